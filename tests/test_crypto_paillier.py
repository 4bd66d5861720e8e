"""`lvfl.crypto.paillier` against phe, the reference implementation of the same scheme (g = n + 1)."""

from __future__ import annotations

import secrets

import pytest
from phe import paillier as phe

from lvfl.crypto import paillier


@pytest.fixture(scope="module")
def keys():
    n, secret = paillier.generate_keypair(2048)
    return n, secret, phe.PaillierPublicKey(n)


def test_encryption_decrypts_with_phe_and_phe_ciphertexts_decrypt_here(keys):
    n, secret, public = keys
    values = [0, 1, 2**40, n - 1]
    ours = paillier.encrypt(n, values)
    assert [secret.raw_decrypt(c) for c in ours] == values
    assert len(set(paillier.encrypt(n, [5, 5]))) == 2  # fresh randomness per encryption
    theirs = [public.raw_encrypt(v) for v in values]
    assert [paillier.decrypt(secret, c) for c in theirs] == values


def test_homomorphic_operations_match_plain_arithmetic(keys):
    n, secret, _ = keys
    a, b = secrets.randbelow(2**60), secrets.randbelow(2**60)
    ca, cb = paillier.encrypt(n, [a, b])
    assert paillier.decrypt(secret, paillier.add(n, [ca, cb])) == a + b
    assert paillier.decrypt(secret, paillier.add_plain(n, ca, 7)) == a + 7
    assert paillier.signed(paillier.decrypt(secret, paillier.add_plain(n, ca, -a - 3)), n) == -3
    assert paillier.decrypt(secret, paillier.power(n, ca, 12)) == 12 * a
    assert paillier.signed(paillier.decrypt(secret, paillier.power(n, ca, -3)), n) == -3 * a
    inv = paillier.inverse(n, ca)
    assert paillier.power(n, ca, -5, inverse=inv) == paillier.power(n, ca, -5)
    assert paillier.decrypt(secret, paillier.add(n, [])) == 0  # the empty sum is [[0]]


def test_blinding_hides_and_unblinds_exactly(keys):
    n, secret, _ = keys
    values = [3, -9, 0]
    cts = paillier.encrypt(n, [v % n for v in values])
    masked, masks = paillier.blind(n, cts)
    seen = [paillier.decrypt(secret, c) for c in masked]  # what the decrypting party sees: m + r mod n
    assert seen != [v % n for v in values]
    assert paillier.unblind(n, seen, masks) == values


def test_bytes_round_trip_at_fixed_width(keys):
    n, _, _ = keys
    assert paillier.ciphertext_nbytes(n) == 512
    assert paillier.plaintext_nbytes(n) == 256
    cts = paillier.encrypt(n, [1, 2, 3])
    data = paillier.to_bytes(cts, paillier.ciphertext_nbytes(n))
    assert len(data) == 3 * 512
    assert paillier.from_bytes(data, 512) == cts


@pytest.mark.parametrize("bad", [1024, 2047, 2100, True, "2048", 2048.0])
def test_weak_or_malformed_key_sizes_are_refused_naming_the_option(bad):
    with pytest.raises(ValueError, match="key_size"):
        paillier.check_key_size(bad)
    assert paillier.check_key_size(3072) == 3072
