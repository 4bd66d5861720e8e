"""Cross-fitted soft labels: the teacher's predictions for samples it did not train on.

A VFL model's soft labels on its own training samples are close to the hard labels (it has fitted them: on
breast_cancer the mean |y~ - y| is ~0.01), so distilling them into a student adds almost nothing to the labels
themselves. Cross-fitting gives each overlapping training sample the prediction of a teacher that did not see it:
the overlap is split into K stratified folds, K fresh copies of the protocol are trained by VFL on K - 1 folds each
(same trainer settings, fresh keys and initialisation), and each predicts its held-out fold through
`teacher_soft_labels`. The soft labels then carry the teacher's uncertainty, as the paper's Stage two intends
("the VFL model predicts each training sample"). The price is K more VFL trainings: their messages are real and
are merged into the protocol's wire under `cross_fit/<tag>` (the fold teachers' inference under
`cross_fit/teacher/<tag>`), so the ledger shows what cross-fitting cost.

The fitted teacher itself still serves every prediction afterwards (the router, the VFL test metrics); only the
student's targets come from the fold teachers.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from sklearn.model_selection import StratifiedKFold
from torch.utils.data import RandomSampler

from lvfl.datamodules.base import VerticalTensorDataset
from lvfl.inference.student import teacher_soft_labels
from lvfl.wire import Wire

__all__ = ["FoldDataModule", "check_folds", "cross_fitted_soft_labels", "untrained_copy"]

CROSS_FIT_TAG = "cross_fit/"


def check_folds(folds: int, num_samples: int | None = None) -> int:
    """Return `folds` if it is an integer >= 2 (and at most the number of samples), else raise naming the option."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ValueError(f"cross_fit must be an integer >= 2 (the number of folds) or None, got cross_fit={folds!r}")
    if num_samples is not None and folds > num_samples:
        raise ValueError(f"cross_fit={folds} folds but only {num_samples} overlapping training samples")
    return folds


class FoldDataModule(LightningDataModule):
    """A `VerticalDataModule` with some of its (overlapping) training samples held out.

    Serves what protocols read from a datamodule: `party_specs`, `task`, `train_set` (the kept samples),
    `train_dataloader` (shuffled with the given seed, the base datamodule's batch size) and validation from the base.
    """

    def __init__(self, base: Any, keep: torch.Tensor, seed: int = 0) -> None:
        super().__init__()
        self.base = base
        self.seed = seed
        self._train = base.train_set.subset(torch.nonzero(keep).flatten())

    @property
    def party_specs(self) -> Any:
        """The base datamodule's parties."""
        return self.base.party_specs

    @property
    def task(self) -> Any:
        """The base datamodule's task."""
        return self.base.task

    @property
    def active_party_name(self) -> str:
        """The base datamodule's active party."""
        return self.base.active_party_name

    @property
    def train_set(self) -> VerticalTensorDataset:
        """The kept training samples."""
        return self._train

    @property
    def val_set(self) -> VerticalTensorDataset:
        """The base datamodule's validation split."""
        return self.base.val_set

    def train_dataloader(self) -> Any:
        """The kept samples, shuffled with `seed`, at the base batch size."""
        generator = torch.Generator().manual_seed(self.seed)
        return self.base._loader(self._train, RandomSampler(self._train, generator=generator))

    def val_dataloader(self) -> Any:
        """The base datamodule's validation loader."""
        return self.base.val_dataloader()


def untrained_copy(module: LightningModule) -> LightningModule:
    """A copy of an *unbuilt* protocol (no party models, keys or ledger yet), with a fresh wire.

    Raises:
        ValueError: if the module is already built (its copy would share keys and masks with it).
    """
    if getattr(module, "built", False):
        raise ValueError(
            "cross-fitting needs the protocol before it is built (fresh keys and weights per fold); this one already "
            "has party models (a resumed or pre-built module)"
        )
    template = copy.deepcopy(module)  # LightningModule.__getstate__ drops the trainer reference
    template.wire = Wire()
    return template


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-fit banners (accelerator, tips) for the K fold fits; warnings still show."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _merge(into: Wire, ledger: Wire) -> None:
    """Add `ledger`'s bytes and messages to `into`, each tag under `cross_fit/`."""
    for (src, dst, tag), n in ledger.bytes.items():
        into.bytes[(src, dst, CROSS_FIT_TAG + tag)] += n
    for (src, dst, tag), n in ledger.messages.items():
        into.messages[(src, dst, CROSS_FIT_TAG + tag)] += n


def cross_fitted_soft_labels(
    template: LightningModule,
    datamodule: Any,
    folds: int,
    max_epochs: int,
    wire: Wire,
    producer: str | None = None,
    seed: int = 0,
    accelerator: str = "cpu",
    batch_size: int = 256,
) -> torch.Tensor:
    """Soft labels (N_o, M) for the datamodule's VFL training set (the overlap), each from a teacher not trained on it.

    Args:
        template: the unbuilt protocol (see `untrained_copy`); each fold trains its own deep copy.
        datamodule: the `VerticalDataModule` whose `train_set` is the overlap.
        folds: K >= 2 stratified folds.
        max_epochs: epochs per fold teacher (the main fit's).
        wire: where the fold trainings' ledgers are merged (the protocol's wire), under `cross_fit/<tag>`.
        producer: the party the fold teachers' predictions are delivered to (see `teacher_soft_labels`).
        seed: seed of the folds, the fold teachers' initialisation and their batch order.
        accelerator: the fold trainers' accelerator.
        batch_size: samples per prediction pass.
    """
    train = datamodule.train_set
    labels = train.labels.cpu().numpy()
    check_folds(folds, len(labels))
    counts = np.bincount(labels)
    smallest = int(counts[counts > 0].min())
    if smallest < folds:  # StratifiedKFold needs every class in every fold
        raise ValueError(
            f"cross_fit={folds} folds but the smallest class has only {smallest} overlapping training samples: "
            "use fewer folds"
        )
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    soft = torch.zeros(len(labels), datamodule.task.num_classes)
    for k, (fit_index, held_index) in enumerate(splitter.split(np.zeros(len(labels)), labels)):
        keep = torch.zeros(len(labels), dtype=torch.bool)
        keep[torch.from_numpy(fit_index)] = True
        fold_dm = FoldDataModule(datamodule, keep, seed=seed + k)
        teacher = copy.deepcopy(template)
        teacher.wire = Wire()
        with torch.random.fork_rng(), _quiet_lightning():
            torch.manual_seed(seed * 1000 + k)
            trainer = Trainer(
                max_epochs=max_epochs,
                accelerator=accelerator,
                devices=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                limit_val_batches=0,
                num_sanity_val_steps=0,
            )
            trainer.fit(teacher, datamodule=fold_dm)
        held = torch.from_numpy(held_index)
        for part in held.split(batch_size):
            soft[part] = teacher_soft_labels(teacher, train[part], producer)
        _merge(wire, teacher.wire)
    return soft
