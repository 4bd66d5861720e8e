"""Partitioners: which feature columns (or image columns) each party holds.

A vertical split gives every party a different set of columns of the same samples. A partitioner only decides the
column indices; the datamodule does the slicing, so one partitioner serves tabular data (columns are features) and
images (columns are pixel columns along the width, so each party holds a vertical strip and stays an image).

Partitioners are small classes with type-hinted `__init__` arguments so that a config selects one by `class_path`::

    data:
      partitioner:
        class_path: lvfl.datamodules.ShuffledColumns
        init_args: {seed: 3}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence

import numpy as np

from lvfl.checks import is_int

__all__ = [
    "ContiguousColumns",
    "ExplicitColumns",
    "ImageStrips",
    "Partitioner",
    "ShuffledColumns",
    "check_columns",
]


class Partitioner(ABC):
    """Decides which column indices each party holds."""

    @abstractmethod
    def split(self, num_columns: int, num_parties: int) -> list[list[int]]:
        """Assign columns to parties.

        Args:
            num_columns: columns available: the feature count for tabular data, the image width for images.
            num_parties: parties to split among, in party-index order.

        Returns:
            One list of column indices per party (party `k` gets entry `k`); non-empty and pairwise disjoint.
        """

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _check_counts(num_columns: int, num_parties: int) -> None:
    if num_parties < 1:
        raise ValueError(f"num_parties must be at least 1, got {num_parties}")
    if num_parties > num_columns:
        raise ValueError(
            f"num_parties={num_parties} exceeds the {num_columns} columns available: every party needs at least one"
        )


def _contiguous_groups(order: Sequence[int], num_parties: int) -> list[list[int]]:
    """Cut `order` into `num_parties` contiguous groups whose sizes differ by at most one (larger groups first)."""
    return [[int(c) for c in group] for group in np.array_split(np.asarray(order, dtype=np.int64), num_parties)]


class ContiguousColumns(Partitioner):
    """Contiguous column groups, as equal as possible: the usual split of a tabular dataset in VFL papers.

    With 30 columns over 4 parties the groups have 8, 8, 7 and 7 columns; the first `num_columns % num_parties`
    parties get the extra column.
    """

    def split(self, num_columns: int, num_parties: int) -> list[list[int]]:
        """Split `range(num_columns)` into `num_parties` contiguous groups."""
        _check_counts(num_columns, num_parties)
        return _contiguous_groups(range(num_columns), num_parties)


class ImageStrips(ContiguousColumns):
    """Vertical strips of an image along its width, as equal as possible (8-wide digits over 4 parties: 2 each).

    The same arithmetic as `ContiguousColumns` applied to pixel columns; a separate name so that an image
    config says what the parties hold (each holds an image strip of full height that a CNN can still consume).
    """


class ShuffledColumns(Partitioner):
    """A seeded random permutation of the columns, then contiguous groups of it.

    Spreads informative features across parties when a dataset orders its columns by meaning (for example
    BreastCancer lists the mean, error and worst of each measurement in blocks). Each party's columns are kept in
    ascending order, so the permutation only decides membership.

    Args:
        seed: seed of the permutation; the same seed always gives the same split.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def split(self, num_columns: int, num_parties: int) -> list[list[int]]:
        """Permute `range(num_columns)` with the seed, then cut it into contiguous groups."""
        _check_counts(num_columns, num_parties)
        order = np.random.default_rng(self.seed).permutation(num_columns)
        return [sorted(group) for group in _contiguous_groups(order, num_parties)]


class ExplicitColumns(Partitioner):
    """Exactly the given columns per party, for a split that follows real ownership (bank vs. retailer columns).

    Columns not listed are held by no party. Validation happens twice: the lists themselves here, their count and
    range against the data in `split`.

    Args:
        columns: `columns[k]` is the list of column indices of party `k`.
    """

    def __init__(self, columns: list[list[int]]) -> None:
        if len(columns) == 0:
            raise ValueError("ExplicitColumns needs at least one party's column list, got none")
        for k, cols in enumerate(columns):
            if len(cols) == 0:
                raise ValueError(f"ExplicitColumns: party {k} has no columns; every party needs at least one")
            bad = [c for c in cols if not is_int(c) or c < 0]
            if bad:
                raise ValueError(f"ExplicitColumns: party {k} has invalid column indices {bad}; use ints >= 0")
        self.columns = [[int(c) for c in cols] for cols in columns]
        check_columns(self.columns, num_columns=None, num_parties=len(self.columns))

    def split(self, num_columns: int, num_parties: int) -> list[list[int]]:
        """Return the configured columns after checking them against the data and the party count."""
        if len(self.columns) != num_parties:
            raise ValueError(
                f"ExplicitColumns lists columns for {len(self.columns)} parties but num_parties={num_parties}"
            )
        check_columns(self.columns, num_columns=num_columns, num_parties=num_parties)
        return [list(cols) for cols in self.columns]


def check_columns(columns: Sequence[Sequence[int]], num_columns: int | None, num_parties: int) -> None:
    """Check a split: one non-empty list per party, indices in range, no column held twice.

    Also applied by the datamodule to any custom partitioner's output, so a faulty partitioner fails here with a
    clear message instead of as a shape error inside a party's model.

    Args:
        columns: the split, one list of column indices per party.
        num_columns: columns available, or None to skip the range check (before the data is known).
        num_parties: expected number of lists.

    Raises:
        ValueError: on the first violation, naming the party and the offending indices.
    """
    if len(columns) != num_parties:
        raise ValueError(f"the partition has {len(columns)} column lists but num_parties={num_parties}")
    owner: dict[int, int] = {}
    for k, cols in enumerate(columns):
        if len(cols) == 0:
            raise ValueError(f"party {k} has no columns in the partition; every party needs at least one")
        if num_columns is not None:
            out = sorted({int(c) for c in cols if not 0 <= c < num_columns})
            if out:
                raise ValueError(
                    f"party {k} has column indices {out} outside 0..{num_columns - 1} ({num_columns} columns)"
                )
        dup = sorted(int(c) for c, n in Counter(cols).items() if n > 1)
        if dup:
            raise ValueError(f"party {k} lists columns {dup} more than once")
        for c in cols:
            if int(c) in owner:
                raise ValueError(f"column {int(c)} is assigned to both party {owner[int(c)]} and party {k}")
            owner[int(c)] = k
