"""A party table's feature columns as arrays: a million rows without a Python object per value.

A value of a table is a finite number or a text (a missing value is a text too: `MISSING`'s spellings). `Column`
keeps a column's numbers in one float64 array and its texts once each, rows pointing at them by code; a column
read as text (`categorical`) keeps every value as its text, so levels that look like numbers ("007") stay as
written. `ColumnBuilder` grows one from the chunks a reader reads, so a table is never held as rows of strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MISSING", "Column", "ColumnBuilder", "finite_number", "number_text"]

MISSING = {"", "na", "nan", "null", "none"}  #: field texts read as a missing value (case-insensitive)
_NUMBER = -1  # a row's code where `numbers` holds its value


def finite_number(text: str) -> float:
    """The finite number a text holds (Python's `float` reading), NaN where it holds none."""
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def number_text(value: float) -> str:
    """A number's text for messages and row-wise readers: a whole number as its integer, else Python's repr."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


@dataclass
class Column:
    """One feature column of a table, row by row a finite number or a text.

    Attributes:
        numbers: float64 per row, the value of a row holding a number; NaN where it holds a text. None for a
            column read as text (every row a text).
        codes: int32 per row, the index into `texts` of a row holding a text, -1 where `numbers` holds its value;
            None where every row holds a number.
        texts: the column's distinct texts, each once (missing values' spellings among them).
    """

    numbers: np.ndarray | None
    codes: np.ndarray | None
    texts: list[str]

    def __len__(self) -> int:
        return len(self.numbers if self.numbers is not None else self.codes)

    def _of_texts(self, flags: list[bool]) -> np.ndarray:
        """Per row, the flag of its text (`flags[code]`), False for a row holding a number."""
        if self.codes is None:
            return np.zeros(len(self), dtype=bool)
        return np.asarray([*flags, False], dtype=bool)[self.codes]  # code -1 reads the appended False

    def missing(self) -> np.ndarray:
        """Per row, whether its value is missing (a text of `MISSING`'s)."""
        return self._of_texts([t.lower() in MISSING for t in self.texts])

    def wordy(self) -> np.ndarray:
        """Per row, whether it holds a text that is no missing value."""
        return self._of_texts([t.lower() not in MISSING for t in self.texts])

    def text(self, row: int) -> str:
        """A row's value as text (a number as `number_text` writes it)."""
        code = _NUMBER if self.codes is None else int(self.codes[row])
        return self.texts[code] if code != _NUMBER else number_text(float(self.numbers[row]))

    def take(self, rows: np.ndarray) -> Column:
        """The column's `rows`, in that order (the texts are shared)."""
        numbers = None if self.numbers is None else self.numbers[rows]
        return Column(numbers, None if self.codes is None else self.codes[rows], self.texts)


class _Growing:
    """One array appended to chunk by chunk in a buffer that doubles: a chunk is copied in, never kept apart.

    (Thousands of small chunks would each be a small allocation, and the allocator keeps such memory for the process
    after they are joined and freed: at a million rows, as much again as the table.)
    """

    def __init__(self, dtype: type, capacity: int) -> None:
        self.data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, chunk: np.ndarray) -> None:
        """Append the values of `chunk`."""
        count = len(chunk)
        self._reserve(count)
        self.data[self.size : self.size + count] = chunk
        self.size += count

    def repeat(self, value: float, count: int) -> None:
        """Append `value` `count` times."""
        self._reserve(count)
        self.data[self.size : self.size + count] = value
        self.size += count

    def _reserve(self, count: int) -> None:
        if self.size + count > len(self.data):
            grown = np.empty(max(self.size + count, 2 * len(self.data)), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown

    def array(self) -> np.ndarray:
        """The values appended (the buffer itself where it is full, else a copy of its used part)."""
        data, self.data = self.data, np.empty(0, dtype=self.data.dtype)
        return data if self.size == len(data) else data[: self.size].copy()


class ColumnBuilder:
    """Grows a `Column` chunk by chunk; `as_text` keeps every value as its text (a categorical column).

    `rows`: how many rows are coming, where the reader knows (Parquet's metadata): the arrays are allocated once.
    """

    def __init__(self, as_text: bool, rows: int = 0) -> None:
        self.as_text = as_text
        self._rows = rows
        self._index: dict[str, int] = {}  # text -> its code, in the order first read
        self._numbers = None if as_text else _Growing(np.float64, rows)
        self._codes = _Growing(np.int32, rows) if as_text else None  # made at the first text of a numeric column
        self._count = 0

    def _code(self, text: str) -> int:
        return self._index.setdefault(text, len(self._index))

    def _add(self, numbers: np.ndarray | None, codes: np.ndarray | None, count: int) -> None:
        if self._numbers is not None:
            self._numbers.extend(numbers)
        if codes is not None and self._codes is None:  # the first text: the rows so far held numbers
            self._codes = _Growing(np.int32, max(self._rows, self._count + count))
            self._codes.repeat(_NUMBER, self._count)
        if self._codes is not None:
            if codes is None:
                self._codes.repeat(_NUMBER, count)
            else:
                self._codes.extend(codes)
        self._count += count

    def add_texts(self, texts: list[str]) -> None:
        """A chunk of rows' texts (stripped), dictionary-encoded here so each distinct text is read once."""
        local: dict[str, int] = {}
        codes = np.fromiter((local.setdefault(t, len(local)) for t in texts), dtype=np.int64, count=len(texts))
        self.add_coded(codes, list(local))

    def add_coded(self, codes: np.ndarray, uniques: list[str]) -> None:
        """A chunk given as per-row indices into its distinct texts `uniques` (stripped)."""
        if self.as_text:
            lut = np.fromiter((self._code(u) for u in uniques), dtype=np.int32, count=len(uniques))
            self._add(None, lut[codes], len(codes))
            return
        values = np.fromiter((finite_number(u) for u in uniques), dtype=np.float64, count=len(uniques))
        wordy = np.flatnonzero(np.isnan(values))
        if not len(wordy):
            self._add(values[codes], None, len(codes))
            return
        lut = np.full(len(uniques), _NUMBER, dtype=np.int32)
        lut[wordy] = [self._code(uniques[k]) for k in wordy]
        self._add(values[codes], lut[codes], len(codes))

    def add_numbers(self, values: np.ndarray, null: np.ndarray | None) -> None:
        """A chunk of typed numbers (float64) of a column not read as text; `null` marks missing rows.

        NaN and infinities are held as their texts ("nan": missing; "inf": a text that is no number), as a
        row-wise reader would read them.
        """
        if self.as_text:
            raise ValueError("a column read as text takes texts (add_texts), not typed numbers")
        values = np.asarray(values, dtype=np.float64)
        odd = ~np.isfinite(values)
        if null is not None:
            odd |= null
        if not odd.any():
            self._add(values, None, len(values))
            return
        codes = np.full(len(values), _NUMBER, dtype=np.int32)
        for i in np.flatnonzero(odd):
            codes[i] = self._code("" if null is not None and null[i] else str(float(values[i])))
        numbers = values.copy()
        numbers[odd] = math.nan
        self._add(numbers, codes, len(values))

    def finish(self) -> Column:
        """The column read (the builder lets go of its arrays)."""
        numbers = None if self._numbers is None else self._numbers.array()
        codes = None if self._codes is None else self._codes.array()
        return Column(numbers, codes, list(self._index))
