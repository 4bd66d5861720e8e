"""`PartyTables`: each party's own CSV table with its own business-ID column, aligned by private set intersection.

The way a bank and a retailer hold their data: one table each, rows keyed by a customer ID of their own ordering,
overlapping only in part. Each party's table is read by that party's reader only (`read_table`); the parties then
align their IDs by ECDH-PSI (`lvfl.privacy.psi`), whose messages are metered and reach the protocol's wire as
set-up traffic (`setup_traffic`). The samples are the active party's rows (it holds the labels); the intersection
is what every party holds (`held_by_every_party`): the VFL loaders serve those, the rest exist at the active party
only (the `overlap` machinery: `active_only_set`, the student callbacks).

This increment reads numeric feature columns; a missing value (an empty field, `NA`, `NaN`) or a non-numeric one
is refused naming the file, the column and the line. Labels may be strings (`default` / `ok`): they are coded in
sorted order and `label_names` decodes predictions. IDs are compared by their text (`12` and `"12"` are one ID)
and kept: `business_ids(sample_ids)` gives the business ID of any sample.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lvfl.datamodules.base import VerticalDataModule, party_name
from lvfl.datamodules.partition import ExplicitColumns, Partitioner
from lvfl.privacy.psi import private_intersection
from lvfl.wire import Wire

__all__ = ["PartyTable", "PartyTables", "read_table"]

MISSING = {"", "na", "nan", "null", "none"}  #: field texts read as a missing value (case-insensitive)


@dataclass
class PartyTable:
    """One party's table.

    Args:
        path: a CSV file with a header line.
        id_column: the column of business IDs (unique within the file).
        columns: the feature columns; default: every column but the ID and label columns.
        label_column: the active party's label column (exactly one party names one).
    """

    path: str
    id_column: str
    columns: list[str] | None = None
    label_column: str | None = None


@dataclass
class Table:
    """A table as its party's reader returns it: IDs, features (float32) and, at the active party, label texts."""

    ids: list[str]
    columns: list[str]
    features: np.ndarray
    labels: list[str] | None = field(default=None)


def read_table(source: PartyTable) -> Table:
    """Read one party's CSV (the `csv` module), refusing what cannot be used, naming the file, column and line."""
    path = Path(source.path)
    if not path.is_file():
        raise FileNotFoundError(f"party table {path} does not exist (the `path` of a PartyTables entry)")
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path}: the file is empty; a party table needs a header line")
        header = [h.strip() for h in header]
        named = [source.id_column, *(source.columns or []), *([source.label_column] if source.label_column else [])]
        absent = [c for c in named if c not in header]
        if absent:
            raise ValueError(f"{path}: no column {absent[0]!r} (the file's columns: {header})")
        if source.columns is not None and not source.columns:
            raise ValueError(f"{path}: `columns` is empty; name at least one feature column or leave it out")
        reserved = {source.id_column, source.label_column}
        columns = list(source.columns) if source.columns is not None else [h for h in header if h not in reserved]
        if not columns:
            raise ValueError(f"{path}: no feature columns besides the ID and label columns")
        where = {c: header.index(c) for c in header}
        ids, rows, labels, first_line = [], [], [], {}
        for line, fields in enumerate(reader, start=2):
            if not any(v.strip() for v in fields):
                continue  # a blank line (e.g. at the end of the file)
            if len(fields) != len(header):
                raise ValueError(f"{path}, line {line}: {len(fields)} fields, the header has {len(header)}")
            key = fields[where[source.id_column]].strip()
            if not key:
                raise ValueError(f"{path}, line {line}: the ID column {source.id_column!r} is empty")
            if key in first_line:
                raise ValueError(
                    f"{path}: ID {key!r} occurs twice (lines {first_line[key]} and {line}); IDs must be unique"
                )
            first_line[key] = line
            ids.append(key)
            rows.append([_number(fields[where[c]], path, c, line) for c in columns])
            if source.label_column:
                label = fields[where[source.label_column]].strip()
                if label.lower() in MISSING:
                    raise ValueError(f"{path}, line {line}: the label column {source.label_column!r} is missing")
                labels.append(label)
    if not ids:
        raise ValueError(f"{path}: no rows below the header")
    features = np.asarray(rows, dtype=np.float32).reshape(len(ids), len(columns))
    return Table(ids, columns, features, labels if source.label_column else None)


def _number(text: str, path: Path, column: str, line: int) -> float:
    value = text.strip()
    if value.lower() in MISSING:
        raise ValueError(
            f"{path}, line {line}: column {column!r} is missing a value; PartyTables does not impute yet: fill it in "
            "or leave the column out (`columns`)"
        )
    try:
        number = float(value)
    except ValueError:
        raise ValueError(
            f"{path}, line {line}: column {column!r} holds {value!r}, not a number; PartyTables reads numeric "
            "columns only so far: encode it or leave the column out (`columns`)"
        ) from None
    if not math.isfinite(number):
        raise ValueError(f"{path}, line {line}: column {column!r} holds {value!r}, not a finite number")
    return number


class PartyTables(VerticalDataModule):
    """Every party's own table (`PartyTable`), aligned by private set intersection on their business IDs.

    Args:
        parties: one `PartyTable` per party, in party order; the one at `active_party` names the `label_column`.
        **kwargs: `VerticalDataModule` arguments (`num_parties` is the number of tables; `overlap` must stay 1: the
            tables say which samples every party holds).
    """

    def __init__(self, parties: list[PartyTable], **kwargs: Any) -> None:
        if not parties:
            raise ValueError("PartyTables needs one table per party in `parties`, got none")
        parties = [p if isinstance(p, PartyTable) else PartyTable(**p) for p in parties]
        if "num_parties" in kwargs and kwargs["num_parties"] != len(parties):
            raise ValueError(f"num_parties={kwargs['num_parties']} but `parties` lists {len(parties)} tables")
        kwargs["num_parties"] = len(parties)
        active = kwargs.get("active_party", 0)
        labelled = [k for k, p in enumerate(parties) if p.label_column]
        if labelled != [active]:
            raise ValueError(
                f"exactly the active party's table (party {active}) names a `label_column`; tables naming one: "
                f"{[parties[k].path for k in labelled]}"
            )
        self.tables = parties
        self._alignment_wire = Wire()
        self._ids: list[str] = []
        self._held: np.ndarray | None = None
        self.label_names: list[str] = []
        super().__init__(**kwargs)

    def default_partitioner(self) -> Partitioner:
        """Placeholder until `load` knows each table's width (then the columns follow the tables exactly)."""
        return ExplicitColumns([[k] for k in range(len(self.tables))])

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Read each table, align the IDs by PSI, and lay the features out on the active party's rows."""
        tables = [read_table(source) for source in self.tables]  # each by its own party
        names = [party_name(k) for k in range(len(tables))]
        active = self.active_party
        self._alignment_wire.reset()
        alignment = private_intersection(
            {name: table.ids for name, table in zip(names, tables, strict=True)},
            active=names[active],
            wire=self._alignment_wire,
            seed=self.seed,
        )
        if not alignment.ids:
            raise ValueError(f"the parties' tables share no ID: {[s.path for s in self.tables]}")
        widths = [t.features.shape[1] for t in tables]
        offsets = np.cumsum([0, *widths])
        self.partitioner = ExplicitColumns([list(range(offsets[k], offsets[k + 1])) for k in range(len(tables))])
        rows_active = alignment.rows[names[active]]
        x = np.zeros((len(tables[active].ids), int(offsets[-1])), dtype=np.float32)
        for k, table in enumerate(tables):
            if k == active:
                x[:, offsets[k] : offsets[k + 1]] = table.features
            else:  # a passive party's values exist for the shared IDs only; its other columns are never served
                x[rows_active, offsets[k] : offsets[k + 1]] = table.features[alignment.rows[names[k]]]
        self._held = np.zeros(len(x), dtype=bool)
        self._held[rows_active] = True
        self._ids = tables[active].ids
        self.label_names = sorted(set(tables[active].labels or []))
        code = {name: i for i, name in enumerate(self.label_names)}
        return x, np.asarray([code[label] for label in tables[active].labels or []], dtype=np.int64)

    def held_by_every_party(self, num_rows: int) -> np.ndarray | None:
        """The active party's rows whose IDs every party holds (the PSI's intersection)."""
        return self._held

    def setup_traffic(self) -> dict[str, list] | None:
        """The PSI's messages (tags `psi/...`), for the protocol's wire."""
        self._prepare()
        return self._alignment_wire.state_dict()

    def business_ids(self, sample_ids: torch.Tensor | np.ndarray | list[int]) -> list[str]:
        """The business IDs (as the active party's table writes them) of samples given by their lvfl sample IDs."""
        self._prepare()
        return [self._ids[int(i)] for i in np.asarray(sample_ids).reshape(-1)]
