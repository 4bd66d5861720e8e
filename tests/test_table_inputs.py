"""Party tables that would be read wrong are refused naming the file, the column and the line (Parquet: the row).

Each case here was once read silently another way (a duplicated header name read twice the same column, a float
Parquet ID became "1000.0", a BOM renamed the first column, an unclosed quote swallowed the rest of the file) or
ended in a raw traceback (`_csv.Error`, `UnicodeDecodeError`, `ArrowInvalid`).
"""

from __future__ import annotations

import decimal
import gzip
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lvfl.datamodules.table_encoding import fit_encoders
from lvfl.datamodules.table_files import PartyTable, read_table


def write(path: Path, text: str, encoding: str = "utf-8") -> str:
    path.write_bytes(text.encode(encoding))
    return str(path)


# ---------------------------------------------------------------------------------------------------- headers
@pytest.mark.parametrize(
    ("header", "match"),
    [
        ("cid,g1,g1", r"t.csv, line 1: the header names 'g1' twice \(columns 2 and 3\)"),
        ("cid,g1, g1 ", r"t.csv, line 1: the header names 'g1' twice"),  # names are stripped
        ("cid,,g1", r"t.csv, line 1: column 2 of the header has no name"),
        ("cid,g1,", r"t.csv, line 1: column 3 of the header has no name"),
    ],
    ids=["duplicate", "duplicate-after-strip", "empty-name", "trailing-comma"],
)
def test_a_header_naming_a_column_twice_or_not_at_all_is_refused(tmp_path: Path, header: str, match: str) -> None:
    path = write(tmp_path / "t.csv", f"{header}\n1,a,b\n2,c,d\n")
    with pytest.raises(ValueError, match=match):
        read_table(PartyTable(path, id_column="cid"))


def test_a_parquet_file_with_a_duplicated_column_name_is_refused(tmp_path: Path) -> None:
    data = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array([1, 2]), pa.array([3, 4])], names=["cid", "x", "x"])
    pq.write_table(data, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"t.parquet: the header names 'x' twice \(columns 2 and 3\)"):
        read_table(PartyTable(str(tmp_path / "t.parquet"), id_column="cid"))


def test_blank_lines_before_the_header_are_skipped_and_line_numbers_stay_the_files(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "\n\ncid,x\n1,2\n1,3\n")
    with pytest.raises(ValueError, match=r"t.csv, line 5: ID '1' occurs twice \(first at .*t.csv, line 4\)"):
        read_table(PartyTable(path, id_column="cid"))


def test_an_empty_or_header_only_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"e.csv: the file is empty; a party table needs a header line"):
        read_table(PartyTable(write(tmp_path / "e.csv", "\n \n"), id_column="cid"))
    with pytest.raises(ValueError, match=r"h.csv: no rows below the header"):
        read_table(PartyTable(write(tmp_path / "h.csv", "cid,x\n"), id_column="cid"))


def test_a_semicolon_separated_file_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "cid;x\n1;2\n")
    with pytest.raises(ValueError, match=r"no column 'cid' .*separated by ';', a party table is comma-separated"):
        read_table(PartyTable(path, id_column="cid"))


# ---------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"columns": ["x", "y"]}, r"`columns` names the label column 'y'; the model would read its own target"),
        ({"columns": ["cid", "x"]}, r"`columns` names the ID column 'cid'; IDs only align the rows"),
        ({"categorical": ["cid"]}, r"`categorical` names the ID column 'cid'; IDs only align the rows"),
        ({"categorical": ["y"]}, r"`categorical` names the label column 'y'; the model would read its own target"),
        ({"missing_columns": {"y": "mode"}}, r"`missing_columns` names the label column 'y', which is no feature"),
        ({"columns": ["x", "z", "x"]}, r"`columns` lists 'x' twice; list each feature column once"),
        ({"label_column": "cid"}, r"the ID column 'cid' is also the `label_column`"),
        ({"max_levels": 0}, r"`max_levels` must be a whole number >= 1, got 0"),
    ],
    ids=["label-in-columns", "id-in-columns", "id-categorical", "label-categorical", "label-missing", "repeat",
         "id-is-label", "max-levels"],
)  # fmt: skip
def test_a_config_that_feeds_the_id_or_label_to_the_model_is_refused(tmp_path: Path, options, match) -> None:
    path = write(tmp_path / "t.csv", "cid,x,z,y\n1,2,3,ok\n2,3,4,bad\n")
    source = PartyTable(path, **{"id_column": "cid", "label_column": "y", **options})
    with pytest.raises(ValueError, match=rf"t.csv: {match}"):
        read_table(source)


# ---------------------------------------------------------------------------------------------------- Parquet IDs
def test_whole_float_parquet_ids_read_as_integers_and_match_an_integer_part(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    pq.write_table(pa.table({"cid": pa.array([999, 1000], pa.int64()), "g": [1.0, 2.0]}), parts / "a.parquet")
    ids = pa.array([1001.0, 2.0**53], pa.float64())  # float64: pandas' integer column with a null elsewhere
    pq.write_table(pa.table({"cid": ids, "g": [3.0, None]}), parts / "b.parquet")
    table = read_table(PartyTable(str(parts), id_column="cid", missing="mean"))
    assert table.ids == ["999", "1000", "1001", str(2**53)]
    assert [row[0] for row in table.values] == ["1", "2", "3", ""]  # whole floats read as an int column's text
    decimals = pa.array([decimal.Decimal("7.00"), decimal.Decimal("8")], pa.decimal128(10, 2))
    pq.write_table(pa.table({"cid": decimals, "g": ["a", "b"]}), tmp_path / "d.parquet")
    assert read_table(PartyTable(str(tmp_path / "d.parquet"), id_column="cid")).ids == ["7", "8"]


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (pa.array([1000.0, 1000.5], pa.float64()), r"row 2: the ID column 'cid' holds 1000.5, not a whole number"),
        (pa.array([1000.0, math.nan], pa.float64()), r"row 2: the ID column 'cid' holds NaN \(a missing ID\)"),
        (pa.array([1000.0, None], pa.float64()), r"row 2: the ID column 'cid' is missing a value \(''\)"),
        (pa.array(["a", None]), r"row 2: the ID column 'cid' is missing a value \(''\)"),
        (pa.array([1.0, 2.0**25], pa.float32()), r"row 2: the ID column 'cid' holds 33554432.0, above 16777216"),
        (pa.array([1.0, 2.0**53 + 2], pa.float64()), r"row 2: the ID column 'cid' holds 9007199254740994.0, above"),
    ],
    ids=["fraction", "nan", "null-float", "null-text", "float32-inexact", "float64-inexact"],
)
def test_a_parquet_id_that_is_no_whole_number_or_missing_is_refused_by_row(tmp_path: Path, ids, match) -> None:
    pq.write_table(pa.table({"cid": ids, "g": [1.0, 2.0]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=rf"t.parquet, {match}"):
        read_table(PartyTable(str(tmp_path / "t.parquet"), id_column="cid"))


def test_a_parquet_row_of_nulls_is_refused_not_skipped_as_a_blank_line(tmp_path: Path) -> None:
    data = pa.table({"cid": ["a", None, "c"], "x": [1.0, None, 3.0], "unused": ["p", "q", None]})
    pq.write_table(data, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"t.parquet, row 2: the ID column 'cid' is missing a value"):
        read_table(PartyTable(str(tmp_path / "t.parquet"), id_column="cid", columns=["x"]))


def test_a_missing_value_text_is_no_id(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "cid,x\n1,2\nNaN,3\n")
    with pytest.raises(ValueError, match=r"t.csv, line 3: the ID column 'cid' is missing a value \('NaN'\)"):
        read_table(PartyTable(path, id_column="cid"))


def test_pandas_row_index_is_no_column_and_binary_columns_are_refused_when_used(tmp_path: Path) -> None:
    data = pa.table({"cid": ["a", "b"], "x": [1.0, 2.0], "__index_level_0__": [7, 9], "blob": [b"\x00", b"\x01"]})
    meta = {"index_columns": ["__index_level_0__"], "columns": []}
    data = data.replace_schema_metadata({b"pandas": json.dumps(meta).encode()})
    pq.write_table(data, tmp_path / "t.parquet")
    path = str(tmp_path / "t.parquet")
    table = read_table(PartyTable(path, id_column="cid", columns=["x"]))  # blob unused: its type does not matter
    assert table.columns == ["x"]
    assert table.values == [["1"], ["2"]]
    with pytest.raises(ValueError, match=r"t.parquet: column 'blob' is of Parquet type binary"):
        read_table(PartyTable(path, id_column="cid"))  # every column but the ID: blob too, not the row index


def test_a_file_that_is_not_parquet_is_refused_by_name(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", "cid,x\n1,2\n")
    with pytest.raises(ValueError, match=r"t.parquet: not a readable Parquet file \(.*magic bytes"):
        read_table(PartyTable(path, id_column="cid"))


# ---------------------------------------------------------------------------------------------------- levels
def many_levels(tmp_path: Path, count: int, **options) -> tuple:
    rows = "".join(f"{i},s{i}\n" for i in range(count))
    source = PartyTable(write(tmp_path / "t.csv", f"cid,shop\n{rows}"), id_column="cid", **options)
    table = read_table(source)
    return table, source, np.arange(count)


def test_a_categorical_column_with_more_levels_than_max_levels_is_refused_for_onehot_only(tmp_path: Path) -> None:
    table, source, train = many_levels(tmp_path, 1001)
    with pytest.raises(
        ValueError,
        match=r"t.csv: column 'shop' has 1001 levels in the training rows, more than the table's max_levels=1000 "
        r"for encoding: onehot .*`encoding: codes` with an embedding party model \(lvfl.models.TabularMLP, DeepFM "
        r"or WideDeep\), or raise the table's `max_levels`",
    ):
        fit_encoders(table, source, train, onehot=True)
    (codes,) = fit_encoders(table, source, train, onehot=False)  # one code column: no limit
    assert codes.cardinalities == [1002]  # the levels and <unseen>
    table, source, train = many_levels(tmp_path, 1001, max_levels=1001)
    (onehot,) = fit_encoders(table, source, train, onehot=True)
    assert len(onehot.output_names) == 1002


# ---------------------------------------------------------------------------------------------------- encodings
def test_a_utf8_byte_order_mark_is_no_part_of_the_first_column_name(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "cid,x\n1,2\n", encoding="utf-8-sig")
    table = read_table(PartyTable(path, id_column="cid"))
    assert (table.ids, table.columns) == (["1"], ["x"])


def test_latin1_is_refused_by_line_as_utf8_and_read_with_its_encoding(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "cid,name\n1,Muller\n2,Müller\n", encoding="latin-1")
    with pytest.raises(
        ValueError,
        match=r"t.csv, line 3: the file does not decode as 'utf-8' \(byte 0xfc\); set the table's `encoding` .*"
        r"`encoding: latin-1`",
    ):
        read_table(PartyTable(path, id_column="cid"))
    assert read_table(PartyTable(path, id_column="cid", encoding="latin-1")).values == [["Muller"], ["Müller"]]


def test_utf16_is_named_in_the_hint_and_read_with_its_encoding(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", "cid,x\n1,2\n", encoding="utf-16")  # with a byte-order mark
    with pytest.raises(
        ValueError, match=r"t.csv, line 1: .*UTF-16 byte-order mark: set the table's `encoding: utf-16`"
    ):
        read_table(PartyTable(path, id_column="cid"))
    assert read_table(PartyTable(path, id_column="cid", encoding="utf-16")).ids == ["1"]
    bare = write(tmp_path / "bare.csv", "cid,x\n1,2\n", encoding="utf-16-le")  # no mark: it decodes, with NULs
    with pytest.raises(ValueError, match=r"bare.csv, line 1: the header holds NUL characters.*`encoding: utf-16-le`"):
        read_table(PartyTable(bare, id_column="cid"))


@pytest.mark.parametrize("encoding", ["utf-9", "onehot", "base64"])
def test_an_unknown_encoding_is_refused_naming_the_option(tmp_path: Path, encoding: str) -> None:
    path = write(tmp_path / "t.csv", "cid,x\n1,2\n")
    with pytest.raises(ValueError, match=rf"t.csv: `encoding` '{encoding}' is not a text encoding Python knows"):
        read_table(PartyTable(path, id_column="cid", encoding=encoding))


def test_a_compressed_file_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_bytes(gzip.compress(b"cid,x\n1,2\n"))
    with pytest.raises(ValueError, match=r"t.csv, line 1: the file does not decode .*gzip-compressed"):
        read_table(PartyTable(str(tmp_path / "t.csv"), id_column="cid"))


# ---------------------------------------------------------------------------------------------------- quoting
def test_a_field_over_the_csv_size_limit_is_refused_by_line(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", f"cid,x\n1,2\n{'9' * 200_000},3\n")
    with pytest.raises(
        ValueError, match=r"t.csv, line 3: a field longer than 131072 characters \(the csv module's field size limit\)"
    ):
        read_table(PartyTable(path, id_column="cid"))


def test_an_unclosed_quote_is_refused_instead_of_swallowing_the_rest_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", 'cid,x\n1,2\n2,"3\n3,4\n4,5\n')
    with pytest.raises(ValueError, match=r"t.csv, line 3: a quote \(\"\) opened in this record is never closed"):
        read_table(PartyTable(path, id_column="cid"))
    path = write(tmp_path / "u.csv", 'cid,x\n1,2\n2,"3"4\n')
    with pytest.raises(ValueError, match=r"u.csv, line 3: ',' expected after '\"'"):
        read_table(PartyTable(path, id_column="cid"))


def test_a_record_spanning_lines_is_named_by_the_line_it_starts_at(tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", 'cid,note\n1,"two\nlines"\n2, "quoted"\n2,x\n')
    with pytest.raises(ValueError, match=r"t.csv, line 5: ID '2' occurs twice \(first at .*t.csv, line 4\)"):
        read_table(PartyTable(path, id_column="cid"))
    path = write(tmp_path / "u.csv", 'cid,note\n1,"two\nlines"\n2, "quoted"\n')
    assert read_table(PartyTable(path, id_column="cid")).values == [["two\nlines"], ["quoted"]]
