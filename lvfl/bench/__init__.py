"""`lvfl bench GRID.yaml`: run a grid of lvfl experiments and compare them on one harness.

A grid file names protocols, datasets, seeds and config overrides shared by every cell. Every path in it (the
`data`, `parties` and protocol templates, `out`, `report`) is relative to the grid file's own folder, so a grid
runs the same from any working directory; absolute paths stay as they are::

    name: baselines
    data: ../data/{dataset}.yaml         # optional: the datamodule piece of each dataset
    parties: ../parties/{dataset}.yaml   # optional: the party models and optimizers of each dataset
    protocols:
      EASTER: ../protocols/easter/{dataset}.yaml    # falls back to ../protocols/easter/default.yaml
      SplitNN: ../protocols/splitnn/{dataset}.yaml
      PraVFed eps=1:                     # a protocol entry may carry its own overrides (ablations)
        config: ../pravfed/{dataset}.yaml
        overrides: ["--model.init_args.label_mechanism.init_args.epsilon=1.0"]
    datasets: [digits, breast_cancer]
    seeds: [0, 1, 2]
    overrides: ["--trainer.max_epochs=30"]
    target_accuracy: 0.9          # for "MB to target" (VFLAIR-style cost to reach an accuracy); or per dataset:
                                  # {digits: 0.9, breast_cancer: 0.95}
    reference: SplitNN            # optional: report every protocol's MB to target relative to this one, in %
    out: ../../runs/bench/digits  # where the cells (logs, result.json) go (default: runs/bench/<grid file name>
                                  # below the current directory)
    report: ../../docs/results    # where table.md, results.csv and the plots go (default: `out`)

A cell (protocol x dataset x seed) is `lvfl fit` + test on several `--config` files, in this order: the dataset's
`data` piece, the protocol's config, the dataset's `parties` piece (the parties come last: they set
`model.init_args` without a `class_path`, which needs the protocol chosen first; configs/README.md has the rules).
The protocol's config is its template with `{dataset}` filled in, or, where that file does not exist, with
`default`: so adding a dataset to a grid takes its data and parties pieces and its name in `datasets`, and a
protocol needs a file of its own only for a dataset it treats differently. A grid without `data` and `parties` runs
whole configs (`config: ../pravfed/{dataset}.yaml`). `overrides` go last, verbatim (their paths, if any, are relative
to the current directory, as on the command line).

Each cell runs in a fresh process so its peak memory is its own; its logs stay in `<out>/cells/<protocol>/<dataset>/
seed<k>/` with a `result.json`. A cell whose `result.json` matches the cell's fingerprint (text of its config files,
overrides, seed, lvfl version, the bench's evaluation rule) is reused, so re-running a finished grid recomputes
nothing. Every cell is parsed and instantiated before the first one runs, so a grid that names an unknown protocol
config, dataset or override fails at once, naming the bad entry. A cell that fails while running stops the grid
with an error naming it; with `--keep-going` it is recorded instead (its row of the table reads
"failed: seed k (i/n): <reason>", no figures), the other cells run, and `lvfl bench` exits with status 1 at the end.

Evaluation rule, the same for every protocol: each cell keeps the checkpoint of its best validation accuracy
(`val/acc/mean`, the first epoch reaching the maximum) and reports the test accuracy of that checkpoint; the test
accuracy after the last epoch is reported beside it. Model selection on validation data is what a practitioner
does, and it keeps the comparison from rewarding whichever protocol happens to be at a good point at epoch T on
small test splits (diabetes: 89 test samples).

The summary reports, per protocol and dataset: test accuracy (mean +- std over seeds) of every party model and of
their mean, the mean at the last epoch, total MB on the wire (10^6 bytes, all stages), MB until the validation
accuracy first reaches `target_accuracy` (blank if never; it counts the set-up traffic, i.e. key exchange and
one-shot transfers before the first training step, plus training traffic, validation excluded), wall time per
training epoch, and peak resident memory; and plots validation accuracy per epoch and against cumulative MB, one
line per protocol (the mean over seeds) in a band from the seeds' minimum to their maximum, the legend outside the
axes.

The package: `grid` (the file, its cells and checks), `run` (cells in their own processes, reuse, `--keep-going`),
`report` (table, CSV, plots).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from lvfl.bench.grid import Cell, Grid, GridError, check_cells, load_grid
from lvfl.bench.report import mb_to_target, summarize, write_plots, write_table
from lvfl.bench.run import CellFailed, Outcome, cached_result, read_history, run_cell, run_cell_in_process, run_grid

__all__ = [
    "Cell",
    "CellFailed",
    "Grid",
    "GridError",
    "Outcome",
    "cached_result",
    "check_cells",
    "load_grid",
    "main",
    "mb_to_target",
    "read_history",
    "run_cell",
    "run_cell_in_process",
    "run_grid",
    "summarize",
    "write_plots",
    "write_table",
]


def main(argv: Sequence[str] | None = None) -> None:
    """`lvfl bench GRID [--out DIR] [--force] [--keep-going]` (and the internal `--cell SPEC` of a cell's process)."""
    parser = argparse.ArgumentParser(
        prog="lvfl bench",
        description="Run a grid of lvfl experiments (protocols x datasets x seeds) and report them.",
        epilog="Paths inside a grid file are relative to the grid file's folder; see `lvfl.bench` for the format.",
    )
    parser.add_argument("grid", nargs="?", help="a grid YAML file (see configs/bench/)")
    parser.add_argument("--out", help="output folder for cells and report (default: the grid's `out` and `report`)")
    parser.add_argument("--force", action="store_true", help="rerun cells even if a matching result exists")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="a failed cell is reported in the table and the grid goes on (exit status 1 at the end)",
    )
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        from lvfl.bench.run import cell_main

        cell_main(args.cell)
        return
    if not args.grid:
        parser.error("give a grid file, e.g. lvfl bench configs/bench/baselines.yaml")
    try:
        outcome = run_grid(args.grid, args.out, args.force, args.keep_going)
    except (GridError, CellFailed) as exc:
        raise SystemExit(f"lvfl bench: {exc}") from exc
    print(outcome.table)
    print(f"table, CSV and plots in {outcome.report_dir}{os.sep}")
    if outcome.failures:
        print(f"lvfl bench: {len(outcome.failures)} cell(s) failed:", file=sys.stderr)
        for cell, reason in outcome.failures.items():
            print(f"  {cell.key}: {reason}", file=sys.stderr)
        raise SystemExit(1)
