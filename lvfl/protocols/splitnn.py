"""SplitNN (Pyvertical, SplitVFL): bottom models at every party, one trainable top model at the active party.

Parties: one active party (features + labels + the top model) and K passive parties (features only), C = K + 1.
Each party k owns a bottom model h_k (its party model's encoder) and its own optimizer; the active party's
optimizer also updates the top model T (`TopModelProtocol` builds them). One training step (Romanini et al. 2021,
"PyVertical: a vertical federated learning framework for multi-headed SplitNN"; EASTER Fig. 1(a), Sec. V-A3),
every cross-party move on the wire:

1. every party computes E_k = h_k(x_k) locally;
2. passive parties send E_k to the active party: with `fusion="concat"` as raw float32 embeddings; with
   `fusion="sum"`/`"mean"` through the aggregation backend, so e.g. DHMasking sends only masked shares;
3. the active party fuses, Z = [E_a, E_1, ..., E_K] (concat) or Z = E_a + sum_k E_k (sum; mean uses Z / C),
   predicts T(Z) and computes the loss against its labels;
4. the active party sends dloss/dE_k back to each passive party k: the k-th slice of dloss/dZ (concat), or
   dloss/dZ itself, the same tensor for every party (sum/mean: under masking the active party only ever sees the
   sum, so it cannot tell the parties apart, which is exactly the protocol);
5. one backward pass over the surrogate loss + sum_k <E_k, dloss/dE_k> gives the top model and each bottom model
   exactly its own gradient of the loss, and every party's optimizer steps.

With a `label_mechanism` the loss of steps 3-4 is computed against the release Y' (`labels_for`): the gradients
sent down pass through the top model, so the top model and the active party's bottom model must learn from Y' too
(trained on the true labels they would carry them into every later gradient; measured before this rule, 50 of 51
steps' gradients changed with the true labels at a fixed release). The active party's reported predictions come
from a private top model (the top model's design) trained on the true labels over Z.detach(); nothing it computes
leaves the active party.

What each message reveals: a concatenated E_k is party k's embedding in the clear (this is why masking makes no sense
for `concat`: the active party must see each embedding in its own slot, and masks only cancel in a sum); under DHMasking
a sum/mean share is uniformly random in the ring (Z_2^32 by default) and only the sum is learned; dloss/dE_k depends on
the labels (gradient-based label inference on split learning applies: see `labels_for` and label mechanisms).

The top model's backward runs twice per step: once (`torch.autograd.grad`) to obtain dloss/dZ for the wire, and
once inside the single `manual_backward`, which keeps one backward per forward for DDP and AMP; the top model is
small, so this costs little. Only the active party's model predicts: evaluation reports the top model under the
active party's name (and as the mean, which is the same number). All parties share one training loss, logged as
`train/loss/<active>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import torch

from lvfl import messages
from lvfl.models.base import PartyModelFactory
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.defenses.embeddings import ReceivedEmbeddingDefense
from lvfl.privacy.defenses.gradients import GradientDefense
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols.party_config import PartyConfig
from lvfl.protocols.top_model import TopModelProtocol
from lvfl.wire import is_shadow

Fusion = Literal["concat", "sum", "mean"]


class SplitNN(TopModelProtocol):
    """Pyvertical split learning: party encoders as bottom models, a trainable top model at the active party.

    Args:
        parties: one `PartyConfig` per party (or one for all); only each model's `encoder` is used.
        top_model: the active party's top model factory, built as
            ``top_model((fused_dim,), top_hidden, num_classes)``; its whole forward (encoder then head) is the top
            model. fused_dim is ``C * embedding_dim`` for concat and ``embedding_dim`` for sum/mean.
        aggregation: backend for the sum/mean fusions (e.g. DHMasking); concat needs one that reveals shares
            (`Plain`).
        embedding_dim: the width of every bottom model's output.
        top_hidden: the width of the top model's encoder output (its ``embedding_dim``).
        fusion: how the active party combines the embeddings: ``concat`` (Pyvertical), ``sum`` or ``mean``.
        label_mechanism: a label-DP mechanism: the bottom and top models train against its release, so the
            gradients sent down are post-processing of it; a private top model on the detached fused input learns
            the true labels and makes the active party's predictions. None: everything uses the true labels.
        gradient_defense: what the active party does to each gradient it sends down (`lvfl.privacy.GaussianNoise`,
            ...), after it is computed.
        received_defense: the active party's layer and loss term on each passive party's received embedding, before
            the top model (`lvfl.privacy.MID`, `lvfl.privacy.DistanceCorrelation`; concat fusion): it shapes the
            gradients sent down at their source. Trained by the active party's optimizer; a private top model (with
            a label mechanism) sees the fused embeddings as they arrived.

    Example:
        >>> from functools import partial
        >>> from lvfl.datamodules import Digits
        >>> from lvfl.models import MLP
        >>> dm = Digits(num_parties=4)
        >>> model = SplitNN([PartyConfig(model=partial(MLP, hidden=[32]))], top_model=MLP, embedding_dim=8)
        >>> model.build(dm.party_specs, dm.task)
        >>> model.top.encoder[1].in_features  # 4 parties x 8
        32
    """

    passive_inbox = {**TopModelProtocol.passive_inbox, "gradients": messages.EMBEDDING_GRADIENT}

    def __init__(
        self,
        parties: list[PartyConfig],
        top_model: PartyModelFactory,
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        top_hidden: int = 64,
        fusion: Fusion = "concat",
        label_mechanism: LabelMechanism | None = None,
        gradient_defense: GradientDefense | None = None,
        received_defense: ReceivedEmbeddingDefense | None = None,
    ) -> None:
        super().__init__(
            parties,
            top_model,
            aggregation=aggregation,
            embedding_dim=embedding_dim,
            top_hidden=top_hidden,
            label_mechanism=label_mechanism,
            gradient_defense=gradient_defense,
        )
        if fusion not in get_args(Fusion):
            raise ValueError(f"model.fusion must be one of {list(get_args(Fusion))}, got fusion={fusion!r}")
        self.fusion: Fusion = fusion
        if received_defense is not None and fusion != "concat":
            raise ValueError(
                f"model.received_defense works on each passive party's slot of the fused embeddings (fusion: concat); "
                f"with fusion={fusion!r} the active party receives only their sum"
            )
        self.received_defense = received_defense

    # ------------------------------------------------------------------------------------------------ building
    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Build the models (base), then the received-embedding defense's per-party parts."""
        super().build(party_specs, task, rank=rank)
        if self.received_defense is not None:
            self.received_defense.build(list(self.passive), self.embedding_dim)

    def party_parameters(self, party: str) -> list[torch.nn.Parameter]:
        """The base's; the active party's optimizer also trains the received-embedding defense (MID's layers)."""
        params = super().party_parameters(party)
        if party == self.active and self.received_defense is not None:
            params += list(self.received_defense.parameters())
        return params

    def slots(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each party's slot of the concatenated Z, by party."""
        return dict(zip(self.party_names, z.split(self.embedding_dim, dim=1), strict=True))

    def defended(self, z: torch.Tensor) -> torch.Tensor:
        """Z with each passive party's slot through the received-embedding defense (at the active party)."""
        if self.received_defense is None or is_shadow(z):
            return z
        slots = self.slots(z)
        return torch.cat([slots[k] if k == self.active else self.received_defense(k, slots[k]) for k in slots], dim=1)

    def top_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The top model on the (defended) fused input: the loss that trains it and the bottom models."""
        return super().top_logits(self.defended(z))

    def predict_from_fused(self, z: torch.Tensor) -> torch.Tensor:
        """The base's; without a private top model, through the defense (the private one sees Z as it is)."""
        return super().predict_from_fused(z if self.private_head is not None else self.defended(z))

    # ------------------------------------------------------------------------------------------------ fusion
    @property
    def fused_dim(self) -> int:
        """The width of the top model's input: C embeddings side by side (concat), or one embedding (sum/mean)."""
        return super().fused_dim if self.fusion == "concat" else self.embedding_dim

    def fuse(self, embeddings: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Z from embeddings the active party holds in the clear: concatenated, or summed as `Plain` sums shares."""
        if self.fusion == "concat":
            return super().fuse(embeddings)
        return self.plain_sum(embeddings[self.active], embeddings, self.passive)

    def top_input(self, z: torch.Tensor) -> torch.Tensor:
        """The top model's input from the fused embeddings (the mean divides the sum by C here)."""
        return z / self.num_parties if self.fusion == "mean" else z

    def describe_combination(self) -> dict[str, Any]:
        """The fusion (concat, sum or mean) of the embeddings, then the active party's (private) top model."""
        if self.fusion == "concat":
            return super().describe_combination()
        z = "(E_a + sum_k E_k) / C, C = num_parties" if self.fusion == "mean" else "E_a + sum_k E_k"
        return {
            "contribution": "E_k = h_k(x_k): passive party k's bottom model (encoder) on its own features",
            "fusion": self.fusion,
            "combine": f"Z = {z}, with E_a = h_a(x_a) the active party's bottom model on its own features; "
            "logits = top_model(Z)",
            "num_parties": self.num_parties,
            "top_model": self.reported_head("top"),
        }

    def check_backend(self) -> None:
        """Refuse a protecting backend with concat fusion: masks cancel only in a sum, never in a concatenation."""
        if self.fusion == "concat":
            self.require_backend(
                "SplitNN with fusion='concat' cannot use aggregation={backend}: masking a "
                "concatenation makes no sense, since the active party must see each party's embedding in its own "
                "slot of the top model's input and masks only cancel in a sum. Use fusion: sum (or fusion: mean) "
                "with this backend, or aggregation: lvfl.privacy.Plain with concat",
                reveals_shares=True,
            )

    # ------------------------------------------------------------------------------------------------ the step
    def gather(self, local: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Steps 2-3 (fusion): the passive embeddings go up; returns Z at the active party, detached.

        Concat sends each passive embedding as it is (float32) and places it in its party's slot; sum/mean use the
        backend, so the active party receives protected shares and learns only E_a + sum_k E_k.
        """
        if self.fusion == "concat":
            received = {
                k: self.wire.send(k, self.active, self.outgoing(k, local[k]), "embeddings") for k in self.passive
            }
            return self.fuse({self.active: local[self.active].detach()} | received)
        return self.aggregate_embeddings(local)

    def embedding_gradients(self, grad_z: torch.Tensor) -> dict[str, torch.Tensor]:
        """dloss/dE_k for every party from dloss/dZ: its slot (concat) or dloss/dZ itself (sum/mean)."""
        if self.fusion == "concat":
            return dict(zip(self.party_names, grad_z.split(self.embedding_dim, dim=1), strict=True))
        return dict.fromkeys(self.party_names, grad_z)

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """One SplitNN step (steps 1-5 of the module docstring)."""
        optimizers = self.begin_step()
        local = self.local_embeddings(batch)  # step 1: each party's bottom model
        if self.fusion == "concat":  # sum/mean check inside aggregate_embeddings
            self.check_finite(local, "embedding")
        z = self.gather(local).requires_grad_(True)  # steps 2-3: a leaf at the active party
        logits = self.top_logits(z)
        labels = self.labels_for(self.active, batch)
        loss = self.task_loss(logits, labels)  # step 3 (the release, with a mechanism)
        if self.received_defense is not None and not is_shadow(z):  # its term shapes the gradients sent down
            received = {k: v for k, v in self.slots(z).items() if k != self.active}
            loss = loss + self.received_defense.penalty(received, labels, self.task.num_classes or 1)
        (grad_z,) = torch.autograd.grad(loss, z, retain_graph=True)
        grads = self.embedding_gradients(grad_z)
        surrogate = [loss]  # reaches the top model; each term below reaches only party k's bottom model
        surrogate.append((local[self.active] * grads[self.active]).sum())  # the active bottom model, locally
        for k in self.passive:  # step 4: d/dtheta_k equals dloss/dtheta_k
            surrogate.append(self.gradient_down(k, local[k], grads[k]))
        losses = {self.active: loss.detach()}
        self.check_finite(losses, "training loss", context=local)  # one joint loss: point at the embeddings
        if self.private_head is not None:  # true labels on the detached fused input: the private top model only
            private = self.private_top_loss(z, batch)
            surrogate.append(private)
            losses[f"{self.active}/private_head"] = private.detach()
        self.end_step(optimizers, surrogate)  # step 5
        self.record_train_losses(losses)
