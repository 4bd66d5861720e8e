"""Student distillation: a model on the active party's features alone, for samples the passive parties do not hold.

A VFL model can only answer for samples every party holds. For the rest, the active party needs a model of its own;
training it on its own labels gives the Local model, training it also on the VFL model's soft labels for the
overlapping samples gives the *student* (non-overlapping inference paper, Sec. 4.2, Eq. 3, Algorithms 1-2).

Objective, per training sample i of the active party (overlapping or not), averaged over a batch of B samples:

    overlap i:      l_i = (1 - lam) * CE(y_i, f_s(x_i)) + lam * L_d(y~_i, f_s(x_i))
    active-only i:  l_i = CE(y_i, f_s(x_i))

with lam in [0, 1]. Convention: **lam weighs the distillation term** (lam = 0 is the Local model trained the same way,
lam = 1 learns the overlap from the teacher only). The paper's Algorithm 2 writes lam on the real-label term; this
follows the issue's convention instead, which is also how the paper's Fig. 10 reads ("lam is the weight of the loss
labelled by the VFL model").

- `L_d` is the soft-label cross-entropy on the student's softmax, `-sum_j y~_j log softmax(z)_j`. Its gradient in the
  logits is `softmax(z) - y~`, *linear in y~*, which is what lets the encrypted path compute it on ciphertexts.
- `y~` (the teacher's soft labels) is the VFL model's predicted class distribution for the sample: the mean over the
  teacher's predictions of their softmax. For EASTER that is every party model's prediction (the active party's is
  its private head's when the protocol keeps one); for SplitNN, C_VFL, PraVFed and Local the one prediction the
  active party computes; for Agg_VFL the aggregate A alone. Rule: an entry of `party_logits` whose key is no party's
  name is a joint prediction (Agg_VFL's "aggregate"); when there is one, the joint predictions alone are the teacher
  (the other entries are the parties' own-model diagnostics), otherwise every entry is.

Two paths give the same student for a linear student (up to fixed-point resolution):

- **plain**: `y~` reaches the active party in the clear and the whole student is trained by autograd on the objective
  above.
- **paillier** (Algorithms 1-2): see `PaillierDistillation`. The gradient of the distillation term reaches the
  student's *last linear layer* only; layers below it (if any) train on the plain real-label loss, the mean
  cross-entropy over the batch, because the active party cannot backpropagate through `y~` it never sees. For a
  linear / logistic student (`LogisticRegression`) the last layer is the whole model, and both paths train the same
  student.

Where `y~` comes from (`teacher_soft_label_parts`). The teacher's joint inference on the overlap runs as in any
prediction (`party_logits`: embeddings, masked shares, EASTER's global embedding, ...) and is metered on the
protocol's wire under `teacher/<tag>`, with one change: a prediction computed by a *passive* party (EASTER's passive
heads) is delivered to the *producer* (by default the first passive party, as in the paper's Stage two) instead of the
active party. Nothing the active party computes (its own model's or private head's prediction, a top model's output,
Agg_VFL's aggregate) is ever sent to a passive party. The soft labels are formed in two parts (`SoftLabelParts`):

    y~ = (S_p + S_a) / C     S_p: sum of the softmax of the predictions delivered to the producer
                             S_a: sum of the softmax of the predictions the active party computed
                             C:   the number of predictions (public: the protocol's structure)

- plain (`plain_soft_labels`): the producer sends S_p (float32, tag "soft_labels") to the active party, which adds S_a
  and divides by C;
- paillier (`PaillierDistillation.send_soft_labels`): the producer sends [[q(S_p)]] encrypted under the coordinator's
  key, the active party adds q(S_a) homomorphically ([[a]] * g^b = [[a + b]]) and folds the public 1/C into the
  decoding; it never holds `y~` in the clear.

When no passive party predicts (SplitNN, C_VFL, Agg_VFL, PraVFed, Local: the active party computes the whole
prediction) S_p is empty: the soft labels stay at the active party, no "soft_labels" message is sent, and under
paillier the active party encrypts its own `y~` (which it knows already: Paillier then hides nothing and costs time,
so `PaillierDistillation` warns). With `producer` set to the active party, passive predictions go to it as the
protocol delivers them and no "soft_labels" message is sent either.

What each party learns from the student path:

- every passive party: the protocol's own inference messages (e.g. EASTER's global embedding), which with a label
  mechanism are functions of the release (DESIGN.md, "Label privacy covers a passive party's whole view"); the
  producer, in addition, the other passive parties' predictions (in EASTER the heads' outputs on the global embedding
  it also receives). No prediction, aggregate or soft label the active party computes goes down; with Paillier the
  producer also receives the coordinator's public key. Tests check it by a counterfactual: a teacher whose active-side
  prediction reads the true labels, run with two different label vectors, leaves every passive inbox bit-identical.
- the active party: plain, `y~` and so S_p = C y~ - S_a, the sum of the passive parties' predictions (with one
  passive predictor, that party's prediction); paillier, ciphertexts only, plus its decrypted student gradients
  (Algorithm 2).
- the coordinator (paillier): uniformly masked gradient coordinates and the per-step loss sums (Algorithm 1).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
import torchmetrics
from torch import nn

from lvfl.crypto import paillier
from lvfl.inference.teacher import (
    Encryption,
    SoftLabelParts,
    StudentData,
    default_producer,
    plain_soft_labels,
    student_data,
    teacher_predictions,
    teacher_soft_label_parts,
    teacher_soft_labels,
)
from lvfl.models.base import PartyModelFactory
from lvfl.models.logistic import LogisticRegression
from lvfl.wire import Wire

__all__ = [
    "Encryption",
    "LogisticRegression",
    "PaillierDistillation",
    "SoftLabelParts",
    "StudentData",
    "StudentFit",
    "build_student",
    "check_lam",
    "default_producer",
    "distillation_loss",
    "evaluate_student",
    "fit_student",
    "plain_soft_labels",
    "student_data",
    "student_loss",
    "teacher_predictions",
    "teacher_soft_label_parts",
    "teacher_soft_labels",
]

#: probabilities are clamped here before the log in the encrypted loss (the exponent must be finite)
_LOG_EPS = 1e-12


# -- validation --------------------------------------------------------------------------------------------------
def check_lam(lam: float) -> float:
    """Return `lam` as a float if it is in [0, 1], else raise a ValueError naming the option."""
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= float(lam) <= 1.0:
        raise ValueError(f"lam must be in [0, 1] (the weight of the distillation term), got lam={lam!r}")
    return float(lam)


# -- the student models ------------------------------------------------------------------------------------------
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


# -- the objective (functional core) -----------------------------------------------------------------------------
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


# -- Paillier roles (Algorithms 1-2) -----------------------------------------------------------------------------
class PaillierDistillation:
    """The encrypted soft-label channel and the coordinator of Algorithms 1-2, on a protocol's `Wire`.

    Roles and messages (every cross-party move on `wire`):

    0. Setup (coordinator): a fresh Paillier key pair (g = n + 1, `key_size` bits); n goes to the active party and
       to the producer (tag "keys"). The secret key stays in this object, used only by the coordinator's methods.
    1. Soft labels (Stage two, step 1; `send_soft_labels`), from `SoftLabelParts` y~ = (S_p + S_a) / C. The
       producer encodes its part to fixed point, q(S_p) = round(S_p * 2**frac_bits), encrypts one value per
       ciphertext under n and sends [[q(S_p)]] to the active party (tag "soft_labels"): N_overlap x M ciphertexts
       of `2 * key_bytes` each. The active party adds its own part homomorphically, [[Q]] = [[q(S_p)]] *
       (1 + q(S_a) n) mod n**2 = [[q(S_p) + q(S_a)]] (phe's add_plain), so it never sees S_p nor y~ and nothing it
       computed leaves it; Q = C y~ 2**frac_bits, and the public 1/C is folded into every decoding below. When the
       producer holds no prediction (the active party computes the whole teacher), nothing is sent: the active
       party encrypts q(S_a) itself (a warning says that this hides nothing). No packing: the active party raises
       each ciphertext to a different plaintext power per gradient coordinate, and a packed ciphertext would scale
       all its slots by the same power (and signed slot sums would need offsets); values here are few.
    2. Active party, each step (Algorithm 2): with h_i the input of the student's last linear layer (bias as a
       constant 1), the distillation gradient's unknown part is `-lam / B * sum_{i in overlap} y~_ij h_ik`; it
       computes [[sum_i Q_ij q(h_ik)]] = prod_i [[Q_ij]]^q(h_ik) (a negative exponent through the ciphertext's
       inverse), with q(h) = round(h * 2**frac_bits), adds a uniform mask r in Z_n to each coordinate
       (`c * (1 + r n) mod n**2`) and sends them to the coordinator (tag "student_grad"). It also sends the batch's
       encrypted loss sum [[sum_i l_i]] (tag "student_loss"), formed the same way from `-log softmax` exponents
       plus the plaintext real-label part.
    3. Coordinator (Algorithm 1): decrypts and returns the masked gradient (tag "student_grad_decrypted"); decrypts
       the loss, sums it over the epoch and, at the epoch's end, sends `converged` (one byte, tag
       "student_converged") when the epoch-mean loss moved less than `tol` (per epoch rather than per step, so the
       stopping rule does not depend on batch order).
    4. Active party: subtracts r mod n, reads values above n/2 as negative, decodes at scale
       2**(2 * frac_bits) * C, multiplies by -lam / B and adds its plaintext part of the gradient. (The loss sum
       carries C times the plaintext part, so the coordinator decodes it at the same scale.)

    What each party learns: the producer, its own part S_p (the passive parties' predictions it received) and the
    public key; nothing the active party computed. The active party sees ciphertexts only (semantically secure
    without the secret key), its own part S_a and its own decrypted gradient, which it must learn to update the
    student; the coordinator sees uniformly masked gradient coordinates and the per-step loss sums (as in
    Algorithm 1). As for every coordinator-based HE scheme, a coordinator colluding with the active party could
    decrypt [[Q]]: stated, not defended.

    Args:
        wire: the protocol's wire.
        active: the active party's name.
        producer: the passive party that holds the passive parties' predictions and encrypts their sum.
        coordinator: the key holder's name.
        key_size: bits of n; at least 2048 (no override).
        frac_bits: fixed-point fractional bits of y~ and h (each term's resolution is 2**-frac_bits).
    """

    def __init__(
        self,
        wire: Wire,
        active: str,
        producer: str,
        coordinator: str = "coordinator",
        key_size: int = paillier.MIN_KEY_SIZE,
        frac_bits: int = 16,
    ) -> None:
        paillier.check_key_size(key_size)
        if isinstance(frac_bits, bool) or not isinstance(frac_bits, int) or not 1 <= frac_bits <= 30:
            raise ValueError(f"frac_bits must be an int in [1, 30], got {frac_bits!r}")
        if len({active, producer, coordinator}) != 3:
            raise ValueError(
                f"active={active!r}, producer={producer!r} and coordinator={coordinator!r} must be distinct parties"
            )
        self.wire, self.active, self.producer, self.coordinator = wire, active, producer, coordinator
        self.key_size, self.frac_bits = key_size, frac_bits
        self._secret: Any = None  # the coordinator's; never serialized
        self._n_at: dict[str, int] = {}
        self._loss_sum = 0.0
        self._prev_epoch_loss: float | None = None
        self.count = 1  # C, the number of predictions averaged in y~ (public); set by send_soft_labels

    # -- 0. setup -------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Generate the coordinator's key pair and send n to the active party and the producer (tag "keys")."""
        n, secret = paillier.generate_keypair(self.key_size)
        n_bytes = n.to_bytes(paillier.plaintext_nbytes(n), "big")
        for party in (self.active, self.producer):
            self._n_at[party] = int.from_bytes(self.wire.send(self.coordinator, party, n_bytes, tag="keys"), "big")
        self._secret = secret
        self._loss_sum, self._prev_epoch_loss, self.count = 0.0, None, 1

    def _n(self, party: str) -> int:
        if party not in self._n_at:
            raise RuntimeError("PaillierDistillation has no keys: call setup() first")
        return self._n_at[party]

    @property
    def ciphertext_nbytes(self) -> int:
        """Wire size of one ciphertext (an integer mod n**2 at fixed width)."""
        return paillier.ciphertext_nbytes(self._n(self.active))

    @property
    def plaintext_nbytes(self) -> int:
        """Wire size of one plaintext (an integer mod n at fixed width)."""
        return paillier.plaintext_nbytes(self._n(self.active))

    def encode(self, x: torch.Tensor) -> np.ndarray:
        """Fixed point: `round(x * 2**frac_bits)` as int64 (exact in float64 for the values used here)."""
        return torch.round(x.detach().double().cpu() * 2.0**self.frac_bits).to(torch.int64).numpy()

    # -- 1. producer -> active party ------------------------------------------------------------------------------
    def send_soft_labels(self, parts: SoftLabelParts) -> list[list[int]]:
        """Step 1: [[Q]] = [[q(S_p) + q(S_a)]] at the active party, one row of M ciphertexts per sample.

        The producer encrypts q(S_p) and sends it (tag "soft_labels"); the active party multiplies in g**q(S_a)
        (adds its own part as a plaintext). Without a producer part nothing is sent and the active party encrypts
        q(S_a). Sets the public count C = `parts.count`, by which every later decoding divides.
        """
        q_active = self.encode(parts.active)  # at the active party
        if (q_active < 0).any():
            raise ValueError("soft labels must be probabilities (non-negative)")
        n = self._n(self.active)
        if parts.num_producer:
            q_producer = self.encode(parts.producer)  # at the producer
            if (q_producer < 0).any():
                raise ValueError("soft labels must be probabilities (non-negative)")
            flat = paillier.encrypt(self._n(self.producer), [int(m) for m in q_producer.ravel()])
            width = self.ciphertext_nbytes
            received = self.wire.send(self.producer, self.active, paillier.to_bytes(flat, width), "soft_labels")
            # at the active party: [[a]] * g**b = [[a + b]]
            values = [
                paillier.add_plain(n, c, int(m))
                for c, m in zip(paillier.from_bytes(received, width), q_active.ravel(), strict=True)
            ]
        else:
            warnings.warn(
                "encryption='paillier' hides nothing here: no passive party contributes to this teacher's "
                "prediction (the active party computes it, as in SplitNN, C_VFL, Agg_VFL and PraVFed), so the active "
                "party already knows the soft labels; it encrypts them itself and the student trains as with 'plain'",
                UserWarning,
                stacklevel=2,
            )
            values = paillier.encrypt(n, [int(m) for m in q_active.ravel()])
        self.count = parts.count
        m = q_active.shape[1]
        return [values[i : i + m] for i in range(0, len(values), m)]

    # -- 2.-4. active party <-> coordinator -----------------------------------------------------------------------
    def _powers(self, rows: Sequence[Sequence[int]], exponents: np.ndarray) -> list[Any]:
        """[[sum_i y~_ij e_ik]] for every (j, k): prod_i c_ij^e_ik mod n**2, flattened j-major. exponents: (B_o, K)."""
        n = self._n(self.active)
        inverses = [[None] * len(row) for row in rows]  # c^-1 mod n**2, computed once per ciphertext
        out = []
        num_classes = len(rows[0]) if rows else 0
        for j in range(num_classes):
            for k in range(exponents.shape[1]):
                terms = []
                for i, row in enumerate(rows):
                    e = int(exponents[i, k])
                    if e == 0:
                        continue
                    if e < 0 and inverses[i][j] is None:
                        inverses[i][j] = paillier.inverse(n, row[j])
                    terms.append(paillier.power(n, row[j], e, inverse=inverses[i][j]))
                out.append(paillier.add(n, terms))
        return out

    def _mask_and_decrypt(self, ciphertexts: Sequence[Any], tag: str) -> list[int]:
        """Active: mask, send; coordinator: decrypt, send back; active: unmask. Returns signed plaintexts."""
        n = self._n(self.active)
        masked, masks = paillier.blind(n, ciphertexts)
        cw, pw = self.ciphertext_nbytes, self.plaintext_nbytes
        at_coordinator = self.wire.send(self.active, self.coordinator, paillier.to_bytes(masked, cw), tag)
        plain = [self._decrypt(c) for c in paillier.from_bytes(at_coordinator, cw)]
        back = self.wire.send(self.coordinator, self.active, paillier.to_bytes(plain, pw), f"{tag}_decrypted")
        return paillier.unblind(n, paillier.from_bytes(back, pw), masks)

    def _decrypt(self, ciphertext: int) -> int:
        if self._secret is None:
            raise RuntimeError("PaillierDistillation has no keys: call setup() first")
        return paillier.decrypt(self._secret, ciphertext)

    def distillation_gradient(self, rows: Sequence[Sequence[int]], h: torch.Tensor) -> torch.Tensor:
        """`sum_{i} y~_i h_i^T` (M x (K + 1), last column the bias) from [[Q]] rows and plaintext h (B_o x K).

        Computed homomorphically at the active party, masked, decrypted blind by the coordinator, unmasked, and
        decoded with the public 1/C (Q = C y~ 2**frac_bits).
        """
        ones = torch.ones(h.shape[0], 1, dtype=h.dtype, device=h.device)
        exponents = self.encode(torch.cat([h, ones], dim=1))
        values = self._mask_and_decrypt(self._powers(rows, exponents), "student_grad")
        scale = 2.0 ** (-2 * self.frac_bits) / self.count
        return torch.tensor(values, dtype=torch.float64).mul_(scale).reshape(len(rows[0]), exponents.shape[1])

    def report_loss(self, rows: Sequence[Sequence[int]], weighted_neg_log_p: torch.Tensor, plain_part: float) -> None:
        """Active: send [[C sum_i l_i]] = prod [[Q_ij]]^q(lam * -log p_ij) * g^q2(C plain_part); coordinator sums it.

        Q = C y~ 2**frac_bits, so the plaintext part is scaled by the public C too and the coordinator divides by C.
        """
        n = self._n(self.active)
        terms = []
        if rows:
            exponents = self.encode(weighted_neg_log_p)  # (B_o, M), all >= 0
            for row, exps in zip(rows, exponents, strict=True):
                terms += [paillier.power(n, c, int(e)) for c, e in zip(row, exps, strict=True)]
        plain_q = round(plain_part * self.count * 2.0 ** (2 * self.frac_bits))
        total = paillier.add_plain(n, paillier.add(n, terms), plain_q)  # + the plain part, homomorphically
        width = self.ciphertext_nbytes
        at_coordinator = self.wire.send(
            self.active, self.coordinator, paillier.to_bytes([total], width), "student_loss"
        )
        value = paillier.signed(self._decrypt(paillier.from_bytes(at_coordinator, width)[0]), n)
        self._loss_sum += value * 2.0 ** (-2 * self.frac_bits) / self.count

    def end_epoch(self, num_samples: int, tol: float | None) -> tuple[float, bool]:
        """Coordinator: the epoch-mean loss and whether it converged; sends the flag to the active party."""
        loss = self._loss_sum / max(num_samples, 1)
        converged = tol is not None and self._prev_epoch_loss is not None and abs(loss - self._prev_epoch_loss) < tol
        self._prev_epoch_loss, self._loss_sum = loss, 0.0
        flag = self.wire.send(self.coordinator, self.active, bytes([int(converged)]), "student_converged")
        return loss, bool(flag[0])


# -- training ----------------------------------------------------------------------------------------------------
@dataclass
class StudentFit:
    """The result of `fit_student`: the student and its epoch-mean training losses (as the coordinator saw them)."""

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
    paillier: PaillierDistillation | None = None,
    tol: float | None = None,
) -> StudentFit:
    """Train `model` (in place, on CPU) on `data` with the student objective; plain, or through `paillier`.

    Batches are drawn from all of the active party's samples in an order seeded by `seed`, so the plain and the
    encrypted path see the same batches. With `paillier`, the soft labels of the overlap reach the active party once
    as [[Q]] from `data.parts` (`PaillierDistillation.send_soft_labels`), and each step follows Algorithm 2. With
    `tol`, training stops after the first epoch whose mean loss moved less than `tol` (Algorithm 1's convergence
    check).

    Args:
        model: the student (for `paillier`, its last layer must be an `nn.Linear`, see `last_linear`).
        data: the active party's training view: soft labels in the clear (plain) or their parts (`paillier`).
        lam: weight of the distillation term, in [0, 1].
        epochs: passes over the data.
        batch_size: samples per step.
        optimizer: callable making the optimizer from the parameters; default Adam, lr 0.01.
        seed: seed of the batch order.
        paillier: the encrypted channel (already `setup`), or None for the plain path.
        tol: convergence threshold on the epoch-mean loss, or None to run every epoch.
    """
    lam = check_lam(lam)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    model = model.cpu().train()
    opt = optimizer(model.parameters()) if optimizer is not None else torch.optim.Adam(model.parameters(), lr=0.01)
    n = data.features.shape[0]
    generator = torch.Generator().manual_seed(seed)
    fit = StudentFit(model=model)

    rows_at_active: list[list[int]] = []
    cipher_row = torch.full((n,), -1, dtype=torch.long)
    layer: nn.Linear | None = None
    if paillier is not None:
        layer = last_linear(model)
        overlap_pos = torch.nonzero(data.overlap).flatten()
        cipher_row[overlap_pos] = torch.arange(overlap_pos.numel())
        if lam > 0 and overlap_pos.numel():
            if data.parts is None:
                raise ValueError(
                    "the encrypted path needs the soft labels' parts (StudentData.parts, e.g. from "
                    "student_data(..., encryption='paillier')): the active party must not hold y~ in the clear"
                )
            rows_at_active = paillier.send_soft_labels(data.parts)

    for epoch in range(epochs):
        total = 0.0
        for index in torch.randperm(n, generator=generator).split(batch_size):
            opt.zero_grad(set_to_none=True)
            x, y, o = data.features[index], data.labels[index], data.overlap[index]
            if paillier is None or layer is None:
                loss = student_loss(model(x), y, data.soft_labels[index], o, lam)
                loss.backward()
                total += float(loss.detach()) * len(index)
            else:
                _encrypted_step(model, layer, paillier, x, y, o, cipher_row[index], rows_at_active, lam)
            opt.step()
        if paillier is not None:
            mean, converged = paillier.end_epoch(n, tol)
        else:
            mean = total / n
            converged = tol is not None and bool(fit.losses) and abs(mean - fit.losses[-1]) < tol
        fit.losses.append(mean)
        if converged:
            fit.converged_epoch = epoch
            break
    return fit


def _encrypted_step(
    model: nn.Module,
    layer: nn.Linear,
    paillier: PaillierDistillation,
    x: torch.Tensor,
    y: torch.Tensor,
    overlap: torch.Tensor,
    cipher_rows: torch.Tensor,
    rows_at_active: list[list[int]],
    lam: float,
) -> None:
    """Set every parameter's `.grad` for one step of Algorithm 2 (the caller steps the optimizer).

    The distillation term `lam * (logsumexp(z) - y~ . z)` splits into a part the active party knows,
    `lam * logsumexp(z)`, and one linear in y~. The known parts (real-label CE and `lam * logsumexp`) go through
    autograd to the last layer; the y~ part comes back from the coordinator. Layers below the last one get the
    gradient of the plain real-label loss (mean cross-entropy over the batch) only.
    """
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0]))
    try:
        logits = model(x)
    finally:
        hook.remove()
    h = captured[0].detach()
    batch = x.shape[0]
    weight = overlap.to(logits.dtype) * lam
    ce = F.cross_entropy(logits, y, reduction="none")
    known = ((1.0 - weight) * ce + weight * torch.logsumexp(logits, -1)).mean()
    last = [layer.weight, layer.bias]
    lower = [p for p in model.parameters() if all(p is not q for q in last)]
    grad_w, grad_b = torch.autograd.grad(known, last, retain_graph=bool(lower))
    if lower:
        lower_grads = torch.autograd.grad(ce.mean(), lower, allow_unused=True)
        for p, g in zip(lower, lower_grads, strict=True):
            p.grad = g
    o_idx = torch.nonzero(overlap).flatten()
    rows = [rows_at_active[int(r)] for r in cipher_rows[o_idx]] if lam > 0 else []
    if rows:
        enc = paillier.distillation_gradient(rows, h[o_idx])  # sum_i y~_i [h_i, 1]^T, M x (K + 1)
        enc = enc.mul_(-lam / batch).to(grad_w.dtype)
        grad_w = grad_w + enc[:, :-1]
        grad_b = grad_b + enc[:, -1]
    layer.weight.grad, layer.bias.grad = grad_w, grad_b
    # Algorithm 2's [[Loss]]: the batch's loss sum, the soft-label part under encryption
    with torch.no_grad():
        neg_log_p = -logits.softmax(-1).clamp_min(_LOG_EPS).log()
        plain_part = float(((1.0 - weight) * ce).sum())
        paillier.report_loss(rows, lam * neg_log_p[o_idx] if rows else neg_log_p[:0], plain_part)


# -- evaluation --------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_student(model: nn.Module, features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict:
    """Accuracy (and AUROC for binary tasks, when both classes occur) of `model` on a set, via torchmetrics."""
    if features.shape[0] == 0:
        return {}
    model = model.cpu().eval()
    probs = model(features).softmax(-1)
    out = {"acc": float(torchmetrics.functional.accuracy(probs, labels, task="multiclass", num_classes=num_classes))}
    if num_classes == 2 and labels.unique().numel() == 2:
        out["auroc"] = float(torchmetrics.functional.auroc(probs[:, 1], labels, task="binary"))
    return out
