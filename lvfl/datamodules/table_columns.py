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

__all__ = ["MISSING", "Column", "ColumnBuilder", "number_text"]

MISSING = {"", "na", "nan", "null", "none"}  #: field texts read as a missing value (case-insensitive)
_NUMBER = -1  # a row's code where `numbers` holds its value


def _finite(text: str) -> float:
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

    @classmethod
    def of_texts(cls, texts: list[str], as_text: bool) -> Column:
        """A column of a few texts (a request's row), as a reader would build it."""
        builder = ColumnBuilder(as_text)
        builder.add_texts(texts)
        return builder.finish()


class ColumnBuilder:
    """Grows a `Column` chunk by chunk; `as_text` keeps every value as its text (a categorical column)."""

    def __init__(self, as_text: bool) -> None:
        self.as_text = as_text
        self._index: dict[str, int] = {}  # text -> its code, in the order first read
        self._numbers: list[np.ndarray] = []
        self._codes: list[np.ndarray | None] = []  # None: a chunk of numbers only

    def _code(self, text: str) -> int:
        return self._index.setdefault(text, len(self._index))

    def add_texts(self, texts: list[str]) -> None:
        """A chunk of rows' texts (stripped), dictionary-encoded here so each distinct text is read once."""
        local: dict[str, int] = {}
        codes = np.fromiter((local.setdefault(t, len(local)) for t in texts), dtype=np.int64, count=len(texts))
        self.add_coded(codes, list(local))

    def add_coded(self, codes: np.ndarray, uniques: list[str]) -> None:
        """A chunk given as per-row indices into its distinct texts `uniques` (stripped)."""
        if self.as_text:
            lut = np.fromiter((self._code(u) for u in uniques), dtype=np.int32, count=len(uniques))
            self._codes.append(lut[codes])
            return
        values = np.fromiter((_finite(u) for u in uniques), dtype=np.float64, count=len(uniques))
        wordy = np.flatnonzero(np.isnan(values))
        self._numbers.append(values[codes])
        if not len(wordy):
            self._codes.append(None)
            return
        lut = np.full(len(uniques), _NUMBER, dtype=np.int32)
        lut[wordy] = [self._code(uniques[k]) for k in wordy]
        self._codes.append(lut[codes])

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
            self._numbers.append(values)
            self._codes.append(None)
            return
        codes = np.full(len(values), _NUMBER, dtype=np.int32)
        for i in np.flatnonzero(odd):
            codes[i] = self._code("" if null is not None and null[i] else str(float(values[i])))
        numbers = values.copy()
        numbers[odd] = math.nan
        self._numbers.append(numbers)
        self._codes.append(codes)

    def finish(self) -> Column:
        """The column read so far."""
        numbers = None if self.as_text else _joined(self._numbers, np.float64)
        if all(c is None for c in self._codes):
            codes = None
        else:
            sizes = [len(n) for n in self._numbers] if not self.as_text else [len(c) for c in self._codes]
            chunks = [
                np.full(s, _NUMBER, dtype=np.int32) if c is None else c for c, s in zip(self._codes, sizes, strict=True)
            ]
            codes = _joined(chunks, np.int32)
        return Column(numbers, codes, list(self._index))


def _joined(chunks: list[np.ndarray], dtype: type) -> np.ndarray:
    """Chunks end to end (the one chunk itself, uncopied)."""
    if len(chunks) == 1:
        return chunks[0].astype(dtype, copy=False)
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(0, dtype=dtype)
