"""PraVFed against hand-written references: the one-shot ledger, E_p, the weights, learning, and bad input."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from helpers import REPO, dh_key_ledger, make_trainer, mlp_parties, run_ddp

from lvfl.commands.fit import build_cli
from lvfl.datamodules import Digits
from lvfl.privacy import DHMasking, LaplaceLabels, Plain, RandomizedResponse
from lvfl.protocols.pravfed import PraVFed


class Recording(PraVFed):
    """PraVFed that snapshots the passive models right after pre-training (steps 1-3)."""

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self.after_pretraining = {k: copy.deepcopy(self.party_models[k].state_dict()) for k in self.passive}


def pravfed(aggregation=None, embedding_dim: int = 8, local_epochs: int = 2, **kwargs) -> Recording:
    return Recording(
        parties=mlp_parties(4, lr=0.1, momentum=0.9, hidden=(32,)),
        aggregation=aggregation,
        embedding_dim=embedding_dim,
        label_mechanism=kwargs.pop("label_mechanism", LaplaceLabels(epsilon=1.0, seed=0)),
        local_epochs=local_epochs,
        **kwargs,
    )


def expected_ledger(model: PraVFed, dm: Digits, share_bytes: int, label_bytes: int) -> dict:
    """Steps 1-3 once: Y' down, acc_k up and w_k down (4 bytes each), train and val E_p shares up; keys for DH."""
    n, n_val = len(dm.train_set), len(dm.val_set)
    d = model.embedding_dim
    out = {}
    for k in model.passive:
        out[(model.active, k, "labels")] = n * label_bytes
        out[(k, model.active, "weights")] = 4
        out[(model.active, k, "weights")] = 4
        out[(k, model.active, "embeddings")] = (n + n_val) * d * share_bytes
    if isinstance(model.aggregation, DHMasking):  # its key exchange
        out.update(dh_key_ledger(model))
    return out


@pytest.mark.parametrize(("aggregation", "share_bytes"), [(Plain, 4), (DHMasking, 4)])
def test_ledger_is_one_shot(tmp_path, aggregation, share_bytes):
    ledgers = {}
    for epochs in (1, 3):
        dm = Digits(num_parties=4, batch_size=100)
        model = pravfed(aggregation(), embedding_dim=16)
        make_trainer(tmp_path, max_epochs=epochs).fit(model, datamodule=dm)
        ledgers[epochs] = dict(model.wire.bytes)
        assert model.wire.messages[("party1", "party0", "embeddings")] == 2  # train once, val once
    m = dm.task.num_classes
    assert ledgers[1] == expected_ledger(model, dm, share_bytes, label_bytes=m * 4)  # float32 Laplace rows
    assert ledgers[3] == ledgers[1]  # nothing per training step or epoch: no gradient goes down
    assert not any(tag in {"gradients", "predictions", "global_embedding"} for _, _, tag in ledgers[3])


def test_meter_counts_the_one_shot_transfers_as_setup(tmp_path):
    """What crosses before training (Y', weights, the training E_p, keys) is `setup_bytes`; the epochs carry 0."""
    import csv

    dm = Digits(num_parties=4, batch_size=100)
    model = pravfed(DHMasking(), embedding_dim=16)
    make_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=2).fit(model, datamodule=dm)
    expected = expected_ledger(model, dm, share_bytes=4, label_bytes=dm.task.num_classes * 4)
    for k in model.passive:  # the validation upload is validation traffic, not set-up
        expected[(k, model.active, "embeddings")] = len(dm.train_set) * 16 * 4
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    (setup,) = [r for r in rows if r.get("train/comm/setup_bytes")]
    assert float(setup["train/comm/setup_bytes"]) == sum(expected.values())
    assert float(setup["train/comm/setup_bytes/labels"]) == sum(v for (_, _, t), v in expected.items() if t == "labels")
    epochs = [float(r["train/comm/epoch_bytes"]) for r in rows if r.get("train/comm/epoch_bytes")]
    assert epochs == [0.0, 0.0]


def test_randomized_response_labels_are_int64_on_the_wire(tmp_path):
    dm = Digits(num_parties=4, batch_size=256)
    model = pravfed(label_mechanism=RandomizedResponse(epsilon=1.0, seed=0), local_epochs=1)
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    assert model.wire.bytes[(model.active, "party1", "labels")] == len(dm.train_set) * 8
    assert model.privacy_ledger.total_epsilon == 1.0  # released once for all passive parties


def hand_ep(model: PraVFed, features: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return sum(model.passive_weights[k] * model.party_models[k].eval().encoder(features[k]) for k in model.passive)


@pytest.mark.parametrize(("aggregation", "atol"), [(Plain, 1e-6), (DHMasking, 3 * 2**-16)])
def test_combined_embedding_is_the_weighted_sum(tmp_path, aggregation, atol):
    dm = Digits(num_parties=4, batch_size=128)
    model = pravfed(aggregation())
    make_trainer(tmp_path, max_epochs=1).fit(model, datamodule=dm)
    for split in (dm.train_set, dm.val_set):
        got = model.combined_embedding(split.ids)
        assert (got - hand_ep(model, split.features)).abs().max().item() <= atol
    with pytest.raises(KeyError, match="never uploaded"):
        model.combined_embedding(dm.test_set.ids)


def test_weights_are_accuracy_proportional_or_average(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = pravfed()
    make_trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=dm)
    train = dm.train_set
    target = model.protected_labels(train.ids).argmax(-1)
    with torch.no_grad():
        accs = {
            k: (model.party_models[k].eval()(train.features[k]).argmax(-1) == target).float().mean().item()
            for k in model.passive
        }
    assert model.passive_accuracy == pytest.approx(accs, abs=1e-6)
    total = sum(accs.values())
    assert model.passive_weights == pytest.approx({k: a / total for k, a in accs.items()}, abs=1e-6)
    assert sum(model.passive_weights.values()) == pytest.approx(1.0, abs=1e-6)

    average = pravfed(weighting="average")
    make_trainer(tmp_path, limit_val_batches=0).fit(average, datamodule=Digits(num_parties=4, batch_size=128))
    assert average.passive_weights == pytest.approx(dict.fromkeys(average.passive, 1 / 3))


def test_learns_on_digits_beyond_the_active_party_alone(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = pravfed(DHMasking(), embedding_dim=16, local_epochs=5)
    trainer = make_trainer(tmp_path, max_epochs=5)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    # Local (active party's 2 columns alone) reaches ~0.45; label noise at epsilon 1 keeps it below Central's ~0.97
    assert 0.65 < metrics["test/acc/party0"] < 0.97
    assert model.wire.messages[("party1", "party0", "embeddings")] == 3  # train, val, test: each once
    preds = trainer.predict(model, datamodule=dm)  # predict reuses the test upload
    assert model.wire.messages[("party1", "party0", "embeddings")] == 3
    assert torch.equal(torch.cat([p["ids"] for p in preds]), dm.test_set.ids)


def test_passive_models_change_only_in_pretraining(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = pravfed()
    model.prepare_datamodule(dm)  # before the data are read: PraVFed's label DP needs a label-free split
    model.build(dm.party_specs, dm.task)
    before = {k: copy.deepcopy(model.party_models[k].state_dict()) for k in model.party_names}
    make_trainer(tmp_path, max_epochs=2).fit(model, datamodule=dm)
    for k in model.passive:
        pre, post = before[k], model.after_pretraining[k]
        assert all(not torch.equal(pre[n], post[n]) for n in pre), f"{k} did not pre-train"
        final = model.party_models[k].state_dict()
        assert all(torch.equal(final[n], post[n]) for n in post), f"{k} changed after pre-training"
        assert all(p.grad is None and not p.requires_grad for p in model.party_models[k].parameters())
    active = model.party_models[model.active].state_dict()
    assert all(not torch.equal(active[n], before[model.active][n]) for n in active)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("local_epochs", [0, -1])
def test_zero_local_epochs_fails_clearly(local_epochs):
    with pytest.raises(ValueError, match="local_epochs"):
        pravfed(local_epochs=local_epochs)


def test_mechanism_missing_or_unfit_fails_clearly():
    with pytest.raises(TypeError, match="needs a label mechanism"):
        PraVFed(parties=mlp_parties(4), label_mechanism="laplace")
    default = PraVFed(parties=mlp_parties(4))  # None means the paper's mechanism, never no label DP
    assert isinstance(default.label_mechanism, LaplaceLabels)
    assert default.label_mechanism.epsilon == 1.0
    model = pravfed(label_mechanism=RandomizedResponse(epsilon=1.0, seed=0))
    regression = types.SimpleNamespace(num_classes=1, kind="regression")
    dm = Digits(num_parties=4)
    with pytest.raises(ValueError, match="RandomizedResponse protects class labels and does not fit a 'regression'"):
        model.build(dm.party_specs, regression)
    with pytest.raises(ValueError, match="weighting"):
        pravfed(weighting="median")


def test_dh_masking_with_one_passive_party_refuses():
    dm = Digits(num_parties=2)
    model = PraVFed(parties=mlp_parties(2), aggregation=DHMasking(), embedding_dim=8)
    with pytest.raises(ValueError, match="at least two passive parties"):
        model.build(dm.party_specs, dm.task)


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["digits", "breast_cancer", "diabetes"])
def test_configs_instantiate(tmp_path, monkeypatch, dataset):
    monkeypatch.chdir(REPO)
    args = ["--config", f"configs/pravfed/{dataset}.yaml", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    cli = build_cli(args, run=False)
    assert isinstance(cli.model, PraVFed)
    assert isinstance(cli.model.aggregation, DHMasking)
    assert cli.model.local_epochs == 10
    assert isinstance(cli.model.label_mechanism, LaplaceLabels)
    assert cli.model.label_mechanism.epsilon == 1.0


def test_resume_neither_pretrains_nor_uploads_again(tmp_path):
    dm = Digits(num_parties=4, batch_size=128)
    model = pravfed(DHMasking())
    trainer = make_trainer(tmp_path, max_epochs=1, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    resumed = pravfed(DHMasking(), label_mechanism=LaplaceLabels(epsilon=1.0, seed=1))
    make_trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(
        resumed, datamodule=dm, ckpt_path=tmp_path / "one.ckpt"
    )
    assert resumed.passive_weights == model.passive_weights
    assert torch.equal(resumed.combined_embedding(dm.train_set.ids), model.combined_embedding(dm.train_set.ids))
    before = {key: v for key, v in model.wire.bytes.items() if key[2] != "keys"}
    # a resume agrees on fresh keys, logged as resume/keys
    after = {key: v for key, v in resumed.wire.bytes.items() if key[2] not in ("keys", "resume/keys")}
    assert after == before
    assert resumed.privacy_ledger.total_epsilon == 1.0


@pytest.mark.slow
def test_ddp_two_cpu_processes(tmp_path):
    """Under DDP the frozen passive models are not registered with DDP (it would stop on them) and the run ends."""
    output = run_ddp("configs/pravfed/breast_cancer.yaml", tmp_path, "--model.init_args.local_epochs=1")
    assert "tag  labels" in output
