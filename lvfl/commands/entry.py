"""The `lvfl` command's front door: `lvfl --help`, and each subcommand handed to the module that runs it.

One module per subcommand, beside this one in `lvfl.commands`: `fit` (fit, validate, test and predict through
LightningCLI; `predict` holds what predict does around Lightning's loop), `export`, `bench`, `party`, `launch` and
`pki`. Each is imported only when its subcommand runs, so `lvfl pki` or `lvfl --help` never loads PyTorch.
"""

from __future__ import annotations

import atexit
import os
import sys

from lvfl.commands.early_checks import early_refusal  # light: PyYAML, no PyTorch (the checks run before it loads)
from lvfl.commands.lead_help import asks_lead_help, lead_help

#: every subcommand, with the one line `lvfl --help` prints for it
SUBCOMMANDS = {
    "fit": "train a protocol on a datamodule; keeps last.ckpt and best.ckpt (resume with --ckpt_path last)",
    "validate": "one evaluation epoch over the validation split",
    "test": "every party's model on the test split, and their mean (--ckpt_path last or best: the fitted weights)",
    "predict": "predictions for the test split to a file keyed by sample ID (--output: .csv or .parquet)",
    "bench": "a grid of protocols x datasets x seeds, each a fit + test in its own process, with tables and plots",
    "export": "one folder per party with only its part of a fitted run (--ckpt_path PATH|last|best, --out)",
    "party": "run one party of a federation (its own process, mutual-TLS gRPC to its peers): --party, --federation",
    "launch": "run every party of a config as its own local process, with a throw-away certificate authority",
    "pki": "write a test certificate authority, party certificates and keys, and a federation file",
    "serve": "serve one party of a fitted federation from its export folder and its table (--party, --model)",
    "score": "score IDs or rows of new features with served parties, lvfl predict's file out (--server or --party)",
    "attack-score": "score a deployed attack's guesses (attacks/NAME.csv) against the truth, from the run's config",
}

#: the subcommands whose config files and party tables are checked before PyTorch loads (`early_checks`)
EARLY_CHECKED = ("fit", "validate", "test", "predict", "launch", "party")

HELP = "\n".join(
    [
        "usage: lvfl {" + ",".join(SUBCOMMANDS) + "} ...",
        "",
        "lvfl: vertical federated learning on PyTorch Lightning.",
        "",
        "subcommands:",
        *(f"  {name:<12} {text}" for name, text in SUBCOMMANDS.items()),
        "",
        "`lvfl SUBCOMMAND --help` shows a subcommand's options, e.g. `lvfl fit --help`, `lvfl bench --help`.",
        "A refused input prints one line, 'lvfl: error: ...'; add --debug (or set LVFL_DEBUG=1) for tracebacks.",
    ]
)


def unknown_subcommand(given: str) -> str:
    """The one-line refusal of a subcommand lvfl does not have: every subcommand, and the closest if one is close."""
    import difflib

    close = difflib.get_close_matches(given, list(SUBCOMMANDS), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"no subcommand {given!r}; {hint}the subcommands are {', '.join(SUBCOMMANDS)} (lvfl --help)"


def main(args: list[str] | None = None) -> None:
    """Entry point of the `lvfl` console script and of `python -m lvfl`.

    gRPC's own log is cut to its errors (unless `GRPC_VERBOSITY` says otherwise), before gRPC is loaded: at its
    default it writes a line for every failed TLS handshake, and anyone who can reach a party's port can make one
    (a probe wrote 193); lvfl says in one line of its own what failed between the parties.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    if args is None:  # the process's own command line: the `lvfl` command, not a caller in a test
        atexit.register(_leave_without_teardown)  # registered first: runs after every other exit handler
        try:
            _dispatch(list(sys.argv[1:]))
        except SystemExit as stop:
            _EXIT_STATUS.append(stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1)
            raise
        _EXIT_STATUS.append(0)
        return
    _dispatch(list(args))


#: the status the `lvfl` command exits with, once its subcommand is done (`_leave_without_teardown`)
_EXIT_STATUS: list[int] = []


def _leave_without_teardown() -> None:
    """End the process once every exit handler has run, skipping the interpreter's teardown of its modules.

    Why: with PyTorch and Lightning loaded, tearing the modules down takes a second or more after the command's
    work is done; a launch pays it in every party and then in the launcher. By the time this
    runs (the last exit handler), Python has joined every non-daemon thread and run every other handler (loggers
    flushed, temporary folders removed, worker processes stopped), so only the teardown is skipped. It applies to a
    command that ended by returning or by `SystemExit`; an uncaught exception takes the usual way out. It is
    registered as `main` starts, before any other handler (none is registered by then), so it runs after them all.
    """
    if not _EXIT_STATUS:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[-1])


def _dispatch(argv: list[str]) -> None:
    """Run the subcommand `argv` names."""
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP)
        if not argv:
            raise SystemExit(2)
        return
    if not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        print(f"lvfl: error: {unknown_subcommand(argv[0])}", file=sys.stderr)
        raise SystemExit(2)
    command, rest = argv[0], argv[1:]
    if asks_lead_help(argv):  # lvfl's own options first, before PyTorch loads (`--help all`: LightningCLI's whole)
        print(lead_help(command))
        raise SystemExit(0)
    if command in EARLY_CHECKED:  # refused before PyTorch loads (the full run checks everything again)
        refused = early_refusal(argv, check_tables=command != "party")  # a party holds its own table only
        if refused is not None:
            print(f"lvfl: error: {refused}", file=sys.stderr)
            raise SystemExit(2)
    if command == "export":
        from lvfl.commands import export

        export.main(rest)
    elif command == "bench":
        from lvfl.commands import bench

        bench.main(rest)
    elif command == "party":
        from lvfl.commands import party

        party.main(rest)
    elif command == "launch":
        from lvfl.commands import launch

        launch.main(rest)
    elif command == "pki":
        from lvfl.commands import pki

        pki.main(rest)
    elif command == "serve":
        from lvfl.commands import serve

        serve.main(rest)
    elif command == "score":
        from lvfl.commands import score

        score.main(rest)
    elif command == "attack-score":
        from lvfl.commands import attack_score

        attack_score.main(rest)
    else:  # fit, validate, test, predict (and LightningCLI's own options)
        from lvfl.commands import fit

        fit.main(argv)
