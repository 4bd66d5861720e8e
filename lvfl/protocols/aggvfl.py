"""Agg_VFL: every party trains a full model on its own features; the active party aggregates their logits.

Parties: one active party (features + labels) and K passive parties (features only), C = K + 1. Party k owns a
full model m_k = p_k . h_k (encoder + head, possibly a different architecture and optimizer per party) that maps its
own feature slice to logits; there is no trainable top model (the difference from split learning, EASTER Fig. 1b).
One training step, every cross-party move on the wire:

1. every party computes its logits L_k = m_k(x_k) locally;
2. passive parties send L_k to the active party (`tag="predictions"`): for `sum`/`mean` as shares of the
   configured aggregation backend, for `weighted` as plain float32 logits;
3. the active party forms the aggregate A and the loss LF(A, Y) (cross-entropy, VFedMH Eq. 8):
   `sum`: A = L_a + sum_k L_k; `mean`: A = (L_a + sum_k L_k) / C; `weighted`: A = sum_j w_j L_j with
   w = softmax(v), v a learned vector of C weight logits owned (and updated) by the active party;
4. the active party returns dLF/dL_k = c_k * dLF/dA to passive party k (`tag="gradients"`), with c_k = 1 (`sum`),
   1/C (`mean`) or w_k (`weighted`): for `sum`/`mean` one gradient serves every party and needs no individual
   logits, so it can be computed from the masked sum alone;
5. one backward pass over the surrogate LF(A, Y) + sum_k <L_k, dLF/dL_k> (as in EASTER, everything that crossed the
   wire is detached, so each term reaches only its own party's parameters), then every party's optimizer steps.

What each message reveals: under `DHMasking` a share is uniformly random in the ring (Z_2^32 by default) and the active
party learns only the sum of the logits (which is what `sum`/`mean` need); under `Plain` (and always for `weighted`,
since the active party cannot weight what it cannot see: masks cancel only in an unweighted sum) it learns every party's
logits. The returned gradient c_k * (softmax(A) - onehot(Y)) / B reveals the labels it was computed from (each row's
only negative entry is the label's), so it is computed against `labels_for(k)`, as in EASTER; under `weighted` it also
reveals w_k up to the unknown scale of dLF/dA.

With a `label_mechanism`, every loss whose gradient goes down is computed against the release Y' (`labels_for`),
and so are the active party's own model and the weights, because their outputs enter the aggregate A that every
returned gradient is computed from (trained on the true labels they would carry them into those gradients). The
active party's reported aggregate then uses a private copy m'_a of its own model, trained on the true labels:
A' = c_a m'_a(x_a) + sum_k c_k L_k with the passive part (and c) detached, so m'_a learns on top of what the
passive parties sent and nothing it computes leaves the active party.

Evaluation metrics (what `val|test/...` keys mean here):

- `acc/aggregate` (and `auroc/aggregate` for binary tasks): the aggregated prediction A, the model the federation
  deploys; `predict` returns its probabilities under `"aggregate"`.
- `acc/mean`: the aggregate's accuracy, not the mean of the parties' own-model accuracies. In the benchmark table
  `mean` answers "how good is the prediction this protocol delivers from all parties' features": EASTER's party
  models each read the global embedding (all parties' features), so their mean is a mean of all-feature
  predictors, and Agg_VFL's all-feature predictor is A. A party's own model sees one feature slice only (a
  Local-like number); averaging those would compare single-slice models with EASTER's all-feature ones. The
  papers' Agg_VFL figures (EASTER Tables II/IV: ~95% on MNIST where Local gets 25-39%) are aggregate-level too.
- `acc/<party>`: party k's own model alone, m_k(x_k), a diagnostic of what each party could predict by itself.
  Trained only through the aggregate, the own models learn complementary parts and score far below it alone
  (on digits after 4 epochs: 0.15-0.36 each, 0.76-0.86 aggregated).
  The active party can only score logits it sees, so these are logged when the backend reveals them (`Plain`) and
  left out under a masking backend, rather than sending in the clear what the backend exists to hide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from lvfl import messages
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.defenses.gradients import GradientDefense
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols.base import VFLModule
from lvfl.protocols.party_config import PartyConfig
from lvfl.protocols.task_metrics import make_metric, metric_names

AGGREGATE = "aggregate"
"""The metric and prediction key of the aggregated prediction (never a party name)."""

AGGREGATIONS = ("sum", "mean", "weighted")


class AggVFL(VFLModule):
    """Agg_VFL: C full party models whose logits the active party sums, averages or weights with learned weights.

    Args:
        parties: one `PartyConfig` per party (or one for all); each is a full model, encoder and head.
        aggregation: the backend that carries passive logits for `sum`/`mean` (`Plain` or a masking backend);
            `weighted` needs `Plain`.
        embedding_dim: the width of each party's internal embedding (it never leaves the party here).
        aggregate: how the active party combines the logits: `sum`, `mean` (default) or `weighted` (softmax of a
            learned weight vector owned by the active party and updated by its optimizer).
        label_mechanism: a label-DP mechanism: every party's model and the weights train against its release; a
            private copy of the active party's model, added to the detached passive logits, learns the true labels
            and gives the reported aggregate. None: true labels everywhere.

    Example:
        >>> from lvfl.datamodules import Digits
        >>> from lvfl.models import MLP
        >>> from lvfl.protocols.party_config import PartyConfig
        >>> dm = Digits(num_parties=4)
        >>> model = AggVFL(parties=[PartyConfig(model=MLP)], aggregate="weighted")
        >>> model.build(dm.party_specs, dm.task)
        >>> model.aggregation_weights().tolist()
        [0.25, 0.25, 0.25, 0.25]
    """

    passive_inbox = {**VFLModule.passive_inbox, "gradients": messages.PREDICTION_GRADIENT}

    def __init__(
        self,
        parties: list[PartyConfig],
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        aggregate: Literal["sum", "mean", "weighted"] = "mean",
        label_mechanism: LabelMechanism | None = None,
        gradient_defense: GradientDefense | None = None,
    ) -> None:
        if aggregate not in AGGREGATIONS:
            raise ValueError(f"model.aggregate must be one of {list(AGGREGATIONS)}, got aggregate={aggregate!r}")
        super().__init__(
            parties,
            aggregation=aggregation,
            embedding_dim=embedding_dim,
            label_mechanism=label_mechanism,
            gradient_defense=gradient_defense,
        )
        self.aggregate = aggregate
        self.weight_logits: nn.Parameter | None
        self.register_parameter("weight_logits", None)  # created by build() for `weighted` (C is known then)

    # ------------------------------------------------------------------------------------------------ building
    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Build the parties (base), the aggregate's metrics and, for `weighted`, the active party's weights."""
        names = [s.name for s in party_specs]
        if AGGREGATE in names:
            raise ValueError(f"a party may not be called {AGGREGATE!r}: it is the aggregated prediction's metric key")
        super().build(party_specs, task, rank=rank)
        for stage in ("val", "test"):
            for metric in metric_names(task):
                self.metrics[f"{stage}_{metric}_{AGGREGATE}"] = make_metric(task, metric)
        if self.aggregate == "weighted":
            self.weight_logits = nn.Parameter(torch.zeros(self.num_parties))  # uniform weights to start
        if self.protects_labels:
            spec = next(s for s in self.party_specs if s.is_active)
            self.private_head = self.build_party_model(spec, self._configs[self.active])

    @property
    def reveals_party_logits(self) -> bool:
        """Whether the active party receives each party's logits in the clear (so it can score them one by one)."""
        return self.aggregate == "weighted" or self.aggregation.reveals_shares

    @property
    def predicting_parties(self) -> list[str]:
        """Parties whose own model gets metrics: all of them when their logits are visible, none under masking."""
        return self.party_names if self.reveals_party_logits else []

    def party_parameters(self, party: str) -> list[nn.Parameter]:
        """A party's model; the active party also owns (and its optimizer updates) the aggregation weights."""
        params = super().party_parameters(party)
        if party == self.active and self.weight_logits is not None:
            params.append(self.weight_logits)
        return params

    def check_backend(self) -> None:
        """`weighted` needs every party's logits at the active party: a backend that reveals shares (`Plain`)."""
        if self.aggregate == "weighted":
            self.require_backend(
                "model.aggregate='weighted' cannot run with model.aggregation={backend}: "
                "the active party cannot weight parties whose logits it cannot see (masks cancel only in an "
                "unweighted sum); use model.aggregation=lvfl.privacy.Plain, or aggregate='sum' or 'mean'",
                reveals_shares=True,
            )

    def aggregation_weights(self) -> torch.Tensor:
        """c_k, each party's coefficient in the aggregate (`party_names` order): for `weighted`, softmax(v)."""
        if self.weight_logits is not None:
            return self.weight_logits.softmax(0)
        return torch.full((self.num_parties,), 1.0 / self.num_parties if self.aggregate == "mean" else 1.0)

    # ------------------------------------------------------------------------------------------------ the step
    def local_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Step 1: each party's full model on its own feature slice."""
        return {k: self.party_models[k](batch.features[k]) for k in self.party_names}

    def aggregate_logits(
        self, local: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor | float]]:
        """Steps 2-3: passive logits up the wire, aggregated at the active party.

        Returns:
            The aggregate A (its graph reaches the active party's own logits and the weights, nothing else); the
            logits the active party received in the clear (its own included; empty under a masking backend); and
            c_k = dA/dL_k for each party, which scales the gradient party k gets back.
        """
        if self.aggregate == "weighted":
            received = {
                k: (
                    local[k]
                    if k == self.active
                    else self.wire.send(k, self.active, self.outgoing(k, local[k]), "predictions")
                )
                for k in self.party_names
            }
            w = self.aggregation_weights()
            agg = sum(w[i] * received[k] for i, k in enumerate(self.party_names))
            return agg, received, {k: w[i].detach() for i, k in enumerate(self.party_names)}
        step = self.next_mask_step()  # a fresh mask stream per aggregation
        shares = {
            k: self.wire.send(
                k, self.active, self.protected(k, self.outgoing(k, local[k].detach()), step), "predictions"
            )
            for k in self.passive
        }
        total = self.combined(local[self.active], shares)
        received = {self.active: local[self.active], **shares} if self.reveals_party_logits else {}
        scale = 1.0 / self.num_parties if self.aggregate == "mean" else 1.0
        return total * scale, received, dict.fromkeys(self.party_names, scale)

    def private_aggregate(
        self, features: torch.Tensor, own: torch.Tensor, agg: torch.Tensor, coeff: Mapping[str, torch.Tensor | float]
    ) -> torch.Tensor:
        """A' = c_a m'_a(x_a) + (A - c_a L_a): the private model's logits with the passive part of A detached."""
        if self.private_head is None:
            raise RuntimeError("private_aggregate needs the private model, built when protects_labels")
        c_a = coeff[self.active]
        passive_part = (agg - c_a * own).detach()
        return c_a * self.private_head(features) + passive_part

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """One Agg_VFL step (steps 1-5 of the module docstring)."""
        optimizers = self.begin_step()
        local = self.local_logits(batch)  # step 1
        self.check_finite(local, "logits")
        agg, _, coeff = self.aggregate_logits(local)  # steps 2-3
        labels = {k: self.labels_for(k, batch) for k in self.party_names}
        losses = {k: self.task_loss(agg, labels[k]) for k in self.party_names}  # step 3 (Eq. 8 on A)
        surrogate = [losses[self.active]]  # reaches the active model (and the weights) through A
        grad_of_agg: dict[int, torch.Tensor] = {}  # one dLF/dA per distinct label tensor
        for k in self.passive:  # step 4
            key = id(labels[k])
            if key not in grad_of_agg:
                (grad_of_agg[key],) = torch.autograd.grad(losses[k], agg, retain_graph=True)
            surrogate.append(self.gradient_down(k, local[k], grad_of_agg[key] * coeff[k]))  # = dLF/dtheta_k
        if self.private_head is not None:  # true labels: reaches the private copy of the active model only
            own = batch.features[self.active]
            private_agg = self.private_aggregate(own, local[self.active], agg, coeff)
            private = self.task_loss(private_agg, self.private_labels(batch))
            surrogate.append(private)
            losses = {**losses, f"{self.active}/private_head": private.detach()}
        self.end_step(optimizers, surrogate)  # step 5
        self.record_train_losses(losses)

    # ------------------------------------------------------------------------------------------------ evaluation
    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """The aggregate under `"aggregate"`, plus each party's own logits where the active party sees them."""
        local = self.local_logits(batch)
        agg, received, coeff = self.aggregate_logits(local)
        if self.private_head is not None:
            agg = self.private_aggregate(batch.features[self.active], local[self.active], agg, coeff)
        return {**received, AGGREGATE: agg}

    def passive_contribution(self, party: str, features: torch.Tensor) -> torch.Tensor:
        """Party `party`'s logits on its own features (what it sends up)."""
        return self.party_models[party](features)

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The aggregate of the active party's logits and the fetched passive logits (sum, mean or weighted)."""
        own = self.party_models[self.active](active_features)
        if self.aggregate == "weighted":
            w = self.aggregation_weights()
            logits = {self.active: own, **{k: v.to(own) for k, v in contributions.items()}}
            agg = sum(w[i] * logits[k] for i, k in enumerate(self.party_names))
            coeff = {k: w[i] for i, k in enumerate(self.party_names)}
        else:
            scale = 1.0 / self.num_parties if self.aggregate == "mean" else 1.0
            agg = self.plain_sum(own, contributions, self.passive) * scale
            coeff = dict.fromkeys(self.party_names, scale)
        if self.private_head is not None:
            agg = self.private_aggregate(active_features, own, agg, coeff)
        return agg

    def describe_combination(self) -> dict[str, Any]:
        """The weighted sum of the parties' logits, each c_k stated (the active party's private model, if any)."""
        weights = self.aggregation_weights().detach().cpu().tolist()
        own = self.reported_head(f"party_models.{self.active}")
        return {
            "contribution": "L_k = m_k(x_k): passive party k's whole model (encoder and head) on its own features, "
            "its logits",
            "aggregate": self.aggregate,
            "combine": "logits = sum_j weights[j] * L_j over every party j, with L_a = m_a(x_a): the active "
            "party's model (model_a) on its own features",
            "weights": dict(zip(self.party_names, weights, strict=True)),
            "model_a": own,
        }

    def _log_aggregate_as_mean(self, stage: str) -> None:
        if not self.wire.holds(self.active):  # the metrics are the active party's (it holds the labels)
            return
        self._epoch_means = {}
        for metric in metric_names(self.task) if self.task is not None else ():
            key = f"{stage}_{metric}_{AGGREGATE}"
            if key in self.metrics:
                # compute() already synced the metric states across ranks; sync_dist only silences Lightning's hint
                value = self.metrics[key].compute()
                self._epoch_means[f"{stage}/{metric}/mean"] = float(value)
                self.log(f"{stage}/{metric}/mean", value, on_epoch=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        """`val/acc/mean` is the aggregate's accuracy (see the module docstring for why); the best-epoch byte."""
        self._log_aggregate_as_mean("val")
        self.share_best_epoch()

    def on_test_epoch_end(self) -> None:
        """`test/acc/mean` is the aggregate's accuracy (see the module docstring for why)."""
        self._log_aggregate_as_mean("test")
