"""`Adult`: the UCI Adult (census income) dataset, read from its published `adult.data` and `adult.test` files.

48,842 people from the 1994 US census (32,561 in `adult.data`, 16,281 in `adult.test`), 14 features (6 numeric,
8 categorical) and a binary label: income above 50K a year (`>50K` = 1). The files are comma-separated with a space
after each comma, have no header and write a missing value as `?`; `adult.test` opens with a `|1x3 Cross validator`
line and ends its labels with a period (`<=50K.`). Both are read with the standard `csv` module (pandas is not a
dependency of lvfl).

Preprocessing, all from the training file so that nothing of the test file shapes the encoding:

- `?` in a categorical column is kept as its own level `"?"`: in Adult a missing workclass, occupation or native
  country is informative (and common), so no row is dropped. A numeric column has no missing value in the published
  files; one there is refused with an error naming the file, line and column.
- Each categorical feature's levels are those of `adult.data`, sorted, plus a reserved last level `"<unseen>"`:
  a test-file level never seen in training (none in the published files; the other way round,
  `native-country=Holand-Netherlands` appears only in `adult.data`) maps there instead of failing or shifting
  codes. The reserved level is always present, so the column layout depends on the training file only.
- `encoding="onehot"` (default): the numeric columns plus one 0/1 column per level, named `<feature>=<level>`, in
  feature order; `categories()` is None, so every column is standardized and any party model (MLP, logistic
  regression) reads it. `encoding="codes"`: one column per feature, categorical ones holding integer codes
  0..c-1 (kept unscaled) and `categories()` giving the cardinalities c, for `TabularMLP` / `DeepFM` / `WideDeep`
  embeddings.

The published split is kept: `adult.test` is the test split (IDs after `adult.data`'s rows) and the validation
split is `val_fraction` of the training rows.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lvfl.checks import check_int
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.partition import ExplicitColumns, Partitioner
from lvfl.datamodules.splitting import check_split_choice
from lvfl.datamodules.stand_ins import FileBacked, write_adult

__all__ = ["Adult"]

#: (feature, is categorical) in the files' column order; the 15th column is the label
FEATURES: tuple[tuple[str, bool], ...] = (
    ("age", False),
    ("workclass", True),
    ("fnlwgt", False),
    ("education", True),
    ("education-num", False),
    ("marital-status", True),
    ("occupation", True),
    ("relationship", True),
    ("race", True),
    ("sex", True),
    ("capital-gain", False),
    ("capital-loss", False),
    ("hours-per-week", False),
    ("native-country", True),
)
MISSING = "?"  #: how the files write a missing value; a level of its own in categorical columns
UNSEEN = "<unseen>"  #: the reserved level of test-file values never seen in the training file
LABELS = {"<=50K": 0, ">50K": 1}  #: income label -> class (the test file's trailing period removed first)
FILES = ("adult.data", "adult.test")


@dataclass(frozen=True)
class _Table:
    """One file's rows as read: values per feature (strings, stripped) and labels."""

    path: Path
    lines: list[int]  # the file line (1-based) of each row, for error messages
    values: list[list[str]]  # values[row][feature]
    labels: np.ndarray


def _read(path: Path, max_rows: int | None) -> _Table:
    """Parse one published file: skip blank lines and a leading `|...` line, strip labels' trailing period."""
    lines: list[int] = []
    values: list[list[str]] = []
    labels: list[int] = []
    with path.open(newline="", encoding="utf-8") as f:
        for line_no, fields in enumerate(csv.reader(f, skipinitialspace=True), start=1):
            fields = [v.strip() for v in fields]
            if not any(fields) or (line_no == 1 and fields[0].startswith("|")):
                continue
            if max_rows is not None and len(values) == max_rows:
                break
            if len(fields) != len(FEATURES) + 1:
                raise ValueError(
                    f"Adult: {path} line {line_no} has {len(fields)} fields, expected {len(FEATURES) + 1} "
                    f"(14 features and the income label)"
                )
            label = fields[-1].removesuffix(".")
            if label not in LABELS:
                raise ValueError(f"Adult: {path} line {line_no} has label {fields[-1]!r}, expected <=50K or >50K")
            lines.append(line_no)
            values.append(fields[:-1])
            labels.append(LABELS[label])
    return _Table(path, lines, values, np.asarray(labels, dtype=np.int64))


class _FeatureRoundRobin(Partitioner):
    """Adult's default split: feature i (of the 14, in file order) to party i % num_parties, one-hot groups whole.

    Column indices depend on the training file's levels, so they are computed when the datamodule splits (after
    loading) and handed to `ExplicitColumns`, which checks them.
    """

    def __init__(self, datamodule: Adult) -> None:
        self._datamodule = datamodule

    def split(self, num_columns: int, num_parties: int) -> list[list[int]]:
        """Deal the features' column groups round-robin, then check them as `ExplicitColumns`."""
        columns: list[list[int]] = [[] for _ in range(num_parties)]
        for i, (_, cols, _) in enumerate(self._datamodule.feature_groups()):
            columns[i % num_parties] += cols
        return ExplicitColumns(columns).split(num_columns, num_parties)

    def __repr__(self) -> str:
        return "Adult features round-robin (feature i -> party i % num_parties)"


class Adult(VerticalDataModule, FileBacked):
    """UCI Adult census income (32,561 + 16,281 rows, 14 features, binary: income > 50K), from its published files.

    The default partitioner deals the 14 features round-robin in file order (age to party 0, workclass to party 1,
    ...; feature i to party i % num_parties), keeping each one-hot group with one party, so `num_parties` may be
    1..14; a custom `partitioner` overrides this (it then decides the column split itself).

    Args:
        root: the folder that holds `adult.data` and `adult.test` as published.
        encoding: "onehot" (numeric columns plus one 0/1 column per level, all scaled) or "codes" (one integer-code
            column per categorical feature, with `categories()`), see the module docstring.
        max_rows: keep only the first `max_rows` rows of each file (quick runs); None keeps all. The levels then come
            from the kept training rows.
        download: must stay False: there is no downloader for Adult.
        split: "published" keeps `adult.test` as the test split; "random" pools both files' rows and draws the seeded,
            stratified split by `val_fraction` / `test_fraction` (PraVFed Sec. V-A1: a random 80/20 split). The
            levels and their order still come from `adult.data` alone.
        **kwargs: `VerticalDataModule` arguments (`test_fraction` is used only with ``split: random``).
    """

    num_classes = 2
    how_to_get = (
        "download adult.data and adult.test from the UCI Machine Learning Repository's Adult dataset "
        "(https://archive.ics.uci.edu/dataset/2/adult) into that folder"
    )

    def __init__(
        self,
        root: str = "data/adult",
        encoding: Literal["onehot", "codes"] = "onehot",
        max_rows: int | None = None,
        download: bool = False,
        split: Literal["published", "random"] = "published",
        **kwargs: Any,
    ) -> None:
        self.split = check_split_choice(split, "Adult")
        if download:
            raise ValueError("Adult cannot download (there is no torchvision downloader for it): set download: false")
        if encoding not in ("onehot", "codes"):
            raise ValueError(f"Adult: encoding must be 'onehot' or 'codes', got {encoding!r}")
        if max_rows is not None:
            check_int(max_rows, "max_rows", 1, why="rows kept from each file")
        num_parties = kwargs.get("num_parties", 4)
        if kwargs.get("partitioner") is None and (not isinstance(num_parties, int) or not 1 <= num_parties <= 14):
            raise ValueError(
                f"Adult's default partitioner gives each of its {len(FEATURES)} features whole to one party, so "
                f"num_parties must be in 1..{len(FEATURES)}, got {num_parties!r}"
            )
        self.root = str(root)
        self.encoding = encoding
        self.max_rows = max_rows
        self.download = False
        self._tables: tuple[_Table, _Table] | None = None
        self._num_train = 0
        super().__init__(**kwargs)

    # ------------------------------------------------------------------------------------------------ files
    @classmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """Random `adult.data` and `adult.test` of `rows` rows each, with `?` entries and the test file's quirks."""
        write_adult(Path(root), FEATURES, rows, rows, seed)

    def expected_files(self) -> list[Path]:
        """`adult.data` and `adult.test` under `root`."""
        return [Path(self.root) / name for name in FILES]

    def check_files(self) -> None:
        """Raise FileNotFoundError naming the missing files, the `root` option and how to get them."""
        missing = [p for p in self.expected_files() if not p.exists()]
        if missing:
            listed = " and ".join(str(p) for p in missing)
            raise FileNotFoundError(f"Adult: expected {listed} under root={self.root!r}; {self.how_to_get}")

    def _read_files(self) -> tuple[_Table, _Table]:
        """Both files parsed once (cached: `feature_names` and `load` share them)."""
        if self._tables is None:
            self.check_files()
            train_path, test_path = self.expected_files()
            self._tables = (_read(train_path, self.max_rows), _read(test_path, self.max_rows))
        return self._tables

    # ------------------------------------------------------------------------------------------------ columns
    def levels(self) -> dict[str, list[str]]:
        """Each categorical feature's levels: the training file's, sorted, then the reserved `"<unseen>"`."""
        train, _ = self._read_files()
        return {
            name: sorted({row[i] for row in train.values}) + [UNSEEN]
            for i, (name, categorical) in enumerate(FEATURES)
            if categorical
        }

    def feature_groups(self) -> list[tuple[str, list[int], list[str]]]:
        """(feature, its column indices, its column names) for the 14 features, in column order."""
        levels = self.levels()
        out = []
        col = 0
        for name, categorical in FEATURES:
            if categorical and self.encoding == "onehot":
                names = [f"{name}={level}" for level in levels[name]]
            else:
                names = [name]
            out.append((name, list(range(col, col + len(names))), names))
            col += len(names)
        return out

    @property
    def feature_names(self) -> list[str]:
        """The name of every column, in column order (one-hot columns as `<feature>=<level>`); reads the files."""
        return [n for _, _, names in self.feature_groups() for n in names]

    @property
    def column_kinds(self) -> list[str]:
        """The kind of every column: "numeric", or "categorical" for a one-hot or code column; reads the files."""
        categorical = dict(FEATURES)
        return [
            "categorical" if categorical[feature] else "numeric"
            for feature, cols, _ in self.feature_groups()
            for _ in cols
        ]

    def categories(self, num_columns: int) -> list[int] | None:
        """None for one-hot (all columns numeric); with codes, each categorical feature's level count."""
        if self.encoding == "onehot":
            return None
        levels = self.levels()
        return [len(levels[name]) if categorical else 0 for name, categorical in FEATURES]

    def default_partitioner(self) -> Partitioner:
        """Feature i (with its whole one-hot group) to party i % num_parties."""
        return _FeatureRoundRobin(self)

    # ------------------------------------------------------------------------------------------------ data
    def _encode(self, table: _Table, levels: dict[str, list[str]]) -> np.ndarray:
        """One file's rows as float32 columns in `feature_names` order."""
        blocks = []
        for i, (name, categorical) in enumerate(FEATURES):
            column = [row[i] for row in table.values]
            if categorical:
                index = {level: code for code, level in enumerate(levels[name])}
                unseen = index[UNSEEN]
                codes = np.asarray([index.get(v, unseen) for v in column], dtype=np.int64)
                if self.encoding == "onehot":
                    blocks.append(np.eye(len(index), dtype=np.float32)[codes])
                else:
                    blocks.append(codes[:, None].astype(np.float32))
            else:
                blocks.append(self._numeric(table, i, name, column)[:, None])
        return np.concatenate(blocks, axis=1)

    @staticmethod
    def _numeric(table: _Table, i: int, name: str, column: list[str]) -> np.ndarray:
        """A numeric column as float32, refusing a missing or unparsable value with its file, line and column."""
        out = np.empty(len(column), dtype=np.float32)
        for row, value in enumerate(column):
            try:
                if value == MISSING:
                    raise ValueError
                out[row] = float(value)
            except ValueError:
                raise ValueError(
                    f"Adult: {table.path} line {table.lines[row]}: numeric column {name!r} (field {i + 1}) holds "
                    f"{value!r}; Adult's numeric columns have no missing values, so the file is not the published one"
                ) from None
        return out

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """`adult.data`'s rows then `adult.test`'s (IDs 0..N_train-1 are training rows), and the income labels."""
        train, test = self._read_files()
        levels = self.levels()
        self._num_train = len(train.values)
        x = np.concatenate([self._encode(train, levels), self._encode(test, levels)])
        return x, np.concatenate([train.labels, test.labels])

    def fixed_splits(self, num_rows: int) -> dict[str, np.ndarray] | None:
        """The published test split: the `adult.test` rows, after the training rows (None with ``split: random``)."""
        if self.split == "random":
            return None
        return {"test": np.arange(self._num_train, num_rows, dtype=np.int64)}
