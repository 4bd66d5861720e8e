"""How a party's raw columns become model input: encoders fitted on the party's training rows only.

See `lvfl.datamodules.tables` for the policy (numeric vs categorical columns, `<unseen>` and `<missing>` levels,
missing-value policies); `ColumnEncoder` is kept after fitting, for prediction on new rows and for `lvfl export`. The
active party's label column is read here too: numbers for a regression (`numeric_labels`), else classes checked
against the task the config states (`check_classes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lvfl.datamodules.table_columns import MISSING, Column, finite_number
from lvfl.datamodules.table_files import PartyTable, Table

__all__ = [
    "MAX_NUMERIC_CLASSES",
    "MISSING_LEVEL",
    "TASKS",
    "UNSEEN",
    "ColumnEncoder",
    "check_classes",
    "fit_encoders",
    "numeric_labels",
]

MISSING_LEVEL = "<missing>"  #: the level of a missing categorical value (when `missing` is not refuse)
UNSEEN = "<unseen>"  #: the reserved level of values not seen in the training rows


@dataclass
class ColumnEncoder:
    """How one raw column becomes model input, fitted on the training rows (kept for prediction and export).

    `kind` "numeric": the value, missing ones replaced by `fill` (plus an indicator column when `indicator`);
    "categorical": a level index into `levels` (its last entry the reserved `<unseen>`), one-hot or as a code.
    """

    name: str
    kind: str
    fill: float | None = None
    indicator: bool = False
    levels: list[str] = field(default_factory=list)
    onehot: bool = True
    fill_level: str | None = None  # categorical, missing: mode: the level a missing value takes

    @property
    def output_names(self) -> list[str]:
        """The encoded columns' names."""
        flag = [f"{self.name} missing"] if self.indicator else []
        if self.kind == "numeric":
            return [self.name, *flag]
        return [*([f"{self.name}={level}" for level in self.levels] if self.onehot else [self.name]), *flag]

    @property
    def cardinalities(self) -> list[int]:
        """Per output column: the number of levels of a code column (`onehot` False), else 0 (numeric)."""
        codes = self.kind == "categorical" and not self.onehot
        return [len(self.levels) if codes and j == 0 else 0 for j in range(len(self.output_names))]

    def encode(self, texts: list[str], origins: list[str]) -> np.ndarray:
        """(rows, len(output_names)) float32 for the column's texts (`origins`: where each is, for messages).

        A request's row, value by value: `encode_column`'s rules without its arrays, which cost several times as
        much for one value (serving encodes each request so). Tests hold the two to the same output.
        """
        if self.kind == "numeric":
            out = np.zeros((len(texts), 2 if self.indicator else 1), dtype=np.float32)
            for i, text in enumerate(texts):
                if text.lower() in MISSING:
                    if self.fill is None:
                        raise ValueError(
                            f"{origins[i]}: column {self.name!r} is missing a value (missing: refuse; "
                            "set the table's `missing` to mean or median to impute it)"
                        )
                    out[i, 0] = self.fill
                    if self.indicator:
                        out[i, 1] = 1.0
                    continue
                value = finite_number(text)
                if math.isnan(value):
                    raise ValueError(
                        f"{origins[i]}: column {self.name!r} holds {text!r}, not a number (the column is "
                        "numeric in the training rows; list it in `categorical` to encode it as categories)"
                    )
                out[i, 0] = value
            return out
        index = {level: j for j, level in enumerate(self.levels)}
        codes = np.empty(len(texts), dtype=np.int64)
        gaps = np.zeros((len(texts), 1), dtype=np.float32)
        for i, text in enumerate(texts):
            absent = text.lower() in MISSING
            gaps[i] = absent
            level = (self.fill_level or MISSING_LEVEL) if absent else text
            if level == MISSING_LEVEL and level not in index:
                raise ValueError(
                    f"{origins[i]}: column {self.name!r} is missing a value (missing: refuse; set the "
                    "table's `missing` to mean or median to give missing values a level of their own)"
                )
            codes[i] = index.get(level, len(self.levels) - 1)  # unseen in training: the reserved last level
        if not self.onehot:
            out = codes[:, None].astype(np.float32)
        else:
            out = np.zeros((len(texts), len(self.levels)), dtype=np.float32)
            out[np.arange(len(texts)), codes] = 1.0
        return np.concatenate([out, gaps], axis=1) if self.indicator else out

    def encode_column(
        self, column: Column, rows: np.ndarray, origin: Callable[[int], str], out: np.ndarray | None = None
    ) -> np.ndarray:
        """The column's `rows` as (len(rows), len(output_names)) float32, written into `out` where given.

        `origin(row)` says where a row is, for the message that refuses it.
        """
        width = len(self.output_names)
        out = np.zeros((len(rows), width), dtype=np.float32) if out is None else out
        part = column.take(rows)
        absent = part.missing()
        if self.kind == "numeric":
            wordy = np.flatnonzero(part.wordy())
            if len(wordy):
                i = int(wordy[0])
                raise ValueError(
                    f"{origin(int(rows[i]))}: column {self.name!r} holds {part.text(i)!r}, not a number (the column "
                    "is numeric in the training rows; list it in `categorical` to encode it as categories)"
                )
            if absent.any() and self.fill is None:
                i = int(np.flatnonzero(absent)[0])
                raise ValueError(
                    f"{origin(int(rows[i]))}: column {self.name!r} is missing a value (missing: refuse; "
                    "set the table's `missing` to mean or median to impute it)"
                )
            out[:, 0] = part.numbers if not absent.any() else np.where(absent, self.fill, part.numbers)
            if self.indicator:
                out[:, 1] = absent
            return out
        index = {level: j for j, level in enumerate(self.levels)}
        unseen = len(self.levels) - 1  # unseen in training: the reserved last level
        gap = index[self.fill_level] if self.fill_level is not None else index.get(MISSING_LEVEL, -1)
        spelled = zip(column.texts, _spelled_missing(column), strict=True)
        lut = np.asarray([*(gap if m else index.get(t, unseen) for t, m in spelled), unseen], dtype=np.int64)
        codes = np.full(len(rows), unseen, dtype=np.int64) if part.codes is None else lut[part.codes]
        if gap < 0 and absent.any():
            i = int(np.flatnonzero(absent)[0])
            raise ValueError(
                f"{origin(int(rows[i]))}: column {self.name!r} is missing a value (missing: refuse; set the "
                "table's `missing` to mean or median to give missing values a level of their own)"
            )
        if not self.onehot:
            out[:, 0] = codes
        else:
            out[:, : len(self.levels)] = 0.0
            out[np.arange(len(rows)), codes] = 1.0
        if self.indicator:
            out[:, -1] = absent
        return out


def _spelled_missing(column: Column) -> list[bool]:
    """Per text of a column, whether it spells a missing value."""
    return [t.lower() in MISSING for t in column.texts]


def fit_encoders(table: Table, source: PartyTable, train: np.ndarray, onehot: bool) -> list[ColumnEncoder]:
    """Each column's encoder from the table's training rows `train` only (see the module docstring).

    With `onehot`, a categorical column of more than `source.max_levels` training levels is refused: one 0/1 column
    per level would silently turn a near-unique column into thousands of inputs.
    """
    encoders = []
    refused: list[tuple[int, str]] = []  # checked once every column's policy fits it: a config mistake comes first
    for j, name in enumerate(table.columns):
        part = table.data[j].take(train)
        present = ~part.missing()
        numbers = part.numbers if part.numbers is not None else np.full(len(train), math.nan)
        parsed = present & ~np.isnan(numbers)  # the present values that are numbers
        count, numeric = int(present.sum()), int(parsed.sum())
        if name not in source.categorical and 0 < numeric < count:  # a typo must not turn it categorical
            odd_is_text = numeric >= count / 2  # name the value of the minority kind
            i = int(np.flatnonzero(present & (parsed != odd_is_text))[0])
            kind = "not a number, while its other values are numbers" if odd_is_text else "a number among text values"
            raise ValueError(
                f"{table.origin(int(train[i]))}: column {name!r} holds {part.text(i)!r}, {kind}; fix the "
                "value, or list the column in `categorical` (levels may look like numbers)"
            )
        policy = source.missing_columns.get(name, source.missing)
        explicit = name in source.missing_columns
        if policy == "refuse":
            refused.append((j, name))
        gaps = count < len(train)  # the training rows miss a value: an indicator column says where
        if policy != "refuse" and not count:
            raise ValueError(f"{table.path}: column {name!r} has no value in the training rows to impute from")
        if name not in source.categorical and numeric == count:
            if policy == "level" and explicit:
                raise ValueError(
                    f"{table.path}: column {name!r} is numeric; missing 'level' is for categorical columns"
                )
            values = numbers[present]
            fill = None
            if policy in ("mean", "median", "level"):  # a table-wide `level` leaves numeric columns to the mean
                fill = float(np.median(values) if policy == "median" else np.mean(values))
            elif policy == "mode":
                found, counts = np.unique(values, return_counts=True)
                fill = float(found[np.argmax(counts)])  # the smallest of the most frequent values
            encoders.append(ColumnEncoder(name, "numeric", fill=fill, indicator=fill is not None and gaps))
        else:
            if policy in ("mean", "median") and explicit:
                raise ValueError(
                    f"{table.path}: column {name!r} is categorical; its missing policy can be mode or level"
                )
            tally = np.bincount(part.codes[present], minlength=len(part.texts)) if count else np.zeros(0, int)
            levels = sorted(part.texts[k] for k in np.flatnonzero(tally))
            if onehot and len(levels) > source.max_levels:  # codes: one column whatever the count
                raise ValueError(
                    f"{table.path}: column {name!r} has {len(levels)} levels in the training rows, more than the "
                    f"table's max_levels={source.max_levels} for encoding: onehot (a 0/1 column each); use "
                    "`encoding: codes` with an embedding party model (lvfl.models.TabularMLP, DeepFM or WideDeep), "
                    "or raise the table's `max_levels`"
                )
            fill_level = None
            if policy == "mode":
                counts = {part.texts[k]: int(tally[k]) for k in np.flatnonzero(tally)}
                fill_level = max(levels, key=counts.__getitem__)  # ties: the first in sorted order
            elif policy != "refuse":
                levels.append(MISSING_LEVEL)
            encoders.append(
                ColumnEncoder(
                    name,
                    "categorical",
                    levels=[*levels, UNSEEN],
                    onehot=onehot,
                    fill_level=fill_level,
                    indicator=fill_level is not None and gaps,
                )
            )
    for j, name in refused:
        _refuse_missing(table, j, name)
    return encoders


def _refuse_missing(table: Table, j: int, name: str) -> None:
    """Refuse a column with missing values under `missing: refuse`, naming the first in file order and the count."""
    absent = np.flatnonzero(table.data[j].missing())
    if len(absent):
        rows = len(table.ids)
        more = f" (and {len(absent) - 1} more of the table's {rows} rows)" if len(absent) > 1 else ""
        raise ValueError(
            f"{table.origin(int(absent[0]))}: column {name!r} is missing a value{more} (missing: refuse; set the "
            "table's `missing`, or this column's in `missing_columns`, to impute it: mean, median, mode or level)"
        )


def numeric_labels(table: Table, column: str) -> np.ndarray:
    """A regression table's label texts as float64, refusing a text that is no finite number by file and line."""
    values = np.empty(len(table.ids), dtype=np.float64)
    for r, text in enumerate(table.labels or []):
        try:
            values[r] = float(text)
        except ValueError:
            values[r] = math.nan
        if not math.isfinite(values[r]):
            raise ValueError(
                f"{table.origin(r)}: the label column {column!r} holds {text!r}, not a finite number (task: regression)"
            )
    return values


#: `PartyTables`' task option: what the active party's label column is
TASKS = ("classification", "binary", "multiclass", "regression")
#: more distinct numbers than this in a label read as classes under `task: classification` is refused as a quantity
MAX_NUMERIC_CLASSES = 20


def check_classes(names: list[str], column: str, task: str, path: str) -> None:
    """Refuse classes that do not fit the stated task, and a quantity about to be read as classes.

    Under "classification" a label whose values are all numbers, more than `MAX_NUMERIC_CLASSES` of them or any
    fraction among them, is refused: a rate or an amount read as classes trains a model of hundreds of one-member
    classes (and the stratified split fails in scikit-learn's words); class codes pass with "multiclass".
    """
    where = f"{path}: the label column {column!r}"
    if task == "binary" and len(names) != 2:
        raise ValueError(f"{where} holds {len(names)} classes ({_listed(names)}), but task: binary needs 2")
    if task == "multiclass" and len(names) < 3:
        raise ValueError(f"{where} holds {len(names)} classes ({_listed(names)}), but task: multiclass needs 3 or "
                         "more (task: binary for 2)")  # fmt: skip
    if task != "classification":
        return
    numbers = []
    for name in names:
        try:
            numbers.append(float(name))
        except ValueError:
            return
    if len(numbers) > MAX_NUMERIC_CLASSES or any(math.isfinite(v) and v != int(v) for v in numbers):
        raise ValueError(
            f"{where} holds {len(names)} distinct numbers ({_listed(names)}): a quantity, read as classes, would "
            "train a model of that many classes; set task: regression to predict the number, or task: multiclass "
            "if these are class codes"
        )


def _listed(names: list[str], shown: int = 5) -> str:
    """`a, b, c` (the first `shown`, then how many more)."""
    head = ", ".join(names[:shown])
    return head + (f", ... {len(names) - shown} more" if len(names) > shown else "")
