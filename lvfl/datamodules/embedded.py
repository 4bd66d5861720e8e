"""Datasets bundled with scikit-learn (no download): fast to load, so tests and smoke runs use them.

Every class here takes `VerticalDataModule`'s arguments (num_parties, partitioner, batch_size, ...); `Synthetic` adds
the generator's own. Tabular sets default to `ContiguousColumns`, `Digits` to `ImageStrips`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine, make_classification

from lvfl.checks import check_int
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.partition import ImageStrips, Partitioner

__all__ = ["BreastCancer", "Diabetes", "Digits", "Synthetic", "Wine"]


class Digits(VerticalDataModule):
    """8x8 handwritten digits (1,797 images, 10 classes), split into vertical image strips (4 parties: 2 columns each).

    Each party's samples are (1, 8, w_k) images so that CNN party models apply unchanged.
    """

    num_classes = 10

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Images (N, 8, 8) with pixel values 0..16, and digit labels."""
        data = load_digits()
        return data.images.astype(np.float32), data.target.astype(np.int64)

    def default_partitioner(self) -> Partitioner:
        """Vertical strips of the image."""
        return ImageStrips()


class BreastCancer(VerticalDataModule):
    """Wisconsin breast cancer (569 samples, 30 features, binary): the usual tabular VFL benchmark.

    The columns come in three blocks of ten (mean, error, worst); `ContiguousColumns` keeps related columns together,
    `ShuffledColumns` spreads them.
    """

    num_classes = 2

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (N, 30) and labels (0 malignant, 1 benign)."""
        data = load_breast_cancer()
        return data.data, data.target.astype(np.int64)


class Wine(VerticalDataModule):
    """Wine recognition (178 samples, 13 features, 3 classes): a small multiclass tabular set."""

    num_classes = 3

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (N, 13) and cultivar labels."""
        data = load_wine()
        return data.data, data.target.astype(np.int64)


class Diabetes(VerticalDataModule):
    """Diabetes progression (442 samples, 10 features): a binary task (the default) or the regression it comes from.

    `task: binary`: the regression target is binarized at the median of the TRAINING split only (label 1 when the
    target is above it): a median over all rows would let the test targets shape the labels. So the split is made on
    the continuous target first, stratified on its quantile bins so every split covers the whole range, and then
    every split is thresholded at the training median. `task: regression`: the same split; the labels are the
    targets, standardized with the training rows' mean and standard deviation (metrics and predictions are reported
    in the target's units). Features are loaded unscaled (`scaled=False`) because scikit-learn's default pre-scales
    them with statistics of all rows; the datamodule scales with training rows only.

    Args:
        task: "binary" (above / below the training median) or "regression" (the disease-progression value).
        num_bins: quantile bins of the target used only to stratify the split.
        **kwargs: `VerticalDataModule` arguments.
    """

    num_classes = 2

    def __init__(self, task: str = "binary", num_bins: int = 5, **kwargs: Any) -> None:
        if task not in ("binary", "regression"):
            raise ValueError(f"Diabetes: task must be 'binary' or 'regression', got task={task!r}")
        if num_bins < 1:
            raise ValueError(f"num_bins must be at least 1, got {num_bins}")
        self.regression = task == "regression"
        self.num_bins = num_bins
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Raw features (N, 10) and the continuous disease-progression target."""
        data = load_diabetes(scaled=False)
        return data.data, data.target.astype(np.float64)

    def stratify_key(self, y: np.ndarray) -> np.ndarray:
        """Quantile bin of each target, so the split is balanced over the target's range."""
        edges = np.quantile(y, np.linspace(0.0, 1.0, self.num_bins + 1)[1:-1])
        return np.searchsorted(edges, y, side="right")

    def labels_from_targets(self, y: np.ndarray, train_rows: np.ndarray) -> np.ndarray:
        """Binary: 1 above the training targets' median, else 0 (one threshold for all splits); regression: y."""
        if self.regression:
            return y
        return (y > np.median(y[train_rows])).astype(np.int64)


class Synthetic(VerticalDataModule):
    """A `make_classification` dataset of any size, for performance and scaling runs.

    Args:
        num_samples: rows.
        num_features: feature columns (split among the parties).
        num_informative: columns that carry the class signal; the rest are noise.
        num_classes: classes.
        data_seed: seed of the generator, separate from `seed` (the split) so the data can stay fixed while the
            split varies.
        **kwargs: `VerticalDataModule` arguments.
    """

    def __init__(
        self,
        num_samples: int = 1000,
        num_features: int = 20,
        num_informative: int = 10,
        num_classes: int = 2,
        data_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        check_int(num_samples, "num_samples", 1)
        check_int(num_features, "num_features", 1)
        if num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        if not 1 <= num_informative <= num_features:
            raise ValueError(f"num_informative={num_informative} must be in 1..num_features={num_features}")
        if num_classes * 2 > 2**num_informative:
            raise ValueError(
                f"num_informative={num_informative} is too small for num_classes={num_classes}: make_classification "
                f"needs 2**num_informative >= 2 * num_classes"
            )
        self.num_samples = num_samples
        self.num_features = num_features
        self.num_informative = num_informative
        self.num_classes = num_classes
        self.data_seed = data_seed
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (num_samples, num_features) and balanced labels."""
        x, y = make_classification(
            n_samples=self.num_samples,
            n_features=self.num_features,
            n_informative=self.num_informative,
            n_redundant=0,
            n_classes=self.num_classes,
            random_state=self.data_seed,
        )
        return x.astype(np.float32), y.astype(np.int64)
