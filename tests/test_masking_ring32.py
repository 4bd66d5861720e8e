"""DHMasking in Z_2^32 (its default ring): int32 shares at a float32's bytes, exact cancellation, range refusals.

The 64-bit ring keeps its own tests (test_privacy_backends.py runs the mask layout and cancellation tests in both
rings); this file holds what is particular to `ring_bits=32` and to the choice between the rings.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from lvfl.crypto import fixedpoint, prg
from lvfl.parties import PartySpec
from lvfl.privacy import DHMasking, Plain
from lvfl.runs import describe_object
from lvfl.wire import Wire, payload_nbytes

FRAC_BITS = 16


def set_up(backend, num_passive: int) -> tuple[list[str], Wire]:
    """Active "a" first, passive "p1".."pK"; returns the passive names and the wire."""
    parties = [PartySpec("a", "active", (3,), 0)] + [
        PartySpec(f"p{i}", "passive", (3,), i) for i in range(1, num_passive + 1)
    ]
    wire = Wire()
    backend.setup(parties, "a", wire)
    return [p.name for p in parties[1:]], wire


def reference_encode(values: np.ndarray, frac_bits: int = FRAC_BITS) -> list[int]:
    """round(v * 2**frac_bits), half to even, in Python ints: the float64 product is exact (a power-of-two scale)."""
    return [round(float(v) * 2**frac_bits) for v in values.reshape(-1)]


def bound_32(num_passive: int, frac_bits: int = FRAC_BITS) -> float:
    """The documented Z_2^32 bound, written out: |v| < ((2**31 - 1) // C + 1/2) / 2**frac_bits, C = K + 1."""
    return ((2**31 - 1) // (num_passive + 1) + 0.5) / 2**frac_bits


# -- bytes on the wire -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (64, 16), (3, 5, 2)])
def test_shares_are_int32_at_the_bytes_of_a_float32_plain_share(shape):
    x = torch.randn(shape)
    dh, plain = DHMasking(), Plain()
    names, dh_wire = set_up(dh, 3)
    set_up(plain, 3)
    plain_wire = Wire()
    for name in names:
        share = dh.protect(name, x, step=0)
        assert share.dtype == torch.int32
        assert share.shape == x.shape
        dh_wire.send(name, "a", share, "embeddings")
        plain_wire.send(name, "a", plain.protect(name, x, step=0), "embeddings")
    numel = math.prod(shape)
    assert payload_nbytes(dh.protect("p1", x, step=1)) == 4 * numel  # exactly 4 bytes per element
    assert dh_wire.bytes_by_tag()["embeddings"] == plain_wire.bytes_by_tag()["embeddings"] == 3 * 4 * numel
    for name in names:  # link by link, as the ledger counts them
        assert dh_wire.bytes[(name, "a", "embeddings")] == plain_wire.bytes[(name, "a", "embeddings")]


def test_the_64_bit_ring_still_costs_8_bytes_and_the_key_exchange_is_the_same():
    x = torch.randn(10, 4)
    wide, narrow = DHMasking(ring_bits=64), DHMasking()
    _, wide_wire = set_up(wide, 4)
    _, narrow_wire = set_up(narrow, 4)
    assert wide_wire.bytes_by_tag() == narrow_wire.bytes_by_tag() == {"keys": 4 * 96 + 4 * 3 * 96}
    share = wide.protect("p1", x, step=0)
    assert share.dtype == torch.int64
    assert payload_nbytes(share) == 8 * x.numel() == 2 * payload_nbytes(narrow.protect("p1", x, step=0))


# -- exact cancellation against an independent fixed-point reference ----------------------------------------------
@pytest.mark.parametrize("num_passive", [2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masks_cancel_exactly_for_values_near_the_bound(num_passive, dtype):
    rng = np.random.default_rng(num_passive)
    backend = DHMasking()
    names, _ = set_up(backend, num_passive)
    bound = bound_32(num_passive)
    assert backend.max_abs_value() == bound
    edge = float(np.nextafter(np.asarray(bound, dtype=np.float32 if dtype == torch.float32 else np.float64), 0))
    xs = {}
    for name in names:
        v = rng.uniform(-edge, edge, size=(6, 40))  # edge is representable in `dtype`: the cast keeps |v| <= edge
        v[0] = rng.choice([edge, -edge], size=40)  # every party at the edge in one row: the largest sums
        v[1] = edge  # all positive: the sum's largest value
        v[2] = -edge
        xs[name] = torch.from_numpy(v).to(dtype)
    shares = {p: backend.protect(p, x, step=3) for p, x in xs.items()}

    encoded = {p: reference_encode(x.double().numpy()) for p, x in xs.items()}
    exact = [sum(col) for col in zip(*encoded.values(), strict=True)]
    assert all(-(2**31) <= e < 2**31 for e in exact)  # the bound keeps the true sum inside the signed range
    assert max(abs(e) for e in exact) >= 0.999 * num_passive * ((2**31 - 1) // (num_passive + 1))  # near the edge
    ring = fixedpoint.ring_sum(shares.values())
    assert ring.dtype == torch.int32
    assert ring.flatten().tolist() == exact  # the masks cancel exactly: the ring sum is the fixed-point sum

    out = backend.combine(torch.zeros(6, 40, dtype=torch.float64), shares)
    assert out.flatten().tolist() == [e / 2**FRAC_BITS for e in exact]  # decoded exactly (|e| < 2**53)
    truth = sum(x.double() for x in xs.values())
    assert (out - truth).abs().max().item() <= backend.error_bound() + 1e-9  # within the stated bound of the sum


@pytest.mark.parametrize("headroom", [2, 3, 4, 7, 11, 16])
@pytest.mark.parametrize("frac_bits", [1, 8, 16, 24])
def test_headroom_encodings_at_the_edge_never_wrap(headroom, frac_bits):
    """`fixedpoint` alone: `headroom` encodings of the largest accepted values (float64, so they round up to the
    largest code) still sum inside [-2**31, 2**31): rounding is accounted for in the bound."""
    bound = fixedpoint.max_abs_value(frac_bits, headroom, ring_bits=32)
    edge = math.nextafter(bound, 0.0)
    assert round(edge * 2**frac_bits) == (2**31 - 1) // headroom  # the edge rounds up to the largest code
    for sign in (1.0, -1.0):
        value = torch.tensor([sign * edge], dtype=torch.float64)
        qs = [fixedpoint.encode(value, frac_bits, headroom_parties=headroom, ring_bits=32)]
        qs *= headroom
        assert fixedpoint.ring_sum(qs).item() == headroom * round(sign * edge * 2**frac_bits)
    at_bound = torch.tensor([bound], dtype=torch.float64)
    with pytest.raises(ValueError, match="out of range"):
        fixedpoint.encode(at_bound, frac_bits, headroom_parties=headroom, ring_bits=32)


# -- refusals -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_passive", [2, 3, 5])
def test_a_value_above_the_bound_is_refused_naming_the_party_bound_and_options(num_passive):
    backend = DHMasking()
    set_up(backend, num_passive)
    bound = bound_32(num_passive)
    fine = torch.tensor([math.nextafter(bound, 0.0), -1.0, 0.5], dtype=torch.float64)
    backend.protect("p2", fine, step=0)
    too_big = torch.tensor([1.0, -2 * bound, bound * 1.5], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^party 'p2': ") as err:
        backend.protect("p2", too_big, step=1)
    message = str(err.value)
    assert f"max |value| = {2 * bound:.6g}" in message  # the largest |value| it found
    assert f"|x| < {bound:.6g}" in message  # the bound
    assert "Z_2^32" in message
    assert "ring_bits=64" in message  # the options
    assert "smaller frac_bits" in message
    assert "'p1'" not in message
    backend.protect("p2", fine, step=1)  # the refused call consumed no mask stream
    with pytest.raises(ValueError, match=r"party 'p1'.*out of range"):  # exactly at the bound: refused too
        backend.protect("p1", torch.tensor([bound], dtype=torch.float64), step=0)


def test_the_same_value_is_accepted_in_the_64_bit_ring():
    big = torch.tensor([20_000.0, -1e6])  # above Z_2^32's bound at frac_bits=16, far below Z_2^64's
    narrow, wide = DHMasking(), DHMasking(ring_bits=64)
    names, _ = set_up(narrow, 3)
    set_up(wide, 3)
    with pytest.raises(ValueError, match="ring_bits=64"):
        narrow.protect("p1", big, step=0)
    shares = {p: wide.protect(p, big, step=0) for p in names}
    assert torch.equal(wide.combine(torch.zeros(2), shares), 3 * big)


def test_a_refusal_in_a_protocol_step_names_the_party_and_its_share_never_goes_on_the_wire(tmp_path):
    """Inside EASTER: party2's embedding leaves Z_2^32's range at batch 1; the refusal names party2, and its share
    for that step is never sent (party1, which protects first, has already sent its masked share)."""
    import lightning.pytorch as pl
    from helpers import easter, make_trainer, spy_on

    from lvfl.datamodules import Digits

    class Escalate(pl.Callback):
        seen: list = []
        mark = 0

        def on_train_start(self, trainer, pl_module):
            Escalate.seen = spy_on(pl_module.wire)
            encoder = pl_module.party_models["party2"].encoder
            encoder.register_forward_hook(lambda module, args, out: out + 1e5 if self.active else out)
            self.active = False

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 1:
                self.active = True
                Escalate.mark = len(Escalate.seen)

    model = easter(4, DHMasking())
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[Escalate()])
    with pytest.raises(ValueError, match=r"^party 'party2': max \|value\| = [\d.e+]+ is out of range.*Z_2\^32") as err:
        trainer.fit(model, datamodule=Digits(num_parties=4, batch_size=16))
    assert f"|x| < {bound_32(3):.6g}" in str(err.value)
    assert "ring_bits=64" in str(err.value)
    before = [(src, tag) for src, _, tag, _ in Escalate.seen[: Escalate.mark] if tag == "embeddings"]
    assert sorted(before) == [("party1", "embeddings"), ("party2", "embeddings"), ("party3", "embeddings")]
    failing = [(src, dst, tag) for src, dst, tag, _ in Escalate.seen[Escalate.mark :]]
    assert ("party2", "party0", "embeddings") not in failing
    assert ("party3", "party0", "embeddings") not in failing
    assert failing.count(("party1", "party0", "embeddings")) == 1


@pytest.mark.parametrize(
    ("ring_bits", "exc"), [(16, ValueError), (128, ValueError), (0, ValueError), ("32", TypeError), (32.0, TypeError)]
)
def test_a_bad_ring_bits_is_refused_naming_the_option(ring_bits, exc):
    with pytest.raises(exc, match=r"DHMasking\(ring_bits=\.\.\.\).*32.*64"):
        DHMasking(ring_bits=ring_bits)
    with pytest.raises((TypeError, ValueError), match="ring_bits"):
        prg.mask_stream(bytes(32), 0, 0, 0, 4, ring_bits=ring_bits)
    with pytest.raises(TypeError, match="ring_bits"):
        DHMasking(ring_bits=True)


def test_a_frac_bits_too_large_for_the_32_bit_ring_is_refused_naming_the_options():
    with pytest.raises(ValueError, match=r"ring_bits=32, frac_bits=30.*ring_bits=64.*frac_bits <= 29"):
        DHMasking(frac_bits=30)  # too large whatever the parties: refused when built
    DHMasking(frac_bits=30, ring_bits=64)
    backend = DHMasking(frac_bits=29)  # room for |v| < 2 with one passive party, not with three
    with pytest.raises(ValueError, match=r"frac_bits=29.*4 parties.*ring_bits=64.*frac_bits <= 28"):
        set_up(backend, 3)
    names, _ = set_up(DHMasking(frac_bits=28), 3)
    assert DHMasking(frac_bits=28).max_abs_value(3) >= 1.0
    wide = DHMasking(frac_bits=29, ring_bits=64)
    names, _ = set_up(wide, 3)
    shares = {p: wide.protect(p, torch.tensor([0.75]), step=0) for p in names}
    assert wide.combine(torch.zeros(1, dtype=torch.float64), shares).item() == 2.25


def test_non_finite_values_are_still_refused():
    backend = DHMasking()
    set_up(backend, 2)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match=r"party 'p1'.*NaN or inf"):
            backend.protect("p1", torch.tensor([0.0, bad]), step=0)


# -- masks: uniform in Z_2^32, fresh per step ----------------------------------------------------------------------
def test_the_32_bit_stream_is_the_aes_ctr_keystream_read_as_uint32_words():
    key = bytes(range(32))
    stream = prg.mask_stream(key, 5, 1, 2, 1000, ring_bits=32)
    assert stream.dtype == torch.int32
    encryptor = Cipher(algorithms.AES(key), modes.CTR(prg.counter_block(5, 1, 2))).encryptor()
    expected = np.frombuffer(encryptor.update(bytes(4000)), dtype="<u4").astype(np.int64)
    assert stream.numpy().view(np.uint32).astype(np.int64).tolist() == expected.tolist()
    share = prg.add_masks_(torch.zeros(1000, dtype=torch.int32), [(key, True)], 5, 1, 2)
    assert torch.equal(share, stream)  # add_masks_ draws the same words, chunk by chunk


@pytest.mark.parametrize("numel", [1, 7, 9, 16383, 16384, 16385, 32767, 32768, 32769, 65539])
def test_add_masks_in_z32_is_the_sum_of_the_streams_at_every_size(numel):
    """Around the keystream chunk (32768 words) and the switch to the GCM-produced keystream (64 KiB): `add_masks_`
    adds exactly the CTR streams `mask_stream` draws, with wrapping uint32 arithmetic."""
    rng = np.random.default_rng(numel)
    start = torch.from_numpy(rng.integers(-(2**31), 2**31, size=numel, dtype=np.int32))
    pair_keys = [(bytes(rng.integers(0, 256, 32, dtype=np.uint8)), add) for add in (True, False, True)]
    got = prg.add_masks_(start.clone(), pair_keys, step=2**40 + 3, rank=5, index=7)
    expected = start.numpy().view(np.uint32).astype(np.uint64)
    for key, add in pair_keys:
        stream = prg.mask_stream(key, 2**40 + 3, 5, 7, numel, ring_bits=32).numpy().view(np.uint32).astype(np.uint64)
        expected = (expected + stream if add else expected + 2**32 - stream) % 2**32
    assert np.array_equal(got.numpy().view(np.uint32), expected.astype(np.uint32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ring_bits", [32, 64])
def test_add_decoded_is_x_plus_decode_bit_for_bit(dtype, ring_bits):
    gen = torch.Generator().manual_seed(0)
    ring = fixedpoint.RING_DTYPES[ring_bits]
    q = torch.randint(-(2**31), 2**31 - 1, (1000,), generator=gen, dtype=torch.int64).to(ring)
    x = (torch.randn(1000, generator=gen, dtype=torch.float64) * 1000).to(dtype).requires_grad_()
    out = fixedpoint.add_decoded(x, q, 16)
    assert out.dtype == dtype
    assert torch.equal(out, x + fixedpoint.decode(q, 16, dtype=dtype))
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_32_bit_masks_look_uniform():
    words = prg.mask_stream(bytes(range(32)), 1, 0, 0, 1 << 16, ring_bits=32).numpy().view(np.uint32)
    for shift in (0, 8, 16, 24, 28):  # low, middle and top bits (the sign bit too) are all used evenly
        counts = np.bincount((words >> np.uint32(shift)) & np.uint32(15), minlength=16)
        chi2 = (((counts - words.size / 16) ** 2) / (words.size / 16)).sum()
        assert chi2 < 45, (shift, chi2)  # 15 degrees of freedom: p < 1e-4 beyond this
    assert abs(words.astype(np.float64).mean() / 2**32 - 0.5) < 0.01
    assert len(np.unique(words)) > words.size - 5  # essentially no repeats among 2**16 draws from 2**32


def test_a_share_hides_the_value_and_changes_every_step():
    backend = DHMasking()
    set_up(backend, 3)
    x = torch.full((32, 32), 1.5)
    encoded = fixedpoint.encode(x, FRAC_BITS, ring_bits=32)
    shares = [backend.protect("p1", x, step=s) for s in range(4)]
    for i, share in enumerate(shares):
        assert share.dtype == torch.int32
        assert (share == encoded).sum().item() <= 1  # not the encoded value ...
        assert len(torch.unique(share)) > share.numel() - 3  # ... nor any constant pattern: one value, 1024 shares
        assert abs(share.double().mean().item()) < 2**31 * 0.1
        for later in shares[i + 1 :]:
            assert (share == later).sum().item() <= 1  # a fresh mask every step for the same input


# -- settings: state_dict, load_state_dict, repr, run fingerprint ---------------------------------------------------
def test_ring_bits_is_a_checkpointed_setting():
    backend = DHMasking()
    assert backend.ring_bits == 32
    assert backend.state_dict() == {"frac_bits": 16, "ring_bits": 32}
    assert "ring_bits=32" in repr(backend)
    assert describe_object(backend)["ring_bits"] == 32  # in the run fingerprint a checkpoint records
    set_up(backend, 2)
    backend.load_state_dict({"frac_bits": 16, "ring_bits": 32})
    with pytest.raises(ValueError, match=r"ring_bits=64 in the checkpoint but 32 in this run"):
        backend.load_state_dict({"frac_bits": 16, "ring_bits": 64})
    assert DHMasking(ring_bits=64).state_dict() == {"frac_bits": 16, "ring_bits": 64}


@pytest.mark.parametrize("ring_bits", [32, 64])
def test_error_bound_holds_in_both_rings(ring_bits):
    backend = DHMasking(ring_bits=ring_bits)
    names, _ = set_up(backend, 4)
    assert backend.error_bound() == 4 * 2.0 ** -(FRAC_BITS + 1)
    gen = torch.Generator().manual_seed(ring_bits)
    xs = {p: torch.randn(50, 20, generator=gen, dtype=torch.float64) * 300 for p in names}
    active = torch.randn(50, 20, generator=gen, dtype=torch.float64)
    out = backend.combine(active, {p: backend.protect(p, x, step=1) for p, x in xs.items()})
    error = (out - (active + sum(xs.values()))).abs().max().item()
    assert 0 < error <= backend.error_bound()
