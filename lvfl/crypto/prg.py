"""A pseudorandom generator of ring elements: AES-256 in counter mode, keyed by a pair secret.

`mask_stream(key, step, rank, index, numel)` is the keystream of AES-256-CTR (the encryption of zeros) read as
little-endian uint64 words, i.e. uniformly random elements of Z_2^64, returned in an int64 tensor. With
`ring_bits=32` the same keystream is read as little-endian uint32 words, uniformly random elements of Z_2^32 in an
int32 tensor: half the keystream (and half the AES work) per element. The 32-bit stream is a prefix of the 64-bit
one's bytes, so one key must mask in one ring only, which `lvfl.privacy.DHMasking` guarantees (its ring is fixed
when it is built, and `setup` agrees on fresh keys).

The 16-byte initial counter block is::

    step (8 bytes, big-endian) | rank (2 bytes) | index (2 bytes) | block counter (4 bytes, starts at 0)

Why a (key, counter block) pair never repeats: CTR mode encrypts the counter block and increments it as one
128-bit big-endian integer per 16-byte block. Only the low 32 bits change because a stream is limited to 2**32
blocks (64 GiB), so the counter never carries into `index`. Each stream therefore owns the counter range
`[step|rank|index|0, step|rank|index|2**32)`, and streams with different `(step, rank, index)` own disjoint ranges.
A pair key is used by one pair of parties in one training run (keys are agreed afresh by every `setup`), the
protocol's step counter only increases, each DDP rank has its own `rank`, and `index` numbers the tensors masked
within a step; so as long as callers keep those promises no AES input block is ever encrypted twice under one key,
which is what CTR mode's security needs.

How `add_masks_` computes the keystream (the stream itself is the one above, bit for bit). OpenSSL's AES-GCM is
stitched with VAES/AVX-512 and, on CPUs that have them, produces keystream faster than its CTR mode (close to
twice as fast on the development machine's). GCM with a 12-byte IV N encrypts with AES-CTR from the
counter block `N | 2`, incrementing the low 32 bits only (NIST SP 800-38D, section 7.1): with N = `step | rank |
index`, that is this stream from its third block on, and the low 32 bits never wrap because a stream stops at 2**32
blocks. So `add_masks_` takes the first two blocks from CTR mode and the rest from GCM's encryption of zeros, and
never computes the GCM tag; streams under 64 KiB, where setting up a second cipher costs more than it saves, stay
in CTR mode. `mask_stream` keeps to plain CTR mode, so that each is a reference for the other.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY_BYTES = 32
MAX_STEP = 2**64 - 1
MAX_RANK = 2**16 - 1
MAX_INDEX = 2**16 - 1
#: 2**32 AES blocks of 16 bytes, 8 bytes per ring element of Z_2^64
MAX_NUMEL = 2**32 * 16 // 8
#: the same stream limit per ring: 2**32 AES blocks of 16 bytes, ring_bits / 8 bytes per element
MAX_NUMEL_BY_RING = {64: MAX_NUMEL, 32: 2**32 * 16 // 4}

_BLOCK = 16
_LE_U64 = np.dtype("<u8")
#: keystream words per ring: little-endian unsigned words, and the signed dtype their bits are handed out in
_LE_WORDS = {64: _LE_U64, 32: np.dtype("<u4")}
_SIGNED = {64: np.dtype(np.int64), 32: np.dtype(np.int32)}
_UNSIGNED = {64: np.dtype(np.uint64), 32: np.dtype(np.uint32)}
_RING_OF = {torch.int64: 64, torch.int32: 32}
#: Z_2^64 elements per keystream chunk in `add_masks_` (128 KiB): the chunk is still in cache when it is added
_CHUNK = 16384
_CHUNK_BYTES = _CHUNK * 8
_ZERO_CHUNK = bytes(_CHUNK_BYTES)  # the CTR plaintext, shared read-only by every call
#: the stream blocks taken from CTR mode before GCM's keystream (which starts at counter block `N | 2`) takes over
_GCM_FIRST_BLOCK = 2
_HEAD_BYTES = _GCM_FIRST_BLOCK * _BLOCK
#: streams at least this long are produced by AES-GCM after their head (see the module doc)
_GCM_FROM_BYTES = 1 << 16


def check_uint(value: object, name: str, upper: int) -> int:
    """`value` as a Python int in [0, upper]; TypeError/ValueError naming `name` otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        number = operator.index(value)  # accepts int, numpy ints and integer 0-d tensors
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if not 0 <= number <= upper:
        raise ValueError(f"{name} must be in [0, {upper}], got {number}")
    return number


def counter_block(step: int, rank: int, index: int) -> bytes:
    """The initial 16-byte CTR block `step | rank | index | 0` for one stream (validated; see the module doc)."""
    step = check_uint(step, "step", MAX_STEP)
    rank = check_uint(rank, "rank", MAX_RANK)
    index = check_uint(index, "index", MAX_INDEX)
    return step.to_bytes(8, "big") + rank.to_bytes(2, "big") + index.to_bytes(2, "big") + bytes(4)


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, bytes | bytearray):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes for AES-256, got {len(key)}")
    return bytes(key)


def _check_ring_bits(ring_bits: object) -> int:
    if isinstance(ring_bits, bool) or not isinstance(ring_bits, int):
        raise TypeError(f"ring_bits must be an int (32 or 64), got {type(ring_bits).__name__}")
    if ring_bits not in _LE_WORDS:
        raise ValueError(f"ring_bits must be 32 or 64, got {ring_bits}")
    return ring_bits


def _keystream_into(key: bytes, nonce: bytes, words: np.ndarray, numel: int) -> None:
    """Write `numel` keystream words into `words` (which has spare room: update_into wants block_size - 1 bytes)."""
    nbytes = numel * words.itemsize
    encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    # update_into writes straight into our buffer, with no intermediate bytes object; the zero plaintext comes
    # from calloc, which is cheap for fresh pages.
    written = encryptor.update_into(bytes(nbytes), memoryview(words.view(np.uint8)))
    encryptor.finalize()
    if written != nbytes:  # pragma: no cover - CTR is a stream mode; cryptography writes everything at once
        raise RuntimeError(f"AES-CTR wrote {written} bytes, expected {nbytes}")


class _Keystream:
    """One stream of `total` bytes, written into a caller's buffer in consecutive pieces (see the module doc)."""

    def __init__(self, key: bytes, nonce: bytes, total: int) -> None:
        aes = algorithms.AES(key)
        self._ctr = Cipher(aes, modes.CTR(nonce)).encryptor()  # blocks 0, 1 (and all of a short stream)
        # blocks 2, 3, ...: GCM encrypts with CTR from `N | 2`, N = the counter block's first 12 bytes
        self._gcm = Cipher(aes, modes.GCM(nonce[:12])).encryptor() if total >= _GCM_FROM_BYTES else None
        self._pos = 0

    def write(self, out: memoryview, nbytes: int) -> None:
        """The next `nbytes` keystream bytes into `out[:nbytes]` (`out` has block_size - 1 spare bytes beyond)."""
        zeros = memoryview(_ZERO_CHUNK)
        head = nbytes if self._gcm is None else min(max(_HEAD_BYTES - self._pos, 0), nbytes)
        if head:
            self._ctr.update_into(zeros[:head], out)
        if nbytes > head:
            self._gcm.update_into(zeros[: nbytes - head], out[head:])
        self._pos += nbytes


def mask_stream(key: bytes, step: int, rank: int, index: int, numel: int, ring_bits: int = 64) -> torch.Tensor:
    """`numel` uniformly random ring elements from AES-256-CTR under `key`, as a CPU int64 (or int32) tensor.

    Both parties of a pair call this with the same arguments and get the same stream, so one can add it and the
    other subtract it.

    Args:
        key: the 32-byte pair key.
        step: mask step counter, in [0, 2**64).
        rank: data-parallel rank, in [0, 2**16).
        index: number of the tensor masked within the step, in [0, 2**16).
        numel: number of ring elements, in [0, 2**33] for Z_2^64 and [0, 2**34] for Z_2^32 (2**32 AES blocks).
        ring_bits: 64 (uint64 words, an int64 tensor) or 32 (uint32 words, an int32 tensor).

    Returns:
        A contiguous int64 (ring_bits=64) or int32 (ring_bits=32) tensor of shape `(numel,)` on the CPU.

    Raises:
        TypeError: if `key` is not bytes or a counter field is not an int.
        ValueError: if `key` is not 32 bytes, `ring_bits` is not 32 or 64, or a field is out of range (the message
            names it).
    """
    key = _check_key(key)
    nonce = counter_block(step, rank, index)
    ring_bits = _check_ring_bits(ring_bits)
    numel = check_uint(numel, "numel", MAX_NUMEL_BY_RING[ring_bits])
    le_words = _LE_WORDS[ring_bits]
    words = np.empty(numel + _BLOCK // le_words.itemsize, dtype=le_words)  # spare room for update_into
    _keystream_into(key, nonce, words, numel)
    stream = words[:numel]
    if not le_words.isnative:  # pragma: no cover - big-endian hosts: reinterpret the little-endian words natively
        stream = stream.astype(_UNSIGNED[ring_bits])
    return torch.from_numpy(stream.view(_SIGNED[ring_bits]))


def add_masks_(
    share: torch.Tensor, pair_keys: Sequence[tuple[bytes, bool]], step: int, rank: int, index: int
) -> torch.Tensor:
    """Add (or subtract) one mask stream per pair key to `share` in the ring, in place; returns `share`.

    Equivalent to `share += sum(+-mask_stream(key, step, rank, index, share.numel(), ring_bits))` mod 2**ring_bits,
    where the ring is `share`'s (int64: Z_2^64, int32: Z_2^32), without allocating a tensor per stream: this is the
    inner loop of pairwise masking.

    Args:
        share: a contiguous CPU int64 (or int32) tensor of ring elements, modified in place.
        pair_keys: `(key, add)` pairs; `add=True` adds the stream, `add=False` subtracts it.
        step: mask step counter (see `mask_stream`).
        rank: data-parallel rank.
        index: number of the tensor within the step.
    """
    if not isinstance(share, torch.Tensor) or share.dtype not in _RING_OF:
        raise TypeError("share must be an int64 (Z_2^64) or int32 (Z_2^32) tensor of ring elements")
    if share.device.type != "cpu" or not share.is_contiguous():
        raise ValueError("share must be a contiguous CPU tensor (it is modified in place)")
    ring_bits = _RING_OF[share.dtype]
    le_words = _LE_WORDS[ring_bits]
    nonce = counter_block(step, rank, index)
    numel = check_uint(share.numel(), "numel", MAX_NUMEL_BY_RING[ring_bits])
    if not pair_keys or numel == 0:
        return share
    acc = share.numpy().reshape(-1).view(_UNSIGNED[ring_bits])  # unsigned: the arithmetic wraps mod 2**ring_bits
    chunk = min(numel, _CHUNK_BYTES // le_words.itemsize)
    words = np.empty(chunk + _BLOCK // le_words.itemsize, dtype=le_words)  # update_into wants block_size - 1 of room
    out = memoryview(words.view(np.uint8))
    for key, add in pair_keys:
        op = np.add if add else np.subtract
        stream = _Keystream(_check_key(key), nonce, numel * le_words.itemsize)
        for start in range(0, numel, chunk):  # one stream, generated and added chunk by chunk
            n = min(chunk, numel - start)
            stream.write(out, n * le_words.itemsize)
            op(acc[start : start + n], words[:n], out=acc[start : start + n])
    return share
