"""`lvfl export`: one folder per party holding only that party's part of a fitted run, servable without lvfl.

`lvfl export --config C --ckpt_path P --out DIR` rebuilds the run from its config, loads the checkpoint (checked to
be this run's) and writes `DIR/<party>/` with `lvfl.export.export_parties` (what each folder holds is said there).
With `--party NAME` a party of a deployed run exports its own folder from its own checkpoint; with `--federation`
too, the data's set-up (the PSI, the split) runs live with the other parties' exports.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lvfl.checkpoints import (
    SPECIAL_CKPT_PATHS,
    describe_checkpoint,
    drop_an_empty_run_folder,
    load_checkpoint,
    resolve_ckpt_path,
)
from lvfl.commands.config_files import saved_config_of, with_saved_config
from lvfl.commands.errors import debug_requested, reported_errors
from lvfl.commands.fit import build_cli
from lvfl.commands.party import PartySession
from lvfl.export import export_parties, owned_keys

__all__ = ["main"]


def _load_party_state(model: Any, datamodule: Any, state: Mapping[str, torch.Tensor], party: str, path: Path) -> None:
    """Load `party`'s own checkpoint of a deployed run, then keep only what it holds (model and data).

    Raises:
        ValueError: `party` is not one of the run's, or the checkpoint does not hold its tensors (another party's).
    """
    if party not in model.party_names:
        raise ValueError(f"--party {party}: the run's parties are {model.party_names}")
    mine = owned_keys(model)[party]
    missing = [k for k in mine if k not in state or state[k].is_meta]
    if missing:
        raise ValueError(
            f"--party {party}: checkpoint {path} does not hold {party}'s tensors ({missing[0]} is "
            f"{'absent' if missing[0] not in state else 'a shape without data'}): it is another party's"
        )
    model.load_state_dict({k: v for k, v in state.items() if not v.is_meta}, strict=False)
    model.hold_only(party)
    datamodule.hold_only(party)


def _export_from_checkpoint(cli: Any, ckpt_path: str, party: str | None, out: str) -> dict[str, Path]:
    """Set the run up as the config says, load the checkpoint (checked to be this run's) and write the folders."""
    model, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    path = resolve_ckpt_path(trainer, ckpt_path)
    what = f"--ckpt_path {ckpt_path} ({path})" if ckpt_path in SPECIAL_CKPT_PATHS else f"--ckpt_path {path}"
    checkpoint = load_checkpoint(path, what=what)
    trainer.datamodule, datamodule.trainer = datamodule, trainer  # as Lightning attaches a datamodule
    trainer.strategy.connect(model)  # the datamodule's set-up sees the protocol (a label mechanism's split)
    model.trainer = trainer
    trainer.ckpt_path = str(path)  # named by the fingerprint check's message
    datamodule.setup("predict")
    model.setup("predict")
    model.on_load_checkpoint(checkpoint)  # refuses a checkpoint of another run, naming the first difference
    if party is None:
        model.load_state_dict(checkpoint["state_dict"])
    else:
        _load_party_state(model, datamodule, checkpoint["state_dict"], party, path)
    about = describe_checkpoint(path, checkpoint)  # said once loaded: a refused checkpoint is one line, the refusal
    print(f"lvfl export: --ckpt_path {ckpt_path}: loaded {path}" + (f" ({about})" if about else ""))
    config = cli.config.as_dict() if hasattr(cli.config, "as_dict") else dict(cli.config)
    identity = {  # the run (the same at every party, kept by a resume) and the checkpoint's place in it
        "run": model.run_token,
        "epoch": checkpoint.get("epoch"),
        "step": checkpoint.get("global_step"),
    }
    return export_parties(model, datamodule, config, out, only=party, identity=identity)


#: the keys of a run's saved config that describe the run (the rest are a subcommand's options)
RUN_KEYS = ("seed_everything", "trainer", "model", "data", "default_callbacks")


def main(argv: Sequence[str]) -> None:
    """`lvfl export --config C [overrides] --ckpt_path P --out DIR`.

    The checkpoint (a path, `last` or `best`, found from disk by `lvfl.checkpoints.resolve_ckpt_path`) is loaded
    with weights_only=True, and must be a checkpoint of the run the config describes: `VFLModule.on_load_checkpoint`
    checks its run fingerprint as test and predict do, since each party's scaling comes from the config's split.
    A refused input prints one line ``lvfl: error: ...`` and exits with status 2 (`errors.reported_errors`).
    """
    debug, argv = debug_requested(list(argv))
    parser = argparse.ArgumentParser(
        prog="lvfl export", description=__doc__.splitlines()[0], exit_on_error=False, allow_abbrev=False
    )
    parser.add_argument(
        "--ckpt_path",
        help="the fitted run's checkpoint: a path, 'last' (the experiment's last.ckpt) or 'best' (its best.ckpt, "
        "the epoch with the best main validation metric); loaded with weights_only=True",
    )
    parser.add_argument("--out", help="the folder to write one sub-folder per party into")
    parser.add_argument(
        "--party",
        help="export this party's folder alone, from its own checkpoint of a deployed run (lvfl party / launch: "
        "its other parties' tensors are shapes without data)",
    )
    parser.add_argument(
        "--federation",
        type=Path,
        default=None,
        help="with --party, for a run whose data is set up between the parties (PartyTables: the PSI, the split): "
        "the federation file; every party runs its own lvfl export --party at the same time",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="with --federation: seconds to wait for a peer")
    parser.add_argument("--run_id", default=None, help="with --federation: the same at every party (default derived)")
    session = None
    with reported_errors(debug):
        args, rest = parser.parse_known_args(argv)
        for option, what in (("ckpt_path", "the checkpoint to export (a path, 'last' or 'best')"), ("out", "a folder")):
            if getattr(args, option) is None:
                raise ValueError(f"lvfl export needs --{option}: {what}")
        if args.federation is not None and args.party is None:
            raise ValueError("lvfl export --federation exports one party's folder: give its --party too")
        given, rest = rest, with_saved_config(rest, "lvfl export", args.ckpt_path, RUN_KEYS)
        if len(rest) != len(given):  # from the checkpoint alone
            print(f"lvfl export: the run's config: {saved_config_of(args.ckpt_path)}")
        cli = build_cli(rest, run=False, exit_on_error=False)
        datamodule = cli.datamodule
        if args.party is not None and hasattr(datamodule, "exchange_on") and args.federation is None:
            raise ValueError(
                f"lvfl export --party of a {type(datamodule).__name__} run needs --federation: each party's encoders "
                "are fitted in a set-up that runs between the parties (the PSI, the split), so every party runs its "
                "own lvfl export --party NAME --federation F.yaml at the same time"
            )
        if args.federation is not None:  # the data's set-up runs live with the other parties' exports
            session = PartySession(args.party, args.federation, args.run_id, args.timeout)
            session.join(cli)
        try:
            folders = _export_from_checkpoint(cli, args.ckpt_path, args.party, args.out)
            drop_an_empty_run_folder(cli.trainer)  # the export is in --out: no version folder of config only
            if session is not None:
                session.finish()  # every message this party sent is delivered before it exits
        except BaseException as err:
            if session is not None:
                session.abort(" ".join(str(err).split()) or type(err).__name__)
            raise
        finally:
            if session is not None:
                session.close()
    for party, folder in folders.items():
        print(f"lvfl export: {party} -> {folder}")
