"""The two reference points every VFL method is read between: `Local` (lower bound) and `Central` (upper bound).

Both train ONE model at ONE site, the active party, with one optimizer, and put nothing on the wire, so that any
protocol's accuracy and bytes can be placed between "the active party alone" and "all features pooled" on the same
harness: the same datamodule (same seeded split, same per-party scaling), the same model class and optimizer as the
active party's entry of the matching EASTER config, the same metrics (`val/acc/<active>`, `test/acc/<active>` and
`test/acc/mean`, which equals it). EASTER Sec. V-A3 calls the lower bound "Standalone".

Both accept the multi-party datamodule of the EASTER runs unchanged (4 parties, no `participants` restriction), so
the split and the active party's slice are exactly those the EASTER runs use; the model is built from a reduced spec
list of one party named after the active party (see `SingleSite.build`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from lvfl.datamodules.split import SPLIT_TAG
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.protocols.base import VFLModule
from lvfl.protocols.party_config import PartyConfig

__all__ = ["Central", "Local", "SingleSite"]


class SingleSite(VFLModule):
    """One model at the active party, trained on what `site_features` gives it; nothing crosses the wire.

    `parties` is one `PartyConfig` (the active party's model and optimizer) or one entry per party of the
    datamodule, in which case only the active party's entry is used: the others describe models that a single-site
    baseline never builds. This lets a baseline config reuse an EASTER config's `parties` list verbatim.

    Args:
        parties: one entry, or one entry per party of the datamodule (the active party's entry is used).
        aggregation: must be None or `Plain`: with one site there are no shares to protect, and a masking or
            encryption backend configured here would silently do nothing, so it is refused.
        embedding_dim: width of the model's embedding (its encoder output), as in the matching EASTER config.
    """

    def __init__(
        self,
        parties: list[PartyConfig],
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
    ) -> None:
        super().__init__(parties=parties, aggregation=aggregation, embedding_dim=embedding_dim)
        self.feature_specs: list[PartySpec] = []
        self.check_backend()  # fail at instantiation, before any data is loaded

    # ------------------------------------------------------------------------------------------------ building
    def check_backend(self) -> None:
        """Refuse a protecting backend (anything but one that reveals shares, `Plain`): one site protects nothing."""
        self.require_backend(
            f"{type(self).__name__} trains one model at one site and sends nothing, so "
            "model.aggregation={backend} would protect nothing; leave it unset (Plain)",
            reveals_shares=True,
        )

    def setup_messages(self, datamodule: Any) -> list[tuple[str, str, Any, str]]:
        """The datamodule's set-up messages but the split's: one site trains no passive party's rows.

        (The PSI's messages stay: a single site still needs to know which samples every party holds.)
        """
        return [m for m in super().setup_messages(datamodule) if m[3] != SPLIT_TAG]

    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Build the single site's model from the active party's config and `site_spec`.

        The base `build` runs on a one-entry spec list (the site, named after the active party), so its checks,
        metrics and (empty) backend set-up apply unchanged and `party_names == [active]`; the full list is kept in
        `feature_specs` for the parties whose slices `Central` joins. `party_configs` is narrowed to the active
        party's entry for the same reason.
        """
        specs = list(party_specs)
        actives = [i for i, s in enumerate(specs) if s.is_active]
        if len(actives) != 1:
            raise ValueError(f"exactly one party must be active, got roles {[s.role for s in specs]}")
        (position,) = actives
        configs = self.party_configs
        if len(configs) not in (1, len(specs)):
            raise ValueError(
                f"model.parties has {len(configs)} entries but the datamodule has {len(specs)} parties "
                f"({[s.name for s in specs]}); give one entry (the active party's) or one per party"
            )
        self.party_configs = [configs[position] if len(configs) > 1 else configs[0]]
        self.feature_specs = specs
        super().build([self.site_spec(specs, specs[position])], task, rank=rank)

    @abstractmethod
    def site_spec(self, specs: list[PartySpec], active: PartySpec) -> PartySpec:
        """The spec the single model is built from (subclasses say which features it sees)."""

    @abstractmethod
    def site_features(self, batch: VFLBatch) -> torch.Tensor:
        """The input of the single model for `batch` (subclasses say which features it sees)."""

    # ------------------------------------------------------------------------------------------------ the step
    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Ordinary supervised training of the one model: forward, cross-entropy, one optimizer step."""
        optimizers = self.begin_step()
        logits = self.party_models[self.active](self.site_features(batch))
        loss = self.task_loss(logits, self.labels_for(self.active, batch))
        self.end_step(optimizers, [loss])
        self.record_train_losses({self.active: loss.detach()})

    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """The one model's prediction, reported under the active party's name (it is the only predictor)."""
        return {self.active: self.party_models[self.active](self.site_features(batch))}


class Local(SingleSite):
    """Standalone (EASTER Sec. V-A3): the active party trains its own model on its own feature slice, alone.

    The lower bound: what the active party reaches without any collaboration, so a VFL method is only worth its
    bytes where it beats this.

    Steps, each at the active party only:

    1. logits = p_a(h_a(x_a)) on the active party's slice x_a;
    2. loss = LF(logits, Y) with the active party's own labels;
    3. the active party's optimizer steps on its own parameters.

    Who holds what: the active party holds x_a, Y and its model; passive parties (if the datamodule has any) hold
    their slices and take no part: no model is built for them, their slices in the batch are never read. Messages:
    none, so the wire's ledger stays empty (0 bytes per step, per epoch, at set-up). Given the same seed, this is
    exactly EASTER with `participants: [0]` (E = E_a, no passive share), which the tests check parameter for
    parameter.

    Example:
        >>> from functools import partial
        >>> from lvfl.datamodules import Digits
        >>> from lvfl.models import MLP
        >>> dm = Digits(num_parties=4)
        >>> local = Local(parties=[PartyConfig(model=partial(MLP, hidden=[16]))], embedding_dim=8)
        >>> local.build(dm.party_specs, dm.task)
        >>> local.party_names, local.party_models["party0"].input_shape
        (['party0'], (1, 8, 2))
    """

    def site_spec(self, specs: list[PartySpec], active: PartySpec) -> PartySpec:
        """The active party's own spec: its model sees its own slice only."""
        return active

    def site_features(self, batch: VFLBatch) -> torch.Tensor:
        """The active party's own slice (the only slice it can read)."""
        return batch.features[self.active]

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's own model on its own features (there are no passive contributions)."""
        return self.party_models[self.active](active_features)

    def describe_combination(self) -> dict[str, Any]:
        """No combination: the active party's model alone."""
        return {"contribution": None, "combine": "logits = m_a(x_a): the active party's own model on its own features"}


class Central(SingleSite):
    """Centralised training (the upper bound): every party's slice pooled at one site, in one model.

    The NON-PRIVATE reference: pooling raw features at one site is exactly what VFL exists to avoid, so this is not a
    protocol anyone would deploy, only the accuracy a VFL method could at best approach. It reads every party's slice
    directly; lvfl does not meter the hypothetical upload of raw data (it is not part of any protocol), so the
    ledger stays empty.

    Steps, at the one site (named after the active party, which holds the labels):

    1. x = concat_k x_k along the partition axis (the last: width for image strips, columns for tabular data), in
       the datamodule's party order;
    2. logits = p(h(x)); loss = LF(logits, Y);
    3. one optimizer steps on the one model.

    The join reassembles the original feature layout up to column order: with the default `ContiguousColumns` /
    `ImageStrips` partitioners it is the original column order exactly (the whole 8x8 digit); with `ShuffledColumns`
    or `ExplicitColumns` it is the concatenation of the parties' column lists (a fixed permutation, which an MLP's
    function class does not care about). Scaling stays per party as the datamodule did it: tabular columns are
    standardized one by one (identical to standardizing the whole table), image strips each with their own training
    mean and standard deviation. With a `participants` restriction only the participating slices are joined.

    The model is the active party's entry of `parties` (its class, hyperparameters and optimizer) built for the
    joined input shape.

    Example:
        >>> from functools import partial
        >>> from lvfl.datamodules import Digits
        >>> from lvfl.models import MLP
        >>> dm = Digits(num_parties=4)
        >>> central = Central(parties=[PartyConfig(model=partial(MLP, hidden=[16]))], embedding_dim=8)
        >>> central.build(dm.party_specs, dm.task)
        >>> central.party_names, central.party_models["party0"].input_shape
        (['party0'], (1, 8, 8))
    """

    def site_spec(self, specs: list[PartySpec], active: PartySpec) -> PartySpec:
        """The active party's spec with every party's slice joined along the last axis."""
        lead = {tuple(s.input_shape[:-1]) for s in specs}
        if len(lead) != 1:
            shapes = {s.name: tuple(s.input_shape) for s in specs}
            raise ValueError(
                f"Central joins the parties' slices along the last axis, so every other axis must agree; "
                f"got input shapes {shapes}"
            )
        width = sum(s.input_shape[-1] for s in specs)
        return PartySpec(
            name=active.name, role="active", input_shape=(*active.input_shape[:-1], width), index=active.index
        )

    @property
    def feature_parties(self) -> list[str]:
        """The parties whose slices are joined, in datamodule order (the order of the join)."""
        return [s.name for s in self.feature_specs]

    def site_features(self, batch: VFLBatch) -> torch.Tensor:
        """Every party's slice, concatenated along the partition axis (step 1)."""
        return torch.cat([batch.features[k] for k in self.feature_parties], dim=-1)
