"""`Criteo`: the Criteo display-advertising challenge (`train.txt`), converted once to memory-mapped arrays.

`train.txt` (of `dac.tar.gz`, the Kaggle display-advertising challenge; 45,840,617 rows, about 11 GB) is
tab-separated without a header, 40 fields per line: the label (0/1 = clicked), I1..I13 integer features (empty =
missing, may be negative) and C1..C26 categorical features (8-hex-digit hashes, empty = missing).

`convert()` streams the file twice in chunks (never holding the table in memory) into `.npy` files written with
`np.lib.format.open_memmap`:

- `dense.npy` float32 (N, 13): `log1p(max(x, 0))`, missing = 0. The usual Criteo preprocessing (DeepCTR,
  PyTorch-FM): a log transform of the integer counts. The few negative values (I2 mostly) are clipped to 0 before
  the log, so they read as 0 like a missing value.
- `sparse.npy` int32 (N, 26): per column, codes 1..V of the values seen at least `min_count` times (sorted), and
  code 0 for missing and rare values (`"<other>"`); the column's cardinality is V + 1.
- `labels.npy` uint8 (N,).
- `meta.json`: row count, cardinalities, `min_count`, `max_rows` and the source's size and mtime; written last, so
  an interrupted conversion, or a changed source, converts again, and a second call with the same inputs reuses
  the files.

The datamodule never loads the table: each split keeps the memmaps and its row indices, and a batch reads only its
rows (sorted for locality). Dense columns are not standardized (`scale` is not used): they are already
log-scaled, and fitting a scaler would mean a pass over the training rows.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lvfl.checks import check_int
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.datasets import RawView, VerticalTensorDataset
from lvfl.datamodules.partition import ContiguousColumns, ExplicitColumns, Partitioner, check_columns
from lvfl.datamodules.preparation import Prepared
from lvfl.datamodules.stand_ins import FileBacked, write_criteo_tsv
from lvfl.parties import PartySpec, TaskInfo, VFLBatch, party_name

__all__ = ["Criteo", "CriteoSplit", "convert"]

NUM_DENSE = 13  #: I1..I13
NUM_SPARSE = 26  #: C1..C26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
FEATURE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)] + [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
MAX_MATERIALIZED_ROWS = 2_000_000  #: `CriteoSplit.features` / `stored` refuse larger splits
_FORMAT = 1  # bump when the converted layout changes


def _chunks(path: Path, max_rows: int | None, chunk_rows: int) -> Iterator[tuple[int, list[list[str]]]]:
    """(first line number, rows as field lists) of at most `chunk_rows` rows, stopping after `max_rows` rows."""
    seen = 0
    rows: list[list[str]] = []
    first = 1
    with path.open(encoding="ascii", errors="replace", newline="\n") as f:
        for line_no, line in enumerate(f, start=1):
            if max_rows is not None and seen == max_rows:
                break
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != NUM_FIELDS:
                if len(fields) > NUM_FIELDS:
                    raise ValueError(
                        f"Criteo: {path} line {line_no} has {len(fields)} fields, expected {NUM_FIELDS} "
                        f"(label, I1..I13, C1..C26)"
                    )
                fields += [""] * (NUM_FIELDS - len(fields))  # trailing empty fields cut off
            if fields[0] not in ("0", "1"):
                raise ValueError(f"Criteo: {path} line {line_no} has label {fields[0]!r}, expected 0 or 1")
            if not rows:
                first = line_no
            rows.append(fields)
            seen += 1
            if len(rows) == chunk_rows:
                yield first, rows
                rows = []
    if rows:
        yield first, rows


def _source_stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def convert(
    tsv_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    min_count: int = 10,
    max_rows: int | None = None,
    chunk_rows: int = 1_000_000,
) -> Path:
    """Convert Criteo's `train.txt` into memory-mappable `.npy` arrays in `out_dir` (see the module docstring).

    Two passes over the file in chunks of `chunk_rows` rows: pass 1 counts every categorical value per column
    (the vocabularies: values seen >= `min_count` times, sorted, codes from 1), pass 2 writes the arrays chunk by
    chunk. Returns `out_dir`; when its `meta.json` matches the inputs (and source size / mtime) nothing is redone.

    Args:
        tsv_path: the `train.txt` file.
        out_dir: where `dense.npy`, `sparse.npy`, `labels.npy` and `meta.json` go (created if needed).
        min_count: values seen fewer times in their column (over the converted rows) share code 0 with missing.
        max_rows: convert only the first `max_rows` rows; None converts all.
        chunk_rows: rows parsed at a time (memory: a few hundred bytes per row of a chunk).
    """
    check_int(min_count, "min_count", 1, why="occurrences a categorical value needs for a code of its own")
    if max_rows is not None:
        check_int(max_rows, "max_rows", 1, why="rows converted from the start of the file")
    check_int(chunk_rows, "chunk_rows", 1, why="rows parsed at a time")
    src = Path(tsv_path)
    out = Path(out_dir)
    if not src.is_file():
        raise FileNotFoundError(f"Criteo: {src} does not exist")
    expected = {
        "format": _FORMAT,
        "source": str(src.resolve()),
        **_source_stamp(src),
        "min_count": int(min_count),
        "max_rows": max_rows,
    }
    meta_path = out / "meta.json"
    names = ("dense.npy", "sparse.npy", "labels.npy")
    if meta_path.is_file() and all((out / n).is_file() for n in names):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta = {}
        if all(meta.get(k) == v for k, v in expected.items()):
            return out
    out.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # a conversion cut short leaves no valid meta behind

    # pass 1: count categorical values per column (missing = "" not counted)
    counts = [Counter() for _ in range(NUM_SPARSE)]
    n = 0
    for _, rows in _chunks(src, max_rows, chunk_rows):
        n += len(rows)
        columns = list(zip(*rows, strict=True))
        for j in range(NUM_SPARSE):
            counts[j].update(columns[1 + NUM_DENSE + j])
    if n == 0:
        raise ValueError(f"Criteo: {src} has no rows")
    vocabs = []
    for c in counts:
        c.pop("", None)
        vocabs.append({v: code for code, v in enumerate(sorted(v for v, k in c.items() if k >= min_count), start=1)})
    del counts

    # pass 2: write the arrays chunk by chunk
    dense = np.lib.format.open_memmap(out / "dense.npy", mode="w+", dtype=np.float32, shape=(n, NUM_DENSE))
    sparse = np.lib.format.open_memmap(out / "sparse.npy", mode="w+", dtype=np.int32, shape=(n, NUM_SPARSE))
    labels = np.lib.format.open_memmap(out / "labels.npy", mode="w+", dtype=np.uint8, shape=(n,))
    start = 0
    for first, rows in _chunks(src, max_rows, chunk_rows):
        m = len(rows)
        columns = list(zip(*rows, strict=True))
        labels[start : start + m] = np.asarray(columns[0], dtype=np.uint8)
        block = np.empty((m, NUM_DENSE), dtype=np.float64)
        for j in range(NUM_DENSE):
            try:
                block[:, j] = np.asarray([v or "0" for v in columns[1 + j]], dtype=np.float64)
            except ValueError as err:
                raise ValueError(
                    f"Criteo: {src} rows from line {first} have a non-integer value in I{j + 1}: {err}"
                ) from err
        dense[start : start + m] = np.log1p(np.maximum(block, 0.0)).astype(np.float32)
        codes = np.empty((m, NUM_SPARSE), dtype=np.int32)
        for j in range(NUM_SPARSE):
            get = vocabs[j].get
            codes[:, j] = np.fromiter((get(v, 0) for v in columns[1 + NUM_DENSE + j]), dtype=np.int32, count=m)
        sparse[start : start + m] = codes
        start += m
    for a in (dense, sparse, labels):
        a.flush()
    del dense, sparse, labels
    meta = {**expected, "rows": n, "cardinalities": [len(v) + 1 for v in vocabs]}
    meta_path.write_text(json.dumps(meta, indent=1))
    return out


class CriteoSplit(VerticalTensorDataset):
    """One split of the converted arrays, read lazily: only `gather`ed rows are read from the memmaps.

    `stored` and `features` materialize the whole split (refused above `MAX_MATERIALIZED_ROWS` rows); `labels`
    reads the split's labels once (1 byte per row on disk, int64 in memory) and keeps them.

    Args:
        rows: (n,) int64 row indices of the split in the converted arrays (the sample IDs), sorted.
        dense, sparse, labels: the memmaps of `convert()`'s output.
        parties: party name -> (dense column indices, sparse column indices) in the party's column order.
    """

    def __init__(
        self,
        rows: np.ndarray,
        dense: np.memmap,
        sparse: np.memmap,
        labels: np.memmap,
        parties: dict[str, tuple[list[int], list[int]]],
    ) -> None:
        self.rows = np.asarray(rows, dtype=np.int64)
        self.ids = torch.from_numpy(self.rows)
        self.dense = dense
        self.sparse = sparse
        self.label_array = labels
        self.parties = {k: (list(d), list(s)) for k, (d, s) in parties.items()}
        self.decoders = {}
        self._labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def labels(self) -> torch.Tensor:  # type: ignore[override]
        """(n,) int64 labels of the split, read from the memmap on first access."""
        if self._labels is None:
            self._labels = torch.from_numpy(self.label_array[self.rows].astype(np.int64))
        return self._labels

    @property
    def stored(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """Every party's whole slice, materialized (small splits only)."""
        if len(self) > MAX_MATERIALIZED_ROWS:
            raise ValueError(
                f"Criteo: this split has {len(self):,} rows; materializing all of its features is refused above "
                f"{MAX_MATERIALIZED_ROWS:,} rows (read batches with gather() or a DataLoader instead)"
            )
        return self.gather(torch.arange(len(self))).features

    @property
    def features(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """Every party's whole slice as model input (small splits only, see `stored`)."""
        return self.stored

    def gather(self, indices: Sequence[int] | torch.Tensor) -> VFLBatch:
        """The rows at positions `indices` of this split, read from the memmaps (sorted for locality)."""
        pos = torch.as_tensor(indices, dtype=torch.long).numpy()
        rows = self.rows[pos]
        order = np.argsort(rows, kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        sorted_rows = rows[order]
        dense = self.dense[sorted_rows][inverse]  # only these rows are read
        sparse = self.sparse[sorted_rows][inverse]
        labels = self.label_array[sorted_rows][inverse].astype(np.int64)
        features = {}
        for name, (dcols, scols) in self.parties.items():
            x = np.empty((len(rows), len(dcols) + len(scols)), dtype=np.float32)
            x[:, : len(dcols)] = dense[:, dcols]
            x[:, len(dcols) :] = sparse[:, scols]
            features[name] = torch.from_numpy(x)
        return VFLBatch(ids=torch.from_numpy(rows.copy()), features=features, labels=torch.from_numpy(labels))

    def subset(self, index: torch.Tensor) -> CriteoSplit:
        """The rows at positions `index` as a split of their own (still lazy)."""
        pos = torch.as_tensor(index, dtype=torch.long).numpy()
        return CriteoSplit(self.rows[pos], self.dense, self.sparse, self.label_array, self.parties)

    def raw(self) -> RawView:
        """This split as served to the loaders (stored = model input for Criteo)."""
        return RawView(self)


class Criteo(VerticalDataModule, FileBacked):
    """Criteo display advertising (`train.txt`, 45,840,617 rows, 13 integer + 26 categorical features, clicked or not).

    Converted once by `convert()` into `root/lvfl_cache_<min_count>_<max_rows>/` and streamed from memory-mapped
    arrays (see the module docstring). The split is a seeded random split by row index (no stratification):
    `test_fraction` (default 0.2) of the rows are the test split, as in EASTER Sec. V-A1 (80/20), and
    `val_fraction` *of the remaining training rows* are the validation split.

    Feature columns are numbered 0..38: 0..12 = I1..I13 (numeric, log-transformed), 13..38 = C1..C26 (integer codes,
    `PartySpec.categories` = each column's cardinality). A party's tensor holds its numeric columns first, then its
    categorical ones, each group in the order `columns` lists them.

    Args:
        root: the folder that holds `train.txt`.
        min_count: categorical values seen fewer times share code 0 with missing ones.
        max_rows: use only the first `max_rows` rows of the file (quick runs); None uses all.
        columns: the party partition of the 39 feature columns, one list per party; default: contiguous groups of
            the 39 columns in order (`ContiguousColumns`: with 2 parties, I1..I13 and C1..C7 to party 0 and C8..C26
            to party 1). Overrides `partitioner`.
        **kwargs: `VerticalDataModule` arguments (`scale` is not used; `overlap` must be 1).
    """

    num_classes = 2
    how_to_get = (
        "download the Criteo display-advertising challenge dataset (dac.tar.gz, from the Kaggle Display Advertising "
        "Challenge / Criteo AI Lab) and extract its train.txt into that folder"
    )

    def __init__(
        self,
        root: str = "data/criteo",
        min_count: int = 10,
        max_rows: int | None = None,
        columns: list[list[int]] | None = None,
        **kwargs: Any,
    ) -> None:
        check_int(min_count, "min_count", 1, why="occurrences a categorical value needs for a code of its own")
        if max_rows is not None:
            check_int(max_rows, "max_rows", 1, why="rows used from the start of train.txt")
        if columns is not None:
            kwargs["partitioner"] = ExplicitColumns(columns)
        self.root = str(root)
        self.min_count = min_count
        self.max_rows = max_rows
        super().__init__(**kwargs)
        if self.overlap < 1.0:
            raise ValueError(
                f"Criteo supports overlap=1 only, got overlap={self.overlap}: the partial-overlap views copy each "
                "party's slice of every split into memory, which the streamed Criteo arrays avoid"
            )
        if self.augmentation is not None:
            raise ValueError(f"Criteo is tabular: augmentation={self.augmentation!r} cannot apply; set 'none'")
        if self.stratify == "labels":
            raise ValueError(
                "Criteo's split is a seeded random split by row index (80/20, as in the EASTER paper), never "
                "stratified: stratify=labels cannot apply; leave stratify at auto or none"
            )

    def default_partitioner(self) -> Partitioner:
        """Contiguous groups of the 39 feature columns (I1..I13 then C1..C26)."""
        return ContiguousColumns()

    @property
    def source(self) -> Path:
        """`root/train.txt`."""
        return Path(self.root) / "train.txt"

    @property
    def cache_dir(self) -> Path:
        """Where the converted arrays go: `root/lvfl_cache_<min_count>_<max_rows>/`."""
        return Path(self.root) / f"lvfl_cache_{self.min_count}_{self.max_rows}"

    @classmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """A random `train.txt` of `rows` lines (missing and negative integers, rare and missing categories)."""
        write_criteo_tsv(Path(root) / "train.txt", rows, seed)

    def check_files(self) -> None:
        """Raise FileNotFoundError naming `train.txt`, the `root` option and how to get it."""
        if not self.source.is_file():
            raise FileNotFoundError(f"Criteo: expected {self.source} under root={self.root!r}; {self.how_to_get}")

    def prepare_data(self) -> None:
        """Convert `train.txt` (once; later calls reuse the arrays)."""
        self.check_files()
        convert(self.source, self.cache_dir, min_count=self.min_count, max_rows=self.max_rows)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """Not used: Criteo streams its arrays (see `_prepare`) instead of loading the table."""
        raise RuntimeError("Criteo does not load the whole table: its splits read rows from memory-mapped arrays")

    def arrays(self) -> tuple[np.memmap, np.memmap, np.memmap, dict[str, Any]]:
        """(dense, sparse, labels, meta) of the converted files, converting first if needed; arrays memory-mapped."""
        self.prepare_data()
        out = self.cache_dir
        meta = json.loads((out / "meta.json").read_text())
        dense, sparse, labels = (np.load(out / n, mmap_mode="r") for n in ("dense.npy", "sparse.npy", "labels.npy"))
        return dense, sparse, labels, meta

    @property
    def split_uses_labels(self) -> bool:
        """Never: Criteo's split is a seeded random split by row index (`_split_rows`), public to every party."""
        return False

    def _split_rows(self, n: int) -> dict[str, np.ndarray]:
        """Seeded random split of the row indices 0..n-1 (sorted within each split)."""
        order = np.random.default_rng([self.seed, 0xC217E0]).permutation(n)
        n_test = round(self.test_fraction * n)
        n_val = round(self.val_fraction * (n - n_test))
        if n_test < 1 or n_val < 1 or n - n_test - n_val < 1:
            raise ValueError(
                f"Criteo: {n} rows cannot make non-empty splits with test_fraction={self.test_fraction}, "
                f"val_fraction={self.val_fraction} (of the training rows)"
            )
        return {
            "train": np.sort(order[n_test + n_val :]),
            "val": np.sort(order[n_test : n_test + n_val]),
            "test": np.sort(order[:n_test]),
        }

    # `_prepare` is private in VerticalDataModule; this in-package subclass overrides it to build lazy splits
    # instead of loading, scaling and copying the table.
    def _prepare(self) -> Prepared:
        if self._prepared is not None:
            return self._prepared
        num_columns = NUM_DENSE + NUM_SPARSE
        if self.num_parties > num_columns:
            raise ValueError(
                f"num_parties={self.num_parties} exceeds the {num_columns} Criteo feature columns: every party "
                "needs at least one"
            )
        columns = [[int(c) for c in cols] for cols in self.partitioner.split(num_columns, self.num_parties)]
        check_columns(columns, num_columns=num_columns, num_parties=self.num_parties)
        dense, sparse, labels, meta = self.arrays()
        cards = [0] * NUM_DENSE + [int(c) for c in meta["cardinalities"]]
        parties: dict[str, tuple[list[int], list[int]]] = {}
        specs = []
        for k in self.participants:
            dcols = [c for c in columns[k] if c < NUM_DENSE]
            scols = [c - NUM_DENSE for c in columns[k] if c >= NUM_DENSE]
            parties[party_name(k)] = (dcols, scols)
            cats = tuple([0] * len(dcols) + [cards[NUM_DENSE + c] for c in scols])
            specs.append(
                PartySpec(
                    name=party_name(k),
                    role="active" if k == self.active_party else "passive",
                    input_shape=(len(columns[k]),),
                    index=k,
                    categories=cats if any(cats) else (),
                )
            )
        rows = self._split_rows(int(meta["rows"]))
        splits: dict[str, VerticalTensorDataset] = {
            s: CriteoSplit(r, dense, sparse, labels, parties) for s, r in rows.items()
        }
        active = party_name(self.active_party)
        active_splits: dict[str, VerticalTensorDataset] = {
            s: CriteoSplit(r, dense, sparse, labels, {active: parties[active]}) for s, r in rows.items()
        }
        self._prepared = Prepared(
            columns=columns,
            party_specs=specs,
            task=TaskInfo(num_classes=2, kind="binary"),
            splits=splits,
            active_splits=active_splits,
            overlap={s: np.ones(len(r), dtype=bool) for s, r in rows.items()},
            image_width=None,
        )
        return self._prepared
