"""`StudentDistillation`: after the VFL model is fitted, fit a student on the active party's features alone.

The logic lives in `lvfl.inference.student` (objective, teacher soft labels, the Paillier roles of Algorithms 1-2);
this callback only gathers the active party's training view from the datamodule (all its samples: the overlap with
the teacher's soft labels, and the samples only it holds), fits the student at the end of fit, evaluates it on the
test split and writes the figures to every logger:

- `student/test/acc`, `student/test/auroc` (binary tasks): all test samples of the active party;
- `student/test/acc/overlap`, `student/test/auroc/overlap`: the test samples every party holds;
- `student/test/acc/active_only`, `student/test/auroc/active_only`: those only the active party holds (absent when
  the datamodule's overlap is 1, or AUROC when one class is missing);
- `student/train/loss`: the last epoch's mean training loss; `student/epochs`: epochs run.

The same figures are kept in `metrics`, the student in `student`.

Who learns what (see `lvfl.inference.student`): the producer (default the first passive party) receives the passive
parties' own predictions on the overlap and forms their sum; the active party adds its own predictions' part, in the
clear (`encryption="plain"`) or homomorphically on the producer's ciphertexts ("paillier"). Nothing the active party
computes (its predictions, a top model's output, an aggregate, the soft labels) is sent to a passive party, so with a
label mechanism the student path adds nothing to a passive party's view that depends on the true labels; with
`cross_fit`, the fold teachers train on the run's one label release.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import OptimizerCallable

from lvfl.inference.cross_fit import check_folds, cross_fitted_soft_label_parts, untrained_copy
from lvfl.inference.student import PaillierDistillation, build_student, check_lam, evaluate_student, fit_student
from lvfl.inference.teacher import Encryption, default_producer, student_data
from lvfl.loggers import log_to_loggers
from lvfl.models.base import PartyModelFactory
from lvfl.models.logistic import LogisticRegression

PREFIX = "student"


class StudentDistillation(Callback):
    """Fits a student model on the active party's features from real labels and the VFL model's soft labels.

    Loss per sample (lvfl's convention, see `lvfl.inference.student`): `(1 - lam) * CE(y) + lam * L_d(y~)` on the
    overlapping training samples, `CE(y)` on the samples only the active party holds.

    Args:
        model: the student's factory, called as `model(input_shape, embedding_dim, num_classes)` like a party model
            (e.g. `lvfl.models.MLP` with its init args, or `lvfl.models.LogisticRegression`, the default).
        embedding_dim: the student's embedding width (ignored by `LogisticRegression`).
        optimizer: the student's optimizer (callable on its parameters); default Adam, lr 0.01.
        lam: weight of the distillation term, in [0, 1].
        epochs: passes over the active party's training samples.
        batch_size: samples per student step.
        encryption: "plain" (soft labels in the clear at the active party) or "paillier" (Algorithms 1-2: the
            active party holds them encrypted only; the distillation gradient reaches the student's last linear
            layer only, layers below train on the real-label loss). Where no passive party predicts (SplitNN,
            C_VFL, Agg_VFL, PraVFed) the active party computes the soft labels itself and "paillier" hides nothing
            (it warns).
        key_size: Paillier modulus bits (>= 2048).
        frac_bits: Paillier fixed-point fractional bits.
        producer: the passive party that receives the passive parties' predictions and sends their sum to the
            active party (default: the first passive party); the active party here keeps everything where the
            protocol delivers it.
        coordinator: the Paillier key holder's name.
        tol: stop when the epoch-mean loss moves less than this (Algorithm 1's check); None runs every epoch.
        seed: seed of the student's initialisation and batch order.
        teacher_batch_size: samples per teacher forward pass.
        cross_fit: None (the fitted teacher's own predictions on its training samples) or K >= 2: cross-fitted soft
            labels, each overlapping sample's from one of K fold teachers that did not train on it (K more VFL
            trainings, same epochs, on the run's one label release, metered under `cross_fit/<tag>`; see
            `lvfl.inference.cross_fit`). The fitted teacher's own soft labels on its training samples are nearly the
            hard labels, so cross-fitting is what gives the student the teacher's uncertainty.

    Example:
        >>> cb = StudentDistillation(lam=0.5, epochs=5)
        >>> # pl.Trainer(callbacks=[cb]).fit(EASTER(...), datamodule=BreastCancer(num_parties=2, overlap=0.5))
        >>> # cb.metrics["student/test/auroc"]
    """

    def __init__(
        self,
        model: PartyModelFactory = LogisticRegression,
        embedding_dim: int = 16,
        optimizer: OptimizerCallable | None = None,
        lam: float = 0.5,
        epochs: int = 20,
        batch_size: int = 64,
        encryption: Encryption = "plain",
        key_size: int = 2048,
        frac_bits: int = 16,
        producer: str | None = None,
        coordinator: str = "coordinator",
        tol: float | None = None,
        seed: int = 0,
        teacher_batch_size: int = 256,
        cross_fit: int | None = None,
    ) -> None:
        self.lam = check_lam(lam)
        if encryption not in ("plain", "paillier"):
            raise ValueError(f"encryption must be 'plain' or 'paillier', got encryption={encryption!r}")
        for name, value in (("epochs", epochs), ("batch_size", batch_size), ("teacher_batch_size", teacher_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if tol is not None and not tol > 0:
            raise ValueError(f"tol must be positive or None, got tol={tol!r}")
        self.model_factory = model
        self.embedding_dim = embedding_dim
        self.optimizer = optimizer if optimizer is not None else partial(torch.optim.Adam, lr=0.01)
        self.epochs, self.batch_size, self.teacher_batch_size = epochs, batch_size, teacher_batch_size
        self.encryption: Encryption = encryption
        self.key_size, self.frac_bits = key_size, frac_bits
        self.producer, self.coordinator = producer, coordinator
        self.tol, self.seed = tol, seed
        self.cross_fit = None if cross_fit is None else check_folds(cross_fit)
        self._template: LightningModule | None = None
        self.student: torch.nn.Module | None = None
        self.losses: list[float] = []
        self.metrics: dict[str, float] = {}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Keep an unbuilt copy of the protocol for the fold teachers (callbacks set up before the module builds)."""
        if self.cross_fit is not None and stage == "fit" and self._template is None:
            if trainer.world_size > 1:
                raise ValueError("cross_fit runs its fold teachers in one process: use it without DDP")
            self._template = untrained_copy(pl_module)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Fit the student on the fitted teacher, evaluate it on the test split and log the figures."""
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "active_set"):
            raise TypeError("StudentDistillation needs a VerticalDataModule (with active_set / overlap_mask)")
        active = dm.active_party_name
        producer = self.producer if self.producer is not None else default_producer(pl_module)
        paillier = None
        if self.encryption == "paillier":  # checks the roles before any fold or teacher runs
            paillier = PaillierDistillation(
                pl_module.wire, active, producer, self.coordinator, key_size=self.key_size, frac_bits=self.frac_bits
            )
        parts = None
        if self.cross_fit is not None:
            if self._template is None:
                raise RuntimeError("cross_fit: the protocol was not captured before it was built (setup not called)")
            if not isinstance(trainer.max_epochs, int) or trainer.max_epochs < 1:
                raise ValueError(
                    f"cross_fit trains each fold teacher for trainer.max_epochs, which is {trainer.max_epochs!r}: "
                    "set trainer.max_epochs"
                )
            parts = cross_fitted_soft_label_parts(
                self._template,
                dm,
                self.cross_fit,
                trainer.max_epochs,
                pl_module.wire,
                producer=producer,
                seed=self.seed,
                accelerator="cpu" if pl_module.device.type == "cpu" else "auto",
                batch_size=self.teacher_batch_size,
                release=getattr(pl_module, "label_release", None),
            )
        # the teacher's inference and, for plain, the soft-label channel: y~ as the active party holds it
        data = student_data(
            pl_module, dm, "train", self.teacher_batch_size, producer, parts=parts, encryption=self.encryption
        )
        if paillier is not None:
            paillier.setup()  # the coordinator's key to the active party and the producer

        input_shape = tuple(data.features.shape[1:])
        student = build_student(self.model_factory, input_shape, self.embedding_dim, data.num_classes, self.seed)
        fit = fit_student(
            student,
            data,
            self.lam,
            epochs=self.epochs,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            seed=self.seed,
            paillier=paillier,
            tol=self.tol,
        )
        self.student, self.losses = fit.model, fit.losses
        self.metrics = self.evaluate(dm, data.num_classes)
        self.metrics[f"{PREFIX}/train/loss"] = fit.losses[-1]
        self.metrics[f"{PREFIX}/epochs"] = float(len(fit.losses))
        log_to_loggers(trainer, self.metrics)
        if trainer.is_global_zero:
            for logger in trainer.loggers:  # loggers were finalized before on_fit_end: write these rows out
                logger.save()

    def evaluate(self, datamodule: Any, num_classes: int, split: str = "test") -> dict[str, float]:
        """The student's metrics on all samples of `split`, its overlap and its active-only samples."""
        if self.student is None:
            raise RuntimeError("the student is fitted at the end of fit")
        full = datamodule.active_set(split)
        mask = datamodule.overlap_mask(split)
        x, y = full.features[datamodule.active_party_name], full.labels
        out: dict[str, float] = {}
        for suffix, keep in (("", None), ("/overlap", mask), ("/active_only", ~mask)):
            xs, ys = (x, y) if keep is None else (x[keep], y[keep])
            for metric, value in evaluate_student(self.student, xs, ys, num_classes).items():
                out[f"{PREFIX}/{split}/{metric}{suffix}"] = value
        return out
