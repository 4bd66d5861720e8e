"""A party table read into arrays reads and encodes as a plain row-by-row reading of the same file does.

The references here are written out in the tests: the csv module's fields stripped, Python's `float`, pyarrow's
`to_pylist`, and the encoding rules of `lvfl.datamodules.tables` applied value by value. The reader under test reads
in chunks (`PROGRESS_ROWS`), dictionary-encodes texts and takes typed Parquet numbers as arrays.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lvfl.datamodules import table_files
from lvfl.datamodules.table_columns import MISSING, Column, ColumnBuilder
from lvfl.datamodules.table_encoding import MISSING_LEVEL, UNSEEN, fit_encoders
from lvfl.datamodules.table_files import PartyTable, read_table

NUMS = ["1", " 2.5", "", "NA", "1_000", "-3e2", "nan", "7", "0.1", "4"]
CODES = ["007", "7", " 7.0", "", "b", "007", "null", "b", "x", "7"]
WORDS = ["x", "y", "NULL", "x", "  z ", "y", "x", "", "y", "w"]


def _csv(tmp_path: Path) -> str:
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["cid", "num", "code", "word"])
        for i, row in enumerate(zip(NUMS, CODES, WORDS, strict=True)):
            out.writerow([f"c{i}", *row])
    return str(path)


def _reference(texts: list[str], train: list[int], categorical: bool) -> np.ndarray:
    """The rules value by value: numbers and the training mean with an indicator, or one-hot levels and `<missing>`."""
    missing = [t.lower() in MISSING for t in texts]
    if not categorical:
        present = [float(texts[r]) for r in train if not missing[r]]
        fill = float(np.mean(np.asarray(present, dtype=np.float64)))
        value = [fill if m else float(t) for t, m in zip(texts, missing, strict=True)]
        return np.asarray([[v, float(m)] for v, m in zip(value, missing, strict=True)], dtype=np.float32)
    levels = [*sorted({texts[r] for r in train if not missing[r]}), MISSING_LEVEL, UNSEEN]
    out = np.zeros((len(texts), len(levels)), dtype=np.float32)
    for i, (t, m) in enumerate(zip(texts, missing, strict=True)):
        out[i, levels.index(MISSING_LEVEL if m else t if t in levels else UNSEEN)] = 1.0
    return out


@pytest.mark.parametrize("chunk", [3, 10_000], ids=["chunks-of-3", "one-chunk"])
def test_columns_read_in_chunks_encode_as_the_rules_applied_value_by_value(tmp_path: Path, monkeypatch, chunk) -> None:
    monkeypatch.setattr(table_files, "PROGRESS_ROWS", chunk)
    source = PartyTable(_csv(tmp_path), id_column="cid", categorical=["code"], missing="mean")
    table = read_table(source)
    train = [0, 1, 2, 3, 4, 6, 7]  # rows 5, 8 and 9 are not fitted on: code "x" and word "w" are unseen there
    encoders = fit_encoders(table, source, np.asarray(train), onehot=True)
    assert [e.kind for e in encoders] == ["numeric", "categorical", "categorical"]
    rows = np.arange(len(NUMS))
    for j, texts in enumerate([NUMS, CODES, WORDS]):
        got = encoders[j].encode_column(table.data[j], rows, table.origin)
        want = _reference([t.strip() for t in texts], train, categorical=j > 0)
        np.testing.assert_array_equal(got, want)
        assert got.tolist() == encoders[j].encode([t.strip() for t in texts], ["?"] * len(texts)).tolist()
    assert table.values[2] == ["", "7.0", "NULL"]  # row texts for row-wise readers: a level, a missing one as written
    assert table.values[4] == ["1000", "b", "z"]  # a number as its value's text; a categorical level as written
    assert table.origin(9) == f"{tmp_path / 't.csv'}, line 11"


def test_a_numeric_column_holds_no_python_object_per_row(tmp_path: Path) -> None:
    rows = "".join(f"{i},{i * 0.5},{i % 3}\n" for i in range(25_000))
    table = read_table(PartyTable(str(_write(tmp_path / "t.csv", f"cid,x,g\n{rows}")), "cid", categorical=["g"]))
    x, g = table.data
    assert (x.codes, x.texts) == (None, [])  # every value a number: one float64 array, nothing else
    assert x.numbers.dtype == np.float64
    assert x.numbers[7] == 3.5
    assert g.numbers is None
    assert g.codes.dtype == np.int32
    assert sorted(g.texts) == ["0", "1", "2"]
    assert len(table.origin.numbers) == 25_000
    assert table.origin.numbers.typecode == "q"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _text(value: object) -> str:
    """A Parquet value's text as a row-wise reader writes it: null empty, a whole float as its integer."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value).strip()


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def test_typed_parquet_columns_read_as_their_texts_would(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(table_files, "PROGRESS_ROWS", 4)
    data = {
        "cid": pa.array(range(9), pa.int64()),
        "ints": pa.array([1, None, 2**60 + 1, -5, 0, 7, None, 3, 2**53 + 1], pa.int64()),
        "floats": pa.array([0.5, math.nan, math.inf, None, 3.0, -math.inf, 1e300, 2.0**60, -0.0], pa.float64()),
        "f32": pa.array([0.1, 1.0, None, 2.5, 0.1, 8.0, 9.0, 1.5, -1.0], pa.float32()),
        "words": pa.array([" a", "b ", None, "7", "", "NA", "a", "1e3", " 2 "]),
        "dict": pa.array(["p", "q", None, "p", "5", " q", "p", "q", "r"]).dictionary_encode(),
        "flags": pa.array([True, False, None, True, True, False, True, False, True]),
    }
    pq.write_table(pa.table(data), tmp_path / "t.parquet")
    table = read_table(PartyTable(str(tmp_path / "t.parquet"), id_column="cid"))
    assert table.columns == list(data)[1:]
    for name, column in zip(table.columns, table.data, strict=True):
        for row, value in enumerate(data[name].to_pylist()):
            want = _text(value)
            number = _finite(want)
            if number is not None:  # a number: its value, whatever its text
                assert column.numbers[row] == number, (name, row)
            else:
                assert column.text(row) == want, (name, row)
                assert bool(column.missing()[row]) == (want.lower() in MISSING), (name, row)
    assert table.origin(5) == f"{tmp_path / 't.parquet'}, row 6"
    texts = read_table(PartyTable(str(tmp_path / "t.parquet"), id_column="cid"), as_text=True)
    assert [row[0] for row in texts.values] == [_text(v) for v in data["ints"].to_pylist()]  # 2**60 + 1 exact


def test_a_bad_value_is_still_refused_by_its_line_from_a_later_chunk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(table_files, "PROGRESS_ROWS", 2)
    path = _write(tmp_path / "t.csv", "cid,x\n1,1\n2,2\n3,3\n4,oops\n5,\n")
    source = PartyTable(str(path), id_column="cid", missing="mean")
    table = read_table(source)
    encoders = fit_encoders(table, source, np.arange(3), onehot=True)
    with pytest.raises(ValueError, match=r"t.csv, line 5: column 'x' holds 'oops', not a number"):
        encoders[0].encode_column(table.data[0], np.arange(5), table.origin)
    with pytest.raises(ValueError, match=r"t.csv, line 5: column 'x' holds 'oops', not a number, while its other"):
        fit_encoders(table, source, np.arange(5), onehot=True)
    with pytest.raises(ValueError, match=r"t.csv, line 6: column 'x' is missing a value \(missing: refuse"):
        fit_encoders(table, PartyTable(str(path), id_column="cid"), np.arange(3), onehot=True)


def built(texts: list[str], as_text: bool) -> Column:
    builder = ColumnBuilder(as_text)
    builder.add_texts(texts[:2])  # two chunks, as a reader adds them (the buffers grow from nothing)
    builder.add_texts(texts[2:])
    return builder.finish()


def test_a_column_of_texts_is_the_texts_it_was_built_from() -> None:
    texts = ["b", "a", "", "b", "NaN", "3"]
    column = built(texts, as_text=True)
    assert [column.text(r) for r in range(len(texts))] == texts
    assert column.missing().tolist() == [False, False, True, False, True, False]
    numeric = built(texts, as_text=False)
    assert numeric.numbers[5] == 3.0
    assert numeric.codes[5] == -1
    assert numeric.wordy().tolist()[:2] == [True, True]
