"""The arithmetic of Diffie-Hellman private set intersection over Curve25519: hash, blind, re-blind.

A party holding secret key a turns an ID x into a·H(x): H is RFC 9380's random-oracle hash to Curve25519
(`lvfl.crypto.hash_to_curve`, taken as a u-coordinate) and the multiplication is X25519 (`cryptography`'s, i.e.
OpenSSL's). Because scalar multiplication commutes, b·(a·H(x)) = a·(b·H(x)): two parties who each blind their own
IDs and re-blind the other's get equal values exactly for the IDs they share, and, under the decisional
Diffie-Hellman assumption with H a random oracle, values indistinguishable from random for the others
(Meadows 1986; Huberman-Franklin-Hogg 1999; the ECDH-PSI of SecretFlow and FATE). The protocol that moves these
values between parties is `lvfl.alignment.ecdh`. `secret_permutation` is here too: the keyed shuffle of a passive
party's list in either PSI (`lvfl.alignment.kkrt`'s as well).

Large batches run on several processes (`workers`): each 32-byte result depends on one ID or point only. What the
workers run is `lvfl.crypto.psi_batches`, which imports no PyTorch.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from lvfl.crypto.prg import KEY_BYTES, mask_stream
from lvfl.crypto.psi_batches import DST, POINT_BYTES, hash_and_blind, reblind

__all__ = [
    "DST",
    "POINT_BYTES",
    "SHUFFLE_KEY_BYTES",
    "PSIKey",
    "join_points",
    "secret_permutation",
    "point_array",
    "split_points",
    "worker_pool",
]

#: below this many items a batch runs in the calling process (starting worker processes costs seconds)
PARALLEL_FROM = 20_000
CHUNK = 10_000  #: items per task sent to a worker (~0.5 s of work: small enough to balance, large enough to batch)


SHUFFLE_KEY_BYTES = KEY_BYTES  #: the key of a secret permutation (AES-256)


def secret_permutation(n: int, key: bytes | None = None) -> np.ndarray:
    """A uniformly random permutation of 0..n-1 that only the holder of `key` can reproduce.

    The rows are ordered by 64-bit words of the AES-256-CTR keystream under `key` (`lvfl.crypto.prg.mask_stream`, a
    stream of its own: step 0, rank 0, index 0): a pseudorandom function of the key, so without the key the order is
    indistinguishable from a uniform shuffle (ties among n words have probability below n^2 / 2^65). `key` None draws
    32 bytes from the OS's CSPRNG (`os.urandom`); a fixed key is for tests only. Never derive it from a config seed:
    the config is public, and whoever knows the key knows the permutation.
    """
    if n < 0:
        raise ValueError(f"a permutation needs n >= 0, got {n}")
    key = os.urandom(SHUFFLE_KEY_BYTES) if key is None else key
    if len(key) != SHUFFLE_KEY_BYTES:
        raise ValueError(f"a shuffle key is {SHUFFLE_KEY_BYTES} bytes, got {len(key)}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    words = mask_stream(key, 0, 0, 0, n).numpy().view(np.uint64)
    return np.argsort(words, kind="stable").astype(np.int64)


def join_points(points: Sequence[bytes]) -> bytes:
    """Points as one message: their 32-byte encodings back to back."""
    return b"".join(points)


def split_points(blob: bytes) -> list[bytes]:
    """The 32-byte points of a message (refusing a length that is not a whole number of points)."""
    _check_whole(blob)
    return [blob[i : i + POINT_BYTES] for i in range(0, len(blob), POINT_BYTES)]


def point_array(blob: bytes) -> np.ndarray:
    """The 32-byte points of a message as one fixed-width array (no Python object per point), checked as above."""
    _check_whole(blob)
    return np.frombuffer(blob, dtype=f"S{POINT_BYTES}")


def _check_whole(blob: bytes) -> None:
    if len(blob) % POINT_BYTES:
        raise ValueError(f"a PSI message of {len(blob)} bytes is not a whole number of {POINT_BYTES}-byte points")


def worker_pool(workers: int | None = None) -> ProcessPoolExecutor | None:
    """Processes for large batches (None for one worker): start it once and pass it to every `PSIKey` of a run.

    Spawned, not forked: the caller may hold threads (torch's) that a fork would copy mid-state.
    """
    workers = workers or os.cpu_count() or 1
    return None if workers == 1 else ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


class PSIKey:
    """One party's secret scalar for one PSI run (an X25519 private key: clamped, so it clears the cofactor).

    Args:
        secret: 32 bytes to use as the key (tests); None draws a fresh one from the OS.
        pool: worker processes (`worker_pool`) for batches of at least `PARALLEL_FROM` items; None: this process.
    """

    def __init__(self, secret: bytes | None = None, pool: ProcessPoolExecutor | None = None) -> None:
        key = X25519PrivateKey.generate() if secret is None else X25519PrivateKey.from_private_bytes(secret)
        self._secret = key.private_bytes_raw()
        self.pool = pool

    def blind(self, ids: Sequence[bytes], done: Callable[[int], None] | None = None) -> bytes:
        """k·H(x) for every ID (byte strings), as one message of 32-byte points in the same order.

        `done(n)` is told each time n more are ready (a chunk of `CHUNK` on the workers; all at once here).
        """
        return self._map(hash_and_blind, list(ids), lambda chunk: chunk, done)

    def reblind(self, points: bytes, done: Callable[[int], None] | None = None) -> bytes:
        """k·P for every 32-byte point P of a message, in the same order (`done` as for `blind`).

        Raises:
            ValueError: a message that is not a whole number of points (`split_points`), or a point of small order
                (X25519 gives all zeros), which an honest peer never sends.
        """
        return self._map(reblind, split_points(points), join_points, done)

    def _map(self, fn, items: list, pack, done: Callable[[int], None] | None) -> bytes:
        done = done or (lambda n: None)
        if self.pool is None or len(items) < PARALLEL_FROM:
            out = fn(self._secret, pack(items))
            done(len(items))
            return out
        chunks = [pack(items[i : i + CHUNK]) for i in range(0, len(items), CHUNK)]
        out = []
        for result in self.pool.map(fn, [self._secret] * len(chunks), chunks):
            out.append(result)  # in order, as each chunk is ready
            done(len(result) // POINT_BYTES)
        return b"".join(out)
