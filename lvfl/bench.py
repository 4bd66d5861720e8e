"""`lvfl bench GRID.yaml`: run a grid of lvfl experiments and compare them on one harness.

A grid file names protocols (each a config template with a `{dataset}` placeholder, optionally with overrides of
its own), datasets, seeds and config overrides shared by every cell::

    name: digits
    protocols:
      EASTER: configs/easter/{dataset}.yaml
      SplitNN: configs/splitnn/{dataset}.yaml
      PraVFed eps=1:                # a protocol entry may carry its own overrides (ablations)
        config: configs/pravfed/{dataset}.yaml
        overrides: ["--model.init_args.label_mechanism.init_args.epsilon=1.0"]
    datasets: [digits, breast_cancer]
    seeds: [0, 1, 2]
    overrides: ["--trainer.max_epochs=30"]
    target_accuracy: 0.9          # for "MB to target" (VFLAIR-style cost to reach an accuracy); or per dataset:
                                  # {digits: 0.9, breast_cancer: 0.95}
    reference: SplitNN            # optional: report every protocol's MB to target relative to this one, in %
    out: runs/bench/digits        # where the cells (logs, result.json) go
    report: docs/results          # where table.md, results.csv and the plots go (default: `out`)

Each cell (protocol x dataset x seed) is a normal lvfl fit + test of its config, run in a fresh process so its peak
memory is its own; its logs stay in `<out>/cells/<protocol>/<dataset>/seed<k>/` with a `result.json`. A cell whose
`result.json` matches the cell's fingerprint (config text, overrides, seed, lvfl version, the bench's evaluation
rule) is reused, so re-running a finished grid recomputes nothing. Every cell is parsed and instantiated before the
first one runs, so a grid that names an unknown protocol config, dataset or override fails at once, naming the bad
entry.

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
line per protocol.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

GRID_KEYS = {"name", "protocols", "datasets", "seeds", "overrides", "target_accuracy", "reference", "out", "report"}
PROTOCOL_KEYS = {"config", "overrides"}
MB = 1e6
#: The bench's evaluation rule; part of every cell's fingerprint, so changing it reruns finished cells.
EVALUATION = "test at the best val/acc/mean checkpoint and after the last epoch; set-up bytes counted to target"
MONITOR = "val/acc/mean"


class GridError(ValueError):
    """A grid file that cannot run; the message names the bad entry."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    protocol: str
    dataset: str
    seed: int
    config: str
    overrides: tuple[str, ...]

    @property
    def key(self) -> str:
        """Its folder below `<out>/cells/`."""
        protocol = re.sub(r"[^A-Za-z0-9._-]+", "_", self.protocol)
        return f"{protocol}/{self.dataset}/seed{self.seed}"

    def args(self, save_dir: str) -> list[str]:
        """The lvfl CLI arguments of this cell (without the subcommand)."""
        return [
            "--config",
            self.config,
            f"--seed_everything={self.seed}",
            f"--data.init_args.seed={self.seed}",
            f"--trainer.logger.init_args.save_dir={save_dir}",
            "--trainer.logger.init_args.name=logs",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=true",
            "--trainer.callbacks="
            + json.dumps(
                [
                    {"class_path": "lvfl.callbacks.CommunicationMeter", "init_args": {"print_summary": False}},
                    {
                        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                        "init_args": {
                            "dirpath": str(Path(save_dir) / "best"),
                            "filename": "best",
                            "monitor": MONITOR,
                            "mode": "max",
                            "save_top_k": 1,
                            "save_last": False,
                            "enable_version_counter": False,
                        },
                    },
                ]
            ),
            *self.overrides,
        ]

    def fingerprint(self) -> str:
        """Changes whenever anything that could change the cell's result changes."""
        from lvfl import __version__

        text = Path(self.config).read_text()
        blob = json.dumps([text, list(self.overrides), self.seed, __version__, EVALUATION])
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Grid:
    """A parsed grid file."""

    name: str
    protocols: dict[str, str]
    datasets: list[str]
    seeds: list[int]
    overrides: list[str] = field(default_factory=list)
    target_accuracy: float | dict[str, float] | None = None
    out: str = "runs/bench"
    report: str | None = None
    protocol_overrides: dict[str, list[str]] = field(default_factory=dict)
    reference: str | None = None

    def target(self, dataset: str) -> float | None:
        """The accuracy whose cost `MB to target` measures on `dataset`."""
        if isinstance(self.target_accuracy, dict):
            return self.target_accuracy.get(dataset)
        return self.target_accuracy

    def cells(self) -> list[Cell]:
        """Every (protocol, dataset, seed), checking that each protocol has a config for each dataset."""
        cells = []
        for protocol, template in self.protocols.items():
            for dataset in self.datasets:
                config = template.format(dataset=dataset)
                if not Path(config).is_file():
                    raise GridError(
                        f"protocol {protocol!r} has no config for dataset {dataset!r}: {config} does not exist"
                    )
                overrides = (*self.overrides, *self.protocol_overrides.get(protocol, []))
                cells += [Cell(protocol, dataset, s, config, overrides) for s in self.seeds]
        return cells


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict):
        raise GridError(f"{path}: a grid file is a mapping with keys {sorted(GRID_KEYS)}")
    unknown = set(raw) - GRID_KEYS
    if unknown:
        raise GridError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(GRID_KEYS)}")
    for key in ("protocols", "datasets", "seeds"):
        if not raw.get(key):
            raise GridError(f"{path}: `{key}` is required and must not be empty")
    protocols = raw["protocols"]
    if not isinstance(protocols, dict):
        raise GridError(f"{path}: `protocols` maps a label to a config template with {{dataset}}")
    templates: dict[str, str] = {}
    protocol_overrides: dict[str, list[str]] = {}
    for label, entry in protocols.items():
        template, own = entry, []
        if isinstance(entry, dict):
            unknown = set(entry) - PROTOCOL_KEYS
            if unknown or "config" not in entry:
                raise GridError(
                    f"{path}: protocol {label!r}: an entry is a template or a mapping with keys "
                    f"{sorted(PROTOCOL_KEYS)} (`config` required); got keys {sorted(entry)}"
                )
            template, own = entry["config"], entry.get("overrides") or []
            _check_overrides(path, own, f"protocol {label!r}: ")
        if not isinstance(template, str) or "{dataset}" not in template:
            raise GridError(f"{path}: protocol {label!r}: template {template!r} must contain {{dataset}}")
        templates[str(label)] = template
        protocol_overrides[str(label)] = list(own)
    reference = raw.get("reference")
    if reference is not None and str(reference) not in templates:
        raise GridError(f"{path}: `reference` {reference!r} is not one of the protocols {sorted(templates)}")
    seeds = raw["seeds"]
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise GridError(f"{path}: `seeds` must be integers, got {seeds}")
    target = raw.get("target_accuracy")
    targets = target.items() if isinstance(target, dict) else [("", target)] if target is not None else []
    for dataset, value in targets:
        if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1):
            where = f"[{dataset!r}]" if dataset else ""
            raise GridError(f"{path}: `target_accuracy`{where} must be in (0, 1], got {value!r}")
        if dataset and dataset not in raw["datasets"]:
            raise GridError(f"{path}: `target_accuracy` names dataset {dataset!r}, which is not in `datasets`")
    overrides = raw.get("overrides") or []
    _check_overrides(path, overrides)
    return Grid(
        name=str(raw.get("name", Path(path).stem)),
        protocols=templates,
        protocol_overrides=protocol_overrides,
        reference=None if reference is None else str(reference),
        datasets=[str(d) for d in raw["datasets"]],
        seeds=list(seeds),
        overrides=list(overrides),
        target_accuracy=(
            {str(k): float(v) for k, v in target.items()} if isinstance(target, dict) else target and float(target)
        ),
        out=str(raw.get("out", f"runs/bench/{Path(path).stem}")),
        report=None if raw.get("report") is None else str(raw["report"]),
    )


def _check_overrides(path: str | Path, overrides: Any, where: str = "") -> None:
    if not isinstance(overrides, list):
        raise GridError(f"{path}: {where}`overrides` must be a list of command-line options, got {overrides!r}")
    bad = [o for o in overrides if not (isinstance(o, str) and o.startswith("--"))]
    if bad:
        raise GridError(f"{path}: {where}overrides are command-line options like '--trainer.max_epochs=5'; bad: {bad}")


def check_cells(cells: Sequence[Cell]) -> None:
    """Parse and instantiate every distinct cell configuration, so a bad override fails before anything runs."""
    from lvfl.cli import build_cli

    seen = set()
    for cell in cells:
        if (cell.config, cell.overrides) in seen:
            continue
        seen.add((cell.config, cell.overrides))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                build_cli(cell.args(tmp), run=False)
            except SystemExit as exc:
                raise GridError(
                    f"cell {cell.protocol}/{cell.dataset}: the config {cell.config} with overrides "
                    f"{list(cell.overrides)} does not parse (see the error printed above)"
                ) from exc


# ---------------------------------------------------------------------------------------------------- one cell
def run_cell_in_process(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Fit and test one cell here and return its result (the body of the cell's own process)."""
    import lightning.pytorch as pl
    import torch

    from lvfl.cli import build_cli

    class EpochTimer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.times.append(time.perf_counter() - self._t0)

    cli = build_cli(cell.args(str(cell_dir)), run=False)
    timer = EpochTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (last,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    wire_bytes = int(cli.model.wire.total_bytes())  # fit + one test pass (loading a checkpoint merges its ledger)
    (keeper,) = [c for c in cli.trainer.checkpoint_callbacks if getattr(c, "monitor", None) == MONITOR]
    best_path = Path(keeper.best_model_path)
    best_epoch = int(torch.load(best_path, map_location="cpu", weights_only=False)["epoch"])
    (best,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False, ckpt_path=str(best_path))
    best_path.unlink()  # the cell's figures are in result.json; its checkpoints would only fill the disk
    history = read_history(Path(cli.trainer.logger.log_dir) / "metrics.csv")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {
        "fingerprint": cell.fingerprint(),
        "cell": cell.key,
        "test": {k: float(v) for k, v in best.items()},
        "test_last": {k: float(v) for k, v in last.items()},
        "best_epoch": best_epoch + 1,
        "wire_bytes": wire_bytes,
        "epoch_seconds": timer.times,
        "history": history,
        "peak_rss_mib": peak,
        "peak_gpu_mib": peak_gpu,
    }


def read_history(metrics_csv: Path) -> dict[str, list[float]]:
    """Per-epoch validation accuracy (mean of party models), training bytes and the set-up bytes from a CSV log."""
    val: dict[int, float] = {}
    train_bytes: dict[int, float] = {}
    setup_bytes = 0.0
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            epoch = row.get("epoch")
            if not epoch:
                continue
            if row.get("train/comm/setup_bytes"):
                setup_bytes = float(row["train/comm/setup_bytes"])
            if row.get("val/acc/mean"):
                val[int(float(epoch))] = float(row["val/acc/mean"])
            if row.get("train/comm/epoch_bytes"):
                train_bytes[int(float(epoch))] = float(row["train/comm/epoch_bytes"])
    epochs = sorted(set(val) & set(train_bytes))
    return {
        "epoch": [e + 1 for e in epochs],
        "val_acc": [val[e] for e in epochs],
        "train_bytes": [train_bytes[e] for e in epochs],
        "setup_bytes": setup_bytes,
    }


def run_cell(cell: Cell, out: Path) -> dict[str, Any]:
    """Run `cell` in a fresh process (its own peak memory, no state shared between cells) and load its result."""
    cell_dir = out / "cells" / cell.key
    cell_dir.mkdir(parents=True, exist_ok=True)
    spec = json.dumps({**cell.__dict__, "overrides": list(cell.overrides), "dir": str(cell_dir)})
    log = cell_dir / "run.log"
    with log.open("w") as f:
        proc = subprocess.run(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "lvfl.bench", "--cell", spec], stdout=f, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        raise RuntimeError(f"cell {cell.key} failed (exit {proc.returncode}); its output is in {log}")
    return json.loads((cell_dir / "result.json").read_text())


def cached_result(cell: Cell, out: Path) -> dict[str, Any] | None:
    """A finished cell's result if its fingerprint still matches, else None."""
    path = out / "cells" / cell.key / "result.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    return result if result.get("fingerprint") == cell.fingerprint() else None


# ---------------------------------------------------------------------------------------------------- summary
def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def mb_to_target(history: dict[str, list[float]], target: float | None) -> float | None:
    """Cumulative MB (set-up, then training) at the first epoch whose validation accuracy reaches `target`."""
    if target is None:
        return None
    total = float(history.get("setup_bytes", 0.0))
    for acc, nbytes in zip(history["val_acc"], history["train_bytes"], strict=True):
        total += nbytes
        if acc >= target:
            return total / MB
    return None


def summarize(grid: Grid, results: dict[Cell, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (protocol, dataset) with the figures of the table."""
    rows = []
    for protocol in grid.protocols:
        for dataset in grid.datasets:
            runs = [r for c, r in results.items() if c.protocol == protocol and c.dataset == dataset]
            parties = sorted(
                {k.split("/")[-1] for r in runs for k in r["test"] if k.startswith("test/acc/")} - {"mean"}
            )
            row: dict[str, Any] = {"protocol": protocol, "dataset": dataset, "seeds": len(runs)}
            for party in [*parties, "mean"]:
                values = [r["test"][f"test/acc/{party}"] for r in runs if f"test/acc/{party}" in r["test"]]
                row[f"acc_{party}"] = _mean_std(values) if values else None
            row["parties"] = parties
            last = [r["test_last"]["test/acc/mean"] for r in runs if "test/acc/mean" in r.get("test_last", {})]
            row["acc_mean_last"] = _mean_std(last) if last else None
            row["mb_total"] = statistics.mean(r["wire_bytes"] for r in runs) / MB
            row["target"] = grid.target(dataset)
            to_target = [mb_to_target(r["history"], row["target"]) for r in runs]
            reached = [m for m in to_target if m is not None]
            row["mb_to_target"] = statistics.mean(reached) if reached and len(reached) == len(runs) else None
            row["reached"] = f"{len(reached)}/{len(runs)}"
            row["s_per_epoch"] = statistics.mean(statistics.median(r["epoch_seconds"]) for r in runs)
            row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
            rows.append(row)
    if grid.reference is not None:
        ref = {r["dataset"]: r["mb_to_target"] for r in rows if r["protocol"] == grid.reference}
        for row in rows:
            base = ref.get(row["dataset"])
            mine = row["mb_to_target"]
            row["vs_reference"] = None if base in (None, 0) or mine is None else 100 * (mine - base) / base
    return rows


def _fmt(cell: tuple[float, float] | None) -> str:
    return "" if cell is None else f"{cell[0]:.4f} ± {cell[1]:.4f}"


def write_table(grid: Grid, rows: list[dict[str, Any]], out: Path) -> str:
    """Markdown table and CSV of the rows; returns the Markdown."""
    party_cols = sorted({p for r in rows for p in r["parties"]})
    head = ["protocol", "dataset", *[f"acc {p}" for p in party_cols], "acc mean", "acc mean (last epoch)"]
    head += ["MB total", "MB to target"]
    if grid.reference is not None:
        head.append(f"MB to target vs {grid.reference}")
    head += ["s/epoch", "peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        csv_head = ["protocol", "dataset", "seeds"]
        for p in [*party_cols, "mean"]:
            csv_head += [f"acc_{p}_mean", f"acc_{p}_std"]
        csv_head += ["acc_mean_last_mean", "acc_mean_last_std", "mb_total", "target", "mb_to_target", "reached"]
        writer.writerow([*csv_head, "mb_to_target_vs_reference_pct", "s_per_epoch", "peak_rss_mib"])
        for r in rows:
            to_target = "" if r["mb_to_target"] is None else f"{r['mb_to_target']:.2f}"
            target = "–" if r["target"] is None else f"{to_target} (acc {r['target']:g}: {r['reached']} seeds)"
            cells = [r["protocol"], r["dataset"], *[_fmt(r.get(f"acc_{p}")) for p in party_cols]]
            versus = "" if r.get("vs_reference") is None else f"{r['vs_reference']:+.2f}%"
            cells += [_fmt(r["acc_mean"]), _fmt(r["acc_mean_last"]), f"{r['mb_total']:.2f}", target]
            cells += [versus] if grid.reference is not None else []
            cells += [f"{r['s_per_epoch']:.3f}", f"{r['peak_rss_mib']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
            values = [r["protocol"], r["dataset"], r["seeds"]]
            for p in [*party_cols, "mean"]:
                stat = r.get(f"acc_{p}")
                values += ["", ""] if stat is None else [f"{stat[0]:.6f}", f"{stat[1]:.6f}"]
            stat = r["acc_mean_last"]
            values += ["", ""] if stat is None else [f"{stat[0]:.6f}", f"{stat[1]:.6f}"]
            values += [f"{r['mb_total']:.6f}", r["target"] or "", to_target, r["reached"]]
            pct = r.get("vs_reference")
            values += ["" if pct is None else f"{pct:.4f}", f"{r['s_per_epoch']:.6f}"]
            writer.writerow([*values, f"{r['peak_rss_mib']:.1f}"])
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    return table


def write_plots(grid: Grid, results: dict[Cell, dict[str, Any]], out: Path) -> list[Path]:
    """Per dataset: validation accuracy vs epoch and vs cumulative training MB, one line per protocol (seed mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    for dataset in grid.datasets:
        fig, (ax_epoch, ax_mb) = plt.subplots(1, 2, figsize=(11, 4))
        for protocol in grid.protocols:
            runs = [r["history"] for c, r in results.items() if c.protocol == protocol and c.dataset == dataset]
            n = min(len(h["epoch"]) for h in runs)
            if n == 0:
                continue
            acc = np.mean([h["val_acc"][:n] for h in runs], axis=0)
            mb = np.mean([h.get("setup_bytes", 0.0) + np.cumsum(h["train_bytes"][:n]) for h in runs], axis=0) / MB
            ax_epoch.plot(runs[0]["epoch"][:n], acc, label=protocol)
            ax_mb.plot(mb, acc, label=protocol)
        ax_epoch.set(xlabel="epoch", ylabel="validation accuracy (mean of party models)", title=dataset)
        ax_mb.set(xlabel="cumulative MB, set-up + training (10^6 bytes)", ylabel="validation accuracy", title=dataset)
        if any(ax_mb.get_lines()):
            ax_mb.set_xscale("symlog", linthresh=0.1)
        for ax in (ax_epoch, ax_mb):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{grid.name}_{dataset}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------------- entry point
def run_grid(grid_path: str | Path, out: str | None = None, force: bool = False) -> tuple[str, Path]:
    """Run (or reuse) every cell of the grid and write the summary; returns the Markdown table and the folder."""
    from tqdm.auto import tqdm

    grid = load_grid(grid_path)
    out_dir = Path(out or grid.out)
    cells = grid.cells()
    todo = [c for c in cells if force or cached_result(c, out_dir) is None]
    if todo:
        check_cells(todo)
    results: dict[Cell, dict[str, Any]] = {}
    with tqdm(total=len(cells), desc=f"lvfl bench {grid.name}", unit="cell") as bar:
        for cell in cells:
            cached = None if force else cached_result(cell, out_dir)
            bar.set_postfix_str(("reused " if cached else "running ") + cell.key)
            results[cell] = cached if cached is not None else run_cell(cell, out_dir)
            bar.update()
    report_dir = Path(grid.report) if grid.report and not out else out_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(grid, results)
    table = write_table(grid, rows, report_dir)
    write_plots(grid, results, report_dir)
    return table, report_dir


def main(argv: Sequence[str] | None = None) -> None:
    """`lvfl bench GRID [--out DIR] [--force]` (and the internal `--cell SPEC` of a cell's own process)."""
    parser = argparse.ArgumentParser(prog="lvfl bench", description="Run a grid of lvfl experiments.")
    parser.add_argument("grid", nargs="?", help="a grid YAML file (see configs/bench/)")
    parser.add_argument("--out", help="output folder (default: the grid's `out`)")
    parser.add_argument("--force", action="store_true", help="rerun cells even if a matching result exists")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        spec = json.loads(args.cell)
        cell_dir = Path(spec.pop("dir"))
        cell = Cell(**{**spec, "overrides": tuple(spec["overrides"])})
        result = run_cell_in_process(cell, cell_dir)
        (cell_dir / "result.json").write_text(json.dumps(result, indent=1))
        return
    if not args.grid:
        parser.error("give a grid file, e.g. lvfl bench configs/bench/digits.yaml")
    try:
        table, out_dir = run_grid(args.grid, args.out, args.force)
    except GridError as exc:
        raise SystemExit(f"lvfl bench: {exc}") from exc
    print(table)
    print(f"table, CSV and plots in {out_dir}{os.sep}")


if __name__ == "__main__":
    main()
