"""Every party's view of a run in one process: the federation's code path without the sockets (docs/federation.md).

A party's view is the protocol module as that party's own process holds it: its own model real, every other
party's model on the meta device (a shadow), its wire a party view (`Wire(here=party, transport=...)`). The views
of one run exchange messages through a `MemoryTransport`, each view in its own thread, so a test can run the same
`training_step` as every party at once and compare the result with the simulation, bit for bit, at a fraction of
the cost of one process per party.
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import Any

import torch

from lvfl.crypto.signing import SimulatedIdentities
from lvfl.federation import FederationError
from lvfl.federation.codec import conform
from lvfl.federation.link import template
from lvfl.parties import VFLBatch
from lvfl.wire import Wire, is_shadow, shadow


class MemoryTransport:
    """Mailboxes for every (src, dst, tag) of one run, shared by the parties' views in one process.

    A message is copied on `post` (as serializing it would), and `take` checks it against the receiver's shadow as
    the socket transport does (`lvfl.federation.codec.conform`): a tensor of another dtype or shape is refused with
    one line naming the sender and the tag.
    """

    def __init__(self, timeout: float = 30.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self._boxes: dict[tuple[str, str, str], queue.Queue] = {}
        self.identities = SimulatedIdentities()  # one throw-away identity per party, shared by the views
        self._lock = threading.Lock()

    def _box(self, src: str, dst: str, tag: str) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((src, dst, tag), queue.Queue())

    def post(self, src: str, dst: str, tag: str, payload: Any) -> None:
        """Leave a copy of `payload` in the (src, dst, tag) mailbox."""
        self._box(src, dst, tag).put(_copy(payload))

    def take(self, src: str, dst: str, tag: str, expected: Any) -> Any:
        """The next message in the (src, dst, tag) mailbox, within the timeout, checked against `expected`."""
        try:
            payload = self._box(src, dst, tag).get(timeout=self.timeout)
        except queue.Empty:
            raise FederationError(f"{src} did not send {tag!r} to {dst} within {self.timeout:g} s") from None
        conform(payload, template(expected), sender=src, tag=tag)
        return payload


def _copy(payload: Any) -> Any:
    if isinstance(payload, torch.Tensor):
        return payload.detach().clone()
    if isinstance(payload, dict):
        return {k: _copy(v) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return type(payload)(_copy(v) for v in payload)
    return copy.deepcopy(payload)


def party_view(module: Any, party: str, transport: Any) -> Any:
    """`party`'s view of a built protocol `module`: a copy in which every other party's parameters are shadows.

    Who owns a parameter is what the protocol already declares for its optimizers (`party_parameters`: a party's
    model, and e.g. the active party's top model or aggregation weights); a module's buffers go with its
    parameters. The copy starts from `module`'s weights (the public initialisation) and keeps no key material
    (backends drop keys when copied): run `view.aggregation.setup(view.party_specs, view.active, view.wire)` in it.
    """
    view = copy.deepcopy(module)
    view.wire = Wire(here=party, transport=transport)
    view.hold_only(party)
    return view


def party_batch(batch: VFLBatch, party: str, active: str) -> VFLBatch:
    """`batch` as `party` holds it: its own features, the labels only at the active party, the rest shadows."""
    features = {k: (x if k == party else shadow(x)) for k, x in batch.features.items()}
    labels = batch.labels if party == active or batch.labels is None else shadow(batch.labels)
    return VFLBatch(ids=batch.ids, features=features, labels=labels)


def held_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` that holds data (not a shadow), by name: what a view really holds."""
    items = list(module.named_parameters()) + list(module.named_buffers())
    return {name: t for name, t in items if not is_shadow(t)}
