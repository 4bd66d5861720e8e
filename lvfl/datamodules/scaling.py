"""A party's slice of the data made into model input: encoded and scaled from its own training rows.

Each party's features (checked by `lvfl.datamodules.features`) are cut into one contiguous slice per split and
standardized with statistics of the party's own training rows only: in a deployment no party sees another's
features, so a statistic pooled across parties could not be computed without a protocol of its own.

- Tabular slices (`scaled_slices`) become float32, numeric columns standardized and categorical codes checked and
  kept as they are; the fitted statistics are returned for `VerticalDataModule.scaling` (what `lvfl export` writes).
- uint8 image strips (`pixel_slices`) stay uint8 and get a `PixelNormalizer`, which the datamodule applies per batch
  on the device.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import torch
from sklearn.preprocessing import StandardScaler

from lvfl.datamodules.column_memory import is_releasable, release_rows

__all__ = ["PixelNormalizer", "apply_scaling", "pixel_slices", "scaled_slices"]

_MAX_LISTED = 10  # bad values quoted in an error message
_FIT_ROWS = 65_536  # rows a scaler takes at a time (its float64 temporaries stay this size, not the table's)
_GATHER_ROWS = 32_768  # rows copied into a split's slice at a time, then given back (`_gathered`)


class PixelNormalizer:
    """Turns one party's stored uint8 pixels into model input: `(x - mean) / std` per channel, in float32.

    Images stay uint8 in memory and on the way to the device (a quarter of float32's bytes); this runs per batch,
    on the batch's device, after the transfer (`VerticalDataModule.on_after_batch_transfer`).

    Args:
        mean: (C,) per-channel mean of the party's training pixels (0..255 scale).
        std: (C,) per-channel standard deviation (> 0).
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean = mean.to(torch.float32)
        self.std = std.to(torch.float32)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize a (..., C, H, W) uint8 tensor to float32 on its own device."""
        if x.device not in self._on:
            shape = (-1, 1, 1)
            self._on[x.device] = (self.mean.to(x.device).view(shape), (1.0 / self.std).to(x.device).view(shape))
        mean, inv_std = self._on[x.device]
        return (x.to(torch.float32) - mean) * inv_std

    def __repr__(self) -> str:
        return f"PixelNormalizer(mean={self.mean.tolist()}, std={self.std.tolist()})"


def pixel_slices(
    x: np.ndarray, cols: list[int], rows: dict[str, np.ndarray], scale: bool
) -> tuple[dict[str, torch.Tensor], PixelNormalizer]:
    """One party's uint8 strip per split (contiguous) and its normalizer from its own training pixels.

    Per-channel mean and standard deviation over the party's training strip (`scale`), or none (values 0..255).

    Args:
        x: (N, C, H, W) uint8 images.
        cols: the party's columns (image width).
        rows: per split, the row indices the party holds.
        scale: whether to standardize with the training strip's statistics.
    """
    col_index = np.asarray(cols, dtype=np.int64)
    part = {split: np.ascontiguousarray(x[idx][..., col_index]) for split, idx in rows.items()}
    channels = x.shape[1]
    if scale:
        train = part["train"]
        mean = np.zeros(channels)
        std = np.ones(channels)
        for c in range(channels):  # float64 sums channel by channel: no float copy of the whole strip
            values = train[:, c]
            mean[c] = values.mean(dtype=np.float64)
            std[c] = np.sqrt(max(float(np.mean(np.square(values, dtype=np.float64))) - mean[c] ** 2, 0.0))
        std[std <= 0] = 1.0  # a constant strip (blank margin) is only centred
    else:
        mean, std = np.zeros(channels), np.ones(channels)
    normalizer = PixelNormalizer(torch.from_numpy(mean), torch.from_numpy(std))
    return {split: torch.from_numpy(p) for split, p in part.items()}, normalizer


def apply_scaling(x: np.ndarray, fitted: dict[str, Any] | None) -> np.ndarray:
    """Encoded rows standardized with a party's fitted statistics (`scaled_slices`' second output), as float32.

    What new rows go through (`lvfl predict` with `new_rows`, `lvfl serve`): the training rows' own arithmetic,
    (x - mean) / scale in float64 on the listed columns (or all), then float32.
    """
    x = x.astype(np.float64)
    if fitted is not None:
        columns = list(range(x.shape[1])) if fitted["columns"] == "all" else fitted["columns"]
        x[:, columns] = (x[:, columns] - np.asarray(fitted["mean"])) / np.asarray(fitted["scale"])
    return np.ascontiguousarray(x, dtype=np.float32)


def scaled_slices(
    x: np.ndarray,
    cols: list[int],
    rows: dict[str, np.ndarray],
    is_image: bool,
    scale: bool,
    cats: list[int] | None = None,
    party: str = "",
    release: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """One party's slice per split, standardized with its training rows' statistics, as contiguous float32.

    Each party is scaled from its own columns only. Categorical columns (`cats[j] > 0`) are checked to be codes
    0..c-1 and kept as they are.

    Args:
        x: every feature of every sample, as numbers: (N, F) or (N, C, H, W).
        cols: the party's columns.
        rows: per split, the row indices the party holds.
        is_image: whether `x` holds images (then one mean/std over the party's whole training strip).
        scale: whether to standardize (tabular: per column; images: one mean/std per party).
        cats: per column of the party, 0 (numeric) or its number of categories; None: all numeric.
        party: the party's name (in error messages).
        release: the party's columns of `x` are never read again: where `x` can give its memory back
            (`lvfl.datamodules.column_memory`), they are reordered in place and give it back as the slices take
            their rows (`_gathered`), so that the table and its slices are not both whole at once.

    Returns:
        The slice per split, and the fitted standardization (`{"columns": ..., "mean": ..., "scale": ...}`, the
        entry of `VerticalDataModule.scaling`), or None where nothing was scaled.
    """
    if x.ndim == 2:  # only the party's columns of only its rows are copied, never a whole row of every party
        part = _gathered(x, cols, rows, release)
    else:
        part = {split: x[idx][..., cols] for split, idx in rows.items()}
    if cats is not None and any(cats):
        return _mixed_slices(part, cats, party, scale)
    fitted = None
    if scale and is_image:
        train = part["train"]
        mean = float(train.mean(dtype=np.float64))
        std = float(train.std(dtype=np.float64))
        std = std if std > 0 else 1.0  # a constant strip (blank margin) is only centred
        part = {split: (p - mean) / std for split, p in part.items()}
        fitted = {"columns": "all", "mean": [mean], "scale": [std]}
    elif scale:
        scaler = _fitted(part["train"])
        part = {split: scaler.transform(p, copy=False) for split, p in part.items()}  # the slices are copies
        fitted = {"columns": "all", "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist()}
    return {split: torch.from_numpy(np.ascontiguousarray(p, dtype=np.float32)) for split, p in part.items()}, fitted


def _gathered(x: np.ndarray, cols: list[int], rows: dict[str, np.ndarray], release: bool) -> dict[str, np.ndarray]:
    """Each split's rows of the party's columns of `x`, C-contiguous: the values of `x[np.ix_(rows, cols)]`.

    With `release` and a table that can give its memory back (`column_memory.is_releasable`), the party's columns
    are first put in the splits' row order in place (one column at a time), so that each split is a run of rows;
    each split is then copied `_GATHER_ROWS` rows at a time, and every run of rows copied is given back at once.
    The table and the slices never stand whole together: a column-major table's pages hold one column's rows, a
    row-major slice's pages every column of a few rows, so no other order of copying frees either while it fills.
    """
    if not (release and is_releasable(x)):
        return {split: np.ascontiguousarray(x[np.ix_(idx, cols)]) for split, idx in rows.items()}
    order = np.concatenate([np.asarray(idx, dtype=np.int64) for idx in rows.values()])
    for column in cols:  # its rows in the splits' order, in place (a column's copy at a time)
        values = x[:, column]
        values[: len(order)] = values[order]
    part, first, released = {}, 0, 0
    page_rows = mmap.PAGESIZE // x.itemsize  # a page not yet given back begins after the last end less this
    for split, idx in rows.items():
        part[split] = np.empty((len(idx), len(cols)), dtype=x.dtype)
        for start in range(0, len(idx), _GATHER_ROWS):
            stop = min(start + _GATHER_ROWS, len(idx))
            part[split][start:stop] = x[first + start : first + stop][:, cols]
            release_rows(x, cols, released, first + stop)
            released = max(0, first + stop - page_rows)
        first += len(idx)
    return part


def _fitted(train: np.ndarray) -> StandardScaler:
    """A `StandardScaler` fitted on `train`; a large one `_FIT_ROWS` rows at a time (`partial_fit`).

    Chunked, the statistics equal one fit's up to float rounding, and sklearn's float64 temporaries stay a chunk's size.
    """
    if len(train) <= _FIT_ROWS:
        return StandardScaler().fit(train)
    scaler = StandardScaler()
    for start in range(0, len(train), _FIT_ROWS):
        scaler.partial_fit(train[start : start + _FIT_ROWS])
    return scaler


def _mixed_slices(
    part: dict[str, np.ndarray], cats: list[int], party: str, scale: bool
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """Numeric columns standardized (training rows), categorical codes checked and kept, as float32."""
    numeric = [j for j, c in enumerate(cats) if c == 0]
    for j, c in enumerate(cats):
        if c == 0:
            continue
        if c >= 2**24:
            raise ValueError(f"{party}'s column {j} has {c} categories; codes above 2**24 are not exact in float32")
        for split, p in part.items():
            col = p[:, j]
            bad = (col < 0) | (col >= c) | (col != np.round(col))
            if bad.any():
                raise ValueError(
                    f"{party}'s column {j} is categorical with {c} categories, so its values must be codes "
                    f"0..{c - 1}; found {col[bad][:_MAX_LISTED].tolist()} in the {split} split"
                )
    out = {split: p.astype(np.float32, copy=False) for split, p in part.items()}  # the slices are copies
    fitted = None
    if scale and numeric:
        scaler = _fitted(part["train"][:, numeric])
        for split, p in part.items():
            out[split][:, numeric] = scaler.transform(p[:, numeric])
        fitted = {"columns": numeric, "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist()}
    return {split: torch.from_numpy(np.ascontiguousarray(p)) for split, p in out.items()}, fitted
