"""The arithmetic of a batched oblivious PRF from OT extension (KKRT16), for private set intersection.

Kolesnikov, Kumaresan, Rosulek and Trieu, "Efficient Batched Oblivious PRF with Applications to Private Set
Intersection" (CCS 2016), semi-honest. A receiver R puts each of its n items in one of m = 1.27 n bins by cuckoo
hashing (3 public hash functions); bin b holding item x by function i gets the code word c_b = C(x, i) of a
512-bit pseudorandom code C (a random word for an empty bin). With 512 base OTs R holds seed pairs (k0_j, k1_j) and
the sender S, by a random s in {0,1}^512, the seeds k_{s_j, j}. Column j of R's matrix T is PRG(k0_j); R sends the
matrix U with columns u^j = PRG(k0_j) xor PRG(k1_j) xor c^j. S's rows are then q_b = PRG(k_{s_j, j}) xor (s and u_b)
= t_b xor (s and c_b), and the PRF of bin b is F_b(y) = H(b, q_b xor (s and C(y))): S can evaluate it on anything,
R knows its value on its own item only, F_b(x) = H(b, t_b), and learns nothing about s. Where y is not x, c_b xor
C(y) has about 256 bits set (at least KKRT's 128 with overwhelming probability), so F_b(y) is pseudorandom to R.

Here: C is AES-128 under a public key over 4 blocks of a 16-byte keyed BLAKE2b digest of the item (each block with
4i + j in its last byte: distinct for each function i); the PRG is AES-128-CTR under the seed; H is BLAKE2b salted
with the bin's number, truncated to the bytes the caller asks for (`value_bytes`). Only numpy and `cryptography`:
the PSI that moves these values between parties is `lvfl.alignment.kkrt`.
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = [
    "CODE_BITS",
    "CODE_BYTES",
    "HASHES",
    "LOAD",
    "CuckooFailed",
    "bins_for",
    "candidate_bins",
    "code_words",
    "cuckoo",
    "digests",
    "prf_values",
    "prg_rows",
    "random_seed",
    "value_bytes",
]

CODE_BITS = 512  #: the pseudorandom code's width: one base OT per bit
CODE_BYTES = CODE_BITS // 8
HASHES = 3  #: cuckoo hash functions
LOAD = 1.27  #: bins per item of the receiver (KKRT's 1.2 n and more: insertion fails less often)
DIGEST_BYTES = 16
STATISTICAL_BITS = 40  #: a false match among all pairs of items has probability about 2^-40
_ROWS = 1 << 16  #: rows per step of the transposition


class CuckooFailed(RuntimeError):
    """An item found no free bin within the moves allowed: draw another hash key and hash again."""


def bins_for(items: int) -> int:
    """m: the number of bins for `items` items of the receiver (at least one)."""
    return max(1, math.ceil(LOAD * items))


def value_bytes(bins: int, items: int) -> int:
    """Bytes of each PRF value sent: 40 statistical bits plus log2 of the receiver's bins and the sender's items.

    R compares each of its at most m values with the sender's values of the same function, about 3 n_S values in
    all, so a false match anywhere has probability below 2^-40.
    """
    return math.ceil((STATISTICAL_BITS + max(1, bins).bit_length() + max(1, HASHES * items).bit_length()) / 8)


def digests(items: list[bytes], key: bytes) -> np.ndarray:
    """A 16-byte BLAKE2b digest of each item under the public hash `key`, as an (n, 16) array.

    The cuckoo hash functions and the code read these, so 2 n items collide with probability about n^2 / 2^128.
    """
    out = b"".join(hashlib.blake2b(x, digest_size=DIGEST_BYTES, key=key).digest() for x in items)
    return np.frombuffer(out, dtype=np.uint8).reshape(len(items), DIGEST_BYTES)


def candidate_bins(digest: np.ndarray, bins: int) -> np.ndarray:
    """The `HASHES` bins each item may take: 32-bit words of its digest mod `bins`, as an (n, 3) array."""
    words = np.ascontiguousarray(digest).view("<u4")[:, :HASHES].astype(np.uint64)
    return (words % np.uint64(bins)).astype(np.int64)


def cuckoo(candidates: np.ndarray, bins: int, seed: int, max_rounds: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Each item in one of its candidate bins, one item a bin, by cuckoo insertion in rounds.

    Every round, each item without a bin takes the bin of its current function, all at once: where several take one
    bin, one of them keeps it, and the bin's earlier item is moved out. Every item left without a bin then switches
    to one of its other functions at random, for the next round. This is the random-walk insertion done for all
    items together, on whole arrays: a loop over the items in Python would be the slowest part of the active
    party's bins (`benchmarks/perf/psi.py` prints that step; docs/results.md has its times). The rounds needed
    shrink fast below the load where 3-way cuckoo hashing stops succeeding, 0.91 items a bin.

    Returns per bin the item it holds (-1: empty) and the function that put it there. `seed` picks the functions
    the moved items switch to: the PSI draws it from the OS (`random_seed`), never from a config, although the
    placement it decides leaves the receiver only inside U, masked.

    Raises:
        CuckooFailed: items were still without a bin after `max_rounds` rounds (rare at 1.27 bins an item).
    """
    rng = np.random.default_rng(seed)
    where = np.ascontiguousarray(candidates, dtype=np.int64)
    table = np.full(bins, -1, dtype=np.int64)
    function = np.zeros(len(where), dtype=np.int64)  # per item: the function it tries, or holds its bin by
    waiting = np.arange(len(where), dtype=np.int64)
    for _ in range(max_rounds):
        if not waiting.size:
            break
        wanted = where[waiting, function[waiting]]
        before = table[wanted]
        table[wanted] = waiting  # where several items take one bin, one of them is written last and keeps it
        kept = table[wanted] == waiting
        waiting = np.concatenate([waiting[~kept], np.unique(before[before >= 0])])  # the losers and the moved out
        function[waiting] = (function[waiting] + rng.integers(1, HASHES, size=waiting.size)) % HASHES
    else:
        raise CuckooFailed(f"cuckoo hashing of {len(where)} items into {bins} bins failed")
    filled = table >= 0
    by = np.zeros(bins, dtype=np.int64)
    by[filled] = function[table[filled]]
    return table, by


def code_words(digest: np.ndarray, function: np.ndarray, key: bytes) -> np.ndarray:
    """C(x, i) for each digest and function: 4 AES-128 blocks under the public `key`, an (n, 64) array."""
    blocks = np.repeat(np.asarray(digest, dtype=np.uint8)[:, None, :], 4, axis=1)
    blocks[:, :, DIGEST_BYTES - 1] ^= (4 * np.asarray(function)[:, None] + np.arange(4)[None, :]).astype(np.uint8)
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 (AES as a PRP on distinct blocks)
    return np.frombuffer(encryptor.update(blocks.tobytes()), dtype=np.uint8).reshape(len(digest), CODE_BYTES)


def prg_rows(seeds: list[bytes], bins: int) -> np.ndarray:
    """Column j is `bins` bits of AES-128-CTR under seed j; returned as rows, 64 bytes a bin.

    Bit j of a row is bit j % 8 (least significant first) of its byte j // 8. The keystreams are drawn and
    transposed 65,536 bins at a time, so that beside the rows this holds 4 MB of columns, not another matrix.
    """
    if len(seeds) != CODE_BITS:
        raise ValueError(f"the matrix takes {CODE_BITS} seeds, got {len(seeds)}")
    streams = [Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor() for seed in seeds]
    rows = np.empty((bins, CODE_BYTES), dtype=np.uint8)
    columns = np.empty((CODE_BITS, _ROWS // 8), dtype=np.uint8)
    for start in range(0, bins, _ROWS):  # _ROWS is a multiple of 8: each chunk starts on a whole byte
        stop = min(bins, start + _ROWS)
        width = (stop - start + 7) // 8
        for j, stream in enumerate(streams):  # each stream goes on where the last chunk left it
            columns[j, :width] = np.frombuffer(stream.update(bytes(width)), dtype=np.uint8)
        bits = np.unpackbits(columns[:, :width], axis=1, bitorder="little")
        rows[start:stop] = np.packbits(bits[:, : stop - start].T, axis=1, bitorder="little")
    return rows


def prf_values(bins: np.ndarray, rows: np.ndarray, width: int) -> np.ndarray:
    """H(b, row) for each bin number and 64-byte row: BLAKE2b salted with b, truncated to `width` bytes."""
    data, salts = memoryview(np.ascontiguousarray(rows, dtype=np.uint8).tobytes()), bins.astype("<u8").tobytes()
    out = b"".join(
        hashlib.blake2b(
            data[k * CODE_BYTES : (k + 1) * CODE_BYTES], digest_size=width, salt=salts[8 * k : 8 * k + 8]
        ).digest()
        for k in range(len(bins))
    )
    return np.frombuffer(out, dtype=f"S{width}")


def random_seed() -> int:
    """A seed for `cuckoo`'s choices of the functions moved items switch to, from the OS (never a config's)."""
    return int.from_bytes(os.urandom(8), "little")
