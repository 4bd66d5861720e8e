"""Shared helpers for the benchmark scripts: run an lvfl config in-process and collect its test metrics."""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from pathlib import Path

import torch

from lvfl.commands import bench
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


def ablation_args(doc: str) -> argparse.Namespace:
    """The command line of an ablation script: `--seeds` and `--only LABEL ...` (default: every candidate)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="+", help="candidate labels to run (default: all)")
    return ap.parse_args()


def run_grid_cells(grid_file: Path) -> list[tuple[bench.Cell, dict]]:
    """Run a grid file with `lvfl bench` (finished cells reused) and return each finished cell with its result."""
    grid = bench.load_grid(grid_file)
    bench.run_grid(grid, keep_going=True)
    done = []
    for cell in grid.cells():
        path = Path(grid.out) / "cells" / cell.key / "result.json"
        if path.is_file():
            done.append((cell, json.loads(path.read_text())))
    return done
