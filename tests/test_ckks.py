"""CKKS aggregation: sums against a plain float reference within the stated bound, packing, parameter checks,
the exact ledger (the coordinator only ever sees the masked aggregate), and secrets kept out of checkpoints.

The pure functions of `lvfl.crypto.ckks` are held to independent references at the end: SEAL's own security table
and parameter check, measured TenSEAL decryption errors, and a Monte-Carlo distinguisher.
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import warnings

import numpy as np
import pytest
import tenseal as ts
import tenseal.sealapi as seal  # SEAL's own API, bound by TenSEAL: the independent reference for the table
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lvfl.crypto import ckks
from lvfl.crypto.ckks import CKKSParameters, masking_advantage
from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.ckks import CKKS, CKKSShare
from lvfl.wire import Wire

SLOTS = 4096  # N / 2 at the default N = 8192


def make_parties(k: int) -> list[PartySpec]:
    return [PartySpec("a", "active", (1,))] + [PartySpec(f"p{i}", "passive", (1,), i) for i in range(1, k + 1)]


def set_up(k: int, **kwargs) -> tuple[CKKS, Wire]:
    backend, wire = CKKS(**kwargs), Wire()
    backend.setup(make_parties(k), "a", wire)
    return backend, wire


@pytest.fixture(scope="module")
def three() -> tuple[CKKS, Wire]:
    """One default backend with three passive parties, set up once for the module (setup makes keys)."""
    return set_up(3)


def passive_names(backend: CKKS) -> list[str]:
    return [p.name for p in backend.parties if p.role == "passive"]


# -- sums against the plain float sum --------------------------------------------------------------------------
@pytest.mark.parametrize("k", range(1, 11))
def test_sum_matches_plain_float_sum_within_bound(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    shape = (int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(1, 300, (1,), generator=gen)))
    backend, _ = set_up(k)
    xs = {p: 4 * torch.randn(shape, generator=gen, dtype=torch.float64) for p in passive_names(backend)}
    active = torch.randn(shape, generator=gen, dtype=torch.float64)
    shares = {p: backend.protect(p, x, step=0) for p, x in xs.items()}
    out = backend.combine(active, shares)
    reference = active + sum(xs.values())
    bound = backend.error_bound()
    assert bound == backend.error_bound(k) < 2e-6 * k
    assert (out - reference).abs().max().item() <= bound
    assert out.dtype == torch.float64
    assert out.shape == active.shape


def test_sum_across_several_ciphertexts_keeps_dtype_and_gradient(three) -> None:
    backend, _ = three
    gen = torch.Generator().manual_seed(0)
    xs = {p: torch.randn(3, 4097, generator=gen) for p in passive_names(backend)}  # 12291 values: 4 ciphertexts
    active = torch.randn(3, 4097, generator=gen, requires_grad=True)
    shares = {p: backend.protect(p, x, step=0) for p, x in xs.items()}
    assert all(s.num_ciphertexts == 4 for s in shares.values())
    out = backend.combine(active, shares)
    assert out.dtype == torch.float32
    reference = active.double() + sum(x.double() for x in xs.values())
    float32_rounding = reference.abs().max().item() * 2.0**-24
    assert (out.double() - reference).abs().max().item() <= backend.error_bound() + float32_rounding
    out.sum().backward()
    assert torch.equal(active.grad, torch.ones_like(active))


def test_combine_has_no_weights_and_needs_no_middle_prime() -> None:
    """Weighted sums are weighted before `protect` (lvfl.privacy.aggregation.base), so combine takes no weights and a
    chain without a middle prime (no rescale) serves every sum."""
    assert "weights" not in inspect.signature(CKKS.combine).parameters
    # headroom 2**13 (see the module docstring): only a small mask fits, so a small max_abs too
    no_rescale, _ = set_up(2, poly_modulus_degree=4096, coeff_mod_bit_sizes=(54, 55), mask_bound=2.0**12, max_abs=1.0)
    shares = {p: no_rescale.protect(p, torch.ones(2), step=0) for p in ("p1", "p2")}
    out = no_rescale.combine(torch.zeros(2, dtype=torch.float64), shares)
    assert (out - 2).abs().max().item() <= no_rescale.error_bound()


# -- packing ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (SLOTS,), (SLOTS + 1,), (128, 128), (3, 5, 7), (0, 4)])
def test_ciphertext_count_is_ceil_numel_over_slots(three, shape: tuple[int, ...]) -> None:
    backend, _ = three
    share = backend.protect("p1", torch.zeros(shape), step=0)
    expected = math.ceil(math.prod(shape) / SLOTS)
    assert share.num_ciphertexts == len(share.vectors) == backend.num_ciphertexts(shape) == expected
    assert all(v.size() <= SLOTS for v in share.vectors)
    assert share.wire_nbytes() == sum(len(v.serialize()) for v in share.vectors)


def test_row_packing_uses_one_ciphertext_per_row() -> None:
    backend, _ = set_up(2, packing="row")
    x = torch.randn(5, 7, dtype=torch.float64)
    shares = {p: backend.protect(p, x, step=0) for p in ("p1", "p2")}
    assert shares["p1"].num_ciphertexts == len(shares["p1"].vectors) == 5
    out = backend.combine(torch.zeros_like(x), shares)
    assert (out - 2 * x).abs().max().item() <= backend.error_bound()


# -- parameters -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"coeff_mod_bit_sizes": (60, 60, 60, 60, 60)}, r"coeff_mod_bit_sizes.*total 300 bits exceeds the 218-bit"),
        (
            {"poly_modulus_degree": 4096, "coeff_mod_bit_sizes": (60, 40, 40, 60)},
            r"coeff_mod_bit_sizes.*total 200 bits exceeds the 109-bit",
        ),
        (
            {"security_bits": 192, "coeff_mod_bit_sizes": (60, 40, 40, 60)},
            r"coeff_mod_bit_sizes.*total 200 bits exceeds the 152-bit bound for 192-bit",
        ),
        ({"security_bits": 192}, r"coeff_mod_bit_sizes.*total 160 bits exceeds the 152-bit bound for 192-bit"),
        ({"security_bits": 80}, r"security_bits"),
        ({"poly_modulus_degree": 3000}, r"poly_modulus_degree.*power of two"),
        ({"poly_modulus_degree": 65536}, r"poly_modulus_degree"),
        ({"coeff_mod_bit_sizes": (60,)}, r"coeff_mod_bit_sizes.*at least 2 primes"),
        ({"coeff_mod_bit_sizes": (60, 30, 40, 60)}, r"middle primes must equal scale_bits=40"),
        ({"coeff_mod_bit_sizes": (40, 40, 60)}, r"first prime \(40 bits\) must exceed scale_bits=40"),
        ({"coeff_mod_bit_sizes": (60, 40, 40, 50)}, r"special\) prime"),
        ({"mask_bound": 0.0}, r"mask_bound"),
        ({"max_abs": float("inf")}, r"max_abs"),
        ({"max_abs": 2.0**30}, r"max_abs=1.07374e\+09 >= mask_bound=1.07374e\+09.*allow_insecure=True"),
        ({"mask_bound": 1.0}, r"max_abs=128 >= mask_bound=1.*allow_insecure=True"),
        ({"max_advantage": 0.0}, r"max_advantage"),
        ({"max_advantage": 2.0}, r"max_advantage"),
        ({"packing": "diagonal"}, r"packing"),
    ],
)
def test_weak_or_inconsistent_parameters_raise_naming_the_option(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CKKS(**kwargs)


def test_stronger_security_levels_accept_parameters_within_their_bound() -> None:
    assert CKKS(security_bits=192, coeff_mod_bit_sizes=(50, 40, 60)).security_bits == 192
    assert CKKS(security_bits=256, poly_modulus_degree=16384, coeff_mod_bit_sizes=(60, 40, 40, 60)).slots == 8192


def test_headroom_too_small_for_the_parties_raises() -> None:
    backend = CKKS(poly_modulus_degree=4096, coeff_mod_bit_sizes=(54, 55))  # headroom 2**13
    with pytest.raises(ValueError, match="headroom"):
        backend.setup(make_parties(8), "a", Wire())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 2.0**10 + 1])
def test_nan_inf_and_out_of_range_values_raise_naming_the_party(three, bad: float) -> None:
    backend, _ = three
    with pytest.raises(ValueError, match="party 'p2'"):
        backend.protect("p2", torch.tensor([0.0, bad]), step=0)


# -- the wire -------------------------------------------------------------------------------------------------
def test_ledger_coordinator_sees_only_the_masked_aggregate() -> None:
    backend, wire = set_up(3)
    names = passive_names(backend)
    key_bytes = len(backend.public_context_bytes)
    assert dict(wire.bytes) == {("coordinator", p, "keys"): key_bytes for p in ["a", *names]}
    assert wire.total_messages() == 4

    inbox: list = []
    wire.subscribe(lambda src, dst, tag, payload: inbox.append((src, tag, payload)) if dst == "coordinator" else None)
    wire.reset()
    xs = {p: torch.randn(128, 128) for p in names}
    shares = {p: wire.send(p, "a", backend.protect(p, x, step=0), tag="embeddings") for p, x in xs.items()}
    backend.combine(torch.zeros(128, 128), shares)

    into_coordinator = {k: n for k, n in wire.messages.items() if k[1] == "coordinator"}
    assert into_coordinator == {("a", "coordinator", "he_aggregate"): 1}
    [(src, tag, aggregate)] = inbox
    assert isinstance(aggregate, CKKSShare)
    assert aggregate.num_ciphertexts == 4
    assert not {id(v) for v in aggregate.vectors} & {id(v) for s in shares.values() for v in s.vectors}
    for p in names:
        assert wire.bytes[(p, "a", "embeddings")] == sum(len(v.serialize()) for v in shares[p].vectors)
        assert wire.bytes[(p, "a", "embeddings")] > 4 * 200_000  # 4 real ciphertexts, not a placeholder size
    assert wire.bytes[("a", "coordinator", "he_aggregate")] == aggregate.wire_nbytes()
    assert wire.bytes[("coordinator", "a", "he_decrypted")] == 8 * 128 * 128
    assert set(wire.bytes_by_tag()) == {"embeddings", "he_aggregate", "he_decrypted"}


def test_parties_hold_only_public_contexts(three) -> None:
    backend, _ = three
    assert backend._secret_context.is_private()
    for party, context in backend._contexts.items():
        assert not context.is_private(), party
        assert not context.has_galois_keys()
        assert not context.has_relin_keys()
    assert not ts.context_from(backend.public_context_bytes).is_private()


def test_secret_key_never_in_state_dict_pickle_or_copies(three) -> None:
    backend, _ = three
    state = backend.state_dict()
    assert all(isinstance(v, str | int | float | list) for v in state.values())
    blob = pickle.dumps(backend)
    assert len(blob) < 4096  # a CKKS secret key alone serializes to ~100 KB at N=8192
    for restored in (pickle.loads(blob), copy.copy(backend), copy.deepcopy(backend)):  # noqa: S301 - our own bytes
        assert restored._secret_context is None
        assert restored._secret_key is None
        assert restored._contexts is None
        with pytest.raises(RuntimeError, match="setup"):
            restored.protect("p1", torch.ones(2), step=0)
    assert backend._secret_context is not None  # the original keeps its keys
    fresh = CKKS()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state


def test_load_state_dict_keeps_live_keys_and_refuses_other_settings(three) -> None:
    """A checkpoint loaded after setup (lvfl test --ckpt_path) must not drop the keys nor change the settings."""
    backend, _ = three
    state = backend.state_dict()
    backend.load_state_dict(state)
    out = backend.combine(
        torch.zeros(2, dtype=torch.float64), {p: backend.protect(p, torch.ones(2), 0) for p in passive_names(backend)}
    )
    assert (out - 3).abs().max().item() <= backend.error_bound()  # keys still live
    for key, other in [
        ("mask_bound", 2.0**31),
        ("scale_bits", 30),
        ("max_abs", 1.0),
        ("coeff_mod_bit_sizes", [60, 40, 40, 60]),
    ]:
        with pytest.raises(ValueError, match=rf"{key}=.* in the checkpoint but .* in this run") as err:
            backend.load_state_dict({**state, key: other})
        assert repr(other) in str(err.value)
        assert repr(state[key]) in str(err.value)
    with pytest.raises(ValueError, match=r"unknown backend settings \['colour'\]"):
        backend.load_state_dict({**state, "colour": "blue"})
    assert backend.state_dict() == state
    backend.load_state_dict({})  # an older checkpoint without settings: nothing to compare


# -- statistical hiding: the stated bound, enforced, and a distinguisher held to it ------------------------------
def test_advantage_bound_is_the_exact_statistical_distance() -> None:
    """1 - (1 - d/2M)**n, checked against the overlap of two shifted uniform boxes computed independently."""
    for n, d, m in [(1, 1.0, 4.0), (3, 0.5, 1.0), (64, 2.0, 2.0**10), (16384, 768.0, 2.0**30)]:
        overlap = math.prod([(2 * m - d) / (2 * m)] * n)  # volume of the boxes' intersection over a box's volume
        assert masking_advantage(n, d, m) == pytest.approx(1 - overlap, rel=1e-9, abs=1e-15)
    assert masking_advantage(5, 10.0, 4.0) == 1.0  # shifted past each other: no overlap
    assert masking_advantage(0, 1.0, 1.0) == masking_advantage(5, 0.0, 1.0) == 0.0
    backend = CKKS()
    assert backend.advantage_bound(16384, num_parties=3) == pytest.approx(
        -math.expm1(16384 * math.log1p(-3 * 2.0**-23))
    )
    assert backend.advantage_bound(16384, num_parties=3) < backend.max_advantage == 0.01
    assert backend.advantage_bound(64 * 8, num_parties=3) < 2e-4


def test_refusals_name_the_options_and_allow_insecure_warns() -> None:
    with pytest.raises(ValueError, match=r"3 passive parties x max_abs=128 >= mask_bound=256.*allow_insecure"):
        set_up(3, mask_bound=256.0)
    backend, _ = set_up(3, mask_bound=2.0**20)  # per value 3 * 128 / 2**20: fine for few values, not for many
    shares = {p: backend.protect(p, torch.ones(8), 0) for p in passive_names(backend)}
    backend.combine(torch.zeros(8), shares)
    shares = {p: backend.protect(p, torch.ones(64, 64), 1) for p in passive_names(backend)}
    with pytest.raises(
        ValueError, match=r"4096 values.*above max_advantage=0.01 \(mask_bound=1.04858e\+06, max_abs=128"
    ):
        backend.combine(torch.zeros(64, 64), shares)
    with pytest.warns(UserWarning, match="allow_insecure=True"):
        loose = CKKS(mask_bound=1.0, max_abs=2.0, allow_insecure=True)
    with pytest.warns(UserWarning, match=r"max_abs=2 >= mask_bound=1.*allow_insecure=True"):
        loose.setup(make_parties(2), "a", Wire())
    shares = {p: loose.protect(p, torch.ones(4), 0) for p in ("p1", "p2")}
    with pytest.warns(UserWarning, match="max_advantage"):
        out = loose.combine(torch.zeros(4, dtype=torch.float64), shares)
    assert (out - 2).abs().max().item() <= loose.error_bound()


def coordinator_views(backend: CKKS, passive_sum: float, trials: int, numel: int) -> list[torch.Tensor]:
    """What the coordinator decrypts in `trials` combines whose passive values sum to `passive_sum` per value."""
    seen: list[torch.Tensor] = []
    handle = backend.wire.subscribe(
        lambda src, dst, tag, payload: seen.append(payload) if tag == "he_decrypted" else None
    )
    names = passive_names(backend)
    x = torch.full((numel,), passive_sum / len(names), dtype=torch.float64)
    for _ in range(trials):
        backend.combine(torch.zeros(numel, dtype=torch.float64), {p: backend.protect(p, x, 0) for p in names})
    backend.wire.unsubscribe(handle)
    return seen


def measured_advantages(backend: CKKS, trials: int, numel: int, *guesses) -> list[float]:
    """P(guess 1 | sum 1) - P(guess 1 | sum 0) over `trials` combines each, per distinguisher: empirical advantages."""
    ones = coordinator_views(backend, 1.0, trials, numel)
    zeros = coordinator_views(backend, 0.0, trials, numel)
    return [(sum(map(guess, ones)) - sum(map(guess, zeros))) / trials for guess in guesses]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kwargs", "insecure"),
    [
        ({}, False),  # the defaults: the bound is ~1e-7, the distinguisher gets nothing beyond sampling noise
        ({"mask_bound": 2.0**-3, "max_abs": 0.5}, True),  # negative control: a tiny mask, told apart every time
        ({"mask_bound": 45.0, "max_abs": 0.5}, True),  # in between: the support test reaches the exact bound
    ],
)
def test_coordinator_distinguisher_stays_within_the_stated_bound(kwargs, insecure) -> None:
    """The coordinator guesses whether the passive values sum to 0 or 1 from what it decrypts.

    Two distinguishers: the audit's (empirical mean above 0.5) and the optimal one for uniform masks (a decrypted
    value above M can only come from sum 1). Neither may beat `advantage_bound` by more than sampling error.
    """
    trials, numel = 150, 32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend, _ = set_up(2, allow_insecure=insecure, **kwargs)
        m = backend.mask_bound
        # the bound for sums 0 vs 1 (|S - S'| = 1 per value), and the worst case for sums in range
        bound = masking_advantage(numel, 1.0, m)
        assert bound <= backend.advantage_bound(numel)
        mean, support = measured_advantages(
            backend, trials, numel, lambda v: float(v.mean()) > 0.5, lambda v: bool((v > m).any())
        )
    slack = 4 * math.sqrt(0.5 / trials)  # 4 standard deviations of a difference of two proportions (p = 1/2)
    assert mean <= bound + slack
    assert support <= bound + slack
    if not kwargs:
        assert bound < 1e-6
        assert abs(mean) <= slack
    elif m < 1:
        assert bound == 1.0
        assert mean == support == 1.0  # the negative control: a distinguisher that works, caught by the bound
    else:
        assert 0.2 < bound < 0.4
        assert support >= bound - slack  # the bound is tight: the optimal test achieves it


# -- errors in combine ----------------------------------------------------------------------------------------
def test_missing_or_unknown_share_raises_naming_the_party(three) -> None:
    backend, _ = three
    shares = {p: backend.protect(p, torch.ones(3), step=0) for p in passive_names(backend)}
    with pytest.raises(ValueError, match=r"missing \['p2'\], unknown \[\]"):
        backend.combine(torch.zeros(3), {p: s for p, s in shares.items() if p != "p2"})
    with pytest.raises(ValueError, match=r"missing \[\], unknown \['eve'\]"):
        backend.combine(torch.zeros(3), {**shares, "eve": shares["p1"]})
    with pytest.raises(ValueError, match="share of party 'p1' has shape"):
        backend.combine(torch.zeros(4), shares)
    with pytest.raises(TypeError, match="share of party 'p3'"):
        backend.combine(torch.zeros(3), {**shares, "p3": torch.ones(3)})
    with pytest.raises(ValueError, match="'eve' is not a passive party"):
        backend.protect("eve", torch.ones(3), step=0)


def test_stale_shares_and_corrupted_decryption_raise() -> None:
    backend, _ = set_up(2)
    old = {p: backend.protect(p, torch.ones(3), step=0) for p in ("p1", "p2")}
    backend.setup(make_parties(2), "a", Wire())  # fresh keys
    with pytest.raises(ValueError, match="share of party 'p1' was encrypted under another key"):
        backend.combine(torch.zeros(3), old)
    shares = {p: backend.protect(p, torch.ones(3), step=0) for p in ("p1", "p2")}
    other = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=list(backend.coeff_mod_bit_sizes), n_threads=1)
    backend._secret_key = other.secret_key()  # the coordinator decrypts with the wrong key
    with pytest.raises(RuntimeError, match="corrupted"):
        backend.combine(torch.zeros(3), shares)


def test_coordinator_must_be_a_separate_party() -> None:
    with pytest.raises(ValueError, match="coordinator 'p1' is the passive party"):
        CKKS(coordinator="p1").setup(make_parties(2), "a", Wire())
    parties = [*make_parties(2), PartySpec("coordinator", "coordinator", (1,))]
    CKKS().setup(parties, "a", Wire())  # listed with its own role: fine


# -- lvfl.crypto.ckks: the pure functions against independent references ---------------------------------------
SEAL_LEVELS = {128: seal.SEC_LEVEL_TYPE.TC128, 192: seal.SEC_LEVEL_TYPE.TC192, 256: seal.SEC_LEVEL_TYPE.TC256}


def valid_chain(total_bits: int) -> tuple[tuple[int, ...], int]:
    """Primes totalling `total_bits` that meet the chain rules (first > scale, middle = scale, special largest)."""
    scale = min(30, total_bits // 2 - 1)
    middle = max(0, math.ceil((total_bits - 120) / scale))
    rest = total_bits - middle * scale
    first = rest // 2
    return (first, *[scale] * middle, rest - first), scale


def seal_accepts(n: int, sizes: tuple[int, ...], security_bits: int) -> bool:
    """SEAL's own verdict on a CKKS parameter set at a security level (its HomomorphicEncryption.org check)."""
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(n)
    parms.set_coeff_modulus(seal.CoeffModulus.Create(n, list(sizes)))
    return seal.SEALContext(parms, True, SEAL_LEVELS[security_bits]).parameters_set()


@pytest.mark.parametrize("security_bits", sorted(SEAL_LEVELS))
def test_security_table_is_seals(security_bits: int) -> None:
    table = ckks.MAX_COEFF_MODULUS_BITS[security_bits]
    assert sorted(table) == [1024, 2048, 4096, 8192, 16384, 32768]
    for n, bound in table.items():
        assert bound == seal.CoeffModulus.MaxBitCount(n, SEAL_LEVELS[security_bits]), n


@pytest.mark.slow
@pytest.mark.parametrize("security_bits", sorted(SEAL_LEVELS))
@pytest.mark.parametrize("n", [4096, 8192, 16384, 32768])  # below 4096 SEAL finds no NTT primes this small
def test_parameters_accept_exactly_what_seal_accepts_at_the_bound(security_bits: int, n: int) -> None:
    bound = ckks.MAX_COEFF_MODULUS_BITS[security_bits][n]
    sizes, scale = valid_chain(bound)
    assert sum(sizes) == bound
    assert seal_accepts(n, sizes, security_bits)
    params = CKKSParameters(n, sizes, scale, security_bits)
    assert (params.poly_modulus_degree, params.coeff_mod_bit_sizes) == (n, sizes)
    over, scale = valid_chain(bound + 1)
    assert not seal_accepts(n, over, security_bits)
    with pytest.raises(ValueError, match=rf"total {bound + 1} bits exceeds the {bound}-bit bound for {security_bits}"):
        CKKSParameters(n, over, scale, security_bits)


def test_tenseal_refuses_one_bit_over_the_bound_too() -> None:
    sizes, scale = valid_chain(109)
    ckks.secret_context(CKKSParameters(4096, sizes, scale))
    over, _ = valid_chain(110)
    with pytest.raises(ValueError, match="encryption parameters are not set correctly"):
        ts.context(ts.SCHEME_TYPE.CKKS, 4096, coeff_mod_bit_sizes=list(over))


def test_parameters_are_frozen_normalized_and_refuse_bools() -> None:
    params = CKKSParameters(np.int64(8192), [60, np.int32(40), 60], np.int16(40))
    assert params == CKKSParameters()
    assert hash(params) == hash(CKKSParameters())
    assert params.coeff_mod_bit_sizes == (60, 40, 60)
    assert all(type(v) is int for v in (params.poly_modulus_degree, params.scale_bits, *params.coeff_mod_bit_sizes))
    with pytest.raises(AttributeError):
        params.scale_bits = 30  # type: ignore[misc]
    assert copy.deepcopy(params) == pickle.loads(pickle.dumps(params)) == params  # noqa: S301 - our own bytes
    for kwargs, option in [
        ({"scale_bits": True}, "scale_bits"),
        ({"poly_modulus_degree": 8192.0}, "poly_modulus_degree"),
        ({"security_bits": True}, "security_bits"),
        ({"coeff_mod_bit_sizes": (60, True, 60)}, "coeff_mod_bit_sizes"),
        ({"scale_bits": 60, "coeff_mod_bit_sizes": (60, 60)}, "scale_bits"),
    ]:
        with pytest.raises(ValueError, match=rf"CKKS\({option}=") as err:
            CKKSParameters(**kwargs)
        assert err.type is ValueError


def test_headroom_is_where_a_decrypted_sum_wraps() -> None:
    """Sums just below `headroom` decrypt exactly; above it they wrap around the first prime (constant vectors make
    the polynomial the constant value x scale, so the threshold is sharp)."""
    params = CKKSParameters(4096, (54, 55), 40)
    limit = ckks.headroom(params)
    assert limit == 2.0**13
    context = ckks.secret_context(params)
    for value, parties in [(0.4999, 2), (0.33, 3), (0.4, 3), (0.49, 3)]:
        vector = ckks.encrypt(context, np.full(8, value * limit))
        decrypted = ckks.decrypt(ckks.masked_sum([[vector]] * parties, [np.zeros(8)]), context.secret_key())
        exact = parties * value * limit
        error = float(np.abs(decrypted - exact).max())
        if exact < limit:
            assert error <= ckks.error_bound(params, parties, value * limit)
        else:
            assert error > limit / 2  # wrapped: off by about 2 x headroom


@pytest.mark.parametrize(
    ("params", "max_abs", "mask_bound"),
    [
        (CKKSParameters(), 2.0**7, 2.0**30),  # the backend's defaults: float64 rounding of the mask dominates
        (CKKSParameters(), 2.0**7, 0.0),  # encryption noise alone
        (CKKSParameters(4096, (54, 55), 40), 1.0, 2.0**12),
        (CKKSParameters(8192, (60, 50, 60), 50), 4.0, 0.0),
    ],
    ids=["defaults", "no-mask", "N4096", "scale50"],
)
@pytest.mark.parametrize("summands", [1, 3])
def test_error_bound_holds_and_is_not_vacuous_on_measured_tenseal_errors(params, max_abs, mask_bound, summands):
    """Encrypt random values at the bound of their range, sum and mask as the backend does, decrypt: every value is
    within `error_bound`, and the worst one within a factor 1000 of it (the bound is not vacuous)."""
    rng = np.random.default_rng(summands)
    numel = 2 * ckks.slots(params) + 5  # three ciphertexts, the last partly filled
    shape = (numel,)
    secret = ckks.secret_context(params)
    public = ckks.load_public_context(ckks.public_context_bytes(secret))
    xs = [rng.uniform(-max_abs, max_abs, numel) for _ in range(summands)]
    xs[0][0] = max_abs  # the extreme of the range, once
    mask = ckks.uniform_mask(numel, mask_bound)
    summed = ckks.masked_sum(
        [[ckks.encrypt(public, c) for c in ckks.chunks(params, x, shape)] for x in xs], ckks.chunks(params, mask, shape)
    )
    assert len(summed) == ckks.num_ciphertexts(params, shape) == 3
    error = float(np.abs(ckks.decrypt(summed, secret.secret_key()) - mask - np.sum(xs, axis=0)).max())
    bound = ckks.error_bound(params, summands, max_abs, mask_bound)
    assert bound / 1000 < error <= bound


def test_error_bound_terms() -> None:
    """The Cheon et al. terms at N = 8192 by hand, and the float64 term scaling with the magnitude."""
    params = CKKSParameters()
    n, sigma = 8192, 3.2
    b_clean = 8 * 2**0.5 * sigma * n + 6 * sigma * n**0.5 + 16 * sigma * (2 * n / 3 * n) ** 0.5
    b_scale = (n / 3) ** 0.5 * (3 + 8 * (2 * n / 3) ** 0.5)
    assert ckks.fresh_noise_bound(params) == pytest.approx(b_clean, rel=1e-12)
    assert ckks.rounding_bound(params) == pytest.approx(b_scale, rel=1e-12)
    assert ckks.error_bound(params, 1, 0.0) == pytest.approx((b_clean + 3 * b_scale) * 2.0**-40, rel=1e-12)
    assert ckks.error_bound(params, 1, 0.0) < 7e-7  # "about 6e-7 per summand" (the module docstring)
    assert ckks.error_bound(params, 3, 128.0, 2.0**30) - ckks.error_bound(params, 3, 0.0) == pytest.approx(
        (3 * 128 + 2**30) * 2.0**-50
    )
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="num_summands"):
            ckks.error_bound(params, bad, 1.0)


def test_masking_advantage_matches_a_monte_carlo_distinguisher() -> None:
    """Sums 0 vs d per value under masks from `uniform_mask`: the optimal test (a value above M can only come from d)
    achieves the stated advantage, up to sampling error."""
    trials, numel, bound, spread = 20_000, 3, 1.0, 0.2
    stated = masking_advantage(numel, spread, bound)
    assert stated == pytest.approx(1 - 0.9**3)
    zero = ckks.uniform_mask(trials * numel, bound).reshape(trials, numel)
    shifted = ckks.uniform_mask(trials * numel, bound).reshape(trials, numel) + spread
    guessed_shift = (shifted > bound).any(axis=1).mean()
    false_alarm = (zero > bound).any(axis=1).mean()
    assert false_alarm == 0.0  # the mask never leaves [-M, M)
    measured = guessed_shift - false_alarm
    assert abs(measured - stated) <= 5 * math.sqrt(stated * (1 - stated) / trials)


def test_uniform_mask_is_uniform_on_the_53_bit_grid() -> None:
    bound = 2.0**30
    values = ckks.uniform_mask(160_000, bound)
    assert values.dtype == np.float64
    assert values.shape == (160_000,)
    assert values.min() >= -bound
    assert values.max() < bound
    grid = (values / bound + 1.0) * 2.0**52  # (2u - 1) M with u = k 2**-53: an integer k
    assert np.array_equal(grid, np.round(grid))
    counts, _ = np.histogram(values, bins=16, range=(-bound, bound))
    chi2 = float(((counts - 10_000) ** 2 / 10_000).sum())
    assert chi2 < 60  # 15 degrees of freedom: P(chi2 > 60) ~ 1e-7
    assert not np.array_equal(values[:8], ckks.uniform_mask(8, bound))  # fresh OS randomness on every call
    assert ckks.uniform_mask(0, bound).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.one_of(  # flat, rows shorter or longer than the 512 slots, 3-D
        st.tuples(st.integers(0, 2000)),
        st.tuples(st.integers(0, 6), st.integers(0, 1200)),
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 60)),
    ),
    packing=st.sampled_from(ckks.PACKINGS),
)
def test_chunks_cover_the_values_in_num_ciphertexts_ciphertexts(shape: tuple[int, ...], packing: str) -> None:
    params = CKKSParameters(1024, (13, 14), 12)  # 512 slots
    values = np.arange(math.prod(shape), dtype=np.float64)
    pieces = ckks.chunks(params, values, shape, packing)
    joined = np.concatenate(pieces) if pieces else np.zeros(0)
    assert np.array_equal(joined, values)
    # a chunk longer than the slots (a long row) is encrypted by TenSEAL into several ciphertexts
    assert sum(math.ceil(p.size / 512) for p in pieces) == ckks.num_ciphertexts(params, shape, packing)
    if packing == "slots":
        assert all(p.size <= 512 for p in pieces)
        assert len(pieces) == math.ceil(values.size / 512)


def test_public_context_has_no_secret_and_key_id_tells_keys_apart() -> None:
    params = CKKSParameters(4096, (54, 55), 40)
    secret = ckks.secret_context(params)
    blob = ckks.public_context_bytes(secret)
    assert secret.is_private()  # the coordinator's context keeps its key
    public = ckks.load_public_context(blob)
    assert not public.is_private()
    assert not public.has_galois_keys()
    assert not public.has_relin_keys()
    with pytest.raises(ValueError, match="must not hold the secret key"):
        ckks.load_public_context(secret.serialize(save_secret_key=True))
    other = ckks.public_context_bytes(ckks.secret_context(params))
    assert len(ckks.key_id(blob)) == 16
    assert ckks.key_id(blob) == ckks.key_id(bytes(blob)) != ckks.key_id(other)
    vector = ckks.encrypt(public, np.array([1.5, -2.0]))
    assert np.abs(ckks.decrypt([vector], secret.secret_key()) - [1.5, -2.0]).max() <= ckks.error_bound(params, 1, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_come_back_on_the_active_device(three) -> None:
    backend, _ = three
    xs = {p: torch.randn(8, 8, device="cuda") for p in passive_names(backend)}
    active = torch.randn(8, 8, device="cuda")
    out = backend.combine(active, {p: backend.protect(p, x, step=0) for p, x in xs.items()})
    assert out.device == active.device
    assert (out - active - sum(xs.values())).abs().max().item() <= 1e-5


# -- between processes: a share as the record "lvfl.CKKSShare" ------------------------------------------------------
def test_a_share_crosses_processes_as_serialized_ciphertexts_and_sums_as_the_live_one() -> None:
    """Through the codec a share's ciphertexts travel as their serialized bytes (no context travels with them) and
    the receiver binds them to its own context: the sum from received shares is the exact sum within the bound, at
    the bytes the live shares are metered at; a malformed record is refused in one line naming the sender."""
    from lvfl.federation import FederationError
    from lvfl.federation.codec import decode_value, encode_value

    backend, _ = set_up(2)
    x = torch.linspace(-3, 3, 10, dtype=torch.float64).reshape(2, 5)
    live = {p: backend.protect(p, x * (i + 1), step=0) for i, p in enumerate(("p1", "p2"))}
    received = {p: decode_value(encode_value(s), sender=p, tag="embeddings") for p, s in live.items()}
    assert all(isinstance(v, bytes) for s in received.values() for v in s.vectors)
    assert [s.wire_nbytes() for s in received.values()] == [s.wire_nbytes() for s in live.values()]
    out = backend.combine(torch.zeros_like(x), received)
    assert float((out - 3 * x).abs().max()) <= backend.error_bound(2)
    bad = encode_value(live["p1"])
    for entry in bad.record.fields:
        if entry.key == "num_ciphertexts":
            entry.value.integer = (7).to_bytes(1, "big")
    with pytest.raises(FederationError, match="p1 sent 'embeddings'.*num_ciphertexts must be the number of vectors"):
        decode_value(bad, sender="p1", tag="embeddings")
    garbage = CKKSShare([b"not a ciphertext"], x.shape, live["p1"].key_id, 1)
    with pytest.raises(ValueError, match="not a serialized CKKS ciphertext"):
        backend.combine(torch.zeros_like(x), {"p1": garbage, "p2": live["p2"]})
