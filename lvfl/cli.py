"""`lvfl fit|validate|test|predict --config ...`: LightningCLI over every lvfl protocol and datamodule.

Protocols (`model:`) and datamodules (`data:`) are chosen by `class_path`; aggregation backends swap with
`--model.aggregation=lvfl.privacy.DHMasking` (or `Plain`). By default runs log to `runs/` with a CSVLogger, meter
the wire with `CommunicationMeter`, and keep a `last.ckpt` so `--ckpt_path last` resumes.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from typing import Any

from lightning.pytorch.cli import LightningCLI

from lvfl.datamodules import VerticalDataModule
from lvfl.protocols import VFLModule


class VFLCLI(LightningCLI):
    """LightningCLI with lvfl's defaults (CSV logs under runs/, a communication meter, last checkpoints)."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        """Lvfl's defaults: seeded runs, CSV logs under runs/, a communication meter, per-experiment checkpoints.

        Set as parser defaults (not `trainer_defaults`) so that a config can replace each of them.
        """
        parser.set_defaults({"seed_everything": 0, **{f"trainer.{k}": v for k, v in trainer_defaults().items()}})


def trainer_defaults() -> dict:
    """Defaults every lvfl run gets unless its config overrides them."""
    return {
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
        "callbacks": [
            {"class_path": "lvfl.callbacks.CommunicationMeter"},
            {"class_path": "lvfl.callbacks.ExperimentCheckpoint"},
        ],
        "enable_model_summary": False,
    }


def build_cli(args: list[str], run: bool = True) -> VFLCLI:
    """The CLI on `args` (with `run=False` the first argument is not a subcommand): for scripts and tests."""
    return VFLCLI(
        VFLModule,
        VerticalDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def run_experiment(
    config: str,
    seed: int,
    overrides: list[str] | None = None,
    save_dir: str | None = None,
    test: bool = True,
    before_fit: Callable[[VFLCLI], Any] | None = None,
) -> tuple[dict[str, float], VFLCLI]:
    """Fit `config` with `seed` (model init and data split), then test it; returns the test metrics and the CLI.

    Progress bar, checkpoints and default callbacks are off (the metrics come back directly); the test metrics
    gain `wire_bytes`, the run's total on the wire. `before_fit(cli)` runs on the instantiated, unfitted CLI (e.g.
    to keep an unbuilt copy of the model). Used by the benchmark scripts and the accuracy tests.
    """
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "--config",
            config,
            f"--seed_everything={seed}",
            f"--data.init_args.seed={seed}",
            f"--trainer.logger.init_args.save_dir={save_dir or tmp}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            *(overrides or []),
        ]
        cli = build_cli(args, run=False)
        if before_fit is not None:
            before_fit(cli)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics: dict[str, float] = {}
        if test:
            (raw,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
            metrics = {k: float(v) for k, v in raw.items()}
        metrics["wire_bytes"] = float(cli.model.wire.total_bytes())
        return metrics, cli


def main(args: list[str] | None = None) -> None:
    """Entry point of the `lvfl` console script: LightningCLI's subcommands, plus `lvfl bench GRID`."""
    argv = list(args if args is not None else sys.argv[1:])
    if argv and argv[0] == "bench":
        from lvfl.bench import main as bench_main

        bench_main(argv[1:])
        return
    build_cli(argv)
