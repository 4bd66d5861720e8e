"""`StudentDistillation`: after the VFL model is fitted, fit a student on the active party's features alone.

The callback only adapts Lightning hooks and sends nothing itself: the teacher's soft labels come from
`lvfl.inference.teacher` (and `lvfl.inference.cross_fit`), the soft-label channel (`lvfl.privacy.PlainSoftLabels`,
`lvfl.privacy.PaillierSoftLabels`, chosen by `channel`) carries them to the active party and computes the student's
gradients, `lvfl.inference.student.fit_student` runs the loop and `lvfl.inference.evaluation` the figures. At the end
of fit it gathers the active party's training view from the datamodule (all its samples: the overlap with the
teacher's soft labels, and the samples only it holds), fits the student, evaluates it on the test split and writes
the figures to every logger:

- `student/test/acc`, `student/test/auroc` (binary tasks): all test samples of the active party;
- `student/test/acc/overlap`, `student/test/auroc/overlap`: the test samples every party holds;
- `student/test/acc/active_only`, `student/test/auroc/active_only`: those only the active party holds (absent when
  the datamodule's overlap is 1, or AUROC when one class is missing);
- a regression task instead: `student/test/r2`, `student/test/mae`, `student/test/rmse` in the target's units (all
  test samples of the active party), each also with `/overlap` and `/active_only` as above;
- `student/train/loss`: the last epoch's mean training loss; `student/epochs`: epochs run.

The same figures are kept in `metrics`, the student in `student`; the student is also saved beside the run's
checkpoints as tensors plus JSON, never as a pickle (`lvfl.inference.student_file`): `student.pt`, its state dict
(read with `torch.load(..., weights_only=True)`), and `student.json`, the class path and init args of `model`, the
input shape, embedding width, number of outputs and task kind that rebuild it. `lvfl predict --ids` finds them there
to answer the IDs only the active party holds. A `model` that is no class path plus JSON init args (e.g. a lambda)
is not saved (a warning says so).

Who learns what (see `lvfl.inference.student` and `lvfl.privacy.soft_labels`): the producer (default the first
passive party) receives the passive parties' own predictions on the overlap and forms their sum; the active party adds
its own predictions' part, in the clear (`PlainSoftLabels`) or homomorphically on the producer's ciphertexts
(`PaillierSoftLabels`). Nothing the active party computes (its predictions, a top model's output, an aggregate, the
soft labels) is sent to a passive party, so with a label mechanism the student path adds nothing to a passive party's
view that depends on the true labels; with `cross_fit`, the fold teachers train on the run's one label release.
A regression student distils the teacher's predicted values through the same parts and the same messages, one value
per sample instead of M probabilities (plain channel only), so each party learns what it learns for classification
with values in place of probabilities (the active party: the sum of the passive parties' predicted values).
"""

from __future__ import annotations

import warnings
from functools import partial

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import OptimizerCallable

from lvfl.checks import OptionError, check_int, check_positive
from lvfl.inference.cross_fit import check_folds, cross_fitted_soft_label_parts, untrained_copy
from lvfl.inference.evaluation import student_metrics
from lvfl.inference.student import build_student, fit_student
from lvfl.inference.student_file import describe_factory, save_student
from lvfl.inference.teacher import default_producer, student_data
from lvfl.loggers import log_to_loggers
from lvfl.models.base import PartyModelFactory
from lvfl.models.logistic import LogisticRegression
from lvfl.privacy.soft_labels import PlainSoftLabels, SoftLabelChannel, check_lam
from lvfl.schedule import Links, Roles

PREFIX = "student"


class StudentDistillation(Callback):
    """Fits a student model on the active party's features from real labels and the VFL model's soft labels.

    Loss per sample (lvfl's convention, see `lvfl.inference.student`): `(1 - lam) * CE(y) + lam * L_d(y~)` on the
    overlapping training samples, `CE(y)` on the samples only the active party holds.

    A regression task distils the teacher's predicted value: `(1 - lam) * (y - f_s(x))**2 + lam * (y~ - f_s(x))**2`
    on the overlap, `(y - f_s(x))**2` on the active-only samples, y the standardized target and y~ the mean of the
    predicting parties' standardized predictions (the active party's own, or the passive parties' sum from the
    producer plus the active party's, over their count; where only the active party predicts, its own). The student
    has one output on the standardized scale (`task.to_target` gives target units). The same parts travel as for
    classification, one value per sample instead of M: the producer learns the passive parties' predicted values,
    the active party their sum. Only `PlainSoftLabels` carries values; another channel is refused by name at setup.

    Args:
        model: the student's factory, called as `model(input_shape, embedding_dim, num_outputs)` like a party model
            (e.g. `lvfl.models.MLP` with its init args, or `lvfl.models.LogisticRegression`, the default);
            num_outputs is the number of classes, or 1 for a regression.
        embedding_dim: the student's embedding width (ignored by `LogisticRegression`).
        optimizer: the student's optimizer (callable on its parameters); default Adam, lr 0.01.
        lam: weight of the distillation term, in [0, 1].
        epochs: passes over the active party's training samples.
        batch_size: samples per student step.
        channel: the soft-label channel (`lvfl.privacy.SoftLabelChannel`); None is `PlainSoftLabels()` (soft labels
            in the clear at the active party). `PaillierSoftLabels(key_size=..., frac_bits=..., coordinator=...)`
            runs Algorithms 1-2: the active party holds them encrypted only, and the distillation gradient reaches
            the student's last linear layer only (layers below train on the real-label loss). Where no passive party
            predicts (SplitNN, C_VFL, Agg_VFL, PraVFed) the active party computes the soft labels itself and
            Paillier hides nothing (it warns). In a config: `channel: {class_path: lvfl.privacy.PaillierSoftLabels,
            init_args: {key_size: 2048}}`.
        producer: the passive party that receives the passive parties' predictions and sends their sum to the
            active party (default: the first passive party); the active party here keeps everything where the
            protocol delivers it.
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
        channel: SoftLabelChannel | None = None,
        producer: str | None = None,
        tol: float | None = None,
        seed: int = 0,
        teacher_batch_size: int = 256,
        cross_fit: int | None = None,
    ) -> None:
        self.lam = check_lam(lam)
        self.epochs = check_int(epochs, "epochs", 1)
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self.teacher_batch_size = check_int(teacher_batch_size, "teacher_batch_size", 1)
        self.tol = None if tol is None else check_positive(tol, "tol", why="or None to run every epoch")
        if channel is None:
            channel = PlainSoftLabels()
        if not isinstance(channel, SoftLabelChannel):
            raise OptionError(
                "channel must be a lvfl.privacy.SoftLabelChannel (e.g. lvfl.privacy.PlainSoftLabels or "
                f"lvfl.privacy.PaillierSoftLabels), got {type(channel).__name__} {channel!r}"
            )
        self.channel = channel
        self.model_factory = model
        self.embedding_dim = embedding_dim
        self.optimizer = optimizer if optimizer is not None else partial(torch.optim.Adam, lr=0.01)
        self.producer = producer
        self.seed = seed
        self.cross_fit = None if cross_fit is None else check_folds(cross_fit)
        self._template: LightningModule | None = None
        self.student: torch.nn.Module | None = None
        self.losses: list[float] = []
        self.metrics: dict[str, float] = {}

    def links(self, roles: Roles) -> Links:
        """The links the student adds to the protocol's (`lvfl.schedule`).

        In the teacher's inference every passive party's prediction goes to the producer (one-way), the producer's
        part to the active party, and the channel adds its own.
        """
        producer = self.producer if self.producer is not None else (roles.passive or (roles.active,))[0]
        to_producer = Links((k, producer) for k in roles.passive)
        return to_producer | Links([(producer, roles.active)]) | self.channel.links(roles.active, producer)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Keep an unbuilt copy of the protocol for the fold teachers (callbacks set up before the module builds).

        Refuses, before training, a regression task with a channel that cannot carry a teacher's values.
        """
        task = getattr(trainer.datamodule, "task", None) if trainer.datamodule is not None else None
        if task is not None:
            self.channel.check_task(task.is_regression)
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
        self.channel.check_roles(active, producer)  # before any fold or teacher runs
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
        # the teacher's inference: the soft labels' parts, each at its holder, before the channel
        data = student_data(pl_module, dm, "train", self.teacher_batch_size, producer, parts=parts)
        self.channel.setup(pl_module.wire, active, producer)  # keys, if the channel has any, on the protocol's wire
        if not pl_module.wire.holds(active):  # a passive party's own process: its part of the channel, no student
            if self.lam > 0 and bool(data.overlap.any()) and data.parts is not None:
                self.channel.send_soft_labels(data.parts)  # as `fit_student` has the active party receive them
            return

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
            channel=self.channel,
            tol=self.tol,
        )
        self.student, self.losses = fit.model, fit.losses
        self.metrics = student_metrics(fit.model, dm, data.num_classes, "test", PREFIX)
        self.metrics[f"{PREFIX}/train/loss"] = fit.losses[-1]
        self.metrics[f"{PREFIX}/epochs"] = float(len(fit.losses))
        log_to_loggers(trainer, self.metrics)
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if trainer.is_global_zero and folder:
            try:
                describe_factory(self.model_factory)
            except ValueError as err:
                warnings.warn(
                    f"StudentDistillation: the student is not saved beside the checkpoints ({err}); lvfl predict "
                    "cannot answer IDs only the active party holds for this run",
                    UserWarning,
                    stacklevel=2,
                )
            else:
                save_student(
                    fit.model,
                    folder,
                    factory=self.model_factory,
                    input_shape=input_shape,
                    embedding_dim=self.embedding_dim,
                    task=dm.task,
                )
        if trainer.is_global_zero:
            for logger in trainer.loggers:  # loggers were finalized before on_fit_end: write these rows out
                logger.save()
