"""Paillier backend: sums against plain float sums, the packing layout, overflow refusals, exact ledger, no secrets."""

from __future__ import annotations

import copy
import gc
import math
import pickle

import gmpy2
import numpy as np
import phe.util
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lvfl.crypto import packing
from lvfl.crypto import paillier as crypto
from lvfl.crypto.paillier import encrypt
from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.paillier import MIN_PARALLEL_CIPHERTEXTS, TABLE_AFTER, Paillier, PaillierShare
from lvfl.wire import Wire

KEY_BITS = 2048
KEY_BYTES = KEY_BITS // 8
CT_BYTES = 2 * KEY_BITS // 8


def make_parties(num_passive: int) -> list[PartySpec]:
    return [PartySpec("a", "active", (3,))] + [
        PartySpec(f"p{i}", "passive", (3,), i) for i in range(1, num_passive + 1)
    ]


def passive(num_passive: int) -> list[str]:
    return [f"p{i}" for i in range(1, num_passive + 1)]


def expected_slots(num_passive: int, int_bits: int = 12, frac_bits: int = 16) -> int:
    width = int_bits + frac_bits + 1 + math.ceil(math.log2(num_passive + 1))
    return (KEY_BITS - 1) // width


@pytest.fixture(scope="module")
def backends():
    """One serial backend (one 2048-bit key pair) per number of passive parties, set up on first use."""
    cache: dict[int, tuple[Paillier, Wire]] = {}

    def get(num_passive: int) -> tuple[Paillier, Wire]:
        if num_passive not in cache:
            backend, wire = Paillier(workers=1), Wire()
            backend.setup(make_parties(num_passive), "a", wire)
            cache[num_passive] = (backend, wire)
        return cache[num_passive]

    return get


def round_trip(backend: Paillier, wire: Wire, xs: dict[str, torch.Tensor], active: torch.Tensor, step: int = 0):
    """Drive one round like a protocol: each passive party's share goes to the active party, which combines."""
    shares = {p: wire.send(p, "a", backend.protect(p, x, step=step), tag="embeddings") for p, x in xs.items()}
    return backend.combine(active, shares), shares


def test_gmpy2_backs_phe():
    assert phe.util.HAVE_GMP, "gmpy2 is missing: phe would fall back to pure-Python big integers (~10x slower)"


# -- sums -----------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    num_passive=st.integers(2, 10),
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    scale=st.sampled_from([1e-3, 1.0, 100.0, 4000.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_sum_matches_plain_float_sum(backends, num_passive, shape, scale, seed):
    backend, wire = backends(num_passive)
    gen = torch.Generator().manual_seed(seed)
    xs = {p: ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale) for p in passive(num_passive)}
    active = torch.randn(*shape, generator=gen, dtype=torch.float64)
    out, _ = round_trip(backend, wire, xs, active)
    reference = active + sum(xs.values())
    assert out.dtype == torch.float64
    assert out.shape == active.shape
    assert (out - reference).abs().max().item() <= (num_passive + 1) * 2.0**-16


def test_sum_is_differentiable_in_the_active_tensor_and_keeps_its_dtype(backends):
    backend, wire = backends(2)
    active = torch.randn(3, 4, requires_grad=True)
    xs = {p: torch.full((3, 4), 0.5) for p in passive(2)}
    out, _ = round_trip(backend, wire, xs, active)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, active.detach() + 1.0)
    out.sum().backward()
    torch.testing.assert_close(active.grad, torch.ones(3, 4))


def test_protect_leaves_the_callers_tensor_alone(backends):
    backend, _ = backends(2)
    x = torch.tensor([0.1, -2.0], dtype=torch.float64)
    backend.protect("p1", x, step=0)
    assert x.tolist() == [0.1, -2.0]


def test_empty_tensor(backends):
    backend, wire = backends(2)
    out, shares = round_trip(backend, wire, {p: torch.zeros(0, 4) for p in passive(2)}, torch.zeros(0, 4))
    assert out.shape == (0, 4)
    assert shares["p1"].ciphertexts == ()


# -- packing --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("width", "slots"), [(1, 7), (31, 66), (33, 1), (64, 3)])
def test_packing_round_trip(width, slots):
    rng = np.random.default_rng(width)
    values = rng.integers(0, 2**width - 1, size=100, dtype=np.uint64, endpoint=True)
    packed = packing.pack(values, width, slots)
    assert len(packed) == -(-100 // slots)
    assert packed[0] == sum(int(v) << (j * width) for j, v in enumerate(values[:slots]))
    unpacked = packing.unpack(packed, width, slots)
    np.testing.assert_array_equal(unpacked[:100], values)
    assert not unpacked[100:].any()


@pytest.mark.parametrize("num_passive", [2, 3, 7])
def test_values_per_ciphertext_follow_the_formula(backends, num_passive):
    backend, _ = backends(num_passive)
    width, slots = backend.layout()
    assert width == 12 + 16 + 1 + math.ceil(math.log2(num_passive + 1))
    assert slots == expected_slots(num_passive)
    share = backend.protect("p1", torch.zeros(5, 41), step=0)
    assert len(share.ciphertexts) == -(-205 // slots)
    assert share.wire_nbytes() == len(share.ciphertexts) * CT_BYTES


def test_unpacked_layout_is_one_value_per_ciphertext():
    backend, wire = Paillier(pack=False, workers=1), Wire()
    backend.setup(make_parties(2), "a", wire)
    assert backend.layout()[1] == 1
    xs = {p: torch.tensor([[0.25, -3.5, 7.0]]) for p in passive(2)}
    out, shares = round_trip(backend, wire, xs, torch.zeros(1, 3))
    assert len(shares["p1"].ciphertexts) == 3
    torch.testing.assert_close(out, torch.tensor([[0.5, -7.0, 14.0]]))


@pytest.mark.slow
def test_parallel_and_serial_decode_identically(backends):
    serial, wire = backends(2)
    parallel = Paillier(workers=2)
    parallel.setup(make_parties(2), "a", Wire())
    gen = torch.Generator().manual_seed(7)
    n = (MIN_PARALLEL_CIPHERTEXTS + 2) * parallel.layout()[1] + 5  # enough ciphertexts for the pool
    xs = {p: torch.randn(n, generator=gen, dtype=torch.float64) * 50 for p in passive(2)}
    try:
        out_parallel, shares = round_trip(parallel, parallel.wire, xs, torch.zeros(n, dtype=torch.float64))
        assert parallel._pool is not None, "the pool should have encrypted these"
        assert len(set(shares["p1"].ciphertexts)) == len(shares["p1"].ciphertexts)  # fresh randomness per chunk
    finally:
        parallel.close()
    assert parallel._pool is None
    out_serial, _ = round_trip(serial, wire, xs, torch.zeros(n, dtype=torch.float64))
    torch.testing.assert_close(out_parallel, out_serial, rtol=0, atol=0)


@pytest.mark.slow
def test_pool_is_shut_down_when_the_backend_is_collected():
    backend = Paillier(workers=2)
    backend.setup(make_parties(1), "a", Wire())
    backend.protect("p1", torch.zeros(MIN_PARALLEL_CIPHERTEXTS * backend.layout()[1]), step=0)
    pool = backend._pool
    assert pool is not None
    del backend
    gc.collect()
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(int)


def worker_view() -> tuple[int, int, list[str]]:
    """Runs inside a pool worker: its pid, how many PaillierPrivateKey objects it holds, and the SHA-256 of every
    ~1024-bit integer (the size of the secret primes) reachable from its tracked objects."""
    import hashlib
    import os
    import warnings

    warnings.simplefilter("ignore")  # touching every object trips deprecation shims (torch.distributed.reduce_op)
    keys = 0
    digests = set()
    for obj in gc.get_objects():
        if type(obj).__name__ == "PaillierPrivateKey":
            keys += 1
        for ref in gc.get_referents(obj):
            is_integer = isinstance(ref, int) or type(ref).__name__ == "mpz"
            if is_integer and 1000 <= int(ref).bit_length() <= 1100:
                digests.add(hashlib.sha256(str(int(ref)).encode()).hexdigest())
    return os.getpid(), keys, sorted(digests)


@pytest.mark.slow
def test_pool_workers_never_hold_the_secret_key():
    """The pool starts after key generation (it is lazy), yet no worker may hold the key object or its primes."""
    import hashlib
    import os

    backend = Paillier(workers=2)
    backend.setup(make_parties(2), "a", Wire())
    secret = backend._secret_key
    primes = {hashlib.sha256(str(int(v)).encode()).hexdigest() for v in (secret.p, secret.q)}
    _, keys_here, digests_here = worker_view()  # the probe finds them where they are: in this process
    assert keys_here >= 1
    assert primes <= set(digests_here)
    try:
        x = torch.randn(MIN_PARALLEL_CIPHERTEXTS * backend.layout()[1], dtype=torch.float64)
        backend.protect("p1", x, step=0)  # the pool encrypts, as in training
        assert backend._pool is not None
        reports = [future.result() for future in [backend._pool.submit(worker_view) for _ in range(8)]]
        assert os.getpid() not in {pid for pid, _, _ in reports}
        for _, keys, digests in reports:
            assert keys == 0, "a pool worker holds a PaillierPrivateKey"
            assert primes.isdisjoint(digests), "a pool worker holds a secret prime"
        shares = {p: backend.protect(p, x, step=1) for p in ("p1", "p2")}
        assert (backend.combine(torch.zeros_like(x), shares) - 2 * x).abs().max() <= 2 * 2.0**-17
    finally:
        backend.close()


# -- refusals -------------------------------------------------------------------------------------------------------
def test_out_of_range_values_raise_naming_party_and_bound(backends):
    backend, _ = backends(2)
    bound = 2.0**12 - 2.0**-17
    backend.protect("p1", torch.tensor([bound * (1 - 1e-12), -bound * (1 - 1e-12)], dtype=torch.float64), step=0)
    with pytest.raises(ValueError, match=r"party 'p2'.*\|x\| < 4095\.99999"):
        backend.protect("p2", torch.tensor([0.0, -bound], dtype=torch.float64), step=0)


def test_small_keys_are_refused():
    with pytest.raises(ValueError, match="key_size"):
        Paillier(key_size=1024)
    with pytest.raises(ValueError, match="key_size"):
        Paillier(key_size=2100)


def crafted_share(backend: Paillier, slot_value: int, shape: tuple[int, ...]) -> PaillierShare:
    """A share encrypting `slot_value` in every slot, built outside `protect` (as a faulty party could)."""
    width, slots = backend.layout()
    values = np.full(math.prod(shape), slot_value, dtype=np.uint64)
    plaintexts = packing.pack(values, width, slots)
    ciphertexts = encrypt(backend.public_key.n, plaintexts)
    return PaillierShare(tuple(ciphertexts), shape, width, slots, 0, 0, backend.ciphertext_nbytes)


def test_decode_detects_slot_sums_out_of_range(backends):
    backend, _ = backends(2)
    width, slots = backend.layout()
    v = backend.value_bits
    # no carry (2 * 1.5 * 2**v < 2**width) but beyond what two honest encodings can sum to
    shares = {p: crafted_share(backend, 3 << (v - 1), (2 * slots,)) for p in passive(2)}
    with pytest.raises(ValueError, match="overflow"):
        backend.combine(torch.zeros(2 * slots), shares)
    # full slots carry out of the top slot
    shares = {p: crafted_share(backend, (1 << width) - 1, (slots,)) for p in passive(2)}
    with pytest.raises(ValueError, match="overflow"):
        backend.combine(torch.zeros(slots), shares)


def test_decode_detects_too_little_headroom(backends, monkeypatch):
    backend, wire = backends(3)
    width, slots = backend.layout()
    monkeypatch.setattr(Paillier, "layout", lambda self: (backend.value_bits, slots))  # no headroom bits
    near_max = torch.full((slots,), 4095.0)
    with pytest.raises(ValueError, match="overflow"):
        round_trip(backend, wire, {p: near_max for p in passive(3)}, torch.zeros(slots))


def test_missing_or_unknown_share_raises_naming_party(backends):
    backend, _ = backends(3)
    x = torch.ones(2)
    shares = {p: backend.protect(p, x, step=0) for p in passive(3)}
    with pytest.raises(ValueError, match=r"missing \['p2'\]"):
        backend.combine(x, {k: v for k, v in shares.items() if k != "p2"})
    with pytest.raises(ValueError, match=r"unknown \['p9'\]"):
        backend.combine(x, {**shares, "p9": shares["p1"]})
    with pytest.raises(ValueError, match="'p9' is not a passive party"):
        backend.protect("p9", x, step=0)


def test_shares_must_agree_in_shape_and_step(backends):
    backend, _ = backends(2)
    shares = {"p1": backend.protect("p1", torch.ones(2, 3), step=0), "p2": backend.protect("p2", torch.ones(3, 2), 0)}
    with pytest.raises(ValueError, match=r"'p2' has shape \(3, 2\)"):
        backend.combine(torch.zeros(2, 3), shares)
    shares["p2"] = backend.protect("p2", torch.ones(2, 3), step=1)
    with pytest.raises(ValueError, match="'p2' is for step 1"):
        backend.combine(torch.zeros(2, 3), shares)


def test_coordinator_must_not_clash_with_a_party():
    parties = make_parties(2)
    Paillier(workers=1).setup([*parties, PartySpec("coordinator", "coordinator", ())], "a", Wire())
    with pytest.raises(ValueError, match="coordinator"):
        Paillier(workers=1, coordinator="p1").setup(parties, "a", Wire())
    with pytest.raises(ValueError, match="coordinator"):
        Paillier(workers=1).setup([*parties, PartySpec("helper", "coordinator", ())], "a", Wire())


# -- the ledger -----------------------------------------------------------------------------------------------------
def test_ledger_matches_the_analytic_formula():
    num_passive, shape = 3, (4, 50)
    backend, wire = Paillier(workers=1), Wire()
    backend.setup(make_parties(num_passive), "a", wire)
    assert wire.bytes_by_tag() == {"keys": (num_passive + 1) * KEY_BYTES}  # n only: each passive party makes its h_s
    cts = -(-math.prod(shape) // expected_slots(num_passive))
    xs = {p: torch.randn(shape) for p in passive(num_passive)}
    round_trip(backend, wire, xs, torch.zeros(shape))

    assert wire.bytes_by_tag() == {
        "keys": (num_passive + 1) * KEY_BYTES,
        "embeddings": num_passive * cts * CT_BYTES,
        "he_aggregate": cts * CT_BYTES,
        "he_decrypted": cts * KEY_BYTES,
    }
    into_coordinator = {k: n for k, n in wire.messages.items() if k[1] == "coordinator"}
    assert into_coordinator == {("a", "coordinator", "he_aggregate"): 1}
    assert not any(src in passive(num_passive) and dst == "coordinator" for src, dst, _ in wire.bytes)
    out_of_coordinator = {(dst, tag) for src, dst, tag in wire.messages if src == "coordinator"}
    assert out_of_coordinator == {("a", "keys"), ("a", "he_decrypted")} | {(p, "keys") for p in passive(num_passive)}


def test_coordinator_sees_only_masked_plaintexts():
    """What reaches the coordinator decrypts to m + r mod n with fresh r: two runs on equal inputs differ."""
    backend, wire = Paillier(workers=1), Wire()
    backend.setup(make_parties(2), "a", wire)
    seen = []
    wire.subscribe(lambda src, dst, tag, payload: seen.append(payload) if tag == "he_decrypted" else None)
    xs = {p: torch.zeros(3) for p in passive(2)}
    for step in range(2):
        round_trip(backend, wire, xs, torch.zeros(3), step=step)
    unmasked = packing.pack(np.full(3, 2 << (backend.value_bits - 1), dtype=np.uint64), *backend.layout())[0]
    masked = [int.from_bytes(p, "big") for p in seen]
    assert len(set(masked)) == 2
    assert unmasked not in masked
    assert all(len(p) == KEY_BYTES for p in seen)


# -- secrets --------------------------------------------------------------------------------------------------------
def secret_encodings(backend: Paillier) -> list[bytes]:
    secret = backend._secret_key
    out = []
    for value in (secret.p, secret.q, secret.hp, secret.hq):
        size = (value.bit_length() + 7) // 8
        out += [value.to_bytes(size, "big"), value.to_bytes(size, "little")]
    return out


@pytest.mark.slow
def test_secret_key_is_not_in_state_dict_pickles_or_copies():
    backend = Paillier(workers=2)
    backend.setup(make_parties(2), "a", Wire())
    backend.protect("p1", torch.zeros(MIN_PARALLEL_CIPHERTEXTS * backend.layout()[1]), step=0)  # starts the pool
    try:
        secrets_ = secret_encodings(backend)
        state = backend.state_dict()
        assert state == {"key_size": 2048, "frac_bits": 16, "int_bits": 12, "pack": True}
        blob = pickle.dumps(backend)
        assert not any(s in blob for s in secrets_)
        assert str(backend._secret_key.p) not in repr(state)
        restored_from_pickle = pickle.loads(blob)  # noqa: S301 - our own bytes
        for restored in (restored_from_pickle, copy.copy(backend), copy.deepcopy(backend)):
            assert restored._secret_key is None
            assert restored._pool is None
            assert restored._fixed_base == {}
            with pytest.raises(RuntimeError, match="setup"):
                restored.protect("p1", torch.zeros(2), step=0)
        fresh = Paillier()
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state
    finally:
        backend.close()


def test_load_state_dict_keeps_keys_and_refuses_other_settings(backends):
    """A checkpoint loaded after setup must keep the keys and this run's settings (say frac_bits from the CLI)."""
    backend, wire = backends(2)
    state = backend.state_dict()
    backend.load_state_dict(state)
    out, _ = round_trip(backend, wire, {p: torch.tensor([1.5]) for p in passive(2)}, torch.zeros(1))
    torch.testing.assert_close(out, torch.tensor([3.0]))  # keys still live
    for key, other in [("frac_bits", 20), ("int_bits", 8), ("key_size", 3072), ("pack", False)]:
        with pytest.raises(ValueError, match=rf"{key}={other!r} in the checkpoint but {state[key]!r} in this run"):
            backend.load_state_dict({**state, key: other})
    assert backend.state_dict() == state


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_round_trip(backends):
    backend, wire = backends(2)
    xs = {p: torch.tensor([1.5, -2.0], device="cuda") for p in passive(2)}
    out, _ = round_trip(backend, wire, xs, torch.zeros(2, device="cuda"))
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), torch.tensor([3.0, -4.0]))


# -- fixed-base encryption ------------------------------------------------------------------------------------------
def test_each_passive_party_derives_its_own_fixed_base_and_none_is_sent():
    """h_s comes from n alone at each passive party: the keys message is n (256 bytes) per party, nothing more."""
    backend, wire = Paillier(workers=1), Wire()
    payloads = []
    wire.subscribe(lambda src, dst, tag, payload: payloads.append((src, dst, tag, payload)))
    backend.setup(make_parties(3), "a", wire)
    assert wire.bytes_by_tag() == {"keys": 4 * KEY_BYTES}
    assert [(dst, len(payload)) for _, dst, _, payload in payloads] == [(p, KEY_BYTES) for p in ["a", *passive(3)]]
    n = backend.public_key.n
    bases = [backend.fixed_base(p) for p in passive(3)]
    assert len({b.h_s for b in bases}) == 3  # one fresh h_s per party
    for base in bases:
        assert base.n == n
        assert base.exponent_bits == 448
        assert crypto.check_fixed_base(n, base.h_s) == base.h_s
        assert base.h_s.to_bytes(CT_BYTES, "big") not in b"".join(payload for *_, payload in payloads)
    with pytest.raises(ValueError, match="not a passive party"):
        backend.fixed_base("a")


def test_table_is_built_once_a_party_has_encrypted_enough():
    backend, wire = Paillier(workers=1), Wire()
    backend.setup(make_parties(2), "a", wire)
    slots = backend.layout()[1]
    secret = backend._secret_key
    few = torch.linspace(-3, 3, (TABLE_AFTER // 2) * slots, dtype=torch.float64)
    share = backend.protect("p1", few, step=0)
    assert len(share.ciphertexts) == TABLE_AFTER // 2
    assert not backend.fixed_base("p1").rows  # a plain powmod of h_s below TABLE_AFTER ciphertexts
    share = backend.protect("p1", few, step=1)  # reaches TABLE_AFTER: this call builds and uses the table
    table = backend.fixed_base("p1")
    assert (len(table.rows), table.window) == (56, 8)
    assert not backend.fixed_base("p2").rows  # per party
    # both kinds of ciphertext decode to the same slots
    plain = [crypto.decrypt(secret, c) for c in share.ciphertexts]
    width, _ = backend.layout()
    decoded = packing.unpack(plain, width, slots)[: few.numel()].astype(np.int64) - (1 << (backend.value_bits - 1))
    np.testing.assert_array_equal(decoded, np.round(few.numpy() * 2**16).astype(np.int64))
    out, _ = round_trip(backend, wire, {p: few for p in passive(2)}, torch.zeros_like(few), step=3)
    assert (out - 2 * few).abs().max() <= 2 * 2.0**-17


@pytest.mark.slow
def test_pool_and_in_process_ciphertexts_use_the_fixed_base(monkeypatch):
    """Every ciphertext, from the pool or not, is (1 + m n) h_s**r with the party's own h_s and a fresh 448-bit r."""
    drawn: list[int] = []
    real = crypto.short_exponents

    def recording(bits: int, count: int) -> list[int]:
        assert bits == 448
        out = real(bits, count)
        drawn.extend(out)
        return out

    monkeypatch.setattr(crypto, "short_exponents", recording)
    backend = Paillier(workers=2)
    backend.setup(make_parties(2), "a", Wire())
    try:
        n, secret = backend.public_key.n, backend._secret_key
        h_s = backend.fixed_base("p1").h_s
        for count in (3, MIN_PARALLEL_CIPHERTEXTS + 1):  # in-process, then in the pool
            drawn.clear()
            plaintexts = list(range(1, count + 1))
            cts = backend._encrypt("p1", plaintexts)
            assert [crypto.decrypt(secret, c) for c in cts] == plaintexts
            assert len(drawn) == count
            for m, r, c in zip(plaintexts, drawn, cts, strict=True):
                assert c == (1 + m * n) * gmpy2.powmod(h_s, r, n * n) % (n * n)
        assert backend._pool is not None
    finally:
        backend.close()
