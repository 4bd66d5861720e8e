"""EASTER against hand-written references: the update, the global embedding, the ledger, and bad input."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import (
    BAD_LABELS_MESSAGE,
    bad_labels_datamodule,
    dh_key_ledger,
    easter,
    make_trainer,
    mlp_parties,
    recording,
    run_ddp,
    split_ledger,
)

from lvfl.datamodules import Digits, VerticalDataModule
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols import EASTER


def recording_easter(n: int, aggregation=None, **kwargs) -> EASTER:
    """`easter(n, ...)` that keeps its batches and every global embedding beside the plain sum (see `recording`)."""
    base = easter(n, aggregation=aggregation, **kwargs)
    return recording(EASTER, aggregates=True)(
        parties=base.party_configs, aggregation=base.aggregation, embedding_dim=base.embedding_dim
    )


def reference_step(models: dict, batch, lr: float) -> dict[str, dict[str, torch.Tensor]]:
    """One EASTER step written out by hand: party k's parameters move along its own loss gradient only."""
    names = list(models)
    c = len(names)
    new = {}
    for k in names:
        emb = [models[j].encoder(batch.features[j]) for j in names]
        e = sum(em if j == k else em.detach() for j, em in zip(names, emb, strict=True)) / c
        loss = F.cross_entropy(models[k].head(e), batch.labels)
        params = dict(models[k].named_parameters())
        grads = torch.autograd.grad(loss, list(params.values()))
        new[k] = {n: p.detach() - lr * g for (n, p), g in zip(params.items(), grads, strict=True)}
    return new


@pytest.mark.parametrize("aggregation", [Plain, DHMasking])
def test_one_step_equals_hand_written_reference(tmp_path, aggregation):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = recording_easter(4, aggregation=aggregation(), lr=0.1)
    model.build(dm.party_specs, dm.task)
    before = copy.deepcopy({k: model.party_models[k] for k in model.party_names})
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected = reference_step(before, batch, lr=0.1)
    # fixed point (2^-16) only perturbs DHMasking's forward values, never which parameters move
    atol = 1e-6 if aggregation is Plain else 1e-4
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            assert torch.allclose(p.detach(), expected[k][name], atol=atol), f"{k}.{name}"
            assert not torch.equal(p.detach(), dict(before[k].named_parameters())[name].detach()), f"{k}.{name} frozen"


def closed_form_step(
    params: dict, features: dict, labels: np.ndarray, lr: float, rule: str = "paper"
) -> dict[str, dict[str, np.ndarray]]:
    """One EASTER step from the papers' equations alone (numpy, float64, no autograd), for one-layer parties.

    Party k: E_k = relu(X_k W_k^T + b_k) (its embedding network h_k), E = (1/C) sum_j E_j (VFedMH Eq. 7, the masks
    cancel), R_k = E V_k^T + c_k (its prediction network p_k), L_k = cross-entropy of R_k, mean over the N rows
    (Eq. 8), and theta_k <- theta_k - eta * grad_{theta_k} L_k (Eq. 3). With G_k = (softmax(R_k) - onehot(Y)) / N:
    dL_k/dV_k = G_k^T E, dL_k/dc_k = sum_rows G_k, and, since dE/dE_k = 1/C, the gradient reaching h_k is
    dL_k/dZ_k = (1/C) (G_k V_k) * 1[Z_k > 0], so dL_k/dW_k = dZ_k^T X_k and dL_k/db_k = sum_rows dZ_k.

    The other `rule`s are the two departures benchmarks/paper/easter_ablation.py measures: "unscaled" drops the 1/C
    (G_k V_k * 1[Z_k > 0]), "joint" moves h_k by every party's loss ((1/C) sum_j G_j V_j * 1[Z_k > 0]).
    """
    names = list(params)
    c = len(names)
    z = {k: features[k] @ params[k]["encoder.1.weight"].T + params[k]["encoder.1.bias"] for k in names}
    e = sum(np.maximum(z[k], 0.0) for k in names) / c
    onehot = np.eye(params[names[0]]["head.0.bias"].shape[0])[labels]
    g = {}
    for k in names:
        r = e @ params[k]["head.0.weight"].T + params[k]["head.0.bias"]
        p = np.exp(r - r.max(axis=1, keepdims=True))
        g[k] = (p / p.sum(axis=1, keepdims=True) - onehot) / len(labels)
    at_e = {k: g[k] @ params[k]["head.0.weight"] for k in names}  # dL_k/dE
    new = {}
    for k in names:
        share = {"paper": at_e[k] / c, "unscaled": at_e[k], "joint": sum(at_e.values()) / c}[rule]
        dz = share * (z[k] > 0)
        grads = {
            "head.0.weight": g[k].T @ e,
            "head.0.bias": g[k].sum(axis=0),
            "encoder.1.weight": dz.T @ features[k],
            "encoder.1.bias": dz.sum(axis=0),
        }
        new[k] = {n: params[k][n] - lr * grads[n] for n in grads}
    return new


@pytest.mark.parametrize("parties", [2, 4])
def test_one_step_equals_the_papers_equations_in_closed_form(tmp_path, parties):
    """The EASTER step against Eq. 3, 7 and 8 written out by hand: in particular each embedding network h_k moves by
    the 1/C share of its own party's loss gradient at E (the mean of Eq. 7), never by another party's loss."""
    torch.manual_seed(0)
    dm = Digits(num_parties=parties, batch_size=64)
    model = recording_easter(parties, aggregation=Plain(), lr=0.5, hidden=())
    model.build(dm.party_specs, dm.task)
    before = {
        k: {n: p.detach().double().numpy().copy() for n, p in model.party_models[k].named_parameters()}
        for k in model.party_names
    }
    assert set(before["party0"]) == {"encoder.1.weight", "encoder.1.bias", "head.0.weight", "head.0.bias"}
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    features = {k: batch.features[k].flatten(1).double().numpy() for k in model.party_names}
    expected = closed_form_step(before, features, batch.labels.numpy(), lr=0.5)
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            moved = np.abs(expected[k][name] - before[k][name]).max()
            assert moved > 1e-4, f"{k}.{name} does not move in the reference"
            np.testing.assert_allclose(p.detach().double().numpy(), expected[k][name], atol=1e-5, err_msg=f"{k}.{name}")


@pytest.mark.parametrize("rule", ["unscaled", "joint", "whole"])
def test_the_ablations_departures_move_the_encoders_as_they_say(tmp_path, rule):
    """benchmarks/paper/easter_ablation.py's variant steps against the closed form of the departure each one names;
    and EASTER's `encoder_gradient="whole"` (the stated variant fmnist_whole_gradient.yaml) is the unscaled one."""
    from benchmarks.paper import easter_ablation

    cls = {"unscaled": easter_ablation.UnscaledShareEASTER, "joint": easter_ablation.JointGradientEASTER}.get(rule)
    options = {"encoder_gradient": "whole"} if rule == "whole" else {}
    rule = "unscaled" if rule == "whole" else rule
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    base = easter(4, aggregation=Plain(), lr=0.5, hidden=())
    model = recording(cls or EASTER)(
        parties=base.party_configs, aggregation=Plain(), embedding_dim=base.embedding_dim, **options
    )
    model.build(dm.party_specs, dm.task)
    before = {
        k: {n: p.detach().double().numpy().copy() for n, p in model.party_models[k].named_parameters()}
        for k in model.party_names
    }
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    features = {k: batch.features[k].flatten(1).double().numpy() for k in model.party_names}
    expected = closed_form_step(before, features, batch.labels.numpy(), lr=0.5, rule=rule)
    paper = closed_form_step(before, features, batch.labels.numpy(), lr=0.5)
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            np.testing.assert_allclose(p.detach().double().numpy(), expected[k][name], atol=1e-5, err_msg=f"{k}.{name}")
        assert np.abs(expected[k]["encoder.1.weight"] - paper[k]["encoder.1.weight"]).max() > 1e-4


@pytest.mark.parametrize("k", ["party0", "party2"])
def test_party_loss_reaches_only_its_own_parameters(tmp_path, k):
    """Run the real step with only party k's loss live: party k's parameters take the reference update of its own
    loss, and no gradient of that loss crosses the wire into another party's model (their gradients stay None)."""
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=32)
    model = recording_easter(4, lr=0.1)
    model.build(dm.party_specs, dm.task)
    before = copy.deepcopy({j: model.party_models[j] for j in model.party_names})
    for j in model.party_names:  # every other party's prediction R_j is cut from the graph: loss_j reaches nothing
        if j != k:
            model.party_models[j].head.register_forward_hook(lambda module, args, out: out.detach())
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected = reference_step(before, batch, lr=0.1)[k]
    for name in model.party_names:
        for pname, p in model.party_models[name].named_parameters():
            if name == k:
                assert p.grad is not None, f"{name}.{pname} got no gradient"
                assert p.grad.abs().sum() > 0, f"{name}.{pname} got a zero gradient"
                assert torch.allclose(p.detach(), expected[pname], atol=1e-6), f"{name}.{pname}"
            else:
                assert p.grad is None, f"party {k}'s loss reached {name}.{pname}"
                assert torch.equal(p.detach(), dict(before[name].named_parameters())[pname].detach()), name


def test_dh_global_embedding_matches_plain_at_every_step(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = recording_easter(4, aggregation=DHMasking())
    make_trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(model, datamodule=dm)
    c = model.num_parties
    assert len(model.aggregates) == 2 * len(dm.train_dataloader())
    for step, (masked, plain) in enumerate(model.aggregates):
        diff = ((masked - plain) / c).abs().max().item()  # the global embedding is the sum / C
        assert diff <= c * 2**-16, f"step {step}: global embeddings differ by {diff}"


def test_dh_and_plain_runs_track_each_other(tmp_path):
    """Same seed, separate runs: the global embedding of DHMasking follows Plain's step by step."""
    runs = {}
    for backend in (Plain, DHMasking):
        torch.manual_seed(0)
        model = recording_easter(4, aggregation=backend())
        make_trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model, datamodule=Digits(batch_size=128))
        runs[backend.__name__] = [m for m, _ in model.aggregates]
    c = 4
    for step, (p, d) in enumerate(zip(runs["Plain"], runs["DHMasking"], strict=True)):
        assert ((p - d) / c).abs().max().item() <= c * 2**-16, f"step {step}"


def expected_epoch_ledger(model: EASTER, dm: VerticalDataModule, share_bytes: int) -> dict[tuple[str, str, str], int]:
    """The analytic byte count of one training epoch of EASTER (float32 tensors; shares at `share_bytes`)."""
    n = len(dm.train_set)
    d, m = model.embedding_dim, dm.task.num_classes
    out = {}
    for k in model.passive:
        out[(k, model.active, "embeddings")] = n * d * share_bytes
        out[(model.active, k, "global_embedding")] = n * d * 4
        out[(k, model.active, "predictions")] = n * m * 4
        out[(model.active, k, "gradients")] = n * m * 4
    return out


@pytest.mark.parametrize(("aggregation", "share_bytes"), [(Plain, 4), (DHMasking, 4)])
def test_ledger_equals_analytic_epoch_count(tmp_path, aggregation, share_bytes):
    dm = Digits(num_parties=4, batch_size=100)  # 100 does not divide the train set: the last batch is short
    model = easter(4, aggregation=aggregation(), embedding_dim=16)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    expected = expected_epoch_ledger(model, dm, share_bytes)
    if aggregation is DHMasking:
        expected.update(dh_key_ledger(model))
    expected.update(split_ledger(dm))  # the active party's stratified split, set-up traffic
    assert dict(model.wire.bytes) == expected
    assert model.wire.total_bytes() == sum(expected.values())
    batches = len(dm.train_dataloader())
    assert model.wire.messages[("party1", "party0", "embeddings")] == batches


def test_single_party_sends_nothing(tmp_path):
    dm = Digits(num_parties=4, participants=[0], batch_size=128)
    model = easter(1)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    assert model.wire.total_bytes() == 0
    assert model.party_names == ["party0"]


def test_mask_step_advances_in_every_stage(tmp_path):
    dm = Digits(num_parties=4, batch_size=256)
    model = easter(4, aggregation=DHMasking())
    trainer = make_trainer(tmp_path)
    trainer.fit(model, datamodule=dm)
    after_fit = model.mask_step
    assert after_fit == len(dm.train_dataloader()) + len(dm.val_dataloader())
    trainer.test(model, datamodule=dm, verbose=False)
    assert model.mask_step == after_fit + len(dm.test_dataloader())


def test_test_reports_every_party_and_the_mean(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = easter(4)
    trainer = make_trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    per_party = [metrics[f"test/acc/party{i}"] for i in range(4)]
    assert metrics["test/acc/mean"] == pytest.approx(sum(per_party) / 4, abs=1e-6)
    assert "test/auroc/party0" not in metrics  # digits is multiclass


def test_binary_task_reports_auroc_like_sklearn(tmp_path):
    from sklearn.metrics import accuracy_score, roc_auc_score

    from lvfl.datamodules import BreastCancer

    dm = BreastCancer(num_parties=3, batch_size=64)
    model = easter(3, aggregation=DHMasking(), momentum=0.9)
    trainer = make_trainer(tmp_path, max_epochs=5)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    preds = trainer.predict(model, datamodule=dm)
    labels = dm.test_set.labels.numpy()
    assert torch.equal(torch.cat([p["ids"] for p in preds]), dm.test_set.ids)
    aurocs = []
    for name in ("party0", "party1", "party2"):
        probs = torch.cat([p["probs"][name] for p in preds]).numpy()
        aurocs.append(roc_auc_score(labels, probs[:, 1]))
        assert metrics[f"test/auroc/{name}"] == pytest.approx(aurocs[-1], abs=1e-4)
        assert metrics[f"test/acc/{name}"] == pytest.approx(accuracy_score(labels, probs.argmax(1)), abs=1e-6)
        assert aurocs[-1] > 0.9
    assert metrics["test/auroc/mean"] == pytest.approx(sum(aurocs) / 3, abs=1e-4)


# ------------------------------------------------------------------------------------------------ bad input
def test_dh_masking_with_one_passive_party_is_refused(tmp_path):
    dm = Digits(num_parties=2, batch_size=128)
    with pytest.raises(ValueError, match="at least two passive parties.*its own embedding in the clear"):
        make_trainer(tmp_path).fit(easter(2, aggregation=DHMasking()), datamodule=dm)


def test_party_count_mismatch_names_both_counts(tmp_path):
    dm = Digits(num_parties=4)
    with pytest.raises(ValueError, match=r"model.parties has 3 entries but the datamodule has 4 parties"):
        make_trainer(tmp_path).fit(easter(3), datamodule=dm)


def test_nan_features_fail_before_training(tmp_path):
    import numpy as np

    class Broken(VerticalDataModule):
        num_classes = 2

        def load(self):
            rng = np.random.default_rng(0)
            x = rng.normal(size=(200, 8))
            x[5, 6] = np.inf  # column 6 belongs to party3 of 4
            return x, np.arange(200) % 2

    model = recording_easter(4)
    with pytest.raises(ValueError, match="party3 has 1 non-finite feature values"):
        make_trainer(tmp_path).fit(model, datamodule=Broken(num_parties=4))
    assert model.batches == []


def test_labels_outside_class_range_fail(tmp_path):
    with pytest.raises(ValueError, match=BAD_LABELS_MESSAGE):
        make_trainer(tmp_path).fit(easter(4), datamodule=bad_labels_datamodule())


def test_out_of_range_embedding_names_the_party():
    dm = Digits(num_parties=4, batch_size=32)
    model = easter(4, aggregation=DHMasking())
    model.build(dm.party_specs, dm.task)
    batch = next(iter(dm.train_dataloader()))
    local = model.local_embeddings(batch)
    local["party2"] = local["party2"] * 0 + 1e15
    with pytest.raises(ValueError, match=r"party 'party2': max \|value\| = 1e\+15 is out of range for fixed point"):
        model.aggregate_embeddings(local)


def test_meter_epoch_bytes_count_training_only(tmp_path):
    """`train/comm/epoch_bytes` is the analytic training epoch: validation and key set-up traffic excluded."""
    import csv

    dm = Digits(num_parties=4, batch_size=128)
    model = easter(4, aggregation=DHMasking(), embedding_dim=16)
    make_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=2).fit(model, datamodule=dm)
    expected = expected_epoch_ledger(model, dm, share_bytes=4)
    (path,) = list(tmp_path.rglob("metrics.csv"))
    rows = [r for r in csv.DictReader(path.open()) if r.get("train/comm/epoch_bytes")]
    assert len(rows) == 2
    for row in rows:
        assert float(row["train/comm/epoch_bytes"]) == sum(expected.values())
        assert float(row["train/comm/epoch_bytes/embeddings"]) == sum(
            v for (_, _, tag), v in expected.items() if tag == "embeddings"
        )
        assert float(row["train/comm/epoch_bytes/party2_to_party0"]) == sum(
            v for (src, _, _), v in expected.items() if src == "party2"
        )
    assert model.wire.total_bytes() > 2 * sum(expected.values())  # validation and keys did cross the wire
    (setup,) = [r for r in csv.DictReader(path.open()) if r.get("train/comm/setup_bytes")]
    set_up = sum(dh_key_ledger(model).values()) + sum(split_ledger(dm).values())  # sanity-val excluded
    assert float(setup["train/comm/setup_bytes"]) == set_up
    assert float(setup["train/comm/setup_bytes/keys"]) == sum(dh_key_ledger(model).values())
    assert float(setup["train/comm/setup_bytes/split"]) == sum(split_ledger(dm).values())


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    """EASTER with DH masking under DDP: per-rank masks and nonces, one backward per step, the ledger summed."""
    output = run_ddp("configs/easter/wine.yaml", tmp_path)
    assert "tag  global_embedding" in output


@pytest.mark.parametrize("protocol", ["easter", "splitnn", "aggvfl"])
def test_a_diverging_party_under_plain_stops_the_run_naming_it_and_the_step(protocol, tmp_path):
    """Under Plain nothing range-checks the values: a party trained at lr 1e9 must not train on to NaN and exit 0."""
    from functools import partial

    from lvfl.models import MLP
    from lvfl.protocols import AggVFL, SplitNN

    parties = mlp_parties(4)
    parties[2].optimizer = partial(torch.optim.SGD, lr=1e9)
    model = {
        "easter": lambda: EASTER(parties=parties, embedding_dim=8),
        "splitnn": lambda: SplitNN(parties=parties, top_model=partial(MLP, hidden=[8]), embedding_dim=8),
        "aggvfl": lambda: AggVFL(parties=parties, embedding_dim=8),
    }[protocol]()
    torch.manual_seed(0)
    trainer = make_trainer(tmp_path, max_epochs=3, limit_val_batches=0)
    with pytest.raises(FloatingPointError, match=r"party '\w+': non-finite .* at training step \d+") as err:
        trainer.fit(model, datamodule=Digits(num_parties=4, batch_size=64))
    message = str(err.value)
    if protocol == "splitnn":  # the NaN may appear elsewhere first (through the top model): party2 is then the
        # largest finite input named in the message
        assert message.startswith("party 'party2'") or "of the finite parties: party2" in message, message
    else:
        assert message.startswith("party 'party2'"), message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_check_finite_agrees_with_an_elementwise_check(dtype):
    """The quick sum clears finite values only: NaN/inf anywhere is caught, and finite values whose sum overflows
    pass (their exact check runs); compared with `torch.isfinite` value by value."""
    model = easter(4)
    big = torch.finfo(dtype).max
    rng = np.random.default_rng(0)
    cases = [torch.tensor([big, big, -1.0]), torch.tensor([-big, -big]), torch.tensor([big, -big, big])]
    for _ in range(60):
        x = torch.from_numpy(rng.normal(size=(5, 4)))
        spots = rng.integers(0, 20, size=rng.integers(0, 3))
        x.view(-1)[spots] = torch.from_numpy(rng.choice([np.nan, np.inf, -np.inf, 1e300], size=len(spots)))
        cases.append(x)
    for x in cases:
        x = x.to(dtype)
        values = {"party0": torch.zeros(3, dtype=dtype), "party2": x}
        if bool(torch.isfinite(x).all()):
            model.check_finite(values, "embedding")
        else:
            with pytest.raises(FloatingPointError, match=r"party 'party2': non-finite embedding"):
                model.check_finite(values, "embedding")


def test_nan_features_at_one_party_are_named_before_any_update(tmp_path):
    dm = Digits(num_parties=4, batch_size=64)
    dm.setup()
    dm.train_set.features["party3"][:, 0] = float("nan")  # in every batch, so in the first
    model = easter(4)
    with pytest.raises(FloatingPointError, match=r"party 'party3': non-finite embedding .* training step 0"):
        make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)


def test_an_unknown_encoder_gradient_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"model.encoder_gradient must be one of \['mean_share', 'whole'\], got 'half'"
    ):
        EASTER(parties=mlp_parties(2), encoder_gradient="half")
