"""How either PSI ends: the active party's matching by value, the `<tag>/matches` message, the agreed order.

Each PSI (`lvfl.alignment.ecdh`, `lvfl.alignment.kkrt`) leaves the active party with values it matches against a
passive party's (`match_positions`), and ends with the same message: the positions, in each passive party's shuffled
list, of the IDs every party holds (`agree`), from which every party puts its rows of them in one order, by ID text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lvfl.alignment.parts import send_in_parts
from lvfl.wire import Absent, Wire

__all__ = ["MATCH_DTYPE", "Alignment", "Exchanged", "agree", "match_positions"]

MATCH_DTYPE = np.dtype(">u4")  #: the wire format of a matched position: 4-byte big-endian unsigned
#: what a PSI's exchange gives `agree`: the active party's matched positions and every size known here (per party),
#: and each passive party's secret shuffle held here
Exchanged = tuple[dict[str, np.ndarray], dict[str, int], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Alignment:
    """The samples every party holds: their IDs in the agreed order, and each party's row of each.

    `rows[party][i]` is the row of `ids[i]` in that party's list, so `table[rows[party]]` lines every party's rows
    up in the same order.
    """

    ids: list[str]
    rows: dict[str, np.ndarray]
    #: what the active party learns besides: each party's list size and each passive party's pairwise intersection
    #: with the active party's list (the active party's own entry: its list size)
    sizes: dict[str, int] = field(default_factory=dict)
    pairwise: dict[str, int] = field(default_factory=dict)


def match_positions(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray | None:
    """For each value of `mine`, the position of the equal value in `theirs` (-1: none); None if `mine` repeats one.

    Fixed-width byte strings (ECDH's 32-byte points, an OPRF's values), matched as a dict from value to row would
    match them (the last position where `theirs` repeats a value), at a few machine words a row instead of a Python
    object per value. The values are pseudorandom, so their first 8 bytes as one integer tell them apart: both
    sides are sorted by that word and `theirs` searched for in `mine` in order, which keeps the searches in cache
    (the matching of `benchmarks/perf/psi.py --ids 10000000`, three searches of ten million values: 7.3 s, 29 s by
    searching the strings in random order); a match of the word is then checked on the whole string. Where two of
    `mine` share their first word, the strings themselves are sorted and searched (`_match_strings`).
    """
    words = _first_words(mine)
    order = np.argsort(words, kind="stable")
    ranked = words[order]
    if ranked.size > 1 and np.any(ranked[1:] == ranked[:-1]):
        return _match_strings(mine, theirs)
    found = np.full(len(mine), -1, dtype=np.int64)
    if not ranked.size or not theirs.size:
        return found
    their_words = _first_words(theirs)
    needles = np.argsort(their_words, kind="stable")  # stable: a repeated value's last position is written last
    searched = their_words[needles]
    at = np.minimum(np.searchsorted(ranked, searched), ranked.size - 1)
    hit = ranked[at] == searched
    rows, positions = order[at[hit]], needles[hit]
    whole = mine[rows] == theirs[positions]
    found[rows[whole]] = positions[whole]
    return found


def _first_words(values: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each fixed-width byte string (zero-padded if narrower) as one unsigned integer."""
    width = values.dtype.itemsize
    raw = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), width)
    padded = np.zeros((len(values), 8), dtype=np.uint8)
    padded[:, : min(8, width)] = raw[:, :8]
    return padded.view("<u8").ravel()


def _match_strings(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray | None:
    """`match_positions` by sorting and searching the whole strings: for a `mine` whose first words repeat."""
    order = np.argsort(mine, kind="stable")
    ranked = mine[order]
    if ranked.size > 1 and np.any(ranked[1:] == ranked[:-1]):
        return None
    found = np.full(len(mine), -1, dtype=np.int64)
    if not ranked.size or not theirs.size:
        return found
    at = np.minimum(np.searchsorted(ranked, theirs), ranked.size - 1)
    hit = ranked[at] == theirs
    found[order[at[hit]]] = np.flatnonzero(hit)
    return found


def agree(
    texts: Mapping[str, list[str]],
    active: str,
    passive: Sequence[str],
    wire: Wire,
    tag: str,
    matched: Mapping[str, np.ndarray],
    sizes: dict[str, int],
    shuffles: Mapping[str, np.ndarray],
) -> Alignment:
    """The last step of either PSI: the matches, and each party's rows of the IDs every party holds, in order.

    The active party tells each passive party k the positions, in k's shuffled list, of the IDs every party holds
    (`<tag>/matches`), and each party puts its rows of them in the agreed order (sorted by ID text).

    `matched[k]` (at the active party): for each of its rows, that ID's position in k's shuffled list (-1: k lacks
    it); `shuffles[k]` (at k): position in its shuffled list -> its row.
    """
    held = wire.holds
    mine = held(active)
    unknown = Absent("PSI points")
    # the active party: the rows every passive party holds, in the agreed order (sorted by ID text)
    ids_agreed: list[str] = []
    rows: dict[str, np.ndarray] = {}
    if mine:
        common = np.ones(len(texts[active]), dtype=bool)
        for party in passive:
            common &= matched[party] >= 0
        agreed = sorted(np.flatnonzero(common).tolist(), key=lambda row: texts[active][row])
        ids_agreed = [texts[active][row] for row in agreed]
        rows[active] = np.asarray(agreed, dtype=np.int64)
    for party in passive:
        positions = np.sort(matched[party][rows[active]]).astype(MATCH_DTYPE).tobytes() if mine else unknown
        received = send_in_parts(wire, active, party, positions, f"{tag}/matches")
        if not held(party):
            continue
        # passive party k: its rows at the matched positions, put in the agreed order by their own ID text
        if len(received) % MATCH_DTYPE.itemsize:
            raise ValueError(f"{active}'s PSI matches ({len(received)} bytes) are not whole {MATCH_DTYPE} positions")
        matches = np.frombuffer(received, dtype=MATCH_DTYPE).astype(np.int64)
        if matches.size and (matches.max() >= len(texts[party]) or np.any(np.diff(matches) <= 0)):
            raise ValueError(f"{active}'s PSI matches are not distinct positions in {party}'s {len(texts[party])} IDs")
        mine_rows = shuffles[party][matches]
        order = sorted(mine_rows.tolist(), key=lambda row: texts[party][row])
        theirs_agreed = [texts[party][row] for row in order]
        if mine and theirs_agreed != ids_agreed:  # cannot happen unless a hash collides
            raise RuntimeError(f"party {party!r} and the active party disagree on the intersection")
        ids_agreed = ids_agreed if mine else theirs_agreed
        rows[party] = np.asarray(order, dtype=np.int64)
    pairwise = {party: int(np.count_nonzero(matched[party] >= 0)) for party in passive if party in matched}
    return Alignment(ids_agreed, rows, sizes, pairwise)
