"""Who talks to whom: the links a run may use, declared once, checked in simulation and greeted in deployment.

A message that one party's process sends and its receiver's process never takes, or a link that one list knows and
another does not, is invisible on an idle machine and breaks a busy federation. So the links of a run are declared
in one place, by the parts that send on them:

- the protocol (`VFLModule.links`): every lvfl protocol is a star around the active party;
- the aggregation backend (`AggregationBackend.links`): an HE backend's coordinator talks to the active party and
  sends every passive party its public key;
- each callback that makes a party send (`links(roles)` on the callback, e.g. `StudentDistillation`'s producer,
  which receives the other passive parties' predictions).

`run_links` gathers them. In simulation the Wire refuses a message on a link nobody declared (`Wire.links`), in one
line naming the tag, the sender and the receiver, so the fast tests catch it; in deployment `lvfl party` greets,
expects and says goodbye along the very same links (`Links.greeted`, `Links.expected`), so there is no second list
to forget.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Links", "Roles", "ScheduleError", "run_links"]


class ScheduleError(ValueError):
    """A message off the run's declared schedule: on a link nobody declared, sent but never taken.

    A `ValueError`, so the command line prints it as one line: the run's parts disagree about who talks to whom.
    """


@dataclass(frozen=True)
class Roles:
    """The parties of a run by role: what a link declaration needs to know, and nothing that must be loaded."""

    active: str
    passive: tuple[str, ...]
    coordinator: str | None = None

    @property
    def parties(self) -> tuple[str, ...]:
        """Every party, the active one first and a coordinator (which holds no data) last."""
        return (self.active, *self.passive, *([self.coordinator] if self.coordinator else []))


@dataclass(frozen=True)
class Links:
    """A set of directed links (src, dst): the only pairs a run's messages may travel between.

    Example:
        >>> links = Links.star("party0", ["party1", "party2"]) | Links([("party2", "party1")])
        >>> links.allows("party1", "party2"), links.allows("party2", "party1")
        (False, True)
        >>> links.greeted("party1"), links.expected("party1")
        (['party0'], ['party2'])
    """

    pairs: frozenset[tuple[str, str]] = frozenset()

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        object.__setattr__(self, "pairs", frozenset((str(a), str(b)) for a, b in pairs if a != b))

    @classmethod
    def star(cls, active: str, passive: Iterable[str]) -> Links:
        """Both directions between the active party and each passive party."""
        return cls(pair for k in passive for pair in ((k, active), (active, k)))

    def __or__(self, other: Links) -> Links:
        return Links(self.pairs | other.pairs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(sorted(self.pairs))

    def __len__(self) -> int:
        return len(self.pairs)

    def allows(self, src: str, dst: str) -> bool:
        """Whether a message may go from `src` to `dst`."""
        return (src, dst) in self.pairs

    def check(self, src: str, dst: str, tag: str) -> None:
        """Refuse, in one line, a message on a link nobody declared."""
        if (src, dst) not in self.pairs:
            declared = ", ".join(f"{a}->{b}" for a, b in self) or "none"
            raise ScheduleError(
                f"{src} sent {tag!r} to {dst} on a link that neither the protocol, its backend nor a callback "
                f"declared (declared: {declared}); a deployed {dst} would refuse it"
            )

    def senders_to(self, party: str) -> list[str]:
        """The parties that send to `party`."""
        return sorted(a for a, b in self.pairs if b == party)

    def receivers_from(self, party: str) -> list[str]:
        """The parties `party` sends to."""
        return sorted(b for a, b in self.pairs if a == party)

    def greeted(self, party: str) -> list[str]:
        """The peers `party` greets: those it talks with both ways (each must reach the other's port)."""
        return sorted(set(self.senders_to(party)) & set(self.receivers_from(party)))

    def expected(self, party: str) -> list[str]:
        """The peers that only send to `party`: it takes their messages without greeting them (a one-way edge)."""
        return sorted(set(self.senders_to(party)) - set(self.receivers_from(party)))


def run_links(roles: Roles, module: Any, callbacks: Sequence[Any] = ()) -> Links:
    """The links of a run: the protocol's and its backend's, and each callback's that declares some.

    `module.links(roles)` gives the first two (`lvfl.protocols.VFLModule.links`), `callback.links(roles)` a
    callback's.
    """
    links = module.links(roles)
    for callback in callbacks:
        declare = getattr(callback, "links", None)
        if callable(declare):
            links = links | declare(roles)
    return links
