"""Soft-label channels: how the teacher's soft labels reach the active party, and the student objective they train.

The student (`lvfl.inference.student`) learns on the active party's features from its own labels and, on the samples
every party holds, from the VFL model's soft labels y~ (non-overlapping inference paper, Sec. 4.2, Eq. 3,
Algorithms 1-2). Each party forms its part of y~ (`SoftLabelParts`, made by
`lvfl.inference.teacher.teacher_soft_label_parts`):

    y~ = (S_p + S_a) / C     S_p: at the producer (a passive party), the sum of the softmax of the passive predictions
                             S_a: at the active party, the sum of the softmax of the predictions it computed
                             C:   the number of predictions (public: the protocol's structure)

A channel moves y~ to the active party and computes the student's gradient from what the active party then holds. It
is chosen by config, `StudentDistillation(channel=...)` with a `class_path`, and built before any protocol exists, so
the run's wire and roles reach it at `setup`. A student fit calls, in this order:

1. `check_roles(active, producer)`: refuse roles the channel cannot run with, before any teacher runs;
2. `setup(wire, active, producer)`: bind to the run; a channel with keys exchanges them here, every byte on `wire`;
3. `start_fit(model)`: refuse a student the channel cannot train, before anything is sent; forget the last fit;
4. `send_soft_labels(parts)`: the channel itself; y~ as the active party then holds it, one row per overlapping sample;
5. `backward(model, x, y, rows, lam)`, each step: every parameter's `.grad` for the student objective;
6. `end_epoch(num_samples, tol)`: the epoch-mean loss and whether it moved less than `tol` (Algorithm 1's check).

Channels: `PlainSoftLabels` (the default: y~ in the clear at the active party, the whole student trained by autograd)
and `PaillierSoftLabels` (`lvfl.privacy.soft_labels.paillier`; Algorithms 1-2: y~ encrypted under a coordinator's
key; see its docstring).

The objective (`student_loss`), per sample of a batch of B, averaged over the batch, with lam in [0, 1]:

    overlap i:      l_i = (1 - lam) * CE(y_i, f_s(x_i)) + lam * L_d(y~_i, f_s(x_i))
    active-only i:  l_i = CE(y_i, f_s(x_i))

`L_d` is the soft-label cross-entropy `-sum_j y~_j log softmax(z)_j`; its gradient in the logits, `softmax(z) - y~`,
is *linear in y~*, which is what lets `PaillierSoftLabels` compute it on ciphertexts.

A regression task (`regression_student_loss`): the parts are the teacher's predicted values (one per sample, on the
standardized scale the party models predict), not probabilities, y~ = (S_p + S_a) / C is the teacher's prediction,
and the student's one output f_s(x) learns

    overlap i:      l_i = (1 - lam) * (y_i - f_s(x_i))**2 + lam * (y~_i - f_s(x_i))**2
    active-only i:  l_i = (y_i - f_s(x_i))**2

Only a channel with `supports_regression` carries values (`PlainSoftLabels`); `start_fit(model, regression=True)`
refuses any other by name.

What each message reveals, and to whom:

- "soft_labels" (producer -> active party): plain, S_p in the clear, so the active party learns y~ and
  S_p = C y~ - S_a, the sum of the passive parties' predictions (with one passive predictor, that party's
  prediction; for a regression, the sum of their predicted values, one per sample instead of M); Paillier,
  ciphertexts only (semantically secure without the secret key). Not sent when the producer
  holds no prediction (the active party computes the whole teacher: SplitNN, C_VFL, Agg_VFL, PraVFed, Local).
- "keys" (coordinator -> active party and producer; Paillier): the public modulus n.
- "student_grad" (active party -> coordinator; Paillier): gradient coordinates under a uniform mask mod n: nothing.
- "student_grad_decrypted" (coordinator -> active party): the masked plaintexts; unmasked, the active party's own
  student gradient, which it must learn to update the student (Algorithm 2).
- "student_loss" (active party -> coordinator): the batch's loss sum, decrypted by the coordinator (Algorithm 1).
- "student_converged" (coordinator -> active party): one byte per epoch.

Nothing the active party computes (S_a, y~, its gradients) is sent to a passive party, and a passive party receives
nothing from a channel but the public key, so with a label mechanism a channel adds nothing to a passive party's view
that depends on the true labels. As for every coordinator-based HE scheme, a coordinator colluding with the active
party could decrypt the soft labels: stated, not defended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lvfl.checks import check_real
from lvfl.schedule import Links
from lvfl.wire import Wire

__all__ = [
    "LOG_EPS",
    "PlainSoftLabels",
    "SoftLabelChannel",
    "SoftLabelParts",
    "check_lam",
    "distillation_loss",
    "last_linear",
    "regression_student_loss",
    "student_loss",
]

#: probabilities are clamped here before the log in the encrypted loss (the exponent must be finite)
LOG_EPS = 1e-12


# -- what a channel carries --------------------------------------------------------------------------------------
@dataclass
class SoftLabelParts:
    """The teacher's soft labels for a set of samples, in the two parts their holders form: `y~ = (S_p + S_a) / C`.

    Attributes:
        producer: (N, M) S_p, the sum of the softmax of the predictions delivered to the producer (passive parties'
            own predictions); zeros when `num_producer` is 0. Held by the producer only. For a regression, (N, 1):
            the sum of the predicted values themselves.
        active: (N, M) S_a, the sum of the softmax of the predictions the active party computed (for a regression,
            of the values). Held by the active party only.
        num_producer: how many predictions `producer` sums (0: the producer holds nothing and sends nothing).
        num_active: how many predictions `active` sums.
    """

    producer: torch.Tensor
    active: torch.Tensor
    num_producer: int
    num_active: int

    def __post_init__(self) -> None:
        if self.producer.shape != self.active.shape or self.producer.dim() != 2:
            raise ValueError(
                f"SoftLabelParts: producer {tuple(self.producer.shape)} and active {tuple(self.active.shape)} must "
                "both be (N, M)"
            )
        if self.num_producer < 0 or self.num_active < 0 or self.count < 1:
            raise ValueError(f"SoftLabelParts: counts {self.num_producer}, {self.num_active} must sum to >= 1")

    @property
    def count(self) -> int:
        """C: the number of predictions averaged (public)."""
        return self.num_producer + self.num_active

    def __len__(self) -> int:
        return int(self.active.shape[0])

    def __getitem__(self, index: Any) -> SoftLabelParts:
        """The parts of a subset of the samples (rows)."""
        return SoftLabelParts(self.producer[index], self.active[index], self.num_producer, self.num_active)

    def mean(self) -> torch.Tensor:
        """y~ = (S_p + S_a) / C: what the active party ends up with after the plain channel (a reference here)."""
        return (self.producer + self.active) / self.count

    @staticmethod
    def cat(parts: Sequence[SoftLabelParts]) -> SoftLabelParts:
        """The parts of several batches of the same teacher, rows concatenated."""
        if not parts:
            raise ValueError("SoftLabelParts.cat needs at least one part")
        counts = {(p.num_producer, p.num_active) for p in parts}
        if len(counts) != 1:
            raise ValueError(f"SoftLabelParts.cat: parts from differently structured teachers {sorted(counts)}")
        ((num_producer, num_active),) = counts
        return SoftLabelParts(
            torch.cat([p.producer for p in parts]), torch.cat([p.active for p in parts]), num_producer, num_active
        )


# -- the objective (functional core) -----------------------------------------------------------------------------
def check_lam(lam: float) -> float:
    """`lam` as a float if it is in [0, 1], else an `OptionError` (a ValueError) naming the option."""
    return check_real(lam, "lam", 0.0, 1.0, why="the weight of the distillation term")


def distillation_loss(logits: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    """Per-sample soft-label cross-entropy `-sum_j y~_j log softmax(z)_j` (B x M -> B)."""
    return -(soft_labels.to(logits.dtype) * logits.log_softmax(-1)).sum(-1)


def student_loss(
    logits: torch.Tensor, labels: torch.Tensor, soft_labels: torch.Tensor, overlap: torch.Tensor, lam: float
) -> torch.Tensor:
    """The student objective on a batch: mean over samples of (1 - lam) CE + lam L_d (overlap) or CE (the rest).

    Args:
        logits: (B, M) student logits.
        labels: (B,) true class indices.
        soft_labels: (B, M) teacher distributions; rows of non-overlapping samples are ignored (any values).
        overlap: (B,) bool, True where the sample is held by every party (has a soft label).
        lam: the weight of the distillation term, in [0, 1].
    """
    lam = check_lam(lam)
    ce = F.cross_entropy(logits, labels, reduction="none")
    if lam == 0.0:  # no teacher term at all (not even 0 * NaN from unused rows)
        return ce.mean()
    soft = torch.where(overlap[:, None], soft_labels.to(logits.dtype), torch.zeros_like(logits))
    weight = overlap.to(logits.dtype) * lam
    return ((1.0 - weight) * ce + weight * distillation_loss(logits, soft)).mean()


def regression_student_loss(
    outputs: torch.Tensor, targets: torch.Tensor, teacher: torch.Tensor, overlap: torch.Tensor, lam: float
) -> torch.Tensor:
    """The regression student objective on a batch: mean of (1 - lam) (y - f)^2 + lam (y~ - f)^2 (overlap) or (y - f)^2.

    Args:
        outputs: (B, 1) the student's predictions, on the standardized scale.
        targets: (B,) the standardized targets y.
        teacher: (B, 1) or (B,) the teacher's predictions y~; rows of non-overlapping samples are ignored (any values).
        overlap: (B,) bool, True where the sample is held by every party (has a teacher prediction).
        lam: the weight of the distillation term, in [0, 1].
    """
    lam = check_lam(lam)
    if outputs.shape != (targets.shape[0], 1):
        raise ValueError(f"a regression student outputs shape (B, 1), got {tuple(outputs.shape)} for B={len(targets)}")
    pred = outputs.squeeze(-1)
    if lam == 0.0:  # no teacher term at all: exactly the Local model's MSE (the protocols' `task_loss`)
        return F.mse_loss(pred, targets.to(pred.dtype))
    mse = F.mse_loss(pred, targets.to(pred.dtype), reduction="none")
    soft = torch.where(overlap, teacher.reshape(-1).to(pred.dtype), torch.zeros_like(pred))
    weight = overlap.to(pred.dtype) * lam
    return ((1.0 - weight) * mse + weight * F.mse_loss(pred, soft, reduction="none")).mean()


def last_linear(model: nn.Module) -> nn.Linear:
    """The student's output layer: its `head` if that is a Linear, or the head's last module.

    Raises:
        ValueError: if the model's output does not come from an `nn.Linear` with a bias.
    """
    head = getattr(model, "head", model)
    layer = head[-1] if isinstance(head, nn.Sequential) and len(head) else head
    if not isinstance(layer, nn.Linear) or layer.bias is None:
        raise ValueError(
            f"the Paillier student path needs a model whose last layer is an nn.Linear with a bias, got "
            f"{type(layer).__name__}"
        )
    return layer


# -- the interface -----------------------------------------------------------------------------------------------
class SoftLabelChannel(ABC):
    """How y~ reaches the active party, and how the student's gradient is computed from what it then holds.

    Built by config before any protocol exists; `setup` binds it to a run (the protocol's wire and the roles) and
    starts afresh (fresh keys, no soft labels). One instance serves one run at a time. The epoch's loss is summed
    by whoever computes it (the active party, or the coordinator under encryption) in `_loss_sum`.

    Attributes:
        supports_regression: whether the channel carries a regression teacher's values and trains on
            `regression_student_loss`; `check_task` and `start_fit` refuse a regression by name otherwise.
    """

    supports_regression: bool = False

    def __init__(self) -> None:
        self.wire: Wire | None = None
        self.active: str | None = None
        self.producer: str | None = None
        self.regression = False  # the fit in progress is a regression's (set by start_fit)
        self._loss_sum = 0.0
        self._prev_epoch_loss: float | None = None

    def check_task(self, regression: bool) -> None:
        """Refuse a regression teacher if this channel cannot carry its values (called before any teacher runs)."""
        if regression and not self.supports_regression:
            raise ValueError(
                f"{type(self).__name__} carries class probabilities and cannot distil a regression teacher's values: "
                "use channel lvfl.privacy.PlainSoftLabels (the default) for a regression task"
            )

    def links(self, active: str, producer: str) -> Links:
        """The links this channel adds beside the producer's to the active party (`lvfl.schedule`): none."""
        return Links()

    def check_roles(self, active: str, producer: str) -> None:  # noqa: B027 - optional hook, no check by default
        """Refuse roles this channel cannot run with (called before any teacher runs, so a bad config fails fast)."""

    def setup(self, wire: Wire, active: str, producer: str) -> None:
        """Bind to a run: the protocol's `wire`, the active party and the producer of the soft labels' passive part."""
        self.check_roles(active, producer)
        self.wire, self.active, self.producer = wire, active, producer
        self._loss_sum, self._prev_epoch_loss = 0.0, None

    def start_fit(self, model: nn.Module, regression: bool = False) -> None:
        """Start a student fit: refuse a student or task this channel cannot train and forget the last fit.

        Args:
            model: the student.
            regression: the student learns a regression (`regression_student_loss`) rather than classes.
        """
        self.check_task(regression)
        self.regression = regression
        self._loss_sum, self._prev_epoch_loss = 0.0, None

    @abstractmethod
    def send_soft_labels(self, parts: SoftLabelParts) -> Any:
        """Move y~ = (S_p + S_a) / C to the active party; returns what it then holds, one row per sample of `parts`."""

    @abstractmethod
    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, lam: float) -> None:
        """Set every parameter's `.grad` for one step of the student objective on a batch (the caller steps).

        Args:
            model: the student, at the active party.
            x: (B, ...) the active party's features.
            y: (B,) true labels (standardized targets, for a regression).
            rows: (B,) each sample's row in the soft labels sent (its position in the overlap); -1 for a sample only
                the active party holds.
            lam: the weight of the distillation term.
        """

    def end_epoch(self, num_samples: int, tol: float | None) -> tuple[float, bool]:
        """The epoch-mean loss over `num_samples` and whether it moved less than `tol` since the last epoch."""
        loss = self._loss_sum / max(num_samples, 1)
        converged = tol is not None and self._prev_epoch_loss is not None and abs(loss - self._prev_epoch_loss) < tol
        self._prev_epoch_loss, self._loss_sum = loss, 0.0
        return loss, converged

    def _bound_wire(self) -> Wire:
        if self.wire is None:
            raise RuntimeError(f"{type(self).__name__} is not set up: call setup(wire, active, producer) first")
        return self.wire


# -- plain -------------------------------------------------------------------------------------------------------
class PlainSoftLabels(SoftLabelChannel):
    """The soft labels in the clear: the producer sends S_p, the active party forms y~ and trains by autograd.

    The producer sends S_p (float32, tag "soft_labels") when it holds any prediction; the active party adds its own
    S_a, divides by the public C and trains the whole student on the objective (`student_loss`; for a regression,
    `regression_student_loss` on the teacher's values). Sends nothing else: the loss and the convergence check stay
    at the active party. The active party learns y~ and S_p.

    Example:
        >>> from lvfl.wire import Wire
        >>> channel = PlainSoftLabels()
        >>> channel.setup(Wire(), active="party0", producer="party1")
        >>> parts = SoftLabelParts(torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]), 1, 1)
        >>> channel.send_soft_labels(parts)
        tensor([[0.7500, 0.2500]])
        >>> channel.wire.bytes_by_tag()
        {'soft_labels': 8}
    """

    supports_regression = True

    def __init__(self) -> None:
        super().__init__()
        self._held: torch.Tensor | None = None  # y~ at the active party, one row per overlapping sample

    def setup(self, wire: Wire, active: str, producer: str) -> None:
        """Bind to the run; nothing goes on the wire (there are no keys)."""
        super().setup(wire, active, producer)
        self._held = None

    def send_soft_labels(self, parts: SoftLabelParts) -> torch.Tensor:
        """y~ as the active party ends up with it: `(S_p + S_a) / C`, S_p sent by the producer if it holds any."""
        if parts.num_producer and len(parts):
            wire = self._bound_wire()
            if self.producer == self.active:
                raise ValueError("the producer's part must come from a passive producer, not the active party")
            at_active = wire.send(self.producer, self.active, parts.producer.float(), "soft_labels")
            if not wire.holds(self.active):  # a passive party's own process: y~ is formed at the active party only
                return at_active
        else:
            at_active = torch.zeros_like(parts.active)
        self._held = (at_active + parts.active) / parts.count
        return self._held

    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, lam: float) -> None:
        """Autograd on the objective, every layer; the batch's loss sum counts towards the epoch mean."""
        logits = model(x)
        overlap = rows >= 0
        if self.regression:  # y~: one value per overlapping sample
            teacher = logits.new_zeros(len(x))
            if self._held is not None:
                teacher[overlap] = self._held[rows[overlap], 0].to(logits.dtype)
            loss = regression_student_loss(logits, y, teacher, overlap, lam)
        else:
            soft = torch.zeros_like(logits) if self._held is None else self._held.new_zeros(logits.shape)
            if self._held is not None:
                soft[overlap] = self._held[rows[overlap]]
            loss = student_loss(logits, y, soft, overlap, lam)
        loss.backward()
        self._loss_sum += float(loss.detach()) * len(x)
