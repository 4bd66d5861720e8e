"""`private_intersection`: the parties' sample IDs aligned by either PSI, every message on the `Wire`.

Each party holds a list of business IDs (strings or integers, compared by their text). The active party runs a
two-party PSI with each passive party k; the samples every party holds are the intersection of all lists, which each
party then orders the same way (sorted by ID text) and finds among its own rows (`lvfl.alignment.matching.agree`).
Two PSIs end with the same matches, each party learning the same: KKRT16's OT-based PSI (`protocol="kkrt"`, the
default, `lvfl.alignment.kkrt`) and ECDH-PSI (`protocol="ecdh"`, `lvfl.alignment.ecdh`), in about fifteen times
KKRT's core time. Each module's docstring has its messages and what each party learns; a long message goes in parts
(`lvfl.alignment.parts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from lvfl.alignment import ecdh, kkrt
from lvfl.alignment.matching import MATCH_DTYPE, Alignment, agree
from lvfl.alignment.parts import READ_DTYPE, reads
from lvfl.crypto.ecdh_blinding import PARALLEL_FROM, worker_pool
from lvfl.progress import Phase
from lvfl.wire import Wire

__all__ = ["DEFAULT_PROTOCOL", "PROTOCOLS", "Alignment", "id_text", "message_bytes", "private_intersection"]

PROTOCOLS = ("ecdh", "kkrt")  #: the PSI protocols `private_intersection` runs (`protocol`)
#: The PSI `private_intersection` and `PartyTables` run unless told otherwise: KKRT16's, several times faster than
#: ECDH-PSI at a bank's size, each party learning the same (docs/results.md, section 11, has the times).
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
    """Align the parties' IDs by private set intersection: KKRT16's (`lvfl.alignment.kkrt`) or ECDH-PSI.

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
        protocol: "kkrt" (the default: an oblivious PRF from OT extension, `lvfl.alignment.kkrt`, about a fifteenth
            of ECDH's core time, the same party learning the same things) or "ecdh" (`lvfl.alignment.ecdh`); `keys`
            and `workers` are ECDH's.

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
            matched, sizes, shuffles = kkrt.exchange(texts, active, passive, wire, tag, shuffle_keys, phase)
        else:
            matched, sizes, shuffles = ecdh.exchange(texts, active, passive, wire, tag, keys, shuffle_keys, pool, phase)
    finally:
        if pool is not None:
            pool.shutdown()
    return agree(texts, active, passive, wire, tag, matched, sizes, shuffles)


def message_bytes(
    sizes: Mapping[str, int], active: str, common: int, protocol: str = DEFAULT_PROTOCOL
) -> dict[str, int]:
    """The bytes each PSI message tag carries in all, for lists of `sizes` and `common` shared IDs (the ledger).

    A message in more than one part adds a `<tag>/read` of 4 bytes for each part after the first.
    """
    passive = [p for p in sizes if p != active]
    whole: dict[str, list[int]] = {}
    if protocol == "kkrt":
        parted, whole = kkrt.message_lengths(sizes, active)
    else:
        parted = ecdh.message_lengths(sizes, active)
    parted["matches"] = [MATCH_DTYPE.itemsize * common] * len(passive)
    out = {tag: sum(lengths) for tag, lengths in {**parted, **whole}.items()}
    for tag, lengths in parted.items():
        if sum(reads(n) for n in lengths):
            out[f"{tag}/read"] = READ_DTYPE.itemsize * sum(reads(n) for n in lengths)
    return out
