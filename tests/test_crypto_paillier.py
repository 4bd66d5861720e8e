"""`lvfl.crypto.paillier` against phe, the reference implementation of the same scheme (g = n + 1)."""

from __future__ import annotations

import secrets
import types

import gmpy2
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


# -- fixed-base (DJN) encryption ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixed(keys):
    """A fixed base for the module's key, with its default table (8-bit windows, 448-bit exponents)."""
    n, _, _ = keys
    return paillier.fixed_base_table(n, paillier.fixed_base(n))


def carmichael(secret) -> int:
    return int(gmpy2.lcm(secret.p - 1, secret.q - 1))


def test_keys_are_blum_moduli(keys):
    n, secret, _ = keys
    assert n.bit_length() == 2048
    assert secret.p * secret.q == n
    assert secret.p % 4 == 3
    assert secret.q % 4 == 3
    assert gmpy2.gcd(secret.p - 1, secret.q - 1) == 2
    assert gmpy2.jacobi(n - 1, n) == 1  # what fixed_base checks from n alone


def test_fixed_base_is_h_to_the_n_for_h_minus_a_square(keys, monkeypatch):
    n, _, _ = keys
    x = secrets.randbelow(n - 2) + 2
    monkeypatch.setattr(paillier, "secrets", types.SimpleNamespace(randbelow=lambda bound: x - 1))
    assert paillier.fixed_base(n) == gmpy2.powmod(-x * x % n, n, n * n)  # h = -x**2 mod n, h_s = h**n mod n**2


def test_fixed_base_is_an_nth_residue_of_a_jacobi_one_non_square(keys, fixed):
    n, secret, _ = keys
    n2, lam, h_s = n * n, carmichael(secret), fixed.h_s
    # h is the unique n-th root of h_s mod n (x -> x**n is a bijection of Z_n^* since gcd(n, lambda) = 1)
    h = gmpy2.powmod(h_s % n, gmpy2.invert(n, lam), n)
    assert h_s == gmpy2.powmod(h, n, n2)
    assert gmpy2.powmod(h_s, lam, n2) == 1  # an n-th residue: h_s**r encrypts 0 for every r
    assert gmpy2.jacobi(h, n) == 1  # constant Jacobi symbol: ciphertexts mod n show nothing of r
    assert gmpy2.legendre(h, secret.p) == gmpy2.legendre(h, secret.q) == -1  # not a square mod p or q
    assert gmpy2.legendre(-h % n, secret.p) == gmpy2.legendre(-h % n, secret.q) == 1  # -h is a square: h = -x**2
    # lambda / 2 is odd, so h's order keeps the factor 2 of lambda: it is not confined to the squares
    assert gmpy2.powmod(h_s, lam // 2, n2) != 1
    assert paillier.check_fixed_base(n, h_s) == h_s


def test_fixed_base_refuses_moduli_where_minus_one_has_jacobi_symbol_minus_one():
    n = 13 * 7  # 13 = 1 mod 4, 7 = 3 mod 4: Jacobi(-1, 91) = -1
    with pytest.raises(ValueError, match="Jacobi"):
        paillier.fixed_base(n)


def test_check_fixed_base_refuses_malformed_bases(keys, fixed):
    n, secret, _ = keys
    for bad in (0, 1, n * n, n, secret.p * 5):
        with pytest.raises(ValueError, match="unit"):
            paillier.check_fixed_base(n, bad)
    non_residue = next(v for v in range(2, 1000) if gmpy2.jacobi(v, n) == -1)
    with pytest.raises(ValueError, match="Jacobi"):
        paillier.check_fixed_base(n, non_residue)
    with pytest.raises(ValueError, match="window"):
        paillier.fixed_base_table(n, fixed.h_s, window=17)


def test_exponent_length_is_four_times_the_security_level(keys, fixed):
    n, _, _ = keys
    assert paillier.security_bits(n) == 112
    assert paillier.short_exponent_bits(n) == 448  # Ma et al. (ACSAC 2021): 4 * 112
    assert paillier.short_exponent_bits(1 << 3071) == 512
    assert paillier.short_exponent_bits(1 << 7679) == 768
    with pytest.raises(ValueError, match="2048"):
        paillier.security_bits(1 << 2046)
    assert (fixed.exponent_bits, fixed.window, len(fixed.rows)) == (448, 8, 56)
    assert {len(row) for row in fixed.rows} == {256}
    assert 7_000_000 < fixed.nbytes < 7_400_000  # 56 * 256 entries of about 512 bytes
    drawn = paillier.short_exponents(448, 256)
    assert all(0 <= r < 2**448 for r in drawn)
    assert max(r.bit_length() for r in drawn) == 448  # misses with probability 2**-256
    assert len(set(drawn)) == 256


def test_encryption_draws_exponents_of_the_stated_length(keys, fixed, monkeypatch):
    n, secret, _ = keys
    drawn = []
    real = paillier.short_exponents

    def recording(bits, count):
        drawn.append(bits)
        out = real(bits, count)
        drawn.extend(out)
        return out

    monkeypatch.setattr(paillier, "short_exponents", recording)
    values = [5, 7, 9]
    cts = paillier.encrypt_fixed_base(fixed, values)
    assert drawn[0] == 448
    for m, r, c in zip(values, drawn[1:], cts, strict=True):
        assert c == (1 + m * n) * gmpy2.powmod(fixed.h_s, r, n * n) % (n * n)  # (1 + m n) h_s**r, r < 2**448
    assert [paillier.decrypt(secret, c) for c in cts] == values


@pytest.mark.parametrize("window", [0, 1, 5, 8, 11])
def test_table_power_matches_gmpy2_powmod(keys, fixed, window):
    n, _, _ = keys
    bits = 448
    base = fixed if window == 8 else paillier.fixed_base_table(n, fixed.h_s, bits, window)
    assert len(base.rows) == (-(-bits // window) if window else 0)
    corners = [0, 1, 2, 255, 256, 2**window - 1 if window else 3, 2**window if window else 4, 2**bits - 1]
    corners += [2**i for i in range(0, bits, 37)] + [secrets.randbits(bits) for _ in range(20)]
    for r in corners:
        assert paillier.fixed_base_power(base, r) == gmpy2.powmod(fixed.h_s, r, n * n), r
    for bad in (-1, 2**bits):
        with pytest.raises(ValueError, match="exponent"):
            paillier.fixed_base_power(base, bad)


def test_worker_task_matches_the_local_table(keys, fixed):
    n, _, _ = keys
    task, *public = paillier.fixed_base_task(n, fixed.h_s, fixed.exponent_bits)
    assert public == [n, fixed.h_s, 448, 8]  # public values only
    exponents = paillier.short_exponents(448, 5)
    for _ in range(2):  # the second call reuses the worker's table
        assert task(*public, exponents) == paillier.fixed_base_obfuscators(fixed, exponents)


@pytest.mark.parametrize("with_table", [True, False])
def test_fixed_base_ciphertexts_decrypt_and_stay_homomorphic(keys, fixed, with_table):
    n, secret, public = keys
    base = fixed if with_table else paillier.fixed_base_table(n, fixed.h_s, window=0)
    values = [0, 1, 2**40, n - 1, n // 2] + [secrets.randbelow(n) for _ in range(10)]
    cts = paillier.encrypt_fixed_base(base, values)
    assert [paillier.decrypt(secret, c) for c in cts] == values
    assert [secret.raw_decrypt(c) for c in cts] == values  # phe's own decryption agrees
    assert all(0 < c < n * n for c in cts)
    assert {gmpy2.jacobi(c % n, n) for c in cts} == {1}  # c = h_s**r mod n: Jacobi symbol +1 whatever r

    a, b = secrets.randbelow(2**60), secrets.randbelow(2**60)
    ca, cb = paillier.encrypt_fixed_base(base, [a, b])
    textbook = paillier.encrypt(n, [b])[0]
    assert paillier.decrypt(secret, paillier.add(n, [ca, cb])) == a + b
    assert paillier.decrypt(secret, paillier.add(n, [ca, textbook])) == a + b  # mixes with textbook ciphertexts
    assert paillier.decrypt(secret, paillier.add(n, [ca, public.raw_encrypt(b)])) == a + b
    assert paillier.decrypt(secret, paillier.add_plain(n, ca, 7)) == a + 7
    assert paillier.signed(paillier.decrypt(secret, paillier.add_plain(n, ca, -a - 3)), n) == -3
    assert paillier.decrypt(secret, paillier.power(n, ca, 12)) == 12 * a
    assert paillier.signed(paillier.decrypt(secret, paillier.power(n, ca, -3)), n) == -3 * a
    masked, masks = paillier.blind(n, [ca])
    assert paillier.unblind(n, [paillier.decrypt(secret, masked[0])], masks) == [a]


def test_fixed_base_encryption_is_randomized(fixed):
    assert len(set(paillier.encrypt_fixed_base(fixed, [5] * 8))) == 8
    assert len(set(paillier.encrypt_fixed_base(fixed, [0, 0]))) == 2
