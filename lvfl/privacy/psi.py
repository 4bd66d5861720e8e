"""Aligning the parties' sample IDs by Diffie-Hellman private set intersection, every message on the `Wire`.

Each party holds a list of business IDs (strings or integers, compared by their text). The active party runs the
two-party protocol below with each passive party k; the samples every party holds are the intersection of all
lists, which each party then orders the same way (sorted by ID text) and finds among its own rows. This module's
protocol is ECDH-PSI (`protocol="ecdh"`); the default, `protocol="kkrt"`, runs KKRT16's OT-based PSI instead
(`lvfl.privacy.psi_ot`), which ends with the same matches and in which each party learns the same, in about a
fifteenth of the core time.

With the active party's key a and passive party k's key b (fresh per run; `lvfl.crypto.psi`), per passive party:

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
(`lvfl.privacy.psi_wire`), so that the lists may be of any length.

What each party learns (semi-honest parties; DDH on Curve25519 with H a random oracle): the active party learns
the size of every passive party's list and *each pairwise intersection* with its own list (with more than two
parties this is more than the common intersection: it learns which of its IDs each passive party holds). A passive
party learns the size of the active party's list and the common intersection (its own IDs in it), nothing about
the other IDs of any party: everything else it receives is a blinded point, and the matches it receives name
positions in its own shuffled list only. The secret shuffle in message 3 keeps k's row order from the active party
(the matched positions would otherwise reveal where the shared IDs sit in k's table, and a table's row order can
carry a private column it is sorted by). The shuffle is keyed by 32 bytes from the OS's CSPRNG at party k
(`lvfl.crypto.psi.secret_permutation`), never by the config's seed, which every party reads: with a seeded shuffle
the active party could redo it and recover k's row of every shared ID. Neither key leaves its party.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from lvfl.crypto.psi import PARALLEL_FROM, POINT_BYTES, PSIKey, point_array, secret_permutation, worker_pool
from lvfl.privacy import psi_ot
from lvfl.privacy.psi_wire import (
    MATCH_DTYPE,
    READ_DTYPE,
    Alignment,
    Exchanged,
    agree,
    match_positions,
    reads,
    send_in_parts,
)
from lvfl.progress import Phase
from lvfl.wire import Absent, Wire

__all__ = ["DEFAULT_PROTOCOL", "PROTOCOLS", "Alignment", "id_text", "message_bytes", "private_intersection"]

PROTOCOLS = ("ecdh", "kkrt")  #: the PSI protocols `private_intersection` runs (`protocol`)
#: The PSI `private_intersection` and `PartyTables` run unless told otherwise: KKRT16's, which meets a million IDs a
#: side in 12 s on one core where ECDH-PSI takes 90 s on two, each party learning the same (results, section 11).
DEFAULT_PROTOCOL = "kkrt"


def id_text(value: object, party: str) -> str:
    """An ID as the text the parties compare: strings as they are, integers in decimal; other types refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return str(int(value))
    raise TypeError(f"party {party!r}: an ID must be a string or an integer, got {value!r} ({type(value).__name__})")


def _texts(ids: Sequence[object], party: str) -> list[str]:
    texts = [id_text(v, party) for v in ids]
    seen: set[str] = set()
    for text in texts:
        if text in seen:
            raise ValueError(f"party {party!r}: ID {text!r} occurs more than once; IDs must be unique")
        seen.add(text)
    if not texts:
        raise ValueError(f"party {party!r} holds no IDs")
    return texts


def private_intersection(
    ids: Mapping[str, Sequence[object]],
    *,
    active: str,
    wire: Wire,
    tag: str = "psi",
    keys: Mapping[str, bytes] | None = None,
    shuffle_keys: Mapping[str, bytes] | None = None,
    workers: int | None = None,
    parties: Sequence[str] | None = None,
    phase: Callable[..., Phase] = Phase,
    protocol: str = DEFAULT_PROTOCOL,
) -> Alignment:
    """Align the parties' IDs by private set intersection: ECDH-PSI (this module) or KKRT16's (`lvfl.privacy.psi_ot`).

    Each module's docstring has its messages and what each party learns.

    Each party's part runs where the wire holds it (`Wire.holds`): every part in simulation, one party's in its own
    process, where `ids` holds that party's list only and the returned `Alignment` what that party learns (its own
    rows; at a passive party, the active party's list size; at the active party, every size and pairwise count).

    Args:
        ids: the IDs of each party held here, in its row order (party name -> list).
        active: the active party's name.
        wire: every message goes on it under `<tag>/...`, so the ledger and `setup_bytes` count them.
        tag: the wire tag prefix.
        keys: 32-byte secret keys per party (tests); default: fresh random keys.
        shuffle_keys: 32-byte keys of the passive parties' secret shuffles (tests); default: drawn from the OS
            (`os.urandom`). There is deliberately no seed: a config's seed is public.
        workers: processes for large lists (`PSIKey`); None: every CPU core.
        parties: every party's name, in order (default: the keys of `ids`, which then hold every party's list).
        phase: makes the `lvfl.progress.Phase` that reports each step's progress (its name, total and unit).
        protocol: "kkrt" (the default: an oblivious PRF from OT extension, `lvfl.privacy.psi_ot`, about a fifteenth
            of ECDH's core time, the same party learning the same things) or "ecdh" (this module); `keys` and
            `workers` are ECDH's.

    Raises:
        ValueError: a party holds no IDs, or one ID twice (named); a party held here is missing from `ids`.
        TypeError: an ID that is neither a string nor an integer (named).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"the PSI protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    parties = list(ids) if parties is None else list(parties)
    if active not in parties:
        raise ValueError(f"the active party {active!r} is not among the parties {sorted(parties)}")
    missing = [p for p in parties if wire.holds(p) and p not in ids]
    if missing:
        raise ValueError(f"the IDs of {missing} are held here but not given")
    keys = keys or {}
    texts = {party: _texts(ids[party], party) for party in parties if wire.holds(party)}
    passive = [p for p in parties if p != active]
    shuffle_keys = shuffle_keys or {}

    large = sum(len(t) for t in texts.values()) >= PARALLEL_FROM
    pool = worker_pool(workers) if protocol == "ecdh" and large else None
    try:
        if protocol == "kkrt":
            matched, sizes, shuffles = psi_ot.exchange(texts, active, passive, wire, tag, shuffle_keys, phase)
        else:
            matched, sizes, shuffles = _exchange(texts, active, passive, wire, tag, keys, shuffle_keys, pool, phase)
    finally:
        if pool is not None:
            pool.shutdown()
    return agree(texts, active, passive, wire, tag, matched, sizes, shuffles)


def _exchange(
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


def message_bytes(
    sizes: Mapping[str, int], active: str, common: int, protocol: str = DEFAULT_PROTOCOL
) -> dict[str, int]:
    """The bytes each PSI message tag carries in all, for lists of `sizes` and `common` shared IDs (the ledger).

    A message in more than one part adds a `<tag>/read` of 4 bytes for each part after the first.
    """
    passive = [p for p in sizes if p != active]
    whole: dict[str, list[int]] = {}
    if protocol == "kkrt":
        parted, whole = psi_ot.message_lengths(sizes, active)
    else:
        parted = {
            "blinded": [POINT_BYTES * sizes[active]] * len(passive),
            "reblinded": [POINT_BYTES * sizes[active]] * len(passive),
            "peer": [POINT_BYTES * sizes[p] for p in passive],
        }
    parted["matches"] = [MATCH_DTYPE.itemsize * common] * len(passive)
    out = {tag: sum(lengths) for tag, lengths in {**parted, **whole}.items()}
    for tag, lengths in parted.items():
        if sum(reads(n) for n in lengths):
            out[f"{tag}/read"] = READ_DTYPE.itemsize * sum(reads(n) for n in lengths)
    return out
