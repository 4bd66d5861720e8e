"""Partial overlap in `VerticalDataModule` (non-overlapping inference) and the `ClickThrough` dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lvfl.datamodules import BreastCancer, ClickThrough, Digits


def _ids(dataset) -> set[int]:
    return set(dataset.ids.tolist())


@pytest.mark.parametrize("alpha", [0.0, -0.5, 1.5, float("nan"), True])
def test_overlap_out_of_range_raises_naming_the_option(alpha):
    with pytest.raises(
        ValueError,
        match=r"overlap must be a finite number in \(0, 1\] \(the fraction of samples every party holds\), got ",
    ) as info:
        BreastCancer(overlap=alpha)
    assert repr(alpha) in str(info.value)


def test_overlap_one_is_unchanged():
    default, full = BreastCancer(num_parties=2), BreastCancer(num_parties=2, overlap=1.0)
    for split in ("train", "val", "test"):
        a, b = getattr(default, f"{split}_set"), getattr(full, f"{split}_set")
        assert torch.equal(a.ids, b.ids)
        assert torch.equal(a.labels, b.labels)
        for name in a.features:
            assert torch.equal(a.features[name], b.features[name])
        assert len(full.active_only_set(split)) == 0
        view = full.active_set(split)
        assert torch.equal(view.ids, a.ids)
        assert torch.equal(view.features["party0"], a.features["party0"])
        assert list(view.features) == ["party0"]
        assert bool(full.overlap_mask(split).all())
    assert torch.equal(full.party_ids("party1"), torch.arange(569))
    assert torch.equal(full.party_ids(0, "test"), full.test_set.ids)


def test_half_overlap_vfl_views_hold_the_overlap_and_active_only_sets_the_rest():
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=16)
    y = dm.active_set("train").labels
    for split in ("train", "val", "test"):
        vfl, only, view = getattr(dm, f"{split}_set"), dm.active_only_set(split), dm.active_set(split)
        assert not _ids(vfl) & _ids(only)
        assert _ids(vfl) | _ids(only) == _ids(view)
        assert len(vfl) == round(0.5 * len(view))
        assert _ids(vfl) == set(dm.party_ids("party1", split).tolist())
        assert set(vfl.features) == {"party0", "party1"}
        assert set(only.features) == {"party0"}
        # the active party's features are the same rows in every view
        pos = torch.searchsorted(view.ids, vfl.ids)
        assert torch.equal(view.features["party0"][pos], vfl.features["party0"])
        assert torch.equal(view.labels[pos], vfl.labels)
    # stratified: the overlap keeps the class balance of the split
    mask = dm.overlap_mask("train")
    assert abs(float(y[mask].float().mean()) - float(y.float().mean())) < 0.01
    # every loader of VFL training and evaluation yields overlapping samples only
    shared = set(dm.overlap_ids().tolist())
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        seen = torch.cat([batch.ids for batch in loader])
        assert set(seen.tolist()) <= shared
        assert len(seen) == len(loader.dataset)
    assert torch.equal(dm.party_ids("party0"), torch.arange(569))
    assert len(dm.party_ids(1)) == len(shared)


def test_overlap_is_seeded():
    a, b, c = (BreastCancer(num_parties=2, overlap=0.5, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.overlap_ids(), b.overlap_ids())
    assert not torch.equal(a.overlap_ids(), c.overlap_ids())


def test_passive_party_scaled_by_the_rows_it_holds():
    dm = BreastCancer(num_parties=2, overlap=0.5)
    passive = dm.train_set.features["party1"].double()
    torch.testing.assert_close(passive.mean(0), torch.zeros(passive.shape[1], dtype=torch.float64), atol=1e-5, rtol=0)
    active = dm.active_set("train").features["party0"].double()  # fitted on all the active party's rows
    torch.testing.assert_close(active.mean(0), torch.zeros(active.shape[1], dtype=torch.float64), atol=1e-5, rtol=0)


def test_active_party_alone_sees_every_sample_with_the_same_overlap():
    alone = Digits(num_parties=4, participants=[0], overlap=0.3)
    joint = Digits(num_parties=4, overlap=0.3)
    assert torch.equal(alone.train_set.ids, alone.active_set("train").ids)
    assert torch.equal(alone.overlap_ids(), joint.overlap_ids())
    assert len(joint.train_set) < len(alone.train_set)
    assert joint.train_set.features["party2"].shape[1:] == (1, 8, 2)


def test_party_ids_rejects_unknown_party_and_split():
    dm = BreastCancer(num_parties=2, overlap=0.5)
    with pytest.raises(ValueError, match="unknown party"):
        dm.party_ids("party7")
    with pytest.raises(ValueError, match="split must be one of"):
        dm.active_set("predict")


# --------------------------------------------------------------------------------------------------- ClickThrough
def test_clickthrough_deterministic_per_seed_with_numeric_and_categorical_columns():
    a, b = ClickThrough(num_samples=600, data_seed=3), ClickThrough(num_samples=600, data_seed=3)
    other = ClickThrough(num_samples=600, data_seed=4)
    xa, ya = a.load()
    xb, yb = b.load()
    xo, _ = other.load()
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(xa, xo)
    kinds = a.column_kinds
    assert len(kinds) == xa.shape[1] == len(a.feature_names)
    assert {"numeric", "categorical"} == set(kinds)
    onehot = xa[:, [i for i, k in enumerate(kinds) if k == "categorical"]]
    assert set(np.unique(onehot)) == {0.0, 1.0}
    assert 0.1 < ya.mean() < 0.4
    # two parties by default: ad/context at the active party, user features at the passive one
    names = a.feature_names
    assert [names[c].split("=")[0] for c in a.columns[0]][:2] == ["ad_position", "bid"]
    assert all(names[c].startswith(("user_", "device", "region")) for c in a.columns[1])
    for cols in a.columns:
        kinds_of_party = {kinds[c] for c in cols}
        assert kinds_of_party == {"numeric", "categorical"}


def test_clickthrough_party_counts():
    assert len(ClickThrough(num_samples=200, num_parties=3).party_specs) == 3
    assert ClickThrough(num_samples=200, num_parties=1).party_specs[0].input_shape == (37,)
    with pytest.raises(ValueError, match="num_parties must be in 1..7"):
        ClickThrough(num_parties=8)
