"""A pseudorandom generator of ring elements: AES-256 in counter mode, keyed by a pair secret.

`mask_stream(key, step, rank, index, numel)` is the keystream of AES-256-CTR (the encryption of zeros) read as
little-endian uint64 words, i.e. uniformly random elements of Z_2^64, returned in an int64 tensor.

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
#: 2**32 AES blocks of 16 bytes, 8 bytes per ring element
MAX_NUMEL = 2**32 * 16 // 8

_BLOCK = 16
_LE_U64 = np.dtype("<u8")
#: ring elements per keystream chunk in `add_masks_` (128 KiB): the chunk is still in cache when it is added
_CHUNK = 16384
_ZERO_CHUNK = bytes(_CHUNK * 8)  # the CTR plaintext, shared read-only by every call


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


def _keystream_into(key: bytes, nonce: bytes, words: np.ndarray, numel: int) -> None:
    """Write `numel` keystream words into `words` (which has 2 spare words: update_into wants block_size - 1)."""
    nbytes = numel * 8
    encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
    # update_into writes straight into our buffer, with no intermediate bytes object; the zero plaintext comes
    # from calloc, which is cheap for fresh pages.
    written = encryptor.update_into(bytes(nbytes), memoryview(words.view(np.uint8)))
    encryptor.finalize()
    if written != nbytes:  # pragma: no cover - CTR is a stream mode; cryptography writes everything at once
        raise RuntimeError(f"AES-CTR wrote {written} bytes, expected {nbytes}")


def mask_stream(key: bytes, step: int, rank: int, index: int, numel: int) -> torch.Tensor:
    """`numel` uniformly random ring elements from AES-256-CTR under `key`, as a CPU int64 tensor.

    Both parties of a pair call this with the same arguments and get the same stream, so one can add it and the
    other subtract it.

    Args:
        key: the 32-byte pair key.
        step: mask step counter, in [0, 2**64).
        rank: data-parallel rank, in [0, 2**16).
        index: number of the tensor masked within the step, in [0, 2**16).
        numel: number of ring elements, in [0, 2**33] (2**32 AES blocks).

    Returns:
        A contiguous int64 tensor of shape `(numel,)` on the CPU.

    Raises:
        TypeError: if `key` is not bytes or a counter field is not an int.
        ValueError: if `key` is not 32 bytes or a field is out of range (the message names it).
    """
    key = _check_key(key)
    nonce = counter_block(step, rank, index)
    numel = check_uint(numel, "numel", MAX_NUMEL)
    words = np.empty(numel + 2, dtype=_LE_U64)
    _keystream_into(key, nonce, words, numel)
    stream = words[:numel]
    if not _LE_U64.isnative:  # pragma: no cover - big-endian hosts: reinterpret the little-endian words natively
        stream = stream.astype(np.uint64)
    return torch.from_numpy(stream.view(np.int64))


def add_masks_(
    share: torch.Tensor, pair_keys: Sequence[tuple[bytes, bool]], step: int, rank: int, index: int
) -> torch.Tensor:
    """Add (or subtract) one mask stream per pair key to `share` in the ring, in place; returns `share`.

    Equivalent to `share += sum(+-mask_stream(key, step, rank, index, share.numel()))` mod 2**64, without
    allocating a tensor per stream: this is the inner loop of pairwise masking.

    Args:
        share: a contiguous CPU int64 tensor of ring elements, modified in place.
        pair_keys: `(key, add)` pairs; `add=True` adds the stream, `add=False` subtracts it.
        step: mask step counter (see `mask_stream`).
        rank: data-parallel rank.
        index: number of the tensor within the step.
    """
    if not isinstance(share, torch.Tensor) or share.dtype != torch.int64:
        raise TypeError("share must be an int64 tensor of ring elements")
    if share.device.type != "cpu" or not share.is_contiguous():
        raise ValueError("share must be a contiguous CPU tensor (it is modified in place)")
    nonce = counter_block(step, rank, index)
    numel = check_uint(share.numel(), "numel", MAX_NUMEL)
    if not pair_keys or numel == 0:
        return share
    acc = share.numpy().reshape(-1).view(np.uint64)
    chunk = min(numel, _CHUNK)
    words = np.empty(chunk + 2, dtype=_LE_U64)  # 2 spare words: update_into wants block_size - 1 of room
    out = memoryview(words.view(np.uint8))
    plaintext = memoryview(_ZERO_CHUNK)
    for key, add in pair_keys:
        op = np.add if add else np.subtract
        encryptor = Cipher(algorithms.AES(_check_key(key)), modes.CTR(nonce)).encryptor()
        for start in range(0, numel, chunk):  # one CTR stream, generated and added chunk by chunk
            n = min(chunk, numel - start)
            encryptor.update_into(plaintext[: n * 8], out)
            op(acc[start : start + n], words[:n], out=acc[start : start + n])
        encryptor.finalize()
    return share
