"""Running a grid: each cell in its own process, finished cells reused, failures stopping the grid or recorded."""

from __future__ import annotations

import csv
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lvfl.commands.bench.grid import Cell, Grid, check_cells, load_grid
from lvfl.commands.bench.quick import with_stand_ins
from lvfl.commands.bench.report import (
    attack_rows,
    summarize,
    write_attack_plots,
    write_attack_table,
    write_plots,
    write_table,
)

#: The file a cell's process leaves behind when it fails: the one-line reason the table shows.
ERROR_FILE = "error.txt"


class CellFailed(RuntimeError):
    """A cell whose process failed; the message names the cell, says why in one line and where its log is."""

    def __init__(self, cell: Cell, reason: str, log: Path) -> None:
        super().__init__(f"cell {cell.key} failed: {reason} (its output is in {log})")
        self.cell, self.reason, self.log = cell, reason, log


@dataclass
class Outcome:
    """What `run_grid` leaves: the Markdown table, the folder of the report, and the failed cells' reasons."""

    table: str
    report_dir: Path
    failures: dict[Cell, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- one cell
def run_cell_in_process(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Fit and test one cell here and return its result (the body of the cell's own process)."""
    import lightning.pytorch as pl
    import torch

    from lvfl.checkpoints import load_checkpoint, weights_only_kwargs
    from lvfl.commands.fit import build_cli

    class EpochTimer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self._t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.times.append(time.perf_counter() - self._t0)

    from lvfl.commands.twin import StepTimer

    cli = build_cli(cell.args(str(cell_dir)), run=False)
    timer, steps = EpochTimer(), StepTimer()
    cli.trainer.callbacks += [timer, steps]
    started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    fit_s, fit_bytes = time.perf_counter() - started, cli.model.wire.bytes_by_tag()
    (last,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    wire_bytes = int(cli.model.wire.total_bytes())  # fit + one test pass (loading a checkpoint merges its ledger)
    (keeper,) = [c for c in cli.trainer.checkpoint_callbacks if getattr(c, "monitor", None) == cell.monitor]
    best_path = Path(keeper.best_model_path)
    best_epoch = int(load_checkpoint(best_path)["epoch"])  # weights_only=True, as every checkpoint lvfl loads
    (best,) = cli.trainer.test(
        cli.model, datamodule=cli.datamodule, verbose=False, ckpt_path=str(best_path), **weights_only_kwargs()
    )
    best_path.unlink()  # the cell's figures are in result.json; its checkpoints would only fill the disk
    history = read_history(Path(cli.trainer.logger.log_dir) / "metrics.csv", cell.metric)
    attacks = read_attacks(Path(cli.trainer.logger.log_dir) / "metrics.csv")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    backend = type(cli.model.aggregation).__name__
    twin = None
    if cell.twin and backend != "Plain":  # after the peak memory is read: the twin's is not the cell's
        from lvfl.commands.twin import Measured

        twin = {"backend": backend, **plain_twin(cell, Measured.of(fit_s, steps, fit_bytes), cell_dir)}
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
        "twin": twin,
        "attacks": attacks,
    }


def plain_twin(cell: Cell, run: Any, cell_dir: Path) -> dict[str, Any]:
    """Fit `cell` again with the Plain backend (same configs, overrides and seed); both fits' costs (`twin`)."""
    from lvfl.commands.fit import build_cli, run_args
    from lvfl.commands.twin import PLAIN, Measured, StepTimer

    overrides = (*cell.overrides, f"--model.init_args.aggregation={PLAIN}")
    meter = [{"class_path": "lvfl.callbacks.CommunicationMeter", "init_args": {"print_summary": False}}]
    cli = build_cli(run_args(cell.configs, cell.seed, str(cell_dir / "twin"), overrides, callbacks=meter), run=False)
    steps = StepTimer()
    cli.trainer.callbacks.append(steps)
    started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    twin = Measured.of(time.perf_counter() - started, steps, cli.model.wire.bytes_by_tag())
    return {
        "step_s": run.step_seconds,
        "twin_step_s": twin.step_seconds,
        "fit_s": run.seconds,
        "twin_fit_s": twin.seconds,
        "bytes": run.total_bytes,
        "twin_bytes": twin.total_bytes,
    }


def cell_main(spec: str) -> None:
    """The body of a cell's own process (`python -m lvfl.commands.bench --cell SPEC`): `result.json`, or why not."""
    fields = json.loads(spec)
    cell_dir = Path(fields.pop("dir"))
    cell = Cell(**{**fields, "configs": tuple(fields["configs"]), "overrides": tuple(fields["overrides"])})
    try:
        result = run_cell_in_process(cell, cell_dir)
    except BaseException as exc:
        (cell_dir / ERROR_FILE).write_text(one_line(exc))
        raise
    (cell_dir / "result.json").write_text(json.dumps(result, indent=1))


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (a SystemExit from the CLI's parser: its exit code; the log has the rest)."""
    if isinstance(exc, SystemExit):
        return f"the lvfl CLI exited with status {exc.code} (see run.log)"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def read_history(metrics_csv: Path, metric: str = "acc") -> dict[str, Any]:
    """Per-epoch validation `metric` (mean of party models), training bytes and the set-up bytes from a CSV log.

    The validation figure is kept under `val_acc` whatever the metric (the grid's `metric:`, accuracy by default).

    With a `NetworkSimulator` in the run, also the simulated wall time at each epoch's end (`sim_wall_s`).
    """
    val: dict[int, float] = {}
    train_bytes: dict[int, float] = {}
    sim_wall: dict[int, float] = {}  # NetworkSimulator's cumulative simulated time at each epoch's end
    setup_bytes = 0.0
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            epoch = row.get("epoch")
            if not epoch:
                continue
            if row.get("train/comm/setup_bytes"):
                setup_bytes = float(row["train/comm/setup_bytes"])
            if row.get(f"val/{metric}/mean"):
                val[int(float(epoch))] = float(row[f"val/{metric}/mean"])
            if row.get("train/comm/epoch_bytes"):
                train_bytes[int(float(epoch))] = float(row["train/comm/epoch_bytes"])
            if row.get("sim/epoch_time") and row.get("sim/wall_time"):
                sim_wall[int(float(epoch))] = float(row["sim/wall_time"])
    epochs = sorted(set(val) & set(train_bytes))
    history: dict[str, Any] = {
        "epoch": [e + 1 for e in epochs],
        "val_acc": [val[e] for e in epochs],
        "train_bytes": [train_bytes[e] for e in epochs],
        "setup_bytes": setup_bytes,
    }
    if sim_wall and all(e in sim_wall for e in epochs):
        history["sim_wall_s"] = [sim_wall[e] for e in epochs]
    return history


def read_attacks(metrics_csv: Path) -> dict[str, float]:
    """Each `attack/<name>/<metric>` an attack logged, at the last epoch it logged it (AP of the trained run)."""
    last: dict[str, float] = {}
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            last |= {k: float(v) for k, v in row.items() if k.startswith("attack/") and v}
    return last


def run_cell(cell: Cell, out: Path) -> dict[str, Any]:
    """Run `cell` in a fresh process (its own peak memory, no state shared between cells) and load its result.

    Raises:
        CellFailed: the process failed; the reason is the exception it raised, in one line.
    """
    cell_dir = out / "cells" / cell.key
    cell_dir.mkdir(parents=True, exist_ok=True)
    (cell_dir / ERROR_FILE).unlink(missing_ok=True)
    spec = json.dumps({**cell.__dict__, "dir": str(cell_dir)})
    log = cell_dir / "run.log"
    with log.open("w") as f:
        proc = subprocess.run(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "lvfl.commands.bench", "--cell", spec],
            stdout=f,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if proc.returncode != 0:
        error = cell_dir / ERROR_FILE
        reason = error.read_text().strip() if error.is_file() else f"its process exited with status {proc.returncode}"
        raise CellFailed(cell, reason, log)
    return json.loads((cell_dir / "result.json").read_text())


def cached_result(cell: Cell, out: Path) -> dict[str, Any] | None:
    """A finished cell's result if its fingerprint still matches, else None."""
    path = out / "cells" / cell.key / "result.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    return result if result.get("fingerprint") == cell.fingerprint() else None


# ---------------------------------------------------------------------------------------------------- the grid
def run_grid(
    grid: str | Path | Grid,
    out: str | None = None,
    force: bool = False,
    keep_going: bool = False,
    stand_ins: tuple[str | Path, int] | None = None,
) -> Outcome:
    """Run (or reuse) every cell of the grid and write the summary.

    Every cell is parsed and instantiated first, so a grid naming a bad config or override fails before any cell
    runs (`GridError`), with or without `keep_going`. Then a failing cell stops the grid with `CellFailed`, or, with
    `keep_going`, is recorded (its row of the table says "failed: <reason>") and the rest of the grid runs.

    Args:
        grid: a grid file, or a `Grid` already loaded (its paths resolved).
        out: the folder for cells and report instead of the grid's `out` (and `report`).
        force: rerun cells even if a matching result exists.
        keep_going: record a failed cell and run the others instead of stopping.
        stand_ins: (folder, rows): run every file-backed dataset on random files in its real format, `rows` per
            split, written once under the folder (`lvfl.commands.bench.quick.with_stand_ins`).
    """
    from tqdm.auto import tqdm

    if not isinstance(grid, Grid):
        grid = load_grid(grid)
    out_dir = Path(out or grid.out)
    cells = grid.cells()
    if stand_ins is not None:
        cells = with_stand_ins(cells, *stand_ins)
    todo = [c for c in cells if force or cached_result(c, out_dir) is None]
    if todo:
        check_cells(todo)
    results: dict[Cell, dict[str, Any]] = {}
    failures: dict[Cell, str] = {}
    with tqdm(total=len(cells), desc=f"lvfl bench {grid.name}", unit="cell") as bar:
        for cell in cells:
            cached = None if force else cached_result(cell, out_dir)
            bar.set_postfix_str(("reused " if cached else "running ") + cell.key)
            try:
                results[cell] = cached if cached is not None else run_cell(cell, out_dir)
            except CellFailed as failed:
                if not keep_going:
                    raise
                failures[cell] = failed.reason
                results[cell] = {"error": failed.reason}
                tqdm.write(f"lvfl bench: {failed} (--keep-going: the grid goes on)", file=sys.stderr)
            bar.update()
    report_dir = Path(grid.report) if grid.report and not out else out_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = summarize(grid, results)
    table = write_table(grid, rows, report_dir)
    write_plots(grid, results, report_dir)
    if grid.attacks:
        rows_by_attack = attack_rows(grid, results)
        table += "\n" + write_attack_table(rows_by_attack, report_dir)
        write_attack_plots(grid, rows_by_attack, report_dir)
    return Outcome(table, report_dir, failures)
