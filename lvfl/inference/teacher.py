"""The teacher's side of student distillation: its soft labels, in the parts their holders form, and the student's data.

`teacher_soft_label_parts` runs the fitted VFL model's inference on overlapping samples (`party_logits`) with every
message metered on the protocol's wire under `teacher/<tag>`, except that a prediction a *passive* party computes is
delivered to the *producer* (by default the first passive party, the paper's Stage two) instead of the active party.
Nothing the active party computes (its own or private head's prediction, a top model's output, an aggregate) is sent
to a passive party: it makes the active part S_a of y~ = (S_p + S_a) / C, S_p being the producer's part
(`lvfl.privacy.SoftLabelParts`). Moving y~ to the active party is the soft-label channel's job
(`lvfl.privacy.PlainSoftLabels`, `lvfl.privacy.PaillierSoftLabels`). `student_data` assembles the active party's
training view before the channel: its samples, which overlap, and the overlap's soft-label parts.

A regression teacher: its parts are the predicted values themselves (the standardized scale the party models predict
on), one per sample instead of M probabilities, so y~ = (S_p + S_a) / C is the mean of the predicting parties'
values, formed and moved exactly as the classification soft labels are.

Which predictions make the teacher (`teacher_predictions`): for EASTER every party model's prediction (the active
party's is its private head's when the protocol keeps one); for SplitNN, C_VFL, PraVFed and Local the one prediction
the active party computes; for Agg_VFL the aggregate A alone. Rule: an entry of `party_logits` whose key is no
party's name is a joint prediction (Agg_VFL's "aggregate"); when there is one, the joint predictions alone are the
teacher (the other entries are the parties' own-model diagnostics), otherwise every entry is. When no passive party
predicts, S_p is empty and the soft labels stay at the active party. Who learns what: `lvfl.inference.student`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lvfl.parties import VFLBatch
from lvfl.privacy.soft_labels import SoftLabelParts

__all__ = [
    "TEACHER_TAG",
    "SoftLabelParts",
    "StudentData",
    "default_producer",
    "student_data",
    "teacher_predictions",
    "teacher_soft_label_parts",
    "teacher_soft_labels",
]

# -- the teacher -------------------------------------------------------------------------------------------------
TEACHER_TAG = "teacher/"


def default_producer(teacher: Any) -> str:
    """The default producer: the first passive party (the paper's Stage two), or the active party if none (Local)."""
    passive = list(getattr(teacher, "passive", []))
    return passive[0] if passive else teacher.active


def teacher_predictions(logits: dict[str, torch.Tensor], party_names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The entries of `party_logits` that make the teacher: its joint predictions if any, else every entry.

    A joint prediction is an entry whose key is no party's name (Agg_VFL's "aggregate"); the other entries are then
    the parties' own-model diagnostics, not the VFL model's prediction.
    """
    joint = {k: v for k, v in logits.items() if k not in party_names}
    return joint if joint else dict(logits)


@torch.no_grad()
def teacher_soft_label_parts(teacher: Any, batch: VFLBatch, producer: str | None = None) -> SoftLabelParts:
    """The teacher's soft labels for `batch` in the parts the producer and the active party hold (on CPU, float32).

    Runs `teacher.party_logits` in eval mode (restoring the mode after), every message live on the teacher's wire
    under `teacher/<tag>`, with the passive parties' own predictions delivered to `producer`
    (`VFLModule.predictions_delivered_to`; not at all when it is the producer's own). Predictions the active party
    computes are never sent: they make the active part. Each part is summed in its holder's process (in a party's
    own process the other part is zeros). Each prediction enters as its softmax, or, for a regression teacher
    (`teacher.task`), as its predicted value (N x 1). See the module docstring for who learns what.

    Args:
        teacher: a fitted protocol (`party_logits`, `party_names`, `active`, `passive`, `wire`).
        batch: overlapping samples (every party holds them).
        producer: the party that receives the passive parties' predictions; default `default_producer(teacher)`.
            The active party here means "as the protocol delivers them" (everything in the active part).
    """
    active = teacher.active
    producer = default_producer(teacher) if producer is None else producer
    if producer not in teacher.party_names:
        raise ValueError(f"producer must be one of the parties {list(teacher.party_names)}, got producer={producer!r}")
    was_training, wire = teacher.training, teacher.wire
    teacher.eval()
    try:  # every message of the inference (the backend's too), live, under teacher/<tag>
        with wire.tags_under(TEACHER_TAG), teacher.predictions_delivered_to(producer):
            logits = teacher.party_logits(batch.to(teacher.device))
    finally:
        teacher.train(was_training)
    predictions = teacher_predictions(logits, teacher.party_names)
    # the passive parties' own predictions went to the producer (`predictions_delivered_to`); the rest is the
    # active party's (its own, a top model's output, a joint aggregate)
    producer_keys = [k for k in predictions if k in teacher.passive] if producer != active else []
    active_keys = [k for k in predictions if k not in producer_keys]
    task = getattr(teacher, "task", None)
    regression = task is not None and task.is_regression
    first = next(iter(predictions.values()))
    shape = (first.shape[0], first.numel() // max(first.shape[0], 1))

    def part(keys: list[str], holder: str) -> torch.Tensor:
        """The sum of `keys`' predictions at `holder` (softmax, or the values of a regression); zeros elsewhere."""
        if not keys or not wire.holds(holder):  # nothing to sum, or it is summed in another party's process
            return torch.zeros(shape)
        if regression:  # the predicted values themselves, (B, 1)
            return _sum(predictions[k].float().reshape(shape).cpu() for k in keys)
        return _sum(predictions[k].float().softmax(-1).cpu() for k in keys)

    return SoftLabelParts(
        producer=part(producer_keys, producer),
        active=part(active_keys, active),
        num_producer=len(producer_keys),
        num_active=len(active_keys),
    )


def _sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    items = list(tensors)
    out = items[0].clone()
    for t in items[1:]:
        out += t
    return out


def teacher_soft_labels(teacher: Any, batch: VFLBatch, producer: str | None = None) -> torch.Tensor:
    """The teacher's soft labels `y~` for `batch` (B x M, on CPU; B x 1 values for a regression) in one process.

    For experiments and references.

    Runs (and meters) the teacher's inference like `teacher_soft_label_parts` and returns the mean of its parts
    without running a soft-label channel: no party holds this tensor in a deployment unless the channel delivered it.
    """
    return teacher_soft_label_parts(teacher, batch, producer).mean()


# -- data --------------------------------------------------------------------------------------------------------
@dataclass
class StudentData:
    """The active party's training view: all its samples, which of them overlap, and the overlap's soft labels.

    Attributes:
        features: (N, ...) the active party's features.
        labels: (N,) class indices, or the standardized targets of a regression.
        overlap: (N,) bool, True where every party holds the sample.
        soft_labels: (N, M) teacher distributions (a regression: (N, 1) teacher predictions, standardized) the
            active party already holds in the clear, when given directly
            (experiments that bypass the channel; `fit_student` then runs no channel); rows where `overlap` is
            False are zero, and every row is zero when `parts` is set.
        parts: the overlap's soft labels as the producer and the active party hold them before the channel
            (`SoftLabelParts`, one row per overlapping sample in order), which a soft-label channel
            (`lvfl.privacy.SoftLabelChannel.send_soft_labels`) carries to the active party; None when `soft_labels`
            is given.
        regression: the labels are regression targets and the student has one output (trained on
            `lvfl.privacy.soft_labels.regression_student_loss`).
    """

    features: torch.Tensor
    labels: torch.Tensor
    overlap: torch.Tensor
    soft_labels: torch.Tensor
    parts: SoftLabelParts | None = None
    regression: bool = False

    def __post_init__(self) -> None:
        n = self.features.shape[0]
        if not (self.labels.shape == (n,) and self.overlap.shape == (n,) and self.soft_labels.shape[0] == n):
            raise ValueError(
                f"StudentData: features {tuple(self.features.shape)}, labels {tuple(self.labels.shape)}, overlap "
                f"{tuple(self.overlap.shape)} and soft_labels {tuple(self.soft_labels.shape)} must share N"
            )
        self.overlap = self.overlap.bool()
        if self.parts is not None and (
            len(self.parts) != int(self.overlap.sum()) or self.parts.active.shape[1] != self.soft_labels.shape[1]
        ):
            raise ValueError(
                f"StudentData: parts has {tuple(self.parts.active.shape)}, expected one row of "
                f"{self.soft_labels.shape[1]} per overlapping sample ({int(self.overlap.sum())})"
            )
        if self.regression and self.soft_labels.shape[1:] != (1,):
            raise ValueError(
                f"StudentData: a regression has one teacher value per sample, got {self.soft_labels.shape}"
            )

    @property
    def num_classes(self) -> int:
        """M: the width of the soft labels, and the student's number of outputs (1 for a regression)."""
        return int(self.soft_labels.shape[1])


# -- assembling the active party's view --------------------------------------------------------------------------
def student_data(
    teacher: Any,
    datamodule: Any,
    split: str = "train",
    batch_size: int = 256,
    producer: str | None = None,
    soft_labels: torch.Tensor | None = None,
    parts: SoftLabelParts | None = None,
) -> StudentData:
    """The active party's samples of `split` with the teacher's soft labels on the overlap, before the channel.

    The soft labels' parts come from `teacher_soft_label_parts` on the datamodule's VFL view of the split (overlap
    only; the teacher's messages metered on its wire under `teacher/<tag>`, passive predictions delivered to
    `producer`, default `default_producer(teacher)`), or are given as `parts` (N_o rows in the VFL view's order, e.g.
    cross-fitted ones, `lvfl.inference.cross_fit`), and are kept in `StudentData.parts` for the soft-label channel
    that `fit_student` runs; `StudentData.soft_labels` stays zero. `soft_labels` (N_o, M) may instead give `y~` as
    the active party already holds it (experiments that bypass the channel): then no teacher runs and `parts` is
    None. Matched to the active party's samples by ID; rows of active-only samples are zero. For a regression task
    (`datamodule.task`) M is 1: the teacher's predicted values, and the labels are the standardized targets.
    """
    if soft_labels is not None and parts is not None:
        raise ValueError(
            "pass soft_labels (y~ at the active party, no channel) or parts (before the channel), not both"
        )
    full = datamodule.active_set(split)
    overlap = datamodule.overlap_mask(split)
    vfl = {"train": datamodule.train_set, "val": datamodule.val_set, "test": datamodule.test_set}[split]
    shared_ids = full.ids[overlap]
    if not torch.equal(vfl.ids, shared_ids):
        raise ValueError(
            f"the datamodule's VFL {split} set holds {len(vfl)} samples, not the {int(overlap.sum())} overlapping "
            "samples of the active party's view (a participants restriction that drops every passive party?)"
        )
    task = datamodule.task
    num_classes = task.num_outputs  # M, or 1 value for a regression
    soft = torch.zeros(len(full), num_classes)
    name = datamodule.active_party_name
    data = StudentData(
        features=full.features[name], labels=full.labels, overlap=overlap, soft_labels=soft,
        regression=task.is_regression,
    )  # fmt: skip
    if soft_labels is not None:
        if tuple(soft_labels.shape) != (len(vfl), num_classes):
            raise ValueError(
                f"soft_labels has shape {tuple(soft_labels.shape)}, expected ({len(vfl)}, {num_classes}): one row per "
                f"overlapping {split} sample"
            )
        soft[overlap] = soft_labels.float().cpu()
        return data
    if not len(vfl):
        return data
    producer = default_producer(teacher) if producer is None else producer
    if parts is None:
        batches = torch.arange(len(vfl)).split(batch_size)
        parts = SoftLabelParts.cat([teacher_soft_label_parts(teacher, vfl[idx], producer) for idx in batches])
    elif len(parts) != len(vfl) or parts.active.shape[1] != num_classes:
        raise ValueError(
            f"parts has shape {tuple(parts.active.shape)}, expected ({len(vfl)}, {num_classes}): one row per "
            f"overlapping {split} sample"
        )
    data.parts = parts
    return data
