"""Label privacy for EASTER: passive parties' losses (and the gradients returned to them) use labels released once."""

from __future__ import annotations

import csv
import math
import types
import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import REPO, make_trainer, mlp_parties, recording, spy_on

from lvfl.commands.fit import build_cli
from lvfl.datamodules import Digits
from lvfl.privacy import LaplaceLabels, RandomizedResponse
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.protocols import EASTER


def recording_easter(mechanism: LabelMechanism | None, n: int = 4) -> EASTER:
    """EASTER that keeps, per step, the epoch, the batch and the labels each party's loss used (`.steps`)."""
    return recording(EASTER, labels=True)(parties=mlp_parties(n), embedding_dim=8, label_mechanism=mechanism)


def counting(mechanism: LabelMechanism) -> list[int]:
    """Count the releases `mechanism` draws (each one would spend epsilon)."""
    calls: list[int] = []
    draw = mechanism.release

    def wrapped(labels, num_classes, generator=None):
        calls.append(int(labels.shape[0]))
        return draw(labels, num_classes, generator)

    mechanism.release = wrapped
    return calls


def metric(tmp_path, name: str) -> list[float]:
    """The non-empty values of column `name` in the test trainer's CSV log (empty when there is no such column)."""
    with open(tmp_path / "t" / "version_0" / "metrics.csv", newline="") as f:
        return [float(row[name]) for row in csv.DictReader(f) if row.get(name)]


def release_by_id(model: EASTER) -> dict[int, object]:
    """The protected label of every training sample, keyed by ID (Laplace rows as tuples)."""
    ids, labels = model.label_release.ids.cpu(), model.label_release.labels.cpu()
    return {int(i): (tuple(y.tolist()) if y.dim() else int(y)) for i, y in zip(ids, labels, strict=True)}


def test_randomized_response_labels_drawn_once_at_the_keep_rate(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=128)
    mech = RandomizedResponse(epsilon=1.0, seed=0)
    draws = counting(mech)
    model = recording_easter(mech)
    make_trainer(tmp_path, max_epochs=3, limit_val_batches=0).fit(model, datamodule=dm)
    assert draws == [len(dm.train_set)]  # one release of the whole training set, not one per step or epoch

    train = dm.train_set
    true = dict(zip(train.ids.tolist(), train.labels.tolist(), strict=True))
    released = release_by_id(model)
    assert set(released) == set(true)
    n = len(true)
    flip_rate = sum(released[i] != true[i] for i in true) / n
    expected = 1 - mech.keep_probability(10)  # 9 / (e + 9) ~ 0.768
    assert abs(flip_rate - expected) < 5 * math.sqrt(expected * (1 - expected) / n)

    seen: dict[int, dict[int, int]] = {}  # epoch -> id -> label a passive loss used
    for epoch, batch, used in model.steps:
        assert torch.equal(used["private"], batch.labels)  # only the active party's private head: true labels
        for k in model.party_names:  # every model whose outputs can reach a passive party: the release
            assert torch.equal(used[k], used[model.passive[0]])  # one release, shared by all passive parties
        for i, y in zip(batch.ids.tolist(), used["party1"].tolist(), strict=True):
            seen.setdefault(epoch, {})[i] = y
    assert sorted(seen) == [0, 1, 2]
    assert seen[0] == seen[1] == seen[2] == released  # identical across epochs

    assert model.privacy_ledger.total_epsilon == 1.0
    assert len(model.privacy_ledger) == 1
    assert metric(tmp_path, "privacy/label_epsilon") == [1.0, 1.0, 1.0]  # each epoch: 1.0, not 1.0 x epochs


def test_passive_gradient_is_cross_entropy_of_the_protected_label(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    model = recording_easter(RandomizedResponse(epsilon=1.0, seed=1))
    sent = spy_on(model.wire)
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    ((_, batch, used),) = model.steps
    protected = model.protected_labels(batch.ids)
    assert not torch.equal(protected, batch.labels)  # at keep rate ~0.23 a batch of 64 surely differs
    m = dm.task.num_classes
    for k in model.passive:
        (pred,) = [p for s, d, t, p in sent if (s, d, t) == (k, model.active, "predictions")]
        (grad,) = [p for s, d, t, p in sent if (s, d, t) == (model.active, k, "gradients")]
        by_hand = (pred.softmax(-1) - F.one_hot(protected, m).to(pred.dtype)) / len(batch)  # d CE / d logits
        assert torch.allclose(grad, by_hand, atol=1e-6), k
        leaked = (pred.softmax(-1) - F.one_hot(batch.labels, m).to(pred.dtype)) / len(batch)
        assert not torch.allclose(grad, leaked, atol=1e-6), f"{k} received the true-label gradient"
        assert torch.equal(used[k], protected)


def test_resume_keeps_the_release_and_the_epsilon(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=256)
    first = recording_easter(RandomizedResponse(epsilon=1.0, seed=2))
    trainer = make_trainer(tmp_path, max_epochs=1, limit_val_batches=0)
    trainer.fit(first, datamodule=dm)
    ckpt = tmp_path / "one.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=True)["lvfl"]["label_privacy"]
    assert state["ledger"]["releases"][0]["epsilon"] == 1.0

    mech = RandomizedResponse(epsilon=1.0, seed=3)  # another seed: a redraw would show
    draws = counting(mech)
    resumed = recording_easter(mech)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="label release")  # the ledger's warning on a second release
        trainer = make_trainer(tmp_path, max_epochs=2, limit_val_batches=0)
        trainer.fit(resumed, datamodule=Digits(num_parties=4, batch_size=256), ckpt_path=ckpt)
    assert draws == []
    assert resumed.current_epoch == 2
    assert release_by_id(resumed) == release_by_id(first)
    assert resumed.privacy_ledger.total_epsilon == 1.0
    assert len(resumed.privacy_ledger) == 1
    for _, batch, used in resumed.steps:
        assert torch.equal(used["party1"], first.protected_labels(batch.ids).to(used["party1"].device))


def test_resume_on_other_training_samples_refuses(tmp_path):
    first = recording_easter(RandomizedResponse(epsilon=1.0, seed=0))
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    trainer.fit(first, datamodule=Digits(num_parties=4, batch_size=256, seed=0))
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    resumed = recording_easter(RandomizedResponse(epsilon=1.0, seed=0))
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=1, limit_val_batches=0)
    # the run fingerprint refuses the checkpoint before the release is reused on other samples
    with pytest.raises(ValueError, match=r"belongs to another run(?s:.*)data.settings.seed"):
        trainer.fit(resumed, datamodule=Digits(num_parties=4, batch_size=256, seed=1), ckpt_path=tmp_path / "one.ckpt")


@pytest.mark.parametrize("mechanism", [RandomizedResponse, LaplaceLabels])
def test_mechanism_on_a_task_it_does_not_fit_fails_clearly(mechanism):
    dm = Digits(num_parties=2)
    model = recording_easter(mechanism(epsilon=1.0, seed=0), n=2)
    regression = types.SimpleNamespace(num_classes=1, kind="regression")
    with pytest.raises(ValueError, match=f"{mechanism.__name__} protects class labels and does not fit a 'regression'"):
        model.build(dm.party_specs, regression)


def test_laplace_labels_train_passive_parties_on_noisy_rows(tmp_path):
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=128)
    model = recording_easter(LaplaceLabels(epsilon=1.0, seed=0))
    make_trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(model, datamodule=dm)
    m = dm.task.num_classes
    assert model.label_release.labels.shape == (len(dm.train_set), m)
    assert model.label_release.labels.is_floating_point()
    for _, batch, used in model.steps:
        assert torch.equal(used["private"], batch.labels)  # the active party's private head only
        for k in model.party_names:  # the active party's shared model too: its E_a goes down
            assert used[k].shape == (len(batch), m)
            assert used[k].is_floating_point()
            assert torch.equal(used[k], model.protected_labels(batch.ids))
    assert model.privacy_ledger.total_epsilon == 1.0
    # the loss dispatches on the labels: PraVFed Eq. 4, 1/(2N) ||softmax(R) - Y'||^2, against noisy rows
    _, batch, used = model.steps[-1]
    logits = torch.randn(len(batch), m)
    by_hand = ((logits.softmax(-1) - used["party1"]) ** 2).sum() / (2 * len(batch))
    assert torch.allclose(model.task_loss(logits, used["party1"]), by_hand)
    assert torch.allclose(model.task_loss(logits, batch.labels), F.cross_entropy(logits, batch.labels))
    for i in range(4):  # training ran: every party's epoch loss is logged twice and finite
        losses = metric(tmp_path, f"train/loss_epoch/party{i}")
        assert len(losses) == 2
        assert all(math.isfinite(v) for v in losses)


def test_no_mechanism_uses_true_labels_and_logs_no_epsilon(tmp_path):
    model = recording_easter(None)
    make_trainer(tmp_path, limit_train_batches=2, limit_val_batches=0).fit(model, datamodule=Digits(batch_size=128))
    for _, batch, used in model.steps:
        assert all(torch.equal(y, batch.labels) for y in used.values())
    assert metric(tmp_path, "privacy/label_epsilon") == []


@pytest.mark.slow
def test_mechanism_from_the_command_line_and_config(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    quick = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    cli = build_cli(["--config", "configs/easter/digits_rr.yaml", *quick], run=False)
    assert isinstance(cli.model.label_mechanism, RandomizedResponse)
    assert cli.model.label_mechanism.epsilon == 1.0
    args = [
        "--config",
        "configs/easter/digits.yaml",
        "--model.label_mechanism=lvfl.privacy.LaplaceLabels",
        "--model.label_mechanism.epsilon=2",
        *quick,
    ]
    mech = build_cli(args, run=False).model.label_mechanism
    assert isinstance(mech, LaplaceLabels)
    assert mech.epsilon == 2.0


def test_release_for_other_training_samples_refuses():
    from lvfl.privacy.labels.release import LabelRelease

    release = LabelRelease(RandomizedResponse(epsilon=1.0, seed=0))
    release.draw(torch.tensor([3, 1, 2]), torch.tensor([0, 1, 0]), num_classes=2)
    release.draw(torch.tensor([2, 3, 1]), torch.tensor([0, 0, 1]), num_classes=2)  # the same samples: kept
    assert len(release.ledger) == 1
    with pytest.raises(ValueError, match="other training samples"):
        release.draw(torch.tensor([1, 2, 4]), torch.tensor([0, 1, 0]), num_classes=2)
