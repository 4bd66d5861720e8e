"""C-VFL: split learning with compressed embeddings and Q local iterations per communication round.

Castiglia, Das, Wang, Patterson, "Compressed-VFL: Communication-efficient learning with vertically partitioned
data", ICML 2023 (Algorithm 1). Parties: one active party (features + labels + the top, or "server", model
theta_0) and K passive parties (features only), C = K + 1. Every party k owns an embedding network h_k (the
encoder of its configured party model) and its own optimizer; the active party's optimizer also holds the top
model. The top model sees the concatenation [E_0, ..., E_K] of all embeddings in party order (`TopModelProtocol`
builds the models and fuses).

One communication round per mini-batch B, every cross-party move on the wire:

1. every party computes its embedding E_k = h_k(x_k^B) and compresses it, C(E_k) (top-k, then b-bit
   quantization: `lvfl.compression`);
2. each passive party sends C(E_k) to the active party (tag "embeddings");
3. the active party sends each passive party k what k needs to compute its own gradient locally:
   the compressed embeddings of every other party, {C(E_j) : j != k} (tag "global_embedding": the blocks of the
   concatenated global embedding other than k's own), the current top-model parameters theta_0 (tag "model",
   float32) and the mini-batch labels (tag "labels", see below);
4. Q local iterations on the same mini-batch, every party at once: party k recomputes only its own embedding
   h_k(x_k^B) with its current parameters and takes an optimizer step on
   loss(theta_0^k; [C(E_j) for j != k, with h_k(x_k^B) in slot k], y), where theta_0^k is the top model as k
   received it (passive parties: the frozen copy from step 3, evaluated with `torch.func.functional_call`, so
   their optimizer moves only their encoder) or the live top model (the active party, which updates its encoder
   and theta_0 together). The others' embeddings stay as they were at the start of the round (stale).

With `bits=32, topk=1, local_iterations=1` this is exactly split learning: every party's gradient is the gradient
of one loss, top(concat(E)), evaluated at the same parameters. `tests/test_top_model.py` checks it against
`SplitNN(fusion="concat")`: the same losses and parameters, bit for bit, and the same embeddings up the wire; only
the messages down differ (C-VFL's (C - 1) W(B) + 4 P + B bytes per passive party instead of SplitNN's gradient,
4 B d), from which each passive party computes exactly the gradient SplitNN would have sent it.

Labels: in C-VFL every party evaluates the loss locally, so it needs the labels. Here only the active party holds
them, so it sends each passive party the labels of the round's mini-batch (`labels_for(k, batch)`, as the smallest
integer type that holds num_classes - 1: uint8, 1 byte per sample, up to 256 classes).

With a `label_mechanism`, the labels sent down are the release Y', and the top model theta_0, whose parameters go
down every round, and the active party's encoder (whose embedding goes down) train against Y' as well: trained on
the true labels they would carry them to every passive party. The active party's reported predictions come from a
private top model (theta_0's design) trained on the true labels over its detached view of the concatenation.

What each message reveals: C(E_k) is party k's (lossy) embedding, in the clear, to the active party *and to every
other passive party* (step 3); theta_0 is the whole top model; the labels are the labels. There is no aggregation
to protect: `Plain` is the only backend that makes sense (masking hides a sum, and a concatenation is no sum).

Evaluation: the active party applies the top model to its own fresh embedding and the passive parties' embeddings
*compressed*, exactly as they would reach it at inference time (tag "embeddings"); metrics are reported under the
active party's name. Training losses are reported per party: each party's local loss at the first of its Q
iterations (the round's starting point; with Q = 1 the split-learning loss, seen through each party's view).

Each local iteration is one backward pass (Q per training step); Q > 1 has not been exercised under DDP.

Bytes per round (batch size B, embedding width d, K passive parties, W(B) the compressed size of one B x d
embedding, P the top model's parameter count): per passive party W(B) up, (C - 1) W(B) + 4 P + B down.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.func import functional_call

from lvfl import messages
from lvfl.checks import check_int
from lvfl.compression import CompressedTensor, Compressor
from lvfl.models.base import PartyModelFactory
from lvfl.parties import VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols.party_config import PartyConfig
from lvfl.protocols.top_model import TopModelProtocol


def label_dtype(num_classes: int) -> torch.dtype:
    """The smallest integer dtype that holds labels 0..num_classes-1 on the wire."""
    if num_classes <= 2**8:
        return torch.uint8
    if num_classes <= 2**15:
        return torch.int16
    return torch.int32


class CVFL(TopModelProtocol):
    """C-VFL: encoders at every party, a top model at the active party, compressed embeddings, Q local iterations.

    Args:
        parties: one `PartyConfig` per party (or one for all); only each model's encoder is used (bottom model).
        top_model: the top (server) model, built as `top_model((C * embedding_dim,), top_hidden, num_classes)` and
            run whole (its encoder and head); e.g. `lvfl.models.MLP`.
        aggregation: must be `Plain` (the default): the embeddings are concatenated, not summed.
        embedding_dim: the width d of every party's embedding.
        top_hidden: the width of the top model's inner representation (its `embedding_dim`).
        local_iterations: Q, the local iterations per communication round (Algorithm 1); 1 is split learning.
        compressor: what every embedding goes through before it crosses the wire (default: nothing).
        label_mechanism: a label-DP mechanism: the labels sent to passive parties for their local iterations are its
            release (drawn once per run), and the top model and the active encoder train against it; a private top
            model learns the true labels and makes the active party's predictions. None: true labels everywhere.
    """

    passive_inbox = {
        **TopModelProtocol.passive_inbox,
        "global_embedding": messages.GLOBAL_EMBEDDING,
        "model": messages.TOP_MODEL,
        "labels": messages.LABELS,
    }

    def __init__(
        self,
        parties: list[PartyConfig],
        top_model: PartyModelFactory,
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        top_hidden: int = 64,
        local_iterations: int = 1,
        compressor: Compressor | None = None,
        label_mechanism: LabelMechanism | None = None,
    ) -> None:
        super().__init__(
            parties,
            top_model,
            aggregation=aggregation,
            embedding_dim=embedding_dim,
            top_hidden=top_hidden,
            label_mechanism=label_mechanism,
        )
        self.local_iterations = check_int(local_iterations, "model.local_iterations", low=1)
        if compressor is None:
            compressor = Compressor()
        if not isinstance(compressor, Compressor):
            raise TypeError(f"model.compressor must be an lvfl.compression.Compressor, got {type(compressor).__name__}")
        self.compressor = compressor

    def check_backend(self) -> None:
        """Only a backend that reveals shares (`Plain`): the embeddings are concatenated, there is no sum to protect."""
        self.require_backend(
            "CVFL concatenates the parties' compressed embeddings and forwards them to every party, so the "
            "aggregation backend {backend} (which protects a sum) cannot apply; "
            "use model.aggregation=lvfl.privacy.Plain (the default)",
            reveals_shares=True,
        )

    # ------------------------------------------------------------------------------------------------ the steps
    def embeddings_up(self, local: Mapping[str, torch.Tensor]) -> dict[str, CompressedTensor]:
        """Steps 1-2: each passive party compresses its embedding and sends C(E_k) up; what the active party holds."""
        return {
            k: self.wire.send(k, self.active, self.compressor.compress(self.outgoing(k, local[k])), "embeddings")
            for k in self.passive
        }

    def top_snapshot(self) -> dict[str, torch.Tensor]:
        """The top model's parameters and buffers as the active party serializes them (a copy, not the live ones)."""
        top = self._top()
        state = dict(top.named_parameters())
        state.update(top.named_buffers())
        return {name: t.detach().clone() for name, t in state.items()}

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """One communication round (Algorithm 1): steps 1-3 once, then Q local iterations (step 4)."""
        active = self.active
        local = self.local_embeddings(batch)  # step 1
        self.check_finite(local, "embedding")
        # steps 1-2: C(E_k) up; the active party holds every party's compressed embedding (its own, to forward)
        held = {active: self.compressor.compress(local[active])} | self.embeddings_up(local)
        # step 3: what each party needs for its local gradient: others' embeddings, the top model, the labels
        others = {active: {j: held[j].decompress() for j in self.passive}}
        top_at: dict[str, dict[str, torch.Tensor]] = {}
        labels = {active: self.labels_for(active, batch)}
        dtype = label_dtype(self.task.num_classes)
        for k in self.passive:
            down = self.wire.send(active, k, {j: held[j] for j in self.party_names if j != k}, "global_embedding")
            others[k] = {j: c.decompress() for j, c in down.items()}
            top_at[k] = self.wire.send(active, k, self.top_snapshot(), "model")
            y = self.labels_for(k, batch)  # class indices, or float rows of a Laplace release (sent as they are)
            y = self.wire.send(active, k, y if y.is_floating_point() else y.to(dtype), "labels")
            labels[k] = y if y.is_floating_point() else y.long()

        losses: dict[str, torch.Tensor] = {}
        for q in range(self.local_iterations):  # step 4
            optimizers = self.begin_step()
            own = local if q == 0 else self.local_embeddings(batch)
            surrogate = []  # one backward pass; each party's loss touches only its own parameters
            for k in self.party_names:
                z = self.fuse(others[k] | {k: own[k]})  # party k's view: its fresh embedding, the others' as received
                logits = self.top_logits(z) if k == active else functional_call(self.top, top_at[k], (z,))
                loss = self.task_loss(logits, labels[k])
                surrogate.append(loss)
                if q == 0:
                    losses[k] = loss.detach()
            if self.private_head is not None:  # true labels on the active party's detached view: private top only
                private = self.private_top_loss(self.fuse(others[active] | {active: own[active]}), batch)
                surrogate.append(private)
                if q == 0:
                    losses[f"{active}/private_head"] = private.detach()
            self.end_step(optimizers, surrogate)
        self.record_train_losses(losses)

    # ------------------------------------------------------------------------------------------------ evaluation
    def gather(self, local: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Z at inference: the active party's fresh embedding, the others' compressed as they would reach it."""
        received = {k: c.decompress() for k, c in self.embeddings_up(local).items()}
        return self.fuse({self.active: local[self.active].detach()} | received)

    def passive_contribution(self, party: str, features: torch.Tensor) -> torch.Tensor:
        """Party `party`'s embedding as the active party receives it: compressed, then decompressed."""
        return self.compressor.compress(super().passive_contribution(party, features)).decompress()

    def describe_combination(self) -> dict[str, Any]:
        """Split learning's concatenation, of the passive embeddings as the compressor delivers them."""
        lossy = self.compressor.bits < 32 or self.compressor.topk < 1.0
        return super().describe_combination() | {
            "contribution": "C(E_k) decompressed: passive party k's bottom model E_k = h_k(x_k), top-k sparsified "
            "(fraction topk of the message's entries by magnitude) and quantized to `bits` bits (min-max over the "
            "whole message), as the active party reconstructs it",
            "compressor": {"bits": self.compressor.bits, "topk": self.compressor.topk},
            "batch_dependent": lossy,
        }
