"""The train/val/test split as the passive parties learn it: one code per shared sample, sent by the active party.

Which split a sample belongs to is decided where the labels are (the active party): a split stratified on the true
labels is a function of them, and even a label-free one is a function of IDs that only the active party holds (its
rows that no passive party shares). A passive party therefore cannot compute its rows of each split itself; the
active party tells it, on the wire (tag `split`, set-up traffic), one byte per sample every party holds, in the order
the passive parties know those samples (`VerticalDataModule.shared_order`): 0 train, 1 val, 2 test. The passive party
fits its scaling (and, for `PartyTables`, its encoders) on the rows the message puts in `train`.

Where the split is public (label-free, over rows every party can name: the embedded and paper datasets with
`stratify: none` or a label mechanism), every party computes it from the config's seed and no message is sent.

What the message reveals is the split of the shared samples, nothing else; what the *split* reveals depends on how it
was drawn (see `VerticalDataModule`'s `stratify` option): stratified on the true labels it carries label information
(a passive party that knows the seed can search for labels that reproduce it), label-free it carries none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["SPLIT_CODES", "SPLIT_TAG", "decode_split", "encode_split", "keyed_order"]

SPLIT_TAG = "split"  #: the wire tag of the split message
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}  #: the byte that stands for each split
_DTYPE = np.dtype(np.uint8)


def encode_split(rows: Mapping[str, np.ndarray], order: np.ndarray) -> bytes:
    """One byte per sample of `order` (sample IDs): the code of the split in `rows` that holds it.

    Raises:
        ValueError: a sample of `order` is in no split of `rows`.
    """
    order = np.asarray(order, dtype=np.int64)
    position = {int(sample): i for i, sample in enumerate(order.tolist())}
    codes = np.full(len(order), 255, dtype=_DTYPE)
    for split, code in SPLIT_CODES.items():
        for sample in np.asarray(rows.get(split, ()), dtype=np.int64).tolist():
            if sample in position:
                codes[position[sample]] = code
    if (codes == 255).any():
        missing = order[codes == 255][:10].tolist()
        raise ValueError(f"samples {missing} are in no split; cannot encode the split message")
    return codes.tobytes()


def decode_split(payload: bytes, order: np.ndarray) -> dict[str, np.ndarray]:
    """The samples of `order` per split, as the receiver reads them off `payload`, each split sorted.

    Raises:
        ValueError: the message does not hold one valid code per sample of `order`.
    """
    codes = np.frombuffer(payload, dtype=_DTYPE)
    order = np.asarray(order, dtype=np.int64)
    if codes.shape != order.shape:
        raise ValueError(f"the split message holds {codes.size} codes for {order.size} shared samples")
    bad = np.setdiff1d(np.unique(codes), list(SPLIT_CODES.values()))
    if bad.size:
        raise ValueError(f"the split message holds unknown codes {bad.tolist()}")
    return {split: np.sort(order[codes == code]) for split, code in SPLIT_CODES.items()}


def keyed_order(keys: Sequence[str], seed: int) -> np.ndarray:
    """The positions of `keys` ordered by SHA-256 of (`seed`, key): an order that depends on the set of keys only.

    A split drawn over this order does not depend on the order of the rows in a file (which may carry information,
    e.g. a table sorted by a private column); ties cannot occur for distinct keys short of a hash collision.
    """
    prefix = f"lvfl-split\x00{int(seed)}\x00".encode()
    digests = [hashlib.sha256(prefix + key.encode()).digest() for key in keys]
    return np.asarray(sorted(range(len(keys)), key=digests.__getitem__), dtype=np.int64)
