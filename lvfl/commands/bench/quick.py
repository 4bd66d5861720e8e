"""Quick runs of a grid: fewer rows, epochs or seeds, and stand-in files where the real data is not at hand.

`lvfl bench GRID --max-rows N [--max-epochs E] [--seeds S ...] [--stand-ins DIR]` runs the grid's every cell, each
shortened the same way, into an output folder of its own (`<out>-quick`, or `<out>-stand-ins`), so a quick run
never replaces the cells or the report of the full one. The options become overrides of every cell (and so part of
its fingerprint): `--data.init_args.max_rows=N` (every datamodule of the grid must take `max_rows`: the paper
datasets do, the embedded scikit-learn sets are small already) and `--trainer.max_epochs=E`.

`--stand-ins DIR` writes random files in each file-backed dataset's real format (`FileBacked.write_stand_in`, N rows
per published split) under `DIR/<datamodule class>/` once, and points every cell of that dataset there
(`--data.init_args.root`). The grid then runs end to end where the data cannot be downloaded (CI, this machine):
readers, partition, models, wire and report as on the real files, with accuracies that mean nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
from collections.abc import Sequence
from pathlib import Path

import yaml

from lvfl.commands.bench.grid import Cell, Grid, GridError

#: the file marking a finished stand-in folder (its row count and seed), so a rerun does not rewrite it
STAND_IN_MARK = ".lvfl-stand-in"


def shorten(
    grid: Grid,
    max_rows: int | None = None,
    max_epochs: int | None = None,
    seeds: Sequence[int] | None = None,
    suffix: str = "quick",
) -> Grid:
    """A copy of `grid` whose cells use at most `max_rows` rows per split, `max_epochs` epochs and `seeds`.

    Its `out` (and report) is `<out>-<suffix>`, so the shortened run keeps out of the full run's folders.
    """
    for name, value in (("--max-rows", max_rows), ("--max-epochs", max_epochs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise GridError(f"{name} must be a positive integer, got {value!r}")
    overrides = list(grid.overrides)
    overrides += [] if max_rows is None else [f"--data.init_args.max_rows={max_rows}"]
    overrides += [] if max_epochs is None else [f"--trainer.max_epochs={max_epochs}"]
    out = f"{grid.out}-{suffix}"
    return dataclasses.replace(
        grid, overrides=overrides, seeds=list(grid.seeds if seeds is None else seeds), out=out, report=out
    )


def datamodule_class(cell: Cell) -> type:
    """The datamodule class a cell's config files choose (the last `data.class_path` among them)."""
    class_path = None
    for config in cell.configs:
        data = (yaml.safe_load(Path(config).read_text()) or {}).get("data")
        if isinstance(data, dict) and data.get("class_path"):
            class_path = data["class_path"]
    if class_path is None:
        raise GridError(f"cell {cell.key}: none of {list(cell.configs)} names a `data.class_path`")
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def with_stand_ins(cells: Sequence[Cell], folder: str | Path, rows: int, seed: int = 0) -> list[Cell]:
    """`cells` reading stand-in files: each file-backed dataset's written once under `folder/<class>/`.

    A cell whose datamodule reads no files (the embedded sets) is left as it is.
    """
    from lvfl.datamodules.stand_ins import FileBacked

    out = []
    for cell in cells:
        cls = datamodule_class(cell)
        if not (isinstance(cls, type) and issubclass(cls, FileBacked)):
            out.append(cell)
            continue
        root = Path(folder) / cls.__name__
        mark = root / STAND_IN_MARK
        stamp = f"rows={rows} seed={seed}"
        if not (mark.is_file() and mark.read_text() == stamp):
            if root.exists() and not mark.is_file():
                raise GridError(
                    f"--stand-ins: {root} exists and holds no stand-in written by lvfl bench; give a folder of its own"
                )
            shutil.rmtree(root, ignore_errors=True)  # an earlier stand-in of another size: rewrite it whole
            cls.write_stand_in(root, rows, seed)
            mark.write_text(stamp)
        out.append(dataclasses.replace(cell, overrides=(*cell.overrides, f"--data.init_args.root={root}")))
    return out
