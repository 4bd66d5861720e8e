"""`lvfl fit|validate|test|predict --config ...`: LightningCLI over every lvfl protocol and datamodule.

Protocols (`model:`) and datamodules (`data:`) are chosen by `class_path`; aggregation backends swap with
`--model.aggregation=lvfl.privacy.DHMasking` (or `Plain`). By default runs log to `runs/` with a CSVLogger, meter
the wire with `CommunicationMeter`, and keep a `last.ckpt` so `--ckpt_path last` resumes.
"""

from __future__ import annotations

import sys
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


def main(args: list[str] | None = None) -> None:
    """Entry point of the `lvfl` console script."""
    VFLCLI(
        VFLModule,
        VerticalDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args if args is not None else sys.argv[1:],
        auto_configure_optimizers=False,
    )
