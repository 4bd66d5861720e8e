"""The tensor datasets a `VerticalDataModule` serves: one split held as one contiguous tensor per party.

`VerticalTensorDataset` is indexed by a whole batch of indices at once (no per-sample `__getitem__` and collation);
`RawView` serves it as stored (uint8 pixels stay uint8) to the DataLoaders. `split_views` builds, from every party's
prepared slices, the two views of each split a datamodule keeps (the active party's and the VFL one), `held_views`
what one party's own process keeps of them, and `select_rows` gathers samples by ID across splits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from lvfl.parties import VFLBatch
from lvfl.wire import shadow

__all__ = ["RawView", "VerticalTensorDataset", "held_views", "select_rows", "split_views"]

_MAX_LISTED = 10  # missing IDs quoted in an error message


class VerticalTensorDataset(Dataset):
    """One split, held as one contiguous tensor per party; indexed by a whole batch of indices at once.

    `DataLoader` calls `__getitems__` with a whole batch of indices (a tensor from `IndexTensorBatchSampler`, or a
    list), so a batch is one tensor indexing per party instead of per-sample `__getitem__` calls and collation.

    A party's slice is *stored* as loaded (uint8 pixels for image datasets) and `decoders[party]` turns it into model
    input. `features`, `__getitems__` and `subset` give model input (decoded); the training loaders read `raw()`, whose
    batches stay in the stored dtype until the datamodule decodes (and augments) them on the device.

    Attributes:
        ids: (N,) int64 sample IDs (row index in the original dataset).
        stored: party name -> (N, ...) tensor of that party's slice as stored (float32, or uint8 pixels).
        labels: (N,) int64 class labels.
        decoders: party name -> function from a stored batch slice to model input; parties not listed are stored
            as model input already.
    """

    def __init__(
        self,
        ids: torch.Tensor,
        features: dict[str, torch.Tensor],
        labels: torch.Tensor,
        decoders: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        self.ids = ids
        self.stored = features
        self.labels = labels
        self.decoders = dict(decoders or {})

    @property
    def features(self) -> dict[str, torch.Tensor]:
        """Every party's whole slice as model input (decoded on each access for uint8 image slices)."""
        return self.decode(self.stored)

    def decode(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Stored slices (a batch's or the whole split's) -> model input, party by party."""
        if not self.decoders:
            return features
        return {k: self.decoders[k](x) if k in self.decoders else x for k, x in features.items()}

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def gather(self, indices: Sequence[int] | torch.Tensor) -> VFLBatch:
        """The batch of samples at positions `indices` (not IDs), as stored (not decoded)."""
        index = torch.as_tensor(indices, dtype=torch.long)
        return VFLBatch(  # index_select: the cheapest gather along dim 0 (a few microseconds per tensor)
            ids=self.ids.index_select(0, index),
            features={name: x.index_select(0, index) for name, x in self.stored.items()},
            labels=self.labels.index_select(0, index),
        )

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> VFLBatch:
        """The batch of samples at positions `indices` (not IDs) of this split, as model input."""
        batch = self.gather(indices)
        batch.features = self.decode(batch.features)
        return batch

    def raw(self) -> RawView:
        """This split as a dataset whose batches are stored slices (what the training loaders serve)."""
        return RawView(self)

    def subset(self, index: torch.Tensor) -> VerticalTensorDataset:
        """The rows at positions `index` as a dataset of their own (every party's slice, labels and IDs)."""
        batch = self.gather(index)
        return VerticalTensorDataset(
            ids=batch.ids, features=dict(batch.features), labels=batch.labels, decoders=self.decoders
        )

    def __getitem__(self, index: int | Sequence[int]) -> VFLBatch:
        """One sample as a batch of one (or a batch, given a sequence), keeping the `VFLBatch` structure."""
        return self.__getitems__([index] if isinstance(index, (int, np.integer)) else index)


class RawView(Dataset):
    """A `VerticalTensorDataset` served as stored (uint8 pixels stay uint8): what the DataLoaders read."""

    def __init__(self, dataset: VerticalTensorDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> VFLBatch:
        """The stored batch at positions `indices`."""
        return self.dataset.gather(indices)

    def __getitem__(self, index: int) -> VFLBatch:
        """One stored sample as a batch of one."""
        return self.dataset.gather([index])


def select_rows(
    splits: dict[str, VerticalTensorDataset], sample_ids: Sequence[int], absent: str
) -> VerticalTensorDataset:
    """The rows of `sample_ids`, in that order, gathered from whichever of `splits` holds each.

    Raises:
        KeyError: IDs that no split holds (listed), followed by `absent` (why they cannot be answered).
    """
    where = {sample: (split, pos) for split, data in splits.items() for pos, sample in enumerate(data.ids.tolist())}
    missing = [i for i in sample_ids if int(i) not in where]
    if missing:
        raise KeyError(f"samples {missing[:_MAX_LISTED]} {absent}")
    template = next(iter(splits.values()))
    parts = [splits[where[int(i)][0]].subset(torch.tensor([where[int(i)][1]])) for i in sample_ids]
    return VerticalTensorDataset(
        ids=torch.cat([p.ids for p in parts]) if parts else template.ids[:0],
        features={k: torch.cat([p.stored[k] for p in parts]) if parts else v[:0] for k, v in template.stored.items()},
        labels=torch.cat([p.labels for p in parts]) if parts else template.labels[:0],
        decoders=template.decoders,
    )


def split_views(
    rows: dict[str, np.ndarray],
    vfl_rows: dict[str, np.ndarray],
    overlap: dict[str, np.ndarray],
    slices: dict[str, dict[str, torch.Tensor]],
    labels: np.ndarray,
    decoders: dict[str, Callable[[torch.Tensor], torch.Tensor]],
    active: str,
) -> tuple[dict[str, VerticalTensorDataset], dict[str, VerticalTensorDataset]]:
    """The VFL view and the active party's view of every split, built from the parties' prepared slices.

    Args:
        rows: per split, the sorted IDs of all its samples (the rows the active party holds).
        vfl_rows: per split, the sorted IDs the VFL view serves (the samples every participant holds).
        overlap: per split, boolean mask over `rows[split]`: held by every party.
        slices: participating party name (in party order) -> split -> its slice of the rows it holds; the active
            party's holds every row of `rows`, the others' the rows of `vfl_rows`.
        labels: (N,) labels of every row of the dataset, indexed by sample ID.
        decoders: party name -> function from a stored slice to model input (image parties).
        active: the name of the active party.

    Returns:
        The VFL views (every participant's slice of `vfl_rows`) and the active party's views (its slice of `rows`).
    """
    splits: dict[str, VerticalTensorDataset] = {}
    active_splits: dict[str, VerticalTensorDataset] = {}
    active_decoders = {k: v for k, v in decoders.items() if k == active}
    for split, idx in rows.items():
        active_splits[split] = VerticalTensorDataset(
            ids=torch.from_numpy(idx.copy()),
            features={active: slices[active][split]},
            labels=torch.from_numpy(labels[idx]),
            decoders=active_decoders,
        )
        vidx = vfl_rows[split]
        positions = None if len(vidx) == len(idx) else torch.from_numpy(np.flatnonzero(overlap[split]))
        features = {}
        for name, party_slices in slices.items():
            part = party_slices[split]
            if name == active and positions is not None:  # the active slice holds every row: keep the shared ones
                prefix = len(positions) == 0 or int(positions[-1]) == len(positions) - 1
                part = part[: len(positions)] if prefix else part.index_select(0, positions)  # a view, not a copy
            features[name] = part
        splits[split] = VerticalTensorDataset(
            ids=torch.from_numpy(vidx.copy()),
            features=features,
            labels=torch.from_numpy(labels[vidx]),
            decoders=decoders,
        )
    return splits, active_splits


def held_views(
    splits: dict[str, VerticalTensorDataset],
    active_splits: dict[str, VerticalTensorDataset],
    overlap: dict[str, np.ndarray],
    party: str | None,
    active: str,
) -> tuple[dict[str, VerticalTensorDataset], dict[str, VerticalTensorDataset], dict[str, np.ndarray]]:
    """The views of every split as `party` holds them (`VerticalDataModule.hold_only`).

    Every other party's slice, and a passive party's labels, become shadows (same dtype and shape, no data), and
    the other parties' decoders are dropped. A passive party's view of the active party's rows is the shared ones.

    Args:
        splits: per split, the VFL view (every participant's slice of the samples every party holds).
        active_splits: per split, the active party's view of all its samples.
        overlap: per split, boolean mask over `active_splits[split]`: held by every party.
        party: the party whose process this is; None keeps no party's data.
        active: the name of the active party.

    Returns:
        The VFL views, the active party's views and the overlap masks, as `party` holds them.
    """

    def own(data: VerticalTensorDataset) -> VerticalTensorDataset:
        return VerticalTensorDataset(
            ids=data.ids,
            features={k: x if k == party else shadow(x) for k, x in data.stored.items()},
            labels=data.labels if party == active else shadow(data.labels),
            decoders={k: d for k, d in data.decoders.items() if k == party},
        )

    held = {split: own(data) for split, data in splits.items()}
    if party == active:
        return held, active_splits, overlap
    return held, held, {split: np.ones(len(data), dtype=bool) for split, data in held.items()}
