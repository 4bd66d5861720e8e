"""Which requested IDs a passive party holds, found without showing it the IDs it does not hold (ECDH-PSI per request).

Serving's plain mode promises a passive party learns which of *its* customers are scored, and nothing of the active
party's other customers. So the active party does not send the IDs first; it finds which of them the passive party
holds with the Diffie-Hellman PSI that aligns the tables at training time (`lvfl.crypto.ecdh_blinding`), cut for
requests:

1. the passive party draws a key b for each version of its table and gives the active party its table blinded,
   b·H(y) for every ID y, shuffled (`BlindedTable`; once per version, fetched again when the version changes);
   the active party re-blinds it with its own key a and keeps the set {a·b·H(y)} (`Memberships`);
2. per request, the active party sends a·H(x) for each requested ID x (its own table's IDs blinded once, at start);
   the passive party returns b·a·H(x), in order; x is held exactly where a·b·H(x) is in the set;
3. only then are the IDs every passive party holds sent in the clear, for their contributions.

What each side learns, semi-honest, under the decisional Diffie-Hellman assumption with H a random oracle: the
passive party sees points that look random to it (it cannot tell a requested ID it does not hold from any other;
the same ID requested again gives the same point, so it can tell a repeat), then the IDs of its own customers that
are scored. The active party learns, for every ID it asks about, whether the passive party holds it (as the
training PSI tells it for its table), and the size of the passive party's table; it can ask about any ID, as any
scoring service lets its caller do. Neither key comes from the config: both are drawn from the OS.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Sequence

from lvfl.crypto.ecdh_blinding import POINT_BYTES, PSIKey, join_points, split_points

__all__ = ["BlindedTable", "Memberships"]

#: re-blinded points a passive party remembers per table version (a repeat costs no exponentiation)
MAX_REMEMBERED = 1_000_000


def _id_bytes(ids: Sequence[str]) -> list[bytes]:
    return [k.encode("utf-8") for k in ids]


class BlindedTable:
    """A passive party's side: its table's IDs blinded under a key drawn for this version, and re-blinding.

    Args:
        ids: the table's IDs.
    """

    def __init__(self, ids: Sequence[str]) -> None:
        self._key = PSIKey()  # b, fresh for each version of the table
        self.version = uuid.uuid4().hex[:16]
        blinded = split_points(self._key.blind(_id_bytes(ids)))
        self.order = list(range(len(blinded)))  # position -> the row of `ids` there (oblivious lookups use positions)
        secrets.SystemRandom().shuffle(self.order)  # the file's order says nothing either
        points = [blinded[i] for i in self.order]
        self.points = join_points(points)
        self.size = len(points)
        self._seen: dict[bytes, bytes] = {}
        self._lock = threading.Lock()

    def reblind(self, points: bytes) -> bytes:
        """b·P for each 32-byte point P the active party sent, in order (a repeat answered from memory).

        Raises:
            ValueError: not a whole number of points, or a point of small order.
        """
        items = split_points(points)
        seen = self._seen  # replaced, never cleared, when full: this call's view stays whole
        fresh = [p for p in dict.fromkeys(items) if p not in seen]
        new = dict(zip(fresh, split_points(self._key.reblind(join_points(fresh))), strict=True)) if fresh else {}
        if new:
            with self._lock:
                if len(self._seen) + len(new) > MAX_REMEMBERED:
                    self._seen = {}
                self._seen.update(new)
        return join_points([new[p] if p in new else seen[p] for p in items])


class Memberships:
    """The active party's side: its key, its IDs blinded once, and each passive party's re-blinded table."""

    def __init__(self) -> None:
        self._key = PSIKey()  # a, for this process's life
        self._blinded: dict[str, bytes] = {}
        self._tables: dict[str, tuple[str, dict[bytes, int]]] = {}  # peer -> (version, {a·b·H(y): its position})
        self._lock = threading.Lock()

    def blind(self, ids: Sequence[str]) -> bytes:
        """a·H(x) for each ID, as one message (each ID blinded once in this process's life)."""
        missing = [k for k in dict.fromkeys(ids) if k not in self._blinded]
        if missing:
            fresh = split_points(self._key.blind(_id_bytes(missing)))
            with self._lock:
                self._blinded.update(zip(missing, fresh, strict=True))
        return join_points([self._blinded[k] for k in ids])

    def version(self, peer: str) -> str | None:
        """The version of `peer`'s table this side holds, or None."""
        held = self._tables.get(peer)
        return None if held is None else held[0]

    def learn_table(self, peer: str, version: str, points: bytes) -> None:
        """Keep {a·b·H(y)} of `peer`'s blinded table (its version `version`).

        Raises:
            ValueError: not a whole number of points, or a point of small order.
        """
        if len(points) % POINT_BYTES:
            raise ValueError(f"{peer}'s blinded table is {len(points)} bytes, not a whole number of points")
        reblinded = split_points(self._key.reblind(points)) if points else []
        reblinded = {p: position for position, p in enumerate(reblinded)}
        with self._lock:
            self._tables[peer] = (version, reblinded)

    def held(self, peer: str, answered: bytes, count: int) -> list[bool]:
        """Which of `count` requested IDs `peer` holds, from its re-blinding of their points.

        Raises:
            ValueError: another number of points than requested.
        """
        return [p is not None for p in self.positions(peer, answered, count)]

    def positions(self, peer: str, answered: bytes, count: int) -> list[int | None]:
        """Where each of `count` requested IDs stands in `peer`'s blinded table (None: not held), from its answer.

        Raises:
            ValueError: another number of points than requested.
        """
        if len(answered) != count * POINT_BYTES:
            raise ValueError(f"{peer} answered {len(answered)} bytes for {count} points")
        table = self._tables[peer][1]
        return [table.get(p) for p in split_points(answered)]

    def size(self, peer: str) -> int:
        """The number of IDs in the version of `peer`'s table this side holds."""
        return len(self._tables[peer][1])
