"""Which rows each split holds, and which of them every party holds: the seeded split and the overlap draw.

`draw_split` is the seeded train/val/test split (scikit-learn `train_test_split`, stratified on a key or label-free,
or a dataset's published split); `overlap_masks` says, per split, which samples exist at every party (a seeded,
stratified fraction alpha, or what the parties' own IDs say); `split_messages` is the active party's `split` message
to each passive participant where it cannot compute its rows of each split itself (its encoding is
`lvfl.datamodules.split`). `VerticalDataModule._prepare` runs them in that order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from lvfl.datamodules.split import SPLIT_TAG, decode_split, encode_split

__all__ = [
    "SPLITS",
    "check_fractions",
    "check_split_choice",
    "choose_overlap",
    "draw_split",
    "overlap_masks",
    "split_messages",
]

SPLITS = ("train", "val", "test")  #: the splits of every datamodule, in order


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Refuse split fractions outside (0, 1), or that leave no training samples.

    Raises:
        ValueError: naming the option at fault.
    """
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"val_fraction + test_fraction must be < 1 to leave training samples, got "
            f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
        )


def draw_split(
    num_rows: int,
    key: np.ndarray | None,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    fixed: dict[str, np.ndarray] | None = None,
    order: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Seeded split of the row indices, stratified by `key` (None: unstratified); each split's IDs sorted.

    Sorted so that val/test batches run in ID order. With `order` (a permutation of the rows), the split is drawn
    over the rows in that order, so that it does not depend on the rows' own order (`PartyTables`).

    Args:
        num_rows: rows of the dataset (row indices 0..num_rows-1).
        key: per row, what the split is stratified on; None: unstratified.
        seed: the `random_state` of every `train_test_split`.
        val_fraction: fraction of all rows in the validation split (of the rows outside a published test split).
        test_fraction: fraction of all rows in the test split (unused with a published test split).
        fixed: a published split (`VerticalDataModule.fixed_splits`): {"test": rows} and optionally {"val": rows}.
        order: a permutation of the rows to draw over; None: 0..num_rows-1.

    Raises:
        ValueError: the fractions leave a split too small (or a class too rare) to draw.
    """
    ids = np.arange(num_rows, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    try:
        if fixed is not None:
            test = np.asarray(fixed["test"], dtype=np.int64)
            rest = np.setdiff1d(ids, test)
            if "val" in fixed:
                val = np.asarray(fixed["val"], dtype=np.int64)
                train = np.setdiff1d(rest, val)
            else:
                train, val = train_test_split(
                    rest,
                    test_size=val_fraction,
                    stratify=None if key is None else key[rest],
                    random_state=seed,
                )
            return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}
        rest, test = train_test_split(
            ids, test_size=test_fraction, stratify=None if key is None else key[ids], random_state=seed
        )
        val_share = val_fraction / (1.0 - test_fraction)
        train, val = train_test_split(
            rest, test_size=val_share, stratify=None if key is None else key[rest], random_state=seed
        )
    except ValueError as err:
        what = "split" if key is None else "stratified split"
        raise ValueError(
            f"cannot make a {what} of {num_rows} samples with val_fraction={val_fraction}, "
            f"test_fraction={test_fraction}: {err}"
        ) from err
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def choose_overlap(labels: np.ndarray, split_index: int, alpha: float, seed: int) -> np.ndarray:
    """Boolean mask of the rows every party holds: round(alpha * n) rows (at least 1), stratified by label.

    Each class gets its share by largest remainders (so the total is exact), and the rows within a class are
    drawn with a generator seeded by (`seed`, split), independent of the split's own seeding.

    Args:
        labels: (n,) the stratum of each row of the split.
        split_index: the split's position in `SPLITS` (part of the generator's seed).
        alpha: the fraction of rows every party holds, in (0, 1].
        seed: the datamodule's seed.
    """
    n = len(labels)
    if alpha >= 1.0 or n == 0:
        return np.ones(n, dtype=bool)
    total = min(n, max(1, round(alpha * n)))
    classes, counts = np.unique(labels, return_counts=True)
    quota = alpha * counts
    take = np.floor(quota).astype(np.int64)
    remainder = quota - take
    for c in np.argsort(-remainder, kind="stable")[: total - int(take.sum())]:
        take[c] += 1
    while take.sum() > total:  # only when rounding `total` down; drop from the largest share
        take[int(np.argmax(take))] -= 1
    rng = np.random.default_rng([seed, split_index, 0x0E71A9])
    mask = np.zeros(n, dtype=bool)
    for c, k in zip(classes, take, strict=True):
        members = np.flatnonzero(labels == c)
        mask[rng.permutation(members)[:k]] = True
    return mask


def overlap_masks(
    rows: dict[str, np.ndarray],
    strata: np.ndarray | None,
    alpha: float,
    seed: int,
    held: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per split, a boolean mask over its rows: True where every party holds the sample.

    Args:
        rows: per split (in `SPLITS` order), the sorted row indices it holds.
        strata: per row of the dataset, what the draw is stratified on; None: one stratum (label-free).
        alpha: the fraction of every split's rows drawn to be held by every party (`choose_overlap`).
        seed: the datamodule's seed.
        held: which rows every party holds, where the data says so itself (`held_by_every_party`); then nothing
            is drawn.
    """
    if held is not None:
        return {split: np.asarray(held, dtype=bool)[idx] for split, idx in rows.items()}
    return {
        split: choose_overlap(np.zeros(len(idx), dtype=np.int64) if strata is None else strata[idx], i, alpha, seed)
        for i, (split, idx) in enumerate(rows.items())
    }


def split_messages(
    shared: dict[str, np.ndarray],
    sender: str,
    receivers: list[str],
    public: bool,
    shared_order: Callable[[np.ndarray], np.ndarray],
) -> tuple[list[tuple[str, str, Any, str]], dict[str, np.ndarray]]:
    """The split message to each passive participant, and the shared rows per split as passive parties read them.

    Where the split is public, or no passive party takes part, nothing is sent and `shared` is returned as is.
    Otherwise the passive parties' rows of each split are decoded from the message they receive, so that what
    they fit (scaling, encoders) follows from what crossed the wire.

    Args:
        shared: per split, the rows every party holds.
        sender: the active party's name.
        receivers: the passive participants' names.
        public: whether every party can compute the split itself (`VerticalDataModule.split_is_public`).
        shared_order: the shared sample IDs (sorted) -> in the order the passive parties know them
            (`VerticalDataModule.shared_order`).
    """
    if public or not receivers:
        return [], shared
    order = shared_order(np.sort(np.concatenate(list(shared.values()))))
    payload = encode_split(shared, order)
    received = decode_split(payload, order)
    if any(not np.array_equal(received[s], np.sort(shared[s])) for s in SPLITS):  # cannot happen
        raise RuntimeError("the split message does not reproduce the split")
    messages = [(sender, receiver, payload, SPLIT_TAG) for receiver in receivers]
    return messages, {s: received[s] for s in SPLITS}


def check_split_choice(split: str, dataset: str) -> str:
    """The `split` option of a dataset with a published test split: "published" or "random", else a clear error."""
    if split not in ("published", "random"):
        raise ValueError(
            f"{dataset}: split must be 'published' (the published test split) or 'random' (a seeded, stratified "
            f"split by val_fraction / test_fraction), got split={split!r}"
        )
    return split
