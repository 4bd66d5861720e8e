"""What `load()` returns, checked, and each party's columns of it: the parties' own tables before the split.

`VerticalDataModule._prepare` checks the arrays' shapes (`checked_arrays`), asks the partitioner which columns each
party holds (`party_columns`) and makes the features numbers that are finite (`finite_numbers`); every message names
the dataset or the first party at fault, so that a party's bad column is found in its own table.
"""

from __future__ import annotations

import numpy as np

from lvfl.datamodules.partition import Partitioner, check_columns

__all__ = ["check_finite", "checked_arrays", "finite_numbers", "numeric_features", "party_columns"]


def checked_arrays(x: np.ndarray, y: np.ndarray, dataset: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """`load()`'s features and targets checked to match; (N, H, W) images get a channel axis.

    Args:
        x: features of shape (N, F), (N, H, W) or (N, C, H, W).
        y: targets of shape (N,).
        dataset: the datamodule's class name (in error messages).

    Returns:
        The features ((N, F) or (N, C, H, W)), the targets, and whether the features are images.

    Raises:
        ValueError: shapes that do not fit, or no samples.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"features must be (N, F), (N, H, W) or (N, C, H, W), got shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"targets must have shape ({len(x)},) to match the features, got {y.shape}")
    if len(x) == 0:
        raise ValueError(f"{dataset} has no samples (features of shape {x.shape}): nothing to train on")
    is_image = x.ndim >= 3
    if x.ndim == 3:
        x = x[:, None]  # (N, H, W) -> (N, 1, H, W): each party's strip stays a one-channel image
    return x, y, is_image


def party_columns(partitioner: Partitioner, num_columns: int, num_parties: int, is_image: bool) -> list[list[int]]:
    """The column indices of every party, as `partitioner` chooses them (checked: `check_columns`).

    Args:
        partitioner: how columns are assigned to parties.
        num_columns: feature columns (the image width for images).
        num_parties: parties the columns are split among.
        is_image: whether the columns are an image's (in error messages).

    Raises:
        ValueError: more parties than columns, or a partition that is not one.
    """
    if num_parties > num_columns:
        what = " (image width)" if is_image else ""
        raise ValueError(
            f"num_parties={num_parties} exceeds the {num_columns} feature columns{what} available: "
            "every party needs at least one"
        )
    columns = [[int(c) for c in cols] for cols in partitioner.split(num_columns, num_parties)]
    check_columns(columns, num_columns=num_columns, num_parties=num_parties)
    return columns


def finite_numbers(x: np.ndarray, columns: dict[str, list[int]]) -> np.ndarray:
    """`x` as numbers (floating point kept as is, else `numeric_features`), checked finite (`check_finite`)."""
    if not np.issubdtype(x.dtype, np.floating):
        x = numeric_features(x, columns)
    check_finite(x, columns)
    return x


def numeric_features(x: np.ndarray, columns: dict[str, list[int]]) -> np.ndarray:
    """`x` as float32; features that are not numbers (strings, objects) fail naming the first party holding one.

    Args:
        x: every feature of every sample, of any dtype.
        columns: participating party name -> its column indices, in party order.
    """
    if np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.bool_):
        return x.astype(np.float32)
    for party, cols in columns.items():
        try:
            x[..., cols].astype(np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{party} has features that are not numbers (dtype {x.dtype}: {err}); encode "
                "categorical columns as numbers first"
            ) from err
    try:
        return x.astype(np.float32)
    except (TypeError, ValueError) as err:  # in columns no participant holds
        raise ValueError(f"features must be numbers, got dtype {x.dtype}: {err}") from err


def check_finite(x: np.ndarray, columns: dict[str, list[int]]) -> None:
    """Refuse NaN or inf in any participating party's columns, naming the first party holding one.

    Args:
        x: every feature of every sample, as numbers.
        columns: participating party name -> its column indices, in party order.
    """
    for party, cols in columns.items():
        # a few columns at a time: the check's temporaries stay small beside a million rows
        bad = sum(int(np.count_nonzero(~np.isfinite(x[..., cols[at : at + 16]]))) for at in range(0, len(cols), 16))
        if bad:
            raise ValueError(f"{party} has {bad} non-finite feature values (NaN or inf); clean or impute them first")
