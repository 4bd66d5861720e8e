"""Gradient defenses: what the active party does to a gradient before it goes down to a passive party.

Why: the gradient a passive party receives carries the label (its prediction gradient's one negative component; a
cut-layer gradient's size and direction: `lvfl.attacks`). A defense is the sending party's option
(`model.gradient_defense`), applied in `VFLModule.gradient_down` where the active party is held, so the passive
party trains on, and can attack, only what was sent. It protects the labels against the receiving passive parties;
it does not protect anything from the active party, and it costs accuracy (the passive models learn from a noisier
or sparser signal): `benchmarks/paper/attacks.py` measures both sides.

Each works on per-sample rows: the sent gradient is of the batch's mean loss, so row i is (1/B) times sample i's own
loss gradient; clipping bounds and noise scales are stated for sample i's own row (the sent row times B).

- `GaussianNoise`: clip each sample's row to L2 norm `clip`, add N(0, (noise_multiplier * clip)^2) to each entry. One
  sample's label changes its row by at most 2 * clip in L2, so each release is a Gaussian mechanism on that label;
  `epsilon(releases, delta)` composes them by Renyi DP (Mironov 2017), a sample's row going down once per epoch.
- `LaplaceNoise`: clip each row to L1 norm `clip`, add Laplace(scale) to each entry: (2 * clip / scale)-DP per
  release, composed over releases by basic composition.
- `GradientSparsification`: keep each row's largest `keep` fraction of entries by magnitude, zero the rest (VFLAIR's
  GS). No DP claim: it removes detail, measured by the attacks.

Noise is drawn from OS randomness unless a `seed` is given (tests only): the config is public and must not fix it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from lvfl.privacy.labels.mechanisms import laplace_noise, os_seeded_generator

__all__ = ["GaussianNoise", "GradientDefense", "GradientSparsification", "LaplaceNoise"]


class GradientDefense(ABC):
    """The contract: `apply(grad)` -> what is sent instead, same shape and dtype; `epsilon` where DP holds."""

    name: ClassVar[str] = "defense"

    @abstractmethod
    def apply(self, grad: torch.Tensor) -> torch.Tensor:
        """The gradient to send for `grad` (batch, ...): row i belongs to sample i."""

    def epsilon(self, releases: int, delta: float = 1e-5) -> float | None:
        """Label-DP epsilon of `releases` releases of one sample's row at `delta`; None: no DP claim."""
        return None

    def apply_per_sample(self, values: torch.Tensor) -> torch.Tensor:
        """The defense on rows that are each one sample's own (an embedding a party sends), not a mean's gradient.

        `apply` treats its input as the gradient of a batch mean (row i is sample i's row over B); the same clip and
        noise on `values` itself: apply(values / B) * B.
        """
        batch = values.shape[0]
        return self.apply(values.detach() / batch) * batch

    @staticmethod
    def rows(grad: torch.Tensor) -> tuple[torch.Tensor, int]:
        """`grad` as one row per sample of its own loss (times the batch size B), and B."""
        batch = grad.shape[0]
        return grad.reshape(batch, -1) * batch, batch


def _check_positive(value: float, name: str, what: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{what}: {name} must be a positive number, got {value!r}")
    return float(value)


class _ClippedNoise(GradientDefense):
    """Clip each sample's own row to norm `clip` (of order `norm`), add `noise(shape)` to each entry, scale back."""

    norm: ClassVar[int] = 2

    def __init__(self, clip: float, seed: int | None) -> None:
        self.clip = _check_positive(clip, "clip", type(self).__name__)
        # a fixed seed, named where a public config must not hold one (`VFLModule.fixed_noise_seeds`); not `seed`, so
        # that the run fingerprint (which records the settings an object keeps under their own names) does not change
        self.fixed_seed = seed
        self.generator = os_seeded_generator(seed)

    @abstractmethod
    def noise(self, shape: torch.Size) -> torch.Tensor:
        """Noise of `shape` for the clipped rows, drawn from `self.generator` (CPU)."""

    def apply(self, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        rows, batch = self.rows(grad.detach().float())
        norms = rows.norm(p=self.norm, dim=1, keepdim=True).clamp_min(1e-12)
        clipped = rows * (self.clip / norms).clamp(max=1.0)
        noisy = clipped + self.noise(clipped.shape).to(clipped.device)
        return (noisy / batch).reshape(grad.shape).to(grad.dtype)


class GaussianNoise(_ClippedNoise):
    """Clip each sample's row to L2 norm `clip`, add Gaussian noise of std `noise_multiplier * clip` per entry.

    Args:
        noise_multiplier: sigma / clip; larger hides more.
        clip: the L2 bound on one sample's own loss-gradient row (a softmax cross-entropy row is at most sqrt(2)).
        seed: None (OS randomness, the default); an int only for tests.
    """

    name: ClassVar[str] = "gaussian"

    def __init__(self, noise_multiplier: float = 1.0, clip: float = 1.0, seed: int | None = None) -> None:
        self.noise_multiplier = _check_positive(noise_multiplier, "noise_multiplier", "GaussianNoise")
        super().__init__(clip, seed)

    def noise(self, shape: torch.Size) -> torch.Tensor:  # noqa: D102
        return torch.randn(shape, generator=self.generator) * (self.noise_multiplier * self.clip)

    def epsilon(self, releases: int, delta: float = 1e-5) -> float:
        """(epsilon, delta) over `releases` Gaussian releases of one sample's row, by Opacus's RDP accountant.

        A release adds N(0, (zC)^2) per entry to a row clipped to L2 norm C, whose change when one label changes is
        at most 2C: a Gaussian mechanism of noise multiplier z / 2 relative to that sensitivity, at sample rate 1
        (every epoch releases every sample's row once; no amplification by sampling is claimed). Opacus composes
        the releases in RDP and converts with Balle et al.'s bound (2020).
        """
        if releases < 1 or not 0 < delta < 1:
            raise ValueError(f"GaussianNoise.epsilon: releases >= 1 and 0 < delta < 1, got {releases}, {delta}")
        # imported here: opacus loads its whole package (per-sample gradient machinery) for its accountant
        from opacus.accountants import RDPAccountant

        accountant = RDPAccountant()
        for _ in range(releases):
            accountant.step(noise_multiplier=self.noise_multiplier / 2, sample_rate=1.0)
        return float(accountant.get_epsilon(delta))


class LaplaceNoise(_ClippedNoise):
    """Clip each sample's row to L1 norm `clip`, add Laplace noise of scale `scale` per entry.

    Args:
        scale: the Laplace scale b of each entry's noise (on one sample's own loss-gradient row).
        clip: the L1 bound on that row (a softmax cross-entropy row is at most 2).
        seed: None (OS randomness, the default); an int only for tests.
    """

    name: ClassVar[str] = "laplace"
    norm: ClassVar[int] = 1

    def __init__(self, scale: float = 1.0, clip: float = 2.0, seed: int | None = None) -> None:
        self.scale = _check_positive(scale, "scale", "LaplaceNoise")
        super().__init__(clip, seed)

    def noise(self, shape: torch.Size) -> torch.Tensor:  # noqa: D102
        # b * (E1 - E2), always finite: the inverse CDF of a uniform draw returned -inf when the draw hit 0 (one float32
        # draw in 2^24; a 1024 x 10 gradient a step met it within a few hundred steps and stopped the run)
        return laplace_noise(tuple(shape), self.scale, self.generator).float()

    def epsilon(self, releases: int, delta: float = 0.0) -> float:
        """Epsilon = releases * 2 * clip / scale: each release is a Laplace mechanism of L1 sensitivity 2 * clip."""
        if releases < 1:
            raise ValueError(f"LaplaceNoise.epsilon: releases must be >= 1, got {releases}")
        return releases * 2 * self.clip / self.scale


class GradientSparsification(GradientDefense):
    """Keep each row's largest `keep` fraction of entries by magnitude (at least one), zero the rest.

    Args:
        keep: the fraction of each row kept, in (0, 1].
    """

    name: ClassVar[str] = "sparsification"

    def __init__(self, keep: float = 0.1) -> None:
        if not (isinstance(keep, int | float) and 0 < keep <= 1):
            raise ValueError(f"GradientSparsification: keep must be in (0, 1], got {keep!r}")
        self.keep = float(keep)

    def apply(self, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        rows = grad.detach().reshape(grad.shape[0], -1)
        k = max(1, math.ceil(self.keep * rows.shape[1]))
        index = rows.abs().topk(k, dim=1).indices
        kept = torch.zeros_like(rows).scatter_(1, index, rows.gather(1, index))
        return kept.reshape(grad.shape)
