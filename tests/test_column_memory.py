"""A column-major table whose rows give their memory back once copied (`lvfl.datamodules.column_memory`), and the
splits' slices cut from it (`scaling._gathered`): the same values as one fancy index per split, the memory freed as
the slices fill, not after."""

from __future__ import annotations

import numpy as np
import pytest

from lvfl.datamodules import scaling
from lvfl.datamodules.column_memory import column_major_zeros, is_releasable, release_rows
from lvfl.datamodules.scaling import _gathered, scaled_slices


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_released_rows_are_freed_and_read_as_zeros_and_only_a_whole_map_is_released():
    x = column_major_zeros(1_000_000, 16)  # 4 MB a column
    assert x.flags.f_contiguous
    assert not x.any()
    assert is_releasable(x)
    x[:] = 1.0
    before = resident_mb()
    release_rows(x, range(8), 0, 1_000_000)
    release_rows(x, [8], 0, 500_000)
    assert before - resident_mb() > 0.95 * (32 + 2)  # 8 columns of 4 MB and half of one went back to the system
    # every page wholly inside them reads zero: at most the two pages a column shares with its neighbours stay
    assert (np.count_nonzero(x[:, :8], axis=0) <= 2 * 1024).all()
    assert not x[1024:499_000, 8].any()
    assert x[500_000:, 8].all()
    assert x[:, 9:].all()
    assert not is_releasable(x[:, 2:4])  # a view of part of it
    assert not is_releasable(np.ones((4, 4), order="F"))  # the allocator's memory
    release_rows(np.ones((4, 4), order="F"), [0], 0, 4)  # left as it is


def test_slices_are_gathered_as_one_fancy_index_per_split_and_the_table_given_back(monkeypatch):
    monkeypatch.setattr(scaling, "_GATHER_ROWS", 700)  # several runs of rows per split, some under a page
    rng = np.random.default_rng(0)
    x = column_major_zeros(5_000, 40)
    x[:] = rng.normal(size=x.shape)
    reference = np.array(x)  # a copy that nothing releases
    rows = {"train": rng.permutation(5_000)[:3_000], "val": np.arange(10, 900) * 5 % 4_990, "test": np.array([4_999])}
    rows["val"] = np.setdiff1d(rows["val"], rows["train"])
    for cols in ([3, 17, 5], list(range(2, 39))):
        got = _gathered(x, cols, rows, release=False)
        for split, idx in rows.items():
            assert got[split].flags.c_contiguous
            assert np.array_equal(got[split], reference[np.ix_(idx, cols)])
    cols = list(range(40))
    slices, _ = scaled_slices(x, cols, rows, False, False, release=True)
    for split, idx in rows.items():
        assert np.array_equal(slices[split].numpy(), reference[np.ix_(idx, cols)])
    # every run of rows copied was given back (the rows the splits hold lead every column now): at most the pages
    # at either end of that run, shared with the previous column and with the rows no split holds, stay
    held = sum(len(idx) for idx in rows.values())
    assert (np.count_nonzero(x[:held], axis=0) <= 2 * 1024).all()


@pytest.mark.slow
def test_the_table_and_its_slices_never_stand_whole_together():
    x = column_major_zeros(1_000_000, 64)  # 256 MB
    x[:] = 1.0
    rows = {"train": np.arange(0, 700_000), "val": np.arange(700_000, 850_000), "test": np.arange(850_000, 1_000_000)}
    high = [resident_mb()]
    original = scaling.release_rows

    def watched(*args):
        original(*args)
        high.append(resident_mb())

    scaling.release_rows = watched
    try:
        _gathered(x, list(range(64)), rows, release=True)
    finally:
        scaling.release_rows = original
    assert max(high) - high[0] < 0.1 * 256  # the slices took the table's place; never both at once
