"""`PartyTables`: each party's own table (CSV or Parquet) with its own business-ID column, aligned by PSI.

The way a bank and a retailer hold their data: one table each, rows keyed by a customer ID of their own ordering,
overlapping only in part. Each party's table is read by that party's reader only (`read_table`); the parties then
align their IDs by ECDH-PSI (`lvfl.privacy.psi`), whose messages are metered and reach the protocol's wire as
set-up traffic (`setup_messages`). The samples are the active party's rows (it holds the labels); the intersection
is what every party holds (`held_by_every_party`): the VFL loaders serve those, the rest exist at the active party
only (the `overlap` machinery: `active_only_set`, the student callbacks).

Encoding, per party and fitted on the training rows only (the split is drawn first, over the active party's rows):

- a column is numeric when every training value parses as a number, categorical when none does or when it is
  named in `categorical` (a column of numbers with a stray text is refused by line, not silently made
  categorical); categorical levels are the training rows' (sorted), plus a reserved `<unseen>` level that values
  first seen outside the training rows map to; `encoding: onehot` gives one 0/1 column per level
  (`<column>=<level>`), `encoding: codes` one integer-code column with `categories()` for embedding tables;
- a missing value (an empty field, `NA`, `NaN`, `null`) follows the table's `missing` policy, or the column's own in
  `missing_columns`: `refuse` (the default) names the file, the column and the line; `mean` / `median` / `mode`
  fill a numeric column with that statistic of its training values, `mode` a categorical one with its most
  frequent training level, and, when the training rows miss any, add a 0/1 column `<column> missing`; `level`
  (and a table-wide `mean` / `median`) gives categorical columns a `<missing>` level. A policy that does not fit the
  column (the mean of a category) is refused. A value that is not a number in a numeric column is refused by line.

Labels may be strings (`default` / `ok`): they are coded in sorted order and `label_names` decodes predictions.
With `task: regression` the label column holds numbers (a value that is not one, or a missing one, is refused by
line), standardized with the training rows' mean and standard deviation and predicted in its own units. IDs
are compared by their text (`12` and `"12"` are one ID) and kept: `business_ids(sample_ids)` gives the business ID
of any sample. `feature_names` lists every party's encoded columns.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import SequentialSampler

from lvfl.datamodules.base import VerticalDataModule, VerticalTensorDataset, party_name
from lvfl.datamodules.partition import ExplicitColumns, Partitioner
from lvfl.privacy.psi import private_intersection
from lvfl.wire import Wire

__all__ = ["PartyTable", "PartyTables", "read_table"]

SUFFIXES = (".csv", ".parquet")  #: the table formats (a directory holds files of one of them)
MISSING = {"", "na", "nan", "null", "none"}  #: field texts read as a missing value (case-insensitive)
POLICIES = ("refuse", "mean", "median", "mode", "level")  #: the `missing` options (see `PartyTable`)
MISSING_LEVEL = "<missing>"  #: the level of a missing categorical value (when `missing` is not refuse)
UNSEEN = "<unseen>"  #: the reserved level of values not seen in the training rows


@dataclass
class PartyTable:
    """One party's table.

    Args:
        path: a CSV file with a header line.
        id_column: the column of business IDs (unique within the file).
        columns: the feature columns; default: every column but the ID and label columns.
        label_column: the active party's label column (exactly one party names one).
        categorical: columns to encode as categories even where every value is a number (postcodes, codes).
        missing: the table's policy for a missing feature value: "refuse" (an error naming it), "mean" or "median"
            (impute numeric columns from the training rows, with an indicator column; categorical ones get a
            `<missing>` level), "mode" (the most frequent training value or level, with an indicator column), or
            "level" (categorical columns only: a `<missing>` level).
        missing_columns: per-column policies that override `missing` (e.g. `{income: median, segment: mode}`).
    """

    path: str
    id_column: str
    columns: list[str] | None = None
    label_column: str | None = None
    categorical: list[str] = field(default_factory=list)
    missing: str = "refuse"
    missing_columns: dict[str, str] = field(default_factory=dict)


@dataclass
class Table:
    """A table as its party's reader returns it: IDs, the feature columns' texts, their origins, label texts."""

    path: Path
    ids: list[str]
    columns: list[str]
    values: list[list[str]]  # values[row][column], stripped
    origins: list[str]  # where each row is ("file, line N"), for messages
    labels: list[str] | None = field(default=None)


def _files(path: Path) -> list[Path]:
    """The files of a table: the file itself, or a directory's `*.csv` or `*.parquet` files in name order."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"party table {path} does not exist (the `path` of a PartyTables entry)")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
    kinds = {p.suffix.lower() for p in files}
    if not files:
        raise FileNotFoundError(f"party table {path} is a directory without .csv or .parquet files")
    if len(kinds) > 1:
        raise ValueError(f"party table {path} mixes .csv and .parquet files; keep one format per table")
    return files


def _records(path: Path) -> tuple[list[str], Iterator[tuple[str, list[str]]]]:
    """A file's header and its rows as texts, each with where it is (`file, line N` or `file, row N`)."""
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ImportError(f"{path}: reading Parquet needs pyarrow: pip install 'lvfl[parquet]'") from err
        data = pq.read_table(path).to_pydict()
        header = list(data)
        texts = {c: ["" if v is None else str(v) for v in data[c]] for c in header}
        n = len(next(iter(texts.values()), []))
        return header, ((f"{path}, row {i + 1}", [texts[c][i] for c in header]) for i in range(n))
    f = path.open(newline="")
    reader = csv.reader(f)
    header = next(reader, None)
    if not header:
        f.close()
        raise ValueError(f"{path}: the file is empty; a party table needs a header line")

    def rows() -> Iterator[tuple[str, list[str]]]:
        with f:
            for line, fields in enumerate(reader, start=2):
                yield f"{path}, line {line}", fields

    return [h.strip() for h in header], rows()


def read_table(source: PartyTable) -> Table:
    """Read one party's table: CSV (the `csv` module) or Parquet (pyarrow), a file or a directory of them.

    What cannot be used is refused naming the file, the column and the line (Parquet: the row).
    """
    path = Path(source.path)
    files = _files(path)
    header: list[str] | None = None
    ids, rows, labels, origins, first = [], [], [], [], {}
    for file in files:
        own_header, records = _records(file)
        if header is None:
            header = own_header
            named = [source.id_column, *(source.columns or []), *([source.label_column] if source.label_column else [])]
            absent = [c for c in named if c not in header]
            if absent:
                raise ValueError(f"{file}: no column {absent[0]!r} (the file's columns: {header})")
            if source.columns is not None and not source.columns:
                raise ValueError(f"{path}: `columns` is empty; name at least one feature column or leave it out")
            reserved = {source.id_column, source.label_column}
            columns = list(source.columns) if source.columns is not None else [h for h in header if h not in reserved]
            if not columns:
                raise ValueError(f"{path}: no feature columns besides the ID and label columns")
            unknown = [c for c in source.categorical if c not in columns]
            if unknown:
                raise ValueError(f"{path}: `categorical` names {unknown[0]!r}, which is not one of the feature columns")
            for column, policy in [("", source.missing), *source.missing_columns.items()]:
                if column and column not in columns:
                    raise ValueError(f"{path}: `missing_columns` names {column!r}, which is not a feature column")
                if policy not in POLICIES:
                    what = f"`missing_columns[{column!r}]`" if column else "`missing`"
                    raise ValueError(f"{path}: {what} must be one of {list(POLICIES)}, got {policy!r}")
            where = {c: header.index(c) for c in header}
        elif own_header != header:
            raise ValueError(f"{file}: its columns {own_header} differ from {files[0]}'s {header}")
        for origin, fields in records:
            if not any(v.strip() for v in fields):
                continue  # a blank line (e.g. at the end of the file)
            if len(fields) != len(header):
                raise ValueError(f"{origin}: {len(fields)} fields, the header has {len(header)}")
            key = fields[where[source.id_column]].strip()
            if not key:
                raise ValueError(f"{origin}: the ID column {source.id_column!r} is empty")
            if key in first:
                raise ValueError(f"{origin}: ID {key!r} occurs twice (first at {first[key]}); IDs must be unique")
            first[key] = origin
            ids.append(key)
            origins.append(origin)
            rows.append([fields[where[c]].strip() for c in columns])
            if source.label_column:
                label = fields[where[source.label_column]].strip()
                if label.lower() in MISSING:
                    raise ValueError(f"{origin}: the label column {source.label_column!r} is missing")
                labels.append(label)
    if not ids:
        raise ValueError(f"{path}: no rows below the header")
    return Table(path, ids, columns, rows, origins, labels if source.label_column else None)


def _number(text: str) -> float | None:
    """The finite number a field holds, None if it holds no number."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


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
        """(rows, len(output_names)) float32 for the column's texts (`origins`: where each is, for messages)."""
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
                value = _number(text)
                if value is None:
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


def fit_encoders(table: Table, source: PartyTable, train: np.ndarray, onehot: bool) -> list[ColumnEncoder]:
    """Each column's encoder from the table's training rows `train` only (see the module docstring)."""
    encoders = []
    for j, name in enumerate(table.columns):
        texts = [table.values[r][j] for r in train]
        present = [t for t in texts if t.lower() not in MISSING]
        parsed = [_number(t) is not None for t in present]
        if name not in source.categorical and any(parsed) and not all(parsed):  # a typo must not turn it categorical
            odd_is_text = sum(parsed) >= len(parsed) / 2  # name the value of the minority kind
            i = next(
                r
                for r, t in zip(train, texts, strict=True)
                if t.lower() not in MISSING and (_number(t) is None) == odd_is_text
            )
            kind = "not a number, while its other values are numbers" if odd_is_text else "a number among text values"
            raise ValueError(
                f"{table.origins[i]}: column {name!r} holds {table.values[i][j]!r}, {kind}; fix the "
                "value, or list the column in `categorical` (levels may look like numbers)"
            )
        policy = source.missing_columns.get(name, source.missing)
        explicit = name in source.missing_columns
        gaps = len(present) < len(texts)  # the training rows miss a value: an indicator column says where
        if policy != "refuse" and not present:
            raise ValueError(f"{table.path}: column {name!r} has no value in the training rows to impute from")
        if name not in source.categorical and all(parsed):
            if policy == "level" and explicit:
                raise ValueError(
                    f"{table.path}: column {name!r} is numeric; missing 'level' is for categorical columns"
                )
            values = np.asarray([_number(t) for t in present], dtype=np.float64)
            fill = None
            if policy in ("mean", "median", "level"):  # a table-wide `level` leaves numeric columns to the mean
                fill = float(np.median(values) if policy == "median" else np.mean(values))
            elif policy == "mode":
                numbers, counts = np.unique(values, return_counts=True)
                fill = float(numbers[np.argmax(counts)])  # the smallest of the most frequent values
            encoders.append(ColumnEncoder(name, "numeric", fill=fill, indicator=fill is not None and gaps))
        else:
            if policy in ("mean", "median") and explicit:
                raise ValueError(
                    f"{table.path}: column {name!r} is categorical; its missing policy can be mode or level"
                )
            levels = sorted(set(present))
            fill_level = None
            if policy == "mode":
                counts = {level: present.count(level) for level in levels}
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
    return encoders


def _numeric_labels(table: Table, column: str) -> np.ndarray:
    """A regression table's label texts as float64, refusing a text that is no finite number by file and line."""
    values = np.empty(len(table.ids), dtype=np.float64)
    for r, text in enumerate(table.labels or []):
        try:
            values[r] = float(text)
        except ValueError:
            values[r] = math.nan
        if not math.isfinite(values[r]):
            raise ValueError(
                f"{table.origins[r]}: the label column {column!r} holds {text!r}, not a finite number "
                "(task: regression)"
            )
    return values


class PartyTables(VerticalDataModule):
    """Every party's own table (`PartyTable`), aligned by private set intersection on their business IDs.

    Args:
        parties: one `PartyTable` per party, in party order; the one at `active_party` names the `label_column`.
        encoding: categorical columns as "onehot" 0/1 columns (any party model) or "codes" (one integer column
            each, with `categories()`, for `TabularMLP` / `DeepFM` / `WideDeep`).
        num_parties: the number of tables (None: taken from `parties`; another number is refused).
        task: "classification" (labels are classes, any text) or "regression" (labels are real numbers).
        new_rows: for `lvfl predict`: one table of new rows per party (the same columns as its training table, no
            label column), aligned by a PSI of their own (tags `psi_new/...`) and encoded and scaled with what each
            party fitted on its training rows; the rows every party holds are predicted by the VFL model, the
            active party's others by the student when the run saved one (`new_rows_active_only`).
        **kwargs: `VerticalDataModule` arguments (`num_parties` is the number of tables; `overlap` must stay 1: the
            tables say which samples every party holds).
    """

    def __init__(
        self,
        parties: list[PartyTable],
        encoding: str = "onehot",
        num_parties: int | None = None,
        new_rows: list[PartyTable] | None = None,
        task: str = "classification",
        **kwargs: Any,
    ) -> None:
        if task not in ("classification", "regression"):
            raise ValueError(f"PartyTables: task must be 'classification' or 'regression', got task={task!r}")
        self.regression = task == "regression"
        if not parties:
            raise ValueError("PartyTables needs one table per party in `parties`, got none")
        parties = [p if isinstance(p, PartyTable) else PartyTable(**p) for p in parties]
        if num_parties is not None and num_parties != len(parties):
            raise ValueError(f"num_parties={num_parties} but `parties` lists {len(parties)} tables")
        if encoding not in ("onehot", "codes"):
            raise ValueError(f"PartyTables: encoding must be 'onehot' or 'codes', got {encoding!r}")
        kwargs["num_parties"] = len(parties)
        active = kwargs.get("active_party", 0)
        labelled = [k for k, p in enumerate(parties) if p.label_column]
        if labelled != [active]:
            raise ValueError(
                f"exactly the active party's table (party {active}) names a `label_column`; tables naming one: "
                f"{[parties[k].path for k in labelled]}"
            )
        new_rows = None if new_rows is None else [p if isinstance(p, PartyTable) else PartyTable(**p) for p in new_rows]
        if new_rows is not None and len(new_rows) != len(parties):
            raise ValueError(f"`new_rows` lists {len(new_rows)} tables for {len(parties)} parties: give one per party")
        if new_rows is not None and any(t.label_column for t in new_rows):
            raise ValueError("`new_rows` tables are what lvfl predict answers: they name no `label_column`")
        self.tables = parties
        self.new_row_tables = new_rows
        self._new: tuple[VerticalTensorDataset, list[str], torch.Tensor] | None = None
        self._new_keys: list[str] = []
        self.encoding = encoding
        self._messages: list[tuple[str, str, Any, str]] = []
        self._ids: list[str] = []
        self._held: np.ndarray | None = None
        self._splits: dict[str, np.ndarray] | None = None
        self._categories: list[int] | None = None
        self.encoders: dict[str, list[ColumnEncoder]] = {}
        self.label_names: list[str] = []
        #: the wall time of the training rows' PSI (both sides, in this process), once loaded
        self.psi_seconds: float | None = None
        super().__init__(**kwargs)

    def default_partitioner(self) -> Partitioner:
        """Placeholder until `load` knows each table's encoded width (then the columns follow the tables exactly)."""
        return ExplicitColumns([[k] for k in range(len(self.tables))])

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Read each table, align the IDs by PSI, split, fit each party's encoders on its training rows, lay out."""
        tables = [read_table(source) for source in self.tables]  # each by its own party
        names = [party_name(k) for k in range(len(tables))]
        active = self.active_party
        wire = Wire()
        started = time.perf_counter()
        with wire.recording() as held:  # sent for real by the protocol, on its wire (`setup_messages`)
            alignment = private_intersection(
                {name: table.ids for name, table in zip(names, tables, strict=True)},
                active=names[active],
                wire=wire,
                seed=self.seed,
            )
        self._messages = [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        self.psi_seconds = time.perf_counter() - started  # `lvfl fit --twin` reports it
        if not alignment.ids:
            raise ValueError(f"the parties' tables share no ID: {[s.path for s in self.tables]}")
        if self.regression:
            y = _numeric_labels(tables[active], self.tables[active].label_column or "")
        else:
            self.label_names = sorted(set(tables[active].labels or []))
            code = {name: i for i, name in enumerate(self.label_names)}
            y = np.asarray([code[label] for label in tables[active].labels or []], dtype=np.int64)
        self._splits = None
        self._splits = self._split(len(y), self.stratify_key(y))  # drawn first: the encoders see training rows only
        num_rows = len(y)
        train = np.zeros(num_rows, dtype=bool)
        train[self._splits["train"]] = True

        rows_active = alignment.rows[names[active]]
        blocks, cats = [], []
        for k, (table, source) in enumerate(zip(tables, self.tables, strict=True)):
            own = np.arange(num_rows) if k == active else alignment.rows[names[k]]  # this party's row of each
            at = np.arange(num_rows) if k == active else rows_active  # ... and the sample it belongs to
            fit_rows = own[train[at]]
            encoders = fit_encoders(table, source, fit_rows, onehot=self.encoding == "onehot")
            self.encoders[names[k]] = encoders
            origins = [table.origins[r] for r in own]
            block = np.zeros((num_rows, sum(len(e.output_names) for e in encoders)), dtype=np.float32)
            parts = [e.encode([table.values[r][j] for r in own], origins) for j, e in enumerate(encoders)]
            block[at] = np.concatenate(parts, axis=1)  # a passive party's other rows are never served
            blocks.append(block)
            cats += [c for e in encoders for c in e.cardinalities]
        widths = np.cumsum([0, *(b.shape[1] for b in blocks)])
        self.partitioner = ExplicitColumns([list(range(widths[k], widths[k + 1])) for k in range(len(blocks))])
        self._categories = cats if any(cats) else None
        self._held = np.zeros(num_rows, dtype=bool)
        self._held[rows_active] = True
        self._ids = tables[active].ids
        return np.concatenate(blocks, axis=1), y

    def setup(self, stage: str | None = None) -> None:
        """Load (once); for `lvfl predict` with `new_rows`, also align and encode the new rows (once)."""
        super().setup(stage)
        if stage == "predict" and self.new_row_tables is not None and self._new is None:
            self._new = self._load_new_rows()

    def _load_new_rows(self) -> tuple[VerticalTensorDataset, list[str], torch.Tensor]:
        """The new rows, encoded and scaled as each party's training rows were, aligned by their own PSI.

        Returns (the new rows every party holds, as a dataset; the business IDs of the new rows only the active
        party holds; those rows' active-party features).
        """
        tables = [read_table(source) for source in self.new_row_tables or []]
        names = [party_name(k) for k in range(len(tables))]
        for name, table in zip(names, tables, strict=True):
            trained = [e.name for e in self.encoders[name]]
            if table.columns != trained:
                raise ValueError(f"{table.path}: columns {table.columns}, but {name} was trained on {trained}")
        active = names[self.active_party]
        wire = Wire()
        with wire.recording() as held:
            alignment = private_intersection(
                {n: t.ids for n, t in zip(names, tables, strict=True)},
                active=active,
                wire=wire,
                tag="psi_new",
                seed=self.seed,
            )
        self._messages += [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        features = {}
        for name, table in zip(names, tables, strict=True):
            rows = np.arange(len(table.ids)) if name == active else alignment.rows[name]
            origins = [table.origins[r] for r in rows]
            parts = [e.encode([table.values[r][j] for r in rows], origins) for j, e in enumerate(self.encoders[name])]
            features[name] = self._scale(name, np.concatenate(parts, axis=1))
        first = len(self._ids)
        self._ids = [*self._ids, *tables[self.active_party].ids]  # new sample IDs follow the training ones
        shared = alignment.rows[active]
        only = np.setdiff1d(np.arange(len(tables[self.active_party].ids)), shared)
        vfl = VerticalTensorDataset(
            ids=torch.as_tensor(first + shared, dtype=torch.int64),
            features={n: torch.from_numpy(features[n][shared] if n == active else features[n]) for n in names},
            labels=torch.zeros(len(shared), dtype=torch.int64),  # unknown: predict_step does not read them
        )
        only_keys = [tables[self.active_party].ids[r] for r in only]
        self._new_keys = list(tables[self.active_party].ids)
        return vfl, only_keys, torch.from_numpy(features[active][only])

    def _scale(self, party: str, x: np.ndarray) -> np.ndarray:
        """`x` standardized with what `party` fitted on its training rows (`scaling`), as float32."""
        fitted = self.scaling.get(party)
        x = x.astype(np.float64)
        if fitted is not None:
            columns = list(range(x.shape[1])) if fitted["columns"] == "all" else fitted["columns"]
            x[:, columns] = (x[:, columns] - np.asarray(fitted["mean"])) / np.asarray(fitted["scale"])
        return np.ascontiguousarray(x, dtype=np.float32)

    def predict_dataloader(self) -> Any:
        """The new rows every party holds (with `new_rows`), else the base class's (test split or `predict_ids`)."""
        if self._new is None or self.predict_ids is not None:
            return super().predict_dataloader()
        dataset = self._new[0]
        return self._loader(dataset, SequentialSampler(dataset))

    def new_rows_active_only(self) -> tuple[list[str], torch.Tensor] | None:
        """With `new_rows`: the business IDs of the new rows only the active party holds, and its features of them."""
        return None if self._new is None else (self._new[1], self._new[2])

    def new_row_ids(self) -> list[str] | None:
        """With `new_rows`: every new row's business ID, in the active party's table order."""
        return None if self._new is None else list(self._new_keys)

    def fixed_splits(self, num_rows: int) -> dict[str, np.ndarray] | None:
        """The split `load` drew before fitting the encoders (so that the base class keeps exactly it)."""
        return None if self._splits is None else {"val": self._splits["val"], "test": self._splits["test"]}

    def categories(self, num_columns: int) -> list[int] | None:
        """With `encoding: codes`, the cardinality of each categorical column (0 for numeric ones)."""
        return self._categories

    @property
    def feature_names(self) -> dict[str, list[str]]:
        """Every party's encoded column names, in its column order."""
        self._prepare()
        return {party: [n for e in encoders for n in e.output_names] for party, encoders in self.encoders.items()}

    def held_by_every_party(self, num_rows: int) -> np.ndarray | None:
        """The active party's rows whose IDs every party holds (the PSI's intersection)."""
        return self._held

    def setup_messages(self) -> list[tuple[str, str, Any, str]]:
        """The PSI's messages (tags `psi/...`), held back for the protocol to send on its wire."""
        self._prepare()
        return list(self._messages)

    def sample_ids_for(self, keys: Sequence[str]) -> list[int]:
        """The sample IDs of business IDs (as the active party's table writes them).

        Raises:
            KeyError: business IDs that are not in the active party's table (listed).
        """
        self._prepare()
        row = {key: i for i, key in enumerate(self._ids)}
        unknown = [k for k in keys if k not in row]
        if unknown:
            raise KeyError(
                f"IDs {unknown[:10]} are not in the active party's table ({self.tables[self.active_party].path})"
            )
        return [row[k] for k in keys]

    def business_ids(self, sample_ids: torch.Tensor | np.ndarray | list[int]) -> list[str]:
        """The business IDs (as the active party's table writes them) of samples given by their lvfl sample IDs."""
        self._prepare()
        return [self._ids[int(i)] for i in np.asarray(sample_ids).reshape(-1)]
