"""VerticalDataModule: one dataset split into train/val/test and vertically into party feature slices.

The base class a dataset subclasses: its options, the hooks a dataset overrides (`load()` first), the views of the
prepared data (splits, sample IDs, `party_specs`, `task`) and the loaders. The pipeline that prepares the data, run
once and lazily (by `setup()` or by the first read of `party_specs` / `task` / `describe()`), is
`lvfl.datamodules.preparation`: load, check, split, label, scale, and hold each party's slice per split.

Partial overlap (`overlap` = alpha < 1; non-overlapping inference): after the split, a seeded fraction alpha of each
split's samples (stratified as the split is) is chosen to exist at every party (`splitting.overlap_masks`); the rest
exist at the active party only (its features and labels). The VFL views (`train_set`, `val_set`, `test_set` and their
loaders) hold the overlap only, so every protocol trains and evaluates on samples all parties hold, unchanged. The
active party's view of every sample of a split is `active_set(split)`, the samples it holds alone
`active_only_set(split)`, and which IDs a party holds `party_ids(party, split)`. A passive party's scaler is fitted on
the training rows it holds (the overlap); the active party's on all training rows. With alpha = 1 (the default)
everything is exactly as without overlap.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler, SequentialSampler

from lvfl.checks import check_real
from lvfl.datamodules.augment import SampleAugmentation, augment_slices
from lvfl.datamodules.datasets import VerticalTensorDataset, held_views, select_rows
from lvfl.datamodules.labels import check_labels, check_targets
from lvfl.datamodules.partition import ContiguousColumns, Partitioner
from lvfl.datamodules.preparation import Prepared, prepare
from lvfl.datamodules.samplers import EpochShuffle, batch_loader
from lvfl.datamodules.splitting import SPLITS, check_fractions, draw_split
from lvfl.parties import PartySpec, TaskInfo, VFLBatch, party_name

__all__ = ["VerticalDataModule"]

_MAX_LISTED = 10  # unknown IDs quoted in an error message

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
        check_fractions(val_fraction, test_fraction)
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
        self._prepared: Prepared | None = None
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
            check_targets(y)
            return None
        check_labels(y, self.num_classes)
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

    def parties_held_here(self) -> set[str] | None:
        """The parties whose features `load()` holds in this process; None (the default): every party's.

        A datamodule that loads in a party's own process only that party's data says so, and the others' slices
        are made shadows straight away: their columns of `load()`'s array are never read (nor given memory).
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
        splits, active_splits, overlap = held_views(
            prepared.splits, prepared.active_splits, prepared.overlap, party, party_name(self.active_party)
        )
        self._prepared = dataclasses.replace(
            prepared, splits=splits, active_splits=active_splits, overlap=overlap, messages=()
        )
        self.scaling = {k: v for k, v in self.scaling.items() if k == party}

    def held_feature_bytes(self) -> int:
        """Bytes of feature memory this process holds once set up (0 before): each storage once, shadows none."""
        if self._prepared is None:
            return 0
        views = [*self._prepared.splits.values(), *self._prepared.active_splits.values()]
        storages = {}
        for x in (x for view in views for x in view.stored.values()):
            if x.device.type != "meta":
                storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return sum(storages.values())

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
        splits = SPLITS if split is None else (self._check_split(split),)
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
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        return split

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a `VFLBatch` tensor by tensor, non-blocking, instead of Lightning's generic dataclass walk.

        The two are compared by `benchmarks/perf/costs.py` (docs/results.md section 8).
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
            columns = {party_name(k): cols for k, cols in enumerate(prepared.columns)}
            features = augment_slices(
                self.augmentation, features, columns, prepared.image_width, batch.ids, epoch, self.seed
            )
        decoders = prepared.splits["train"].decoders
        if decoders:
            features = {k: decoders[k](x) if k in decoders else x for k, x in features.items()}
        if features is batch.features:
            return batch
        return VFLBatch(ids=batch.ids, features=features, labels=batch.labels)

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
        return select_rows(self._prepare().splits, sample_ids, "are not held by every party")

    def active_rows(self, sample_ids: Sequence[int]) -> VerticalTensorDataset:
        """The samples with these IDs, in this order, as the active party holds them (its slice only)."""
        return select_rows(self._prepare().active_splits, sample_ids, "are not samples of the active party")

    # ----------------------------------------------------------------------------------------------- internals
    def _loader(self, dataset: VerticalTensorDataset, sampler: Sampler) -> DataLoader:
        return batch_loader(dataset, sampler, self.batch_size, self.num_workers, self.seed)

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

    def _split(self, num_rows: int, key: np.ndarray | None, order: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Seeded split of the row indices, stratified by `key` (None: unstratified); each split's IDs sorted.

        The split `draw_split` draws with this datamodule's `seed`, fractions and published split (`fixed_splits`);
        `order` (a permutation of the rows) draws it over the rows in that order (`PartyTables`).
        """
        fixed = self.fixed_splits(num_rows)
        return draw_split(num_rows, key, self.seed, self.val_fraction, self.test_fraction, fixed, order)

    def _prepare(self) -> Prepared:
        """The prepared data (`lvfl.datamodules.preparation.prepare`), prepared on the first call."""
        if self._prepared is None:
            self._prepared = prepare(self)
        return self._prepared
