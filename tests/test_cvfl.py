"""C-VFL and its compressors against independent references: error bounds, byte formulas, hand-written updates."""

from __future__ import annotations

import copy
import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import make_trainer, mlp_parties, recording, split_ledger
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lvfl.compression import Compressor, densify, dequantize, quantize, topk_sparsify
from lvfl.datamodules import Digits, VerticalDataModule
from lvfl.models import MLP
from lvfl.privacy import DHMasking
from lvfl.protocols.cvfl import CVFL

FLOAT32_EPS = 2.0**-23

arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=12),
    elements=st.floats(-1e4, 1e4, width=32),
)


def half_step(x: torch.Tensor, bits: int) -> float:
    """The scheme's error bound: half of (max - min) / (2^b - 1), in float64, plus float32 rounding of the result."""
    lo, hi = x.double().min().item(), x.double().max().item()
    return (hi - lo) / (2**bits - 1) / 2 * (1 + 1e-6) + FLOAT32_EPS * max(abs(lo), abs(hi))


# ------------------------------------------------------------------------------------------------ compression
@settings(max_examples=60, deadline=None)
@given(x=arrays, bits=st.integers(1, 16))
def test_quantization_round_trip_is_within_half_a_step(x, bits):
    t = torch.from_numpy(x)
    codes, offset, step = quantize(t, bits)
    assert codes.shape == t.shape
    assert int(codes.min()) >= 0
    assert int(codes.max()) <= 2**bits - 1
    err = (dequantize(codes, offset, step) - t).abs().max().item()
    assert err <= half_step(t, bits)
    c = Compressor(bits=bits).compress(t)
    assert torch.equal(c.decompress(), dequantize(codes, offset, step))
    assert c.decompress().dtype == torch.float32


def test_quantization_hits_the_extremes_and_constant_tensors_exactly():
    t = torch.tensor([[-3.0, 0.0, 5.0]])
    codes, offset, step = quantize(t, 4)
    assert codes.tolist() == [[0, round(3 / 8 * 15), 15]]
    out = dequantize(codes, offset, step)
    assert out[0, 0] == -3.0
    assert out[0, 2] == pytest.approx(5.0, abs=1e-6)
    const = torch.full((2, 3), 1.25)
    assert torch.equal(Compressor(bits=1).compress(const).decompress(), const)


def test_no_quantization_is_exact():
    t = torch.randn(5, 7)
    c = Compressor().compress(t)
    assert torch.equal(c.decompress(), t)
    assert c.wire_nbytes() == t.numel() * 4


@settings(max_examples=60, deadline=None)
@given(x=arrays, topk=st.floats(0.01, 1.0))
def test_topk_keeps_exactly_the_largest_magnitudes(x, topk):
    t = torch.from_numpy(x)
    n = t.numel()
    k = max(1, math.floor(topk * n + 0.5))
    values, indices = topk_sparsify(t, topk)
    assert values.numel() == indices.numel() == k
    assert len(set(indices.tolist())) == k
    assert indices.tolist() == sorted(indices.tolist())
    # the multiset of kept magnitudes is the k largest of all magnitudes (ties may pick either element)
    kept = sorted(values.abs().tolist())
    assert kept == sorted(t.abs().flatten().tolist())[n - k :]
    dense = densify(values, indices, tuple(t.shape))
    mask = torch.zeros(n, dtype=torch.bool)
    mask[indices] = True
    assert torch.equal(dense.flatten()[mask], t.flatten()[mask])  # exact on the kept elements
    assert torch.all(dense.flatten()[~mask] == 0)


@settings(max_examples=40, deadline=None)
@given(x=arrays, bits=st.integers(1, 16), topk=st.floats(0.05, 0.95))
def test_topk_then_quantize_bounds_the_kept_elements(x, bits, topk):
    t = torch.from_numpy(x)
    values, indices = topk_sparsify(t, topk)
    out = Compressor(bits=bits, topk=topk).compress(t).decompress().flatten()
    mask = torch.zeros(t.numel(), dtype=torch.bool)
    mask[indices] = True
    assert (out[mask] - t.flatten()[mask]).abs().max().item() <= half_step(values, bits)
    assert torch.all(out[~mask] == 0)


def compressed_nbytes(numel: int, bits: int, topk: float) -> int:
    """Hand-written wire size: kept count, packed codes + 8 header bytes or float32, packed indices."""
    kept = numel if topk == 1.0 else max(1, math.floor(topk * numel + 0.5))
    values = math.ceil(kept * bits / 8) + 8 if bits < 32 else 4 * kept
    indices = 0 if topk == 1.0 else math.ceil(kept * math.ceil(math.log2(numel)) / 8)
    return values + indices


@pytest.mark.parametrize("shape", [(128, 64), (37, 16), (1, 3)])
@pytest.mark.parametrize("topk", [1.0, 0.1])
def test_compressed_bytes_fall_with_bits_by_the_exact_formula(shape, topk):
    t = torch.randn(*shape)
    sizes = {}
    for bits in [*range(1, 17), 32]:
        sizes[bits] = Compressor(bits=bits, topk=topk).compress(t).wire_nbytes()
        assert sizes[bits] == compressed_nbytes(t.numel(), bits, topk), bits
    if t.numel() * topk >= 8:  # once the 8 header bytes are amortised, every bit saved shows
        order = [32, *range(16, 0, -1)]
        assert all(sizes[a] > sizes[b] for a, b in zip(order, order[1:], strict=False)), sizes


def test_eight_bits_of_a_batch_embedding_is_about_a_quarter():
    t = torch.rand(128, 64)
    assert Compressor(bits=8).compress(t).wire_nbytes() == 128 * 64 + 8
    assert Compressor(bits=32).compress(t).wire_nbytes() == 128 * 64 * 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bits": 0}, r"bits must be in \[1, 16\] or 32.*bits=0"),
        ({"bits": 17}, r"bits=17"),
        ({"bits": 31}, r"bits=31"),
        ({"topk": 0.0}, r"topk must be a fraction in \(0, 1\].*topk=0.0"),
        ({"topk": 1.5}, r"topk=1.5"),
        ({"topk": float("nan")}, r"topk=nan"),
    ],
)
def test_bad_compressor_arguments_raise_naming_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Compressor(**kwargs)


def test_bad_compressor_types_raise():
    with pytest.raises(TypeError, match="bits must be an int"):
        Compressor(bits=8.0)
    with pytest.raises(TypeError, match="bits must be an int"):
        Compressor(bits=True)
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(torch.tensor([0.0, float("inf")]), 8)
    with pytest.raises(TypeError, match="floating-point"):
        Compressor(bits=8).compress(torch.arange(4))


# ------------------------------------------------------------------------------------------------ the protocol
Recording = recording(CVFL)


def cvfl(n: int = 4, lr: float = 0.1, momentum: float = 0.0, embedding_dim: int = 8, **kwargs) -> Recording:
    return Recording(
        parties=mlp_parties(n, lr=lr, momentum=momentum),
        top_model=partial(MLP, hidden=[16]),
        top_hidden=12,
        embedding_dim=embedding_dim,
        **kwargs,
    )


def snapshot(model: CVFL) -> tuple[dict, torch.nn.Module]:
    return copy.deepcopy({k: model.party_models[k].encoder for k in model.party_names}), copy.deepcopy(model.top)


def split_learning_step(encoders: dict, top, batch, lr: float) -> tuple[dict, dict]:
    """Plain split learning, by hand: one loss on top(concat(E)), one SGD step on every parameter."""
    z = torch.cat([encoders[k](batch.features[k]) for k in encoders], dim=1)
    loss = F.cross_entropy(top(z), batch.labels)
    params = {f"{k}.{n}": p for k, enc in encoders.items() for n, p in enc.named_parameters()}
    params |= {f"top.{n}": p for n, p in top.named_parameters()}
    grads = torch.autograd.grad(loss, list(params.values()))
    new = {n: p.detach() - lr * g for (n, p), g in zip(params.items(), grads, strict=True)}
    return new, params


def cvfl_reference(encoders: dict, top, batch, lr: float, q: int, bits: int) -> dict[str, torch.Tensor]:
    """C-VFL by hand (Algorithm 1), one round: each party alone, Q SGD steps on stale compressed others."""
    names = list(encoders)
    active = names[0]

    def wire(e):  # what the receiver reconstructs
        return dequantize(*quantize(e.detach(), bits))

    with torch.no_grad():
        sent = {k: wire(encoders[k](batch.features[k])) for k in names}
    new = {}
    for k in names:
        enc, top_k = copy.deepcopy(encoders[k]), copy.deepcopy(top)
        own_params = list(enc.parameters()) + (list(top_k.parameters()) if k == active else [])
        for _ in range(q):
            z = torch.cat([enc(batch.features[j]) if j == k else sent[j] for j in names], dim=1)
            loss = F.cross_entropy(top_k(z), batch.labels)
            grads = torch.autograd.grad(loss, own_params)
            with torch.no_grad():
                for p, g in zip(own_params, grads, strict=True):
                    p -= lr * g
        new |= {f"{k}.{n}": p.detach() for n, p in enc.named_parameters()}
        if k == active:
            new |= {f"top.{n}": p.detach() for n, p in top_k.named_parameters()}
    return new


def trained_params(model: CVFL) -> dict[str, torch.Tensor]:
    encoders = {k: model.party_models[k].encoder for k in model.party_names}
    out = {f"{k}.{n}": p.detach() for k, enc in encoders.items() for n, p in enc.named_parameters()}
    return out | {f"top.{n}": p.detach() for n, p in model.top.named_parameters()}


def test_uncompressed_single_iteration_equals_split_learning(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = cvfl(4, lr=0.1)
    model.build(dm.party_specs, dm.task)
    encoders, top = snapshot(model)
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected, before = split_learning_step(encoders, top, batch, lr=0.1)
    got = trained_params(model)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(got[name], value, atol=1e-6), name
        assert not torch.equal(got[name], before[name].detach()), f"{name} did not move"


def test_compressed_local_iterations_equal_hand_written_cvfl(tmp_path):
    """Q = 3 with 4-bit embeddings: passive parties step on a frozen top model and stale others' embeddings."""
    torch.manual_seed(1)
    dm = Digits(num_parties=3, batch_size=64)
    model = cvfl(3, lr=0.1, local_iterations=3, compressor=Compressor(bits=4))
    model.build(dm.party_specs, dm.task)
    encoders, top = snapshot(model)
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected = cvfl_reference(encoders, top, batch, lr=0.1, q=3, bits=4)
    got = trained_params(model)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(got[name], value, atol=1e-5), name
    # staleness matters: the same three steps of plain split learning end elsewhere
    sl_encoders, sl_top = copy.deepcopy(encoders), copy.deepcopy(top)
    for _ in range(3):
        new, params = split_learning_step(sl_encoders, sl_top, batch, lr=0.1)
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(new[name])
    assert not torch.allclose(got["party1.1.weight"], new["party1.1.weight"], atol=1e-5)


def expected_epoch_ledger(model: CVFL, dm: VerticalDataModule, bits: int, topk: float):
    """The analytic bytes of one training epoch: per round and passive party, W up and (C-1) W + 4P + B down."""
    n = len(dm.train_set)
    b = dm.batch_size
    batches = [b] * (n // b) + ([n % b] if n % b else [])
    d, c = model.embedding_dim, model.num_parties
    p = sum(t.numel() for t in model.top.parameters())
    out = {}
    for k in model.passive:
        out[(k, model.active, "embeddings")] = sum(compressed_nbytes(s * d, bits, topk) for s in batches)
        out[(model.active, k, "global_embedding")] = sum(
            (c - 1) * compressed_nbytes(s * d, bits, topk) for s in batches
        )
        out[(model.active, k, "model")] = len(batches) * 4 * p
        out[(model.active, k, "labels")] = n  # one uint8 per label
    return out


@pytest.mark.parametrize(("bits", "topk"), [(32, 1.0), (8, 1.0), (3, 1.0), (6, 0.3)])
def test_ledger_equals_analytic_epoch_count(tmp_path, bits, topk):
    dm = Digits(num_parties=4, batch_size=100)  # 100 does not divide the train set: the last batch is short
    model = cvfl(4, local_iterations=2, compressor=Compressor(bits=bits, topk=topk), embedding_dim=16)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    expected = expected_epoch_ledger(model, dm, bits, topk)
    split = split_ledger(dm)  # the active party's stratified split, set-up traffic: one message each
    assert dict(model.wire.bytes) == expected | split
    rounds = len(dm.train_dataloader())
    assert all(model.wire.messages[key] == rounds for key in expected)  # Q = 2 local iterations, one round each
    assert all(model.wire.messages[key] == 1 for key in split)


def test_top_model_parameters_are_counted_in_full():
    dm = Digits(num_parties=4, batch_size=32)
    model = cvfl(4, embedding_dim=8)
    model.build(dm.party_specs, dm.task)
    # MLP top on the 4 x 8 concatenation: Linear(32, 16), Linear(16, top_hidden=12), Linear(12, 10)
    assert sum(t.numel() for t in model.top_snapshot().values()) == (32 * 16 + 16) + (16 * 12 + 12) + (12 * 10 + 10)


def test_evaluation_sends_compressed_embeddings_only(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = cvfl(4, compressor=Compressor(bits=5), embedding_dim=16)
    trainer = make_trainer(tmp_path, limit_train_batches=0)
    trainer.validate(model, datamodule=dm, verbose=False)
    n = len(dm.val_set)
    sizes = [128] * (n // 128) + ([n % 128] if n % 128 else [])
    expected = {
        (k, "party0", "embeddings"): sum(compressed_nbytes(s * 16, 5, 1.0) for s in sizes) for k in model.passive
    }
    expected.update(split_ledger(dm))
    assert dict(model.wire.bytes) == expected


def test_evaluation_uses_the_compressed_embeddings():
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = cvfl(4, compressor=Compressor(bits=2))
    model.build(dm.party_specs, dm.task)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        got = model.party_logits(batch)["party0"]
        e = {k: model.party_models[k].encoder(batch.features[k]) for k in model.party_names}
        z = torch.cat([e[k] if k == "party0" else dequantize(*quantize(e[k], 2)) for k in model.party_names], dim=1)
        uncompressed = model.top(torch.cat(list(e.values()), dim=1))
    assert torch.allclose(got, model.top(z), atol=1e-6)
    assert not torch.allclose(got, uncompressed, atol=1e-4)


def test_learns_digits(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = cvfl(4, lr=0.1, momentum=0.9, embedding_dim=16, local_iterations=2, compressor=Compressor(bits=8))
    trainer = make_trainer(tmp_path, max_epochs=4)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert metrics["test/acc/party0"] >= 0.6  # chance is 0.1; 0.73 observed
    assert metrics["test/acc/mean"] == metrics["test/acc/party0"]  # only the active party predicts


# ------------------------------------------------------------------------------------------------ bad input
def test_masking_backend_is_refused(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = Recording(parties=mlp_parties(4), top_model=MLP, aggregation=DHMasking())
    with pytest.raises(ValueError, match=r"CVFL concatenates.*DHMasking.*lvfl.privacy.Plain"):
        make_trainer(tmp_path).fit(model, datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"local_iterations": 0}, r"model.local_iterations must be an int >= 1, got 0$"),
        ({"local_iterations": 1.5}, r"model.local_iterations must be an int >= 1, got 1.5$"),
        ({"local_iterations": True}, r"model.local_iterations must be an int >= 1, got True$"),
        ({"top_hidden": 0}, r"model.top_hidden must be an int >= 1, got 0$"),
    ],
)
def test_bad_protocol_arguments_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CVFL(parties=mlp_parties(2), top_model=MLP, **kwargs)


def test_compressor_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="model.compressor must be an lvfl.compression.Compressor, got dict"):
        CVFL(parties=mlp_parties(2), top_model=MLP, compressor={"bits": 8})
