"""Shared helpers for the benchmark scripts: run an lvfl config in-process and collect its test metrics."""

from __future__ import annotations

import os
import platform
import tempfile
import warnings
from typing import Any

import torch

from lvfl.cli import VFLCLI


def quiet() -> None:
    """Silence Lightning's banners and known-harmless warnings so the tables stay readable."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def run_config(config: str, seed: int, overrides: list[str] | None = None, test: bool = True) -> dict[str, float]:
    """Fit `config` with `seed` (model init and data split) and return its test metrics (and the wire total)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "--config",
            config,
            f"--seed_everything={seed}",
            f"--data.init_args.seed={seed}",
            f"--trainer.logger.init_args.save_dir={tmp}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            *(overrides or []),
        ]
        cli = VFLCLI(
            __import__("lvfl.protocols", fromlist=["VFLModule"]).VFLModule,
            __import__("lvfl.datamodules", fromlist=["VerticalDataModule"]).VerticalDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=False,
            auto_configure_optimizers=False,
        )
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        out: dict[str, Any] = {}
        if test:
            (metrics,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
            out.update({k: float(v) for k, v in metrics.items()})
        out["wire_bytes"] = float(cli.model.wire.total_bytes())
        return out


def machine() -> str:
    """One line describing where the numbers were measured."""
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}"
    )
