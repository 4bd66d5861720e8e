"""What an OT-based PSI would cost here: a sketch of KKRT16's, both parties in this process, beside lvfl's ECDH-PSI.

    .venv/bin/python benchmarks/psi_ot_sketch.py                # 1,000,000 x 1,000,000 IDs, 50% shared
    .venv/bin/python benchmarks/psi_ot_sketch.py --ids 100000   # a quicker look

Not lvfl's PSI (that is `lvfl.privacy.psi`, ECDH over Curve25519, `benchmarks/psi.py`): evidence for a decision,
whether lvfl should take an OPRF from oblivious transfer to reach the issue's 50 s for 1M x 1M, which ECDH-PSI
cannot on 2 cores. Like `benchmarks/naive_ot.py` it lives here, and only here, until that is decided.

The protocol (Kolesnikov, Kumaresan, Rosulek, Trieu, "Efficient Batched Oblivious PRF with Applications to Private
Set Intersection", CCS 2016), semi-honest, receiver R (the active party) and sender S:

1. 512 base OTs (`lvfl.crypto.ot`, simplest OT): R sends seed pairs (k0_j, k1_j), S chooses by a random s in
   {0,1}^512 and learns k_{s_j, j};
2. R puts each of its IDs in one of m = 1.27 n bins by cuckoo hashing with 3 public hash functions (a keyed BLAKE2b);
   for bin b holding ID x by function i its code word is c_b = C(x, i), a 512-bit pseudorandom code (AES-128 under a
   public key; a random word for an empty bin). With t^j = PRG(k0_j) and the matrix's columns u^j = t^j xor
   PRG(k1_j) xor c^j, R sends U (m x 64 bytes);
3. S's rows are q_b = PRG(k_{s_j, j}) xor (s and u_b) = t_b xor (s and c_b), so for each of its IDs y and each
   function i it sends F(b, y) = H(b, q_b xor (s and C(y, i))) at b = h_i(y), truncated to 10 bytes (40 bits of
   statistical security plus log2 of both lists' sizes at a million each), three lists in one secretly shuffled order;
4. R's value for bin b is H(b, t_b): equal to S's exactly when c_b = C(y, i), i.e. the same ID, and pseudorandom to R
   otherwise (the code's words are 512 bits apart by about half, far over KKRT's 128-bit minimum distance).

R learns which of its IDs S holds and their positions in S's shuffled lists, as with lvfl's ECDH-PSI (the matches
message back to S is the same); S learns the sizes. Left out of this sketch: the messages on a wire (everything is
computed in order in one process), what to do when cuckoo hashing fails (redraw the hash key), workers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lvfl.crypto.ot import OTReceiver, OTSender

CODE_BITS = 512
CODE_BYTES = CODE_BITS // 8
VALUE_BYTES = 10  #: 80 bits: 40 statistical + log2(10^6) + log2(10^6)
LOAD = 1.27  #: bins per ID of the receiver
HASHES = 3
CHUNK = 1 << 16  #: rows per step of the matrix work


def digests(ids: list[bytes], key: bytes) -> np.ndarray:
    """A 16-byte keyed BLAKE2b digest per ID: the input to the cuckoo hash functions and to the code."""
    out = b"".join(hashlib.blake2b(x, digest_size=16, key=key).digest() for x in ids)
    return np.frombuffer(out, dtype=np.uint8).reshape(-1, 16)


def candidate_bins(digest: np.ndarray, bins: int) -> np.ndarray:
    """The 3 bins an ID may take: 32-bit words of its digest mod the number of bins."""
    return (digest.view("<u4")[:, :HASHES].astype(np.uint64) % bins).astype(np.int64)


def cuckoo(candidates: np.ndarray, bins: int, max_moves: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Each ID in one of its candidate bins, at most one a bin (random-walk insertion): per bin, its ID and function."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    table, function = [-1] * bins, [0] * bins
    where = candidates.tolist()
    for item in range(len(where)):
        current = item
        for _ in range(max_moves):
            free = next((i for i in range(HASHES) if table[where[current][i]] == -1), None)
            if free is not None:
                table[where[current][free]], function[where[current][free]] = current, free
                break
            i = int(rng.integers(HASHES))
            b = where[current][i]
            table[b], current, function[b] = current, table[b], i
        else:
            raise RuntimeError("cuckoo hashing failed: redraw the hash key")
    return np.asarray(table, dtype=np.int64), np.asarray(function, dtype=np.int64)


def code_words(digest: np.ndarray, function: np.ndarray, key: bytes) -> np.ndarray:
    """C(x, i): AES-128 under the public `key` of the digest with 4i + j in its last byte, j = 0..3 (64 bytes)."""
    blocks = np.repeat(digest[:, None, :], 4, axis=1)
    blocks[:, :, 15] ^= (4 * function[:, None] + np.arange(4)[None, :]).astype(np.uint8)
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 (AES as a PRP on distinct blocks)
    return np.frombuffer(encryptor.update(blocks.tobytes()), dtype=np.uint8).reshape(len(digest), CODE_BYTES)


def prg_rows(seeds: list[bytes], bins: int) -> np.ndarray:
    """Column j = `bins` bits of AES-CTR under seed j; returned transposed, a 64-byte row per bin."""
    width = (bins + 7) // 8
    columns = np.empty((len(seeds), width), dtype=np.uint8)
    for j, seed in enumerate(seeds):
        columns[j] = np.frombuffer(
            Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(width)), np.uint8
        )
    rows = np.empty((bins, CODE_BYTES), dtype=np.uint8)
    for start in range(0, bins, CHUNK):
        stop = min(bins, start + CHUNK)
        bits = np.unpackbits(columns[:, start // 8 : (stop + 7) // 8], axis=1, bitorder="little")[:, : stop - start]
        rows[start:stop] = np.packbits(bits.T, axis=1, bitorder="little")
    return rows


def prf_values(bins: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """H(b, row): BLAKE2b of the row salted with the bin's number, truncated to `VALUE_BYTES`."""
    data, salts = memoryview(rows.tobytes()), bins.astype("<u8").tobytes()
    out = b"".join(
        hashlib.blake2b(
            data[k * CODE_BYTES : (k + 1) * CODE_BYTES], digest_size=VALUE_BYTES, salt=salts[8 * k : 8 * k + 8]
        ).digest()
        for k in range(len(bins))
    )
    return np.frombuffer(out, dtype=f"S{VALUE_BYTES}")


def run(active: list[bytes], passive: list[bytes]) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, float], int]:
    """Per active ID its position in S's shuffled lists (-1: not held), and that shuffle; seconds a step; bytes."""
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def step(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    hash_key, code_key = os.urandom(16), os.urandom(16)  # public, drawn by R and sent with U
    bins = int(np.ceil(LOAD * len(active)))
    # 1. base OTs: R sends 512 seed pairs, S chooses by s
    sender = OTSender(b"psi-ot-sketch")
    pairs = [(os.urandom(16), os.urandom(16)) for _ in range(CODE_BITS)]
    s = np.frombuffer(os.urandom(CODE_BYTES), dtype=np.uint8)
    choices = np.unpackbits(s, bitorder="little").tolist()
    receiver = OTReceiver(sender.public_point(), b"psi-ot-sketch")
    chosen = receiver.receive(sender.respond(receiver.choose(choices), pairs))
    step("base OTs (512)")
    # 2. R: cuckoo hashing, code words, the matrix U
    mine = digests(active, hash_key)
    table, function = cuckoo(candidate_bins(mine, bins), bins)
    step("R: digests and cuckoo hashing")
    full = table >= 0
    words = np.frombuffer(os.urandom(16 * bins), dtype=np.uint8).reshape(bins, 16).copy()  # empty bins: random
    words[full] = mine[table[full]]
    t = prg_rows([k0 for k0, _ in pairs], bins)
    u = t ^ prg_rows([k1 for _, k1 in pairs], bins) ^ code_words(words, function, code_key)
    step("R: code words and U")
    r_values = prf_values(np.flatnonzero(full), t[full])
    step("R: its values")
    # 3. S: its rows, its three lists in one shuffled order
    theirs = digests(passive, hash_key)
    where = candidate_bins(theirs, bins)
    q = prg_rows(chosen, bins) ^ (u & s[None, :])
    order = np.argsort(np.frombuffer(os.urandom(8 * len(passive)), dtype=np.uint64))  # S's secret shuffle
    lists = []
    for i in range(HASHES):
        parts = []
        for start in range(0, len(passive), CHUNK):
            rows = order[start : start + CHUNK]
            b = where[rows, i]
            code = code_words(theirs[rows], np.full(len(rows), i), code_key)
            parts.append(prf_values(b, q[b] ^ (code & s[None, :])))
        lists.append(np.concatenate(parts))
    step("S: its values (three per ID)")
    # 4. R: match each bin's value against the list of the function that put its ID there
    found = np.full(len(active), -1, dtype=np.int64)
    items, used = table[full], function[full]
    for i in range(HASHES):
        ranked_at = np.argsort(lists[i])
        ranked = lists[i][ranked_at]
        values, rows = r_values[used == i], items[used == i]
        at = np.minimum(np.searchsorted(ranked, values), len(ranked) - 1)
        hit = ranked[at] == values
        found[rows[hit]] = ranked_at[at[hit]]
    step("R: matching")
    base_ots = 33 + CODE_BITS * 33 + CODE_BITS * 2 * (16 + 16)  # A; 512 points B; 512 pairs of seed + GCM tag
    wire = base_ots + u.nbytes + sum(v.nbytes for v in lists) + 4 * int(np.count_nonzero(found >= 0))  # + matches
    return (found, order), seconds, wire


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="IDs per party (default 1,000,000)")
    args = parser.parse_args()
    n, half = args.ids, args.ids // 2
    bank = [f"cust-{i:09d}".encode() for i in range(n)]  # the same IDs as benchmarks/psi.py
    retailer = [f"cust-{i:09d}".encode() for i in range(half, half + n)][::-1]
    start = time.perf_counter()
    (found, order), seconds, wire = run(bank, retailer)
    total = time.perf_counter() - start
    held = np.flatnonzero(found >= 0)
    assert len(held) == n - half, f"{len(held)} IDs found, {n - half} shared"
    assert all(retailer[order[found[r]]] == bank[r] for r in held), "a match points at another ID"
    print(f"{n:,} x {n:,} IDs, {n - half:,} shared, one process, one core (no workers)")
    print(f"wall time {total:.1f} s; {2 * n / total:,.0f} IDs/s, (|X| + |Y|) / seconds, on one core")
    print(
        f"on the wire (counted, not sent) {wire / 1e6:.1f} MB: U {np.ceil(LOAD * n) * CODE_BYTES / 1e6:.1f} MB, the "
        f"sender's values {HASHES * n * VALUE_BYTES / 1e6:.1f} MB, the base OTs and the matches (ECDH-PSI: "
        f"{(3 * 32 * n + 4 * (n - half)) / 1e6:.1f} MB)"
    )
    for name, value in seconds.items():
        print(f"  {name}: {value:.2f} s")


if __name__ == "__main__":
    main()
