"""The regression student: the teacher's predicted values distilled by MSE, against hand-written references."""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import make_trainer, mlp_parties, spy_on_fold_teachers
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

import lvfl.inference.cross_fit as cross_fit_module
from lvfl.callbacks.student import StudentDistillation
from lvfl.datamodules import Diabetes
from lvfl.inference.cross_fit import cross_fitted_soft_labels, untrained_copy
from lvfl.inference.evaluation import evaluate_student, student_metrics
from lvfl.inference.student import build_student, fit_student
from lvfl.inference.student_file import load_student
from lvfl.inference.teacher import StudentData, student_data, teacher_soft_label_parts
from lvfl.models import MLP, LogisticRegression
from lvfl.privacy import PaillierSoftLabels, PlainSoftLabels, SoftLabelParts
from lvfl.privacy.soft_labels import regression_student_loss
from lvfl.protocols import EASTER
from lvfl.wire import Wire

FIGURES = ("r2", "mae", "rmse")


def diabetes(num_parties: int = 2, overlap: float = 0.5) -> Diabetes:
    dm = Diabetes(task="regression", num_parties=num_parties, overlap=overlap, batch_size=32)
    dm.setup("fit")
    return dm


def _toy(n: int = 20, seed: int = 0) -> tuple[StudentData, SoftLabelParts]:
    """Regression data before the channel: y, every other sample overlapping, y~ split into S_p (2) and S_a (1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x[:, 0] - 0.5 * x[:, 1] + 0.3 * torch.randn(n, generator=g)
    overlap = torch.arange(n) % 2 == 0
    n_o = int(overlap.sum())
    parts = SoftLabelParts(torch.randn(n_o, 1, generator=g), torch.randn(n_o, 1, generator=g), 2, 1)
    data = StudentData(x, y, overlap, torch.zeros(n, 1), parts=parts, regression=True)
    return data, parts


def _channel() -> tuple[PlainSoftLabels, Wire]:
    wire = Wire()
    channel = PlainSoftLabels()
    channel.setup(wire, "party0", "party1")
    return channel, wire


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_regression_loss_matches_a_hand_written_reference(lam):
    torch.manual_seed(0)
    f = torch.randn(6, 1, dtype=torch.float64)
    y = torch.randn(6, dtype=torch.float64)
    teacher = torch.randn(6, dtype=torch.float64)
    overlap = torch.tensor([True, False, True, True, False, False])
    total = 0.0
    for i in range(6):
        fi, yi, ti = float(f[i, 0]), float(y[i]), float(teacher[i])
        total += (1 - lam) * (yi - fi) ** 2 + lam * (ti - fi) ** 2 if overlap[i] else (yi - fi) ** 2
    got = regression_student_loss(f, y, teacher, overlap, lam)
    assert float(got) == pytest.approx(total / 6, rel=1e-12)
    with pytest.raises(ValueError, match=r"regression student outputs shape \(B, 1\)"):
        regression_student_loss(torch.zeros(6, 2), y, teacher, overlap, lam)


@pytest.mark.parametrize("lam", [0.4, 1.0])
def test_regression_student_equals_a_reference_loop_in_plain_torch(lam):
    """The plain channel (S_p sent, S_a added, / C) and fit_student against a loop written here: same initial
    weights, same batch order, the objective summed sample by sample."""
    data, parts = _toy()
    model = build_student(partial(MLP, hidden=[4]), (3,), 4, 1, seed=3)
    ref = copy.deepcopy(model)
    channel, wire = _channel()
    opt = partial(torch.optim.SGD, lr=0.05)
    fit = fit_student(model, data, lam=lam, epochs=3, batch_size=6, optimizer=opt, seed=5, channel=channel)

    teacher = torch.zeros(20)
    teacher[data.overlap] = ((parts.producer + parts.active) / 3).squeeze(1)  # y~ = (S_p + S_a) / C, C = 2 + 1
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(5)
    epoch_losses = []
    for _ in range(3):
        total = 0.0
        for idx in torch.randperm(20, generator=g).split(6):
            ref_opt.zero_grad()
            out = ref(data.features[idx])[:, 0]
            terms = []
            for j, i in enumerate(idx.tolist()):
                if data.overlap[i]:
                    terms.append((1 - lam) * (data.labels[i] - out[j]) ** 2 + lam * (teacher[i] - out[j]) ** 2)
                else:
                    terms.append((data.labels[i] - out[j]) ** 2)
            loss = torch.stack(terms).mean()
            loss.backward()
            ref_opt.step()
            total += float(loss.detach()) * len(idx)
        epoch_losses.append(total / 20)
    for a, b in zip(fit.model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert fit.losses == pytest.approx(epoch_losses, rel=1e-5)
    assert wire.bytes_by_tag() == {"soft_labels": 10 * 1 * 4}  # S_p: one float32 value per overlapping sample


def test_lam_zero_is_a_plain_mse_fit_whatever_the_teacher_says():
    data, parts = _toy()
    other = SoftLabelParts(parts.producer + 5.0, parts.active - 3.0, 2, 1)
    opt = partial(torch.optim.Adam, lr=0.05)
    fits = []
    for p in (parts, other):
        d = StudentData(data.features, data.labels, data.overlap, data.soft_labels, parts=p, regression=True)
        model = build_student(partial(MLP, hidden=[4]), (3,), 4, 1, seed=7)
        fits.append(fit_student(model, d, lam=0.0, epochs=3, batch_size=8, optimizer=opt, seed=1).model)
    ref = build_student(partial(MLP, hidden=[4]), (3,), 4, 1, seed=7)
    ref_opt = opt(ref.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for idx in torch.randperm(20, generator=g).split(8):
            ref_opt.zero_grad()
            F.mse_loss(ref(data.features[idx]).squeeze(-1), data.labels[idx]).backward()
            ref_opt.step()
    for a, b, r in zip(fits[0].parameters(), fits[1].parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, r, rtol=0, atol=1e-7)


def _sklearn_figures(student: torch.nn.Module, dm: Diabetes) -> dict[str, float]:
    """Independent of torchmetrics: sklearn on the student's predictions, both sides in the target's units by hand."""
    full = dm.active_set("test")
    overlap = dm.overlap_mask("test").numpy()
    mean, scale = dm.task.target_mean, dm.task.target_scale
    with torch.no_grad():
        pred = student.eval()(full.features[dm.active_party_name])[:, 0].double().numpy() * scale + mean
    y = full.labels.double().numpy() * scale + mean
    out = {}
    for suffix, keep in (("", np.ones_like(overlap)), ("/overlap", overlap), ("/active_only", ~overlap)):
        out[f"r2{suffix}"] = r2_score(y[keep], pred[keep])
        out[f"mae{suffix}"] = mean_absolute_error(y[keep], pred[keep])
        out[f"rmse{suffix}"] = float(np.sqrt(mean_squared_error(y[keep], pred[keep])))
    return out


def test_regression_figures_are_sklearns_on_the_students_own_predictions():
    dm = diabetes()
    data = student_data(None, dm, soft_labels=torch.zeros(len(dm.train_set), 1))  # no teacher: y~ given
    assert data.regression
    model = build_student(LogisticRegression, (data.features.shape[1],), 1, 1, seed=0)
    student = fit_student(model, data, lam=0.0, epochs=5, batch_size=32, seed=0).model
    got = student_metrics(student, dm, 1, "test", "student")
    expected = _sklearn_figures(student, dm)
    assert set(got) == {f"student/test/{k}" for k in expected}
    for key, value in expected.items():
        assert got[f"student/test/{key}"] == pytest.approx(value, rel=1e-4, abs=1e-4)
    assert got["student/test/r2"] > 0.1  # it learned something (an untrained linear model scores below 0)
    one = dm.active_set("test")  # R^2 is undefined on one sample: left out, MAE and RMSE kept
    x1, y1 = one.features[dm.active_party_name][:1], one.labels[:1]
    assert set(evaluate_student(student, x1, y1, 1, dm.task)) == {"mae", "rmse"}


def test_a_regression_teachers_parts_are_the_parties_predicted_values():
    dm = diabetes(num_parties=3)
    torch.manual_seed(0)
    model = EASTER(mlp_parties(3), embedding_dim=4)
    model.build(dm.party_specs, dm.task)
    batch = dm.train_set[list(range(5))]
    parts = teacher_soft_label_parts(model, batch, producer="party1")
    with torch.no_grad():
        e = sum(model.party_models[k].encoder(batch.features[k]) for k in model.party_names) / 3
        values = {k: model.party_models[k].head(e) for k in model.party_names}
    assert (parts.num_producer, parts.num_active) == (2, 1)
    torch.testing.assert_close(parts.producer, values["party1"] + values["party2"])
    torch.testing.assert_close(parts.active, values["party0"])
    torch.testing.assert_close(parts.mean(), sum(values.values()) / 3)
    assert (parts.producer < 0).any()  # values, not probabilities


def test_channels_that_cannot_carry_values_refuse_a_regression_by_name(tmp_path):
    data, parts = _toy()
    he = PaillierSoftLabels()
    model = build_student(LogisticRegression, (3,), 1, 1, seed=0)
    with pytest.raises(ValueError, match="PaillierSoftLabels carries class probabilities and cannot distil a regr"):
        he.start_fit(model, regression=True)
    with pytest.raises(ValueError, match="PaillierSoftLabels .* regression"):
        fit_student(model, data, lam=0.5, epochs=1, channel=he)
    cb = StudentDistillation(epochs=1, channel=PaillierSoftLabels())
    trainer = make_trainer(tmp_path, max_epochs=1, callbacks=[cb])
    model = EASTER(mlp_parties(2), embedding_dim=4)
    with pytest.raises(ValueError, match="PaillierSoftLabels .* use channel lvfl.privacy.PlainSoftLabels"):
        trainer.fit(model, datamodule=diabetes())
    assert not model.wire.bytes  # refused at setup: nothing trained, nothing sent


def test_end_to_end_a_diabetes_student_with_partial_overlap_reports_its_r2_and_is_saved(tmp_path):
    dm = Diabetes(task="regression", num_parties=2, overlap=0.5, batch_size=32)
    cb = StudentDistillation(
        model=LogisticRegression, lam=0.5, epochs=20, batch_size=32, optimizer=partial(torch.optim.Adam, lr=0.05)
    )
    folder = tmp_path / "ckpt"
    trainer = make_trainer(
        tmp_path, max_epochs=10, enable_checkpointing=True, callbacks=[cb, ModelCheckpoint(dirpath=folder)]
    )
    torch.manual_seed(0)
    model = EASTER(mlp_parties(2, lr=0.01), embedding_dim=8)
    trainer.fit(model, datamodule=dm)

    expected = _sklearn_figures(cb.student, dm)
    for key, value in expected.items():
        assert cb.metrics[f"student/test/{key}"] == pytest.approx(value, rel=1e-4, abs=1e-4)
    assert cb.metrics["student/test/r2"] > 0.2
    assert cb.metrics["student/test/r2/active_only"] > 0.1
    assert not any("acc" in k or "auroc" in k for k in cb.metrics)
    tags = model.wire.bytes_by_tag()
    assert tags["soft_labels"] == len(dm.train_set) * 1 * 4  # party1's predicted value, float32, per overlap sample
    assert "teacher/predictions" not in tags  # with two parties party1 is the producer: its values stay there

    # the saved student (tensors + JSON) answers exactly like the fitted one
    loaded = load_student(folder, task=dm.task)
    x = dm.active_set("test").features[dm.active_party_name]
    with torch.no_grad():
        assert torch.equal(loaded(x), cb.student.eval()(x))


def test_cross_fitted_regression_values_come_from_teachers_that_did_not_train_on_the_sample(monkeypatch):
    dm = diabetes()
    trained, labelled = spy_on_fold_teachers(monkeypatch, cross_fit_module)
    torch.manual_seed(0)
    values = cross_fitted_soft_labels(untrained_copy(EASTER(mlp_parties(2), embedding_dim=4)), dm, 2, 1, Wire())
    assert values.shape == (len(dm.train_set), 1)
    assert len(trained) == 2
    everything = set(dm.train_set.ids.tolist())
    for fit_ids, held_ids in zip(trained, labelled, strict=True):
        assert fit_ids.isdisjoint(held_ids)
        assert fit_ids | held_ids == everything
