"""EASTER / VFedMH: every party trains its own heterogeneous model on the blinded, averaged embedding.

Parties: one active party (features + labels) and K passive parties (features only), C = K + 1. Each party k
owns a model split into an embedding network h_k (encoder) and a prediction network p_k (head), and its own
optimizer. One training step (VFedMH Algorithm 1), every cross-party move on the wire:

1. every party computes E_k = h_k(x_k) locally;
2. passive parties send protected shares [E_k] = E_k + r_k (Eq. 6; the r_k cancel in the sum, Eq. 5);
3. the active party forms the global embedding E = (E_a + sum_k [E_k]) / C (Eq. 7) and sends E to every party;
4. each party predicts R_k = p_k(E) and sends R_k to the active party;
5. the active party computes loss_k = LF(R_k, Y) (Eq. 8) and returns dloss_k/dR_k to party k; with a
   `label_mechanism`, Y for a passive party is its protected label (drawn once for the run, see `VFLModule`);
6. each party updates its own parameters from its own loss (Eq. 3).

What each message reveals: [E_k] alone is uniformly random in Z_2^64 under DHMasking (only the sum is learned);
E is the average of all parties' embeddings; R_k is party k's prediction; dloss_k/dR_k reveals the label it was
computed against (see `labels_for`): the true label without a label mechanism (a passive party can read it off
the gradient), the epsilon-label-DP release with one (randomized response: cross-entropy on the released class;
Laplace: PraVFed's MSE on the noisy one-hot row, see `task_loss`). Party k's loss reaches only party k's
parameters: the head sees E.detach() + (E_k - E_k.detach()) / C, whose value is E and whose gradient flows only
into h_k (E_k's 1/C share of the mean) and p_k.
"""

from __future__ import annotations

import torch

from lvfl.parties import VFLBatch
from lvfl.protocols.base import VFLModule


class EASTER(VFLModule):
    """EASTER / VFedMH: C heterogeneous party models trained in one run on the averaged global embedding."""

    def local_embeddings(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Step 1: each party embeds its own feature slice."""
        return {k: self.party_models[k].encoder(batch.features[k]) for k in self.party_names}

    def global_embedding(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Steps 2-3: aggregate (Eq. 7) at the active party and send E back down; returns E as each party holds it."""
        e = self.aggregate_embeddings(local) / self.num_parties
        return {k: (e if k == self.active else self.wire.send(self.active, k, e, "global_embedding")) for k in local}

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """One EASTER step (Algorithm 1, lines 2-14)."""
        optimizers = self.party_optimizers()
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)

        local = self.local_embeddings(batch)  # step 1
        e_at = self.global_embedding(local)  # steps 2-3
        c = self.num_parties
        surrogate = []  # one backward pass; each term touches only its own party's parameters
        losses = {}
        for k in self.party_names:
            head_in = e_at[k] + (local[k] - local[k].detach()) / c
            r_k = self.party_models[k].head(head_in)  # step 4 (local prediction)
            if k == self.active:
                loss = self.task_loss(r_k, self.labels_for(k, batch))
                surrogate.append(loss)
            else:
                r_recv = self.wire.send(k, self.active, r_k, "predictions").requires_grad_(True)
                loss = self.task_loss(r_recv, self.labels_for(k, batch))  # step 5, Eq. 8, at the active party
                (grad,) = torch.autograd.grad(loss, r_recv)
                grad_at_k = self.wire.send(self.active, k, grad, "gradients")
                surrogate.append((r_k * grad_at_k).sum())  # d/dtheta_k equals dloss_k/dtheta_k
            losses[k] = loss.detach()
        self.manual_backward(torch.stack(surrogate).sum())
        for opt in optimizers.values():  # step 6 (Eq. 3)
            opt.step()
        self.record_train_losses(losses)

    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Each party's model on the global embedding; passive predictions travel to the active party."""
        local = self.local_embeddings(batch)
        e_at = self.global_embedding(local)
        out = {}
        for k in self.party_names:
            r_k = self.party_models[k].head(e_at[k])
            out[k] = r_k if k == self.active else self.wire.send(k, self.active, r_k, "predictions")
        return out

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's head on E = (E_a + sum_k E_k) / C, its `party_logits` from fetched embeddings."""
        model = self.party_models[self.active]
        e = self.plain_sum(model.encoder(active_features), contributions, self.passive) / self.num_parties
        return model.head(e)
