"""KKRT16's batched oblivious PRF (`lvfl.crypto.oprf`): the matrix rows are the bitwise transposes of the seeds'
keystreams, cuckoo hashing holds every item once in one of its bins, and the sender's PRF equals the receiver's
value on the receiver's own item only, against a bit-by-bit reference of the OT-extension identity."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lvfl.crypto import oprf


@pytest.mark.parametrize("bins", [1000, 2 * 65536 + 1003])  # one chunk; three, the last not a whole byte
def test_prg_rows_are_the_bitwise_transpose_of_the_seeds_keystreams(bins: int) -> None:
    seeds = [os.urandom(16) for _ in range(oprf.CODE_BITS)]
    rows = oprf.prg_rows(seeds, bins)
    for j in (0, 7, 300, 511):  # column j, bit by bit, against its own keystream drawn in one go
        stream = Cipher(algorithms.AES(seeds[j]), modes.CTR(bytes(16))).encryptor().update(bytes((bins + 7) // 8))
        column = np.unpackbits(np.frombuffer(stream, dtype=np.uint8), bitorder="little")[:bins]
        assert np.array_equal((rows[:, j // 8] >> (j % 8)) & 1, column)
    with pytest.raises(ValueError, match="takes 512 seeds, got 3"):
        oprf.prg_rows(seeds[:3], bins)


def test_cuckoo_puts_every_item_in_one_of_its_bins_once() -> None:
    digest = oprf.digests([str(i).encode() for i in range(5000)], bytes(16))
    bins = oprf.bins_for(5000)
    candidates = oprf.candidate_bins(digest, bins)
    table, function = oprf.cuckoo(candidates, bins, seed=1)
    assert sorted(table[table >= 0].tolist()) == list(range(5000))
    for b in np.flatnonzero(table >= 0):
        assert candidates[table[b], function[b]] == b
    with pytest.raises(oprf.CuckooFailed, match="5000 items into 4000 bins failed"):  # past 3-way cuckoo's load limit
        oprf.cuckoo(oprf.candidate_bins(digest, 4000), 4000, seed=1, max_rounds=50)


def test_the_senders_prf_is_the_receivers_value_exactly_on_the_receivers_item() -> None:
    """q_b = t_b xor (s and c_b), computed here bit by bit for a few bins: the sender's PRF of the bin's own item
    under its own function equals H(b, t_b); under another function, or of another item, it does not."""
    bins, key = 64, os.urandom(16)
    k0 = [os.urandom(16) for _ in range(oprf.CODE_BITS)]
    k1 = [os.urandom(16) for _ in range(oprf.CODE_BITS)]
    s_bits = np.frombuffer(os.urandom(oprf.CODE_BITS), dtype=np.uint8) & 1
    s = np.packbits(s_bits, bitorder="little")
    items = oprf.digests([f"id{i}".encode() for i in range(bins)], bytes(16))
    function = np.arange(bins) % oprf.HASHES
    words = oprf.code_words(items, function, key)
    t = oprf.prg_rows(k0, bins)
    u = t ^ oprf.prg_rows(k1, bins) ^ words
    q = oprf.prg_rows([k1[j] if s_bits[j] else k0[j] for j in range(oprf.CODE_BITS)], bins) ^ (u & s)
    for b in (0, 5, 63):  # the identity, bit by bit
        for j in range(oprf.CODE_BITS):
            bit = lambda row, j=j: (int(row[j // 8]) >> (j % 8)) & 1  # noqa: E731
            assert bit(q[b]) == bit(t[b]) ^ (s_bits[j] & bit(words[b]))
    at = np.arange(bins)
    own = oprf.prf_values(at, t, 10)
    sender = oprf.prf_values(at, q ^ (oprf.code_words(items, function, key) & s), 10)
    assert np.array_equal(own, sender)
    other_function = oprf.prf_values(at, q ^ (oprf.code_words(items, (function + 1) % 3, key) & s), 10)
    other_item = oprf.prf_values(at, q ^ (oprf.code_words(np.roll(items, 1, axis=0), function, key) & s), 10)
    assert not np.any(own == other_function)
    assert not np.any(own == other_item)


def test_value_bytes_cover_the_statistical_bits_and_both_sizes() -> None:
    assert oprf.value_bytes(oprf.bins_for(900), 904) == 8  # 40 + 11 + 12 bits
    assert oprf.value_bytes(oprf.bins_for(10**6), 10**6) == 11  # 40 + 21 + 22 bits
    assert oprf.value_bytes(oprf.bins_for(10**7), 10**7) == 12  # 40 + 24 + 25 bits
