"""`DataSetup`: what a protocol asks of its datamodule before training, and the set-up messages it puts on the wire.

The datamodule's own exchange (the PSI that aligns the parties' IDs, the split) runs before any party model exists:
the protocol first says what it needs of the data (a label-free split under a label mechanism; in a party's own
process, the exchanges run live on its wire), then sends the set-up messages on its wire and reports the PSI's
counts. `VFLModule.setup` calls these, then builds the parties. Before any of it, the run's links are declared on the
wire (`lvfl.schedule`): who talks to whom, which every message is checked against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lvfl.loggers import log_to_loggers
from lvfl.parties import party_name
from lvfl.schedule import Links, Roles, run_links


def describe_setup(metrics: Mapping[str, float]) -> str:
    """One line on the PSI's counts (`setup/psi/...`): each list, each pairwise overlap, the common intersection."""
    prefix = "setup/psi/"
    counts = {k[len(prefix) :]: int(v) for k, v in metrics.items() if k.startswith(prefix)}
    parties = sorted({k.split("/")[0] for k in counts if "/" in k})
    parts = []
    for party in parties:
        shared = counts.get(f"{party}/shared_with_active")
        part = f"{party} {counts.get(f'{party}/ids', 0):,} IDs"
        parts.append(part + (f" ({shared:,} shared with the active party)" if shared is not None else ""))
    return f"lvfl: PSI: {'; '.join(parts)}; every party holds {counts.get('intersection', 0):,}"


class DataSetup:
    """The datamodule set-up steps a `VFLModule` inherits (a protocol may filter `setup_messages`).

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`): `wire`, `aggregation`,
    `label_mechanism`, and Lightning's `_trainer`. It also holds the run's declared links (`links`, `declared_links`),
    which `VFLModule.setup` puts on the wire before the set-up's first message.
    """

    def prepare_datamodule(self, datamodule: Any) -> None:
        """Tell `datamodule` what this protocol needs before it prepares: a label-free split with a label mechanism.

        `setup` calls it; so does code that sets a datamodule up before the trainer does (`lvfl predict`, `lvfl
        export`). A datamodule prepared earlier with a split drawn from the labels is refused by name.
        """
        holder = getattr(getattr(self, "aggregation", None), "coordinator", None)
        if holder is not None and hasattr(datamodule, "add_key_holder"):
            datamodule.add_key_holder(holder)  # an HE backend's coordinator loops with the parties: told the counts
        if self.wire.here is not None and hasattr(datamodule, "exchange_on"):
            datamodule.exchange_on(self.wire)  # a party's own process: the data's set-up exchanges run live
        if self.label_mechanism is not None and hasattr(datamodule, "require_label_free_split"):
            mechanism = type(self.label_mechanism).__name__
            datamodule.require_label_free_split(f"the protocol's label mechanism ({mechanism})")

    def teardown(self, stage: str) -> None:
        """The run is over: its wire checks no declaration any more (code after it may use the wire its own way)."""
        self.wire.links = None

    def links(self, roles: Roles) -> Links:
        """Who talks to whom in this protocol (`lvfl.schedule`): a star around the active party, and the backend's.

        The set-up (PSI, split), every training step, validation, test, prediction and the teacher's inference go
        between the active party and each passive party; a protocol whose parties talk otherwise declares it here.
        """
        return Links.star(roles.active, roles.passive) | self.aggregation.links(roles)

    def declared_links(self, datamodule: Any, callbacks: Any = ()) -> Links:
        """The run's links (`lvfl.schedule.run_links`): this protocol's and its backend's, and each callback's.

        What the simulation checks every message against, and what a deployed party greets and says goodbye along.
        """
        return run_links(run_roles(datamodule, self), self, list(callbacks))

    def setup_messages(self, datamodule: Any) -> list[tuple[str, str, Any, str]]:
        """The datamodule's set-up messages (`VerticalDataModule.setup_messages`) this protocol puts on its wire."""
        return list(datamodule.setup_messages()) if hasattr(datamodule, "setup_messages") else []

    def report_setup(self, datamodule: Any, stage: str) -> None:
        """Log what the datamodule's set-up established (`setup_metrics`: the PSI's counts) and, in fit, print it."""
        metrics = datamodule.setup_metrics() if hasattr(datamodule, "setup_metrics") else {}
        if not metrics or self._trainer is None:
            return
        log_to_loggers(self._trainer, metrics)
        if stage == "fit" and self._trainer.is_global_zero:
            print(describe_setup(metrics))


def run_roles(datamodule: Any, module: Any = None) -> Roles:
    """The parties of a run by role (`lvfl.schedule.Roles`), from the datamodule's configuration and the backend.

    Nothing is loaded from a `VerticalDataModule`: the names come from its `participants` and `active_party`. Another
    datamodule (a fold of one, `lvfl.inference.cross_fit`) gives its `party_specs`.
    """
    if hasattr(datamodule, "participants") and hasattr(datamodule, "active_party"):
        active = party_name(datamodule.active_party)
        passive = tuple(party_name(i) for i in datamodule.participants if party_name(i) != active)
    else:
        specs = list(datamodule.party_specs)
        active = next(s.name for s in specs if s.is_active)
        passive = tuple(s.name for s in specs if not s.is_active)
    coordinator = getattr(getattr(module, "aggregation", None), "coordinator", None)
    return Roles(active, passive, coordinator)
