"""Cross-fitted soft labels: the teacher's predictions for samples it did not train on.

A VFL model's soft labels on its own training samples are close to the hard labels (it has fitted them: on
breast_cancer the mean |y~ - y| is ~0.01), so distilling them into a student adds almost nothing to the labels
themselves. Cross-fitting gives each overlapping training sample the prediction of a teacher that did not see it:
the overlap is split into K folds (stratified by class; plain shuffled folds for a regression or with a label
mechanism, since a passive party takes part in every fold and sees which samples each holds), K fresh copies of
the protocol are trained by VFL on K - 1 folds each (same trainer settings, fresh keys and initialisation), and each
predicts its held-out fold through `teacher_soft_label_parts`. The soft labels then carry the teacher's uncertainty,
as the paper's Stage two intends ("the VFL model predicts each training sample"). The price is K more VFL trainings:
their messages are real and go through the protocol's own wire under `cross_fit/<tag>` (the fold teachers'
inference under `cross_fit/teacher/<tag>`; `Wire.send`, so the ledger shows what cross-fitting cost and the wire's
observers, e.g. a label audit, see every message a passive party receives in the folds too).

Label privacy: the fold teachers train on the run's one label release (`LabelRelease.restrict`: the parent's draw for
the fold's samples, on the parent's `PrivacyLedger`), never on a release of their own, since each fold drawing again
would release every label K more times. The parent's ledger records every release that happens, so with a mechanism
it shows exactly one after cross-fitting. The fold teachers' soft labels are formed like the fitted teacher's
(`lvfl.inference.teacher.teacher_soft_label_parts`): passive predictions to the producer, nothing the active party
computes sent down.

A regression works the same way: the fold teachers' predicted values are the soft labels' parts
(`teacher_soft_label_parts`), each from a teacher that did not train on the sample.

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
from sklearn.model_selection import KFold, StratifiedKFold
from torch.utils.data import RandomSampler

from lvfl.checks import check_int
from lvfl.datamodules.datasets import VerticalTensorDataset
from lvfl.inference.teacher import teacher_soft_label_parts
from lvfl.privacy.labels.release import LabelRelease
from lvfl.privacy.soft_labels import SoftLabelParts
from lvfl.wire import Wire

__all__ = [
    "FoldDataModule",
    "check_folds",
    "cross_fitted_soft_label_parts",
    "cross_fitted_soft_labels",
    "untrained_copy",
]

CROSS_FIT_TAG = "cross_fit/"


def check_folds(folds: int, num_samples: int | None = None) -> int:
    """Return `folds` if it is an integer >= 2 (and at most the number of samples), else raise naming the option."""
    folds = check_int(folds, "cross_fit", 2, why="the number of folds, or None")
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

    def model_input(self, batch: Any, augment: bool = False, epoch: int = 0) -> Any:
        """The base datamodule's decoding (and augmentation) of a stored batch."""
        return self.base.model_input(batch, augment=augment, epoch=epoch)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Decode (and, in training, augment) a stored batch as the base datamodule's own loaders are."""
        trainer = self.trainer
        training = trainer is not None and trainer.training
        return self.model_input(batch, augment=training, epoch=trainer.current_epoch if trainer is not None else 0)


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


def cross_fitted_soft_label_parts(
    template: LightningModule,
    datamodule: Any,
    folds: int,
    max_epochs: int,
    wire: Wire,
    producer: str | None = None,
    seed: int = 0,
    accelerator: str = "cpu",
    batch_size: int = 256,
    release: LabelRelease | None = None,
) -> SoftLabelParts:
    """Soft-label parts (N_o rows) for the VFL training set (the overlap), each from a teacher not trained on it.

    See `lvfl.privacy.SoftLabelParts`; rows are in the datamodule's `train_set` order.

    Args:
        template: the unbuilt protocol (see `untrained_copy`); each fold trains its own deep copy.
        datamodule: the `VerticalDataModule` whose `train_set` is the overlap.
        folds: K >= 2 folds, stratified by class (a regression's are shuffled, unstratified).
        max_epochs: epochs per fold teacher (the main fit's).
        wire: the protocol's wire: the fold trainings and inferences are sent through it under `cross_fit/<tag>`.
        producer: the party the fold teachers' passive predictions are delivered to (see `teacher_soft_label_parts`).
        seed: seed of the folds, the fold teachers' initialisation and their batch order.
        accelerator: the fold trainers' accelerator.
        batch_size: samples per prediction pass.
        release: the run's label release (`module.label_release`, drawn at fit start); each fold trains on its
            restriction to the fold's samples. Required when the template has a label mechanism.

    Raises:
        ValueError: with a label mechanism but no `release` (each fold would spend epsilon again, off the ledger).
    """
    if release is None and getattr(template, "label_mechanism", None) is not None:
        raise ValueError(
            "cross-fitting a protocol with a label mechanism needs the run's label release (release=module."
            "label_release): fold teachers must reuse it, not draw (and spend epsilon) again"
        )
    train = datamodule.train_set
    labels = train.labels.cpu().numpy()
    check_folds(folds, len(labels))
    task = getattr(datamodule, "task", None)
    if (task is not None and task.is_regression) or release is not None:
        # real-valued targets have no classes to stratify on; with a label mechanism the folds must not depend on the
        # true labels either: a passive party trains in every fold teacher and sees which samples each fold holds
        splits = KFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(labels)))
    else:
        counts = np.bincount(labels)
        smallest = int(counts[counts > 0].min())
        if smallest < folds:  # StratifiedKFold needs every class in every fold
            raise ValueError(
                f"cross_fit={folds} folds but the smallest class has only {smallest} overlapping training samples: "
                "use fewer folds"
            )
        splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        splits = splitter.split(np.zeros(len(labels)), labels)
    rows: list[tuple[torch.Tensor, SoftLabelParts]] = []
    for k, (fit_index, held_index) in enumerate(splits):
        keep = torch.zeros(len(labels), dtype=torch.bool)
        keep[torch.from_numpy(fit_index)] = True
        fold_dm = FoldDataModule(datamodule, keep, seed=seed + k)
        teacher = copy.deepcopy(template)
        teacher.wire = wire.prefixed(CROSS_FIT_TAG)  # the fold's traffic is the run's, under cross_fit/
        if release is not None:  # the run's one release, for the fold's samples, on the run's ledger
            teacher.label_release = release.restrict(fold_dm.train_set.ids)
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
            rows.append((part, teacher_soft_label_parts(teacher, train[part], producer)))
    order = torch.cat([index for index, _ in rows])
    parts = SoftLabelParts.cat([p for _, p in rows])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return parts[inverse]


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
    release: LabelRelease | None = None,
) -> torch.Tensor:
    """Cross-fitted soft labels y~ (N_o, M; N_o x 1 values for a regression): `cross_fitted_soft_label_parts`' mean.

    In one process, for experiments and references; no soft-label channel runs (see
    `lvfl.inference.teacher.teacher_soft_labels`).
    """
    return cross_fitted_soft_label_parts(
        template, datamodule, folds, max_epochs, wire, producer, seed, accelerator, batch_size, release
    ).mean()
