"""Tests of lvfl.datamodules, checked against independent scikit-learn / numpy computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from lvfl.datamodules import (
    BreastCancer,
    ContiguousColumns,
    Diabetes,
    Digits,
    ExplicitColumns,
    ImageStrips,
    ShuffledColumns,
    Synthetic,
    VerticalDataModule,
    Wine,
    check_columns,
)
from lvfl.parties import PartySpec, TaskInfo, VFLBatch


class Crafted(VerticalDataModule):
    """A datamodule over hand-made arrays, for the validation paths."""

    def __init__(self, x: np.ndarray, y: np.ndarray, **kwargs) -> None:
        self._x, self._y = x, y
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        return self._x, self._y


def _tabular(n: int = 60, f: int = 8, classes: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)), np.arange(n) % classes


def _all_features(split) -> np.ndarray:
    return torch.cat([split.features[name] for name in sorted(split.features)], dim=1).numpy()


# --------------------------------------------------------------------------------------------------- partitioners
def test_contiguous_columns_as_equal_as_possible():
    cols = ContiguousColumns().split(30, 4)
    assert [len(c) for c in cols] == [8, 8, 7, 7]
    assert sum(cols, []) == list(range(30))


def test_image_strips_digits_width():
    assert ImageStrips().split(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ImageStrips().split(8, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_shuffled_columns_seeded():
    a, b, c = (
        ShuffledColumns(seed=1).split(13, 3),
        ShuffledColumns(seed=1).split(13, 3),
        ShuffledColumns(2).split(13, 3),
    )
    assert a == b
    assert a != c
    assert sorted(sum(a, [])) == list(range(13))
    assert [len(g) for g in a] == [5, 4, 4]
    assert a != ContiguousColumns().split(13, 3)


@pytest.mark.parametrize(
    ("columns", "num_columns", "num_parties", "match"),
    [
        ([[0, 1], [2]], 4, 3, "lists columns for 2 parties but num_parties=3"),
        ([[0, 1], [2, 9]], 4, 2, r"party 1 has column indices \[9\] outside 0..3"),
        ([[0, 1, 1], [2]], 4, 2, r"party 0 lists columns \[1\] more than once"),
        ([[0, 1], [1, 2]], 4, 2, "column 1 is assigned to both party 0 and party 1"),
    ],
)
def test_explicit_columns_validation(columns, num_columns, num_parties, match):
    with pytest.raises(ValueError, match=match):
        ExplicitColumns(columns).split(num_columns, num_parties)


@pytest.mark.parametrize(
    ("columns", "match"),
    [([[0], []], "party 1 has no columns"), ([[0], [-1]], r"party 1 has invalid column indices \[-1\]"), ([], "none")],
)
def test_explicit_columns_validated_at_init(columns, match):
    with pytest.raises(ValueError, match=match):
        ExplicitColumns(columns)


def test_explicit_columns_used_by_datamodule():
    dm = BreastCancer(num_parties=2, partitioner=ExplicitColumns([[0, 5], [29]]))
    assert dm.columns == [[0, 5], [29]]
    assert [s.input_shape for s in dm.party_specs] == [(2,), (1,)]


def test_check_columns_rejects_faulty_custom_partition():
    with pytest.raises(ValueError, match="has 1 column lists but num_parties=2"):
        check_columns([[0]], num_columns=3, num_parties=2)


# --------------------------------------------------------------------------------------------------- splits & scaling
def test_split_matches_independent_stratified_split():
    dm = BreastCancer(seed=3)
    x, y = load_breast_cancer(return_X_y=True)
    ids = np.arange(len(y))
    rest, test = train_test_split(ids, test_size=0.2, stratify=y, random_state=3)
    train, val = train_test_split(rest, test_size=0.1 / 0.8, stratify=y[rest], random_state=3)
    for split, expect in (("train", train), ("val", val), ("test", test)):
        got = getattr(dm, f"{split}_set").ids.numpy()
        np.testing.assert_array_equal(got, np.sort(expect))
        assert got.dtype == np.int64
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (398, 57, 114)


def test_splits_disjoint_cover_and_stratified():
    dm = Digits()
    sets = [set(s.ids.tolist()) for s in (dm.train_set, dm.val_set, dm.test_set)]
    assert not sets[0] & sets[1]
    assert not sets[0] & sets[2]
    assert not sets[1] & sets[2]
    assert set.union(*sets) == set(range(1797))
    overall = np.bincount(load_digits().target, minlength=10) / 1797
    for split in (dm.train_set, dm.val_set, dm.test_set):
        frac = np.bincount(split.labels.numpy(), minlength=10) / len(split)
        assert np.abs(frac - overall).max() < 0.02


def test_ids_and_labels_follow_rows_and_tabular_scaler_is_train_only():
    dm = BreastCancer()
    x, y = load_breast_cancer(return_X_y=True)
    train_ids = dm.train_set.ids.numpy()
    scaler = StandardScaler().fit(x[train_ids])  # independent reference: train rows only
    for split in (dm.train_set, dm.val_set, dm.test_set):
        ids = split.ids.numpy()
        np.testing.assert_array_equal(split.labels.numpy(), y[ids])
        np.testing.assert_allclose(_all_features(split), scaler.transform(x[ids]), rtol=1e-5, atol=1e-5)
    # a scaler fitted on all rows would give different validation features
    assert not np.allclose(_all_features(dm.val_set), StandardScaler().fit(x).transform(x[dm.val_set.ids]), atol=1e-4)


def test_image_scaling_per_party_from_train_pixels():
    dm = Digits()
    images = load_digits().images
    cols = dm.columns[1]
    train = images[dm.train_set.ids.numpy()][:, :, cols]
    mean, std = train.mean(), train.std()
    test_ids = dm.test_set.ids.numpy()
    expect = (images[test_ids][:, None][..., cols] - mean) / std
    np.testing.assert_allclose(dm.test_set.features["party1"].numpy(), expect, rtol=1e-5, atol=1e-5)


def test_no_scaling_keeps_raw_values():
    dm = Wine(scale=False, num_parties=1)
    from sklearn.datasets import load_wine

    x = load_wine().data
    np.testing.assert_allclose(dm.val_set.features["party0"].numpy(), x[dm.val_set.ids.numpy()], rtol=1e-6)


# --------------------------------------------------------------------------------------------------- datasets
@pytest.mark.parametrize(
    ("dm", "shapes", "task"),
    [
        (Digits(), [(1, 8, 2)] * 4, TaskInfo(10, "multiclass")),
        (BreastCancer(), [(8,), (8,), (7,), (7,)], TaskInfo(2, "binary")),
        (Wine(num_parties=2), [(7,), (6,)], TaskInfo(3, "multiclass")),
        (Diabetes(num_parties=3), [(4,), (3,), (3,)], TaskInfo(2, "binary")),
        (Synthetic(num_samples=200, num_features=12, num_classes=4, num_parties=3), [(4,)] * 3, TaskInfo(4)),
    ],
    ids=["digits", "breast_cancer", "wine", "diabetes", "synthetic"],
)
def test_party_specs_and_task(dm, shapes, task):
    specs, got_task = dm.describe()  # lazily loads: no setup() call needed
    assert got_task == task == dm.task
    assert [s.input_shape for s in specs] == shapes
    assert [s.name for s in specs] == [f"party{i}" for i in range(len(shapes))]
    assert [s.role for s in specs] == ["active"] + ["passive"] * (len(shapes) - 1)
    assert [s.index for s in specs] == list(range(len(shapes)))
    assert dm.party_specs == specs


def test_diabetes_binarized_at_train_median():
    dm = Diabetes()
    target = load_diabetes().target
    median = np.median(target[dm.train_set.ids.numpy()])
    for split in (dm.train_set, dm.val_set, dm.test_set):
        np.testing.assert_array_equal(split.labels.numpy(), (target[split.ids.numpy()] > median).astype(np.int64))
    assert abs(dm.train_set.labels.float().mean().item() - 0.5) < 0.02
    # stratified on target bins: every split spans the target's range
    for split in (dm.val_set, dm.test_set):
        t = target[split.ids.numpy()]
        assert t.min() < np.quantile(target, 0.2)
        assert t.max() > np.quantile(target, 0.8)


def test_synthetic_data_seed_and_split_seed_are_independent():
    a, b = Synthetic(num_samples=100, data_seed=1), Synthetic(num_samples=100, data_seed=1, seed=5)
    assert not torch.equal(a.train_set.ids, b.train_set.ids)
    common = sorted(set(a.train_set.ids.tolist()) & set(b.train_set.ids.tolist()))
    assert common
    with pytest.raises(ValueError, match="num_informative=1 is too small for num_classes=3"):
        Synthetic(num_informative=1, num_classes=3)


# --------------------------------------------------------------------------------------------------- batches
def test_batches_structure_and_dtypes():
    dm = Digits(batch_size=100)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert len(batches) == 13  # 1257 samples, last batch smaller
    batch = batches[0]
    assert isinstance(batch, VFLBatch)
    assert batch.ids.dtype == torch.int64
    assert batch.labels.dtype == torch.int64
    assert set(batch.features) == {"party0", "party1", "party2", "party3"}
    for x in batch.features.values():
        assert x.dtype == torch.float32
        assert x.shape == (100, 1, 8, 2)
    ids = torch.cat([b.ids for b in batches])
    assert sorted(ids.tolist()) == sorted(dm.train_set.ids.tolist())
    # every batch row is the row of its ID
    pos = {int(i): k for k, i in enumerate(dm.train_set.ids)}
    rows = [pos[int(i)] for i in batch.ids]
    assert torch.equal(batch.features["party2"], dm.train_set.features["party2"][rows])
    assert torch.equal(batch.labels, dm.train_set.labels[rows])


def test_train_shuffle_reproducible_eval_in_order():
    first = [next(iter(BreastCancer(seed=s).train_dataloader())).ids for s in (0, 0, 1)]
    assert torch.equal(first[0], first[1])
    assert not torch.equal(first[0], first[2])
    dm = BreastCancer(batch_size=16)
    for loader, split in ((dm.val_dataloader(), dm.val_set), (dm.predict_dataloader(), dm.test_set)):
        assert torch.equal(torch.cat([b.ids for b in loader]), split.ids)
    # the train order changes between epochs of one loader, still from the seeded generator
    loader = dm.train_dataloader()
    assert not torch.equal(next(iter(loader)).ids, next(iter(loader)).ids)


def test_batch_size_survives_lightning_distributed_sampler():
    # what Lightning does to each loader under DDP: rebuild it around a DistributedSampler
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DistributedSampler

    dm = Wine(batch_size=16)
    for rank in (0, 1):
        sampler = DistributedSampler(dm.train_set, num_replicas=2, rank=rank, shuffle=True, seed=0)
        batches = list(_update_dataloader(dm.train_dataloader(), sampler))
        assert [len(b) for b in batches] == [16, 16, 16, 14]  # 124 train samples, 62 per rank
        assert all(isinstance(b, VFLBatch) for b in batches)


def test_index_tensor_batch_sampler():
    from torch.utils.data import RandomSampler, SequentialSampler, SubsetRandomSampler

    from lvfl.datamodules import IndexTensorBatchSampler

    data = range(10)
    batches = list(IndexTensorBatchSampler(SequentialSampler(data), batch_size=4, drop_last=False))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(list(IndexTensorBatchSampler(SequentialSampler(data), batch_size=4, drop_last=True))) == 2
    gen = torch.Generator().manual_seed(0)
    shuffled = torch.cat(list(IndexTensorBatchSampler(RandomSampler(data, generator=gen), 4, drop_last=False)))
    assert sorted(shuffled.tolist()) == list(range(10))
    assert shuffled.tolist() != list(range(10))
    other = list(IndexTensorBatchSampler(SubsetRandomSampler([1, 3, 5]), 2, drop_last=False))  # generic path
    assert sorted(sum(other, [])) == [1, 3, 5]


def test_participants_keep_only_their_slices():
    full = BreastCancer()
    local = BreastCancer(participants=[0])
    assert [s.name for s in local.party_specs] == ["party0"]
    assert local.party_specs[0].input_shape == (8,)
    assert set(next(iter(local.train_dataloader())).features) == {"party0"}
    assert torch.equal(local.train_set.features["party0"], full.train_set.features["party0"])
    pair = Digits(active_party=2, participants=[3, 2])
    assert [(s.name, s.role, s.index) for s in pair.party_specs] == [("party2", "active", 2), ("party3", "passive", 3)]


def test_runs_under_lightning_trainer():
    import lightning.pytorch as pl

    class Probe(pl.LightningModule):
        def __init__(self, specs: list[PartySpec]) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleDict({s.name: torch.nn.Linear(int(np.prod(s.input_shape)), 3) for s in specs})

        def _logits(self, batch: VFLBatch) -> torch.Tensor:
            return sum(self.layers[k](x.flatten(1)) for k, x in batch.features.items())

        def training_step(self, batch: VFLBatch, _: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self._logits(batch), batch.labels)

        def validation_step(self, batch: VFLBatch, _: int) -> None:
            self.log("val/loss", torch.nn.functional.cross_entropy(self._logits(batch), batch.labels))

        def predict_step(self, batch: VFLBatch, _: int) -> torch.Tensor:
            return batch.ids

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = Wine(batch_size=32)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Probe(dm.party_specs), datamodule=dm)
    predicted = trainer.predict(Probe(dm.party_specs), datamodule=dm)
    assert torch.equal(torch.cat(predicted), dm.test_set.ids)


def test_configurable_by_class_path():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_subclass_arguments(VerticalDataModule, "data")
    cfg = parser.parse_string(
        """
        data:
          class_path: lvfl.datamodules.Synthetic
          init_args:
            num_samples: 120
            num_parties: 3
            partitioner: {class_path: lvfl.datamodules.ShuffledColumns, init_args: {seed: 4}}
        """
    )
    dm = parser.instantiate(cfg).data
    assert isinstance(dm, Synthetic)
    assert (dm.num_samples, dm.num_parties) == (120, 3)
    assert dm.columns == ShuffledColumns(seed=4).split(20, 3)


# --------------------------------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_name_the_party(bad):
    x, y = _tabular(f=8)
    x[[3, 7, 11], 5] = bad  # column 5 belongs to party2 of 4
    dm = Crafted(x, y)
    with pytest.raises(ValueError, match=r"party2 has 3 non-finite feature values"):
        dm.setup("fit")


def test_non_finite_features_of_dropped_party_are_ignored():
    x, y = _tabular(f=8)
    x[0, 5] = np.nan
    assert len(Crafted(x, y, participants=[0]).party_specs) == 1


@pytest.mark.parametrize(
    ("y", "match"),
    [
        (
            np.r_[np.arange(58) % 2, 5, 5],
            r"labels must be in 0..2 \(num_classes=3\); found out-of-range label values \[5\]",
        ),
        (np.r_[np.arange(58) % 3, -1, -1], r"labels must be in 0..3 .*values \[-1\]"),
        (np.arange(60) % 2 + 1, r"labels must be in 0..1 \(num_classes=2\).*values \[2\]"),  # 1-based labels
        (np.r_[(np.arange(58) % 2).astype(float), 0.5, np.nan], r"non-integer values \[0.5, nan\]"),
        (np.zeros(60, dtype=int), "needs at least 2 classes, found 1"),
    ],
)
def test_bad_labels(y, match):
    x, _ = _tabular(n=len(y))
    with pytest.raises(ValueError, match=match):
        Crafted(x, y).setup("fit")


def test_declared_num_classes_bounds_labels():
    x, _ = _tabular(n=60)
    dm = Crafted(x, np.arange(60) % 3)
    dm.num_classes = 2
    with pytest.raises(ValueError, match=r"0..1 \(num_classes=2\).*\[2\]"):
        dm.setup("fit")


def test_float_integer_labels_are_accepted():
    x, y = _tabular()
    dm = Crafted(x, y.astype(np.float64))
    assert dm.task == TaskInfo(2, "binary")
    assert dm.train_set.labels.dtype == torch.int64


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_parties": 0}, "num_parties must be at least 1, got 0"),
        ({"active_party": 4}, "active_party=4 is out of range for num_parties=4"),
        ({"active_party": -1}, "active_party=-1 is out of range"),
        ({"participants": []}, "participants must list at least the active party"),
        ({"participants": [0, 4]}, r"participants \[4\] are out of range for num_parties=4"),
        ({"participants": [0, 1, 1]}, "participants lists a party more than once"),
        ({"participants": [1, 2]}, r"must include the active party 0"),
        ({"val_fraction": 0.0}, r"val_fraction must be in \(0, 1\), got 0.0"),
        ({"test_fraction": 1.0}, r"test_fraction must be in \(0, 1\), got 1.0"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction \\+ test_fraction must be < 1"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BreastCancer(**kwargs)


def test_too_many_parties_for_image_width():
    with pytest.raises(ValueError, match=r"num_parties=9 exceeds the 8 feature columns \(image width\) available"):
        Digits(num_parties=9).setup("fit")


def test_too_many_parties_for_tabular_columns():
    with pytest.raises(ValueError, match=r"num_parties=14 exceeds the 13 feature columns available"):
        Wine(num_parties=14).setup("fit")


def test_bad_shapes():
    x, y = _tabular()
    with pytest.raises(ValueError, match=r"targets must have shape \(60,\)"):
        Crafted(x, y[:-1]).setup("fit")
    with pytest.raises(ValueError, match="features must be"):
        Crafted(x[:, 0], y).setup("fit")


def test_split_too_small_to_stratify():
    x, y = _tabular(n=12, classes=4)
    with pytest.raises(ValueError, match="cannot make a stratified split of 12 samples"):
        Crafted(x, y, num_parties=2).setup("fit")
