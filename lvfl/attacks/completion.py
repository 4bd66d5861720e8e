"""Passive model completion: a passive party turns its own trained bottom model into a label classifier.

Fu et al. ("Label inference attacks against vertical federated learning", USENIX Security 2022, Sec. 4.1): whatever
the protocol sends, a passive party's encoder is trained to make the active party's task easy, so a small head fit
on its embeddings of a few samples of known label (the attacker's side knowledge, `known_labels`: 40 on digits in
the issue's setting) labels the rest. It reads no message: it applies to every protocol with a passive encoder,
SplitNN included, where no gradient row carries the label directly.

This is the supervised variant (a linear softmax head on the frozen encoder, fit on the known samples); the paper also
fine-tunes with MixMatch on unlabeled rows, which this does not.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from lvfl.attacks.base import Attack, PartyView
from lvfl.attacks.fitting import fit_full_batch

__all__ = ["PassiveModelCompletion"]


class PassiveModelCompletion(Attack):
    """Fit a linear head on the party's own encoder's embeddings of its known samples; guess every other label with it.

    The head is refit at the first step of each epoch on a frozen copy of the encoder as it is then (the party's
    model itself is never run or changed by the attack: its batch-norm statistics and dropout stream stay the
    protocol's), and guesses that epoch's batches through the same copy.

    Args:
        known_labels: the labelled samples the attacker holds (Fu et al.: 40 for a 10-class set), at least 1.
        steps: full-batch Adam steps to fit the head.
        lr: the head's learning rate.
        weight_decay: its L2 penalty (few samples, many embedding dimensions).
        inputs: ``"encoder"``, the party's trained encoder's embeddings (the attack), or ``"raw"``, its raw
            features with no model at all: the same head on what the party held before the federation, the reference
            that says how much of the attack's accuracy the training gave it (give it another `name`).
        **kwargs: `Attack`'s (party, seed, name).

    Metric: `attack/pmc/accuracy`, against guessing the most frequent class.
    """

    name: ClassVar[str] = "pmc"
    reads: ClassVar[tuple[str, ...]] = ()
    min_known_labels: ClassVar[int] = 1

    def __init__(
        self,
        known_labels: int = 40,
        steps: int = 300,
        lr: float = 0.05,
        weight_decay: float = 1e-3,
        inputs: Literal["encoder", "raw"] = "encoder",
        **kwargs: Any,
    ) -> None:
        if inputs not in ("encoder", "raw"):
            raise ValueError(f"PassiveModelCompletion: inputs must be 'encoder' or 'raw', got {inputs!r}")
        if steps < 1 or not lr > 0 or weight_decay < 0:
            raise ValueError(
                f"PassiveModelCompletion: steps >= 1, lr > 0 and weight_decay >= 0, got {steps}, {lr}, {weight_decay}"
            )
        super().__init__(known_labels=known_labels, **kwargs)
        self.steps, self.lr, self.weight_decay, self.inputs = int(steps), float(lr), float(weight_decay), inputs
        self._encoder: nn.Module | None = None
        self._head: nn.Linear | None = None
        self._scale: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fit_epoch = -1

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        if self._encoder is None:  # pragma: no cover - `_fit` sets it before any call
            raise RuntimeError("PassiveModelCompletion: no encoder copy yet")
        with torch.no_grad():
            return self._encoder(x).reshape(len(x), -1).float()

    def _fit(self, view: PartyView) -> None:
        if self.inputs == "raw":
            self._encoder = nn.Flatten()
        elif view.model is None or not hasattr(view.model, "encoder"):
            raise ValueError(f"PassiveModelCompletion needs {view.party}'s own model with an encoder")
        else:
            self._encoder = copy.deepcopy(view.model.encoder).cpu().eval()
        ids = torch.tensor(sorted(view.known_labels), dtype=torch.long)
        rows = torch.searchsorted(view.train_ids, ids)
        labels = torch.tensor([view.known_labels[int(i)] for i in ids], dtype=torch.long)
        z = self._embed(view.train_features[rows])
        mean, std = z.mean(dim=0), z.std(dim=0).clamp_min(1e-6) if len(z) > 1 else torch.ones(z.shape[1])
        self._scale = (mean, std)
        generator = torch.Generator().manual_seed(self.seed)
        head = nn.Linear(z.shape[1], view.num_classes)
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * 0.01)
            head.bias.zero_()
        inputs = (z - mean) / std
        self._head = fit_full_batch(head, inputs, labels, F.cross_entropy, self.steps, self.lr, self.weight_decay)

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """The head's logits on this batch's embeddings (refit at each epoch's first step)."""
        if self._head is None or view.epoch != self._fit_epoch:
            self._fit(view)
            self._fit_epoch = view.epoch
        head, scale = self._head, self._scale
        if head is None or scale is None:  # pragma: no cover - `_fit` sets both
            raise RuntimeError("PassiveModelCompletion: the head was not fit")
        mean, std = scale
        with torch.no_grad():
            return head((self._embed(view.features.cpu()) - mean) / std)
