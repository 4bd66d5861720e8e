"""Reading a party's own table: CSV (the `csv` module) or Parquet (pyarrow), one file or a directory of them.

Each party's table is read by that party's reader only. What cannot be used is refused naming the file, the column
and the line (Parquet: the row), never silently read another way: a header naming a column twice or not at all, a
config that feeds the ID or label column to the model, a file that does not decode in its `encoding`, a quote that
is never closed, a field over the csv module's size limit, a Parquet ID that is no whole number. `PartyTable` is
the config entry that says where a table is and what its columns are.
"""

from __future__ import annotations

import codecs
import csv
import decimal
import difflib
import itertools
import math
import re
from array import array
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lvfl.datamodules.table_columns import MISSING, Column, ColumnBuilder

__all__ = ["MISSING", "POLICIES", "SUFFIXES", "PartyTable", "Table", "read_table"]

SUFFIXES = (".csv", ".parquet")  #: the table formats (a directory holds files of one of them)
POLICIES = ("refuse", "mean", "median", "mode", "level")  #: the `missing` options (see `PartyTable`)
PROGRESS_ROWS = 10_000  #: rows read between two reports of `read_table`'s progress


@dataclass
class PartyTable:
    """One party's table.

    Args:
        path: a CSV or Parquet file (`.parquet`; any other name is read as CSV), or a directory of `.csv` or
            `.parquet` files of one format with one header, read in name order. A CSV's first (non-blank) line is
            its header; fields are comma-separated, quoted with `"`, and at most the csv module's field size limit
            long (131072 characters unless the process raised it). lvfl leaves that limit as it is: in a table of
            IDs, numbers and categories a longer field is an unclosed quote far more often than data, and the
            limit is process-wide state; a longer field is refused by line.
        id_column: the column of business IDs (unique within the file; never a feature).
        columns: the feature columns, each once; default: every column but the ID and label columns.
        label_column: the active party's label column (exactly one party names one; never a feature).
        categorical: columns to encode as categories even where every value is a number (postcodes, codes).
        missing: the table's policy for a missing feature value: "refuse" (an error naming it), "mean" or "median"
            (impute numeric columns from the training rows, with an indicator column; categorical ones get a
            `<missing>` level), "mode" (the most frequent training value or level, with an indicator column), or
            "level" (categorical columns only: a `<missing>` level).
        missing_columns: per-column policies that override `missing` (e.g. `{income: median, segment: mode}`).
        encoding: the CSV file's text encoding, a Python codec name (`utf-8`, `latin-1`, `cp1252`, `utf-16`);
            `utf-8` also reads a file that starts with a byte-order mark (as spreadsheets write them). A file that
            does not decode is refused by line, naming this option. Parquet text is UTF-8 by the format's rule.
            Not to be confused with the datamodule's `PartyTables(encoding=onehot|codes)`, which says how
            categorical columns become model input.
        max_levels: with the datamodule's `encoding: onehot`, the most distinct values a categorical column may
            have in the training rows (each becomes a 0/1 column, so a near-unique column would blow the party's
            input up to thousands of columns); more is refused. `encoding: codes` (one code column for an
            embedding model) has no such limit.
    """

    path: str
    id_column: str
    columns: list[str] | None = None
    label_column: str | None = None
    categorical: list[str] = field(default_factory=list)
    missing: str = "refuse"
    missing_columns: dict[str, str] = field(default_factory=dict)
    encoding: str = "utf-8"
    max_levels: int = 1000


@dataclass
class Places:
    """Where each row of a table is, for messages: its file and its line (CSV) or row (Parquet), as arrays."""

    files: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # per file: "line" or "row"
    starts: list[int] = field(default_factory=list)  # per file: the table row its first row is
    numbers: array = field(default_factory=lambda: array("q"))  # per row: its line or row number in its file

    def __call__(self, row: int) -> str:
        """`file, line N` (or `file, row N`) of a table row."""
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return f"{self.files[k]}, {self.kinds[k]} {self.numbers[row]}"


@dataclass
class Table:
    """A table as its party's reader returns it: IDs, the feature columns (`Column`), where each row is, labels."""

    path: Path
    ids: list[str]
    columns: list[str]
    data: list[Column]  # per feature column
    origin: Places  # origin(row): where a row is ("file, line N"), for messages
    labels: list[str] | None = field(default=None)

    @property
    def values(self) -> list[list[str]]:
        """Every row's values as texts (row-wise readers: serving's tables of a few rows; large tables use `data`)."""
        return [[c.text(r) for c in self.data] for r in range(len(self.ids))]

    @property
    def origins(self) -> list[str]:
        """Where every row is, as texts (row-wise readers)."""
        return [self.origin(r) for r in range(len(self.ids))]


def _files(path: Path) -> list[Path]:
    """The files of a table: the file itself, or a directory's `*.csv` or `*.parquet` files in name order."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"party table {path} does not exist (the `path` of a PartyTables entry)")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
    kinds = {p.suffix.lower() for p in files}
    if not files:
        raise FileNotFoundError(f"party table {path} is a directory without .csv or .parquet files")
    if len(kinds) > 1:
        raise ValueError(f"party table {path} mixes .csv and .parquet files; keep one format per table")
    return files


def _codec(source: PartyTable) -> str:
    """The codec a CSV is read with: `source.encoding`, with UTF-8 read as `utf-8-sig` (a leading BOM dropped)."""
    try:
        name = codecs.lookup(source.encoding).name
        "".encode(source.encoding)  # a bytes-to-bytes codec (base64) is known but no text encoding
    except (LookupError, TypeError):
        raise ValueError(
            f"{source.path}: `encoding` {source.encoding!r} is not a text encoding Python knows (the file's text "
            "encoding, e.g. utf-8, latin-1, cp1252, utf-16; the datamodule's onehot/codes option is another one)"
        ) from None
    return "utf-8-sig" if name == "utf-8" else source.encoding


def _sniff(path: Path) -> str:
    """A hint from a file's first bytes for a file that does not read as text in its `encoding`."""
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "the file starts with a UTF-32 byte-order mark: set the table's `encoding: utf-32`"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "the file starts with a UTF-16 byte-order mark: set the table's `encoding: utf-16`"
    if head.startswith(b"PAR1"):
        return "the file is Parquet: name it *.parquet"
    if head.startswith(b"\x1f\x8b"):
        return "the file is gzip-compressed: decompress it"
    if head.startswith(b"PK\x03\x04"):
        return "the file is a zip archive (a spreadsheet workbook?): export the sheet as CSV"
    return "set the table's `encoding` to the file's text encoding (e.g. `encoding: latin-1` or `encoding: cp1252`)"


def _undecodable(path: Path, codec: str) -> str:
    """`file, line N: ...` for a file that does not decode with `codec` (N: the first line that does not)."""
    decoder = codecs.getincrementaldecoder(codec)()
    failed, reason = 1, "undecodable bytes"
    with path.open("rb") as f:
        for number, line in enumerate(itertools.chain(f, [b""]), start=1):  # the empty last one flushes the decoder
            try:
                decoder.decode(line, final=not line)
            except UnicodeDecodeError as err:
                failed = max(1, number - (not line))  # an incomplete last character: the last line
                if err.start < len(err.object):
                    reason = f"byte 0x{err.object[err.start]:02x}"
                break
    hint = _sniff(path)
    return f"{path}, line {failed}: the file does not decode as {codec.removesuffix('-sig')!r} ({reason}); {hint}"


_NUL = (
    "UTF-16 text without a byte-order mark reads so: set the table's `encoding: utf-16-le` (or `utf-16-be`), "
    "or check that the file is text"
)


def _csv_error(path: Path, start: int, limit: int, err: csv.Error) -> str:
    """A one-line message for what the csv module refused in the record starting at line `start`."""
    text = str(err)
    if "field larger than field limit" in text:
        return (
            f"{path}, line {start}: a field longer than {limit} characters (the csv module's field size limit); a "
            "party table's fields are IDs, numbers and categories: if none should be that long, a quote (\") "
            "opened in this record and never closed has made the rest of the file one field"
        )
    if "unexpected end of data" in text:
        return f'{path}, line {start}: a quote (") opened in this record is never closed before the end of the file'
    if "NUL" in text:
        return f"{path}, line {start}: the line holds NUL characters; {_NUL}"
    return f"{path}, line {start}: {text} (a quoted field must end at its closing quote, then a comma)"


def _blank(fields: list[str]) -> bool:
    """Whether a CSV record is blank: an empty line, or commas only (spreadsheets write those below the data)."""
    return not any(v.strip() for v in fields)


def _csv(path: Path, codec: str) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """A CSV's header (its first non-blank line) and its records, each with the line it starts at."""
    f = path.open(newline="", encoding=codec)
    # strict: a quote never closed, or text after a closing quote, is refused rather than read into the field
    reader = csv.reader(f, strict=True, skipinitialspace=True)

    def records() -> Iterator[tuple[int, list[str]]]:
        with f:
            while True:
                start = reader.line_num + 1
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except UnicodeDecodeError:
                    raise ValueError(_undecodable(path, codec)) from None
                except csv.Error as err:
                    raise ValueError(_csv_error(path, start, csv.field_size_limit(), err)) from None
                yield start, fields

    lines = records()
    try:
        line, header = next(((n, h) for n, h in lines if not _blank(h)), (0, []))
        if not header:
            raise ValueError(f"{path}: the file is empty; a party table needs a header line")
        header = [h.strip() for h in header]
        if any("\x00" in h for h in header):
            raise ValueError(f"{path}, line {line}: the header holds NUL characters; {_NUL}")
        _check_header(f"{path}, line {line}", header)
    except ValueError:
        f.close()
        raise
    return header, ((n, fields) for n, fields in lines if not _blank(fields))


def _check_header(where: str, header: list[str]) -> None:
    """Refuse a header that names a column twice (the second would read as the first) or not at all."""
    seen: dict[str, int] = {}
    for j, name in enumerate(header):
        if not name:
            raise ValueError(f"{where}: column {j + 1} of the header has no name; every column needs a unique name")
        if name in seen:
            raise ValueError(
                f"{where}: the header names {name!r} twice (columns {seen[name] + 1} and {j + 1}); "
                "column names must be unique"
            )
        seen[name] = j


_EXACT = {16: 2**11, 32: 2**24, 64: 2**53}  # float bits -> the bound below which every whole number is exact


def _whole(value: float | decimal.Decimal) -> bool:
    """Whether a float or decimal is a whole number (so that it reads as the integer's text)."""
    if isinstance(value, decimal.Decimal):
        return value.is_finite() and value == value.to_integral_value()
    return math.isfinite(value) and value.is_integer()


def _parquet(path: Path, source: PartyTable) -> tuple[list[str], Callable[[_Reader], None]]:
    """A Parquet file's column names, and what reads its rows into a `_Reader` a batch at a time."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"{path}: reading Parquet needs pyarrow: pip install 'lvfl[parquet]'") from err
    unreadable = (OSError, pa.ArrowException)
    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
    except unreadable as err:
        raise ValueError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})") from None
    meta = schema.pandas_metadata or {}
    index = {c for c in meta.get("index_columns", []) if isinstance(c, str) and re.fullmatch(r"__index_level_\d+__", c)}
    stored = {name.strip(): name for name in schema.names if name not in index}  # pandas' row index is no column
    header = list(stored)
    _check_header(str(path), [n.strip() for n in schema.names if n not in index])
    named = {source.id_column, source.label_column, *(header if source.columns is None else source.columns)}
    for name in header:
        kind = schema.field(stored[name]).type
        kind = kind.value_type if pa.types.is_dictionary(kind) else kind
        if name not in named:
            continue  # not read: its type does not matter
        if pa.types.is_nested(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            raise ValueError(
                f"{path}: column {name!r} is of Parquet type {kind}, which has no text form a table column can "
                "take; store it as strings or numbers"
            )
        if pa.types.is_fixed_size_binary(kind):
            raise ValueError(f"{path}: column {name!r} is of Parquet type {kind}; store it as strings or numbers")

    def feed(reader: _Reader) -> None:
        wanted = [source.id_column, *([source.label_column] if source.label_column else []), *reader.columns]
        first = 0
        try:
            for batch in file.iter_batches(batch_size=PROGRESS_ROWS, columns=[stored[n] for n in wanted]):
                arrays = dict(zip(wanted, batch.columns, strict=True))
                kind = arrays[source.id_column].type
                exact = _EXACT.get(kind.bit_width) if pa.types.is_floating(kind) else None
                values = arrays[source.id_column].to_pylist()
                keys = [_id_text(path, first + i, source.id_column, v, exact).strip() for i, v in enumerate(values)]
                labels = None
                if source.label_column:
                    labels = [_text(v).strip() for v in arrays[source.label_column].to_pylist()]
                reader.add_rows(keys, range(first + 1, first + 1 + len(keys)), labels)
                for name, builder in zip(reader.columns, reader.builders, strict=True):
                    _add_parquet(builder, arrays[name])
                first += len(keys)
                reader.done(len(keys))
        except unreadable as err:
            raise ValueError(f"{path}: not a readable Parquet file ({str(err).splitlines()[0]})") from None
        finally:  # the batches' buffers: Arrow's allocator keeps freed memory for reuse (400 MB at a million rows)
            pa.default_memory_pool().release_unused()

    return header, feed


def _parquet_rows(files: list[Path]) -> int:
    """The rows of a table of Parquet files, from their metadata (0 for CSV, or where it cannot be read yet)."""
    if any(f.suffix.lower() != ".parquet" for f in files):
        return 0
    try:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except Exception:  # noqa: BLE001 - an unreadable file is refused by name when it is read
        return 0


def _add_parquet(builder: ColumnBuilder, values: Any) -> None:
    """A batch of one Parquet column: typed numbers as arrays, text by its distinct values, the rest by `_text`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type
    if builder.as_text or not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind)
        or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind)
    ):  # fmt: skip
        builder.add_texts([_text(v).strip() for v in values.to_pylist()])
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        null = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
        numbers = pc.cast(values, pa.float64(), safe=False).fill_null(0.0).to_numpy(zero_copy_only=False)
        builder.add_numbers(numbers, null)
    else:
        coded = values if pa.types.is_dictionary(kind) else values.dictionary_encode()
        uniques = [_text(v).strip() for v in coded.dictionary.to_pylist()]
        codes = coded.indices.fill_null(len(uniques)).to_numpy(zero_copy_only=False)
        builder.add_coded(codes, [*uniques, ""])  # a null: the empty text, a missing value


def _text(value: Any) -> str:
    """A Parquet value's text: "" for null, a whole float or decimal as its integer (`3.0` reads as `3`)."""
    if value is None:
        return ""
    if isinstance(value, float | decimal.Decimal) and _whole(value) and abs(value) < 2**53:
        return str(int(value))  # the same text as an integer column's (a part with nulls is float in pandas)
    return str(value)


def _id_text(path: Path, row: int, name: str, value: Any, exact: int | None) -> str:
    """A Parquet ID's text; a float ID must be a whole number that the float holds exactly."""
    if not isinstance(value, float | decimal.Decimal):
        return "" if value is None else str(value)
    where = f"{path}, row {row + 1}: the ID column {name!r}"
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{where} holds NaN (a missing ID); every row needs an ID")
    if not _whole(value):
        raise ValueError(f"{where} holds {value}, not a whole number; store the IDs as integers or text")
    if exact is not None and abs(value) > exact:
        raise ValueError(
            f"{where} holds {value}, above {exact}: the column's floats do not hold every whole number there, "
            "so the ID may have been rounded; store the IDs as integers or text"
        )
    return str(int(value))


def _feature_columns(source: PartyTable, file: Path, header: list[str]) -> list[str]:
    """The table's feature columns, refusing a config that names an absent column or makes an ID or label one."""
    path = source.path
    if source.label_column is not None and source.label_column == source.id_column:
        raise ValueError(f"{path}: the ID column {source.id_column!r} is also the `label_column`; name two columns")
    named = [source.id_column, *(source.columns or []), *([source.label_column] if source.label_column else [])]
    absent = [c for c in named if c not in header]
    if absent:
        hint = ""
        if len(header) == 1 and (sep := next((s for s in ";\t|" if s in header[0]), None)):
            hint = f"; the header seems to be separated by {sep!r}, a party table is comma-separated"
        elif close := difflib.get_close_matches(absent[0], header, n=1, cutoff=0.6):
            hint = f"; did you mean {close[0]!r}?"
        raise ValueError(f"{file}: no column {absent[0]!r} (the file's columns: {header}){hint}")
    if source.columns is not None and not source.columns:
        raise ValueError(f"{path}: `columns` is empty; name at least one feature column or leave it out")
    why = {source.id_column: ("ID column", "IDs only align the rows; as a feature each customer would get a column")}
    if source.label_column:
        why[source.label_column] = ("label column", "the model would read its own target (a label leak)")
    for option, names in [("columns", source.columns or []), ("categorical", source.categorical)]:
        for name in names:
            if name in why:
                what, reason = why[name]
                raise ValueError(f"{path}: `{option}` names the {what} {name!r}; {reason}: leave it out")
    for name in source.missing_columns:
        if name in why:
            raise ValueError(f"{path}: `missing_columns` names the {why[name][0]} {name!r}, which is no feature column")
    if source.columns is not None:
        twice = next((c for i, c in enumerate(source.columns) if c in source.columns[:i]), None)
        if twice is not None:
            raise ValueError(f"{path}: `columns` lists {twice!r} twice; list each feature column once")
    columns = list(source.columns) if source.columns is not None else [h for h in header if h not in why]
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
    return columns


class _Reader:
    """What `read_table` gathers over a table's files, a chunk of rows at a time."""

    def __init__(
        self,
        source: PartyTable,
        columns: list[str],
        as_text: bool | Collection[str],
        done: Callable[[int], None],
        rows: int = 0,
    ) -> None:
        self.source, self.columns, self.done = source, columns, done
        texts = set(source.categorical) | set(columns if as_text is True else as_text or ())
        self.builders = [ColumnBuilder(c in texts, rows) for c in columns]
        self.ids: list[str] = []
        self.first: dict[str, int] = {}  # ID -> its row (a second one is refused naming the first)
        self.labels: list[str] = []
        self._label_texts: dict[str, str] = {}  # one string per distinct label, not one per row
        self.places = Places()

    def start(self, file: Path, kind: str) -> None:
        """The next file's rows follow; `kind`: "line" (CSV) or "row" (Parquet)."""
        self.places.files.append(str(file))
        self.places.kinds.append(kind)
        self.places.starts.append(len(self.ids))

    def add_rows(self, keys: list[str], numbers: Iterator[int] | range, labels: list[str] | None) -> None:
        """A chunk's IDs (stripped), line or row numbers and labels; a missing or repeated ID, or label, is refused."""
        at = len(self.ids)
        self.places.numbers.extend(numbers)
        source = self.source
        for i, key in enumerate(keys):
            if key.lower() in MISSING:
                raise ValueError(
                    f"{self.places(at + i)}: the ID column {source.id_column!r} is missing a value ({key!r})"
                )
            row = self.first.setdefault(key, at + i)
            if row != at + i:
                raise ValueError(
                    f"{self.places(at + i)}: ID {key!r} occurs twice (first at {self.places(row)}); IDs must be unique"
                )
            if labels is not None:
                if labels[i].lower() in MISSING:
                    raise ValueError(f"{self.places(at + i)}: the label column {source.label_column!r} is missing")
                self.labels.append(self._label_texts.setdefault(labels[i], labels[i]))
        self.ids.extend(keys)


def _feed_csv(file: Path, header: list[str], records: Iterator[tuple[int, list[str]]], reader: _Reader) -> None:
    """A CSV's records into `reader`, `PROGRESS_ROWS` at a time."""
    source = reader.source
    id_at = header.index(source.id_column)
    label_at = header.index(source.label_column) if source.label_column else None
    ats = [header.index(c) for c in reader.columns]
    while chunk := list(itertools.islice(records, PROGRESS_ROWS)):
        for line, fields in chunk:
            if len(fields) != len(header):
                raise ValueError(f"{file}, line {line}: {len(fields)} fields, the header has {len(header)}")
        labels = None if label_at is None else [f[label_at].strip() for _, f in chunk]
        reader.add_rows([f[id_at].strip() for _, f in chunk], (n for n, _ in chunk), labels)
        for at, builder in zip(ats, reader.builders, strict=True):
            builder.add_texts([f[at].strip() for _, f in chunk])
        reader.done(len(chunk))


def read_table(
    source: PartyTable, done: Callable[[int], None] | None = None, as_text: bool | Collection[str] = False
) -> Table:
    """Read one party's table: CSV (the `csv` module) or Parquet (pyarrow), a file or a directory of them.

    What cannot be used is refused naming the file, the column and the line (Parquet: the row). `done(n)` is told
    as each chunk of `PROGRESS_ROWS` rows (and the last ones) is read. Columns listed in `source.categorical` are
    kept as their texts; `as_text` keeps these columns (True: every column) so too, for readers that take values
    as texts (serving, new rows whose encoder is categorical).
    """
    path = Path(source.path)
    limit = source.max_levels
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{path}: `max_levels` must be a whole number >= 1, got {limit!r}")
    codec = _codec(source)
    files = _files(path)
    header: list[str] | None = None
    reader: _Reader | None = None
    for file in files:
        parquet = file.suffix.lower() == ".parquet"
        if parquet:
            own_header, feed = _parquet(file, source)
        else:
            own_header, records = _csv(file, codec)
        if header is None:
            header = own_header
            columns = _feature_columns(source, file, header)
            reader = _Reader(source, columns, as_text, done or (lambda n: None), _parquet_rows(files))
        elif own_header != header:
            raise ValueError(f"{file}: its columns {own_header} differ from {files[0]}'s {header}")
        reader.start(file, "row" if parquet else "line")
        if parquet:
            feed(reader)
        else:
            _feed_csv(file, header, records, reader)
    if not reader.ids:
        raise ValueError(f"{path}: no rows below the header")
    data = [builder.finish() for builder in reader.builders]
    labels = reader.labels if source.label_column else None
    return Table(path, reader.ids, reader.columns, data, reader.places, labels)
