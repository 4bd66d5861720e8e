"""`ClickThrough`: a synthetic, Criteo-like click-through-rate dataset, generated from a seed (no download).

Criteo's display-advertising logs have 13 integer (count) features and 26 hashed categorical ones and a binary
"clicked" label; in the FATE-style two-party setup of the non-overlapping-inference paper the active party (the
advertiser) holds ad and context features and the labels, the passive party (a publisher) user features. This
generator keeps that shape on a few thousand rows:

- active party (ad / context): `ad_position` (slot 1..6, numeric), `bid` (log-normal, numeric), `hour` (0..23 as
  sin/cos of the hour, numeric), `ad_category` (8 levels), `site_category` (5 levels);
- passive parties (user): `user_age` (numeric), `user_activity` (log of a Poisson visit count, numeric),
  `user_past_ctr` (beta-distributed, numeric), `user_segment` (8 levels), `device` (3 levels), `region` (6 levels).

Categorical features are one-hot encoded (one column per level, `<name>=<level>`), which every party model (MLP,
logistic regression) reads without embeddings; the datamodule then standardizes all columns with training rows.
`feature_names` and `column_kinds` ("numeric" / "categorical") describe every column.

The click probability is a logistic function of both sides, so that neither party alone sees all the signal:
position and bid effects and an ad-category x site-category term (active), activity, past CTR and device (passive),
and an ad-category x user-segment affinity (cross-party: a user segment likes some ad categories, which only the
joint model can use). The intercept sets the click rate near 21%.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lvfl.checks import check_int
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.partition import ExplicitColumns, Partitioner

__all__ = ["ClickThrough"]

#: (feature, levels) in column order; levels 0 means numeric (one column), else one-hot with that many columns
ACTIVE_FEATURES: tuple[tuple[str, int], ...] = (
    ("ad_position", 0),
    ("bid", 0),
    ("hour_sin", 0),
    ("hour_cos", 0),
    ("ad_category", 8),
    ("site_category", 5),
)
USER_FEATURES: tuple[tuple[str, int], ...] = (
    ("user_age", 0),
    ("user_activity", 0),
    ("user_past_ctr", 0),
    ("user_segment", 8),
    ("device", 3),
    ("region", 6),
)


class ClickThrough(VerticalDataModule):
    """Synthetic click-through data: ad/context features at the active party, user features at the passive ones.

    The default partitioner gives the active party every ad/context column and deals the six user features out to
    the passive parties round-robin (a one-hot group always stays with one party), so `num_parties` may be 1
    (everything at the active party) to 7; a custom `partitioner` overrides this.

    Args:
        num_samples: rows to generate.
        data_seed: seed of the generator, separate from `seed` (split, overlap, shuffling), so the data can stay
            fixed while the split varies.
        num_parties: parties (default 2: one advertiser, one publisher, as in the paper's FATE runs).
        **kwargs: `VerticalDataModule` arguments.

    Example:
        >>> dm = ClickThrough(num_samples=500)
        >>> [s.input_shape for s in dm.party_specs]
        [(17,), (20,)]
    """

    num_classes = 2

    def __init__(self, num_samples: int = 4000, data_seed: int = 0, num_parties: int = 2, **kwargs: Any) -> None:
        check_int(num_samples, "num_samples", 20)
        max_parties = 1 + len(USER_FEATURES)
        if not isinstance(num_parties, int) or not 1 <= num_parties <= max_parties:
            raise ValueError(
                f"ClickThrough has {len(USER_FEATURES)} user features for the passive parties, so num_parties must "
                f"be in 1..{max_parties}, got {num_parties!r}"
            )
        self.num_samples = num_samples
        self.data_seed = data_seed
        super().__init__(num_parties=num_parties, **kwargs)

    # ------------------------------------------------------------------------------------------------ columns
    @staticmethod
    def _columns_of(features: tuple[tuple[str, int], ...], start: int) -> list[tuple[str, list[int], list[str]]]:
        """(feature, its column indices, its column names), columns numbered from `start`."""
        out = []
        col = start
        for name, levels in features:
            names = [name] if levels == 0 else [f"{name}={level}" for level in range(levels)]
            out.append((name, list(range(col, col + len(names))), names))
            col += len(names)
        return out

    @property
    def feature_names(self) -> list[str]:
        """The name of every column, in column order (one-hot columns as `<feature>=<level>`)."""
        groups = self._columns_of(ACTIVE_FEATURES, 0)
        groups += self._columns_of(USER_FEATURES, sum(len(g[1]) for g in groups))
        return [n for _, _, names in groups for n in names]

    @property
    def column_kinds(self) -> list[str]:
        """The kind of every column, in column order: "numeric", or "categorical" for a one-hot column."""
        levels = dict(ACTIVE_FEATURES + USER_FEATURES)
        return ["categorical" if levels[n.split("=")[0]] else "numeric" for n in self.feature_names]

    def default_partitioner(self) -> Partitioner:
        """Ad/context columns to the active party, user features round-robin to the passive parties."""
        active = self._columns_of(ACTIVE_FEATURES, 0)
        first_user = sum(len(cols) for _, cols, _ in active)
        user = self._columns_of(USER_FEATURES, first_user)
        columns: list[list[int]] = [[] for _ in range(self.num_parties)]
        columns[self.active_party] = [c for _, cols, _ in active for c in cols]
        passive = [k for k in range(self.num_parties) if k != self.active_party]
        if not passive:  # one party holds everything
            columns[self.active_party] += [c for _, cols, _ in user for c in cols]
        for i, (_, cols, _) in enumerate(user):
            if passive:
                columns[passive[i % len(passive)]] += cols
        return ExplicitColumns(columns)

    # ------------------------------------------------------------------------------------------------ data
    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (num_samples, 37) in `feature_names` order and the clicked label (0/1)."""
        rng = np.random.default_rng([self.data_seed, 0xC71C])
        n = self.num_samples

        def onehot(index: np.ndarray, levels: int) -> np.ndarray:
            return np.eye(levels, dtype=np.float64)[index]

        # active party: ad and context
        position = rng.integers(1, 7, size=n)
        bid = rng.lognormal(mean=0.0, sigma=0.5, size=n)
        hour = rng.integers(0, 24, size=n)
        ad_cat = rng.integers(0, 8, size=n)
        site_cat = rng.integers(0, 5, size=n)
        # passive parties: the user
        age = rng.normal(38.0, 12.0, size=n).clip(16, 80)
        activity = np.log1p(rng.poisson(lam=rng.gamma(2.0, 4.0, size=n)))
        past_ctr = rng.beta(2.0, 12.0, size=n)
        segment = rng.integers(0, 8, size=n)
        device = rng.choice(3, size=n, p=[0.55, 0.35, 0.10])
        region = rng.integers(0, 6, size=n)

        # fixed effect tables, from their own stream so that they do not depend on n
        effects = np.random.default_rng([self.data_seed, 0xEFF])
        ad_site = effects.normal(0.0, 0.5, size=(8, 5))
        affinity = effects.normal(0.0, 1.2, size=(8, 8))  # user segment x ad category: the cross-party signal
        device_effect = np.array([0.0, 0.3, -0.4])
        hour_phase = 2 * np.pi * hour / 24

        logit = (
            -1.2
            - 0.25 * (position - 1)
            + 0.6 * np.log(bid)
            + 0.3 * np.sin(hour_phase)
            + ad_site[ad_cat, site_cat]
            + 0.35 * (activity - activity.mean())
            + 6.0 * (past_ctr - past_ctr.mean())
            - 0.01 * (age - 38.0)
            + device_effect[device]
            + affinity[segment, ad_cat]
        )
        clicked = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

        x = np.concatenate(
            [
                position[:, None].astype(np.float64),
                bid[:, None],
                np.sin(hour_phase)[:, None],
                np.cos(hour_phase)[:, None],
                onehot(ad_cat, 8),
                onehot(site_cat, 5),
                age[:, None],
                activity[:, None],
                past_ctr[:, None],
                onehot(segment, 8),
                onehot(device, 3),
                onehot(region, 6),
            ],
            axis=1,
        )
        return x.astype(np.float32), clicked
