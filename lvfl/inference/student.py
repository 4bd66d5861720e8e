"""Student distillation: a model on the active party's features alone, for samples the passive parties do not hold.

A VFL model can only answer for samples every party holds. For the rest, the active party needs a model of its own;
training it on its own labels gives the Local model, training it also on the VFL model's soft labels for the
overlapping samples gives the *student* (non-overlapping inference paper, Sec. 4.2, Eq. 3, Algorithms 1-2).

Objective, per training sample i of the active party (overlapping or not), averaged over a batch of B samples
(`lvfl.privacy.soft_labels.student_loss`):

    overlap i:      l_i = (1 - lam) * CE(y_i, f_s(x_i)) + lam * L_d(y~_i, f_s(x_i))
    active-only i:  l_i = CE(y_i, f_s(x_i))

with lam in [0, 1]. Convention: **lam weighs the distillation term** (lam = 0 is the Local model trained the same way,
lam = 1 learns the overlap from the teacher only). A regression (`data.regression`): CE becomes the squared error to
the standardized target and L_d the squared error to the teacher's predicted value y~
(`lvfl.privacy.soft_labels.regression_student_loss`); the student has one output, on the standardized scale. The
paper's Algorithm 2 writes lam on the real-label term; this follows the issue's convention instead, which is also how
the paper's Fig. 10 reads ("lam is the weight of the loss labelled by the VFL model").

The pieces, one module each:

- the teacher's soft labels y~ and the active party's training view (`lvfl.inference.teacher`): y~ is the VFL model's
  predicted class distribution (a regression: its predicted value), formed in two parts by the parties that hold
  them, y~ = (S_p + S_a) / C (the producer's sum of the passive parties' predictions, the active party's sum of its
  own, their public count);
- the soft-label channel (`lvfl.privacy.soft_labels`, chosen by config): `PlainSoftLabels` sends S_p in the clear
  and trains the whole student by autograd; `PaillierSoftLabels` (Algorithms 1-2) keeps y~ encrypted at the active
  party and trains the distillation term into the student's last linear layer only. For a linear student
  (`lvfl.models.LogisticRegression`) both train the same student, up to fixed-point resolution. Only the plain
  channel distils a regression (Paillier refuses it by name);
- this module: the training loop (`fit_student`), the same batches for every channel;
- the student's test figures (`lvfl.inference.evaluation`).

What each party learns from the whole student path (the privacy statement; per message in `lvfl.privacy.soft_labels`):

- every passive party: the protocol's own inference messages (e.g. EASTER's global embedding), which with a label
  mechanism are functions of the release (DESIGN.md, "Label privacy covers a passive party's whole view"); the
  producer, in addition, the other passive parties' predictions (in EASTER the heads' outputs on the global embedding
  it also receives). No prediction, aggregate or soft label the active party computes goes down; with Paillier the
  producer also receives the coordinator's public key. Tests check it by a counterfactual: a teacher whose active-side
  prediction reads the true labels, run with two different label vectors, leaves every passive inbox bit-identical.
- the active party: plain, `y~` and so S_p = C y~ - S_a, the sum of the passive parties' predictions (with one
  passive predictor, that party's prediction); Paillier, ciphertexts only, plus its decrypted student gradients
  (Algorithm 2).
- the coordinator (Paillier): uniformly masked gradient coordinates and the per-step loss sums (Algorithm 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lvfl.checks import check_int
from lvfl.inference.teacher import StudentData
from lvfl.models.base import PartyModelFactory
from lvfl.privacy.soft_labels import PlainSoftLabels, SoftLabelChannel, SoftLabelParts, check_lam

__all__ = ["StudentFit", "build_student", "fit_student"]


@dataclass
class StudentFit:
    """The result of `fit_student`: the student and its epoch-mean training losses (as the channel summed them)."""

    model: nn.Module
    losses: list[float] = field(default_factory=list)
    converged_epoch: int | None = None


def build_student(
    factory: PartyModelFactory, input_shape: tuple[int, ...], embedding_dim: int, num_classes: int, seed: int
) -> nn.Module:
    """The student, initialised from `seed` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(tuple(input_shape), embedding_dim, num_classes)


def fit_student(
    model: nn.Module,
    data: StudentData,
    lam: float,
    epochs: int = 20,
    batch_size: int = 64,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    seed: int = 0,
    channel: SoftLabelChannel | None = None,
    tol: float | None = None,
) -> StudentFit:
    """Train `model` (in place, on CPU) on `data` with the student objective, through a soft-label channel.

    Batches are drawn from all of the active party's samples in an order seeded by `seed`, so every channel sees the
    same batches. The soft labels of the overlap reach the active party once, `channel.send_soft_labels(data.parts)`
    (when `lam` uses them), and each step is `channel.backward`. With `tol`, training stops after the first epoch
    whose mean loss moved less than `tol` (Algorithm 1's convergence check). A regression (`data.regression`)
    trains the student's one output on the squared-error objective; a channel that cannot is refused by name before
    anything is sent.

    Args:
        model: the student (for `PaillierSoftLabels`, its last layer must be an `nn.Linear`).
        data: the active party's training view: the soft labels' parts before the channel (`data.parts`, from
            `student_data`), or y~ already at the active party in the clear (`data.soft_labels`, no channel).
        lam: weight of the distillation term, in [0, 1].
        epochs: passes over the data.
        batch_size: samples per step.
        optimizer: callable making the optimizer from the parameters; default Adam, lr 0.01.
        seed: seed of the batch order.
        channel: the channel that carries `data.parts` to the active party, already `setup` on the run's wire; None
            when `data.soft_labels` already holds y~ at the active party (then nothing is sent).
        tol: convergence threshold on the epoch-mean loss, or None to run every epoch.
    """
    lam = check_lam(lam)
    check_int(epochs, "epochs", 1)
    check_int(batch_size, "batch_size", 1)
    model = model.cpu().train()
    opt = optimizer(model.parameters()) if optimizer is not None else torch.optim.Adam(model.parameters(), lr=0.01)
    n = data.features.shape[0]
    generator = torch.Generator().manual_seed(seed)
    fit = StudentFit(model=model)
    overlap_pos = torch.nonzero(data.overlap).flatten()
    row_of = torch.full((n,), -1, dtype=torch.long)  # each sample's row in the soft labels sent; -1: active-only
    row_of[overlap_pos] = torch.arange(overlap_pos.numel())
    channel = _start(channel, model, data, uses_teacher=lam > 0 and overlap_pos.numel() > 0)

    for epoch in range(epochs):
        for index in torch.randperm(n, generator=generator).split(batch_size):
            opt.zero_grad(set_to_none=True)
            channel.backward(model, data.features[index], data.labels[index], row_of[index], lam)
            opt.step()
        mean, converged = channel.end_epoch(n, tol)
        fit.losses.append(mean)
        if converged:
            fit.converged_epoch = epoch
            break
    return fit


def _start(
    channel: SoftLabelChannel | None, model: nn.Module, data: StudentData, uses_teacher: bool
) -> SoftLabelChannel:
    """Start the fit on `channel` and send the overlap's soft labels through it if the objective uses them."""
    if channel is None:
        if data.parts is not None and uses_teacher:
            raise ValueError(
                "data.parts holds the soft labels before a channel: pass channel=... (e.g. lvfl.privacy."
                "PlainSoftLabels, set up on the run's wire) to send them to the active party"
            )
        # y~ already at the active party: its own part, C = 1, nothing to send
        soft = data.soft_labels[data.overlap]
        parts = SoftLabelParts(torch.zeros_like(soft), soft, num_producer=0, num_active=1)
        channel = PlainSoftLabels()
    else:
        if not isinstance(channel, SoftLabelChannel):
            raise TypeError(f"channel must be a lvfl.privacy.SoftLabelChannel, got {type(channel).__name__}")
        if data.parts is None and uses_teacher:
            raise ValueError(
                "a soft-label channel needs the soft labels' parts (StudentData.parts, from student_data(...)): the "
                "channel carries them to the active party, which must not start with y~ in the clear"
            )
        parts = data.parts
    channel.start_fit(model, regression=data.regression)
    if uses_teacher and parts is not None:
        channel.send_soft_labels(parts)
    return channel
