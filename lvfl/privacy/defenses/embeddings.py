"""Defenses at the active party on the embeddings it receives: the gradient it sends back is shaped by them.

Why here and not on the gradient: where the active party's top model is trained (SplitNN), the gradient a passive
party gets is dloss/dE_k through the top model. A layer or a loss term on E_k at the active party changes that
gradient at its source, as part of training, rather than adding noise after it (`lvfl.privacy.defenses.gradients`).
Each protects the labels against the passive parties (what their gradients reveal), costs main-task accuracy, and
protects nothing from the active party. No DP claim: the attacks measure them
(`benchmarks/paper/attacks.py --defenses`).

- `MID` (Zou et al., "Mutual information regularization for vertical federated learning", arXiv 2301.01142; VFLAIR's
  active-party MID): a variational information bottleneck on each passive party's received embedding, before the
  top model: an encoder to (mu, sigma) of a `bottleneck`-wide Gaussian, a sample z = mu + sigma * eps, a decoder back
  to the embedding's width; its loss adds `lam` times KL(N(mu, sigma^2) || N(0, I)), the bound on the information the
  top model gets from E_k, and hence on what flows back into E_k's gradient. Trained with the top model by the
  active party's optimizer; noise is sampled at evaluation too, as in VFLAIR.
- `DistanceCorrelation` (dCor; Vepakomma et al., NoPeek 2019, as VFLAIR's active-party defense): adds `lam` times
  log dCor(E_k, onehot(y)) per passive party to the loss, so the top model's gradient pushes each passive embedding
  away from a (distance-)correlation with the labels.

`SplitNN(received_defense=...)` applies one to every passive party's slot of the fused embeddings (concat fusion),
with the labels the loss uses (the release under a label mechanism).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["MID", "DistanceCorrelation", "ReceivedEmbeddingDefense", "distance_correlation"]


def _check(value: float, name: str, what: str, low: float = 0.0, strict: bool = False) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and (value > low if strict else value >= low)):
        raise ValueError(f"{what}: {name} must be {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


class ReceivedEmbeddingDefense(nn.Module):
    """The active party's layer on each passive party's received embedding, and a loss term; trained with the top.

    `build(parties, width)` makes its per-party parts once the embedding width is known; `forward(party, e)` is what
    the top model gets in place of `e`; `penalty(received, labels)` is added to the loss (received: each passive
    party's embedding as it arrived, in this step; labels: class indices).
    """

    name: ClassVar[str] = "defense"

    def build(self, parties: list[str], width: int) -> None:
        """Make the per-party parts (none by default)."""

    def forward(self, party: str, embedding: torch.Tensor) -> torch.Tensor:
        """What the top model gets for `party`'s `embedding` (itself by default)."""
        return embedding

    @abstractmethod
    def penalty(self, received: Mapping[str, torch.Tensor], labels: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The loss term of this step."""


class MID(ReceivedEmbeddingDefense):
    """A variational information bottleneck per passive party (VFLAIR's active-party MID layer).

    Args:
        lam: the KL term's weight (VFLAIR sweeps 0 to 1e4; its code's default 1e-3).
        bottleneck: the Gaussian's width; None: the embedding's width (VFLAIR: the passive output's width).
        std_shift: sigma = softplus(raw - std_shift): a small initial sigma (VFLAIR: 5 for MNIST and CIFAR).
    """

    name: ClassVar[str] = "mid"

    def __init__(self, lam: float = 1e-3, bottleneck: int | None = None, std_shift: float = 5.0) -> None:
        super().__init__()
        self.lam = _check(lam, "lam", "MID")
        if bottleneck is not None and not (isinstance(bottleneck, int) and bottleneck >= 1):
            raise ValueError(f"MID: bottleneck must be a positive integer or None, got {bottleneck!r}")
        self.bottleneck, self.std_shift = bottleneck, _check(std_shift, "std_shift", "MID", low=-math.inf)
        self.encoders = nn.ModuleDict()
        self.decoders = nn.ModuleDict()
        self._kl: dict[str, torch.Tensor] = {}

    def build(self, parties: list[str], width: int) -> None:
        """Per party: encoder Linear(width, 2b) + ReLU, decoder Linear(b, 5b) + ReLU + Linear(5b, width) + ReLU."""
        b = self.bottleneck or width
        for party in parties:
            self.encoders[party] = nn.Sequential(nn.Linear(width, 2 * b), nn.ReLU())
            self.decoders[party] = nn.Sequential(nn.Linear(b, 5 * b), nn.ReLU(), nn.Linear(5 * b, width), nn.ReLU())

    def forward(self, party: str, embedding: torch.Tensor) -> torch.Tensor:
        """Decode a sample of the bottleneck; keep its KL to N(0, I) for `penalty`."""
        h = self.encoders[party](embedding.flatten(1))
        b = h.shape[1] // 2
        mu, sigma = h[:, :b], F.softplus(h[:, b:] - self.std_shift)
        z = mu + sigma * torch.randn_like(sigma)
        self._kl[party] = (0.5 * (mu.pow(2) + sigma.pow(2) - 1) - torch.log(sigma + 1e-12)).sum(dim=1).mean()
        return self.decoders[party](z).reshape(embedding.shape)

    def penalty(self, received: Mapping[str, torch.Tensor], labels: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The KL term: `lam` times the sum over passive parties of the batch's mean KL."""
        kl = [self._kl[k] for k in received if k in self._kl]
        self._kl = {}
        return self.lam * torch.stack(kl).sum() if kl else torch.zeros(())


def distance_correlation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sample distance correlation of rows of `x` and `y` (Szekely et al. 2007), differentiable; in [0, 1]."""

    def centred(m: torch.Tensor) -> torch.Tensor:
        d = torch.cdist(m, m)
        return d - d.mean(dim=0, keepdim=True) - d.mean(dim=1, keepdim=True) + d.mean()

    a, b = centred(x.flatten(1).float()), centred(y.flatten(1).float())
    dcov_xy, dvar_x, dvar_y = (a * b).mean(), (a * a).mean(), (b * b).mean()
    return (dcov_xy.clamp_min(0) / (dvar_x * dvar_y).sqrt().clamp_min(1e-12)).clamp_min(1e-12).sqrt()


class DistanceCorrelation(ReceivedEmbeddingDefense):
    """lam * log dCor(E_k, onehot(y)) per passive party, added to the active party's loss (VFLAIR's dCor).

    Args:
        lam: the term's weight (VFLAIR: 1e-4 in most configs; sweeps 1e-4 to 0.3).
    """

    name: ClassVar[str] = "dcor"

    def __init__(self, lam: float = 1e-4) -> None:
        super().__init__()
        self.lam = _check(lam, "lam", "DistanceCorrelation")

    def penalty(self, received: Mapping[str, torch.Tensor], labels: torch.Tensor, num_classes: int) -> torch.Tensor:
        """The dCor term: `lam` times the sum over passive parties of log dCor(E_k, onehot(y))."""
        target = F.one_hot(labels.long(), num_classes).float() if not labels.is_floating_point() else labels.float()
        terms = [torch.log(distance_correlation(e, target)) for e in received.values()]
        return self.lam * torch.stack(terms).sum() if terms else torch.zeros(())
