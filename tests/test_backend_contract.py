"""The aggregation-backend contract, one suite run against every backend (Plain, DHMasking, Paillier, CKKS).

Each backend declares its capabilities (`lvfl.privacy.aggregation.base`: `reveals_shares`, `refuses_nonfinite`,
`refuses_reused_step`, `error_bound`); these tests hold every backend to the interface and each declaration to the
behaviour. Backend-specific properties (mask layout, packing, HE parameters, the exact ledger) stay in
test_privacy_backends.py, test_paillier.py and test_ckks.py.
"""

from __future__ import annotations

import inspect
import io
import pickle

import pytest
import torch

from lvfl.parties import PartySpec
from lvfl.privacy import CKKS, AggregationBackend, DHMasking, Paillier, Plain
from lvfl.privacy.aggregation.ckks import CKKSShare
from lvfl.privacy.aggregation.paillier import PaillierShare
from lvfl.wire import Wire

#: how each backend is built for the contract: secure defaults (Paillier's 2048-bit key), serial Paillier (fast)
FACTORIES = {
    "Plain": Plain,
    "DHMasking": DHMasking,
    "Paillier": lambda: Paillier(workers=1),
    "CKKS": CKKS,
}
NAMES = list(FACTORIES)
CAPABILITIES = ("reveals_shares", "refuses_nonfinite", "refuses_reused_step")


def make_parties(num_passive: int) -> list[PartySpec]:
    """Passive "p1".."pK" with the active party "a" second (not first: order must not matter)."""
    passive = [PartySpec(f"p{i}", "passive", (3,), i) for i in range(1, num_passive + 1)]
    return passive[:1] + [PartySpec("a", "active", (3,), 0)] + passive[1:]


def passive_names(num_passive: int) -> list[str]:
    return [f"p{i}" for i in range(1, num_passive + 1)]


@pytest.fixture(scope="module")
def backends():
    """`get(name, K)`: a backend set up with K passive parties, and its wire (key generation once per pair)."""
    cache: dict[tuple[str, int], tuple[AggregationBackend, Wire]] = {}

    def get(name: str, num_passive: int = 3) -> tuple[AggregationBackend, Wire]:
        if (name, num_passive) not in cache:
            backend, wire = FACTORIES[name](), Wire()
            backend.setup(make_parties(num_passive), "a", wire)
            cache[(name, num_passive)] = (backend, wire)
        return cache[(name, num_passive)]

    yield get
    for backend, _ in cache.values():
        if isinstance(backend, Paillier):
            backend.close()


class Steps:
    """A fresh mask step per protect round, as a protocol's `mask_step` counter gives (never reused)."""

    counter = 0

    @classmethod
    def next(cls) -> int:
        cls.counter += 1
        return cls.counter


def share_view(share) -> bytes:
    """What a share looks like on the wire, as bytes (to compare two shares)."""
    if isinstance(share, torch.Tensor):
        return share.detach().cpu().contiguous().numpy().tobytes()
    if isinstance(share, PaillierShare):
        return b"".join(c.to_bytes(share.ciphertext_nbytes, "big") for c in share.ciphertexts)
    if isinstance(share, CKKSShare):
        return b"".join(v.serialize() for v in share.vectors)
    raise TypeError(f"unknown share type {type(share).__name__}")


# -- declarations ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_backend_declares_its_capabilities(name):
    cls = type(FACTORIES[name]())
    for capability in CAPABILITIES:
        assert capability in vars(cls), f"{cls.__name__} must declare {capability} itself, not inherit it"
        assert isinstance(getattr(cls, capability), bool)
    assert cls.error_bound is not AggregationBackend.error_bound, f"{cls.__name__} must state its error_bound"
    assert list(inspect.signature(cls.combine).parameters) == ["self", "active_tensor", "shares"]  # no weights


def test_declarations_per_backend():
    """What each backend promises, in one table (the rest of this file checks the promises)."""
    table = {name: tuple(getattr(type(FACTORIES[name]()), c) for c in CAPABILITIES) for name in NAMES}
    assert table == {
        "Plain": (True, False, False),
        "DHMasking": (False, True, True),
        "Paillier": (False, True, False),
        "CKKS": (False, True, False),
    }


# -- protect + combine is the sum -----------------------------------------------------------------------------------
@pytest.mark.parametrize("num_passive", [2, 3, 4, 5])
@pytest.mark.parametrize("name", NAMES)
def test_combine_is_the_sum_within_the_stated_bound(backends, name, num_passive):
    backend, _ = backends(name, num_passive)
    gen = torch.Generator().manual_seed(num_passive)
    xs = {p: torch.randn(4, 6, generator=gen, dtype=torch.float64) * 10 for p in passive_names(num_passive)}
    active = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    step = Steps.next()
    out = backend.combine(active, {p: backend.protect(p, x, step) for p, x in xs.items()})
    reference = active.detach() + sum(xs.values())
    bound = backend.error_bound()
    assert bound == backend.error_bound(num_passive) >= 0
    assert (out.detach() - reference).abs().max().item() <= bound + 1e-12 * reference.abs().max().item()
    assert out.dtype == torch.float64
    assert out.shape == active.shape
    out.sum().backward()  # the gradient reaches the active party's own tensor, and only through it
    assert torch.equal(active.grad, torch.ones_like(active))


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (0, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_dtypes_are_preserved(backends, name, dtype, shape):
    backend, _ = backends(name)
    xs = {p: torch.full(shape, 0.5 * i, dtype=dtype) for i, p in enumerate(passive_names(3), start=1)}
    active = torch.ones(shape, dtype=dtype)
    step = Steps.next()
    out = backend.combine(active, {p: backend.protect(p, x, step) for p, x in xs.items()})
    assert out.dtype == dtype
    assert out.shape == active.shape
    torch.testing.assert_close(out, torch.full(shape, 1 + 0.5 + 1.0 + 1.5, dtype=dtype))
    for x, value in zip(xs.values(), (0.5, 1.0, 1.5), strict=True):  # protect leaves the caller's tensor alone
        assert torch.equal(x, torch.full(shape, value, dtype=dtype))


# -- reveals_shares, matched by behaviour ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_reveals_shares_matches_what_the_active_party_receives(backends, name):
    backend, _ = backends(name)
    x = torch.linspace(-2, 2, 24, dtype=torch.float64).reshape(4, 6)
    first, second = backend.protect("p2", x, Steps.next()), backend.protect("p2", x, Steps.next())
    if backend.reveals_shares:
        assert isinstance(first, torch.Tensor)
        assert torch.equal(first, x)  # the embedding itself, in the clear
        return
    for share in (first, second):  # neither the value itself nor any element of it
        assert not (isinstance(share, torch.Tensor) and share.dtype == x.dtype and torch.equal(share, x))
        if isinstance(share, torch.Tensor):
            assert not torch.any(share.double() == x)
    assert share_view(first) != share_view(second)  # and the same value twice looks different on the wire


@pytest.mark.parametrize("name", NAMES)
def test_keys_go_on_the_wire_exactly_when_shares_are_protected(backends, name):
    """A backend that protects shares agrees on keys (bytes on the wire); one that reveals them sends nothing."""
    backend, _ = backends(name)
    wire = Wire()
    fresh = FACTORIES[name]()
    fresh.setup(make_parties(2), "a", wire)
    try:
        if backend.reveals_shares:
            assert wire.total_bytes() == 0
        else:
            assert set(wire.bytes_by_tag()) == {"keys"}
            assert wire.total_bytes() > 0
    finally:
        if isinstance(fresh, Paillier):
            fresh.close()


# -- refuses_reused_step: a mask step is never reused ---------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_a_mask_step_is_never_reused(backends, name):
    backend, _ = backends(name, 2)
    x = torch.ones(3)
    step = Steps.next()
    first = backend.protect("p1", x, step, index=0)
    if backend.refuses_reused_step:
        with pytest.raises(ValueError, match=r"party 'p1'.*already used"):
            backend.protect("p1", x, step, index=0)
        backend.protect("p1", x, step, index=1)  # a new index in the same step is a new stream
    elif not backend.reveals_shares:  # fresh randomness per call: the same (step, index) still hides afresh
        assert share_view(backend.protect("p1", x, step, index=0)) != share_view(first)


# -- refuses_nonfinite -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", NAMES)
def test_non_finite_values_are_refused_naming_the_party_or_passed_through(backends, name, bad):
    backend, _ = backends(name)
    x = torch.zeros(2, 3)
    x[1, 2] = bad
    if backend.refuses_nonfinite:
        for culprit in ("p1", "p3"):
            with pytest.raises(ValueError, match=rf"^party '{culprit}'.*NaN or inf") as err:
                backend.protect(culprit, x, Steps.next())
            assert all(f"'{other}'" not in str(err.value) for other in ("p1", "p2", "p3") if other != culprit)
        return
    step = Steps.next()  # Plain: the value reaches the sum unchanged, as in the unprotected reference
    shares = {p: backend.protect(p, x if p == "p3" else torch.zeros(2, 3), step) for p in passive_names(3)}
    out = backend.combine(torch.zeros(2, 3), shares)
    torch.testing.assert_close(out, x, equal_nan=True)


# -- combine refuses a missing or unknown share ----------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_combine_needs_exactly_one_share_per_passive_party(backends, name):
    backend, _ = backends(name)
    step = Steps.next()
    shares = {p: backend.protect(p, torch.ones(2), step) for p in passive_names(3)}
    with pytest.raises(ValueError, match=r"one share per passive party.*missing \['p2'\]"):
        backend.combine(torch.zeros(2), {p: s for p, s in shares.items() if p != "p2"})
    with pytest.raises(ValueError, match=r"unknown \['p9'\]"):
        backend.combine(torch.zeros(2), {**shares, "p9": shares["p1"]})


# -- checkpoints: no secrets, own state loads, other settings refused ------------------------------------------------
def changed(value):
    """Another value of the same kind, for a setting a later run might change."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list | tuple):
        return [*value, value[-1]]
    raise TypeError(f"no other value for {value!r}")


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_holds_settings_only(backends, name):
    backend, _ = backends(name)
    state = backend.state_dict()
    assert all(isinstance(v, bool | int | float | str | list) for v in state.values())
    assert all(isinstance(e, int | float) for v in state.values() if isinstance(v, list) for e in v)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == state  # loads without unpickling arbitrary objects
    assert len(pickle.dumps(state)) < 1024  # a key (X25519, Paillier 2048-bit, CKKS context) would not fit
    fresh = FACTORIES[name]()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state


@pytest.mark.parametrize("name", NAMES)
def test_load_state_dict_keeps_keys_and_refuses_changed_settings(backends, name):
    backend, _ = backends(name)
    state = backend.state_dict()
    backend.load_state_dict(state)
    backend.load_state_dict({})  # an older checkpoint without settings: nothing to compare
    step = Steps.next()
    out = backend.combine(
        torch.zeros(2, dtype=torch.float64), {p: backend.protect(p, torch.ones(2), step) for p in passive_names(3)}
    )
    assert (out - 3).abs().max().item() <= backend.error_bound()  # keys still live
    for key, value in state.items():
        with pytest.raises(ValueError, match=rf"{key}=.* in the checkpoint but .* in this run"):
            backend.load_state_dict({**state, key: changed(value)})
    with pytest.raises(ValueError, match=r"unknown backend settings \['colour'\]"):
        backend.load_state_dict({**state, "colour": "blue"})
    assert backend.state_dict() == state


@pytest.mark.parametrize("name", NAMES)
def test_copies_hold_no_keys(backends, name):
    """A pickled backend must be set up again (keys are never serialized); one without keys works as it is."""
    backend, _ = backends(name)
    restored = pickle.loads(pickle.dumps(backend))  # noqa: S301 - our own bytes
    if backend.reveals_shares:
        assert torch.equal(restored.protect("p1", torch.ones(2), 0), torch.ones(2))
        return
    with pytest.raises(RuntimeError, match="setup"):
        restored.protect("p1", torch.ones(2), 0)
    assert backend.protect("p1", torch.ones(2), Steps.next()) is not None  # the original keeps its keys


# -- protocols decide from the declarations, never from the class ----------------------------------------------------
def test_protocols_decide_from_declared_capabilities():
    """A single site refuses any backend that protects shares and accepts one that reveals them, whatever its class."""
    from helpers import mlp_parties

    from lvfl.protocols import Local

    class QuietPlain(Plain):  # a Plain that claims to protect: refused as a protecting backend would be
        reveals_shares = False

    with pytest.raises(ValueError, match=r"QuietPlain would protect nothing.*declares reveals_shares=False"):
        Local(parties=mlp_parties(1), aggregation=QuietPlain())
    with pytest.raises(ValueError, match=r"DHMasking would protect nothing.*this needs reveals_shares=True"):
        Local(parties=mlp_parties(1), aggregation=DHMasking())

    class OpenBackend(Plain):  # another class that reveals shares: accepted
        pass

    Local(parties=mlp_parties(1), aggregation=OpenBackend())


def test_no_protocol_checks_a_backend_class():
    from pathlib import Path

    import lvfl.protocols

    for path in Path(lvfl.protocols.__file__).parent.glob("*.py"):
        source = path.read_text()
        needles = ("isinstance(self.aggregation", "type(self.aggregation) is", "from lvfl.privacy.masking")
        for needle in (*needles, "from lvfl.privacy.aggregation.masking"):
            assert needle not in source, f"{path.name} checks the backend's class ({needle}); declare a capability"
