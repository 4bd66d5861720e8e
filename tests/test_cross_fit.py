"""Cross-fitted soft labels (`lvfl.inference.cross_fit`): every sample's soft label from a teacher that never saw it."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from helpers import easter, make_trainer, mlp_parties, recording, spy_on_fold_teachers
from sklearn.metrics import roc_auc_score

import lvfl.inference.cross_fit as cross_fit_module
from lvfl.callbacks.student import StudentDistillation
from lvfl.datamodules import BreastCancer
from lvfl.inference.cross_fit import FoldDataModule, check_folds, cross_fitted_soft_labels, untrained_copy
from lvfl.models import MLP
from lvfl.privacy import RandomizedResponse
from lvfl.privacy.labels.release import LabelRelease
from lvfl.protocols import EASTER
from lvfl.wire import Wire


@pytest.mark.parametrize("folds", [1, 0, True, "3", 2.0])
def test_folds_must_be_an_integer_of_at_least_two(folds):
    with pytest.raises(ValueError, match=r"cross_fit must be an int >= 2 \(the number of folds, or None\)"):
        check_folds(folds)
    with pytest.raises(ValueError, match=r"cross_fit must be an int >= 2 \(the number of folds, or None\)"):
        StudentDistillation(cross_fit=folds)


def test_fold_datamodule_serves_only_the_kept_samples():
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=16)
    keep = torch.arange(len(dm.train_set)) % 3 != 0
    fold = FoldDataModule(dm, keep, seed=1)
    expected = dm.train_set.ids[keep]
    assert torch.equal(fold.train_set.ids, expected)
    seen = torch.cat([batch.ids for batch in fold.train_dataloader()])
    assert sorted(seen.tolist()) == sorted(expected.tolist())
    assert fold.party_specs == dm.party_specs
    assert fold.task == dm.task


def test_every_soft_label_comes_from_a_teacher_that_did_not_train_on_the_sample(monkeypatch):
    """Spy on every fold teacher: the IDs it trained on and the IDs it labelled must be disjoint, and the labelled
    IDs of all folds must cover the overlap exactly once."""
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=32)
    torch.manual_seed(0)
    template = untrained_copy(recording(EASTER)(parties=easter(2).party_configs, embedding_dim=8))
    labelled: dict[int, list[int]] = {}
    rows: dict[int, torch.Tensor] = {}
    real = cross_fit_module.teacher_soft_label_parts

    def spy(teacher, batch, producer=None):
        labelled.setdefault(id(teacher), []).extend(batch.ids.tolist())
        parts = real(teacher, batch, producer)
        rows.update(zip(batch.ids.tolist(), parts.mean(), strict=True))
        return parts

    monkeypatch.setattr(cross_fit_module, "teacher_soft_label_parts", spy)
    wire = Wire()
    soft = cross_fitted_soft_labels(template, dm, folds=3, max_epochs=1, wire=wire, producer="party1", seed=0)

    assert soft.shape == (len(dm.train_set), 2)
    torch.testing.assert_close(soft.sum(-1), torch.ones(len(dm.train_set)))
    for i, sample in enumerate(dm.train_set.ids.tolist()):  # each row is its own fold teacher's, in train_set order
        assert torch.equal(soft[i], rows[sample])
    assert len(labelled) == 3  # three distinct fold teachers
    all_labelled = [i for ids in labelled.values() for i in ids]
    assert sorted(all_labelled) == sorted(dm.train_set.ids.tolist())
    # the template recorded nothing: every fold trained a copy of it
    assert template.batches == []
    tags = wire.bytes_by_tag()
    assert tags["cross_fit/embeddings"] > 0  # the fold trainings' messages, through the wire
    # party1's predictions stay at party1 (the producer); party0's own are never sent
    assert "cross_fit/teacher/predictions" not in tags
    assert tags["cross_fit/teacher/embeddings"] > 0


def test_fold_teachers_train_only_on_their_kept_samples(monkeypatch):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=32)
    trained, labelled = spy_on_fold_teachers(monkeypatch, cross_fit_module)
    torch.manual_seed(0)
    cross_fitted_soft_labels(untrained_copy(easter(2)), dm, folds=2, max_epochs=1, wire=Wire())
    assert len(trained) == 2
    everything = set(dm.train_set.ids.tolist())
    for fit_ids, held_ids in zip(trained, labelled, strict=True):
        assert fit_ids.isdisjoint(held_ids)
        assert fit_ids | held_ids == everything


def test_a_built_protocol_cannot_be_the_template_and_too_many_folds_fail():
    dm = BreastCancer(num_parties=2, overlap=0.5)
    model = easter(2)
    model.build(dm.party_specs, dm.task)
    with pytest.raises(ValueError, match="before it is built"):
        untrained_copy(model)
    with pytest.raises(ValueError, match="smallest class"):
        cross_fitted_soft_labels(untrained_copy(easter(2)), dm, folds=100, max_epochs=1, wire=Wire())


def test_callback_with_cross_fit_logs_the_student_and_meters_the_folds(tmp_path):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=64)
    cb = StudentDistillation(lam=0.5, epochs=3, model=partial(MLP, hidden=[8]), embedding_dim=4, cross_fit=2)
    trainer = make_trainer(tmp_path, callbacks=[cb])
    torch.manual_seed(0)
    model = easter(2)
    trainer.fit(model, datamodule=dm)
    # an independent reference: sklearn's ROC AUC of the same student on the active party's test samples
    test = dm.active_set("test")
    with torch.no_grad():
        scores = cb.student.eval()(test.features[dm.active_party_name]).softmax(-1)[:, 1]
    reference = roc_auc_score(test.labels.numpy(), scores.numpy())
    assert 0.5 < cb.metrics["student/test/auroc"] == pytest.approx(reference, abs=1e-6)
    tags = model.wire.bytes_by_tag()
    assert tags["cross_fit/embeddings"] > 0
    assert tags["soft_labels"] == len(dm.train_set) * 2 * 4


def test_cross_fit_needs_a_trainer_with_max_epochs(tmp_path):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=64)
    cb = StudentDistillation(epochs=1, cross_fit=2)
    trainer = make_trainer(tmp_path, callbacks=[cb], max_epochs=-1, max_steps=2)
    with pytest.raises(ValueError, match="trainer.max_epochs"):
        trainer.fit(easter(2), datamodule=dm)


def _easter_with_mechanism(epsilon: float = 1.0) -> EASTER:
    return EASTER(parties=mlp_parties(2), embedding_dim=8, label_mechanism=RandomizedResponse(epsilon, seed=0))


def test_fold_teachers_reuse_the_runs_one_label_release(tmp_path, monkeypatch):
    """With a mechanism and cross_fit=3, the run's ledger shows exactly one release, and every fold teacher trained
    on the parent's release for its samples (no draw of its own), recorded on the parent's ledger."""
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=64)
    folds: list = []

    class SpyTrainer(cross_fit_module.Trainer):
        def fit(self, model, datamodule=None, **kwargs):
            out = super().fit(model, datamodule=datamodule, **kwargs)
            folds.append((model, datamodule.train_set.ids.clone()))
            return out

    monkeypatch.setattr(cross_fit_module, "Trainer", SpyTrainer)
    cb = StudentDistillation(lam=0.5, epochs=1, cross_fit=3)
    torch.manual_seed(0)
    model = _easter_with_mechanism()
    make_trainer(tmp_path, callbacks=[cb]).fit(model, datamodule=dm)

    assert len(model.privacy_ledger) == 1
    assert model.privacy_ledger.total_epsilon == 1.0
    assert len(folds) == 3
    for fold, ids in folds:
        assert fold is not model
        assert fold.privacy_ledger is model.privacy_ledger  # any release a fold made would show here
        assert torch.equal(fold.protected_labels(ids), model.protected_labels(ids))
        assert torch.equal(fold.label_release.ids, torch.sort(ids).values)


def test_cross_fitting_with_a_mechanism_needs_the_runs_release():
    dm = BreastCancer(num_parties=2, overlap=0.5)
    with pytest.raises(ValueError, match="needs the run's label release"):
        cross_fitted_soft_labels(untrained_copy(_easter_with_mechanism()), dm, folds=2, max_epochs=1, wire=Wire())


def test_restricted_release_is_the_parents_draw_on_the_parents_ledger():
    release = LabelRelease(RandomizedResponse(epsilon=1.0, seed=0))
    ids = torch.tensor([9, 2, 7, 4, 5])
    release.draw(ids, torch.tensor([1, 0, 1, 1, 0]), num_classes=2)
    fold = release.restrict(torch.tensor([7, 2, 9]))
    assert fold.ledger is release.ledger
    assert torch.equal(fold.ids, torch.tensor([2, 7, 9]))
    assert torch.equal(fold.lookup(torch.tensor([9, 7, 2])), release.lookup(torch.tensor([9, 7, 2])))
    fold.draw(torch.tensor([9, 7, 2]), torch.tensor([0, 0, 0]), num_classes=2)  # same samples: kept, nothing drawn
    assert torch.equal(fold.lookup(torch.tensor([2, 7, 9])), release.lookup(torch.tensor([2, 7, 9])))
    assert len(release.ledger) == 1
    with pytest.raises(ValueError, match="outside the label release"):
        release.restrict(torch.tensor([2, 3]))
    # nothing drawn yet: the restriction shares the ledger, so a draw through it shows on the parent's
    undrawn = LabelRelease(RandomizedResponse(epsilon=2.0, seed=0))
    later = undrawn.restrict(torch.tensor([1, 2]))
    later.draw(torch.tensor([1, 2]), torch.tensor([0, 1]), num_classes=2)
    assert undrawn.ledger.total_epsilon == 2.0
    assert not LabelRelease(None).restrict(torch.tensor([1])).drawn
