"""DHMasking (Plain as its reference): exact mask cancellation, byte-exact key exchange, refusals, no keys in pickles.

What every backend must do (the sum within its bound, capabilities, refusals, checkpoints) is in
test_backend_contract.py.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lvfl.crypto import fixedpoint, keys, prg
from lvfl.parties import PartySpec
from lvfl.privacy import AggregationBackend, DHMasking, Plain
from lvfl.privacy.aggregation.masking import SIGNED_KEY_BYTES
from lvfl.wire import Wire

RING = 2**64
RINGS = [32, 64]  # DHMasking's ring_bits; 32 is the default


def make_parties(num_passive: int, active_at: int = 0) -> list[PartySpec]:
    """An active party "a" at position `active_at` among passive parties "p1".."pK"."""
    passive = [PartySpec(f"p{i}", "passive", (3,), i) for i in range(1, num_passive + 1)]
    return passive[:active_at] + [PartySpec("a", "active", (3,), 0)] + passive[active_at:]


def passive_names(parties: list[PartySpec]) -> list[str]:
    return [p.name for p in parties if p.role == "passive"]


def set_up(backend: AggregationBackend, num_passive: int, rank: int = 0, active_at: int = 0):
    parties = make_parties(num_passive, active_at)
    wire = Wire()
    backend.setup(parties, "a", wire, rank=rank)
    return parties, wire


def signed(v: int, ring_bits: int = 64) -> int:
    v %= 2**ring_bits
    return v - 2**ring_bits if v >= 2 ** (ring_bits - 1) else v


# -- DHMasking: exact cancellation ------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    num_passive=st.integers(2, 10),
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
    step=st.integers(0, 2**64 - 1),
    rank=st.integers(0, 3),
    index=st.integers(0, 2**16 - 1),
    active_at=st.integers(0, 10),
    seed=st.integers(0, 2**32 - 1),
    ring_bits=st.sampled_from(RINGS),
)
def test_masks_cancel_exactly(num_passive, shape, step, rank, index, active_at, seed, ring_bits):
    rng = np.random.default_rng(seed)
    backend = DHMasking(ring_bits=ring_bits)
    parties, _ = set_up(backend, num_passive, rank=rank, active_at=min(active_at, num_passive))
    names = passive_names(parties)
    xs = {p: torch.from_numpy(rng.uniform(-1000, 1000, size=shape).astype(np.float32)) for p in names}
    active = torch.from_numpy(rng.uniform(-1000, 1000, size=shape).astype(np.float32))
    shares = {p: backend.protect(p, x, step, index) for p, x in xs.items()}

    # the ring sum of the shares is exactly the sum of the fixed-point values (independent numpy encoding)
    ints = {p: np.rint(x.numpy().astype(np.float64) * 2**16).astype(np.int64) for p, x in xs.items()}
    exact = sum(ints[p].astype(object) for p in names)
    ring = fixedpoint.ring_sum(shares.values()).numpy()
    assert ring.dtype == (np.int32 if ring_bits == 32 else np.int64)
    assert ring.tolist() == np.asarray(exact, dtype=np.int64).tolist()

    # combine == active + decoded sum of the rounded values, bit for bit
    out = backend.combine(active, shares)
    decoded = torch.from_numpy((np.asarray(exact, dtype=np.float64) / 2**16).astype(np.float32))
    assert torch.equal(out, active + decoded)

    # and within C * 2**-16 of Plain (computed in float64, so Plain's own rounding is negligible)
    plain = Plain()
    set_up(plain, num_passive)
    plain_out = plain.combine(active.double(), {p: plain.protect(p, x.double(), step) for p, x in xs.items()})
    c = num_passive + 1
    assert (backend.combine(active.double(), shares) - plain_out).abs().max() <= c * 2.0**-16


@pytest.mark.parametrize("ring_bits", RINGS)
@pytest.mark.parametrize("active_at", [0, 2])
def test_shares_follow_eq5_sign_convention(active_at, ring_bits):
    """share_k = encode(x_k) + sum_{j after k} PRG(k_kj) - sum_{j before k} PRG(k_kj), with the rank in the nonce."""
    backend = DHMasking(ring_bits=ring_bits)
    parties, _ = set_up(backend, 3, rank=7, active_at=active_at)
    names = passive_names(parties)
    x = torch.linspace(-2, 2, 10).reshape(2, 5)
    for pos, k in enumerate(names):
        share = backend.protect(k, x, step=11, index=2).flatten().tolist()
        expected = fixedpoint.encode(x, 16, ring_bits=ring_bits).flatten().tolist()
        for pos_j, j in enumerate(names):
            if j == k:
                continue
            key = dict(zip([n for n in names if n != k], [pk for pk, _ in backend._peers[k]], strict=True))[j]
            stream = prg.mask_stream(key, 11, 7, 2, 10, ring_bits=ring_bits).tolist()
            sign = 1 if pos < pos_j else -1
            expected = [signed(e + sign * s, ring_bits) for e, s in zip(expected, stream, strict=True)]
        assert share == expected


def test_pair_keys_agree_and_never_cross_the_wire():
    backend = DHMasking()
    parties = make_parties(4)
    sent = []

    class RecordingWire(Wire):
        def send(self, src, dst, payload, tag):
            sent.append(bytes(payload["key"]))
            return super().send(src, dst, payload, tag)

    backend.setup(parties, "a", RecordingWire())
    names = passive_names(parties)
    table = {k: dict(zip([n for n in names if n != k], backend._peers[k], strict=True)) for k in names}
    all_keys = set()
    for k in names:
        for j in names:
            if j != k:
                key_kj, add_kj = table[k][j]
                key_jk, add_jk = table[j][k]
                assert key_kj == key_jk  # both ends derive the same pair key
                assert add_kj != add_jk  # one adds the stream, the other subtracts it
                all_keys.add(key_kj)
    assert len(all_keys) == 6  # one distinct key per pair
    assert not all_keys & set(sent)
    assert all(len(m) == keys.PUBLIC_KEY_BYTES for m in sent)


def test_an_active_party_that_swaps_a_relayed_key_is_caught_by_the_passive_party():
    """The man in the middle (docs/backends.md): the relay replaces p2's key by one of its own (signed by
    itself, or re-signed by nobody); p1 refuses it, naming both, and derives no pair key."""
    from lvfl.crypto import keys

    class SwappingRelay(Wire):
        def send(self, src, dst, payload, tag):
            if src == "a" and tag == "keys" and dst == "p1":
                _, own = keys.generate_keypair()  # the active party's key, in p2's place
                payload = {"key": own, "signature": self.identities.sign("a", own)}
            return super().send(src, dst, payload, tag)

    backend = DHMasking()
    parties = [PartySpec("a", "active", (4,)), *(PartySpec(f"p{i}", "passive", (4,), i) for i in (1, 2))]
    with pytest.raises(
        ValueError, match="p1 received p2's X25519 public key, relayed by the active party a, without a valid"
    ):
        backend.setup(parties, "a", SwappingRelay())
    assert backend._peers is None


@pytest.mark.parametrize("replay_into", ["another run", "another round of the same run"])
def test_a_signed_key_replayed_into_another_run_or_round_is_refused(replay_into):
    """The relay keeps p2's signed key of one key set-up and relays it in a later one: the parties' identity keys are
    the same (as a federation's TLS keys are across runs), but the signature binds the run (the identities' session)
    and the set-up's round, so p1 refuses it. The control: the same key relayed in its own set-up is accepted."""
    from lvfl.crypto.signing import SimulatedIdentities

    recorded: dict = {}

    class Relay(Wire):
        replay = False

        def send(self, src, dst, payload, tag):
            if tag == "keys" and src == "p2" and dst == "a":
                received = super().send(src, dst, payload, tag)
                recorded.setdefault("p2", received)  # the first set-up's
                return received
            if tag == "keys" and src == "a" and dst == "p1" and self.replay:
                payload = recorded["p2"]
            return super().send(src, dst, payload, tag)

    identities = SimulatedIdentities()  # one set of identity keys for both set-ups
    backend = DHMasking()
    parties = [PartySpec("a", "active", (4,)), *(PartySpec(f"p{i}", "passive", (4,), i) for i in (1, 2))]
    wire = Relay()
    wire._identities = identities
    backend.setup(parties, "a", wire)  # records p2's signed key; relays it as sent
    assert backend._peers is not None
    if replay_into == "another run":
        backend, identities.session = DHMasking(), b"the next run"  # round 0 again, in another run
    wire.replay = True
    with pytest.raises(ValueError, match=r"without a valid signature by p2.s identity for this run: .*\(a replay\)"):
        backend.setup(parties, "a", wire)
    assert backend._peers is None


@pytest.mark.parametrize("num_passive", [2, 3, 4, 7])
def test_setup_puts_exact_key_bytes_on_the_wire(num_passive):
    backend = DHMasking()
    parties, wire = set_up(backend, num_passive)
    k = num_passive
    n = SIGNED_KEY_BYTES  # a 32-byte X25519 public key and its 64-byte signature
    assert n == 96
    assert wire.bytes_by_tag() == {"keys": k * n + k * (k - 1) * n}
    assert wire.total_messages() == k + k * (k - 1)
    links = wire.bytes_by_link()
    for p in passive_names(parties):
        assert links[f"{p}->a"] == n
        assert links[f"a->{p}"] == (k - 1) * n
    assert all("a" in link.split("->") for link in links)  # every key goes through the active party


# -- fresh masks: per step, per index, per rank -------------------------------------------------------------------
@pytest.mark.parametrize("ring_bits", RINGS)
def test_share_changes_every_step_for_identical_input(ring_bits):
    backend = DHMasking(ring_bits=ring_bits)
    set_up(backend, 3)
    x = torch.full((8, 8), 0.25)
    shares = [backend.protect("p2", x, step=s) for s in range(5)]
    encoded = fixedpoint.encode(x, 16, ring_bits=ring_bits)
    for i, s in enumerate(shares):
        assert s.dtype == fixedpoint.RING_DTYPES[ring_bits]
        assert not torch.any(s == encoded)  # the share hides the value ...
        for t in shares[i + 1 :]:
            assert not torch.any(s == t)  # ... and differs elementwise from every other step's share
    assert not torch.any(backend.protect("p2", x, step=4, index=1) == shares[4])  # a new index, a new mask


@pytest.mark.parametrize("ring_bits", RINGS)
def test_different_rank_gives_different_masks(ring_bits):
    key = bytes(range(32))
    assert not torch.any(prg.mask_stream(key, 1, 0, 0, 256, ring_bits) == prg.mask_stream(key, 1, 1, 0, 256, ring_bits))
    backend = DHMasking(ring_bits=ring_bits)
    set_up(backend, 2, rank=1)
    x = torch.zeros(16)
    pair_key, add = backend._peers["p1"][0]
    share = backend.protect("p1", x, step=0)
    mask = prg.mask_stream(pair_key, 0, 1, 0, 16, ring_bits)
    assert share.tolist() == [signed(m if add else -m, ring_bits) for m in mask.tolist()]
    assert not torch.any(share == prg.mask_stream(pair_key, 0, 0, 0, 16, ring_bits))


def test_reusing_a_mask_stream_is_refused():
    backend = DHMasking()
    set_up(backend, 2)
    x = torch.ones(3)
    backend.protect("p1", x, step=5, index=0)
    backend.protect("p1", x, step=5, index=1)
    backend.protect("p2", x, step=5, index=0)  # the other party's own use of the same stream
    with pytest.raises(ValueError, match=r"party 'p1'.*step 5 index 0 was already used"):
        backend.protect("p1", x, step=5, index=0)
    with pytest.raises(ValueError, match="already used"):
        backend.protect("p1", x, step=4, index=3)
    backend.protect("p1", x, step=6, index=0)
    set_up(backend, 2)  # fresh keys: the counter may start again
    backend.protect("p1", x, step=5, index=0)


# -- refusals ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("num_passive", "frac_bits"), [(2, 16), (5, 16), (3, 30)])
def test_out_of_range_values_raise_naming_the_party_and_bound(num_passive, frac_bits):
    """Z_2^64 (the 32-bit ring's bound is tested in test_masking_ring32.py)."""
    backend = DHMasking(frac_bits=frac_bits, ring_bits=64)
    set_up(backend, num_passive)
    c = num_passive + 1
    bound = 2.0 ** (63 - frac_bits) / c
    below = torch.tensor([np.nextafter(bound, 0.0), -1.0], dtype=torch.float64)
    backend.protect("p2", below, step=0)
    at = torch.tensor([1.0, -bound], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"party 'p2'.*out of range") as err:
        backend.protect("p2", at, step=1)
    assert f"{bound:.6g}" in str(err.value)
    assert f"{c} parties" in str(err.value)
    backend.protect("p2", below, step=1)  # a refused call consumed no mask stream


@pytest.mark.parametrize("num_passive", [0, 1])
def test_fewer_than_two_passive_parties_is_refused(num_passive):
    with pytest.raises(ValueError, match="at least two passive parties") as err:
        set_up(DHMasking(), num_passive)
    assert "own embedding in the clear" in str(err.value)  # says why
    assert "allow_insecure=True" in str(err.value)  # and how to opt out


def test_one_passive_party_runs_only_when_allowed_and_warns():
    backend = DHMasking(allow_insecure=True)
    with pytest.warns(UserWarning, match="allow_insecure=True"):
        _, wire = set_up(backend, 1)
    assert wire.bytes_by_tag() == {
        "keys": SIGNED_KEY_BYTES
    }  # its signed public key still goes to the active party; nothing comes back
    x = torch.tensor([0.5, -0.25])
    share = backend.protect("p1", x, step=0)
    assert torch.equal(share, fixedpoint.encode(x, 16, ring_bits=32))  # no peer, no mask: what the refusal warns of
    assert torch.equal(backend.combine(torch.ones(2), {"p1": share}), torch.tensor([1.5, 0.75]))


def test_secure_setup_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        set_up(DHMasking(), 2)


@pytest.mark.parametrize(
    ("frac_bits", "exc"),
    [(0, ValueError), (41, ValueError), (-3, ValueError), (16.0, TypeError), (True, TypeError), ("16", TypeError)],
)
def test_frac_bits_is_validated(frac_bits, exc):
    with pytest.raises(exc, match="frac_bits"):
        DHMasking(frac_bits=frac_bits)


def test_setup_validates_parties_and_rank():
    with pytest.raises(ValueError, match="not an active party"):
        DHMasking().setup(make_parties(2), "p1", Wire())
    with pytest.raises(ValueError, match="unique"):
        DHMasking().setup(make_parties(2) + [PartySpec("p1", "passive", (3,), 9)], "a", Wire())
    with pytest.raises(ValueError, match="rank"):
        DHMasking().setup(make_parties(2), "a", Wire(), rank=2**16)


def test_protect_and_combine_refuse_misuse():
    backend = DHMasking()
    with pytest.raises(RuntimeError, match="setup"):
        backend.protect("p1", torch.zeros(2), step=0)
    set_up(backend, 3)
    with pytest.raises(ValueError, match="'a' is not a passive party"):
        backend.protect("a", torch.zeros(2), step=0)
    with pytest.raises(TypeError, match="party 'p1'.*floating-point"):
        backend.protect("p1", torch.zeros(2, dtype=torch.int32), step=0)
    shares = {p: backend.protect(p, torch.ones(2), step=1) for p in ("p1", "p2", "p3")}
    with pytest.raises(ValueError, match=r"missing \['p2'\]"):
        backend.combine(torch.zeros(2), {p: s for p, s in shares.items() if p != "p2"})
    with pytest.raises(ValueError, match=r"unknown \['p9'\]"):
        backend.combine(torch.zeros(2), shares | {"p9": shares["p1"]})
    with pytest.raises(TypeError, match="party 'p3'.*int32"):
        backend.combine(torch.zeros(2), shares | {"p3": shares["p3"].float()})
    with pytest.raises(TypeError, match=r"party 'p3'.*int32.*ring_bits=32.*got torch.int64"):  # another ring's share
        backend.combine(torch.zeros(2), shares | {"p3": shares["p3"].long()})
    with pytest.raises(ValueError, match="party 'p1'.*shape"):
        backend.combine(torch.zeros(3), shares)
    assert torch.equal(backend.combine(torch.zeros(2), shares), torch.full((2,), 3.0))


# -- devices and layouts ------------------------------------------------------------------------------------------
def test_non_contiguous_and_half_precision_inputs():
    backend = DHMasking()
    set_up(backend, 2)
    base = torch.randn(6, 4)
    x1, x2 = base.t(), (base * 2).t()  # non-contiguous
    shares = {"p1": backend.protect("p1", x1, 0), "p2": backend.protect("p2", x2.half(), 0)}
    assert shares["p1"].shape == (4, 6)
    out = backend.combine(torch.zeros(4, 6), shares)
    assert (out - (x1 + x2.half().float())).abs().max() <= 2 * 2.0**-17 + 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_shares_stay_on_device_and_cancel():
    backend = DHMasking()
    set_up(backend, 3)
    xs = {p: torch.randn(128, 128, device="cuda") for p in ("p1", "p2", "p3")}
    shares = {p: backend.protect(p, x, step=0) for p, x in xs.items()}
    assert all(s.device.type == "cuda" and s.dtype == torch.int32 for s in shares.values())
    active = torch.randn(128, 128, device="cuda")
    out = backend.combine(active, shares)
    assert out.device.type == "cuda"
    cpu = {p: fixedpoint.encode(x.cpu(), 16, ring_bits=32) for p, x in xs.items()}
    assert torch.equal(out.cpu(), active.cpu() + fixedpoint.decode(fixedpoint.ring_sum(cpu.values()), 16))


# -- no key material in checkpoints or pickles ---------------------------------------------------------------------
def test_pickles_and_checkpoints_hold_no_key_material(monkeypatch):
    private_raw = []
    real_generate = keys.generate_keypair

    def recording_generate():
        private, public = real_generate()
        private_raw.append(private.private_bytes_raw())
        return private, public

    monkeypatch.setattr(keys, "generate_keypair", recording_generate)
    backend = DHMasking(frac_bits=20)
    set_up(backend, 3)
    pair_keys = {key for peers in backend._peers.values() for key, _ in peers}
    assert len(private_raw) == 3
    assert len(pair_keys) == 3

    holder = torch.nn.Module()
    holder.aggregation = backend
    buffer = io.BytesIO()
    torch.save({"module": holder, "backend_state": backend.state_dict()}, buffer)
    for blob in (pickle.dumps(backend), buffer.getvalue()):
        for secret in [*private_raw, *pair_keys]:
            assert secret not in blob

    assert backend.state_dict() == {"frac_bits": 20, "ring_bits": 32}
    restored = pickle.loads(pickle.dumps(backend))  # noqa: S301 - our own bytes
    assert restored.frac_bits == 20
    assert backend._peers is not None  # pickling does not strip the live object
    for clone in (restored, copy.deepcopy(backend)):
        with pytest.raises(RuntimeError, match="setup"):
            clone.protect("p1", torch.zeros(2), step=0)
    set_up(restored, 3)  # set up again: fresh keys, works
    assert {key for peers in restored._peers.values() for key, _ in peers}.isdisjoint(pair_keys)
    assert "key" not in repr(backend).lower()


def test_load_state_dict_keeps_keys_and_refuses_another_frac_bits():
    """A checkpoint is loaded after setup (test --ckpt_path, resume): it must keep the keys and this run's settings."""
    backend = DHMasking(frac_bits=20)
    set_up(backend, 2)
    backend.load_state_dict({"frac_bits": 20})
    backend.load_state_dict({})  # an older checkpoint without the setting
    shares = {p: backend.protect(p, torch.ones(2), step=0) for p in ("p1", "p2")}
    assert torch.equal(backend.combine(torch.zeros(2), shares), torch.full((2,), 2.0))  # keys still live
    with pytest.raises(ValueError, match=r"frac_bits=16 in the checkpoint but 20 in this run"):
        backend.load_state_dict({"frac_bits": 16})
    assert backend.frac_bits == 20
    with pytest.raises(ValueError, match=r"unknown backend settings \['mask'\]"):
        backend.load_state_dict({"frac_bits": 20, "mask": 1})


# -- range errors name the party whose values are out of range ----------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.0**50])
@pytest.mark.parametrize("culprit", ["p1", "p2", "p3"])
def test_only_the_out_of_range_party_is_named(bad, culprit):
    """Three passive parties, one of them diverging: the error names it, whichever it is, and no other."""
    backend = DHMasking()
    set_up(backend, 3)
    for step, party in enumerate(["p1", "p2", "p3"]):
        x = torch.randn(4, 5)
        if party == culprit:
            x[1, 2] = bad
            with pytest.raises(ValueError, match=rf"^party '{culprit}': ") as err:
                backend.protect(party, x, step=step)
            assert all(f"'{other}'" not in str(err.value) for other in ("p1", "p2", "p3") if other != culprit)
        else:
            backend.protect(party, x, step=step)


def test_a_diverging_third_party_is_named_in_a_protocol_step(tmp_path):
    """Inside EASTER: only party3's encoder blows up; the refusal names party3, not the first passive party."""
    import lightning.pytorch as pl
    from helpers import easter, make_trainer

    from lvfl.datamodules import Digits

    class Diverge(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                with torch.no_grad():
                    for param in pl_module.party_models["party3"].encoder.parameters():
                        param.mul_(1e12)

    model = easter(4, DHMasking())
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[Diverge()])
    with pytest.raises(ValueError, match=r"party 'party3'.*out of range") as err:
        trainer.fit(model, datamodule=Digits(num_parties=4, batch_size=16))
    assert "party1" not in str(err.value)
    assert "party2" not in str(err.value)
