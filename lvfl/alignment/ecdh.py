"""ECDH-PSI: the parties' IDs aligned by Diffie-Hellman private set intersection, every message on the `Wire`.

`private_intersection(..., protocol="ecdh")` (`lvfl.alignment.intersection`) runs it; the default, `protocol="kkrt"`,
runs KKRT16's OT-based PSI instead (`lvfl.alignment.kkrt`), which ends with the same matches and in which each party
learns the same, in about a fifteenth of the core time.

With the active party's key a and passive party k's key b (fresh per run; `lvfl.crypto.ecdh_blinding`), per passive
party:

1. active -> k, `<tag>/blinded`: a·H(x) for every active ID x, in the active party's row order (32 bytes each);
2. k -> active, `<tag>/reblinded`: b·(a·H(x)) for those points, in the same order (32 bytes each);
3. k -> active, `<tag>/peer`: b·H(y) for every ID y of k, in an order k shuffles secretly (32 bytes each);
4. the active party computes a·(b·H(y)) and matches it against message 2: it learns which of its IDs k holds;
5. once every passive party has answered, active -> k, `<tag>/matches`: the positions, in k's shuffled message 3,
   of the IDs that *every* party holds, sorted (4 bytes each), from which k finds its rows of the intersection.

The order on the wire is 3, 1, 2 for each passive party in turn, then 5. Message 3 needs nothing from the active
party, so each passive party computes it first, while the active party computes message 1, and sends it; the active
party then re-blinds message 3 (step 4) while k computes message 2. With each party in its own process on its own
cores, the parties blind their own IDs at once (a hash and a multiplication per ID: about three quarters of a
party's work), and re-blind at once. The active party takes the passive parties one at a time, so it holds at
most one message of each unread.

A message of 16 MiB or more (a list of 524,288 IDs) goes in parts, the receiver acknowledging each
(`lvfl.alignment.parts`), so that the lists may be of any length.

What each party learns (semi-honest parties; DDH on Curve25519 with H a random oracle): the active party learns
the size of every passive party's list and *each pairwise intersection* with its own list (with more than two
parties this is more than the common intersection: it learns which of its IDs each passive party holds). A passive
party learns the size of the active party's list and the common intersection (its own IDs in it), nothing about
the other IDs of any party: everything else it receives is a blinded point, and the matches it receives name
positions in its own shuffled list only. The secret shuffle in message 3 keeps k's row order from the active party
(the matched positions would otherwise reveal where the shared IDs sit in k's table, and a table's row order can
carry a private column it is sorted by). The shuffle is keyed by 32 bytes from the OS's CSPRNG at party k
(`lvfl.crypto.ecdh_blinding.secret_permutation`), never by the config's seed, which every party reads: with a seeded
shuffle the active party could redo it and recover k's row of every shared ID. Neither key leaves its party.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from lvfl.alignment.matching import Exchanged, match_positions
from lvfl.alignment.parts import send_in_parts
from lvfl.crypto.ecdh_blinding import POINT_BYTES, PSIKey, point_array, secret_permutation
from lvfl.progress import Phase
from lvfl.wire import Absent, Wire

__all__ = ["exchange", "message_lengths"]


def exchange(
    texts: dict[str, list[str]],
    active: str,
    passive: list[str],
    wire: Wire,
    tag: str,
    keys: Mapping[str, bytes],
    shuffle_keys: Mapping[str, bytes],
    pool: ProcessPoolExecutor | None,
    phase: Callable[..., Phase],
) -> Exchanged:
    """ECDH-PSI's messages 1-3, each party's part where the wire holds it: what `agree` takes (its docstring)."""
    held = wire.holds
    unknown = Absent("PSI points")  # a message another party computes: its size is its sender's

    def blind(key: PSIKey, party: str, ids: list[str]) -> bytes:
        with phase(f"{party}: PSI, hashing and blinding its IDs", total=len(ids), unit="IDs") as step:
            return key.blind([t.encode() for t in ids], step.advance)

    def reblind(key: PSIKey, party: str, other: str, points: bytes) -> bytes:
        with phase(f"{party}: PSI, blinding {other}'s IDs again", total=len(points) // POINT_BYTES, unit="IDs") as step:
            return key.reblind(points, step.advance)

    # the active party blinds its IDs once; every passive party gets the same message
    mine = PSIKey(keys.get(active), pool) if held(active) else None
    blinded = blind(mine, active, texts[active]) if mine else unknown
    # each passive party blinds its own IDs (message 3, in an order it shuffles secretly) before it waits for
    # anything: it needs no message, so in the parties' own processes it runs while the active party blinds its IDs
    passive_keys = {party: PSIKey(keys.get(party), pool) for party in passive if held(party)}
    shuffles: dict[str, np.ndarray] = {}  # passive party k's secret: position in its message 3 -> its row
    own: dict[str, bytes] = {}
    for party, theirs in passive_keys.items():
        shuffles[party] = secret_permutation(len(texts[party]), shuffle_keys.get(party))
        own[party] = blind(theirs, party, [texts[party][row] for row in shuffles[party]])
    # the active party's view: k -> for each of its rows, that ID's position in k's message 3 (-1: k lacks it)
    matched: dict[str, np.ndarray] = {}
    sizes = {party: len(rows) for party, rows in texts.items()}
    for party in passive:  # one passive party at a time: the active party holds one's messages unread at most
        theirs = passive_keys.get(party)
        # message 3 goes first (k has it ready), then message 1; each party then re-blinds what it received, the
        # active party message 3 while k re-blinds message 1, and k answers with message 2
        peer = send_in_parts(wire, party, active, own.get(party, unknown), f"{tag}/peer")
        incoming = send_in_parts(wire, active, party, blinded, f"{tag}/blinded")
        peer_twice = reblind(mine, active, party, peer) if mine else None
        if theirs:
            sizes[active] = len(point_array(incoming))  # what the passive party learns: the active list's size
        reblinded = send_in_parts(
            wire, party, active, reblind(theirs, party, active, incoming) if theirs else unknown, f"{tag}/reblinded"
        )
        if mine:
            matched[party] = match_positions(point_array(reblinded), point_array(peer_twice))
            if matched[party] is None or len(matched[party]) != len(texts[active]):
                raise ValueError(f"{party}'s reblinded points are not one per ID of {active}'s list")
            sizes[party] = len(peer) // POINT_BYTES

    return matched, sizes, shuffles


def message_lengths(sizes: Mapping[str, int], active: str) -> dict[str, list[int]]:
    """The length of each message of each passive party's exchange, by tag (the ledger; matches aside).

    Each is sent in parts when long (`parts.send_in_parts`).
    """
    passive = [p for p in sizes if p != active]
    return {
        "blinded": [POINT_BYTES * sizes[active]] * len(passive),
        "reblinded": [POINT_BYTES * sizes[active]] * len(passive),
        "peer": [POINT_BYTES * sizes[p] for p in passive],
    }
