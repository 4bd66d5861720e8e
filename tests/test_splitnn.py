"""SplitNN (Pyvertical) against hand-written references: the update, the ledger, evaluation, and bad input."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import (
    BAD_LABELS_MESSAGE,
    bad_labels_datamodule,
    dh_key_ledger,
    make_trainer,
    mlp_parties,
    recording,
    split_ledger,
)

from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols.splitnn import SplitNN

Recording = recording(SplitNN)


def splitnn(n: int, aggregation=None, fusion: str = "concat", embedding_dim: int = 8, **kwargs) -> Recording:
    """A SplitNN with n MLP bottom models and a top model Linear(fused, 16) -> ReLU -> Linear(10), all plain SGD."""
    return Recording(
        parties=mlp_parties(n, **kwargs),
        top_model=partial(MLP, hidden=[]),
        aggregation=aggregation,
        embedding_dim=embedding_dim,
        top_hidden=16,
        fusion=fusion,
    )


def reference_step(encoders: dict, top: torch.nn.Module, batch, fusion: str, lr: float) -> dict[str, torch.Tensor]:
    """One split-learning step as one plain PyTorch model: encoders -> fuse -> top model -> CE -> SGD on everything."""
    emb = [enc(batch.features[k]) for k, enc in encoders.items()]
    scale = len(emb) if fusion == "mean" else 1
    z = torch.cat(emb, dim=1) if fusion == "concat" else torch.stack(emb).sum(0) / scale
    loss = F.cross_entropy(top(z), batch.labels)
    params = {f"{k}.{n}": p for k, enc in encoders.items() for n, p in enc.named_parameters()}
    params |= {f"top.{n}": p for n, p in top.named_parameters()}
    grads = torch.autograd.grad(loss, list(params.values()))
    return {n: p.detach() - lr * g for (n, p), g in zip(params.items(), grads, strict=True)}


@pytest.mark.parametrize(
    ("fusion", "aggregation"), [("concat", Plain), ("sum", Plain), ("mean", Plain), ("sum", DHMasking)]
)
def test_one_step_equals_hand_written_reference(tmp_path, fusion, aggregation):
    """Same parameters as one centralised model: the gradients sent over the wire are the right ones."""
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = splitnn(4, aggregation=aggregation(), fusion=fusion, lr=0.1)
    model.build(dm.party_specs, dm.task)
    encoders = {k: copy.deepcopy(model.party_models[k].encoder) for k in model.party_names}
    top = copy.deepcopy(model.top)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    before_named = {f"{k}.{n}": p.detach().clone() for k, enc in encoders.items() for n, p in enc.named_parameters()}
    before_named |= {f"top.{n}": p.detach().clone() for n, p in top.named_parameters()}
    expected = reference_step(encoders, top, batch, fusion, lr=0.1)
    got = {f"{k}.{n}": p for k in model.party_names for n, p in model.party_models[k].encoder.named_parameters()}
    got |= {f"top.{n}": p for n, p in model.top.named_parameters()}
    assert got.keys() == expected.keys()
    atol = 1e-6 if aggregation is Plain else 1e-4  # fixed point (2^-16) perturbs DHMasking's forward values only
    for name, p in got.items():
        assert torch.allclose(p.detach(), expected[name], atol=atol), name
        update, expected_update = p.detach() - before_named[name], expected[name] - before_named[name]
        rel = ((update - expected_update).norm() / expected_update.norm()).item()
        assert rel < 1e-4, f"{name}: the update is off by {rel:.1e} of its size"  # observed <= 7e-6 (DHMasking)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(moved) == len(before), "every parameter (bottom and top) must move"


def test_every_parameter_gets_a_gradient(tmp_path):
    """No unused parameters (the party heads are gone), so DDP without find_unused_parameters is fine."""
    dm = Digits(num_parties=4, batch_size=64)
    model = splitnn(4)
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name
    for k in model.party_names:
        assert isinstance(model.party_models[k].head, torch.nn.Identity)
    opt_params = {k: {id(p) for g in o.param_groups for p in g["params"]} for k, o in model.party_optimizers().items()}
    assert {id(p) for p in model.top.parameters()} <= opt_params["party0"]
    assert sum(len(v) for v in opt_params.values()) == len(list(model.parameters()))  # each parameter, one owner


def expected_epoch_ledger(model: SplitNN, n: int, share_bytes: int, k_keys: int = 0) -> dict[tuple[str, str, str], int]:
    """The analytic bytes of one training epoch on n samples: E_k up (shares), dloss/dE_k down (float32), keys."""
    d = model.embedding_dim
    out = {}
    for k in model.passive:
        out[(k, model.active, "embeddings")] = n * d * share_bytes
        out[(model.active, k, "gradients")] = n * d * 4
    if k_keys:  # DHMasking
        out.update(dh_key_ledger(model))
    return out


@pytest.mark.parametrize(
    ("fusion", "aggregation", "share_bytes"), [("concat", Plain, 4), ("sum", DHMasking, 4), ("mean", Plain, 4)]
)
def test_ledger_equals_analytic_epoch_count(tmp_path, fusion, aggregation, share_bytes):
    dm = Digits(num_parties=4, batch_size=100)  # 100 does not divide the train set: the last batch is short
    model = splitnn(4, aggregation=aggregation(), fusion=fusion, embedding_dim=16)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    k_keys = len(model.passive) if aggregation is DHMasking else 0
    expected = expected_epoch_ledger(model, len(dm.train_set), share_bytes, k_keys)
    expected.update(split_ledger(dm))  # the active party's stratified split, set-up traffic
    assert dict(model.wire.bytes) == expected
    assert model.wire.total_bytes() == sum(expected.values())
    batches = len(dm.train_dataloader())
    for k in model.passive:
        assert model.wire.messages[(k, "party0", "embeddings")] == batches
        assert model.wire.messages[("party0", k, "gradients")] == batches


def test_learns_digits_and_reports_the_active_party_only(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = splitnn(4, embedding_dim=16, lr=0.1, momentum=0.9)
    trainer = make_trainer(tmp_path, max_epochs=4)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert metrics["test/acc/party0"] >= 0.7  # chance is 0.1; seeds 0-3 gave 0.85-0.92
    assert metrics["test/acc/mean"] == pytest.approx(metrics["test/acc/party0"], abs=1e-6)
    assert not any(key.startswith("test/acc/party1") for key in metrics)
    assert model.predicting_parties == ["party0"]


def test_dh_sum_learns_digits(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = splitnn(4, aggregation=DHMasking(), fusion="sum", embedding_dim=16, lr=0.1, momentum=0.9)
    trainer = make_trainer(tmp_path, max_epochs=4)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert metrics["test/acc/party0"] >= 0.65  # chance is 0.1; seeds 0-3 gave 0.75-0.89


def test_fused_width_follows_fusion():
    dm = Digits(num_parties=4)
    for fusion, width in (("concat", 4 * 8), ("sum", 8), ("mean", 8)):
        model = splitnn(4, fusion=fusion)
        model.build(dm.party_specs, dm.task)
        assert model.fused_dim == width
        assert model.top.encoder[1].in_features == width  # Flatten, then the first Linear
        assert model.top.head[-1].out_features == 10


def test_single_party_sends_nothing(tmp_path):
    dm = Digits(num_parties=4, participants=[0], batch_size=128)
    model = splitnn(1)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    assert model.wire.total_bytes() == 0


def test_checkpoint_restores_the_top_model(tmp_path):
    dm = Digits(num_parties=4, batch_size=256)
    model = splitnn(4, aggregation=DHMasking(), fusion="mean")
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    restored = splitnn(4, aggregation=DHMasking(), fusion="mean")
    make_trainer(tmp_path, limit_val_batches=0).fit(restored, datamodule=dm, ckpt_path=tmp_path / "last.ckpt")
    for (name, p), q in zip(model.top.named_parameters(), restored.top.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert restored.mask_step == model.mask_step == len(dm.train_dataloader())


# ------------------------------------------------------------------------------------------------ bad input
def test_concat_with_masking_is_refused(tmp_path):
    model = splitnn(4, aggregation=DHMasking(), fusion="concat")
    with pytest.raises(ValueError, match=r"masking a concatenation makes no sense.*fusion: sum") as err:
        make_trainer(tmp_path).fit(model, datamodule=Digits(num_parties=4))
    assert "DHMasking" in str(err.value)
    assert model.wire.total_bytes() == 0  # refused before any key crossed the wire


def test_unknown_fusion_names_the_option():
    with pytest.raises(ValueError, match=r"model.fusion must be one of \['concat', 'sum', 'mean'\].*'max'"):
        splitnn(4, fusion="max")


def test_bad_top_hidden_names_the_option():
    with pytest.raises(ValueError, match=r"model.top_hidden must be an int >= 1, got 0$"):
        SplitNN(parties=mlp_parties(4), top_model=MLP, top_hidden=0)


def test_labels_outside_class_range_fail(tmp_path):
    with pytest.raises(ValueError, match=BAD_LABELS_MESSAGE):
        make_trainer(tmp_path).fit(splitnn(4), datamodule=bad_labels_datamodule())
