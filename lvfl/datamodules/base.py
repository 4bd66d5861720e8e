"""VerticalDataModule: one dataset split into train/val/test and vertically into party feature slices.

The pipeline, run once (lazily, by `setup()` or by the first read of `party_specs` / `task` / `describe()`):

1. `load()` (the subclass) returns the whole dataset as arrays; sample ID = row index in it, kept everywhere.
2. Checks: shapes, finite features per party (the message names the party), integer labels in range.
3. A seeded train/val/test split (scikit-learn `train_test_split`), stratified on the labels or label-free
   (`stratify`); where a passive party cannot compute it itself, the active party sends it (`lvfl.datamodules.split`).
4. Scaling fitted on the training rows only, then applied to every split.
5. Each party's slice copied once into a contiguous float32 tensor; batches are made by indexing those tensors with
   a whole batch of indices at a time, so the data pipeline costs microseconds per step, not per sample.

Partial overlap (`overlap` = alpha < 1; non-overlapping inference): after the split, a seeded fraction alpha of each
split's samples (stratified as the split is) is chosen to exist at every party; the rest exist at the active party
only (its features and labels). The VFL views (`train_set`, `val_set`, `test_set` and their loaders) hold the
overlap only, so every protocol trains and evaluates on samples all parties hold, unchanged. The active party's view
of every sample of a split is `active_set(split)`, the samples it holds alone `active_only_set(split)`, and which IDs
a party holds `party_ids(party, split)`. A passive party's scaler is fitted on the training rows it holds (the overlap);
the active party's on all training rows. With alpha = 1 (the default) everything is exactly as without overlap.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler

from lvfl.checks import check_real
from lvfl.datamodules.augment import SampleAugmentation, reassemble
from lvfl.datamodules.partition import ContiguousColumns, Partitioner, check_columns
from lvfl.datamodules.split import SPLIT_TAG, decode_split, encode_split
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.runs import seeded_generator
from lvfl.wire import shadow

__all__ = [
    "EpochShuffle",
    "IndexTensorBatchSampler",
    "PixelNormalizer",
    "RawView",
    "VerticalDataModule",
    "VerticalTensorDataset",
    "party_name",
]

_MAX_LISTED = 10  # bad values quoted in an error message


def party_name(index: int) -> str:
    """The name of party `index`, the key of its slice in `VFLBatch.features`."""
    return f"party{index}"


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


def _rows(splits: dict[str, VerticalTensorDataset], sample_ids: Sequence[int], absent: str) -> VerticalTensorDataset:
    """The rows of `sample_ids`, in that order, gathered from whichever of `splits` holds each (KeyError: `absent`)."""
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


def _keep_batch(batch: VFLBatch) -> VFLBatch:
    """Collate function for batches that `__getitems__` already built (module level so workers can pickle it)."""
    return batch


@dataclass(frozen=True)
class _Prepared:
    columns: list[list[int]]
    party_specs: list[PartySpec]
    task: TaskInfo
    splits: dict[str, VerticalTensorDataset]  # VFL views: samples every participating party holds
    active_splits: dict[str, VerticalTensorDataset]  # the active party's slice of every sample of each split
    overlap: dict[str, np.ndarray]  # per split, boolean mask over `active_splits[split]`: held by every party
    image_width: int | None  # the whole image's width (columns) for image data, else None
    split_used_labels: bool = False  # whether the split (and overlap) was stratified on the labels
    messages: tuple[tuple[str, str, Any, str], ...] = ()  # the split message to each passive participant


_SPLITS = ("train", "val", "test")
STRATIFY = ("auto", "labels", "none")  #: the `stratify` options


class VerticalDataModule(pl.LightningDataModule, ABC):
    """A dataset split among parties by columns, yielding `VFLBatch` batches.

    Subclasses implement `load()` and may set `num_classes` (otherwise it is the number of distinct labels) and
    override `default_partitioner()`. Targets that need the training split to become labels (a regression target
    thresholded at the training median) override `stratify_key()` and `labels_from_targets()`.

    Images ((N, H, W) or (N, C, H, W)) are split along the width, and each party's slice stays an image of shape
    (C, H, w_k) per sample (C = 1 added for (N, H, W)); tabular data (N, F) gives (f_k,) per sample.

    Args:
        num_parties: parties the columns are split among (party 0 .. num_parties - 1).
        active_party: index of the party that holds the labels.
        participants: indices of the parties that take part (default: all). The others' slices are dropped, which
            is how the Local baseline keeps only the active party's slice of a multi-party split. Must include the
            active party.
        partitioner: how columns are assigned to parties; None uses the dataset's `default_partitioner()`.
        batch_size: samples per batch (the last batch may be smaller).
        val_fraction: fraction of all samples in the validation split.
        test_fraction: fraction of all samples in the test split (also used for `predict`).
        seed: seed of the split and of the training-set shuffling (public: every party reads the config).
        num_workers: DataLoader worker processes; 0 is fastest for in-memory data.
        scale: standardize features with statistics of the training rows only (tabular: per column; images: one
            mean/std per party over its own training pixels).
        overlap: alpha in (0, 1], the fraction of every split's samples that exists at every party (chosen per
            split with `seed`, stratified by label); the rest exist at the active party only. The VFL loaders
            serve the overlap only. When `participants` is the active party alone, nothing is missing from any
            participant, so the VFL views hold every sample (how a `participants: [0]` Local run sees all of its
            samples); the overlap IDs are the same either way.
        augmentation: a per-sample random transform of training images (`lvfl.datamodules.CropFlip`), the same at
            every party (drawn from `seed`, the sample ID and the epoch; see `lvfl.datamodules.augment`); "default"
            uses the dataset's `default_augmentation()` (none, except CIFAR-style sets), "none" (or null) turns it
            off. Only image data can be augmented.
        stratify: what the split (and the `overlap` draw) is stratified on. "labels": the true labels (or what
            `stratify_key` gives), which keeps class shares equal across splits but makes the split a function of
            the labels: a passive party sees which of its rows land in each split and, knowing the public seed, can
            search for labels that reproduce it.
            "none": a seeded label-free split. "auto" (default): "labels", unless the protocol has a label
            mechanism, which needs everything a passive party sees to be free of the true labels: then "none"
            (and "labels" is refused). Where a passive party cannot compute the split itself (it depends on the
            labels, or on IDs only the active party holds), the active party sends it (`split` message).
    """

    num_classes: int | None = None
    #: whether `load()`'s targets are real values to regress on (MSE loss, MAE/RMSE/R^2) rather than class labels;
    #: the split is then unstratified unless `stratify_key` says otherwise, and the labels are the targets
    #: standardized with the training rows' mean and standard deviation (`TaskInfo.target_mean`, `target_scale`)
    regression: bool = False
    #: whether every party can name every sample (sample IDs are row numbers of a public dataset, as for the
    #: embedded and paper datasets); False where the samples are the active party's own rows (`PartyTables`), so
    #: that even a label-free split is known to the active party alone and must be sent
    rows_are_public: bool = True

    def __init__(
        self,
        num_parties: int = 4,
        active_party: int = 0,
        participants: list[int] | None = None,
        partitioner: Partitioner | None = None,
        batch_size: int = 128,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 0,
        num_workers: int = 0,
        scale: bool = True,
        overlap: float = 1.0,
        augmentation: SampleAugmentation | Literal["default", "none"] | None = "default",
        stratify: Literal["auto", "labels", "none"] = "auto",
    ) -> None:
        # No save_hyperparameters(): Lightning merges datamodule and module hparams and raises when a shared key
        # (seed, batch_size) differs; LightningCLI already records the full config of every run.
        super().__init__()
        if num_parties < 1:
            raise ValueError(f"num_parties must be at least 1, got {num_parties}")
        if not 0 <= active_party < num_parties:
            raise ValueError(f"active_party={active_party} is out of range for num_parties={num_parties}")
        self.num_parties = num_parties
        self.active_party = active_party
        self.participants = self._check_participants(participants, num_parties, active_party)
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be < 1 to leave training samples, got "
                f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        check_real(overlap, "overlap", 0.0, 1.0, open_low=True, why="the fraction of samples every party holds")
        if stratify not in STRATIFY:
            raise ValueError(f"stratify must be one of {list(STRATIFY)}, got stratify={stratify!r}")
        self.stratify = stratify
        self._label_free = False  # set by `require_label_free_split` (a label mechanism)
        self.partitioner = partitioner if partitioner is not None else self.default_partitioner()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.scale = scale
        self.overlap = float(overlap)
        if augmentation == "default":
            augmentation = self.default_augmentation()
        elif augmentation == "none":
            augmentation = None
        elif augmentation is not None and not isinstance(augmentation, SampleAugmentation):
            raise ValueError(
                f"augmentation must be a SampleAugmentation (e.g. lvfl.datamodules.CropFlip), 'default' or 'none', "
                f"got augmentation={augmentation!r}"
            )
        self.augmentation: SampleAugmentation | None = augmentation
        self._prepared: _Prepared | None = None
        #: per party, the standardization fitted on its training rows (`x' = (x - mean) / scale` on `columns`, a
        #: list of its column positions or "all"); empty where nothing is scaled. `lvfl export` writes it.
        self.scaling: dict[str, dict[str, Any]] = {}
        #: sample IDs `predict_dataloader` serves instead of the test split (`lvfl predict --ids`)
        self.predict_ids: list[int] | None = None

    # ----------------------------------------------------------------------------------------------- subclass hooks
    @abstractmethod
    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the whole dataset: X of shape (N, F), (N, H, W) or (N, C, H, W), and y of shape (N,)."""

    def default_partitioner(self) -> Partitioner:
        """The partitioner used when none is configured: contiguous column groups."""
        return ContiguousColumns()

    def stratify_key(self, y: np.ndarray) -> np.ndarray | None:
        """What the split stratifies on: by default the labels (checked first, for a clear message), or None.

        A regression target (`regression`) is checked and the split is not stratified (None). Override (with
        `labels_from_targets`) when `y` are targets that become labels only after the split.
        """
        if self.regression:
            self._check_targets(y)
            return None
        self._check_labels(y)
        return y

    def split_key(self, y: np.ndarray) -> np.ndarray | None:
        """What the split is drawn on: `stratify_key(y)` (checked) when the split may use the labels, else None."""
        if self.task_from_peers() is not None:  # no labels here: the split was received (`fixed_splits`)
            return None
        key = self.stratify_key(y)
        return key if self.split_uses_labels else None

    @property
    def split_uses_labels(self) -> bool:
        """Whether the split and the overlap draw are stratified on the labels (`stratify`)."""
        return self.stratify == "labels" or (self.stratify == "auto" and not self._label_free)

    @property
    def split_is_public(self) -> bool:
        """Whether every party can compute the split itself (label-free, over public rows): then nothing is sent."""
        return self.rows_are_public and not self.split_uses_labels

    def require_label_free_split(self, why: str) -> None:
        """Make the split (and the overlap draw) label-free, for `why` (a label mechanism); refuse where it cannot be.

        A protocol with a label mechanism calls this (through `setup`) before the data is prepared.

        Raises:
            ValueError: `stratify` is "labels", or the split was already drawn from the labels.
        """
        if self.stratify == "labels":
            raise ValueError(
                f"data stratify=labels draws the split from the true labels, but {why} must keep them from the passive "
                "parties, who see which of their rows land in each split: set stratify: auto or none"
            )
        if self._prepared is not None and self._prepared.split_used_labels:
            raise ValueError(
                f"{type(self).__name__}'s split was drawn stratified on the true labels before {why} asked for a "
                "label-free one (the data was prepared before the protocol's setup): set data stratify: none"
            )
        self._label_free = True

    def labels_from_targets(self, y: np.ndarray, train_rows: np.ndarray) -> np.ndarray:
        """Turn `load()`'s targets into class labels, seeing only the training rows `train_rows`. Default: as is."""
        return y

    def default_augmentation(self) -> SampleAugmentation | None:
        """The augmentation used when the `augmentation` option is "default". Default: none."""
        return None

    def fixed_splits(self, num_rows: int) -> dict[str, np.ndarray] | None:
        """Rows of a published split, if the dataset has one: {"test": rows} and optionally {"val": rows}.

        Default None: the seeded stratified split by `val_fraction` / `test_fraction`. With a published test split
        (MNIST's 10,000 test images) the validation split is `val_fraction` of the remaining rows, stratified and
        seeded, unless the dataset publishes one too (CINIC-10's valid/); `test_fraction` is then not used.
        """
        return None

    def held_by_every_party(self, num_rows: int) -> np.ndarray | None:
        """Which rows every party holds (a boolean mask over `load()`'s rows), when the data says so itself.

        Default None: the `overlap` option draws that fraction of every split. A datamodule whose parties have
        their own ID lists (`PartyTables`, aligned by private set intersection) returns the intersection instead;
        the rest of the rows exist at the active party only.
        """
        return None

    def setup_messages(self) -> list[tuple[str, str, Any, str]]:
        """Messages the datamodule's parties exchange while loading, as (src, dst, payload, tag), in order.

        The ID alignment (`alignment_messages`), then the split message to each passive participant where it cannot
        compute the split itself (`lvfl.datamodules.split`). The datamodule prepares before any protocol exists, so
        it holds them back; the protocol sends them on its wire in `setup`, where they are metered as set-up traffic
        and seen by the wire's observers like every other message.
        """
        prepared = self._prepare()
        return [*self.alignment_messages(), *prepared.messages]

    def alignment_messages(self) -> list[tuple[str, str, Any, str]]:
        """Messages that aligned the parties' IDs while loading. Default none; `PartyTables`: its PSI's."""
        return []

    def shared_order(self, shared: np.ndarray) -> np.ndarray:
        """The sample IDs every party holds (`shared`, sorted) in the order the passive parties know them.

        Default: by sample ID (row numbers of a public dataset). `PartyTables`: the PSI's agreed order.
        """
        return shared

    def task_from_peers(self) -> TaskInfo | None:
        """The task as the active party told this process, where it holds no labels; None where `load()`'s are real.

        Default None. `PartyTables` in a passive party's own process (`exchange_on`): its `load()` returns filler
        labels, the split comes from the active party's `split` message (`fixed_splits`), and the task from its
        `task` message, so nothing here is derived from labels it does not hold.
        """
        return None

    def categories(self, num_columns: int) -> list[int] | None:
        """Per feature column: 0 for a numeric column, c > 0 for a categorical one coded 0..c-1. Default: all numeric.

        Categorical columns are not scaled; they reach party models as integer codes (stored exactly in float32) and
        the protocol builds the party's model with `categories=` (see `lvfl.models.tabular`).
        """
        return None

    # ----------------------------------------------------------------------------------------------- public views
    def prepare_data(self) -> None:
        """Nothing to download by default; dataset subclasses that download override this."""

    def setup(self, stage: str | None = None) -> None:
        """Load, check, split, scale and partition the data (once; later calls reuse it).

        Attached to a trainer, the protocol says first what it needs of the data (`VFLModule.prepare_datamodule`:
        with a label mechanism, a label-free split).
        """
        trainer = getattr(self, "trainer", None)
        module = trainer.lightning_module if trainer is not None else None
        if callable(getattr(module, "prepare_datamodule", None)):  # Lightning sets the data up before the protocol
            module.prepare_datamodule(self)
        self._prepare()

    def hold_only(self, party: str | None) -> None:
        """Keep only what `party` holds: its own slice of every split, and the labels if it is the active party.

        Run in a party's own process (docs/federation.md) once the set-up messages are exchanged: every other
        party's slice, and a passive party's labels, become shadows (same dtype and shape, no data), and the other
        parties' scaling statistics and decoders are dropped. A passive party knows the samples every party holds
        and nothing of the active party's others: its view of the active party's rows is the shared ones. `None`
        keeps nothing: the process of a key holder outside the parties (an HE backend's coordinator).
        """
        prepared = self._prepare()
        names = [s.name for s in prepared.party_specs]
        if party is not None and party not in names:
            raise ValueError(f"there is no party {party!r} in {type(self).__name__}'s run (parties: {names})")
        active = party_name(self.active_party)

        def own(data: VerticalTensorDataset) -> VerticalTensorDataset:
            return VerticalTensorDataset(
                ids=data.ids,
                features={k: x if k == party else shadow(x) for k, x in data.stored.items()},
                labels=data.labels if party == active else shadow(data.labels),
                decoders={k: d for k, d in data.decoders.items() if k == party},
            )

        splits = {split: own(data) for split, data in prepared.splits.items()}
        if party == active:
            active_splits, overlap = prepared.active_splits, prepared.overlap
        else:
            active_splits = splits
            overlap = {split: np.ones(len(data), dtype=bool) for split, data in splits.items()}
        self._prepared = dataclasses.replace(
            prepared, splits=splits, active_splits=active_splits, overlap=overlap, messages=()
        )
        self.scaling = {k: v for k, v in self.scaling.items() if k == party}

    def describe(self) -> tuple[list[PartySpec], TaskInfo]:
        """The participating parties and the task, loading the data if needed (protocols call this in `setup`)."""
        prepared = self._prepare()
        return list(prepared.party_specs), prepared.task

    @property
    def party_specs(self) -> list[PartySpec]:
        """The participating parties in index order: name `party{i}`, role, per-sample input shape, index i."""
        return list(self._prepare().party_specs)

    @property
    def task(self) -> TaskInfo:
        """Number of classes and binary/multiclass."""
        return self._prepare().task

    @property
    def columns(self) -> list[list[int]]:
        """Column indices of every party (participating or not), as chosen by the partitioner."""
        return [list(c) for c in self._prepare().columns]

    @property
    def train_set(self) -> VerticalTensorDataset:
        """The training split."""
        return self._prepare().splits["train"]

    @property
    def val_set(self) -> VerticalTensorDataset:
        """The validation split."""
        return self._prepare().splits["val"]

    @property
    def test_set(self) -> VerticalTensorDataset:
        """The test split (also served by `predict_dataloader`)."""
        return self._prepare().splits["test"]

    # ----------------------------------------------------------------------------------------------- partial overlap
    @property
    def active_party_name(self) -> str:
        """The name of the active party (the key of its slice in every batch)."""
        return party_name(self.active_party)

    def active_set(self, split: str = "train") -> VerticalTensorDataset:
        """Every sample of `split` as the active party holds it: its own slice only, with labels, sorted by ID.

        This is what a student model or the Local baseline trains on (overlapping and active-only samples alike).
        """
        return self._prepare().active_splits[self._check_split(split)]

    def overlap_mask(self, split: str = "train") -> torch.Tensor:
        """Boolean mask over `active_set(split)`: True where every party holds the sample."""
        return torch.from_numpy(self._prepare().overlap[self._check_split(split)].copy())

    def active_only_set(self, split: str = "train") -> VerticalTensorDataset:
        """The samples of `split` that only the active party holds (its slice and labels); empty when alpha = 1."""
        full = self.active_set(split)
        index = torch.from_numpy(np.flatnonzero(~self._prepare().overlap[split]))
        return full.subset(index)

    def overlap_ids(self, split: str | None = None) -> torch.Tensor:
        """Sorted IDs of the samples every party holds, in `split` or (None) in all splits."""
        return self.party_ids(None, split)

    def party_ids(self, party: str | int | None, split: str | None = None) -> torch.Tensor:
        """Sorted IDs of the samples `party` (name or index) holds, in `split` or (None) in all splits.

        The active party holds every sample; a passive party (participating or not) the overlapping ones only.
        `party=None` gives the overlap (what every party holds).
        """
        prepared = self._prepare()
        if party is not None:
            index = party if isinstance(party, int) else self._party_index(party)
            if not 0 <= index < self.num_parties:
                raise ValueError(f"party {party!r} is out of range for num_parties={self.num_parties}")
        held_all = party is not None and index == self.active_party
        splits = _SPLITS if split is None else (self._check_split(split),)
        parts = [
            prepared.active_splits[s].ids if held_all else prepared.active_splits[s].ids[prepared.overlap[s]]
            for s in splits
        ]
        return torch.sort(torch.cat(parts)).values

    def _party_index(self, name: str) -> int:
        for k in range(self.num_parties):
            if party_name(k) == name:
                return k
        raise ValueError(f"unknown party {name!r}; parties are {[party_name(k) for k in range(self.num_parties)]}")

    @staticmethod
    def _check_split(split: str) -> str:
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {list(_SPLITS)}, got {split!r}")
        return split

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a `VFLBatch` tensor by tensor, non-blocking, instead of Lightning's generic dataclass walk.

        The two are compared by `benchmarks/costs.py` (docs/results.md section 8).
        """
        if isinstance(batch, VFLBatch):
            return batch.to(device, non_blocking=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Turn a stored batch into model input on its device: augment (training only), then decode (normalize).

        Loaders serve stored slices (uint8 pixels for image sets), so the host-to-device copy moves a quarter of
        float32's bytes and the per-pixel work runs on the accelerator. Tabular batches pass through unchanged.
        """
        if not isinstance(batch, VFLBatch):
            return batch
        trainer = self.trainer
        training = trainer is not None and trainer.training
        return self.model_input(batch, augment=training, epoch=trainer.current_epoch if trainer is not None else 0)

    def model_input(self, batch: VFLBatch, augment: bool = False, epoch: int = 0) -> VFLBatch:
        """A stored batch as the party models read it: augmented (if `augment` and configured), then decoded.

        Code that iterates a loader outside a `Trainer` (PraVFed's local pre-training) calls this itself. The
        augmentation's random choices are a function of (`seed`, sample ID, `epoch`) only, so they are the same at
        every party, on every DDP rank and after a resume.
        """
        prepared = self._prepare()
        features = batch.features
        if augment and self.augmentation is not None:
            features = self._augment(self.augmentation, features, batch.ids, epoch)
        decoders = prepared.splits["train"].decoders
        if decoders:
            features = {k: decoders[k](x) if k in decoders else x for k, x in features.items()}
        if features is batch.features:
            return batch
        return VFLBatch(ids=batch.ids, features=features, labels=batch.labels)

    def _augment(
        self, aug: SampleAugmentation, features: dict[str, torch.Tensor], ids: torch.Tensor, epoch: int
    ) -> dict[str, torch.Tensor]:
        prepared = self._prepare()
        names = list(features)
        if aug.scope == "party":
            params = aug.parameters(self.seed, ids, epoch)
            return {k: aug.apply(features[k], params) for k in names}
        columns = [prepared.columns[self._party_index(k)] for k in names]
        whole = reassemble([features[k] for k in names], columns, prepared.image_width)
        whole = aug(whole, ids, epoch, self.seed)
        return {
            k: whole[..., torch.as_tensor(cols, device=whole.device)] for k, cols in zip(names, columns, strict=True)
        }

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches in a new order every epoch, derived from (`seed`, epoch) by `EpochShuffle`.

        Runs repeat exactly, and a resumed run shuffles its epochs as the uninterrupted run would have.
        """
        return self._loader(self.train_set, EpochShuffle(self.train_set, seed=self.seed))

    def val_dataloader(self) -> DataLoader:
        """Validation batches in order."""
        return self._loader(self.val_set, SequentialSampler(self.val_set))

    def test_dataloader(self) -> DataLoader:
        """Test batches in order."""
        return self._loader(self.test_set, SequentialSampler(self.test_set))

    def predict_dataloader(self) -> DataLoader:
        """The test set in order, or the samples of `predict_ids` (in that order) when it is set."""
        dataset = self.test_set if self.predict_ids is None else self.vfl_rows(self.predict_ids)
        return self._loader(dataset, SequentialSampler(dataset))

    def sample_ids_for(self, keys: Sequence[str], missing: Literal["raise", "none"] = "raise") -> list[int | None]:
        """The sample IDs of IDs as a user writes them (`lvfl predict --ids`): here the sample IDs' own text.

        Datamodules with business IDs (`PartyTables`) map those instead. With `missing="none"` an ID that names no
        sample maps to None (`lvfl predict` writes it with a reason) instead of raising.

        Raises:
            KeyError: IDs that name no sample (listed), with `missing="raise"`.
        """
        num_rows = sum(len(d) for d in self._prepare().active_splits.values())
        known = [str(k).strip().isdigit() and int(k) < num_rows for k in keys]
        bad = [k for k, ok in zip(keys, known, strict=True) if not ok]
        if bad and missing == "raise":
            raise KeyError(f"IDs {bad[:_MAX_LISTED]} name no sample of {type(self).__name__} (IDs 0..{num_rows - 1})")
        return [int(k) if ok else None for k, ok in zip(keys, known, strict=True)]

    def vfl_rows(self, sample_ids: Sequence[int]) -> VerticalTensorDataset:
        """The samples with these IDs, in this order, as every party holds them (from whichever split holds each).

        Raises:
            KeyError: IDs that not every party holds (named), which the VFL model cannot answer.
        """
        return _rows(self._prepare().splits, sample_ids, "are not held by every party")

    def active_rows(self, sample_ids: Sequence[int]) -> VerticalTensorDataset:
        """The samples with these IDs, in this order, as the active party holds them (its slice only)."""
        return _rows(self._prepare().active_splits, sample_ids, "are not samples of the active party")

    # ----------------------------------------------------------------------------------------------- internals
    def _loader(self, dataset: VerticalTensorDataset, sampler: Sampler) -> DataLoader:
        # Under DDP Lightning rebuilds the loader, re-instantiating this BatchSampler subclass around a
        # DistributedSampler with the same batch_size; the dataset's `__getitems__` builds each batch at once.
        # The loader's own generator: without one, every `iter(loader)` draws the workers' base seed from torch's
        # global RNG, and Lightning creates a resumed run's first iterator at another point of the epoch than the
        # uninterrupted run does, which would shift the dropout stream that `ExactResume` reseeds per epoch.
        return DataLoader(
            dataset.raw(),
            batch_sampler=IndexTensorBatchSampler(sampler, batch_size=self.batch_size, drop_last=False),
            collate_fn=_keep_batch,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),  # page-locked batches (`VFLBatch.pin_memory`): async copies to a GPU
            generator=seeded_generator(self.seed, "loader"),
        )

    @staticmethod
    def _check_participants(participants: list[int] | None, num_parties: int, active_party: int) -> list[int]:
        if participants is None:
            return list(range(num_parties))
        if len(participants) == 0:
            raise ValueError("participants must list at least the active party, got an empty list")
        out = sorted({p for p in participants if not 0 <= p < num_parties})
        if out:
            raise ValueError(f"participants {out} are out of range for num_parties={num_parties}")
        if len(set(participants)) != len(participants):
            raise ValueError(f"participants lists a party more than once: {participants}")
        if active_party not in participants:
            raise ValueError(
                f"participants {participants} must include the active party {active_party} (it holds the labels)"
            )
        return sorted(participants)

    def _numeric_features(self, x: np.ndarray, columns: list[list[int]]) -> np.ndarray:
        """`x` as float32; features that are not numbers (strings, objects) fail naming the first party holding one."""
        if np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.bool_):
            return x.astype(np.float32)
        for k in self.participants:
            try:
                x[..., columns[k]].astype(np.float64)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"{party_name(k)} has features that are not numbers (dtype {x.dtype}: {err}); encode "
                    "categorical columns as numbers first"
                ) from err
        try:
            return x.astype(np.float32)
        except (TypeError, ValueError) as err:  # in columns no participant holds
            raise ValueError(f"features must be numbers, got dtype {x.dtype}: {err}") from err

    def _check_labels(self, y: np.ndarray) -> int:
        """Check labels are integers in 0..M-1 and return M (`num_classes`, or the number of distinct labels)."""
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
        num_classes = self.num_classes if self.num_classes is not None else int(np.unique(y).size)
        if num_classes < 2:
            raise ValueError(f"a classification task needs at least 2 classes, found {num_classes}")
        bad = np.unique(y[(y < 0) | (y >= num_classes)])
        if bad.size:
            raise ValueError(
                f"labels must be in 0..{num_classes - 1} (num_classes={num_classes}); found out-of-range label "
                f"values {bad[:_MAX_LISTED].tolist()}"
            )
        return num_classes

    def _check_targets(self, y: np.ndarray) -> np.ndarray:
        """Check regression targets are one finite real number per sample; return them as float64."""
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
                f"regression targets must be finite; rows {bad[:_MAX_LISTED].tolist()} hold NaN or inf "
                f"({bad.size} in all)"
            )
        return y

    def _regression_labels(self, y: np.ndarray, train_rows: np.ndarray) -> tuple[np.ndarray, TaskInfo]:
        """The targets standardized with the training rows' mean and standard deviation, and the task that undoes it."""
        y = self._check_targets(self.labels_from_targets(y, train_rows))
        mean, std = float(y[train_rows].mean()), float(y[train_rows].std())
        if not std > 0:
            raise ValueError(
                f"the regression target is constant ({mean}) over the {len(train_rows)} training rows: nothing to learn"
            )
        task = TaskInfo(num_classes=0, kind="regression", target_mean=mean, target_scale=std)
        return ((y - mean) / std).astype(np.float32), task

    def _split(self, num_rows: int, key: np.ndarray | None, order: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Seeded split of the row indices, stratified by `key` (None: unstratified); each split's IDs sorted.

        Sorted so that val/test batches run in ID order. With `order` (a permutation of the rows), the split is drawn
        over the rows in that order, so that it does not depend on the rows' own order (`PartyTables`).
        """
        ids = np.arange(num_rows, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
        fixed = self.fixed_splits(num_rows)
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
                        test_size=self.val_fraction,
                        stratify=None if key is None else key[rest],
                        random_state=self.seed,
                    )
                return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}
            rest, test = train_test_split(
                ids, test_size=self.test_fraction, stratify=None if key is None else key[ids], random_state=self.seed
            )
            val_share = self.val_fraction / (1.0 - self.test_fraction)
            train, val = train_test_split(
                rest, test_size=val_share, stratify=None if key is None else key[rest], random_state=self.seed
            )
        except ValueError as err:
            what = "split" if key is None else "stratified split"
            raise ValueError(
                f"cannot make a {what} of {num_rows} samples with val_fraction={self.val_fraction}, "
                f"test_fraction={self.test_fraction}: {err}"
            ) from err
        return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}

    def _prepare(self) -> _Prepared:
        if self._prepared is not None:
            return self._prepared
        x, y = self.load()
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim not in (2, 3, 4):
            raise ValueError(f"features must be (N, F), (N, H, W) or (N, C, H, W), got shape {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise ValueError(f"targets must have shape ({len(x)},) to match the features, got {y.shape}")
        if len(x) == 0:
            raise ValueError(f"{type(self).__name__} has no samples (features of shape {x.shape}): nothing to train on")
        is_image = x.ndim >= 3
        if x.ndim == 3:
            x = x[:, None]  # (N, H, W) -> (N, 1, H, W): each party's strip stays a one-channel image

        num_columns = x.shape[-1]
        if self.num_parties > num_columns:
            what = " (image width)" if is_image else ""
            raise ValueError(
                f"num_parties={self.num_parties} exceeds the {num_columns} feature columns{what} available: "
                "every party needs at least one"
            )
        columns = [[int(c) for c in cols] for cols in self.partitioner.split(num_columns, self.num_parties)]
        check_columns(columns, num_columns=num_columns, num_parties=self.num_parties)
        pixels = is_image and x.dtype == np.uint8  # kept uint8; normalized per batch on the device
        if self.augmentation is not None and not is_image:
            raise ValueError(
                f"augmentation={self.augmentation!r} transforms images, but {type(self).__name__} is tabular "
                f"(features of shape {x.shape}); set augmentation: none"
            )
        cats = None if is_image else self.categories(num_columns)
        if cats is not None and len(cats) != num_columns:
            raise ValueError(f"categories() gives {len(cats)} entries for {num_columns} feature columns")
        if not pixels and not np.issubdtype(x.dtype, np.floating):
            x = self._numeric_features(x, columns)

        for k in [] if pixels else self.participants:
            bad = int(np.count_nonzero(~np.isfinite(x[..., columns[k]])))
            if bad:
                raise ValueError(
                    f"{party_name(k)} has {bad} non-finite feature values (NaN or inf); clean or impute them first"
                )

        rows = self._split(len(y), self.split_key(y))
        known = self.task_from_peers()
        if known is not None:  # a passive party's own process: no labels here (filler, shadowed by `hold_only`)
            labels, task = np.zeros(len(y), dtype=np.float32 if known.is_regression else np.int64), known
        elif self.regression:
            labels, task = self._regression_labels(y, rows["train"])
        else:
            labels = np.asarray(self.labels_from_targets(y, rows["train"]))
            num_classes = self._check_labels(labels)
            labels = labels.astype(np.int64)
            task = TaskInfo(num_classes=num_classes, kind="binary" if num_classes == 2 else "multiclass")

        held_mask = self.held_by_every_party(len(y))
        if held_mask is not None and self.overlap < 1.0:
            raise ValueError(
                f"overlap={self.overlap} draws which samples every party holds, but {type(self).__name__} knows it "
                "from the parties' own IDs: leave overlap at 1"
            )
        if held_mask is None:
            # stratified by class as the split is; a regression target has no classes (one stratum)
            label_free = self.regression or not self.split_uses_labels
            strata = np.zeros(len(labels), dtype=np.int64) if label_free else labels
            overlap = {split: self._choose_overlap(strata[idx], i) for i, (split, idx) in enumerate(rows.items())}
        else:
            overlap = {split: np.asarray(held_mask, dtype=bool)[idx] for split, idx in rows.items()}
        shared = {split: idx[overlap[split]] for split, idx in rows.items()}  # the rows every party holds
        vfl_all = len(self.participants) == 1  # no passive participant: nothing is missing from anyone
        messages, shared = self._split_messages(shared, vfl_all)
        vfl_rows = rows if vfl_all else shared
        splits: dict[str, VerticalTensorDataset] = {}
        active_splits: dict[str, VerticalTensorDataset] = {}
        slices = {}
        decoders: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
        party_cats: dict[int, tuple[int, ...]] = {}
        for k in self.participants:  # each party's slice of the rows it holds, scaled by its own training rows
            held = rows if k == self.active_party or vfl_all else shared
            if pixels:
                slices[k], decoders[party_name(k)] = self._pixel_slices(x, columns[k], held)
            else:
                own = None if cats is None else [int(cats[c]) for c in columns[k]]
                slices[k] = self._scaled_slices(x, columns[k], held, is_image, own, party_name(k))
                party_cats[k] = tuple(own) if own is not None and any(own) else ()
        active = self.active_party
        active_full = slices[active]  # the active party always participates and holds every row
        active_decoders = {k: v for k, v in decoders.items() if k == party_name(active)}
        for split, idx in rows.items():
            active_splits[split] = VerticalTensorDataset(
                ids=torch.from_numpy(idx.copy()),
                features={party_name(active): active_full[split]},
                labels=torch.from_numpy(labels[idx]),
                decoders=active_decoders,
            )
            vidx = vfl_rows[split]
            positions = None if len(vidx) == len(idx) else torch.from_numpy(np.flatnonzero(overlap[split]))
            features = {}
            for k in self.participants:
                part = slices[k][split]
                if k == active and positions is not None:  # the active slice holds every row: keep the shared ones
                    part = part.index_select(0, positions)
                features[party_name(k)] = part
            splits[split] = VerticalTensorDataset(
                ids=torch.from_numpy(vidx.copy()),
                features=features,
                labels=torch.from_numpy(labels[vidx]),
                decoders=decoders,
            )
        specs = [
            PartySpec(
                name=party_name(k),
                role="active" if k == self.active_party else "passive",
                input_shape=tuple(splits["train"].stored[party_name(k)].shape[1:]),
                index=k,
                categories=party_cats.get(k, ()),
            )
            for k in self.participants
        ]
        self._prepared = _Prepared(
            columns=columns,
            party_specs=specs,
            task=task,
            splits=splits,
            active_splits=active_splits,
            overlap=overlap,
            image_width=num_columns if is_image else None,
            split_used_labels=self.split_uses_labels,
            messages=tuple(messages),
        )
        return self._prepared

    def _split_messages(
        self, shared: dict[str, np.ndarray], vfl_all: bool
    ) -> tuple[list[tuple[str, str, Any, str]], dict[str, np.ndarray]]:
        """The split message to each passive participant, and the shared rows per split as passive parties read them.

        Where the split is public, or no passive party takes part, nothing is sent and `shared` is returned as is.
        Otherwise the passive parties' rows of each split are decoded from the message they receive, so that what
        they fit (scaling, encoders) follows from what crossed the wire.
        """
        passive = [k for k in self.participants if k != self.active_party]
        if self.split_is_public or vfl_all or not passive:
            return [], shared
        order = self.shared_order(np.sort(np.concatenate(list(shared.values()))))
        payload = encode_split(shared, order)
        received = decode_split(payload, order)
        if any(not np.array_equal(received[s], np.sort(shared[s])) for s in _SPLITS):  # cannot happen
            raise RuntimeError("the split message does not reproduce the split")
        messages = [(party_name(self.active_party), party_name(k), payload, SPLIT_TAG) for k in passive]
        return messages, {s: received[s] for s in _SPLITS}

    def _mixed_slices(self, part: dict[str, np.ndarray], cats: list[int], party: str) -> dict[str, torch.Tensor]:
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
        out = {split: p.astype(np.float32, copy=True) for split, p in part.items()}
        if self.scale and numeric:
            scaler = StandardScaler().fit(part["train"][:, numeric])
            for split, p in part.items():
                out[split][:, numeric] = scaler.transform(p[:, numeric])
            self.scaling[party] = {"columns": numeric, "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist()}
        return {split: torch.from_numpy(np.ascontiguousarray(p)) for split, p in out.items()}

    def _choose_overlap(self, labels: np.ndarray, split_index: int) -> np.ndarray:
        """Boolean mask of the rows every party holds: round(alpha * n) rows (at least 1), stratified by label.

        Each class gets its share by largest remainders (so the total is exact), and the rows within a class are
        drawn with a generator seeded by (`seed`, split), independent of the split's own seeding.
        """
        n = len(labels)
        if self.overlap >= 1.0 or n == 0:
            return np.ones(n, dtype=bool)
        total = min(n, max(1, round(self.overlap * n)))
        classes, counts = np.unique(labels, return_counts=True)
        quota = self.overlap * counts
        take = np.floor(quota).astype(np.int64)
        remainder = quota - take
        for c in np.argsort(-remainder, kind="stable")[: total - int(take.sum())]:
            take[c] += 1
        while take.sum() > total:  # only when rounding `total` down; drop from the largest share
            take[int(np.argmax(take))] -= 1
        rng = np.random.default_rng([self.seed, split_index, 0x0E71A9])
        mask = np.zeros(n, dtype=bool)
        for c, k in zip(classes, take, strict=True):
            members = np.flatnonzero(labels == c)
            mask[rng.permutation(members)[:k]] = True
        return mask

    def _pixel_slices(
        self, x: np.ndarray, cols: list[int], rows: dict[str, np.ndarray]
    ) -> tuple[dict[str, torch.Tensor], PixelNormalizer]:
        """One party's uint8 strip per split (contiguous) and its normalizer from its own training pixels.

        Per-channel mean and standard deviation over the party's training strip (`scale`), or none (values 0..255).
        """
        col_index = np.asarray(cols, dtype=np.int64)
        part = {split: np.ascontiguousarray(x[idx][..., col_index]) for split, idx in rows.items()}
        channels = x.shape[1]
        if self.scale:
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

    def _scaled_slices(
        self,
        x: np.ndarray,
        cols: list[int],
        rows: dict[str, np.ndarray],
        is_image: bool,
        cats: list[int] | None = None,
        party: str = "",
    ) -> dict[str, torch.Tensor]:
        """One party's slice per split, standardized with its training rows' statistics, as contiguous float32.

        Each party is scaled from its own columns only: in a deployment no party sees another's features, so a
        statistic pooled across parties could not be computed without a protocol of its own. Categorical columns
        (`cats[j] > 0`) are checked to be codes 0..c-1 and kept as they are.
        """
        part = {split: x[idx][..., cols] for split, idx in rows.items()}
        if cats is not None and any(cats):
            return self._mixed_slices(part, cats, party)
        if self.scale and is_image:
            train = part["train"]
            mean = float(train.mean(dtype=np.float64))
            std = float(train.std(dtype=np.float64))
            std = std if std > 0 else 1.0  # a constant strip (blank margin) is only centred
            part = {split: (p - mean) / std for split, p in part.items()}
            self.scaling[party] = {"columns": "all", "mean": [mean], "scale": [std]}
        elif self.scale:
            scaler = StandardScaler().fit(part["train"])
            part = {split: scaler.transform(p) for split, p in part.items()}
            self.scaling[party] = {"columns": "all", "mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist()}
        return {split: torch.from_numpy(np.ascontiguousarray(p, dtype=np.float32)) for split, p in part.items()}
