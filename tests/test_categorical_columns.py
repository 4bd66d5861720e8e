"""Categorical columns from a datamodule reach party models as codes, with `categories=`; numeric-only models refuse."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from lvfl.datamodules import VerticalDataModule
from lvfl.models import MLP, DeepFM, TabularMLP
from lvfl.protocols import EASTER, PartyConfig


class Shop(VerticalDataModule):
    """4 columns: numeric, categorical(3), numeric, categorical(5); the label is whether column 3's code is even."""

    num_classes = 2

    def __init__(self, codes_offset: float = 0.0, **kwargs) -> None:
        self.codes_offset = codes_offset
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        n = 200
        x = np.stack([rng.normal(5, 2, n), rng.integers(0, 3, n), rng.normal(-3, 4, n), rng.integers(0, 5, n)], axis=1)
        x[:, 3] += self.codes_offset
        return x.astype(np.float32), (x[:, 3] % 2 == 0).astype(np.int64)

    def categories(self, num_columns: int) -> list[int]:
        return [0, 3, 0, 5]


def test_codes_are_kept_and_numeric_columns_scaled_per_party() -> None:
    dm = Shop(num_parties=2)
    assert [s.categories for s in dm.party_specs] == [(0, 3), (0, 5)]
    train = dm.train_set.features
    assert set(train["party0"][:, 1].unique().tolist()) == {0.0, 1.0, 2.0}
    assert set(train["party1"][:, 1].unique().tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}
    for party in ("party0", "party1"):  # the numeric column standardized with training rows
        col = train[party][:, 0].double()
        assert abs(float(col.mean())) < 1e-5
        assert abs(float(col.std(unbiased=False)) - 1) < 1e-4


def test_a_code_out_of_range_names_the_party_column_and_values() -> None:
    with pytest.raises(ValueError, match=r"^party1's column 1 is categorical with 5 categories, so its values must be"):
        Shop(num_parties=2, codes_offset=0.5).setup("fit")


def test_protocol_passes_categories_and_refuses_a_model_that_cannot_read_them() -> None:
    dm = Shop(num_parties=2)
    easter = EASTER(
        parties=[PartyConfig(model=partial(TabularMLP, hidden=[8])), PartyConfig(model=partial(DeepFM, hidden=[8]))],
        embedding_dim=8,
    )
    easter.build(dm.party_specs, dm.task)
    assert easter.party_models["party0"].categories == (0, 3)
    assert easter.party_models["party1"].categories == (0, 5)
    batch = dm.train_set[torch.arange(16)]
    assert easter.party_models["party1"](batch.features["party1"]).shape == (16, 2)

    mlp = EASTER(parties=[PartyConfig(model=partial(MLP, hidden=[8]))], embedding_dim=8)
    with pytest.raises(ValueError, match=r"^party 'party0' holds categorical columns \(cardinalities \[0, 3\]\), but"):
        mlp.build(dm.party_specs, dm.task)


def test_a_config_that_sets_other_categories_is_refused() -> None:
    dm = Shop(num_parties=2)
    easter = EASTER(parties=[PartyConfig(model=partial(TabularMLP, categories=[0, 7]))], embedding_dim=8)
    with pytest.raises(ValueError, match=r"^party party0's model sets categories=\[0, 7\], but the datamodule"):
        easter.build(dm.party_specs, dm.task)
