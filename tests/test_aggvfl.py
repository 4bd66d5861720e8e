"""Agg_VFL against hand-written references: the update, the ledger, the learned weights, metrics and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import dh_key_ledger, make_trainer, mlp_parties, recording, split_ledger

from lvfl.datamodules import Digits, VerticalDataModule
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols.aggvfl import AggVFL

Recording = recording(AggVFL)


def aggvfl(n: int, aggregate: str = "mean", aggregation=None, cls=AggVFL, **kwargs) -> AggVFL:
    """An AggVFL module with n MLP parties (plain SGD unless told otherwise)."""
    return cls(parties=mlp_parties(n, **kwargs), aggregation=aggregation, embedding_dim=8, aggregate=aggregate)


def reference_step(models: dict, weight_logits, batch, aggregate: str, lr: float):
    """One Agg_VFL step written out by hand: one joint loss on the aggregated logits, SGD on every parameter."""
    names = list(models)
    logits = [models[k](batch.features[k]) for k in names]
    if aggregate == "weighted":
        w = weight_logits.softmax(0)
        agg = sum(w[i] * lk for i, lk in enumerate(logits))
    else:
        agg = sum(logits) / (len(names) if aggregate == "mean" else 1)
    loss = F.cross_entropy(agg, batch.labels)
    params = {k: dict(models[k].named_parameters()) for k in names}
    flat = [p for k in names for p in params[k].values()] + ([weight_logits] if aggregate == "weighted" else [])
    grads = iter(torch.autograd.grad(loss, flat))
    new = {k: {n: p.detach() - lr * next(grads) for n, p in params[k].items()} for k in names}
    new_w = weight_logits.detach() - lr * next(grads) if aggregate == "weighted" else None
    return new, new_w


@pytest.mark.parametrize(
    ("aggregate", "aggregation"), [("mean", Plain), ("sum", Plain), ("weighted", Plain), ("mean", DHMasking)]
)
def test_one_step_equals_hand_written_reference(tmp_path, aggregate, aggregation):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = aggvfl(4, aggregate, aggregation(), cls=Recording, lr=0.1)
    model.build(dm.party_specs, dm.task)
    if aggregate == "weighted":  # start away from uniform so the weights matter in the reference
        with torch.no_grad():
            model.weight_logits.copy_(torch.tensor([0.5, -0.2, 0.1, -0.4]))
    before = copy.deepcopy({k: model.party_models[k] for k in model.party_names})
    w_before = model.weight_logits.detach().clone().requires_grad_(True) if aggregate == "weighted" else None
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected, expected_w = reference_step(before, w_before, batch, aggregate, lr=0.1)
    # fixed point (2^-16) only perturbs DHMasking's forward values, never which parameters move
    atol = 1e-6 if aggregation is Plain else 1e-4
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            assert torch.allclose(p.detach(), expected[k][name], atol=atol), f"{k}.{name}"
            assert not torch.equal(p.detach(), dict(before[k].named_parameters())[name].detach()), f"{k}.{name} frozen"
    if aggregate == "weighted":
        assert torch.allclose(model.weight_logits.detach(), expected_w, atol=1e-6)


def expected_epoch_ledger(model: AggVFL, dm: VerticalDataModule, share_bytes: int) -> dict[tuple[str, str, str], int]:
    """The analytic byte count of one Agg_VFL training epoch: logits up (at `share_bytes`), float32 gradients down."""
    n, m = len(dm.train_set), dm.task.num_classes
    out = {}
    for k in model.passive:
        out[(k, model.active, "predictions")] = n * m * share_bytes
        out[(model.active, k, "gradients")] = n * m * 4
    return out


@pytest.mark.parametrize(
    ("aggregate", "aggregation", "share_bytes"), [("mean", Plain, 4), ("sum", DHMasking, 4), ("weighted", Plain, 4)]
)
def test_ledger_equals_analytic_epoch_count(tmp_path, aggregate, aggregation, share_bytes):
    dm = Digits(num_parties=4, batch_size=100)  # 100 does not divide the train set: the last batch is short
    model = aggvfl(4, aggregate, aggregation())
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    expected = expected_epoch_ledger(model, dm, share_bytes)
    if aggregation is DHMasking:
        expected.update(dh_key_ledger(model))
    expected.update(split_ledger(dm))  # the active party's stratified split, set-up traffic
    assert dict(model.wire.bytes) == expected
    batches = len(dm.train_dataloader())
    for k in model.passive:
        assert model.wire.messages[(k, model.active, "predictions")] == batches
        assert model.wire.messages[(model.active, k, "gradients")] == batches


def test_weighted_with_masking_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"aggregate='weighted'.*DHMasking.*cannot see.*unweighted sum"):
        make_trainer(tmp_path).fit(aggvfl(4, "weighted", DHMasking()), datamodule=Digits(num_parties=4))


def test_unknown_aggregate_names_the_option():
    with pytest.raises(ValueError, match=r"model.aggregate must be one of \['sum', 'mean', 'weighted'\].*'max'"):
        aggvfl(4, "max")


def test_learned_weights_move_and_stay_a_distribution(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = aggvfl(4, "weighted", lr=0.5)
    make_trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(model, datamodule=dm)
    w = model.aggregation_weights().detach()
    assert torch.all(w > 0)
    assert w.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert (w - 0.25).abs().max().item() > 1e-3, f"weights did not move from uniform: {w.tolist()}"
    assert any(p is model.weight_logits for p in model.party_parameters(model.active))
    assert all(p is not model.weight_logits for k in model.passive for p in model.party_parameters(k))
    assert "weight_logits" in model.state_dict()


def test_learns_on_digits_and_reports_own_models_and_the_aggregate(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = aggvfl(4, "mean", lr=0.1, momentum=0.9, hidden=(32,))
    trainer = make_trainer(tmp_path, max_epochs=4, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert 0.6 <= metrics["test/acc/aggregate"] <= 0.95  # seeds 0-2 give 0.76-0.86
    assert metrics["test/acc/mean"] == pytest.approx(metrics["test/acc/aggregate"], abs=1e-6)
    own = [metrics[f"test/acc/party{i}"] for i in range(4)]
    # trained only through the aggregate, each own model learns a complementary part, far weaker alone (0.15-0.36)
    assert all(a < metrics["test/acc/aggregate"] - 0.2 for a in own), own
    preds = trainer.predict(model, datamodule=dm)
    probs = torch.cat([p["probs"]["aggregate"] for p in preds])
    acc = (probs.argmax(1) == dm.test_set.labels).float().mean().item()
    assert metrics["test/acc/aggregate"] == pytest.approx(acc, abs=1e-6)


def test_masked_run_reports_only_the_aggregate(tmp_path):
    """Under DHMasking the active party never sees a party's logits, so it cannot score them one by one."""
    dm = Digits(num_parties=4, batch_size=256)
    model = aggvfl(4, "sum", DHMasking())
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    assert sorted(k for k in metrics if k.startswith("test/acc/")) == ["test/acc/aggregate", "test/acc/mean"]
    assert metrics["test/acc/mean"] == metrics["test/acc/aggregate"]
    assert model.predicting_parties == []
    batches = len(dm.test_dataloader())
    assert model.wire.messages[("party1", "party0", "predictions")] == len(dm.train_dataloader()) + batches


def test_binary_task_reports_aggregate_auroc_as_mean(tmp_path):
    from sklearn.metrics import roc_auc_score

    from lvfl.datamodules import BreastCancer

    dm = BreastCancer(num_parties=3, batch_size=64)
    model = aggvfl(3, "mean", momentum=0.9)
    trainer = make_trainer(tmp_path, max_epochs=3, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    probs = torch.cat([p["probs"]["aggregate"] for p in trainer.predict(model, datamodule=dm)])
    auroc = roc_auc_score(dm.test_set.labels.numpy(), probs[:, 1].numpy())
    assert metrics["test/auroc/aggregate"] == pytest.approx(auroc, abs=1e-4)
    assert metrics["test/auroc/mean"] == pytest.approx(auroc, abs=1e-4)
    assert auroc > 0.9
