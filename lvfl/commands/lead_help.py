"""`lvfl fit --help` (and validate, test, predict): lvfl's own options first, then where the rest are.

Why: LightningCLI's help is over 500 lines led by 44 Trainer flags, with Lightning's generic description; the options
a newcomer needs (the config, the protocol, the datamodule, the checkpoint) came after them. This page names those,
how to list one class's options (`--model.help CLASS`), the Trainer options most runs set, and `--help all` for the
whole of LightningCLI's help. It imports nothing heavy: it prints before PyTorch loads.
"""

from __future__ import annotations

__all__ = ["LEAD_HELP_SUBCOMMANDS", "asks_lead_help", "lead_help"]

#: the subcommands whose `--help` is this page (LightningCLI's whole help: `--help all`)
LEAD_HELP_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def asks_lead_help(argv: list[str]) -> bool:
    """Whether `argv` (subcommand first) is `lvfl SUBCOMMAND --help` (or `-h`) and nothing else."""
    return len(argv) == 2 and argv[0] in LEAD_HELP_SUBCOMMANDS and argv[1] in ("-h", "--help")


_WHAT = {
    "fit": "train a protocol on a datamodule, every party simulated in this process; keeps last.ckpt and best.ckpt",
    "validate": "one evaluation epoch over the validation split, with a checkpoint's weights",
    "test": "every party's model on the test split, and their mean, with a checkpoint's weights",
    "predict": "predictions for the test split (or --ids) to a file keyed by sample ID, with a checkpoint's weights",
}

_OWN = [
    ("--config FILE", "a YAML config; several compose in order (data, protocol, parties: configs/README.md)"),
    ("--model CLASS", "the protocol: lvfl.protocols.EASTER, SplitNN, AggVFL, CVFL, PraVFed, Local or Central"),
    ("--model.help CLASS", "that protocol's options, each set as --model.init_args.NAME VALUE"),
    ("--data CLASS", "the datamodule: lvfl.datamodules.PartyTables for your own tables (docs/own-data.md),"),
    ("", "an embedded set (Digits, BreastCancer, Wine, Diabetes) or a paper's (MNIST, FashionMNIST, CIFAR10, ...)"),
    ("--data.help CLASS", "that datamodule's options, each set as --data.init_args.NAME VALUE"),
]

_CKPT = {
    "fit": "resume from a checkpoint: a path, or last / best of the config's newest run",
    "validate": "the checkpoint whose weights to use: a path, or last / best of the config's newest run",
}

_PREDICT = [
    ("--output FILE", "the predictions file, .csv or .parquet (default: predictions.csv in the run's folder)"),
    ("--ids FILE", "the IDs to predict, one per line (default: the test split)"),
    ("--oblivious true", "fetch the passive parties' parts by oblivious transfer, as a deployment would"),
]

_REST = [
    ("--seed_everything N", "the run's public seed (it never draws a secret: keys and noise come from the OS)"),
    ("--print_config", "print the config these options make, and stop"),
    ("--debug", "tracebacks and every warning (or LVFL_DEBUG=1)"),
]


def lead_help(subcommand: str) -> str:
    """The help page of `lvfl SUBCOMMAND --help` (fit, validate, test, predict)."""
    rows = list(_OWN)
    rows.append((f"--ckpt_path {'PATH|last|best'}", _CKPT.get(subcommand, _CKPT["validate"])))
    if subcommand == "predict":
        rows += _PREDICT
    if subcommand == "fit":
        rows.append(("--twin true", "fit again with the Plain backend and print what the privacy cost beside it"))
    rows += _REST
    width = max(len(flag) for flag, _ in rows) + 2
    lines = [
        f"usage: lvfl {subcommand} --config FILE [--config FILE ...] [--OPTION VALUE ...]",
        "",
        f"lvfl {subcommand}: {_WHAT[subcommand]}.",
        "",
        "lvfl's options (a config file may set any of them; the command line overrides it):",
        *(f"  {flag:<{width}}{text}" for flag, text in rows),
        "",
        "Lightning's Trainer options, the ones most runs set:",
        "  --trainer.max_epochs N, --trainer.callbacks+=lvfl.callbacks.StudentDistillation (any callback class),",
        "  --trainer.accelerator gpu, --trainer.devices N, --trainer.logger.init_args.save_dir DIR",
        "",
        f"Every option, all of Lightning's Trainer flags included: lvfl {subcommand} --help all",
    ]
    return "\n".join(lines)
