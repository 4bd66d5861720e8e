"""Shared helpers for the benchmark scripts: run an lvfl config in-process and collect its test metrics."""

from __future__ import annotations

import os
import platform
import warnings

import torch

from lvfl.commands.fit import run_experiment


def quiet() -> None:
    """Silence Lightning's banners and known-harmless warnings so the tables stay readable."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def run_config(config: str, seed: int, overrides: list[str] | None = None) -> dict[str, float]:
    """Fit and test `config` with `seed`; its test metrics and `wire_bytes`."""
    return run_experiment(config, seed, overrides)[0]


def machine() -> str:
    """One line describing where the numbers were measured."""
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}"
    )
