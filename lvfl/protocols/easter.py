"""EASTER / VFedMH: every party trains its own heterogeneous model on the blinded, averaged embedding.

Parties: one active party (features + labels) and K passive parties (features only), C = K + 1. Each party k
owns a model split into an embedding network h_k (encoder) and a prediction network p_k (head), and its own
optimizer. One training step (VFedMH Algorithm 1), every cross-party move on the wire:

1. every party computes E_k = h_k(x_k) locally;
2. passive parties send protected shares [E_k] = E_k + r_k (Eq. 6; the r_k cancel in the sum, Eq. 5);
3. the active party forms the global embedding E = (E_a + sum_k [E_k]) / C (Eq. 7) and sends E to every party;
4. each party predicts R_k = p_k(E) and sends R_k to the active party;
5. the active party computes loss_k = LF(R_k, Y) (Eq. 8) and returns dloss_k/dR_k to party k;
6. each party updates its own parameters from its own loss (Eq. 3).

With a `label_mechanism`, Y in every loss that can reach a passive party is the release Y' drawn once for the run
(`VFLModule.labels_for`): the passive losses (step 5) *and the active party's own model* p_a . h_a, because h_a's
embedding E_a is part of the E that goes down (training h_a on true labels would put them into E: measured before
this rule, a passive party with side information read canary labels off E at 74-80% where epsilon = 1 bounds any
attack at 23%). The active party's reported predictions come from a private head q_a (the architecture of p_a)
trained on the true labels over E.detach(): its output and parameters never leave the active party, and its
gradient reaches no other parameter. So every message a passive party receives is a function of Y', the active
party's features and the passive parties' own messages.

What each message reveals: [E_k] alone is uniformly random in the ring (Z_2^32 by default) under DHMasking (only the sum
is learned); E is the average of all parties' embeddings, so a passive party learns C*E - E_k, the sum of the *other*
parties' embeddings (with C = 2 that is E_a itself; DHMasking hides single shares from the active party, never this sum
from the receivers of E). R_k is party k's prediction; dloss_k/dR_k reveals the label it was computed against: the true
label without a label mechanism (a passive party can read it off the gradient), the epsilon-label-DP release with one
(randomized response: cross-entropy on the released class; Laplace: PraVFed's MSE on the noisy one-hot row, see
`task_loss`). Party k's loss reaches only party k's parameters: the head sees E.detach() + (E_k - E_k.detach()) / C,
whose value is E and whose gradient flows only into h_k (E_k's 1/C share of the mean) and p_k
(`encoder_gradient="whole"` drops the 1/C: h_k then gets dL_k/dE itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from lvfl import messages
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.defenses.gradients import GradientDefense
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols.base import VFLModule
from lvfl.protocols.party_config import PartyConfig

#: how party k's loss gradient at E reaches its embedding network h_k (see `EASTER`)
ENCODER_GRADIENTS = ("mean_share", "whole")
#: when the parties exchange (see `EASTER`): every update, or once per `local_updates` updates (pipelined: half an
#: exchange riding with the next batch's)
SCHEDULES = ("sync", "local_updates", "pipelined")
#: sub-batches of a batch under ``schedule: local_updates`` when `local_updates` is not given
DEFAULT_LOCAL_UPDATES = 4


class EASTER(VFLModule):
    """EASTER / VFedMH: C heterogeneous party models trained in one run on the averaged global embedding.

    `parties`, `aggregation`, `embedding_dim`, `label_mechanism` and the other options are `VFLModule`'s.

    Args:
        encoder_gradient: what h_k receives of dL_k/dE. ``"mean_share"`` (default): its share through the mean of
            Eq. 7, (1/C) dL_k/dE, the chain rule of Eq. 3. ``"whole"``: dL_k/dE itself, as party k gets it when it
            backpropagates through its own network with the received E in place of its embedding layer's output
            (a reading of Algorithm 1's "local model"; it equals scaling h_k's learning rate by C). Only the
            encoders' update differs; every message is the same.
        schedule: when the parties exchange. ``"sync"`` (default): Algorithm 1, one exchange (four one-way trips: shares
            up, E down, R_k up, gradients down) per update. ``"local_updates"``: one exchange per batch and
            `local_updates` updates on it, after FedBCD (Liu et al., "FedBCD: A Communication-Efficient Collaborative
            Learning Framework for Distributed Features", IEEE TSP 2022): the batch's E and every party's dloss_k/dR_k
            cross once, then the batch is cut into `local_updates` consecutive sub-batches and each party updates on
            each in turn, recomputing its own E_k and R_k with its current parameters: its own part of E is brought up
            to date (E + (E_k now - E_k exchanged) / C), the other parties' parts are the exchanged ones, and a passive
            party trains on the exchanged (so stale) dloss_k/dR_k, as FedBCD-p's parties reuse the other parties' stale
            intermediate results with their own fresh ones. The first update is the synchronous one on its sub-batch;
            the j-th trains on a gradient j-1 updates old. With a batch `local_updates` times the synchronous one, an
            epoch has as many updates of as many samples, the same messages per sample (so what each reveals is
            unchanged), and a `local_updates`-th of the exchanges, each waiting on the network's latency four times.
            ``"pipelined"``: the same updates, with each exchange's second half (R_k up, dloss_k/dR_k down)
            travelling with the next batch's first half (shares up, E down), so that an exchange waits on the latency
            twice, in the spirit of one-step-stale pipelined VFL (PubSub-VFL; delayed-gradient VFL): step t sends
            batch t's shares and batch t-1's R_k up together, E_t and batch t-1's gradients down together, then
            runs batch t-1's updates; the epoch's last step finishes its own batch as well (four trips). Batch t's
            E is computed before batch t-1's updates, so in its updates the other parties' parts of E are
            `local_updates` updates staler than under ``local_updates``; each party's R_k and own part are as fresh.
            It needs a training loader of known length; a checkpoint taken inside an epoch does not hold the batch
            in flight (the epoch-end checkpoints hold everything).
        local_updates: updates per exchange under ``schedule: local_updates`` or ``pipelined`` (default 4; at
            least 2).
        delay_compensation: under ``local_updates`` or ``pipelined``, a passive party moves the exchanged (stale)
            dloss_k/dR_k to the R_k of each update before training on it, in the spirit of delay-compensated
            asynchronous SGD (Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML
            2017), here exact rather than a Taylor estimate: for cross-entropy against class indices the gradient is
            (softmax(R_k) - onehot(y)) / N, and for a regression's MSE 2 (R_k - y) / N, so the change from the R_k it
            sent to the one it now computes needs no label (`task_loss_gradient_shift`). Only the other parties'
            parts of E then stay stale. No message is added or changed in form; what a party computes from its own
            view reveals nothing more than the view. Refused with soft labels (a `LaplaceLabels` release), whose
            gradient mixes labels and logits. Default False (FedBCD-p's stale gradient, as published).
    """

    passive_inbox = {
        **VFLModule.passive_inbox,
        "global_embedding": messages.GLOBAL_EMBEDDING,
        "gradients": messages.PREDICTION_GRADIENT,
    }

    def __init__(
        self,
        parties: list[PartyConfig],
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        label_mechanism: LabelMechanism | None = None,
        gradient_defense: GradientDefense | None = None,
        encoder_gradient: Literal["mean_share", "whole"] = "mean_share",
        schedule: Literal["sync", "local_updates", "pipelined"] = "sync",
        local_updates: int | None = None,
        delay_compensation: bool = False,
    ) -> None:
        if encoder_gradient not in ENCODER_GRADIENTS:
            raise ValueError(
                f"model.encoder_gradient must be one of {list(ENCODER_GRADIENTS)}, got {encoder_gradient!r}"
            )
        if schedule not in SCHEDULES:
            raise ValueError(f"model.schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
        if schedule == "sync" and local_updates is not None:
            raise ValueError(
                f"model.local_updates={local_updates} applies to model.schedule: local_updates or pipelined only; the "
                "schedule is sync (one update per exchange)"
            )
        if local_updates is not None and not (isinstance(local_updates, int) and local_updates >= 2):
            raise ValueError(f"model.local_updates must be an integer >= 2, got {local_updates!r}")
        check_delay_compensation(delay_compensation, schedule, label_mechanism)
        super().__init__(
            parties,
            aggregation=aggregation,
            embedding_dim=embedding_dim,
            label_mechanism=label_mechanism,
            gradient_defense=gradient_defense,
        )
        self.encoder_gradient = encoder_gradient
        self.schedule = schedule
        self.local_updates = (local_updates or DEFAULT_LOCAL_UPDATES) if schedule != "sync" else 1
        self.delay_compensation = delay_compensation
        self._pipelined: tuple | None = None  # the pipelined schedule's batch in flight: (batch, its E_k, its E)

    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Build the parties (base); with a label mechanism, also the active party's private head (p_a's design)."""
        super().build(party_specs, task, rank=rank)
        if self.protects_labels:
            spec = next(s for s in self.party_specs if s.is_active)
            self.private_head = self.build_party_model(spec, self._configs[self.active]).head

    def global_embedding(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Steps 2-3: aggregate (Eq. 7) at the active party and send E back down; returns E as each party holds it."""
        e = self.aggregate_embeddings(local) / self.num_parties
        return {k: (e if k == self.active else self.wire.send(self.active, k, e, "global_embedding")) for k in local}

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """One EASTER step (Algorithm 1, lines 2-14); under ``schedule: local_updates``, `local_update_step`."""
        if self.schedule == "local_updates":
            self.local_update_step(batch)
            return
        if self.schedule == "pipelined":
            self.pipelined_step(batch, batch_idx)
            return
        optimizers = self.begin_step()
        local = self.local_embeddings(batch)  # step 1
        e_at = self.global_embedding(local)  # steps 2-3
        c = self.num_parties
        surrogate = []  # one backward pass; each term touches only its own party's parameters
        losses = {}
        for k in self.party_names:
            if not self.involves(k, self.active):  # another party's term, exchanged with the active party only
                continue
            own = local[k] - local[k].detach()  # value 0: carries h_k's gradient only
            head_in = e_at[k] + (own / c if self.encoder_gradient == "mean_share" else own)
            r_k = self.party_call(k, "head", head_in)  # step 4 (local prediction)
            if k == self.active:
                loss = self.task_loss(r_k, self.labels_for(k, batch))
                surrogate.append(loss)
            else:
                r_recv = self.wire.send(k, self.active, r_k, "predictions").requires_grad_(True)
                loss = self.task_loss(r_recv, self.labels_for(k, batch))  # step 5, Eq. 8, at the active party
                (grad,) = torch.autograd.grad(loss, r_recv)
                surrogate.append(self.gradient_down(k, r_k, grad))  # d/dtheta_k equals dloss_k/dtheta_k
            losses[k] = loss.detach()
        if self.private_head is not None and self.involves(self.active):  # true labels, detached E: the private head
            private = self.private_loss(e_at[self.active], batch)
            surrogate.append(private)
            losses[f"{self.active}/private_head"] = private.detach()
        self.end_step(optimizers, surrogate)  # step 6 (Eq. 3)
        self.record_train_losses(losses)

    def local_update_step(self, batch: VFLBatch) -> None:
        """One exchange over `batch`, then `local_updates` updates over its sub-batches (see `schedule`)."""
        with torch.no_grad():  # the exchange: nothing of it is differentiated, every update recomputes its own part
            local = self.local_embeddings(batch)  # step 1, the whole batch; each party keeps its own E_k
            e_at = self.global_embedding(local)  # steps 2-3
            received, losses, sent = self.predictions_and_gradients(batch, e_at)  # steps 4-5
        self.update_on(batch, local, e_at, received, losses, sent)

    def pipelined_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """The pipelined schedule's step (see `schedule`).

        This batch's first half-exchange travels with the previous batch's second, then the previous batch's
        `local_updates` updates run; the epoch's last step also finishes its own batch.
        """
        last = self.trainer.num_training_batches
        if not isinstance(last, int):
            raise ValueError("model.schedule: pipelined needs a training loader of known length (it finishes each "
                             "epoch's last batch in its last step)")  # fmt: skip
        held = self._pipelined if batch_idx > 0 else None  # an epoch starts with nothing pending
        with torch.no_grad():
            local = self.local_embeddings(batch)  # this batch's E_k, at the parameters before the updates below
            e = self.aggregate_embeddings(local) / self.num_parties  # its shares up, with ...
            replies = self.predictions_up(held[0], held[2]) if held is not None else {}  # ... the previous R_k
            e_at = {
                k: (e if k == self.active else self.wire.send(self.active, k, e, "global_embedding")) for k in local
            }  # E down, with the previous batch's gradients
            received, losses, sent = self.gradients_down(replies)
        self._pipelined = (batch, local, e_at)
        if held is not None:
            self.update_on(*held, received, losses, sent)
        if batch_idx == last - 1:  # the epoch's last batch: its second half-exchange and its updates now
            self._pipelined = None
            with torch.no_grad():
                received, losses, sent = self.predictions_and_gradients(batch, e_at)
            self.update_on(batch, local, e_at, received, losses, sent)

    def predictions_and_gradients(
        self, batch: VFLBatch, e_at: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
        """Steps 4-5 over the whole batch: each passive R_k up, its dloss_k/dR_k down; as `gradients_down`."""
        return self.gradients_down(self.predictions_up(batch, e_at))

    def predictions_up(self, batch: VFLBatch, e_at: dict[str, torch.Tensor]) -> dict[str, tuple]:
        """Step 4 and, at the active party, step 5: each passive party's R_k on E, sent up, and its loss gradient."""
        replies = {}
        for k in self.passive:
            if not self.involves(k, self.active):
                continue
            sent = self.party_call(k, "head", e_at[k])  # step 4, kept by party k (`delay_compensation`)
            r_k = self.wire.send(k, self.active, sent, "predictions")
            with torch.enable_grad():
                r_k.requires_grad_(True)
                loss = self.task_loss(r_k, self.labels_for(k, batch))  # step 5, Eq. 8, at the active party
                (grad,) = torch.autograd.grad(loss, r_k)
            replies[k] = (grad, loss.detach(), sent)
        return replies

    def gradients_down(
        self, replies: dict[str, tuple]
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
        """Each passive party's dloss_k/dR_k sent down; (what each received, the losses, the R_k each sent)."""
        received = {k: self.send_gradient(k, grad) for k, (grad, _, _) in replies.items()}
        return received, {k: loss for k, (_, loss, _) in replies.items()}, {k: r for k, (_, _, r) in replies.items()}

    def update_on(
        self,
        batch: VFLBatch,
        local: dict[str, torch.Tensor],
        e_at: dict[str, torch.Tensor],
        received: dict[str, torch.Tensor],
        losses: dict[str, Any],
        sent: dict[str, torch.Tensor],
    ) -> None:
        """`local_updates` updates over `batch`'s sub-batches, from its exchange and the R_k each passive party `sent`.

        The exchange is `local` (each E_k), `e_at` (E as each party holds it) and `received` (each dloss_k/dR_k).
        """
        c, size = self.num_parties, len(batch)
        for part in torch.arange(size).tensor_split(self.local_updates):
            if not len(part):
                continue
            start, stop = int(part[0]), int(part[-1]) + 1
            rows, scale = batch.rows(start, stop), size / (stop - start)  # the batch's mean loss -> the sub-batch's
            optimizers = self.begin_step()
            surrogate = []
            for k in self.party_names:
                if not self.wire.holds(k):  # another party's update: its own process's
                    continue
                embedding = self.party_call(k, "encoder", rows.features[k])  # E_k with k's current parameters
                moved = (embedding.detach() - local[k][start:stop]) / c  # its own part of E, brought up to date
                own = embedding - embedding.detach()  # value 0: carries h_k's gradient only
                grad_path = own / c if self.encoder_gradient == "mean_share" else own
                r_k = self.party_call(k, "head", e_at[k][start:stop] + moved + grad_path)
                if k == self.active:
                    loss = self.task_loss(r_k, self.labels_for(k, batch)[start:stop])
                    surrogate.append(loss)
                    losses[k] = losses.get(k, 0) + loss.detach() * (stop - start) / size  # the batch's mean
                else:  # the exchanged gradient: FedBCD-p's stale partial derivative for updates after the first
                    gradient = received[k][start:stop]
                    if self.delay_compensation:  # ... moved to this R_k; the labels cancel
                        gradient = gradient + self.task_loss_gradient_shift(r_k.detach(), sent[k][start:stop], size)
                    surrogate.append((r_k * gradient).sum() * scale)
            if self.private_head is not None and self.wire.holds(self.active):
                private = self.private_loss(e_at[self.active][start:stop], rows)
                surrogate.append(private)
                key = f"{self.active}/private_head"
                losses[key] = losses.get(key, 0) + private.detach() * (stop - start) / size
            self.end_step(optimizers, surrogate)  # step 6, once per sub-batch
        self.record_train_losses(losses)

    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Each party's model on the global embedding; passive predictions travel to the active party."""
        local = self.local_embeddings(batch)
        e_at = self.global_embedding(local)
        to = self.prediction_recipient  # the active party, or a teacher's producer
        out = {}
        for k in self.party_names:
            if k == self.active:
                out[k] = self.active_prediction(self.party_models[k].head, e_at[k])
            else:
                r_k = self.party_call(k, "head", e_at[k])
                out[k] = r_k if k == to else self.wire.send(k, to, r_k, "predictions")
        return out

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's head on E = (E_a + sum_k E_k) / C, its `party_logits` from fetched embeddings."""
        model = self.party_models[self.active]
        e = self.plain_sum(model.encoder(active_features), contributions, self.passive) / self.num_parties
        return self.active_prediction(model.head, e)

    def describe_combination(self) -> dict[str, Any]:
        """The mean embedding over the C parties, then the active party's (private) head."""
        return {
            "contribution": "E_k = h_k(x_k): passive party k's encoder on its own features (its embedding)",
            "combine": "E = (E_a + sum_k E_k) / C with E_a = h_a(x_a), the active party's encoder on its own "
            "features, and C = num_parties; logits = head(E)",
            "num_parties": self.num_parties,
            "head": self.reported_head(f"party_models.{self.active}.head"),
        }


def check_delay_compensation(on: bool, schedule: str, label_mechanism: LabelMechanism | None) -> None:
    """Refuse `delay_compensation` where it does not apply: off the local schedules, or with soft labels."""
    if not isinstance(on, bool):
        raise ValueError(f"model.delay_compensation must be true or false, got {on!r}")
    if not on:
        return
    if schedule == "sync":
        raise ValueError(
            "model.delay_compensation applies to model.schedule: local_updates or pipelined only; under sync every "
            "gradient is fresh"
        )
    if label_mechanism is not None and label_mechanism.release_shadow(1, 2).dtype.is_floating_point:
        raise ValueError(
            f"model.delay_compensation needs a loss whose gradient in R_k is a function of R_k minus one of the label "
            f"(cross-entropy against classes, a regression's MSE); {type(label_mechanism).__name__}'s soft labels are "
            "regressed on through the softmax, which mixes the two"
        )
