"""What `lvfl fit` tells the person who ran it: a line per epoch where no progress bar draws, and a closing summary.

A progress bar is for a terminal: redirected to a file it is hundreds of kilobytes of carriage returns, so
`lvfl.commands.fit` turns it off where standard output is not a terminal (unless the config sets
`trainer.enable_progress_bar`), and `EpochLines` prints one line per epoch instead. `EpochLines` also records every
epoch's validation figures, from which `fit_summary` writes the summary `lvfl fit` ends with: the best and the last
value of the task's main validation metric per party (and the epoch of each party's best), the epoch `best.ckpt` holds,
the megabytes on the wire, the PSI's intersection (own tables), the process's peak memory beside the features and
model parameters it holds, and where the checkpoints and logs are.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lvfl.parties import TaskInfo, party_name
from lvfl.progress import peak_memory_mb
from lvfl.protocols.task_metrics import BEST_EPOCHS_METRIC, main_validation_metric

__all__ = ["EpochLines", "describe_task", "fit_summary"]


def _main_metric(trainer: Trainer) -> str | None:
    """The task's main validation metric's name, e.g. ``val/auroc/mean`` (None: the datamodule has no task)."""
    task = getattr(getattr(trainer, "datamodule", None), "task", None)
    return main_validation_metric(task) if isinstance(task, TaskInfo) else None


def _family(metric: str) -> str:
    """``val/auroc`` of ``val/auroc/mean``: the prefix every party's value of that metric shares."""
    return metric.rsplit("/", 1)[0]


class EpochLines(Callback):
    """Records each epoch's validation figures; prints one line per epoch when the trainer has no progress bar.

    Args:
        print_lines: print the lines (None: exactly when the trainer draws no progress bar).
    """

    def __init__(self, print_lines: bool | None = None) -> None:
        self.print_lines = print_lines
        self.history: list[dict[str, float]] = []  # per validated epoch: {"epoch": e (1-based), metric: value}
        self.metric: str | None = None
        self._started = 0.0
        self._validated = False

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Note the main metric and the clock."""
        self.metric = _main_metric(trainer)
        self._started = time.perf_counter()

    def _printing(self, trainer: Trainer) -> bool:
        if self.print_lines is not None:
            return self.print_lines
        return trainer.progress_bar_callback is None and trainer.is_global_zero

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Note that this epoch validated (not the sanity check); its figures are complete at the epoch's end.

        (A callback's hook runs before the module's, which logs the mean over the parties.)
        """
        if not trainer.sanity_checking:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Record the epoch's main metric per party; one line: those (best so far?), the loss, the time."""
        epoch = trainer.current_epoch + 1
        if self._validated and self.metric is not None:
            family = _family(self.metric) + "/"
            metrics = trainer.callback_metrics
            values = {k: float(v) for k, v in metrics.items() if k.startswith(family) and v.numel() == 1}
            if values:
                self.history.append({"epoch": epoch, **values})
        self._validated = False
        if not self._printing(trainer):
            return
        bounded = trainer.max_epochs is not None and trainer.max_epochs > 0
        parts = [f"epoch {epoch}/{trainer.max_epochs}" if bounded else f"epoch {epoch}"]
        last = self.history[-1] if self.history and self.history[-1]["epoch"] == epoch else None
        if last is not None and self.metric is not None:
            family = _family(self.metric)
            shown = " ".join(f"{k[len(family) + 1 :]} {v:.4f}" for k, v in last.items() if k != "epoch")
            before = max((h.get(self.metric, float("-inf")) for h in self.history[:-1]), default=None)
            value = last.get(self.metric)  # "best" as best.ckpt keeps it: a strict improvement (a tie keeps the first)
            mark = " (best)" if before is not None and value is not None and value > before else ""
            parts.append(f"{family} {shown}{mark}")
        losses = [float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/loss_epoch/")]
        if losses:
            parts.append(f"train loss {sum(losses) / len(losses):.4f}")
        parts.append(f"{time.perf_counter() - self._started:.1f} s")
        print("  ".join(parts), flush=True)


def _table(history: list[dict[str, float]], metric: str) -> list[str]:
    """Rows ``who  best (epoch)  last`` of the main metric's family, one per party (and mean, aggregate)."""
    family = _family(metric)
    who = [k[len(family) + 1 :] for k in history[-1] if k != "epoch"]
    order = sorted(who, key=lambda w: (not w.startswith("party"), w != "mean", _natural(w)))
    last_epoch = int(history[-1]["epoch"])
    rows = [f"  {family:<16} {'best (epoch)':<18} last (epoch {last_epoch})"]
    for name in order:
        key = f"{family}/{name}"
        scored = [(h[key], int(h["epoch"])) for h in history if key in h]
        if not scored:
            continue
        value, epoch = max(scored, key=lambda s: (s[0], -s[1]))  # the first epoch reaching the best value
        rows.append(f"  {name:<16} {f'{value:.4f} ({epoch})':<18} {history[-1].get(key, float('nan')):.4f}")
    return rows


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def _psi(counts: dict[str, int]) -> str | None:
    """``604 shared IDs; party0 holds 900, party1 812`` from a `PartyTables` datamodule's `psi_counts`."""
    if "intersection" not in counts:
        return None
    held = [f"{k[: -len('/ids')]} {v:,}" for k, v in counts.items() if k.endswith("/ids")]
    return f"{counts['intersection']:,} IDs every party holds" + (f" (of {', '.join(held)})" if held else "")


def _student(trainer: Trainer, datamodule: Any) -> str | None:
    """The student's line: its main test figure and where it was saved; None where the run fitted no student.

    The figure is given on the active party's test samples, on those every party holds, and on those only the active
    party holds (which the VFL model cannot answer): the student answers them all.
    """
    student = next((cb for cb in trainer.callbacks if type(cb).__name__ == "StudentDistillation"), None)
    metrics = dict(getattr(student, "metrics", None) or {})
    task = getattr(datamodule, "task", None)
    if not metrics or not isinstance(task, TaskInfo):
        return None
    name = "r2" if task.is_regression else "auroc" if task.num_classes == 2 else "acc"
    key = f"student/test/{name}"
    if key not in metrics:
        return None
    active = datamodule.active_party_name
    mask = datamodule.overlap_mask("test")
    total, shared = len(mask), int(mask.sum())
    parts = [f"test {name} {metrics[key]:.4f} on {active}'s {total:,} test samples"]
    for suffix, count, who in (
        ("overlap", shared, "every party holds"),
        ("active_only", total - shared, "only it holds"),
    ):
        if f"{key}/{suffix}" in metrics:
            parts.append(f"{metrics[f'{key}/{suffix}']:.4f} on the {count:,} {who}")
    folder = getattr(trainer.checkpoint_callback, "dirpath", None)
    saved = Path(folder) / "student.pt" if folder else None
    where = f"saved: {saved}" if saved is not None and saved.is_file() else "not saved"
    return parts[0] + (f" ({', '.join(parts[1:])})" if parts[1:] else "") + f"; {where}"


def _unanswered(datamodule: Any) -> str | None:
    """Without a student: how many of the active party's test samples no model will answer (it alone holds them)."""
    overlap = getattr(datamodule, "overlap_mask", None)
    if overlap is None:
        return None
    try:
        mask = overlap("test")
    except (RuntimeError, ValueError, KeyError):  # a process that does not hold the active party's view
        return None
    alone = len(mask) - int(mask.sum())
    if not alone:
        return None
    active = datamodule.active_party_name
    return (
        f"{alone:,} of {active}'s {len(mask):,} test samples are held by {active} alone, and no model answers them: "
        "the VFL model needs every party's part (a student would: --trainer.callbacks+=lvfl.callbacks."
        "StudentDistillation)"
    )


def describe_task(task: TaskInfo, names: list[str] | None = None) -> str:
    """``3 classes: high, low, medium``, ``2 classes (binary): default, ok``, ``10 classes`` or ``regression``."""
    if task.kind == "regression" or task.num_classes == 0:
        return "regression"
    kind = " (binary)" if task.num_classes == 2 else ""
    listed = f": {', '.join(str(n) for n in names)}" if names and len(names) == task.num_classes else ""
    return f"{task.num_classes} classes{kind}{listed}"


def _size(nbytes: float) -> str:
    """A byte count as a person reads it: kB below a megabyte, else MB."""
    return f"{nbytes / 1e3:,.1f} kB" if nbytes < 1e6 else f"{nbytes / 1e6:,.1f} MB"


def _memory(model: Any, datamodule: Any) -> str:
    """The process's peak resident memory, beside the features its datamodule holds and its model's parameters."""
    held = getattr(datamodule, "held_feature_bytes", None)
    features = held() if callable(held) else 0
    params = 0
    if isinstance(model, torch.nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
        params = sum(t.nbytes for t in tensors if t.device.type != "meta")  # another party's: shadows
    before = getattr(datamodule, "peak_mb_before_setup", None)
    before = f" ({before:,.0f} MB before the data's set-up)" if before is not None else ""
    return (
        f"  memory: peak {peak_memory_mb():,.0f} MB in this process{before}; it holds {_size(features)} of features "
        f"and {_size(params)} of model parameters"
    )


def fit_summary(trainer: Trainer, model: Any, datamodule: Any, seconds: float | None = None) -> str:
    """The lines `lvfl fit` ends with (see the module docstring); only what this process knows."""
    record = next((cb for cb in trainer.callbacks if isinstance(cb, EpochLines)), None)
    epochs = trainer.current_epoch
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    device = trainer.strategy.root_device.type
    lines = [f"lvfl fit: {epochs} epoch{'s' if epochs != 1 else ''}{took} ({type(model).__name__}, {device})"]
    task = getattr(model, "task", None) or getattr(datamodule, "task", None)
    if isinstance(task, TaskInfo):
        lines.append(f"  task: {describe_task(task, getattr(datamodule, 'label_names', None))}")
    wire = getattr(model, "wire", None)
    here, active = getattr(wire, "here", None), getattr(datamodule, "active_party", None)
    if record is not None and record.history and record.metric is not None:
        lines += _table(record.history, record.metric)
    elif here is not None and active is not None and here != party_name(active):
        lines.append(f"  validation: scored at {party_name(active)}, which holds the labels")
    elif record is not None and record.metric is not None:
        lines.append("  validated no epoch")
    if wire is not None:
        total = wire.total_bytes()
        whose = " (rank 0's share; the ledger above sums every rank)" if trainer.world_size > 1 else ""
        lines.append(f"  wire: {total / 1e6:.3f} MB ({total:,} bytes) in {wire.total_messages():,} messages{whose}")
    student = _student(trainer, datamodule)
    if student is not None:
        lines.append(f"  student: {student}")
    elif here is None or active is None or here == party_name(active):  # the process that holds the active party
        unanswered = _unanswered(datamodule)
        if unanswered is not None:
            lines.append(f"  unanswered: {unanswered}")
    psi = _psi(dict(getattr(datamodule, "psi_counts", None) or {}))
    if psi is not None:
        lines.append(f"  PSI: {psi}")
    lines.append(_memory(model, datamodule))
    for keeper in (cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)):
        best, last = keeper.best_model_path, keeper.last_model_path
        if best and Path(best).is_file():
            score = keeper.best_model_score
            about = []
            if record is not None and score is not None and keeper.monitor:
                kept = [int(h["epoch"]) for h in record.history if h.get(keeper.monitor) == float(score)]
                about += [f"epoch {kept[0]}"] if kept else []
            if keeper.monitor == BEST_EPOCHS_METRIC:  # a passive party's process: the active party says which
                about.append("the epoch the active party found best")
            elif score is not None and keeper.monitor:
                about.append(f"{keeper.monitor} {float(score):.4f}")
            lines.append(f"  best: {best}" + (f" ({', '.join(about)})" if about else ""))
        if last and Path(last).is_file():
            lines.append(f"  last: {last}")
    if trainer.loggers and getattr(trainer.loggers[0], "log_dir", None):  # (trainer.log_dir is a collective)
        lines.append(f"  logs: {trainer.loggers[0].log_dir}")
    return "\n".join(lines)
