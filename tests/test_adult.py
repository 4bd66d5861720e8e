"""`Adult` reads the published UCI files (format quirks included), encodes categories from the training file only."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from lvfl.datamodules.adult import Adult
from lvfl.models import TabularMLP
from lvfl.protocols import EASTER, PartyConfig

# Rows in the published format (", " between values; written with commas only to fit the line length).
# Train-only levels: native-country=Holand-Netherlands, workclass=Never-worked.
# Test-only levels: native-country=Atlantis, occupation=? (a "?" seen only in the test file's occupation).
TRAIN = """\
39,State-gov,77516,Bachelors,13,Never-married,Adm-clerical,Not-in-family,White,Male,2174,0,40,United-States,<=50K
50,Self-emp-not-inc,83311,Bachelors,13,Married-civ-spouse,Exec-managerial,Husband,White,Male,0,0,13,United-States,<=50K
38,Private,215646,HS-grad,9,Divorced,Handlers-cleaners,Not-in-family,White,Male,0,0,40,?,<=50K
53,?,234721,11th,7,Married-civ-spouse,Handlers-cleaners,Husband,Black,Male,0,0,40,United-States,<=50K
28,Private,338409,Bachelors,13,Married-civ-spouse,Prof-specialty,Wife,Black,Female,0,0,40,Cuba,<=50K
37,Private,284582,Masters,14,Married-civ-spouse,Exec-managerial,Wife,White,Female,0,0,40,United-States,>50K
49,Private,160187,9th,5,Married-spouse-absent,Other-service,Not-in-family,Black,Female,0,0,16,Jamaica,<=50K
52,Self-emp-not-inc,209642,HS-grad,9,Married-civ-spouse,Exec-managerial,Husband,White,Male,0,0,45,United-States,>50K
31,Private,45781,Masters,14,Never-married,Prof-specialty,Not-in-family,White,Female,14084,0,50,United-States,>50K
42,Private,159449,Bachelors,13,Married-civ-spouse,Exec-managerial,Husband,White,Male,5178,0,40,United-States,>50K
37,Private,280464,Some-college,10,Married-civ-spouse,Exec-managerial,Husband,Black,Male,0,0,80,United-States,>50K
30,State-gov,141297,Bachelors,13,Married-civ-spouse,Prof-specialty,Husband,Asian-Pac-Islander,Male,0,0,40,India,>50K
23,Private,122272,Bachelors,13,Never-married,Adm-clerical,Own-child,White,Female,0,0,30,United-States,<=50K
32,Never-worked,205019,Assoc-acdm,12,Never-married,Sales,Not-in-family,Black,Male,0,0,50,Holand-Netherlands,<=50K
40,Private,121772,Assoc-voc,11,Married-civ-spouse,Craft-repair,Husband,Asian-Pac-Islander,Male,0,0,40,?,>50K
34,Private,245487,7th-8th,4,Married-civ-spouse,Transport-moving,Husband,Amer-Indian-Eskimo,Male,0,0,45,Mexico,<=50K

""".replace(",", ", ")
TEST = """\
|1x3 Cross validator
25,Private,226802,11th,7,Never-married,Machine-op-inspct,Own-child,Black,Male,0,0,40,United-States,<=50K.
38,Private,89814,HS-grad,9,Married-civ-spouse,Farming-fishing,Husband,White,Male,0,0,50,United-States,<=50K.
28,Local-gov,336951,Assoc-acdm,12,Married-civ-spouse,Protective-serv,Husband,White,Male,0,0,40,Atlantis,>50K.
44,Private,160323,Some-college,10,Married-civ-spouse,Machine-op-inspct,Husband,Black,Male,7688,0,40,United-States,>50K.
18,?,103497,Some-college,10,Never-married,?,Own-child,White,Female,0,0,30,United-States,<=50K.
34,Private,198693,10th,6,Never-married,Other-service,Not-in-family,White,Male,0,0,30,?,<=50K.

""".replace(",", ", ")
NUM_TRAIN, NUM_TEST = 16, 6
NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


def write_files(root: Path, train: str = TRAIN, test: str = TEST) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text(train)
    (root / "adult.test").write_text(test)
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_files(tmp_path / "adult")


def test_onehot_shape_labels_and_published_test_split(root: Path) -> None:
    dm = Adult(root=str(root), num_parties=2)
    x, y = dm.load()
    names = dm.feature_names
    assert x.shape == (NUM_TRAIN + NUM_TEST, len(names))
    assert x.dtype == np.float32
    assert y.tolist() == [0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0] + [0, 0, 1, 1, 0, 0]
    assert [n for n in names if "=" not in n] == NUMERIC
    assert names[:3] == ["age", "workclass=?", "workclass=Never-worked"]
    workclass = [n for n in names if n.startswith("workclass=")]  # sorted training levels, then the reserved one
    assert workclass == [
        f"workclass={v}" for v in ["?", "Never-worked", "Private", "Self-emp-not-inc", "State-gov"]
    ] + ["workclass=<unseen>"]
    kinds = dm.column_kinds
    assert [k for k, n in zip(kinds, names, strict=True) if n in NUMERIC] == ["numeric"] * 6
    assert kinds.count("categorical") == len(names) - 6
    assert x[0, names.index("fnlwgt")] == 77516
    groups = [[c for c, n in enumerate(names) if n.startswith(f + "=")] for f in ("workclass", "native-country")]
    for cols in groups:  # one-hot: exactly one 1 per row and group
        assert (x[:, cols].sum(axis=1) == 1).all()
    assert dm.categories(x.shape[1]) is None

    assert dm.test_set.ids.tolist() == list(range(NUM_TRAIN, NUM_TRAIN + NUM_TEST))
    assert dm.test_set.labels.tolist() == [0, 0, 1, 1, 0, 0]
    held = sorted(dm.train_set.ids.tolist() + dm.val_set.ids.tolist())
    assert held == list(range(NUM_TRAIN))


def test_missing_is_a_level_and_unseen_levels_map_to_the_reserved_one(root: Path) -> None:
    dm = Adult(root=str(root), num_parties=2)
    x, _ = dm.load()
    col = {n: c for c, n in enumerate(dm.feature_names)}
    assert x[3, col["workclass=?"]] == 1  # train row with workclass ?
    assert x[NUM_TRAIN + 4, col["workclass=?"]] == 1  # test row with workclass ?
    assert x[2, col["native-country=?"]] == 1
    # train-only level: a column of its own, set in training, never in the test rows
    assert x[13, col["native-country=Holand-Netherlands"]] == 1
    assert x[NUM_TRAIN:, col["native-country=Holand-Netherlands"]].sum() == 0
    # test-only levels: no column of their own, mapped to <unseen>; <unseen> never set in training
    assert "native-country=Atlantis" not in col
    assert "occupation=?" not in col
    assert x[NUM_TRAIN + 2, col["native-country=<unseen>"]] == 1
    assert x[NUM_TRAIN + 4, col["occupation=<unseen>"]] == 1
    assert x[:NUM_TRAIN, col["native-country=<unseen>"]].sum() == 0
    assert x[NUM_TRAIN:, col["native-country=<unseen>"]].sum() == 1


def test_codes_encoding_gives_one_column_per_feature_and_cardinalities(root: Path) -> None:
    dm = Adult(root=str(root), encoding="codes", num_parties=2)
    x, _ = dm.load()
    assert x.shape == (NUM_TRAIN + NUM_TEST, 14)
    assert dm.feature_names[:4] == ["age", "workclass", "fnlwgt", "education"]
    levels = dm.levels()
    cats = dm.categories(14)
    assert cats[0] == 0
    assert cats[1] == len(levels["workclass"]) == 6  # 5 training levels + <unseen>
    assert cats[13] == len(levels["native-country"])
    assert x[13, 13] == levels["native-country"].index("Holand-Netherlands")
    assert x[NUM_TRAIN + 2, 13] == cats[13] - 1  # Atlantis -> <unseen>, the last code
    assert x[3, 1] == 0  # "?" sorts first
    # codes reach the parties unscaled, with their cardinalities
    specs = dm.party_specs
    assert [s.categories for s in specs] == [tuple(cats[0::2]), tuple(cats[1::2])]
    assert set(dm.train_set.features["party1"][:, 0].unique().tolist()) <= set(map(float, range(cats[1])))


@pytest.mark.parametrize(("encoding", "num_parties"), [("onehot", 1), ("onehot", 3), ("codes", 14), ("onehot", 14)])
def test_partition_keeps_each_feature_whole_with_one_party(root: Path, encoding: str, num_parties: int) -> None:
    dm = Adult(root=str(root), encoding=encoding, num_parties=num_parties)
    columns = dm.columns
    assert sorted(c for cols in columns for c in cols) == list(range(len(dm.feature_names)))
    for i, (_, cols, _) in enumerate(dm.feature_groups()):
        assert set(cols) <= set(columns[i % num_parties])


def test_too_many_parties_and_bad_options_are_refused(root: Path) -> None:
    with pytest.raises(ValueError, match=r"num_parties must be in 1\.\.14, got 15$"):
        Adult(root=str(root), num_parties=15)
    with pytest.raises(ValueError, match="max_rows must be an int >= 1"):
        Adult(root=str(root), max_rows=0)
    with pytest.raises(ValueError, match="encoding must be 'onehot' or 'codes'"):
        Adult(root=str(root), encoding="ordinal")


def test_max_rows_keeps_the_first_rows_of_each_file(root: Path) -> None:
    dm = Adult(root=str(root), max_rows=4, num_parties=2, val_fraction=0.25)
    x, y = dm.load()
    assert y.tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert x.shape[0] == 8
    assert "workclass=Never-worked" not in dm.feature_names  # levels from the kept training rows only
    assert dm.test_set.ids.tolist() == [4, 5, 6, 7]


def test_a_missing_numeric_value_names_file_line_and_column(tmp_path: Path) -> None:
    bad = TRAIN.replace("38, Private, 215646", "38, Private, ?", 1)
    root = write_files(tmp_path / "adult", train=bad)
    with pytest.raises(ValueError, match=r"adult\.data line 3: numeric column 'fnlwgt' \(field 3\) holds '\?'"):
        Adult(root=str(root)).load()


def test_missing_files_and_download_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    expected = (
        f"Adult: expected {root / 'adult.data'} and {root / 'adult.test'} under root={str(root)!r}; download "
        "adult.data and adult.test from the UCI Machine Learning Repository's Adult dataset "
        "(https://archive.ics.uci.edu/dataset/2/adult) into that folder"
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(expected)}$"):
        Adult(root=str(root)).setup()
    with pytest.raises(ValueError, match=r"^Adult cannot download .*: set download: false$"):
        Adult(root=str(root), download=True)


def test_easter_with_tabular_mlp_parties_runs_a_forward_pass(root: Path) -> None:
    dm = Adult(root=str(root), encoding="codes", num_parties=3, batch_size=8)
    easter = EASTER(parties=[PartyConfig(model=partial(TabularMLP, hidden=[8])) for _ in range(3)], embedding_dim=8)
    easter.build(dm.party_specs, dm.task)
    assert [easter.party_models[s.name].categories for s in dm.party_specs] == [s.categories for s in dm.party_specs]
    batch = dm.train_set[torch.arange(8)]
    logits = easter.party_logits(batch)  # every party's embedding, the global one, every party's head
    assert sorted(logits) == ["party0", "party1", "party2"]
    for out in logits.values():
        assert out.shape == (8, 2)
        assert torch.isfinite(out).all()


def test_stand_in_files_read_back_with_missing_levels(tmp_path: Path) -> None:
    Adult.write_stand_in(tmp_path, 50, seed=2)
    assert (tmp_path / "adult.test").read_text().startswith("|1x3 Cross validator\n")
    dm = Adult(root=str(tmp_path), num_parties=3, val_fraction=0.2)
    assert len(dm.train_set) + len(dm.val_set) == 50
    assert len(dm.test_set) == 50
    assert "?" in dm.levels()["workclass"]
