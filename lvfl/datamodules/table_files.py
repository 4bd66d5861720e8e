"""Reading a party's own table: CSV (the `csv` module) or Parquet (pyarrow), one file or a directory of them.

Each party's table is read by that party's reader only. What cannot be used is refused naming the file, the column
and the line (Parquet: the row); `PartyTable` is the config entry that says where a table is and what its columns are.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MISSING", "POLICIES", "SUFFIXES", "PartyTable", "Table", "read_table"]

SUFFIXES = (".csv", ".parquet")  #: the table formats (a directory holds files of one of them)
MISSING = {"", "na", "nan", "null", "none"}  #: field texts read as a missing value (case-insensitive)
POLICIES = ("refuse", "mean", "median", "mode", "level")  #: the `missing` options (see `PartyTable`)


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
