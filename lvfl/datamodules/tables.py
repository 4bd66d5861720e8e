"""`PartyTables`: each party's own table (CSV or Parquet) with its own business-ID column, aligned by PSI.

The way a bank and a retailer hold their data: one table each, rows keyed by a customer ID of their own ordering,
overlapping only in part. Each party's table is read by that party's reader only (`read_table`); the parties then
align their IDs by private set intersection (`lvfl.alignment`: KKRT16's PSI, or ECDH-PSI with `psi: ecdh`), whose
messages are metered and reach the protocol's wire as set-up traffic (`setup_messages`). The samples are the active
party's rows (it holds the labels); the intersection is what every party holds (`held_by_every_party`): the VFL
loaders serve those, the rest exist at the active party only (the `overlap` machinery: `active_only_set`, the
student callbacks).

The samples are numbered by what every party can name: the shared ones first, in the PSI's agreed order (by ID
text), then the active party's others by ID text; nothing depends on the order of the rows in a file. The split is
drawn first, by the active party, over its own rows in an order keyed by their IDs, stratified on the labels unless
the split must be label-free (`stratify`, a label mechanism); each passive party learns its rows of each split from
the active party's `split` message (`lvfl.datamodules.split`) and fits on those, and the number of classes from its
`task` message (8 bytes). Then every party's encoded column count and categorical cardinalities go to the active
party and from it to every passive party (`inputs`), so that every process builds every party's model with the same
shapes (the models are initialized in party order from one seeded generator). The PSI's passive shuffle is keyed
from the OS, never from the config's public seed. The set-up messages besides the split, each a value of the codec
checked where it arrives, are `lvfl.alignment.setup_exchange`'s.

Each party's part of that set-up runs where the wire holds it: all of it in simulation, on a recording wire whose
messages the protocol then sends (`setup_messages`); one party's in its own process (`lvfl party`, `exchange_on`),
live on its wire, reading its own table only. A passive party's process never holds a label: its split and task are
the messages it received (`task_from_peers`).

A key holder outside the parties (an HE backend's coordinator, `add_key_holder`) holds no table and takes no part in
the PSI, but its process runs the same loop over the batches: the active party tells it the number of its samples
and of the shared ones (`rows`, 16 bytes), the split of the shared ones, the task and every participant's input
columns, as it tells a passive party; with `new_rows`, the number of new rows every party holds (`rows_new`). What it
learns from them: those counts and shapes, nothing of an ID, a feature or a label.

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
`task: binary` or `task: multiclass` states how many classes the config expects (2, or 3 and more), and another
count is refused naming the classes found; under the default `task: classification`, a label of more than 20
distinct numbers, or of fractions, is refused as the quantity it looks like (`task: regression` predicts it,
`task: multiclass` takes numbers as class codes).
With `task: regression` the label column holds numbers (a value that is not one, or a missing one, is refused by
line), standardized with the training rows' mean and standard deviation and predicted in its own units. IDs
are compared by their text (`12` and `"12"` are one ID) and kept: `business_ids(sample_ids)` gives the business ID
of any sample. `feature_names` lists every party's encoded columns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import SequentialSampler

from lvfl.alignment import DEFAULT_PROTOCOL as DEFAULT_PSI
from lvfl.alignment import PROTOCOLS as PSI_PROTOCOLS
from lvfl.alignment.setup_exchange import (
    NEW_ROWS_TAG,
    ROWS_TAG,
    TASK_TAG,
    align,
    exchange_inputs,
    psi_counts,
    split_bytes,
    task_from,
    task_message,
    tell_counts,
)
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.column_memory import column_major_zeros
from lvfl.datamodules.datasets import VerticalTensorDataset
from lvfl.datamodules.partition import ExplicitColumns, Partitioner
from lvfl.datamodules.scaling import apply_scaling
from lvfl.datamodules.split import SPLIT_TAG, decode_split, encode_split, keyed_order
from lvfl.datamodules.table_encoding import TASKS, ColumnEncoder, check_classes, fit_encoders, numeric_labels
from lvfl.datamodules.table_files import PartyTable, Table, read_table
from lvfl.parties import TaskInfo, party_name
from lvfl.progress import Phase
from lvfl.runs import digest_array, digest_json
from lvfl.wire import Absent, Wire, shadow

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
        task: "classification" (labels are classes, any text; a label of many distinct numbers, or of fractions, is
            refused as the quantity it looks like: say "regression", or "multiclass" for class codes), "binary"
            or "multiclass" (classes, and a label with another number of classes is refused), or "regression"
            (labels are real numbers).
        new_rows: for `lvfl predict`: one table of new rows per party (the same columns as its training table, no
            label column), aligned by a PSI of their own (tags `psi_new/...`) and encoded and scaled with what each
            party fitted on its training rows; the rows every party holds are predicted by the VFL model, the
            active party's others by the student when the run saved one (`new_rows_active_only`).
        psi: the private set intersection that aligns the tables (and the new rows): "kkrt" (the default: an
            oblivious PRF from OT extension, `lvfl.alignment.kkrt`, 11.8 s for a million IDs a side on one core) or
            "ecdh" (ECDH-PSI over Curve25519, `lvfl.alignment.ecdh`: the same result, each party learning the same, in
            about 15 times KKRT's core time, with 18% fewer bytes).
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
        psi: str = DEFAULT_PSI,
        **kwargs: Any,
    ) -> None:
        if psi not in PSI_PROTOCOLS:
            raise ValueError(f"PartyTables: psi must be one of {list(PSI_PROTOCOLS)}, got psi={psi!r}")
        self.psi = psi
        if task not in TASKS:
            raise ValueError(f"PartyTables: task must be one of {list(TASKS)}, got task={task!r}")
        self.task_option = task
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
        self._party_wire: Wire | None = None  # a party's own wire (`exchange_on`): the set-up runs live on it
        self._key_holders: list[str] = []  # outside the parties, told the counts and shapes (`add_key_holder`)
        self._peer_task: TaskInfo | None = None  # in a passive party's process: the task the active party sent
        self._ids: list[str] = []
        self._held: np.ndarray | None = None
        self._splits: dict[str, np.ndarray] | None = None
        self._categories: list[int] | None = None
        self._held_order: np.ndarray = np.zeros(0, dtype=np.int64)
        self._held_here: set[str] | None = None  # in a party's own process: the party whose table it read
        #: the PSI's counts (`setup_metrics`): `<party>/ids`, `<party>/shared_with_active`, `intersection`
        self.psi_counts: dict[str, int] = {}
        self._table_digests: dict[str, dict[str, Any]] = {}  # per party: its IDs' and columns' digests (`load`)
        self._content: dict[str, Any] | None = None
        self.encoders: dict[str, list[ColumnEncoder]] = {}
        self.label_names: list[str] = []
        #: the wall time of the training rows' PSI (both sides, in this process), once loaded
        self.psi_seconds: float | None = None
        #: the set-up's phases run in this process (reading, each PSI step, the split, encoding), once loaded
        self.phases: list[Phase] = []
        super().__init__(**kwargs)

    def default_partitioner(self) -> Partitioner:
        """Placeholder until `load` knows each table's encoded width (then the columns follow the tables exactly)."""
        return ExplicitColumns([[k] for k in range(len(self.tables))])

    def exchange_on(self, wire: Wire) -> None:
        """Run the set-up exchanges live on a party's own wire (`lvfl party`), before `load`.

        The protocol calls it in a party's own process (`VFLModule.prepare_datamodule`): `load` then reads only that
        party's table, runs its part of the PSI, and sends or receives the split and the task on `wire`, where they
        are metered as they happen (`setup_messages` has nothing left to send). A passive party's process holds no
        labels: `task_from_peers` gives the task the active party sent, and the other parties' columns are one
        placeholder column each (shadows once `hold_only` runs).
        """
        if self._party_wire is wire:
            return
        if self._prepared is not None:
            raise RuntimeError("PartyTables.exchange_on must come before the data is loaded")
        self._party_wire = wire

    def add_key_holder(self, name: str) -> None:
        """Tell a key holder outside the parties (an HE backend's coordinator) the set-up's counts and shapes.

        The protocol calls it, before the data is loaded, in every process and in simulation alike, so that the
        messages (and their bytes) are the same either way. See the module docstring for what the holder learns.
        """
        if name in self._key_holders:
            return
        if self._prepared is not None:
            raise RuntimeError("PartyTables.add_key_holder must come before the data is loaded")
        self._key_holders.append(name)

    def _phase(self, name: str, total: int | None = None, unit: str = "rows") -> Phase:
        """A phase of the set-up, kept in `phases` (its time, count and the process's peak memory at its end)."""
        phase = Phase(name, total=total, unit=unit)
        self.phases.append(phase)
        return phase

    def _holders(self, names: list[str]) -> list[str]:
        return [h for h in self._key_holders if h not in names]

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Read each table, align the IDs by PSI, split, fit each party's encoders on its training rows, lay out.

        Each party's part runs where the wire holds it (every part in simulation, one party's in its own process).
        The samples are numbered by what every party can name: the shared samples first, in the PSI's agreed order
        (by ID text), then the active party's other rows by ID text; so a passive party knows the sample IDs of its
        rows, and no numbering depends on the order of the rows in a file.
        """
        names = [party_name(k) for k in range(len(self.tables))]
        active = names[self.active_party]
        live = self._party_wire is not None
        wire = self._party_wire if live else Wire()
        self.phases = []
        tables = {}
        for name, source in zip(names, self.tables, strict=True):
            if wire.holds(name):
                with self._phase(f"{name}: reading its table") as phase:
                    tables[name] = read_table(source, phase.advance)
        passive = [names[k] for k in self.participants if k != self.active_party]
        holders = self._holders(names)
        holder_here = live and wire.here in holders  # a key holder's own process: no table, no part in the PSI
        started = time.perf_counter()
        with contextlib.nullcontext([]) if live else wire.recording() as held:
            # sent for real by the protocol, on its wire (`setup_messages`); in a party's process, live
            alignment = None
            shared_count = num_rows = 0
            if not holder_here:
                lists = {n: t.ids for n, t in tables.items()}
                paths = [s.path for s in self.tables]  # refused naming them if they share no ID
                alignment = align(
                    lists, parties=names, active=active, wire=wire, phase=self._phase, protocol=self.psi, paths=paths
                )
                shared_count, num_rows = len(alignment.ids), alignment.sizes[active]
            if active in tables:
                with self._phase(f"{active}: drawing the split", total=len(tables[active].ids)) as phase:
                    y, perm, payload, task = self._active_part(tables[active], alignment, shared_count)
                    phase.advance(len(y))
            else:
                y, perm, payload, task = self._active_part(None, alignment, shared_count)
            received: dict[str, np.ndarray] = {}
            for name in [*passive, *holders]:  # the split each fits on (or loops over), the task its model learns
                if name in holders:  # a key holder knows no count from the PSI: the active party tells it
                    num_rows, shared_count = tell_counts(wire, active, name, [num_rows, shared_count], ROWS_TAG)
                got = wire.send(active, name, payload, SPLIT_TAG)
                told = wire.send(active, name, task, TASK_TAG)
                if wire.holds(name):
                    received = decode_split(split_bytes(got, active), np.arange(shared_count, dtype=np.int64))
                    self._peer_task = None if wire.holds(active) else task_from(told, active, self.task_option)
            shared_order = np.arange(shared_count, dtype=np.int64)
        if not received and wire.holds(active):  # no passive participant (Local): the tables' split all the same
            received = decode_split(payload, shared_order)
        self._messages = [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        self.psi_seconds = time.perf_counter() - started  # `lvfl fit --twin` reports it
        if not wire.holds(active):  # the active party's split of the shared samples, all this process knows
            self._splits = {"val": received["val"], "test": received["test"]}
            y = np.zeros(num_rows, dtype=np.float32 if self.regression else np.int64)  # filler: no labels here

        own_rows: dict[str, np.ndarray] = {}  # per party held here: its row of each sample it encodes
        own_columns: dict[str, list[int]] = {}  # per party held here: each encoded column's cardinality (0: numeric)
        for name, table in tables.items():
            if name == active:  # its row of each sample, and the training rows it fits on
                own_rows[name] = perm
                fit_rows = np.sort(perm[self._splits["train"]])
            else:
                own_rows[name] = alignment.rows[name]
                fit_rows = own_rows[name][received["train"]]
            with self._phase(f"{name}: fitting its encoders", total=len(table.columns), unit="columns") as phase:
                source = self.tables[names.index(name)]
                encoders = fit_encoders(table, source, fit_rows, onehot=self.encoding == "onehot")
                phase.advance(len(encoders))
            self.encoders[name] = encoders
            self._table_digests[name] = {"ids": digest_json(table.ids), "columns": list(table.columns)}
            own_columns[name] = [c for e in encoders for c in e.cardinalities]
        with contextlib.nullcontext([]) if live else wire.recording() as held:  # sent as the PSI's are
            columns = exchange_inputs(wire, active, passive, own_columns, holders)
        self._messages += [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        widths = np.cumsum([0, *(len(columns.get(name, [0])) for name in names)])
        # column-major, each party's columns encoded straight into it: a party's columns lie apart from the others',
        # whose zeros (in a party's own process, another party's columns) are never written, so the system never
        # backs them with memory; a passive party's rows past the shared ones are never served
        x = column_major_zeros(num_rows, int(widths[-1]))  # its rows given back as the splits take them
        for k, name in enumerate(names):
            if name in tables:
                rows = own_rows[name]
                encoders = self.encoders[name]
                with self._phase(f"{name}: encoding its columns", total=len(encoders), unit="columns") as phase:
                    _encoded(tables[name], encoders, rows, phase, out=x[: len(rows), widths[k] : widths[k + 1]])
        cats = [c for name in names for c in columns.get(name, [0])]
        self.partitioner = ExplicitColumns([list(range(widths[k], widths[k + 1])) for k in range(len(names))])
        self._held_here = {n for n in names if n in tables} if live else None
        self._categories = cats if any(cats) else None
        self._held = np.zeros(num_rows, dtype=bool)
        self._held[:shared_count] = True
        self._held_order = shared_order
        if active in tables:
            self._ids = [tables[active].ids[r] for r in perm]
        else:  # a passive party knows the shared IDs; a key holder none
            self._ids = list(alignment.ids) if alignment is not None else []
        if active in tables:
            self._table_digests[active]["labels"] = digest_array(y)
        self._content = None
        self.psi_counts = {} if alignment is None else psi_counts(alignment, names)
        return x, y

    def _active_part(
        self, table: PartyTable | None, alignment: Any, shared_count: int
    ) -> tuple[np.ndarray, np.ndarray, Any, torch.Tensor]:
        """The active party's part: its labels and row of each sample, the split, and what it tells the others.

        Returns (labels per sample, its row per sample, the `split` message, the `task` message); where the active
        party is not held here, placeholders and the shadows the messages are received against.
        """
        if table is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, Absent("the split"), task_message(None)
        active = party_name(self.active_party)
        shared = alignment.rows[active]
        others = sorted(set(range(len(table.ids))) - set(shared.tolist()), key=lambda r: table.ids[r])
        perm = np.concatenate([shared, np.asarray(others, dtype=np.int64)]).astype(np.int64)
        if self.regression:
            y = numeric_labels(table, self.tables[self.active_party].label_column or "")[perm]
            num_classes = 0
        else:
            self.label_names = sorted(set(table.labels or []))
            column = self.tables[self.active_party].label_column or ""
            check_classes(self.label_names, column, self.task_option, table.path)
            code = {name: i for i, name in enumerate(self.label_names)}
            y = np.asarray([code[label] for label in table.labels or []], dtype=np.int64)[perm]
            num_classes = len(self.label_names)
        self._splits = None
        # drawn first (the encoders see training rows only), over the active party's rows in an order keyed by their
        # IDs (`keyed_order`), so that the split does not depend on the order of the rows in its file
        ids = [table.ids[r] for r in perm]
        self._splits = self._split(len(y), self.split_key(y), order=keyed_order(ids, self.seed))
        in_shared = {split: rows[rows < shared_count] for split, rows in self._splits.items()}
        payload = encode_split(in_shared, np.arange(shared_count, dtype=np.int64))
        return y, perm, payload, task_message(num_classes)

    def task_from_peers(self) -> TaskInfo | None:
        """In a passive party's own process, the task the active party sent (`task` message); else None."""
        return self._peer_task

    def setup_messages(self) -> list[tuple[str, str, Any, str]]:
        """The PSI's, the split's and the task's messages, held back for the protocol to send on its wire.

        None in a party's own process (`exchange_on`), where they were exchanged live while loading.
        """
        self._prepare()
        return [] if self._party_wire is not None else list(self._messages)

    def setup(self, stage: str | None = None) -> None:
        """Load (once); for `lvfl predict` with `new_rows`, also align and encode the new rows (once)."""
        super().setup(stage)
        if stage == "predict" and self.new_row_tables is not None and self._new is None:
            self._new = self._load_new_rows()

    def _load_new_rows(self) -> tuple[VerticalTensorDataset, list[str], torch.Tensor]:
        """The new rows, encoded and scaled as each party's training rows were, aligned by their own PSI.

        Each party's part runs where the wire holds it, as `load`'s: in a party's own process (`exchange_on`) it reads
        only its own table of new rows, runs its part of the PSI live (tags `psi_new/...`), and holds only its own
        features of the shared rows, the other parties' as shadows of their widths. Every process serves the shared
        rows in the PSI's agreed order, so the predict loop's batches match; a passive party numbers them from the
        end of the training samples in that order (the active party's numbers, by its table's rows, are its own).

        Returns (the new rows every party holds, as a dataset; the business IDs of the new rows only the active
        party holds; those rows' active-party features: at a passive party, none).
        """
        names = [party_name(k) for k in range(len(self.tables))]
        live = self._party_wire is not None
        wire = self._party_wire if live else Wire()
        tables = {}
        for name, source in zip(names, self.new_row_tables or [], strict=True):
            if wire.holds(name):
                with self._phase(f"{name}: reading its new rows") as phase:
                    texts = [e.name for e in self.encoders.get(name, []) if e.kind == "categorical"]
                    tables[name] = read_table(source, phase.advance, as_text=texts)  # levels as written
        for name, table in tables.items():
            trained = [e.name for e in self.encoders[name]]
            if table.columns != trained:
                raise ValueError(f"{table.path}: columns {table.columns}, but {name} was trained on {trained}")
        active = names[self.active_party]
        holders = self._holders(names)
        holder_here = live and wire.here in holders
        with contextlib.nullcontext([]) if live else wire.recording() as held:
            alignment = None
            if not holder_here:
                lists = {n: t.ids for n, t in tables.items()}
                alignment = align(
                    lists, parties=names, active=active, wire=wire, phase=self._phase, protocol=self.psi, tag="psi_new"
                )
            told = 0
            for name in holders:  # it loops over the new rows' batches too: the active party tells it their number
                shared = len(alignment.rows[active]) if wire.holds(active) else 0
                (told,) = tell_counts(wire, active, name, [shared], NEW_ROWS_TAG)
        self._messages += [(src, dst, payload, tag) for src, dst, payload, tag, _ in held]
        if holder_here:  # no table, no feature: shadows of every party's width, in the shared rows' count
            widths = {name: len(self.partitioner.columns[k]) for k, name in enumerate(names)}
            first = len(self._ids)
            self._new_keys = []
            vfl = VerticalTensorDataset(
                ids=torch.arange(first, first + told, dtype=torch.int64),
                features={n: shadow(torch.zeros(told, widths[n])) for n in names},
                labels=torch.zeros(told, dtype=torch.int64),
            )
            return vfl, [], torch.zeros(0, widths[active])
        features = {}
        for name, table in tables.items():
            rows = np.arange(len(table.ids)) if name == active else alignment.rows[name]
            encoders = self.encoders[name]
            with self._phase(f"{name}: encoding its new rows", total=len(encoders), unit="columns") as phase:
                encoded = _encoded(table, encoders, rows, phase)
            features[name] = self._scale(name, encoded)
        first = len(self._ids)
        here = next(iter(tables))  # the party this process holds (every party in simulation: the first)
        count = len(alignment.rows[active] if active in tables else alignment.rows[here])
        if active in tables:
            shared = alignment.rows[active]
            ids = torch.as_tensor(first + shared, dtype=torch.int64)
            self._ids = [*self._ids, *tables[active].ids]  # new sample IDs follow the training ones
        else:  # a passive party's own process: the shared rows, numbered in the PSI's order
            ids = torch.arange(first, first + count, dtype=torch.int64)
        widths = {name: len(self.partitioner.columns[k]) for k, name in enumerate(names)}
        held_features = {
            n: torch.from_numpy(features[n][shared] if n == active else features[n])
            if n in features
            else shadow(torch.zeros(count, widths[n]))
            for n in names
        }
        vfl = VerticalTensorDataset(
            ids=ids,
            features=held_features,
            labels=torch.zeros(count, dtype=torch.int64),  # unknown: predict_step does not read them
        )
        if active not in tables:
            self._new_keys = []
            return vfl, [], torch.zeros(0, widths[active])
        only = np.setdiff1d(np.arange(len(tables[active].ids)), shared)
        only_keys = [tables[active].ids[r] for r in only]
        self._new_keys = list(tables[active].ids)
        return vfl, only_keys, torch.from_numpy(features[active][only])

    def _scale(self, party: str, x: np.ndarray) -> np.ndarray:
        """`x` standardized with what `party` fitted on its training rows (`scaling`), as float32."""
        return apply_scaling(x, self.scaling.get(party))

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

    def parties_held_here(self) -> set[str] | None:
        """In a party's own process, the party whose table it read (none: a key holder's); None in simulation."""
        return self._held_here

    def held_by_every_party(self, num_rows: int) -> np.ndarray | None:
        """The active party's rows whose IDs every party holds (the PSI's intersection)."""
        return self._held

    def alignment_messages(self) -> list[tuple[str, str, Any, str]]:
        """The PSI's messages (tags `psi/...`), held back for the protocol to send on its wire."""
        self._prepare()
        return [m for m in self._messages if m[3].startswith(("psi/", "psi_new/"))]

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
                    entry["features"] = digest_array(parts)  # = torch.cat(parts)'s, without the copy
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


def _encoded(
    table: Table, encoders: list[ColumnEncoder], rows: np.ndarray, phase: Phase, out: np.ndarray | None = None
) -> np.ndarray:
    """`rows` of `table` through its fitted `encoders`, side by side, into `out` where given.

    `phase` counts each column as it is done. Each raw column is let go of once encoded (`table.data` is
    emptied), so a party's raw and encoded tables are never both whole in memory.
    """
    width = sum(len(e.output_names) for e in encoders)
    out = np.zeros((len(rows), width), dtype=np.float32) if out is None else out
    raw, table.data, at = table.data, [], 0
    for j, encoder in enumerate(encoders):
        width = len(encoder.output_names)
        encoder.encode_column(raw[j], rows, table.origin, out[:, at : at + width])
        raw[j] = None
        at += width
        phase.advance()
    return out
