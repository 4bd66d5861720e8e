"""`PartyTables`: each party's own table (CSV or Parquet) with its own business-ID column, aligned by PSI.

The way a bank and a retailer hold their data: one table each, rows keyed by a customer ID of their own ordering,
overlapping only in part. Each party's table is read by that party's reader only (`read_table`); the parties then
align their IDs by ECDH-PSI (`lvfl.privacy.psi`), whose messages are metered and reach the protocol's wire as
set-up traffic (`setup_messages`). The samples are the active party's rows (it holds the labels); the intersection
is what every party holds (`held_by_every_party`): the VFL loaders serve those, the rest exist at the active party
only (the `overlap` machinery: `active_only_set`, the student callbacks).

The split is drawn first, by the active party, over its own rows in an order keyed by their IDs (not their place in
its file), stratified on the labels unless the split must be label-free (`stratify`, a label mechanism); each
passive party learns its rows of each split from the active party's `split` message (`lvfl.datamodules.split`) and
fits on those. The PSI's passive shuffle is keyed from the OS, never from the config's public seed.

Encoding, per party and fitted on the training rows only:

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

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import SequentialSampler

from lvfl.datamodules.base import VerticalDataModule, VerticalTensorDataset, party_name
from lvfl.datamodules.partition import ExplicitColumns, Partitioner
from lvfl.datamodules.split import decode_split, encode_split, keyed_order
from lvfl.datamodules.table_encoding import ColumnEncoder, fit_encoders, numeric_labels
from lvfl.datamodules.table_files import PartyTable, read_table
from lvfl.privacy.psi import private_intersection
from lvfl.runs import digest_array, digest_json
from lvfl.wire import Wire

__all__ = ["PartyTable", "PartyTables", "read_table"]


class PartyTables(VerticalDataModule):
    """Every party's own table (`PartyTable`), aligned by private set intersection on their business IDs.

    Args:
        parties: one `PartyTable` per party, in party order; the one at `active_party` names the `label_column`.
        encoding: categorical columns as "onehot" 0/1 columns (any party model) or "codes" (one integer column
            each, with `categories()`, for `TabularMLP` / `DeepFM` / `WideDeep`). Not the per-table
            `PartyTable.encoding`, which is a CSV file's text encoding (utf-8, latin-1, ...); with onehot, each
            table's `max_levels` caps a column's levels.
        num_parties: the number of tables (None: taken from `parties`; another number is refused).
        task: "classification" (labels are classes, any text) or "regression" (labels are real numbers).
        new_rows: for `lvfl predict`: one table of new rows per party (the same columns as its training table, no
            label column), aligned by a PSI of their own (tags `psi_new/...`) and encoded and scaled with what each
            party fitted on its training rows; the rows every party holds are predicted by the VFL model, the
            active party's others by the student when the run saved one (`new_rows_active_only`).
        **kwargs: `VerticalDataModule` arguments (`num_parties` is the number of tables; `overlap` must stay 1: the
            tables say which samples every party holds).
    """

    rows_are_public = False  # the samples are the active party's own rows: its split is sent, never recomputed

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
        self._held_order: np.ndarray = np.zeros(0, dtype=np.int64)
        #: the PSI's counts (`setup_metrics`): `<party>/ids`, `<party>/shared_with_active`, `intersection`
        self.psi_counts: dict[str, int] = {}
        self._table_digests: dict[str, dict[str, Any]] = {}  # per party: its IDs' and columns' digests (`load`)
        self._content: dict[str, Any] | None = None
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
            )
        self._messages = [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        self.psi_seconds = time.perf_counter() - started  # `lvfl fit --twin` reports it
        if not alignment.ids:
            raise ValueError(f"the parties' tables share no ID: {[s.path for s in self.tables]}")
        if self.regression:
            y = numeric_labels(tables[active], self.tables[active].label_column or "")
        else:
            self.label_names = sorted(set(tables[active].labels or []))
            code = {name: i for i, name in enumerate(self.label_names)}
            y = np.asarray([code[label] for label in tables[active].labels or []], dtype=np.int64)
        self._splits = None
        # drawn first (the encoders see training rows only), over the active party's rows in an order keyed by their
        # IDs (`keyed_order`), so that the split does not depend on the order of the rows in its file
        self._splits = self._split(len(y), self.split_key(y), order=keyed_order(tables[active].ids, self.seed))
        num_rows = len(y)
        rows_active = alignment.rows[names[active]]
        self._held_order = rows_active
        # what each passive party learns of the split: the message the active party sends it (`setup_messages`)
        shared = {split: np.intersect1d(rows, rows_active) for split, rows in self._splits.items()}
        received = decode_split(encode_split(shared, rows_active), rows_active)
        train_shared = np.isin(rows_active, received["train"])

        blocks, cats = [], []
        for k, (table, source) in enumerate(zip(tables, self.tables, strict=True)):
            own = np.arange(num_rows) if k == active else alignment.rows[names[k]]  # this party's row of each
            at = np.arange(num_rows) if k == active else rows_active  # ... and the sample it belongs to
            fit_rows = np.sort(self._splits["train"]) if k == active else own[train_shared]
            encoders = fit_encoders(table, source, fit_rows, onehot=self.encoding == "onehot")
            self.encoders[names[k]] = encoders
            self._table_digests[names[k]] = {"ids": digest_json(table.ids), "columns": list(table.columns)}
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
        self._table_digests[names[active]]["labels"] = digest_array(y)
        self._content = None
        self.psi_counts = {**{f"{n}/ids": alignment.sizes[n] for n in names}, "intersection": len(alignment.ids)}
        self.psi_counts |= {f"{n}/shared_with_active": alignment.pairwise[n] for n in names if n in alignment.pairwise}
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

    def alignment_messages(self) -> list[tuple[str, str, Any, str]]:
        """The PSI's messages (tags `psi/...`), held back for the protocol to send on its wire."""
        self._prepare()
        return list(self._messages)

    def shared_order(self, shared: np.ndarray) -> np.ndarray:
        """The samples every party holds in the PSI's agreed order (by ID text): how passive parties know them."""
        return np.asarray(self._held_order, dtype=np.int64)

    def content_digest(self) -> dict[str, Any]:
        """Per party: digests of its table's IDs, its columns, fitted encoders and scaling, and encoded features.

        Recorded in every checkpoint's run fingerprint (`lvfl.runs.data_fingerprint`), so that `lvfl test`,
        `predict` and `export` refuse a checkpoint fitted on other tables under the same paths (renamed IDs, changed
        features, other labels), not only on other settings.
        """
        prepared = self._prepare()
        if self._content is None:
            content: dict[str, Any] = {}
            for name, digests in self._table_digests.items():
                entry = dict(digests)
                entry["encoders"] = digest_json([dataclasses.asdict(e) for e in self.encoders[name]])
                entry["scaling"] = digest_json(self.scaling.get(name))
                views = prepared.active_splits if name == self.active_party_name else prepared.splits
                parts = [views[split].stored[name] for split in ("train", "val", "test") if name in views[split].stored]
                if parts:
                    entry["features"] = digest_array(torch.cat(parts))
                content[name] = entry
            self._content = content
        return self._content

    def setup_metrics(self) -> dict[str, float]:
        """The PSI's counts as the active party learns them: each list's size, each pairwise and the common overlap."""
        self._prepare()
        return {f"setup/psi/{key}": float(value) for key, value in self.psi_counts.items()}

    def sample_ids_for(self, keys: Sequence[str], missing: str = "raise") -> list[int | None]:
        """The sample IDs of business IDs (as the active party's table writes them).

        With `missing="none"` an ID that is not in the active party's table maps to None instead of raising.

        Raises:
            KeyError: business IDs that are not in the active party's table (listed), with `missing="raise"`.
        """
        self._prepare()
        row = {key: i for i, key in enumerate(self._ids)}
        unknown = [k for k in keys if k not in row]
        if unknown and missing == "raise":
            raise KeyError(
                f"IDs {unknown[:10]} are not in the active party's table ({self.tables[self.active_party].path})"
            )
        return [row.get(k) for k in keys]

    def business_ids(self, sample_ids: torch.Tensor | np.ndarray | list[int]) -> list[str]:
        """The business IDs (as the active party's table writes them) of samples given by their lvfl sample IDs."""
        self._prepare()
        return [self._ids[int(i)] for i in np.asarray(sample_ids).reshape(-1)]
