"""The Criteo datamodule: conversion to memmaps, lazy splits, loaders and a short EASTER fit on a tiny TSV."""

from __future__ import annotations

import gc
import json
import math
import tracemalloc
from collections import Counter
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lvfl.datamodules.criteo import Criteo, CriteoSplit, convert
from lvfl.datamodules.stand_ins import write_criteo_tsv
from lvfl.models import TabularMLP
from lvfl.protocols import EASTER, PartyConfig


def _reference(rows: list[list[str]], min_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Independent per-row reference: log1p of clipped ints, codes from sorted vocabularies (0 = missing/rare)."""
    dense = np.array([[math.log1p(max(int(v), 0)) if v else 0.0 for v in r[1:14]] for r in rows], dtype=np.float32)
    vocabs = []
    for j in range(26):
        counts = Counter(r[14 + j] for r in rows if r[14 + j])
        kept = sorted(v for v, c in counts.items() if c >= min_count)
        vocabs.append({v: i + 1 for i, v in enumerate(kept)})
    sparse = np.array([[vocabs[j].get(r[14 + j], 0) for j in range(26)] for r in rows], dtype=np.int32)
    labels = np.array([int(r[0]) for r in rows], dtype=np.uint8)
    return dense, sparse, labels, [len(v) + 1 for v in vocabs]


@pytest.fixture
def criteo_root(tmp_path: Path) -> tuple[Path, list[list[str]]]:
    rows = write_criteo_tsv(tmp_path / "train.txt", 300)
    return tmp_path, rows


def test_convert_matches_reference_and_reuses(criteo_root, tmp_path: Path) -> None:
    root, rows = criteo_root
    out = convert(root / "train.txt", tmp_path / "conv", min_count=5, chunk_rows=64)
    dense_ref, sparse_ref, labels_ref, cards = _reference(rows, 5)
    np.testing.assert_allclose(np.load(out / "dense.npy"), dense_ref, rtol=1e-6)
    sparse = np.load(out / "sparse.npy")
    assert sparse.dtype == np.int32
    assert np.array_equal(sparse, sparse_ref)
    assert np.array_equal(np.load(out / "labels.npy"), labels_ref)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rows"] == 300
    assert meta["cardinalities"] == cards
    assert meta["min_count"] == 5
    # rare values (seen once) and missing ones map to 0; negatives read as 0
    rare_or_missing = np.array(
        [[r[14 + j] == "" or Counter(x[14 + j] for x in rows)[r[14 + j]] < 5 for j in range(26)] for r in rows]
    )
    assert rare_or_missing.any()
    assert (sparse[rare_or_missing] == 0).all()
    assert (sparse[~rare_or_missing] > 0).all()
    negative = np.array([[v.startswith("-") for v in r[1:14]] for r in rows])
    assert negative.any()
    assert (np.load(out / "dense.npy")[negative] == 0).all()
    # second call: reused (files untouched); a changed min_count reconverts
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert convert(root / "train.txt", out, min_count=5, chunk_rows=64) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    convert(root / "train.txt", out, min_count=2)
    assert json.loads((out / "meta.json").read_text())["cardinalities"] == _reference(rows, 2)[3]
    # max_rows: the first rows only, vocabularies from those rows
    small = convert(root / "train.txt", tmp_path / "small", min_count=2, max_rows=50)
    d, s, _, c = _reference(rows[:50], 2)
    assert np.array_equal(np.load(small / "sparse.npy"), s)
    assert json.loads((small / "meta.json").read_text())["cardinalities"] == c


def test_datamodule_splits_parties_and_batches(criteo_root) -> None:
    root, rows = criteo_root
    dm = Criteo(root=str(root), min_count=5, num_parties=2, batch_size=32, seed=3)
    dm.setup()
    assert (root / "lvfl_cache_5_None" / "meta.json").is_file()
    dense_ref, sparse_ref, labels_ref, cards = _reference(rows, 5)
    n_train, n_val, n_test = (len(dm.train_set), len(dm.val_set), len(dm.test_set))
    assert n_test == 60
    assert n_val == 24
    assert n_train == 216
    ids = torch.cat([dm.train_set.ids, dm.val_set.ids, dm.test_set.ids])
    assert sorted(ids.tolist()) == list(range(300))
    assert dm.columns == [list(range(20)), list(range(20, 39))]
    specs = dm.party_specs
    assert specs[0].input_shape == (20,)
    assert specs[1].input_shape == (19,)
    assert specs[0].categories == tuple([0] * 13 + cards[:7])
    assert specs[1].categories == tuple(cards[7:])
    assert isinstance(dm.train_set, CriteoSplit)
    assert all(isinstance(a, np.memmap) for a in (dm.train_set.dense, dm.train_set.sparse, dm.train_set.label_array))

    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 32
    r = batch.ids.numpy()
    ref0 = np.concatenate([dense_ref[r], sparse_ref[r][:, :7].astype(np.float32)], axis=1)
    np.testing.assert_allclose(batch.features["party0"].numpy(), ref0, rtol=1e-6)
    np.testing.assert_array_equal(batch.features["party1"].numpy(), sparse_ref[r][:, 7:].astype(np.float32))
    np.testing.assert_array_equal(batch.labels.numpy(), labels_ref[r].astype(np.int64))
    assert batch.features["party0"].dtype == torch.float32
    # the whole (small) split agrees with gather; labels read once
    assert torch.equal(dm.val_set.labels, torch.from_numpy(labels_ref[dm.val_set.ids.numpy()].astype(np.int64)))
    np.testing.assert_array_equal(dm.val_set.features["party1"].numpy(), sparse_ref[dm.val_set.ids.numpy()][:, 7:])
    sub = dm.test_set.subset(torch.tensor([3, 0]))
    assert sub.ids.tolist() == [dm.test_set.ids[3].item(), dm.test_set.ids[0].item()]

    # explicit columns: numeric first, then codes, each in the listed order
    dm2 = Criteo(
        root=str(root), min_count=5, num_parties=2, columns=[[14, 2, 0], [c for c in range(39) if c not in (14, 2, 0)]]
    )
    b = dm2.train_set.gather([0, 1])
    r = b.ids.numpy()
    expect = np.stack([dense_ref[r, 2], dense_ref[r, 0], sparse_ref[r, 1]], axis=1)
    np.testing.assert_allclose(b.features["party0"].numpy(), expect, rtol=1e-6)
    assert dm2.party_specs[0].categories == (0, 0, cards[1])


def test_max_rows_and_errors(criteo_root, tmp_path: Path) -> None:
    root, _ = criteo_root
    dm = Criteo(root=str(root), max_rows=100, num_parties=3)
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 100
    assert (root / "lvfl_cache_10_100").is_dir()
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        Criteo(root=str(missing)).setup()
    assert str(info.value) == (
        f"Criteo: expected {missing / 'train.txt'} under root={str(missing)!r}; download the Criteo "
        "display-advertising challenge dataset (dac.tar.gz, from the Kaggle Display Advertising Challenge / "
        "Criteo AI Lab) and extract its train.txt into that folder"
    )
    with pytest.raises(ValueError, match="overlap=1 only"):
        Criteo(root=str(root), overlap=0.5)
    with pytest.raises(ValueError, match="exceeds the 39 Criteo feature columns"):
        Criteo(root=str(root), num_parties=40).setup()


@pytest.mark.slow
def test_streams_without_materializing_the_table(tmp_path: Path) -> None:
    n = 20_000
    write_criteo_tsv(tmp_path / "train.txt", n, seed=1)
    dm = Criteo(root=str(tmp_path), num_parties=2, batch_size=64)
    dm.prepare_data()  # conversion (streams the TSV) done before measuring
    gc.collect()
    tracemalloc.start()
    try:
        dm.setup()
        loader = iter(dm.train_dataloader())
        batches = [next(loader), next(loader)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    table_bytes = n * 39 * 4  # the features as float32 (what base.VerticalDataModule would hold)
    assert peak < table_bytes / 4, (peak, table_bytes)
    assert all(len(b) == 64 for b in batches)
    for split in (dm.train_set, dm.val_set, dm.test_set):
        for name, value in vars(split).items():
            if isinstance(value, (np.ndarray, torch.Tensor)) and not isinstance(value, np.memmap):
                assert value.ndim == 1, name  # only row indices / IDs, never the table
            if name == "_labels":
                assert value is None  # labels not read by the loader path


def test_easter_fit_two_steps(criteo_root) -> None:
    root, _ = criteo_root
    dm = Criteo(root=str(root), min_count=5, num_parties=2, batch_size=32)
    model = EASTER(parties=[PartyConfig(model=partial(TabularMLP, hidden=[8]))], embedding_dim=8)
    trainer = pl.Trainer(
        max_steps=2,
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
    )
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step >= 2
