"""The active party's labels checked and made into training targets: class indices, or standardized real values.

`VerticalDataModule` checks what `load()` returns here: class labels must be integers 0..M-1 (`check_labels`),
regression targets finite real numbers (`check_targets`), which are standardized with the training rows' mean and
standard deviation (`standardized_targets`); the messages say what is wrong and quote the offending values.
`training_labels` gives the labels a model trains on, and the task, either way.
"""

from __future__ import annotations

import numpy as np

from lvfl.parties import TaskInfo

__all__ = ["check_labels", "check_targets", "standardized_targets", "training_labels"]

_MAX_LISTED = 10  # bad values quoted in an error message


def check_labels(y: np.ndarray, num_classes: int | None = None) -> int:
    """Check labels are integers in 0..M-1 and return M (`num_classes`, or the number of distinct labels).

    Args:
        y: (N,) class labels.
        num_classes: the number of classes M the dataset declares; None: the number of distinct labels.

    Raises:
        ValueError: labels that are not integer class indices in range, or fewer than 2 classes.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of class indices, got shape {y.shape}")
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_)):
        if not np.issubdtype(y.dtype, np.floating):
            raise ValueError(
                f"labels must be integer class indices 0..M-1, got dtype {y.dtype} (values such as "
                f"{np.unique(y.astype(str))[:3].tolist()}); encode them as integers first"
            )
        bad = np.unique(y[~np.isfinite(y) | (y != np.round(y))])
        if bad.size:
            raise ValueError(
                f"labels must be integer class indices; found non-integer values {bad[:_MAX_LISTED].tolist()}"
            )
    num_classes = num_classes if num_classes is not None else int(np.unique(y).size)
    if num_classes < 2:
        raise ValueError(f"a classification task needs at least 2 classes, found {num_classes}")
    bad = np.unique(y[(y < 0) | (y >= num_classes)])
    if bad.size:
        raise ValueError(
            f"labels must be in 0..{num_classes - 1} (num_classes={num_classes}); found out-of-range label "
            f"values {bad[:_MAX_LISTED].tolist()}"
        )
    return num_classes


def check_targets(y: np.ndarray) -> np.ndarray:
    """Check regression targets are one finite real number per sample; return them as float64.

    Raises:
        ValueError: targets that are not one finite number per sample.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"regression targets must be a 1-D array, one value per sample, got shape {y.shape}")
    if not (np.issubdtype(y.dtype, np.number) or np.issubdtype(y.dtype, np.bool_)):
        raise ValueError(
            f"regression targets must be numbers, got dtype {y.dtype} (values such as "
            f"{np.unique(y.astype(str))[:3].tolist()})"
        )
    y = y.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        raise ValueError(
            f"regression targets must be finite; rows {bad[:_MAX_LISTED].tolist()} hold NaN or inf ({bad.size} in all)"
        )
    return y


def standardized_targets(y: np.ndarray, train_rows: np.ndarray) -> tuple[np.ndarray, TaskInfo]:
    """The targets standardized with the training rows' mean and standard deviation, and the task that undoes it.

    Args:
        y: (N,) regression targets (checked here).
        train_rows: the row indices of the training split.

    Raises:
        ValueError: targets that are not finite numbers, or constant over the training rows.
    """
    y = check_targets(y)
    mean, std = float(y[train_rows].mean()), float(y[train_rows].std())
    if not std > 0:
        raise ValueError(
            f"the regression target is constant ({mean}) over the {len(train_rows)} training rows: nothing to learn"
        )
    task = TaskInfo(num_classes=0, kind="regression", target_mean=mean, target_scale=std)
    return ((y - mean) / std).astype(np.float32), task


def training_labels(
    y: np.ndarray, train_rows: np.ndarray, regression: bool, num_classes: int | None = None
) -> tuple[np.ndarray, TaskInfo]:
    """The labels a model trains on and the task: int64 class indices (checked), or standardized regression targets.

    Args:
        y: (N,) class labels, or regression targets (`regression`).
        train_rows: the row indices of the training split (regression targets are standardized with them).
        regression: whether `y` are real values to regress on.
        num_classes: the number of classes the dataset declares; None: the number of distinct labels.
    """
    if regression:
        return standardized_targets(y, train_rows)
    labels = np.asarray(y)
    num_classes = check_labels(labels, num_classes)
    task = TaskInfo(num_classes=num_classes, kind="binary" if num_classes == 2 else "multiclass")
    return labels.astype(np.int64), task
