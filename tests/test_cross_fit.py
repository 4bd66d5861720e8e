"""Cross-fitted soft labels (`lvfl.inference.cross_fit`): every sample's soft label from a teacher that never saw it."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import easter, make_trainer, recording

import lvfl.inference.cross_fit as cross_fit_module
from lvfl.callbacks.student import StudentDistillation
from lvfl.datamodules import BreastCancer
from lvfl.inference.cross_fit import FoldDataModule, check_folds, cross_fitted_soft_labels, untrained_copy
from lvfl.models import MLP
from lvfl.protocols import EASTER
from lvfl.wire import Wire


@pytest.mark.parametrize("folds", [1, 0, True, "3", 2.0])
def test_folds_must_be_an_integer_of_at_least_two(folds):
    with pytest.raises(ValueError, match="cross_fit must be an integer >= 2"):
        check_folds(folds)
    with pytest.raises(ValueError, match="cross_fit must be an integer >= 2"):
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
    real = cross_fit_module.teacher_soft_labels

    def spy(teacher, batch, producer=None):
        labelled.setdefault(id(teacher), []).extend(batch.ids.tolist())
        return real(teacher, batch, producer)

    monkeypatch.setattr(cross_fit_module, "teacher_soft_labels", spy)
    wire = Wire()
    soft = cross_fitted_soft_labels(template, dm, folds=3, max_epochs=1, wire=wire, producer="party1", seed=0)

    assert soft.shape == (len(dm.train_set), 2)
    torch.testing.assert_close(soft.sum(-1), torch.ones(len(dm.train_set)))
    assert len(labelled) == 3  # three distinct fold teachers
    all_labelled = [i for ids in labelled.values() for i in ids]
    assert sorted(all_labelled) == sorted(dm.train_set.ids.tolist())
    # the template recorded nothing: every fold trained a copy of it
    assert template.batches == []
    tags = wire.bytes_by_tag()
    assert tags["cross_fit/embeddings"] > 0  # the fold trainings' messages, merged
    assert tags["cross_fit/teacher/predictions"] == len(dm.train_set) * 2 * 4  # party0's forwarded to party1


def test_fold_teachers_train_only_on_their_kept_samples(monkeypatch):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=32)
    trained: list[set[int]] = []
    labelled: list[set[int]] = []
    real = cross_fit_module.teacher_soft_labels

    class SpyTrainer(cross_fit_module.Trainer):
        def fit(self, model, datamodule=None, **kwargs):
            trained.append(set(datamodule.train_set.ids.tolist()))
            labelled.append(set())
            return super().fit(model, datamodule=datamodule, **kwargs)

    def spy(teacher, batch, producer=None):
        labelled[-1].update(batch.ids.tolist())
        return real(teacher, batch, producer)

    monkeypatch.setattr(cross_fit_module, "Trainer", SpyTrainer)
    monkeypatch.setattr(cross_fit_module, "teacher_soft_labels", spy)
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
    assert 0.5 < cb.metrics["student/test/auroc"] <= 1.0
    tags = model.wire.bytes_by_tag()
    assert tags["cross_fit/embeddings"] > 0
    assert tags["soft_labels"] == len(dm.train_set) * 2 * 4


def test_cross_fit_needs_a_trainer_with_max_epochs(tmp_path):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=64)
    cb = StudentDistillation(epochs=1, cross_fit=2)
    trainer = make_trainer(tmp_path, callbacks=[cb], max_epochs=-1, max_steps=2)
    with pytest.raises(ValueError, match="trainer.max_epochs"):
        trainer.fit(easter(2), datamodule=dm)
