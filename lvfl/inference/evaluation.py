"""The student's figures on a split: all the active party's samples, the overlap, and the samples only it holds.

The student answers for the active party alone, on its own features, so evaluating it needs no other party and sends
nothing: the active party's labels of the split and the datamodule's overlap mask are all it reads. Classification:
accuracy and (binary) AUROC; regression: R^2, MAE and RMSE in the target's own units, computed by the same
`lvfl.protocols.task_metrics` functions as the VFL model's figures (so the two read alike).
"""

from __future__ import annotations

from typing import Any

import torch
import torchmetrics
from torch import nn

from lvfl.parties import TaskInfo
from lvfl.protocols.task_metrics import make_metric, update_metric

__all__ = ["evaluate_student", "student_metrics"]


#: a regression student's figures, in the order they are reported
REGRESSION_FIGURES = ("r2", "mae", "rmse")


@torch.no_grad()
def evaluate_student(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor, num_classes: int, task: TaskInfo | None = None
) -> dict:
    """Accuracy (and AUROC for binary tasks, when both classes occur) of `model` on a set, via torchmetrics.

    With a regression `task`: R^2, MAE and RMSE of the student's values against the (standardized) `labels`, both
    taken back to the target's units by `task.to_target` (R^2 absent for fewer than two samples, where it is
    undefined); `num_classes` is then unused.
    """
    if features.shape[0] == 0:
        return {}
    model = model.cpu().eval()
    if task is not None and task.is_regression:
        out = model(features)
        figures = {}
        for name in REGRESSION_FIGURES:
            if name == "r2" and features.shape[0] < 2:
                continue
            metric = make_metric(task, name)
            update_metric(metric, name, task, out, labels)
            figures[name] = float(metric.compute())
        return figures
    probs = model(features).softmax(-1)
    out = {"acc": float(torchmetrics.functional.accuracy(probs, labels, task="multiclass", num_classes=num_classes))}
    if num_classes == 2 and labels.unique().numel() == 2:
        out["auroc"] = float(torchmetrics.functional.auroc(probs[:, 1], labels, task="binary"))
    return out


def student_metrics(
    model: nn.Module, datamodule: Any, num_classes: int, split: str = "test", prefix: str = "student"
) -> dict[str, float]:
    """`evaluate_student` on the active party's samples of `split`: all of them, the overlap, the active-only ones.

    Keys are `<prefix>/<split>/<metric>` (all samples), `.../<metric>/overlap` (the samples every party holds) and
    `.../<metric>/active_only` (those only the active party holds); a subset that is empty (e.g. overlap 1) has no
    keys, and AUROC is absent where a subset holds one class. A regression task (`datamodule.task`) gives R^2, MAE
    and RMSE in the target's units instead (`evaluate_student`).

    Args:
        model: the student.
        datamodule: a `VerticalDataModule` (`active_set`, `overlap_mask`, `active_party_name`).
        num_classes: M (unused for a regression).
        split: "train", "val" or "test".
        prefix: the keys' first component.
    """
    full = datamodule.active_set(split)
    mask = datamodule.overlap_mask(split)
    x, y = full.features[datamodule.active_party_name], full.labels
    task = getattr(datamodule, "task", None)
    task = task if task is not None and task.is_regression else None  # classification: as before, by num_classes
    out: dict[str, float] = {}
    for suffix, keep in (("", None), ("/overlap", mask), ("/active_only", ~mask)):
        xs, ys = (x, y) if keep is None else (x[keep], y[keep])
        for metric, value in evaluate_student(model, xs, ys, num_classes, task).items():
            out[f"{prefix}/{split}/{metric}{suffix}"] = value
    return out
