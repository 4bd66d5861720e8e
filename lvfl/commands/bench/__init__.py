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
    datasets:                      # names, or variants of a dataset with their own pieces and overrides:
      - digits
      - breast_cancer
      - digits C=2: {dataset: digits, parties: ../parties/digits_two.yaml,
                     overrides: ["--data.init_args.num_parties=2"]}
    seeds: [0, 1, 2]
    overrides: ["--trainer.max_epochs=30"]
    target_accuracy: 0.9          # for "MB to target" (VFLAIR-style cost to reach an accuracy); or per dataset:
                                  # {digits: 0.9, breast_cancer: 0.95}
    reference: SplitNN            # optional: report every protocol's MB to target relative to this one, in %
    out: ../../runs/bench/digits  # where the cells (logs, result.json) go (default: runs/bench/<grid file name>
                                  # below the current directory)
    report: ../../docs/results    # where table.md, results.csv and the plots go (default: `out`)
    network: {links: 50mbps_50ms, devices: {party3: low}}   # optional: a NetworkSimulator in every cell; the
                                  # table gains "sim. s to target", the simulated wall time to target_accuracy
    twin: true                    # optional: each cell whose backend is not Plain also fits a Plain twin (same
                                  # configs and seed); a second table gives step time and MB beside the twin's
    metric: acc                   # optional: what checkpoints are selected by and targets count in,
                                  # val/<metric>/mean: acc (default), auroc, r2 (higher is better), mae, rmse (lower)
    paper:                        # optional: published numbers printed beside lvfl's (two columns, a note)
      source: "EASTER Table II: test accuracy (%), Avg of the party models"
      metric: acc                 # or auroc; or per dataset: {criteo: auroc} (acc for the others)
      values: {EASTER: {digits: 98.16}}
    attacks:                      # optional: attacks (lvfl.attacks) as callbacks of every cell; adds attacks.md
      - {class_path: lvfl.attacks.DirectLabelInference}
    defenses:                     # optional: every protocol crossed with every defense ("<protocol> + <label>")
      none: []                    # the undefended run: DCS's ideal MP
      gaussian z=1: ['--model.init_args.gradient_defense={"class_path": "lvfl.privacy.GaussianNoise",
                     "init_args": {"noise_multiplier": 1.0}}']

A cell (protocol x dataset x seed) is `lvfl fit` + test on several `--config` files, in this order: the dataset's
`data` piece, the protocol's config, the dataset's `parties` piece (the parties come last: they set
`model.init_args` without a `class_path`, which needs the protocol chosen first; configs/README.md has the rules).
The protocol's config is its template with `{dataset}` filled in, or, where that file does not exist, with
`default`: so adding a dataset to a grid takes its data and parties pieces and its name in `datasets`, and a
protocol needs a file of its own only for a dataset it treats differently. A grid without `data` and `parties` runs
whole configs (`config: ../pravfed/{dataset}.yaml`). `overrides` go last, verbatim (their paths, if any, are relative
to the current directory, as on the command line).

A `datasets` entry is a name, which fills `{dataset}` in the templates, or a one-key mapping `label: {dataset,
data, parties, overrides}`: a variant of a dataset (its label names its cells and rows), whose `dataset` fills the
templates (default: the label), whose own `data` / `parties` files replace the templates' (relative to the grid
file), and whose `overrides` apply to its cells (after the grid's, before the protocol's). The paper grids use it
for C = 2..10 parties and for homogeneous party models (configs/bench/paper_easter_*.yaml).

Quick runs (`lvfl.commands.bench.quick`): `--max-rows N`, `--max-epochs E` and `--seeds S ...` shorten every cell alike
and write to `<out>-quick`; `--stand-ins DIR --max-rows N` also writes random files in each file-backed dataset's real
format under DIR and runs on them (`<out>-stand-ins`), so a paper grid runs end to end without its data.

Each cell runs in a fresh process so its peak memory is its own; its logs stay in `<out>/cells/<protocol>/<dataset>/
seed<k>/` with a `result.json`. A cell whose `result.json` matches the cell's fingerprint (text of its config files,
overrides, seed, lvfl version, the bench's evaluation rule) is reused, so re-running a finished grid recomputes
nothing. Every cell is parsed and instantiated before the first one runs, so a grid that names an unknown protocol
config, dataset or override fails at once, naming the bad entry. A cell that fails while running stops the grid
with an error naming it; with `--keep-going` it is recorded instead (its row of the table reads
"failed: seed k (i/n): <reason>", no figures), the other cells run, and `lvfl bench` exits with status 1 at the end.

Evaluation rule, the same for every protocol: each cell keeps the checkpoint of its best validation accuracy
(`val/acc/mean`, the first epoch reaching the maximum; the grid's `metric` instead where it sets one, e.g. R^2 for
a regression) and reports the test accuracy of that checkpoint; the test accuracy after the last epoch is reported
beside it. Model selection on validation data is what a practitioner
does, and it keeps the comparison from rewarding whichever protocol happens to be at a good point at epoch T on
small test splits (diabetes: 89 test samples).

The summary reports, per protocol and dataset: test accuracy (mean +- std over seeds) of every party model and of
their mean, the mean at the last epoch, the best-validation epoch of the epochs trained (marked when a seed's best
fell in the last tenth of training: the run was still improving when it stopped, so its row is compared before
convergence, and a note under the table says so), total MB on the wire (10^6 bytes, all stages), MB until the
validation accuracy first reaches `target_accuracy` (blank if never; it counts the set-up traffic, i.e. key exchange
and one-shot transfers before the first training step, plus training traffic, validation excluded), wall time per
training epoch, and peak resident memory; and plots validation accuracy per epoch and against cumulative MB, one
line per protocol (the mean over seeds) in a band from the seeds' minimum to their maximum, the legend outside the
axes.

With `attacks:` every cell also runs the attacks, and the report adds `attacks.md` / `attacks.csv`: per protocol (and
defense), dataset and attack, the attack's metric at its last logged epoch and its trivial baseline, the attack
performance AP (1 - MSE for a reconstruction, as VFLAIR), the main-task performance MP (the grid's test metric at
the best-validation checkpoint), VFLAIR's DCS against the same protocol's `none` run (beta 0.5, ideal AP 0), and
the epsilon bound a label mechanism puts on a label guess, where one is logged; and a privacy-utility plot per
dataset and attack (AP against MP, one point per protocol and defense). `defenses:` maps a label to the overrides
that set a defense (`model.gradient_defense`, `model.received_defense`, a party's `embedding_noise`, a
`label_mechanism`); every protocol is crossed with every entry, and `none: []` is the undefended reference.

The package: `grid` (the file, its cells and checks), `run` (cells in their own processes, reuse, `--keep-going`),
`report` (table, CSV, plots), `quick` (shortened runs and stand-in data).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from lvfl.commands.bench.grid import Cell, DatasetEntry, Grid, GridError, Paper, check_cells, load_grid
from lvfl.commands.bench.quick import shorten, with_stand_ins
from lvfl.commands.bench.report import mb_to_target, summarize, write_plots, write_table
from lvfl.commands.bench.run import (
    CellFailed,
    Outcome,
    cached_result,
    read_history,
    run_cell,
    run_cell_in_process,
    run_grid,
)
from lvfl.commands.errors import OneLineParser

__all__ = [
    "Cell",
    "CellFailed",
    "DatasetEntry",
    "Grid",
    "GridError",
    "Outcome",
    "Paper",
    "cached_result",
    "check_cells",
    "load_grid",
    "main",
    "mb_to_target",
    "read_history",
    "run_cell",
    "run_cell_in_process",
    "run_grid",
    "shorten",
    "summarize",
    "write_plots",
    "with_stand_ins",
    "write_table",
]


def main(argv: Sequence[str] | None = None) -> None:
    """`lvfl bench GRID [--out DIR] [--force] [--keep-going]` plus the quick-run options (`lvfl.commands.bench.quick`).

    Also the internal `--cell SPEC`, the body of a cell's own process.
    """
    parser = OneLineParser(
        prog="lvfl bench",
        description="Run a grid of lvfl experiments (protocols x datasets x seeds) and report them.",
        epilog="Paths inside a grid file are relative to the grid file's folder; `lvfl.commands.bench` has the format.",
    )
    parser.add_argument("grid", nargs="?", help="a grid YAML file (see configs/bench/)")
    parser.add_argument("--out", help="output folder for cells and report (default: the grid's `out` and `report`)")
    parser.add_argument("--force", action="store_true", help="rerun cells even if a matching result exists")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="a failed cell is reported in the table and the grid goes on (exit status 1 at the end)",
    )
    quick = parser.add_argument_group(
        "quick runs", "shorten every cell alike; results and report go to <out>-quick (<out>-stand-ins), not <out>"
    )
    quick.add_argument("--max-rows", type=int, help="at most N rows per published split (--data.init_args.max_rows)")
    quick.add_argument("--max-epochs", type=int, help="N training epochs per cell (--trainer.max_epochs)")
    quick.add_argument("--seeds", type=int, nargs="+", help="these seeds instead of the grid's")
    quick.add_argument(
        "--stand-ins",
        metavar="DIR",
        help="write random files in each file-backed dataset's real format under DIR (--max-rows rows per split) "
        "and run on them: the grid end to end where the real data is not at hand",
    )
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from lvfl.commands.errors import (
        quiet_third_party,  # Lightning's tips and known third-party noise, as `lvfl fit` does
    )

    if args.cell:
        from lvfl.commands.bench.run import cell_main

        with quiet_third_party():
            cell_main(args.cell)
        return
    if not args.grid:
        parser.error("give a grid file, e.g. lvfl bench configs/bench/baselines.yaml")
    if args.stand_ins and args.max_rows is None:
        parser.error("--stand-ins needs --max-rows: the stand-in files hold that many rows per split")
    try:
        grid = load_grid(args.grid)
        if args.max_rows is not None or args.max_epochs is not None or args.seeds or args.stand_ins:
            suffix = "stand-ins" if args.stand_ins else "quick"
            grid = shorten(grid, args.max_rows, args.max_epochs, args.seeds, suffix)
        stand_ins = None if not args.stand_ins else (args.stand_ins, args.max_rows)
        with quiet_third_party():
            outcome = run_grid(grid, args.out, args.force, args.keep_going, stand_ins)
    except (GridError, CellFailed) as exc:
        raise SystemExit(f"lvfl bench: {exc}") from exc
    print(outcome.table)
    print(f"table, CSV and plots in {outcome.report_dir}{os.sep}")
    if outcome.failures:
        print(f"lvfl bench: {len(outcome.failures)} cell(s) failed:", file=sys.stderr)
        for cell, reason in outcome.failures.items():
            print(f"  {cell.key}: {reason}", file=sys.stderr)
        raise SystemExit(1)
