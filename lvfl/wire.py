"""The wire: the one path by which anything crosses from one party to another, with a ledger of real bytes.

Every cross-party message goes through `Wire.send(src, dst, payload, tag)`. Tensors arrive detached: autograd
never crosses a party boundary, so a gradient can only reach another party if it is itself sent as a message.

Two kinds of observer watch the wire. The meter (`Wire.ledger`, `lvfl.ledger.Ledger`) records every message that
crosses to or from this process, once, at its serialized size. Observers (`Wire.subscribe`) model what a receiving
party can see: each is called with every message as it arrives, after it is metered, so audits (e.g.
`lvfl.callbacks.LabelLeakageAudit`) can mount the attacks a party could run on its inbox without any protocol code
knowing about them.

How a message travels is the wire's route, one class per way: `InMemory` (simulation: every party is held here),
`PartyView` (one party's process, over a `Carrier`), `Holding` (`Wire.recording`: held back, not yet sent) and
`OnParent` (`Wire.prefixed`: sent on another wire under a tag prefix).

One party's view (`Wire(here=party, carrier=...)`, docs/federation.md): in a party's own process the same
protocol code runs, but the party holds real values only for what it owns; everything else is a *shadow* (a
`meta`-device tensor with the value's dtype and shape, or `Absent`). `send` then transmits when `here` is the
sender, receives when it is the receiver, and returns a shadow otherwise; `holds(party)` tells host-side code
(key generation, encryption, range checks, metrics) whether it runs here. In simulation `here` is None: every
party is held and nothing changes. Every message carries the protocol's `Wire.step` (the protocol sets it at each
training batch; -1 during set-up), and a receiver refuses one sent at another step.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lvfl.ledger import Ledger, Link, payload_nbytes
from lvfl.schedule import Links
from lvfl.shadows import Shadow, as_shadow

__all__ = [
    "Absent",
    "Carrier",
    "Holding",
    "InMemory",
    "Link",
    "OnParent",
    "PartyView",
    "Route",
    "Wire",
    "arrive",
    "is_shadow",
    "payload_nbytes",
    "shadow",
]

#: An observer: `fn(src, dst, tag, payload)` with the payload exactly as `dst` receives it.
Observer = Callable[[str, str, str, Any], None]

#: An interceptor: `fn(src, tag, payload)` -> what its party acts on instead of `payload` (a malicious receiver).
Interceptor = Callable[[str, str, Any], Any]

#: A message held back by `Wire.recording`: (src, dst, payload as sent, tag, payload as dst would receive it).
Held = tuple[str, str, Any, str, Any]


def arrive(payload: Any) -> Any:
    """`payload` as its receiver holds it: tensors detached (autograd never crosses a party boundary)."""
    if isinstance(payload, torch.Tensor):
        return payload.detach()
    if isinstance(payload, dict):
        return {k: arrive(v) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return type(payload)(arrive(v) for v in payload)
    return payload


@dataclass(frozen=True)
class Absent:
    """The shadow of a value that is not a tensor (a key, a ciphertext) in a process that does not hold it."""

    what: str = "a value held by another party"


def shadow(payload: Any) -> Any:
    """What a party that does not hold `payload` holds in its place: same structure, tensors on the meta device.

    Torch operations on meta tensors work out dtypes and shapes without data, so the code of another party's part
    of a step runs everywhere at little cost (a `lvfl.shadows.Shadow` replays each operator's shape after its first
    call); mixing a shadow with a real tensor raises, which is exactly a cross-party move that bypassed the wire.
    """
    if isinstance(payload, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():  # a shadow's own dispatch is not needed for its shape
            return as_shadow(torch.empty_like(payload, device="meta", requires_grad=False))
    if isinstance(payload, dict):
        return {k: shadow(v) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return type(payload)(shadow(v) for v in payload)
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type | Absent):  # e.g. a CompressedTensor
        fields = {f.name: getattr(payload, f.name) for f in dataclasses.fields(payload) if f.init}
        tensors = {k: shadow(v) for k, v in fields.items() if isinstance(v, torch.Tensor)}
        if tensors:  # its data is in tensors: the same record with shadows in their place
            return dataclasses.replace(payload, **tensors)
    return payload if isinstance(payload, Absent) else Absent(type(payload).__name__)


def is_shadow(value: Any) -> bool:
    """Whether `value` stands for something another party holds (a meta tensor, or `Absent`)."""
    if isinstance(value, torch.Tensor):
        return type(value) is Shadow or value.is_meta
    return isinstance(value, Absent)


class Carrier(Protocol):
    """Moves a party view's messages between party processes: a rehearsal's turns, or the socket transport.

    Each message carries the step the protocol is at (`Wire.step`); `take` refuses one sent at another step.
    """

    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        """Deliver `payload` (as `dst` receives it) from `src` to `dst`."""

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        """The next message from `src` to `dst` under `tag`, checked against `expected` (its shadow at `dst`)."""


class Route(Protocol):
    """How a wire carries one message (its tag already complete); returns the payload as `dst` holds it here."""

    def carry(self, wire: Wire, src: str, dst: str, tag: str, payload: Any) -> Any:
        """Move `payload` from `src` to `dst` under `tag`, on `wire`'s meter and observers as the route needs."""


class InMemory:
    """Simulation: every party is held in this process, so a message is metered and handed over at once."""

    def carry(self, wire: Wire, src: str, dst: str, tag: str, payload: Any) -> Any:
        """Check the link, meter the message, hand it to `dst` (its observers and interceptor)."""
        wire.check_link(src, dst, tag)
        received = arrive(payload)
        wire.meter(src, dst, tag, received)
        return wire.deliver(src, dst, tag, received)


@dataclass(frozen=True)
class PartyView:
    """One party's process: its own messages go out on `carrier`, those to it come in, others are only shapes."""

    here: str
    carrier: Carrier

    def carry(self, wire: Wire, src: str, dst: str, tag: str, payload: Any) -> Any:
        """Send (as `src`), receive (as `dst`), or return a shadow (a message between two other parties)."""
        wire.check_link(src, dst, tag)  # in every process alike: simulation fails where a deployed peer would refuse
        if self.here == src:  # the message leaves this process
            received = arrive(payload)
            wire.meter(src, dst, tag, received)
            self.carrier.post(src, dst, tag, wire.step, received)
            return shadow(received)
        if self.here == dst:  # it arrives from another process, checked against its shadow here
            received = self.carrier.take(src, dst, tag, wire.step, payload)
            wire.meter(src, dst, tag, received)
            return wire.deliver(src, dst, tag, received)
        return shadow(payload)  # a message between two other parties: only its shape is known here


@dataclass(frozen=True)
class Holding:
    """`Wire.recording`: each message is held back in `held`, neither metered nor observed nor sent."""

    held: list[Held]

    def carry(self, wire: Wire, src: str, dst: str, tag: str, payload: Any) -> Any:
        """Hold the message; return it as `dst` would receive it."""
        received = arrive(payload)
        self.held.append((src, dst, payload, tag, received))
        return received


@dataclass(frozen=True)
class OnParent:
    """`Wire.prefixed`: the message goes on `parent` (its meter, observers and route), its tag under `prefix`."""

    parent: Wire
    prefix: str

    def carry(self, wire: Wire, src: str, dst: str, tag: str, payload: Any) -> Any:
        """Send on the parent wire."""
        return self.parent.send(src, dst, payload, self.prefix + tag)


class Wire:
    """Carries messages between parties on its route; its ledger counts bytes and messages per (link, tag).

    Example:
        >>> wire = Wire()
        >>> _ = wire.send("party1", "party0", torch.zeros(4, 8), tag="embeddings")
        >>> wire.total_bytes()
        128
    """

    def __init__(self, here: str | None = None, carrier: Carrier | None = None) -> None:
        if (here is None) != (carrier is None):
            raise ValueError("a party's view of the wire needs both `here` (its party) and a `carrier`")
        self.here = here
        self.carrier = carrier
        self.ledger = Ledger()  # the meter: every message that crosses to or from this process, once
        self._route: Route = InMemory() if here is None else PartyView(here, carrier)
        self._observers: dict[int, Observer] = {}
        self._interceptors: dict[str, Interceptor] = {}
        self._next_handle = 0
        self._parent: Wire | None = None  # set by `prefixed`: a view that sends on its parent
        self._step = -1  # set-up (key agreement, PSI) runs before the first training step
        self._tagged = ""  # set inside `tags_under`: a prefix on every tag sent on this wire object
        self._identities: Any = None  # simulated identities, drawn on first use (see `identities`)
        #: the run's declared links (`lvfl.schedule.run_links`, set by the protocol's `setup`): a message on any other
        #: link is refused in one line; None (a wire outside a run) checks nothing
        self.links: Links | None = None

    # -- the step every message carries ------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """The protocol's step: -1 during set-up, then the training batch count, the same at every party.

        The protocol sets it (`lvfl.protocols.base.VFLModule.on_train_batch_start`); a party view's carrier stamps
        each message with it and refuses a received one of another step. A prefixed view shares its parent's.
        """
        return self._parent.step if self._parent is not None else self._step

    @step.setter
    def step(self, value: int) -> None:
        if self._parent is not None:
            self._parent.step = value
        else:
            self._step = int(value)

    # -- views and recordings: the same wire, used another way -----------------------------------------------------
    def prefixed(self, prefix: str) -> Wire:
        """A wire that sends every message on this one, its tag under `prefix` (e.g. a sub-run's `cross_fit/`).

        The view meters nothing itself: every message is on this wire's ledger and seen by its observers as it
        happens, so a sub-run (a fold teacher) is a normal protocol whose traffic is part of the run's.

        Example:
            >>> wire = Wire()
            >>> _ = wire.prefixed("fold/").send("party1", "party0", torch.zeros(2), tag="embeddings")
            >>> wire.bytes_by_tag()
            {'fold/embeddings': 8}
        """
        view = Wire()
        view._parent, view._route = self, OnParent(self, prefix)
        view.here, view.carrier = self.here, self.carrier
        return view

    @property
    def identities(self) -> Any:
        """Who each party is (`lvfl.crypto.signing.Identities`): signs for the parties held here, verifies anyone.

        In a party's view, the carrier's (its TLS identity and the peers' pinned certificates); in simulation, a
        throw-away identity key per party, so that signed messages cost the same bytes in both.
        """
        if self._parent is not None:
            return self._parent.identities
        given = getattr(self.carrier, "identities", None)
        if given is not None:
            return given
        if self._identities is None:
            from lvfl.crypto.signing import SimulatedIdentities

            self._identities = SimulatedIdentities()
        return self._identities

    def holds(self, party: str) -> bool:
        """Whether `party`'s own computations run in this process: every party in simulation, one in a party view."""
        return self.here is None or party == self.here

    @contextmanager
    def recording(self) -> Iterator[list[Held]]:
        """Hold back every message sent inside the block: none is metered or observed, each is yielded in order.

        For a caller that must see a whole exchange before it knows where each message really goes (a teacher's
        inference whose predictions are delivered to another party): it then sends each one itself with `send`.
        Each held message is (src, dst, payload, tag, payload as dst would receive it).
        """
        if isinstance(self._route, Holding):
            raise RuntimeError("Wire.recording is already active on this wire")
        route, held = self._route, []
        self._route = Holding(held)
        try:
            yield held
        finally:
            self._route = route

    @contextmanager
    def tags_under(self, prefix: str) -> Iterator[None]:
        """Put every message sent on this wire object inside the block under `prefix` + its tag.

        For a phase of a run that reuses the protocol's moves (a teacher's inference, `teacher/<tag>`): everything that
        holds this wire (the protocol, its aggregation backend) sends under the prefix, live, metered and observed as
        usual, in every process.
        """
        before, self._tagged = self._tagged, self._tagged + prefix
        try:
            yield
        finally:
            self._tagged = before

    # -- interceptors: what a malicious receiver acts on ---------------------------------------------------------------
    def intercept(self, party: str, fn: Interceptor | None) -> None:
        """Have `party` act on `fn(src, tag, payload)` instead of each message it receives; None stops it.

        Models a party that deviates from the protocol in its own code after a message arrived (a backdoor attacker
        replacing the gradient it trains on, `lvfl.attacks.backdoor`): the message is metered and observed as it
        arrived; only what the protocol code carries on with changes. One interceptor per party.
        """
        if fn is None:
            self._interceptors.pop(party, None)
        elif party in self._interceptors and self._interceptors[party] is not fn:
            raise RuntimeError(f"party {party!r} already has an interceptor on this wire")
        else:
            self._interceptors[party] = fn

    # -- observers: what a receiving party sees ------------------------------------------------------------------
    def subscribe(self, fn: Observer) -> int:
        """Call `fn(src, dst, tag, payload)` for every later message, after it is metered; returns a handle.

        Observers model what the receiving party `dst` can see, to audit what it could infer (an attack or a
        leakage measurement). They get the payload as it arrives (detached) and must not change it: the protocol
        carries on with the very same object. With no observer, `send` pays only one empty-dict test.
        """
        handle = self._next_handle
        self._next_handle += 1
        self._observers[handle] = fn
        return handle

    def unsubscribe(self, handle: int) -> None:
        """Stop the observer registered under `handle` (unknown handles are ignored, so teardown is idempotent)."""
        self._observers.pop(handle, None)

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers subscribed now, in subscription order (so a caller can check it cleaned up after itself)."""
        return tuple(self._observers.values())

    # -- sending: the route carries, the meter counts, the observers see -----------------------------------------------
    def send(self, src: str, dst: str, payload: Any, tag: str) -> Any:
        """Move `payload` from `src` to `dst` on this wire's route; returns the payload as `dst` receives it here."""
        if src == dst:
            raise ValueError(
                f"party {src!r} sent a message to itself (tag {tag!r}); only cross-party moves go on the wire"
            )
        return self._route.carry(self, src, dst, self._tagged + tag, payload)

    def check_link(self, src: str, dst: str, tag: str) -> None:
        """Refuse a message on a link the run did not declare (`links`; nothing is checked without them)."""
        if self.links is not None:
            self.links.check(src, dst, tag)

    def meter(self, src: str, dst: str, tag: str, payload: Any) -> None:
        """Record a message that crosses to or from this process on the ledger."""
        self.ledger.record(src, dst, tag, payload)

    def deliver(self, src: str, dst: str, tag: str, received: Any) -> Any:
        """Hand an arrived message to `dst`: its observers see it, its interceptor may replace what `dst` acts on."""
        if self._observers:
            for fn in tuple(self._observers.values()):  # a copy: an observer may unsubscribe itself
                fn(src, dst, tag, received)
        if self._interceptors and dst in self._interceptors:
            received = self._interceptors[dst](src, tag, received)
        return received

    # -- reading the ledger (`lvfl.ledger.Ledger`) -------------------------------------------------------------------
    @property
    def bytes(self) -> Counter[tuple[str, str, str]]:
        """Bytes per (src, dst, tag)."""
        return self.ledger.bytes

    @property
    def messages(self) -> Counter[tuple[str, str, str]]:
        """Messages per (src, dst, tag)."""
        return self.ledger.messages

    def total_bytes(self) -> int:
        """All bytes sent so far."""
        return self.ledger.total_bytes()

    def bytes_by_tag(self) -> dict[str, int]:
        """Bytes per message tag."""
        return self.ledger.bytes_by_tag()

    def bytes_by_link(self) -> dict[str, int]:
        """Bytes per directed link, keyed `src->dst`."""
        return self.ledger.bytes_by_link()

    def total_messages(self) -> int:
        """All messages sent so far."""
        return self.ledger.total_messages()

    def reset(self) -> None:
        """Forget everything recorded."""
        self.ledger.reset()

    def state_dict(self) -> dict[str, list]:
        """The ledger as plain lists (it survives a resume, so cumulative figures stay right)."""
        return self.ledger.state_dict()

    def load_state_dict(self, state: Mapping[str, list]) -> None:
        """Restore a ledger saved by `state_dict`."""
        self.ledger.load_state_dict(state)

    def merge_state_dict(self, state: Mapping[str, list]) -> None:
        """Add a saved ledger to this one (a resumed run keeps its own key exchange and the saved history)."""
        self.ledger.merge_state_dict(state)
