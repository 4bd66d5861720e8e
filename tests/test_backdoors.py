"""Backdoors by a passive party (`lvfl.attacks.backdoor`) and the wire's interceptor they act through."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers import easter, make_trainer, mlp_parties

from lvfl.attacks import GradientReplacement, NoisySample
from lvfl.datamodules import Digits, FashionMNIST
from lvfl.models import MLP
from lvfl.protocols import CVFL, SplitNN
from lvfl.wire import Wire


def fit(tmp_path, model, dm, callbacks, epochs: int = 1, **kwargs):
    trainer = make_trainer(tmp_path, max_epochs=epochs, callbacks=list(callbacks), limit_val_batches=0, **kwargs)
    trainer.fit(model, datamodule=dm)
    return trainer


def test_an_interceptor_changes_what_its_party_acts_on_not_what_was_sent():
    wire = Wire()
    seen = []
    wire.subscribe(lambda src, dst, tag, payload: seen.append(payload))
    double = lambda src, tag, payload: payload * 2  # noqa: E731
    wire.intercept("b", double)
    assert torch.equal(wire.send("a", "b", torch.ones(2), "x"), torch.full((2,), 2.0))
    assert torch.equal(seen[0], torch.ones(2))  # observed (and metered) as it arrived
    assert wire.total_bytes() == 8
    assert torch.equal(wire.send("b", "a", torch.ones(2), "x"), torch.ones(2))  # only what b receives
    with pytest.raises(RuntimeError, match="party 'b' already has an interceptor"):
        wire.intercept("b", lambda src, tag, payload: payload)
    wire.intercept("b", None)
    assert torch.equal(wire.send("a", "b", torch.ones(2), "x"), torch.ones(2))


@pytest.mark.slow
def test_gradient_replacement_triggers_its_rows_and_trains_them_on_a_target_samples_gradient(tmp_path, monkeypatch):
    attack = GradientReplacement(target_class=3, known_targets=40, poison_fraction=0.2, gamma=2.0, seed=1)
    model = SplitNN(parties=mlp_parties(2), top_model=MLP, embedding_dim=8)
    dm = Digits(num_parties=2, batch_size=128)
    encoded, replaced = [], []
    local_embeddings = SplitNN.local_embeddings

    def spy_embeddings(self, batch):
        encoded.append((batch.ids.clone(), batch.features["party1"].clone(), attack._rows))
        return local_embeddings(self, batch)

    monkeypatch.setattr(SplitNN, "local_embeddings", spy_embeddings)
    replace = attack.replace

    def spy_replace(src, tag, payload):
        out = replace(src, tag, payload)
        replaced.append((payload, out, attack._rows))
        return out

    monkeypatch.setattr(attack, "replace", spy_replace)
    fit(tmp_path, model, dm, [attack], epochs=2)
    assert model.wire._interceptors == {}  # stopped with the fit
    assert len(attack.poisoned) == round(0.2 * len(dm.train_set))
    assert not attack.poisoned & attack.targets
    labels = dict(zip(dm.train_set.ids.tolist(), dm.train_set.labels.tolist(), strict=True))
    assert {labels[i] for i in attack.targets} == {3}
    own = dm.train_set.decode({"party1": dm.train_set.stored["party1"]})["party1"]
    clean = dict(zip(dm.train_set.ids.tolist(), own, strict=True))
    stamped_rows = 0
    for ids, features, rows in encoded:
        if rows is None:  # the measurement's inference on the validation split, not a training step
            continue
        poisoned, _ = rows
        for position, sample in enumerate(ids.tolist()):
            row = features[position].reshape(-1)
            if sample in attack.poisoned:
                assert torch.equal(row, attack.trigger(clean[sample].unsqueeze(0)).reshape(-1))
                stamped_rows += 1
            elif sample in attack.targets:  # a triggered poisoned sample in its place
                assert torch.equal(row[-4:], attack.trigger(clean[sample].unsqueeze(0)).reshape(-1)[-4:])
                swapped = [attack.trigger(f.unsqueeze(0)).reshape(-1) for f in attack._poison_features]
                assert any(torch.equal(row, f) for f in swapped)
            else:
                assert torch.equal(row, clean[sample].reshape(-1))  # the rest of its slice untouched
        assert set(poisoned.tolist()) == {i for i, s in enumerate(ids.tolist()) if s in attack.poisoned}
    assert stamped_rows > 0
    acted = 0
    for received, trained_on, (poisoned, targets) in replaced:
        others = torch.ones(len(received), dtype=torch.bool)
        if len(poisoned) and len(targets):
            others[poisoned] = False
            assert torch.allclose(trained_on[poisoned], 2.0 * received[targets].mean(dim=0).expand(len(poisoned), -1))
            acted += 1
        assert torch.equal(trained_on[others], received[others])
    assert acted > 0
    assert {"success_rate", "baseline_success_rate"} <= attack.history[-1].keys()


def test_measuring_a_backdoor_leaves_the_run_bit_identical(tmp_path):
    finals, ledgers = [], []
    for callbacks in ([], [NoisySample(noise=1.0)]):
        pl.seed_everything(0)
        model = easter(3)  # its default backend masks: a measurement must not spend a mask step
        fit(tmp_path / str(len(callbacks)), model, Digits(num_parties=3, batch_size=128), callbacks, epochs=2)
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
        ledgers.append(dict(model.wire.bytes))
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert ledgers[0] == ledgers[1]  # nothing the measurement sent is on the ledger


def test_noisy_sample_measures_the_joint_models_accuracy_on_the_attackers_noisy_slice(tmp_path):
    faint, loud = NoisySample(noise=1e-9, name="faint"), NoisySample(noise=3.0, name="loud")
    model = SplitNN(parties=mlp_parties(2, momentum=0.9), top_model=MLP, embedding_dim=8)
    fit(tmp_path, model, Digits(num_parties=2, batch_size=32), [faint, loud], epochs=3)
    assert faint.history[-1]["accuracy_drop"] == 0.0
    last = loud.history[-1]
    assert last["clean_accuracy"] == faint.history[-1]["clean_accuracy"] > 0.5
    assert last["accuracy_drop"] == pytest.approx(last["clean_accuracy"] - last["noisy_accuracy"])
    assert last["accuracy_drop"] > 0.05  # the noise goes through the joint model: its slice matters


def test_backdoors_refuse_what_they_do_not_fit(tmp_path):
    with pytest.raises(ValueError, match="GradientReplacement does not apply to CVFL"):
        fit(tmp_path, CVFL(parties=mlp_parties(2), top_model=MLP), Digits(num_parties=2), [GradientReplacement()])
    with pytest.raises(ValueError, match="party must be a passive party"):
        fit(tmp_path, easter(2), Digits(num_parties=2), [NoisySample(party="party0")])
    with pytest.raises(ValueError, match="target_class 12 is not a class of this task"):
        fit(tmp_path, easter(2), Digits(num_parties=2), [GradientReplacement(target_class=12)])
    with pytest.raises(ValueError, match="poison_fraction must be in"):
        GradientReplacement(poison_fraction=1.5)
    with pytest.raises(ValueError, match="noise must be positive"):
        NoisySample(noise=0)


def test_a_backdoor_measures_an_image_set_on_the_pixels_the_run_decodes(tmp_path):
    """Image sets serve stored uint8 pixels that the run decodes per batch: the measurement decodes them the same way,
    so a backdoor's clean accuracy with no noise is the run's own validation accuracy."""
    FashionMNIST.write_stand_in(tmp_path / "data", 200)
    dm = FashionMNIST(root=str(tmp_path / "data"), num_parties=2, batch_size=64)
    model = SplitNN(parties=mlp_parties(2), top_model=MLP, embedding_dim=8)
    faint = NoisySample(noise=1e-9)
    trainer = make_trainer(tmp_path, max_epochs=1, callbacks=[faint])
    trainer.fit(model, datamodule=dm)
    accuracy = float(trainer.callback_metrics["val/acc/party0"])
    assert faint.history[-1]["clean_accuracy"] == pytest.approx(accuracy, abs=1e-6)
