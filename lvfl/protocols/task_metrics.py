"""The metrics of a task, built and fed the same way by every protocol.

Classification: accuracy, and AUROC on binary tasks (of the positive class's probability). Regression: MAE, RMSE and
R^2, computed in the target's own units (`TaskInfo.to_target` undoes the standardization the labels travel in), so
the figures read like scikit-learn's `mean_absolute_error`, `root_mean_squared_error` and `r2_score` on the raw
targets. Each is logged as `{stage}/{metric}/{party}` and, over the predicting parties, `{stage}/{metric}/mean`.
"""

from __future__ import annotations

import torch
import torchmetrics

from lvfl.parties import TaskInfo

__all__ = ["metric_names", "make_metric", "update_metric"]

REGRESSION_METRICS = ("mae", "rmse", "r2")


def metric_names(task: TaskInfo) -> tuple[str, ...]:
    """The metrics reported for `task`, in the order they are logged."""
    if task.is_regression:
        return REGRESSION_METRICS
    return ("acc", "auroc") if task.kind == "binary" else ("acc",)


def make_metric(task: TaskInfo, name: str) -> torchmetrics.Metric:
    """A fresh torchmetrics object for metric `name` of `task`."""
    makers = {
        "acc": lambda: torchmetrics.Accuracy(task="multiclass", num_classes=task.num_classes),
        "auroc": lambda: torchmetrics.AUROC(task="binary"),
        "mae": torchmetrics.MeanAbsoluteError,
        "rmse": lambda: torchmetrics.MeanSquaredError(squared=False),
        "r2": torchmetrics.R2Score,
    }
    if name not in metric_names(task):
        raise ValueError(f"metric {name!r} does not fit a {task.kind} task (its metrics: {list(metric_names(task))})")
    return makers[name]()


def update_metric(
    metric: torchmetrics.Metric, name: str, task: TaskInfo, out: torch.Tensor, labels: torch.Tensor
) -> None:
    """Feed a batch's model outputs `out` (logits, or standardized values of shape (N, 1)) and labels to `metric`."""
    if task.is_regression:
        metric(task.to_target(out.reshape(-1).float()), task.to_target(labels.reshape(-1).float()))
    elif name == "auroc":
        metric(out.softmax(-1)[:, 1], labels)
    else:
        metric(out, labels)


#: what a passive party's own process selects its best epoch by: the running count of epochs the active party
#: found best (`lvfl.protocols.base.VFLModule.share_best_epoch`), since it holds no labels to score one itself
BEST_EPOCHS_METRIC = "val/best_epochs"


def main_validation_metric(task: TaskInfo) -> str:
    """The metric the best epoch of a `task` (`lvfl.parties.TaskInfo`) is selected by; every one is maximised.

    Accuracy for a multiclass task, AUROC for a binary one (accuracy hides a minority class), R^2 for a regression
    (in the target's units, and higher is better like the others).
    """
    if task.is_regression:
        return "val/r2/mean"
    return "val/auroc/mean" if task.kind == "binary" else "val/acc/mean"
