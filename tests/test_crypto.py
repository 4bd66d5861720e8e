"""The hazmat layer against independent references: Python ints mod 2**64, exact fractions, AES-ECB, RFC vectors."""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lvfl.crypto import fixedpoint, keys, prg

RING = 2**64
INT64 = st.integers(-(2**63), 2**63 - 1)
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)


def to_signed(v: int) -> int:
    v %= RING
    return v - RING if v >= 2**63 else v


def ref_encode(values: np.ndarray, frac_bits: int) -> list[int]:
    """round(x * 2**f), ties to even, in exact rational arithmetic (Python's round on a Fraction)."""
    return [round(Fraction(float(v)) * 2**frac_bits) for v in values.ravel()]


# -- fixed point ------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    frac_bits=st.integers(1, 40),
    dtype=st.sampled_from([np.float32, np.float64]),
    shape=SHAPES,
)
def test_encode_matches_exact_rounding_and_roundtrip_bound(data, frac_bits, dtype, shape):
    bound = min(1e6, fixedpoint.max_abs_value(frac_bits) / 2)
    elements = st.floats(-bound, bound, allow_nan=False, width=32 if dtype == np.float32 else 64)
    values = data.draw(hnp.arrays(dtype, shape, elements=elements))
    x = torch.from_numpy(values)

    q = fixedpoint.encode(x, frac_bits)
    assert q.dtype == torch.int64
    assert q.shape == x.shape
    assert q.flatten().tolist() == ref_encode(values, frac_bits)

    back = fixedpoint.decode(q, frac_bits, dtype=x.dtype)
    assert back.dtype == x.dtype
    half_step = Fraction(1, 2 ** (frac_bits + 1))
    for got, want in zip(back.flatten().tolist(), values.ravel().tolist(), strict=True):
        assert abs(Fraction(got) - Fraction(want)) <= half_step


def test_encode_rounds_half_to_even_and_handles_half_precision():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5], dtype=torch.float64)
    assert fixedpoint.encode(x, frac_bits=1).tolist() == [1, 3, 5, -1, -3]  # x*2 is already an integer
    assert fixedpoint.encode(x / 2, frac_bits=1).tolist() == [0, 2, 2, -0, -2]  # ties 0.5, 1.5, ... to even
    h = torch.tensor([1000.0, -3.25, 0.1], dtype=torch.float16)  # 1000 * 2**16 overflows float16 itself
    assert fixedpoint.encode(h, 16).tolist() == ref_encode(h.float().numpy(), 16)
    b = torch.tensor([1000.0, -3.25, 0.1], dtype=torch.bfloat16)
    assert fixedpoint.encode(b, 16).tolist() == ref_encode(b.float().numpy(), 16)


def test_encode_refuses_non_float_and_bad_frac_bits():
    with pytest.raises(TypeError, match="floating-point"):
        fixedpoint.encode(torch.arange(3), 16)
    with pytest.raises(ValueError, match="frac_bits"):
        fixedpoint.encode(torch.zeros(3), 63)
    with pytest.raises(TypeError, match="frac_bits"):
        fixedpoint.encode(torch.zeros(3), 16.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_check_range_refuses_non_finite_naming_who(bad):
    x = torch.tensor([0.0, bad, 1.0])
    with pytest.raises(ValueError, match=r"party 'p7'.*NaN or inf"):
        fixedpoint.check_range(x, 16, 3, who="party 'p7'")
    with pytest.raises(ValueError, match="party 'p7'"):
        fixedpoint.encode(x, 16, headroom_parties=3, who="party 'p7'")


@pytest.mark.parametrize(("frac_bits", "headroom"), [(16, 1), (16, 3), (20, 7), (40, 16)])
def test_check_range_bound_is_tight(frac_bits, headroom):
    bound = 2.0 ** (63 - frac_bits) / headroom
    at = torch.tensor([0.0, -bound], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"who.*max \|value\|") as err:
        fixedpoint.check_range(at, frac_bits, headroom, who="who")
    assert f"{bound:.6g}" in str(err.value)  # names the offending value and the allowed bound
    below = torch.tensor([math.nextafter(bound, 0.0)], dtype=torch.float64)
    fixedpoint.check_range(below, frac_bits, headroom, who="who")
    fixedpoint.check_range(torch.empty(0), frac_bits, headroom, who="who")


@settings(max_examples=40, deadline=None)
@given(headroom=st.integers(1, 16), frac_bits=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_sum_of_headroom_encodings_never_overflows(headroom, frac_bits, seed):
    """Values right at the edge of the allowed range: their ring sum still decodes to the true integer sum."""
    rng = np.random.default_rng(seed)
    bound = fixedpoint.max_abs_value(frac_bits, headroom)
    edge = np.nextafter(bound, 0.0)
    tensors = []
    for _ in range(headroom):
        v = rng.choice([edge, -edge, 0.0], size=5) * rng.choice([1.0, 0.999999], size=5)
        tensors.append(torch.from_numpy(v))
    qs = [fixedpoint.encode(t, frac_bits, headroom_parties=headroom) for t in tensors]
    total = fixedpoint.ring_sum(qs).tolist()
    exact = [sum(col) for col in zip(*(ref_encode(t.numpy(), frac_bits) for t in tensors), strict=True)]
    assert all(-(2**63) <= e < 2**63 for e in exact)
    assert total == exact


# -- ring arithmetic against Python ints mod 2**64 ------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(INT64, min_size=1, max_size=20),
    extra=st.lists(st.lists(INT64, min_size=20, max_size=20), min_size=1, max_size=5),
)
def test_ring_ops_match_python_ints(a, extra):
    n = len(a)
    b = extra[0][:n]
    ta, tb = torch.tensor(a, dtype=torch.int64), torch.tensor(b, dtype=torch.int64)
    assert fixedpoint.ring_add(ta, tb).tolist() == [to_signed(x + y) for x, y in zip(a, b, strict=True)]
    assert fixedpoint.ring_sub(ta, tb).tolist() == [to_signed(x - y) for x, y in zip(a, b, strict=True)]
    assert fixedpoint.ring_neg(ta).tolist() == [to_signed(-x) for x in a]
    rows = [a] + [e[:n] for e in extra]
    got = fixedpoint.ring_sum(torch.tensor(r, dtype=torch.int64) for r in rows).tolist()
    assert got == [to_signed(sum(col)) for col in zip(*rows, strict=True)]
    assert ta.tolist() == a  # pure: inputs untouched


def test_ring_ops_wrap_at_the_extremes_and_out_in_place():
    top, bottom = 2**63 - 1, -(2**63)
    a = torch.tensor([top, bottom, -1, bottom])
    b = torch.tensor([1, -1, 1, bottom])
    assert fixedpoint.ring_add(a, b).tolist() == [bottom, top, 0, 0]
    assert fixedpoint.ring_neg(torch.tensor([bottom, 0])).tolist() == [bottom, 0]
    out = a.clone()
    res = fixedpoint.ring_sub(out, b, out=out)
    assert res is out
    assert out.tolist() == [to_signed(x - y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    with pytest.raises(TypeError, match="int64"):
        fixedpoint.ring_add(a.float(), b)
    with pytest.raises(ValueError, match="same shape"):
        fixedpoint.ring_add(a, b[:2])
    with pytest.raises(ValueError, match="at least one"):
        fixedpoint.ring_sum([])


# -- PRG: AES-256-CTR with the documented counter block ------------------------------------------------------------
KEY = bytes(range(32))


def aes_block(key: bytes, block: bytes) -> bytes:
    """One AES-256 block encryption: the independent definition of what CTR's keystream must be."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 - single-block reference, not a mode
    return enc.update(block) + enc.finalize()


@settings(max_examples=25, deadline=None)
@given(
    step=st.integers(0, 2**64 - 1),
    rank=st.integers(0, 2**16 - 1),
    index=st.integers(0, 2**16 - 1),
    numel=st.integers(1, 40),
)
def test_mask_stream_is_aes_of_the_documented_counter_blocks(step, rank, index, numel):
    stream = prg.mask_stream(KEY, step, rank, index, numel)
    assert stream.dtype == torch.int64
    assert stream.shape == (numel,)
    nblocks = (numel * 8 + 15) // 16
    ref = b"".join(aes_block(KEY, struct.pack(">QHHI", step, rank, index, b)) for b in range(nblocks))
    words = [int.from_bytes(ref[8 * i : 8 * i + 8], "little") for i in range(numel)]
    assert stream.tolist() == [to_signed(w) for w in words]
    assert prg.counter_block(step, rank, index) == struct.pack(">QHHI", step, rank, index, 0)


def test_mask_stream_fields_separate_streams_and_prefixes_agree():
    base = prg.mask_stream(KEY, 5, 1, 2, 64)
    assert torch.equal(prg.mask_stream(KEY, 5, 1, 2, 64), base)  # deterministic: both ends of a pair agree
    assert torch.equal(prg.mask_stream(KEY, 5, 1, 2, 10), base[:10])
    others = [
        prg.mask_stream(KEY, 6, 1, 2, 64),  # step
        prg.mask_stream(KEY, 5, 0, 2, 64),  # rank
        prg.mask_stream(KEY, 5, 1, 3, 64),  # index
        prg.mask_stream(bytes(32), 5, 1, 2, 64),  # key
    ]
    for other in others:
        assert not torch.any(other == base)
    assert prg.mask_stream(KEY, 0, 0, 0, 0).shape == (0,)


def test_mask_stream_looks_uniform():
    words = prg.mask_stream(KEY, 1, 0, 0, 1 << 14).numpy().view(np.uint64)
    bits = np.unpackbits(words.view(np.uint8))
    # 2**20 fair bits: the mean is within 6 sigma (sigma = 0.5 / 1024) of 1/2
    assert abs(bits.mean() - 0.5) < 6 * 0.5 / 1024
    top = (words >> np.uint64(62)).astype(np.int64)  # the sign bits are used too
    assert set(np.unique(top).tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"step": -1}, ValueError, "step"),
        ({"step": 2**64}, ValueError, "step"),
        ({"rank": 2**16}, ValueError, "rank"),
        ({"index": 2**16}, ValueError, "index"),
        ({"index": -1}, ValueError, "index"),
        ({"numel": prg.MAX_NUMEL + 1}, ValueError, "numel"),
        ({"step": 1.0}, TypeError, "step"),
        ({"rank": True}, TypeError, "rank"),
        ({"key": bytes(31)}, ValueError, "32 bytes"),
        ({"key": "k" * 32}, TypeError, "key"),
    ],
)
def test_mask_stream_validates(kwargs, exc, match):
    args = {"key": KEY, "step": 0, "rank": 0, "index": 0, "numel": 4} | kwargs
    with pytest.raises(exc, match=match):
        prg.mask_stream(**args)


def test_mask_stream_accepts_numpy_and_tensor_integers():
    want = prg.mask_stream(KEY, 3, 1, 2, 8)
    assert torch.equal(prg.mask_stream(KEY, np.int64(3), torch.tensor(1), np.uint16(2), 8), want)


@settings(max_examples=25, deadline=None)
@given(signs=st.lists(st.booleans(), min_size=0, max_size=5), shape=SHAPES, seed=st.integers(0, 2**32 - 1))
def test_add_masks_matches_sum_of_streams(signs, shape, seed):
    rng = np.random.default_rng(seed)
    start = torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, size=shape, dtype=np.int64, endpoint=True))
    pair_keys = [(bytes(rng.integers(0, 256, 32, dtype=np.uint8)), add) for add in signs]
    got = prg.add_masks_(start.clone(), pair_keys, step=9, rank=1, index=4)
    numel = start.numel()
    expected = start.flatten().tolist()
    for key, add in pair_keys:
        stream = prg.mask_stream(key, 9, 1, 4, numel).tolist()
        expected = [to_signed(e + s if add else e - s) for e, s in zip(expected, stream, strict=True)]
    assert got.shape == start.shape
    assert got.flatten().tolist() == expected


def test_add_masks_refuses_non_ring_or_non_contiguous():
    with pytest.raises(TypeError, match="int64"):
        prg.add_masks_(torch.zeros(4), [(KEY, True)], 0, 0, 0)
    with pytest.raises(ValueError, match="contiguous"):
        prg.add_masks_(torch.zeros(4, 4, dtype=torch.int64).t(), [(KEY, True)], 0, 0, 0)


# -- keys: X25519 (RFC 7748 section 6.1) and HKDF-SHA256 (RFC 5869) -------------------------------------------------
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED_SECRET = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def ref_hkdf_sha256(ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 with hmac/hashlib: extract with an all-zero salt (salt=None), then expand."""
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def test_x25519_rfc7748_vector_through_the_wrapper():
    alice = keys.private_key_from_bytes(ALICE_PRIVATE)
    bob = keys.private_key_from_bytes(BOB_PRIVATE)
    assert keys.public_key_bytes(alice) == ALICE_PUBLIC
    assert keys.public_key_bytes(bob) == BOB_PUBLIC
    assert keys.x25519_shared_secret(alice, BOB_PUBLIC) == SHARED_SECRET
    assert keys.x25519_shared_secret(bob, ALICE_PUBLIC) == SHARED_SECRET
    info = keys.pair_info("alice", "bob")
    pair_key = keys.shared_pair_key(alice, BOB_PUBLIC, info)
    assert pair_key == keys.shared_pair_key(bob, ALICE_PUBLIC, keys.pair_info("bob", "alice"))
    assert pair_key == ref_hkdf_sha256(SHARED_SECRET, info, 32)
    assert len(pair_key) == keys.PAIR_KEY_BYTES


def test_hkdf_rfc5869_test_case_3():
    okm = keys.hkdf_sha256(bytes([0x0B] * 22), info=b"", length=42)
    assert okm.hex() == ("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")


def test_generated_pairs_agree_and_info_binds_the_pair():
    a_priv, a_pub = keys.generate_keypair()
    b_priv, b_pub = keys.generate_keypair()
    assert len(a_pub) == keys.PUBLIC_KEY_BYTES
    assert a_pub != b_pub
    k_ab = keys.shared_pair_key(a_priv, b_pub, keys.pair_info("p1", "p2"))
    assert k_ab == keys.shared_pair_key(b_priv, a_pub, keys.pair_info("p2", "p1"))
    assert k_ab != keys.shared_pair_key(a_priv, b_pub, keys.pair_info("p1", "p3"))
    assert k_ab != keys.shared_pair_key(a_priv, b_pub, keys.pair_info("p1", "p2", context=b"other"))


def test_pair_info_is_canonical_and_unambiguous():
    assert keys.pair_info("b", "a") == keys.pair_info("a", "b")
    assert keys.pair_info("a", "bc") != keys.pair_info("ab", "c")
    with pytest.raises(ValueError, match="two different parties"):
        keys.pair_info("p1", "p1")


def test_key_agreement_refuses_bad_public_keys():
    priv, _ = keys.generate_keypair()
    with pytest.raises(ValueError, match="32 raw bytes"):
        keys.shared_pair_key(priv, bytes(31), b"info")
    with pytest.raises(ValueError, match="low-order|invalid"):
        keys.shared_pair_key(priv, bytes(32), b"info")  # the identity point: all-zero shared secret
    with pytest.raises(TypeError, match="info"):
        keys.shared_pair_key(priv, ALICE_PUBLIC, "info")
    with pytest.raises(ValueError, match="private key"):
        keys.private_key_from_bytes(bytes(16))


@pytest.mark.parametrize("numel", [prg._CHUNK - 1, prg._CHUNK, 2 * prg._CHUNK + 3])
def test_add_masks_across_keystream_chunks_matches_whole_streams(numel):
    """Masks generated chunk by chunk are the same CTR stream as one `mask_stream` call (no restart per chunk)."""
    start = torch.arange(numel, dtype=torch.int64) * 7919
    keys = [(bytes(range(32)), True), (bytes(range(1, 33)), False)]
    got = prg.add_masks_(start.clone(), keys, step=5, rank=2, index=1)
    a = prg.mask_stream(keys[0][0], 5, 2, 1, numel).numpy().view(np.uint64)
    b = prg.mask_stream(keys[1][0], 5, 2, 1, numel).numpy().view(np.uint64)
    expected = start.numpy().view(np.uint64) + a - b  # numpy uint64 arithmetic wraps mod 2**64
    assert np.array_equal(got.numpy().view(np.uint64), expected)
