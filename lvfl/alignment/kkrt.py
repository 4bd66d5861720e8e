"""Aligning the parties' IDs by KKRT16's PSI: an oblivious PRF from OT extension, every message on the `Wire`.

`private_intersection(..., protocol="kkrt")` (`lvfl.alignment.intersection`; the default) runs this, not ECDH-PSI
(`lvfl.alignment.ecdh`): the same result and the same final message (`<tag>/matches`, `lvfl.alignment.matching.agree`),
about a fifteenth of its core time, no public-key operation per ID. The arithmetic is `lvfl.crypto.oprf` (its
docstring has the construction); the base OTs are `lvfl.crypto.ot`'s simplest OT.

With the active party R and each passive party k, k's list shuffled secretly as in ECDH-PSI:

1. R -> k, `<tag>/setup`: R's base-OT point A (33 bytes), the public hash and code keys (16 + 16, drawn by R from
   the OS), the size of R's list (8);
2. k -> R, `<tag>/choices`: the size of k's list (8 bytes) and 512 base-OT points, one per bit of k's secret s;
3. R -> k, `<tag>/seeds`: the 512 seed pairs (k0_j, k1_j), each seed encrypted under its OT key (64 bytes a pair);
4. R -> k, `<tag>/matrix`: U, 64 bytes for each of R's m = ceil(1.27 n_R) bins (R's IDs cuckoo-hashed into them);
5. k -> R, `<tag>/values`: for each of its IDs in its shuffled order and each of the 3 hash functions, the PRF value at
   that function's bin (`lvfl.crypto.oprf.value_bytes` bytes each): three lists, one after the other;
6. R matches each of its bins' own values against the list of the function that filled the bin: it learns which of
   its IDs k holds and their positions in k's shuffled list, then `<tag>/matches` as in ECDH-PSI.

R sends messages 1, 3 and 4 to every passive party before it takes any party's message 5, so in the parties' own
processes each passive party computes its values while R serves the next one. Messages 4 and 5 go in parts when
long (`lvfl.alignment.parts`).

What each party learns (semi-honest parties; the base OTs' CDH in secp256k1, AES as a pseudorandom permutation,
BLAKE2b as a random oracle): exactly what it learns in ECDH-PSI. R learns the size of every passive party's list
and each pairwise intersection with its own list, with each shared ID's position in that party's shuffled list;
every other value k sends is a PRF value under k's secret s on an input R does not hold, pseudorandom to R, and k's
OT points are uniform whatever s is. A passive party learns the size of R's list and the common intersection:
the seeds it did not choose are encrypted under keys it cannot compute, and U is each code word masked by the
pseudorandom stream of a seed it does not hold, so U is pseudorandom to k. The hash and code keys are public, and
drawn afresh by R (a cuckoo hashing that fails draws another hash key before anything is sent: rare at 1.27 bins
an ID, below the load where 3-way cuckoo hashing stops succeeding, 0.91 items a bin; it has not failed in any run
here. The key R sends then tells k only that R's list hashed under it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

from lvfl.alignment.matching import Exchanged, match_positions
from lvfl.alignment.parts import send_in_parts
from lvfl.crypto import oprf
from lvfl.crypto.ecdh_blinding import secret_permutation
from lvfl.crypto.ot import POINT_BYTES as OT_POINT_BYTES
from lvfl.crypto.ot import TAG_BYTES, OTReceiver, OTSender
from lvfl.progress import Phase
from lvfl.wire import Absent, Wire

__all__ = ["SEED_BYTES", "SETUP_BYTES", "exchange", "message_lengths"]

SEED_BYTES = 16  #: an OT-extension seed (AES-128)
KEY_BYTES = 16  #: the public hash and code keys
SETUP_BYTES = OT_POINT_BYTES + 2 * KEY_BYTES + 8  #: message 1
CHOICES_BYTES = 8 + oprf.CODE_BITS * OT_POINT_BYTES  #: message 2
SEEDS_BYTES = oprf.CODE_BITS * 2 * (SEED_BYTES + TAG_BYTES)  #: message 3
CHUNK = 1 << 16  #: rows or IDs a step, so that the temporaries stay a few MB
CUCKOO_TRIES = 8  #: hash keys drawn before cuckoo hashing is given up (a failure is rare: see the docstring)
_SIZE = np.dtype(">u8")


def message_lengths(sizes: Mapping[str, int], active: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The length of each message of each passive party's exchange, by tag (the ledger; matches aside).

    First those sent in parts when long (`parts.send_in_parts`), then those of a few kB, always sent whole.
    """
    passive = [p for p in sizes if p != active]
    bins = oprf.bins_for(sizes[active])
    parted = {
        "matrix": [bins * oprf.CODE_BYTES] * len(passive),
        "values": [oprf.HASHES * sizes[p] * oprf.value_bytes(bins, sizes[p]) for p in passive],
    }
    whole = {
        "setup": [SETUP_BYTES] * len(passive),
        "choices": [CHOICES_BYTES] * len(passive),
        "seeds": [SEEDS_BYTES] * len(passive),
    }
    return parted, whole


def exchange(
    texts: dict[str, list[str]],
    active: str,
    passive: list[str],
    wire: Wire,
    tag: str,
    shuffle_keys: Mapping[str, bytes],
    phase: Callable[..., Phase],
) -> Exchanged:
    """Messages 1-5 and R's matching, each party's part where the wire holds it: what `matching.agree` takes."""
    held = wire.holds
    unknown = Absent("PSI values")
    mine = held(active)
    sizes = {party: len(rows) for party, rows in texts.items()}
    table = function = inputs = None
    hash_key = code_key = b""
    if mine:  # R: its IDs into bins, each bin's code word (for every passive party alike)
        with phase(f"{active}: PSI, hashing its IDs into bins", total=len(texts[active]), unit="IDs") as step:
            count = len(texts[active])
            bins = oprf.bins_for(count)
            for _ in range(CUCKOO_TRIES):
                hash_key, code_key = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
                digest = oprf.digests([t.encode() for t in texts[active]], hash_key)
                try:
                    table, function = oprf.cuckoo(oprf.candidate_bins(digest, bins), bins, oprf.random_seed())
                    break
                except oprf.CuckooFailed:
                    continue
            else:
                raise RuntimeError(f"{active}: cuckoo hashing of its {count} IDs failed {CUCKOO_TRIES} times")
            filled = table >= 0
            inputs = np.frombuffer(os.urandom(16 * bins), dtype=np.uint8).reshape(bins, 16).copy()  # empty: random
            inputs[filled] = digest[table[filled]]  # each bin's code word C(input, function) is made as U is
            step.advance(count)

    own_values: dict[str, np.ndarray] = {}  # R: per passive party, its own value of each filled bin
    values_out: dict[str, bytes] = {}  # k: its message 5
    shuffles: dict[str, np.ndarray] = {}
    for party in passive:  # messages 1-4 to every passive party before any message 5
        theirs = held(party)
        sender = OTSender(_session(tag, active, party)) if mine else None
        setup = (
            sender.public_point() + hash_key + code_key + np.array([sizes[active]], _SIZE).tobytes()
            if mine
            else unknown
        )
        setup = _whole(wire.send(active, party, setup, f"{tag}/setup"), active, f"{tag}/setup", theirs, SETUP_BYTES)
        if theirs:
            point, k_hash, k_code = setup[:OT_POINT_BYTES], setup[OT_POINT_BYTES:-24], setup[-24:-8]
            sizes[active] = int(np.frombuffer(setup[-8:], _SIZE)[0])
            bins = oprf.bins_for(sizes[active])
            s = np.frombuffer(os.urandom(oprf.CODE_BYTES), dtype=np.uint8)
            receiver = OTReceiver(point, _session(tag, active, party))
            points = receiver.choose(np.unpackbits(s, bitorder="little").tolist())
            choices = np.array([sizes[party]], _SIZE).tobytes() + b"".join(points)
        else:
            choices = unknown
        choices = _whole(
            wire.send(party, active, choices, f"{tag}/choices"), party, f"{tag}/choices", mine, CHOICES_BYTES
        )
        pairs = [(os.urandom(SEED_BYTES), os.urandom(SEED_BYTES)) for _ in range(oprf.CODE_BITS)] if mine else []
        if mine:
            sizes[party] = int(np.frombuffer(choices[:8], _SIZE)[0])
            if not sizes[party]:
                raise ValueError(f"{party} says it holds no IDs")
            points = [choices[8 + j * OT_POINT_BYTES : 8 + (j + 1) * OT_POINT_BYTES] for j in range(oprf.CODE_BITS)]
            seeds = b"".join(c0 + c1 for c0, c1 in sender.respond(points, pairs))
        else:
            seeds = unknown
        seeds = _whole(wire.send(active, party, seeds, f"{tag}/seeds"), active, f"{tag}/seeds", theirs, SEEDS_BYTES)
        width = (SEED_BYTES + TAG_BYTES) if theirs else 0
        ciphertexts = (
            [
                (seeds[2 * j * width : (2 * j + 1) * width], seeds[(2 * j + 1) * width : (2 * j + 2) * width])
                for j in range(oprf.CODE_BITS)
            ]
            if theirs
            else []
        )
        matrix = unknown
        if mine:
            with phase(f"{active}: PSI, the OT extension with {party}", total=len(table), unit="bins") as step:
                t = oprf.prg_rows([k0 for k0, _ in pairs], len(table))
                u = oprf.prg_rows([k1 for _, k1 in pairs], len(table))
                u ^= t
                for start in range(0, len(table), CHUNK):  # the code words, a chunk at a time
                    rows = slice(start, start + CHUNK)
                    u[rows] ^= oprf.code_words(inputs[rows], function[rows], code_key)
                matrix = memoryview(u.reshape(-1))  # sent a part at a time (`send_in_parts`), not copied whole
                filled = np.flatnonzero(table >= 0)
                width = oprf.value_bytes(len(table), sizes[party])
                own_values[party] = np.concatenate(
                    [oprf.prf_values(at, t[at], width) for at in np.array_split(filled, max(1, len(filled) // CHUNK))]
                )
                del t
                step.advance(len(table))
        matrix = send_in_parts(wire, active, party, matrix, f"{tag}/matrix")
        u = None  # R's matrix is sent: let it go before k's work (in simulation both are in this process)
        if theirs:
            if len(matrix) != bins * oprf.CODE_BYTES:
                raise ValueError(
                    f"{active}'s {tag}/matrix is {len(matrix)} bytes, not {bins} rows of {oprf.CODE_BYTES}"
                )
            with phase(f"{party}: PSI, its rows of the OT extension", total=bins, unit="bins") as step:
                q = oprf.prg_rows(receiver.receive(ciphertexts), bins)  # the seeds k chose: PRG(k_{s_j, j})
                received = np.frombuffer(matrix, np.uint8).reshape(bins, oprf.CODE_BYTES)
                for start in range(0, bins, CHUNK):  # q = PRG(chosen seeds) xor (s and u), a chunk at a time
                    q[start : start + CHUNK] ^= received[start : start + CHUNK] & s
                matrix = received = None  # only q is needed from here
                step.advance(bins)
            shuffles[party] = secret_permutation(len(texts[party]), shuffle_keys.get(party))
            values_out[party] = _values(texts[party], shuffles[party], q, s, k_hash, k_code, party, active, phase)
            q = None

    matched: dict[str, np.ndarray] = {}
    for party in passive:
        values = send_in_parts(wire, party, active, values_out.get(party, unknown), f"{tag}/values")
        if mine:
            with phase(f"{active}: PSI, matching {party}'s values", total=len(texts[active]), unit="IDs") as step:
                matched[party] = _match(values, own_values.pop(party), table, function, sizes, party, active)
                step.advance(len(texts[active]))
    return matched, sizes, shuffles


def _values(
    ids: list[str],
    shuffle: np.ndarray,
    q: np.ndarray,
    s: np.ndarray,
    hash_key: bytes,
    code_key: bytes,
    party: str,
    active: str,
    phase: Callable[..., Phase],
) -> bytes:
    """Message 5 of passive party k: per function, each ID's PRF value (shuffled order) at that function's bin."""
    bins = len(q)
    with phase(f"{party}: PSI, its OPRF values for {active}", total=oprf.HASHES * len(ids), unit="values") as step:
        digest = oprf.digests([ids[row].encode() for row in shuffle], hash_key)
        where = oprf.candidate_bins(digest, bins)
        width = oprf.value_bytes(bins, len(ids))
        lists = []
        for i in range(oprf.HASHES):
            for start in range(0, len(ids), CHUNK):
                at = where[start : start + CHUNK, i]
                code = oprf.code_words(digest[start : start + CHUNK], np.full(len(at), i), code_key) & s
                code ^= q[at]
                lists.append(oprf.prf_values(at, code, width).tobytes())
                step.advance(len(at))
        return b"".join(lists)


def _match(
    values: bytes,
    own: np.ndarray,
    table: np.ndarray,
    function: np.ndarray,
    sizes: Mapping[str, int],
    party: str,
    active: str,
) -> np.ndarray:
    """For each of R's rows, its ID's position in `party`'s shuffled list (-1: not held), from message 5."""
    width, count = own.dtype.itemsize, sizes[party]
    if len(values) != oprf.HASHES * count * width:
        raise ValueError(f"{party}'s PSI values are {len(values)} bytes, not {oprf.HASHES} x {count} x {width}")
    lists = np.frombuffer(values, dtype=f"S{width}").reshape(oprf.HASHES, count)
    filled = np.flatnonzero(table >= 0)
    found = np.full(sizes[active], -1, dtype=np.int64)
    for i in range(oprf.HASHES):
        by_i = function[filled] == i
        positions = match_positions(own[by_i], lists[i])
        if positions is None:  # two of R's bins with one value: probability about 2^-40
            raise RuntimeError(f"two of the active party's PSI values with {party} are equal")
        found[table[filled[by_i]]] = positions
    return found


def _whole(payload: object, sender: str, tag: str, used_here: bool, length: int) -> object:
    """A received fixed-length message, checked where it is used."""
    if used_here and (not isinstance(payload, bytes) or len(payload) != length):
        size = len(payload) if isinstance(payload, bytes) else type(payload).__name__
        raise ValueError(f"{sender}'s {tag!r} is {size}, not {length} bytes")
    return payload


def _session(tag: str, active: str, party: str) -> bytes:
    """The base OTs' transcript tag: this PSI, between these two parties."""
    return f"lvfl/psi-kkrt/{tag}/{active}/{party}".encode()
