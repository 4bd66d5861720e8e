"""A small CSV a user hands lvfl (an attacker's side knowledge, a deployed attack's guesses), read bounded.

Every refusal is one line naming where the file was given: a file over its size limit is refused before it is read,
and bytes that are not UTF-8 or a field over the csv module's limit are refused with their place, never with a
traceback.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

__all__ = ["MAX_TEXT_BYTES", "read_csv_rows", "read_text"]

MAX_TEXT_BYTES = 256 * 2**20  #: the largest such file read, checked before reading


def read_text(path: Path, where: str, max_bytes: int | None = None) -> str:
    """The UTF-8 text at `path`; `where` names it in a refusal (e.g. ``side_knowledge='known.csv'``).

    Raises:
        ValueError: over `max_bytes` (`MAX_TEXT_BYTES` by default), checked before reading, or not UTF-8 text.
    """
    limit = MAX_TEXT_BYTES if max_bytes is None else max_bytes
    size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{where}: {size:,} bytes; at most {limit:,} are read")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text (byte {err.start}: {err.reason})") from None


def read_csv_rows(path: Path, where: str, max_bytes: int | None = None) -> list[list[str]]:
    """Every row of the CSV at `path`, read with `read_text`.

    Raises:
        ValueError: as `read_text`, or a row the csv module refuses (a field over its limit), naming its line.
    """
    reader = csv.reader(io.StringIO(read_text(path, where, max_bytes), newline=""))
    try:
        return list(reader)
    except csv.Error as err:
        raise ValueError(f"{where}, line {reader.line_num}: {err}") from None
