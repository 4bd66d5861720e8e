"""The encrypted soft-label channel of Algorithms 1-2 (non-overlapping inference paper): `PaillierSoftLabels`.

The channel contract, the student objective and what every channel's messages reveal to whom (the whole view of each
party) are in `lvfl.privacy.soft_labels.channels`; this module holds the Paillier channel and its coordinator. The
Paillier arithmetic is `lvfl.crypto.paillier`'s, the fixed-point encoding `lvfl.crypto.fixedpoint`'s.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lvfl.checks import OptionError
from lvfl.crypto import fixedpoint, paillier
from lvfl.privacy.soft_labels.channels import LOG_EPS, SoftLabelChannel, SoftLabelParts, last_linear
from lvfl.schedule import Links
from lvfl.wire import Wire


class PaillierSoftLabels(SoftLabelChannel):
    """The encrypted soft-label channel and the coordinator of Algorithms 1-2, on the run's `Wire`.

    Roles and messages (every cross-party move on the wire):

    0. Setup (coordinator): a fresh Paillier key pair (g = n + 1, `key_size` bits); n goes to the active party and
       to the producer (tag "keys"). The secret key stays in this object, used only by the coordinator's methods.
    1. Soft labels (Stage two, step 1; `send_soft_labels`), from `SoftLabelParts` y~ = (S_p + S_a) / C. The
       producer encodes its part to fixed point, q(S_p) = round(S_p * 2**frac_bits), encrypts one value per
       ciphertext under n and sends [[q(S_p)]] to the active party (tag "soft_labels"): N_overlap x M ciphertexts
       of `2 * key_bytes` each. The active party adds its own part homomorphically, [[Q]] = [[q(S_p)]] *
       (1 + q(S_a) n) mod n**2 = [[q(S_p) + q(S_a)]], so it never sees S_p nor y~ and nothing it computed leaves
       it; Q = C y~ 2**frac_bits, and the public 1/C is folded into every decoding below. When the producer holds no
       prediction (the active party computes the whole teacher), nothing is sent: the active party encrypts q(S_a)
       itself (a warning says that this hides nothing). No packing: the active party raises each ciphertext to a
       different plaintext power per gradient coordinate, and a packed ciphertext would scale all its slots by the
       same power (and signed slot sums would need offsets); values here are few.
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

    The distillation gradient reaches the student's *last linear layer* only; layers below it (if any) train on the
    plain real-label loss (the mean cross-entropy over the batch), because the active party cannot backpropagate
    through y~ it never sees. For a linear student (`lvfl.models.LogisticRegression`) the last layer is the whole
    model, and this channel trains the same student as `PlainSoftLabels` (up to fixed-point resolution). It carries
    class probabilities only: a regression task is refused by name (`supports_regression` is False).

    What each party learns: the producer, its own part S_p (the passive parties' predictions it received) and the
    public key; nothing the active party computed. The active party sees ciphertexts only, its own part S_a and its
    own decrypted gradient; the coordinator sees uniformly masked gradient coordinates and the per-step loss sums.

    Args:
        key_size: bits of n; at least 2048 (no override).
        frac_bits: fixed-point fractional bits of y~, h and the loss exponents (each term's resolution is
            2**-frac_bits), by the rule every backend shares (`lvfl.crypto.fixedpoint.check_frac_bits`). Products of
            two encodings (2 * frac_bits bits) sit far below n / 2 for any accepted value; an encoding itself must
            fit an int64, which `fixedpoint.encode` checks.
        coordinator: the key holder's name (a party distinct from the active party and the producer).

    Example (config): ``channel: {class_path: lvfl.privacy.PaillierSoftLabels, init_args: {key_size: 3072}}``.
    """

    def __init__(
        self, key_size: int = paillier.MIN_KEY_SIZE, frac_bits: int = 16, coordinator: str = "coordinator"
    ) -> None:
        super().__init__()
        self.key_size = paillier.check_key_size(key_size, "PaillierSoftLabels(key_size=...)")
        self.frac_bits = fixedpoint.check_frac_bits(frac_bits, "PaillierSoftLabels(frac_bits=...)")
        if not isinstance(coordinator, str) or not coordinator:
            raise OptionError(f"PaillierSoftLabels(coordinator=...) must be a party name, got {coordinator!r}")
        self.coordinator = coordinator
        self._secret: Any = None  # the coordinator's; never serialized
        self._n_at: dict[str, int] = {}
        self._held: list[list[int]] = []  # [[Q]] at the active party, one row of M ciphertexts per overlapping sample
        self.count = 1  # C, the number of predictions averaged in y~ (public); set by send_soft_labels

    # -- 0. setup -------------------------------------------------------------------------------------------------
    def check_roles(self, active: str, producer: str) -> None:
        """The active party, the producer and the coordinator must be three distinct parties."""
        if len({active, producer, self.coordinator}) != 3:
            raise ValueError(
                f"active={active!r}, producer={producer!r} and coordinator={self.coordinator!r} must be distinct "
                "parties"
            )

    def links(self, active: str, producer: str) -> Links:
        """The coordinator's links (`lvfl.schedule`).

        Its key to the active party and the producer; the masked gradients and losses both ways with the active party.
        """
        c = self.coordinator
        return Links([(c, active), (c, producer), (active, c)])

    def setup(self, wire: Wire, active: str, producer: str) -> None:
        """Generate the coordinator's key pair and send n to the active party and the producer (tag "keys")."""
        super().setup(wire, active, producer)
        n, secret = paillier.generate_keypair(self.key_size)
        n_bytes = n.to_bytes(paillier.plaintext_nbytes(n), "big")
        self._n_at = {}
        for party in (active, producer):
            self._n_at[party] = int.from_bytes(wire.send(self.coordinator, party, n_bytes, tag="keys"), "big")
        self._secret = secret
        self._held, self.count = [], 1

    def start_fit(self, model: nn.Module, regression: bool = False) -> None:
        """Refuse a regression (by name) and a student whose output is not an `nn.Linear` with a bias (`last_linear`).

        A regression teacher's values would need their own encrypted gradient (and may be negative, which the
        encoding of probabilities here refuses): this channel carries class probabilities only.
        """
        self.check_task(regression)
        last_linear(model)
        super().start_fit(model, regression)

    def _n(self, party: str) -> int:
        if party not in self._n_at:
            raise RuntimeError("PaillierSoftLabels has no keys: call setup(wire, active, producer) first")
        return self._n_at[party]

    @property
    def ciphertext_nbytes(self) -> int:
        """Wire size of one ciphertext (an integer mod n**2 at fixed width)."""
        return paillier.ciphertext_nbytes(self._n(self.active))

    @property
    def plaintext_nbytes(self) -> int:
        """Wire size of one plaintext (an integer mod n at fixed width)."""
        return paillier.plaintext_nbytes(self._n(self.active))

    def encode(self, x: torch.Tensor, who: str = "PaillierSoftLabels") -> np.ndarray:
        """Fixed point: `round(x * 2**frac_bits)` as int64 (computed in float64; out-of-range values refused)."""
        return fixedpoint.encode(x.detach().double().cpu(), self.frac_bits, who=who).numpy()

    # -- 1. producer -> active party ------------------------------------------------------------------------------
    def send_soft_labels(self, parts: SoftLabelParts) -> list[list[int]]:
        """Step 1: [[Q]] = [[q(S_p) + q(S_a)]] at the active party, one row of M ciphertexts per sample.

        The producer encrypts q(S_p) and sends it (tag "soft_labels"); the active party multiplies in g**q(S_a)
        (adds its own part as a plaintext). Without a producer part nothing is sent and the active party encrypts
        q(S_a). Sets the public count C = `parts.count`, by which every later decoding divides.
        """
        # at the active party
        q_active = self.encode(parts.active, "PaillierSoftLabels: the active party's soft labels")
        if (q_active < 0).any():
            raise ValueError("soft labels must be probabilities (non-negative)")
        n = self._n(self.active)
        if parts.num_producer:
            # at the producer
            q_producer = self.encode(parts.producer, "PaillierSoftLabels: the producer's soft labels")
            if (q_producer < 0).any():
                raise ValueError("soft labels must be probabilities (non-negative)")
            flat = paillier.encrypt(self._n(self.producer), [int(m) for m in q_producer.ravel()])
            width = self.ciphertext_nbytes
            received = self._bound_wire().send(
                self.producer, self.active, paillier.to_bytes(flat, width), "soft_labels"
            )
            # at the active party: [[a]] * g**b = [[a + b]]
            values = [
                paillier.add_plain(n, c, int(m))
                for c, m in zip(paillier.from_bytes(received, width), q_active.ravel(), strict=True)
            ]
        else:
            warnings.warn(
                "PaillierSoftLabels hides nothing here: no passive party contributes to this teacher's prediction "
                "(the active party computes it, as in SplitNN, C_VFL, Agg_VFL and PraVFed), so the active party "
                "already knows the soft labels; it encrypts them itself and the student trains as with PlainSoftLabels",
                UserWarning,
                stacklevel=2,
            )
            values = paillier.encrypt(n, [int(m) for m in q_active.ravel()])
        self.count = parts.count
        m = q_active.shape[1]
        self._held = [values[i : i + m] for i in range(0, len(values), m)]
        return self._held

    # -- 2.-4. active party <-> coordinator -----------------------------------------------------------------------
    def backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, lam: float) -> None:
        """One step of Algorithm 2: every parameter's `.grad`, the y~ part of the last layer's through the coordinator.

        The distillation term `lam * (logsumexp(z) - y~ . z)` splits into a part the active party knows,
        `lam * logsumexp(z)`, and one linear in y~. The known parts (real-label CE and `lam * logsumexp`) go through
        autograd to the last layer; the y~ part comes back from the coordinator. Layers below the last one get the
        gradient of the plain real-label loss (mean cross-entropy over the batch) only.
        """
        layer = last_linear(model)
        captured: list[torch.Tensor] = []
        hook = layer.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0]))
        try:
            logits = model(x)
        finally:
            hook.remove()
        h = captured[0].detach()
        batch = x.shape[0]
        overlap = rows >= 0
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
        held = [self._held[int(r)] for r in rows[o_idx]] if lam > 0 else []
        if held:
            enc = self.distillation_gradient(held, h[o_idx])  # sum_i y~_i [h_i, 1]^T, M x (K + 1)
            enc = enc.mul_(-lam / batch).to(grad_w.dtype)
            grad_w = grad_w + enc[:, :-1]
            grad_b = grad_b + enc[:, -1]
        layer.weight.grad, layer.bias.grad = grad_w, grad_b
        # Algorithm 2's [[Loss]]: the batch's loss sum, the soft-label part under encryption
        with torch.no_grad():
            neg_log_p = -logits.softmax(-1).clamp_min(LOG_EPS).log()
            plain_part = float(((1.0 - weight) * ce).sum())
            self.report_loss(held, lam * neg_log_p[o_idx] if held else neg_log_p[:0], plain_part)

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
        wire = self._bound_wire()
        masked, masks = paillier.blind(n, ciphertexts)
        cw, pw = self.ciphertext_nbytes, self.plaintext_nbytes
        at_coordinator = wire.send(self.active, self.coordinator, paillier.to_bytes(masked, cw), tag)
        plain = [self._decrypt(c) for c in paillier.from_bytes(at_coordinator, cw)]
        back = wire.send(self.coordinator, self.active, paillier.to_bytes(plain, pw), f"{tag}_decrypted")
        return paillier.unblind(n, paillier.from_bytes(back, pw), masks)

    def _decrypt(self, ciphertext: int) -> int:
        if self._secret is None:
            raise RuntimeError("PaillierSoftLabels has no keys: call setup(wire, active, producer) first")
        return paillier.decrypt(self._secret, ciphertext)

    def distillation_gradient(self, rows: Sequence[Sequence[int]], h: torch.Tensor) -> torch.Tensor:
        """`sum_{i} y~_i h_i^T` (M x (K + 1), last column the bias) from [[Q]] rows and plaintext h (B_o x K).

        Computed homomorphically at the active party, masked, decrypted blind by the coordinator, unmasked, and
        decoded with the public 1/C (Q = C y~ 2**frac_bits).
        """
        ones = torch.ones(h.shape[0], 1, dtype=h.dtype, device=h.device)
        exponents = self.encode(torch.cat([h, ones], dim=1), "PaillierSoftLabels: the student's last-layer input")
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
            exponents = self.encode(weighted_neg_log_p, "PaillierSoftLabels: lam * -log p")  # (B_o, M), all >= 0
            for row, exps in zip(rows, exponents, strict=True):
                terms += [paillier.power(n, c, int(e)) for c, e in zip(row, exps, strict=True)]
        plain_q = round(plain_part * self.count * 2.0 ** (2 * self.frac_bits))
        total = paillier.add_plain(n, paillier.add(n, terms), plain_q)  # + the plain part, homomorphically
        width = self.ciphertext_nbytes
        at_coordinator = self._bound_wire().send(
            self.active, self.coordinator, paillier.to_bytes([total], width), "student_loss"
        )
        value = paillier.signed(self._decrypt(paillier.from_bytes(at_coordinator, width)[0]), n)
        self._loss_sum += value * 2.0 ** (-2 * self.frac_bits) / self.count

    def end_epoch(self, num_samples: int, tol: float | None) -> tuple[float, bool]:
        """Coordinator: the epoch-mean loss and whether it converged; sends the flag to the active party."""
        loss, converged = super().end_epoch(num_samples, tol)
        flag = self._bound_wire().send(self.coordinator, self.active, bytes([int(converged)]), "student_converged")
        return loss, bool(flag[0])
