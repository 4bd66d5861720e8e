"""The order a `VerticalDataModule`'s loaders serve samples in, how each batch is cut from it, and the loaders.

`EpochShuffle` makes the training order of epoch e a pure function of (seed, e), so runs repeat exactly and a resumed
run shuffles as the uninterrupted one did; `IndexTensorBatchSampler` cuts each batch from one permutation as one
index tensor, which `VerticalTensorDataset.__getitems__` turns into a batch at once (`keep_batch` then passes it
through the DataLoader's collation untouched). `batch_loader` puts them together into the DataLoader every loader of
a datamodule is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, SequentialSampler

from lvfl.datamodules.datasets import VerticalTensorDataset
from lvfl.parties import VFLBatch
from lvfl.runs import seeded_generator

__all__ = ["EpochShuffle", "IndexTensorBatchSampler", "batch_loader", "keep_batch"]


class EpochShuffle(RandomSampler):
    """A shuffle whose order in epoch e is a pure function of (`seed`, e).

    One generator seeded with `seed` draws one `randperm` per epoch, so epoch e gets the (e+1)-th permutation of
    that stream. A different order every epoch, the same order for epoch e in every run and every process, and the
    same stream an uninterrupted run has always drawn (a `RandomSampler` over `Generator().manual_seed(seed)`), so
    results measured before resumes were exact stay as they were. Lightning calls `set_epoch(e)` on the training sampler
    before each epoch (as it does for a `DistributedSampler`); a run resumed at epoch r replays the stream up to
    epoch r once (r permutations, at the first pass) instead of replaying the orders of epochs 0, 1, ... as a
    generator reseeded at every `train_dataloader()` would. Iterated without `set_epoch` (by hand, outside a
    trainer), a sampler walks through epochs 0, 1, 2, ... one pass at a time. Under DDP Lightning replaces this
    sampler (a `RandomSampler`) by a `DistributedSampler`, whose order is likewise a function of its seed and the
    epoch.
    """

    def __init__(self, data_source: Sequence[Any], seed: int) -> None:
        super().__init__(data_source)
        self.seed = int(seed)
        self.epoch = 0  # the epoch the next pass shuffles for
        self._stream = torch.Generator().manual_seed(self.seed)
        self._stream_epoch = 0  # the epoch the stream's next permutation belongs to

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next pass for epoch `epoch`."""
        self.epoch = int(epoch)

    def permutation(self) -> torch.Tensor:
        """The next pass's order: the stream's permutation for `epoch` (replayed from `seed` if needed)."""
        n = len(self.data_source)
        if self._stream_epoch != self.epoch:  # a resume, or a pass repeated by hand: replay from the seed
            self._stream = torch.Generator().manual_seed(self.seed)
            for _ in range(self.epoch):
                torch.randperm(n, generator=self._stream)
            self._stream_epoch = self.epoch
        order = torch.randperm(n, generator=self._stream)
        self._stream_epoch += 1
        self.epoch += 1
        return order

    def __iter__(self) -> Iterator[int]:
        yield from self.permutation().tolist()


class IndexTensorBatchSampler(BatchSampler):
    """A `BatchSampler` that yields each batch as one index tensor cut from a single permutation.

    `BatchSampler` over `RandomSampler` walks a Python list one index at a time and the dataset then converts each
    list back to a tensor; that costs more than the indexing itself on small data. For an `EpochShuffle`, a plain
    `RandomSampler` (without replacement) or a `SequentialSampler` this draws one permutation / `arange` per epoch
    and slices it;
    any other sampler (for example the `DistributedSampler` that Lightning injects under DDP, re-instantiating this
    class with `sampler=`) goes through `BatchSampler`'s own list path unchanged.
    """

    def __iter__(self) -> Iterator[torch.Tensor | list[int]]:
        sampler = self.sampler
        if type(sampler) is SequentialSampler:
            order = torch.arange(len(sampler))
        elif isinstance(sampler, EpochShuffle):
            order = sampler.permutation()
        elif (
            type(sampler) is RandomSampler
            and not sampler.replacement
            and sampler.num_samples == len(sampler.data_source)
        ):
            generator = sampler.generator
            if generator is None:  # as RandomSampler does: a fresh seed from the global RNG
                generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            order = torch.randperm(len(sampler), generator=generator)
        else:
            yield from super().__iter__()
            return
        batches = order.split(self.batch_size)
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        yield from batches


def keep_batch(batch: VFLBatch) -> VFLBatch:
    """Collate function for batches that `__getitems__` already built (module level so workers can pickle it)."""
    return batch


def batch_loader(
    dataset: VerticalTensorDataset, sampler: Sampler, batch_size: int, num_workers: int, seed: int
) -> DataLoader:
    """A DataLoader of `dataset`'s stored batches (`raw()`), each cut at once from `sampler`'s order.

    Args:
        dataset: the split to serve (a `VerticalTensorDataset`).
        sampler: the order of its samples (`EpochShuffle`, `SequentialSampler`, ...).
        batch_size: samples per batch (the last batch may be smaller).
        num_workers: DataLoader worker processes; 0 is fastest for in-memory data.
        seed: seeds the loader's own generator.
    """
    # Under DDP Lightning rebuilds the loader, re-instantiating this BatchSampler subclass around a
    # DistributedSampler with the same batch_size; the dataset's `__getitems__` builds each batch at once.
    # The loader's own generator: without one, every `iter(loader)` draws the workers' base seed from torch's
    # global RNG, and Lightning creates a resumed run's first iterator at another point of the epoch than the
    # uninterrupted run does, which would shift the dropout stream that `ExactResume` reseeds per epoch.
    return DataLoader(
        dataset.raw(),
        batch_sampler=IndexTensorBatchSampler(sampler, batch_size=batch_size, drop_last=False),
        collate_fn=keep_batch,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        pin_memory=torch.cuda.is_available(),  # page-locked batches (`VFLBatch.pin_memory`): async copies to a GPU
        generator=seeded_generator(seed, "loader"),
    )
