"""`TopModelProtocol`: split learning's shape, the base of SplitNN and C-VFL.

Parties: one active party (features + labels + the top model) and K passive parties (features only), C = K + 1.
Every party k owns a bottom model h_k, the encoder of its configured party model (the party model's head is
replaced by `nn.Identity`, so no parameter goes unused under DDP), and its own optimizer. The active party also
owns the top model T, built on the fused embeddings Z (`fused_dim` wide) and updated by the active party's
optimizer together with its bottom model. Only the active party predicts: T(Z), reported under its name.

What the protocols on this base share, and what they differ in:

- shared (here): building the bottom models, the top model and its private copy, the active party's optimizer
  holding the top model, fusing embeddings the active party holds in the clear (`fuse`: the concatenation in party
  order), the top model's input and prediction (`top_input`, `top_logits`, `predict_from_fused`), evaluation
  (`party_logits`) and ID-private inference (`complete_prediction`);
- per protocol: how the passive embeddings reach the active party (`gather`: raw, masked, compressed), the training
  step in its paper's order, and which backends make sense (`check_backend`).

The two are one algorithm at one setting: C-VFL with 32-bit embeddings, no sparsification and Q = 1 local
iteration is split learning with concat fusion. With the same seeds, data and models, their losses and parameters
are bit-identical step after step (`tests/test_top_model.py`); they differ only in the messages that go down
(SplitNN sends each passive party its gradient; C-VFL sends what that party needs to compute the same gradient).

Label privacy (`VFLModule`): with a label mechanism the top model and every bottom model train against the release
(`labels_for`), because the gradients or parameters sent down pass through the top model; the private top model
(`private_head`, the top model's design) learns the true labels on the *detached* fused input
(`private_top_loss`) and gives the active party's reported predictions (`predict_from_fused`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lvfl.checks import check_int
from lvfl.models.base import PartyModelFactory
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.defenses.gradients import GradientDefense
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols.base import VFLModule
from lvfl.protocols.party_config import PartyConfig


class TopModelProtocol(VFLModule):
    """Bottom models (party encoders) at every party, one trainable top model at the active party.

    A subclass defines `gather` (how the passive embeddings reach the active party, every move on the wire) and
    `training_step` (in its paper's order); it overrides `fused_dim`, `fuse` and `top_input` for a fusion other than
    the concatenation.

    Args:
        parties: one `PartyConfig` per party (or one for all); only each model's `encoder` is used (bottom model).
        top_model: the active party's top model factory, built as ``top_model((fused_dim,), top_hidden,
            num_classes)`` and run whole (its encoder, then its head); e.g. `lvfl.models.MLP`.
        aggregation: the aggregation backend (see each protocol's `check_backend`).
        embedding_dim: the width of every bottom model's output.
        top_hidden: the width of the top model's inner representation (its ``embedding_dim``).
        label_mechanism: a label-DP mechanism: the bottom and top models train against its release; a private top
            model on the detached fused input learns the true labels and makes the active party's predictions.
    """

    def __init__(
        self,
        parties: list[PartyConfig],
        top_model: PartyModelFactory,
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        top_hidden: int = 64,
        label_mechanism: LabelMechanism | None = None,
        gradient_defense: GradientDefense | None = None,
    ) -> None:
        super().__init__(
            parties,
            aggregation=aggregation,
            embedding_dim=embedding_dim,
            label_mechanism=label_mechanism,
            gradient_defense=gradient_defense,
        )
        self.top_model_factory = top_model  # not `top_model`: the run fingerprint reads init arguments kept by name
        self.top_hidden = check_int(top_hidden, "model.top_hidden", low=1)
        self.top: nn.Module | None = None

    # ------------------------------------------------------------------------------------------------ building
    @property
    def fused_dim(self) -> int:
        """The width of the top model's input: the C embeddings side by side."""
        return self.num_parties * self.embedding_dim

    def build_party_model(self, spec: PartySpec, config: PartyConfig) -> nn.Module:
        """Party `spec`'s model with its head replaced by `nn.Identity`: only the encoder is a bottom model.

        Dropping the head keeps every registered parameter in use, so DDP (without `find_unused_parameters`)
        does not stop on parameters that never receive a gradient.
        """
        model = super().build_party_model(spec, config)
        model.head = nn.Identity()
        return model

    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Build the bottom models (base), then the active party's top model (and private copy) on the fused input."""
        super().build(party_specs, task, rank=rank)
        self.top = self.top_model_factory((self.fused_dim,), self.top_hidden, task.num_outputs)
        if self.protects_labels:
            self.private_head = self.top_model_factory((self.fused_dim,), self.top_hidden, task.num_outputs)

    @property
    def predicting_parties(self) -> list[str]:
        """Only the active party predicts (with the top model)."""
        return [self.active]

    def party_parameters(self, party: str) -> list[nn.Parameter]:
        """A party's bottom model; the active party's optimizer also updates the top model (and the private head)."""
        params = super().party_parameters(party)
        if party == self.active:
            params += list(self._top().parameters())
        return params

    def _top(self) -> nn.Module:
        if self.top is None:
            raise RuntimeError("the top model is built by build()/setup(), before any step or optimizer")
        return self.top

    # ------------------------------------------------------------------------------------------------ the top model
    def fuse(self, embeddings: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Z from every party's embedding as the active party holds it: [E_0, ..., E_K], in party order."""
        return torch.cat([embeddings[k] for k in self.party_names], dim=1)

    def top_input(self, z: torch.Tensor) -> torch.Tensor:
        """The top model's input from the fused embeddings (Z itself; SplitNN's mean divides by C here)."""
        return z

    def top_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The top model on the fused input: the loss that trains it and the bottom models."""
        return self._top()(self.top_input(z))

    def predict_from_fused(self, z: torch.Tensor) -> torch.Tensor:
        """The active party's reported prediction: the private top model with a label mechanism, else the top model."""
        return self.active_prediction(self._top(), self.top_input(z))

    def private_top_loss(self, z: torch.Tensor, batch: VFLBatch) -> torch.Tensor:
        """The private top model's true-label loss on the detached fused input: it trains the private head only."""
        return self.private_loss(self.top_input(z), batch)

    # ------------------------------------------------------------------------------------------------ evaluation
    @abstractmethod
    def gather(self, local: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The passive embeddings go up the wire; returns Z as the active party holds it, detached."""

    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """The active party's prediction on Z as it gathers it (the top model, or its private copy)."""
        return {self.active: self.predict_from_fused(self.gather(self.local_embeddings(batch)))}

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """The prediction on Z fused from the active party's fresh embedding and the fetched passive ones."""
        own = self.party_models[self.active].encoder(active_features)
        fetched = {k: contributions[k].to(own) for k in self.passive}
        return self.predict_from_fused(self.fuse({self.active: own} | fetched))

    def describe_combination(self) -> dict[str, Any]:
        """The concatenation in party order, then the active party's (private) top model."""
        return {
            "contribution": "E_k = h_k(x_k): passive party k's bottom model (encoder) on its own features",
            "fusion": "concat",
            "combine": "Z = [E_j for j in fusion_order], concatenated along the feature axis, with the active "
            "party's own E_a = h_a(x_a) in its slot; logits = top_model(Z)",
            "fusion_order": list(self.party_names),
            "top_model": self.reported_head("top"),
        }
