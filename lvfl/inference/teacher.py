"""The teacher's side of student distillation: its soft labels, in the parts their holders form, and the student's data.

`teacher_soft_label_parts` runs the fitted VFL model's inference on overlapping samples (`party_logits`) with every
message metered on the protocol's wire under `teacher/<tag>`, except that a prediction a *passive* party computes is
delivered to the *producer* (by default the first passive party, the paper's Stage two) instead of the active party.
Nothing the active party computes (its own or private head's prediction, a top model's output, an aggregate) is sent
to a passive party: it makes the active part S_a of y~ = (S_p + S_a) / C, S_p being the producer's part. The plain
channel (`plain_soft_labels`) sends S_p to the active party; the encrypted one is
`lvfl.inference.student.PaillierDistillation`. `student_data` assembles the active party's training view: its
samples, which overlap, and the overlap's soft labels. Who learns what: `lvfl.inference.student`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from lvfl.parties import VFLBatch
from lvfl.wire import Wire

__all__ = [
    "TEACHER_TAG",
    "Encryption",
    "SoftLabelParts",
    "StudentData",
    "default_producer",
    "plain_soft_labels",
    "student_data",
    "teacher_predictions",
    "teacher_soft_label_parts",
    "teacher_soft_labels",
]

Encryption = Literal["plain", "paillier"]

# -- the teacher -------------------------------------------------------------------------------------------------
TEACHER_TAG = "teacher/"


@dataclass
class SoftLabelParts:
    """The teacher's soft labels for a set of samples, in the two parts their holders form: `y~ = (S_p + S_a) / C`.

    Attributes:
        producer: (N, M) S_p, the sum of the softmax of the predictions delivered to the producer (passive parties'
            own predictions); zeros when `num_producer` is 0. Held by the producer only.
        active: (N, M) S_a, the sum of the softmax of the predictions the active party computed. Held by the active
            party only.
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

    Runs `teacher.party_logits` in eval mode (restoring the mode after) and meters its messages on the teacher's wire
    under `teacher/<tag>`, except that a prediction a passive party sends to the active party goes to `producer`
    instead (not at all when it is the producer's own). Predictions the active party computes are never sent: they
    make the active part. See the module docstring for who learns what.

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
    was_training = teacher.training
    teacher.eval()
    try:
        with teacher.wire.recording() as held:
            logits = teacher.party_logits(batch.to(teacher.device))
    finally:
        teacher.train(was_training)
    predictions = teacher_predictions(logits, teacher.party_names)
    # a passive party's message whose arrival *is* one of the predictions delivered that party's own prediction
    wanted = {id(v) for v in predictions.values()}
    from_passive = {
        id(received) for src, dst, _, _, received in held if dst == active and src != active and id(received) in wanted
    }
    at_producer = from_passive if producer != active else set()
    for src, dst, payload, tag, received in held:
        if id(received) in at_producer:
            dst = producer
        if src != dst:  # the producer's own prediction, delivered to itself, does not cross the wire
            teacher.wire.send(src, dst, payload, TEACHER_TAG + tag)
    probs = {k: v.float().softmax(-1).cpu() for k, v in predictions.items()}
    shape = next(iter(probs.values())).shape
    producer_keys = [k for k, v in predictions.items() if id(v) in at_producer]
    active_keys = [k for k in predictions if k not in producer_keys]
    return SoftLabelParts(
        producer=_sum(probs[k] for k in producer_keys) if producer_keys else torch.zeros(shape),
        active=_sum(probs[k] for k in active_keys) if active_keys else torch.zeros(shape),
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
    """The teacher's soft labels `y~` for `batch` (B x M, on CPU) in one process, for experiments and references.

    Runs (and meters) the teacher's inference like `teacher_soft_label_parts` and returns the mean of its parts
    without running a soft-label channel: no party holds this tensor in a deployment unless the channel delivered it.
    """
    return teacher_soft_label_parts(teacher, batch, producer).mean()


def plain_soft_labels(wire: Wire, parts: SoftLabelParts, active: str, producer: str) -> torch.Tensor:
    """The plain channel: `y~` as the active party ends up with it.

    The producer sends S_p (float32, tag "soft_labels") when it holds any prediction; the active party adds its own
    S_a and divides by the public count C. With no passive prediction nothing is sent.
    """
    if parts.num_producer and len(parts):
        if producer == active:
            raise ValueError("the producer's part must come from a passive producer, not the active party")
        at_active = wire.send(producer, active, parts.producer.float(), "soft_labels")
    else:
        at_active = torch.zeros_like(parts.active)
    return (at_active + parts.active) / parts.count


# -- data --------------------------------------------------------------------------------------------------------
@dataclass
class StudentData:
    """The active party's training view: all its samples, which of them overlap, and the overlap's soft labels.

    Attributes:
        features: (N, ...) the active party's features.
        labels: (N,) class indices.
        overlap: (N,) bool, True where every party holds the sample.
        soft_labels: (N, M) teacher distributions as the active party holds them in the clear (the plain path);
            rows where `overlap` is False are zero, and so is every row for the encrypted path.
        parts: for the encrypted path, the overlap's soft labels as the producer and the active party hold them
            before the channel (`SoftLabelParts`, one row per overlapping sample in order), which
            `PaillierDistillation.send_soft_labels` turns into [[y~]] at the active party; None on the plain path.
    """

    features: torch.Tensor
    labels: torch.Tensor
    overlap: torch.Tensor
    soft_labels: torch.Tensor
    parts: SoftLabelParts | None = None

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

    @property
    def num_classes(self) -> int:
        """M: the width of the soft labels."""
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
    encryption: Encryption = "plain",
) -> StudentData:
    """The active party's samples of `split` with the teacher's soft labels on the overlap, as it holds them.

    The soft labels' parts come from `teacher_soft_label_parts` on the datamodule's VFL view of the split (overlap
    only; the teacher's messages metered on its wire under `teacher/<tag>`, passive predictions delivered to
    `producer`, default `default_producer(teacher)`), or are given as `parts` (N_o rows in the VFL view's order, e.g.
    cross-fitted ones, `lvfl.inference.cross_fit`). Then, for `encryption="plain"`, the plain channel runs on the
    teacher's wire (`plain_soft_labels`) and `soft_labels` holds `y~` on the overlap; for "paillier", the parts are
    kept for `PaillierDistillation.send_soft_labels` (called by `fit_student`) and `soft_labels` stays zero.
    `soft_labels` (N_o, M) may instead give `y~` as the active party already holds it (experiments that bypass the
    channel; plain only). Matched to the active party's samples by ID; rows of active-only samples are zero.
    """
    if encryption not in ("plain", "paillier"):
        raise ValueError(f"encryption must be 'plain' or 'paillier', got encryption={encryption!r}")
    if soft_labels is not None and (parts is not None or encryption != "plain"):
        raise ValueError("soft_labels gives y~ at the active party (plain, no channel): pass parts instead")
    full = datamodule.active_set(split)
    overlap = datamodule.overlap_mask(split)
    vfl = {"train": datamodule.train_set, "val": datamodule.val_set, "test": datamodule.test_set}[split]
    shared_ids = full.ids[overlap]
    if not torch.equal(vfl.ids, shared_ids):
        raise ValueError(
            f"the datamodule's VFL {split} set holds {len(vfl)} samples, not the {int(overlap.sum())} overlapping "
            "samples of the active party's view (a participants restriction that drops every passive party?)"
        )
    num_classes = datamodule.task.num_classes
    soft = torch.zeros(len(full), num_classes)
    name = datamodule.active_party_name
    data = StudentData(features=full.features[name], labels=full.labels, overlap=overlap, soft_labels=soft)
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
    if encryption == "plain":
        soft[overlap] = plain_soft_labels(teacher.wire, parts, teacher.active, producer)
    else:
        data.parts = parts
    return data
