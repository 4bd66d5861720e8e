"""Feature reconstruction by a passive party in EASTER: inverting what the global embedding reveals.

EASTER sends every party the global embedding E = (E_a + sum_k E_k) / C (VFedMH Eq. 7). Passive party k knows its
own E_k, so C * E - E_k is the sum of the *other* parties' embeddings; with C = 2 it is the active party's embedding
E_a itself, whatever the aggregation backend (masking hides a single share from the active party, never this sum
from the receivers of E). An attacker holding some samples of the active party's features (side knowledge,
`known_features`: public records, say) fits an inverse map from that sum back to the active party's features and
applies it to every other sample: a model inversion with an auxiliary set (He et al., "Model inversion attacks
against collaborative inference", ACSAC 2019, the auxiliary-data setting).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lvfl.attacks.base import Attack, PartyView
from lvfl.attacks.fitting import fit_full_batch
from lvfl.messages import GLOBAL_EMBEDDING

__all__ = ["EmbeddingInversion"]


class EmbeddingInversion(Attack):
    """Reconstruct the active party's features from C * E - E_k, with an inverse network fit on known samples.

    Each step it pairs the known samples of the batch (their C * E - E_k, their features) into the epoch's training
    set; at each epoch's first step it fits a one-hidden-layer network on the previous epoch's pairs (the map drifts
    as the encoders train), and reconstructs every batch of the epoch with it. The first epoch has no guess.

    Args:
        known_features: how many training samples of the active party's features the attacker holds (at least 1).
        hidden: the inverse network's hidden width.
        steps: full-batch Adam steps to fit it.
        lr: its learning rate.
        weight_decay: its L2 penalty.
        **kwargs: `Attack`'s (party, seed, name).

    Metric: `attack/embedding_inversion/mse`, the mean squared error per feature of the active party's (scaled)
    features, against `baseline_mse`: guessing the known samples' mean for every sample.
    """

    name: ClassVar[str] = "embedding_inversion"
    reads: ClassVar[tuple[str, ...]] = (GLOBAL_EMBEDDING,)
    metrics: ClassVar[tuple[str, ...]] = ("mse",)
    target: ClassVar[str] = "active_features"
    min_known_features: ClassVar[int] = 1
    needs_own_encoding: ClassVar[bool] = True

    def __init__(
        self,
        known_features: int = 100,
        hidden: int = 128,
        steps: int = 500,
        lr: float = 0.01,
        weight_decay: float = 1e-4,
        **kwargs: Any,
    ) -> None:
        if hidden < 1 or steps < 1 or not lr > 0 or weight_decay < 0:
            raise ValueError(
                f"EmbeddingInversion: hidden >= 1, steps >= 1, lr > 0 and weight_decay >= 0, got {hidden}, {steps}, "
                f"{lr}, {weight_decay}"
            )
        super().__init__(known_features=known_features, **kwargs)
        self.hidden, self.steps, self.lr, self.weight_decay = hidden, steps, float(lr), float(weight_decay)
        self._pairs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # this epoch's known samples: id -> (sum, x)
        self._inverse: nn.Module | None = None
        self._scale: tuple[torch.Tensor, torch.Tensor] | None = None
        self._epoch = -1

    def check_task(self, num_classes: int) -> None:
        """Any task: the target is the active party's features, not its labels."""

    @staticmethod
    def others_sum(view: PartyView) -> torch.Tensor | None:
        """C * E - E_k for the batch: the other parties' embeddings summed (E_a itself when C = 2), or None."""
        payloads = view.received(GLOBAL_EMBEDDING)
        received = [p for p in payloads if isinstance(p, torch.Tensor)]
        if payloads and not received:
            raise ValueError(
                "EmbeddingInversion inverts EASTER's global embedding E, one tensor; this protocol's "
                f"global_embedding is a {type(payloads[-1]).__name__} (C_VFL sends the other parties' embeddings one "
                "by one: no sum to invert)"
            )
        if not received or view.own_encoding is None or received[-1].shape != view.own_encoding.shape:
            return None
        return (view.num_parties * received[-1].float() - view.own_encoding.float()).reshape(len(view.ids), -1)

    def _fit(self) -> None:
        pairs = list(self._pairs.values())
        inputs = torch.stack([z for z, _ in pairs]).cpu()
        targets = torch.stack([x.reshape(-1) for _, x in pairs]).float().cpu()
        # one scale for every input dimension: a dimension nearly constant on the known samples (a unit the encoder
        # has switched off) must not be blown up when it moves on the others
        mean, std = inputs.mean(dim=0), inputs.std().clamp_min(1e-6) if inputs.numel() > 1 else torch.tensor(1.0)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng(devices=[]):  # the run's own random streams stay where they were
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
            inverse = nn.Sequential(
                nn.Linear(inputs.shape[1], self.hidden), nn.ReLU(), nn.Linear(self.hidden, targets.shape[1])
            )
        x = (inputs - mean) / std
        fit_full_batch(inverse, x, targets, F.mse_loss, self.steps, self.lr, self.weight_decay)
        self._inverse, self._scale = inverse.eval(), (mean, std)

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """This batch's reconstruction of the active party's features (None in the first epoch)."""
        if view.epoch != self._epoch:  # a new epoch: fit on the last one's pairs, start collecting afresh
            if self._pairs:
                self._fit()
            self._pairs, self._epoch = {}, view.epoch
        others = self.others_sum(view)
        if others is None:
            return None
        for position, sample in enumerate(view.ids.tolist()):
            if sample in view.known_features:
                self._pairs[sample] = (others[position].cpu(), view.known_features[sample])
        if self._inverse is None or self._scale is None:
            return None
        mean, std = self._scale
        shape = next(iter(view.known_features.values())).shape
        with torch.no_grad():
            return self._inverse((others.cpu() - mean) / std).reshape(len(view.ids), *shape)
