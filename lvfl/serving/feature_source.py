"""`FeatureSource`: a serving party's own table, encoded once, looked up by ID, read again when its files change.

The table is what the party trained on: a CSV or Parquet file or a folder of parts (`lvfl.datamodules.table_files`),
with the party's ID column and the raw columns its export's encoders read. Every row is encoded and scaled once
when read (`ExportedParty.encode`), so a request costs a lookup. Before a request the files' names, sizes and
modification times are compared with those read (at most every `check_every` seconds); a changed table is read
again whole and replaces the old one at once, and a table that cannot be read (a file half-written) leaves the old
one serving, with a warning naming the file, until it can.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lvfl.datamodules.table_files import SUFFIXES, PartyTable, read_table
from lvfl.serving.export_folder import ExportedParty

__all__ = ["FeatureSource", "Lookup"]

log = logging.getLogger("lvfl.serve")


@dataclass(frozen=True)
class Lookup:
    """The rows of some requested IDs that a table holds: their positions in the request and their features."""

    held: list[bool]  # per requested ID
    features: torch.Tensor  # (held rows, *input shape), in request order


def _signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """The table's files with their sizes and modification times: what tells that it changed."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
    else:
        files = [path]
    out = []
    for file in files:
        try:
            stat = file.stat()
        except OSError:
            continue
        out.append((file.name, stat.st_size, stat.st_mtime_ns))
    return tuple(out)


class FeatureSource:
    """A party's table, encoded by its export, by ID (see the module docstring).

    Args:
        path: the table (file or folder of parts).
        party: the party's export (its ID column, encoders and scaling).
        encoding: the CSV files' text encoding (as `PartyTable.encoding`).
        check_every: the least number of seconds between two checks of the files.

    Raises:
        ValueError, FileNotFoundError: the table cannot be read at start, or lacks a column the export reads.
    """

    def __init__(self, path: str | Path, party: ExportedParty, encoding: str = "utf-8", check_every: float = 1.0):
        self.path, self.party, self.encoding, self.check_every = Path(path), party, encoding, float(check_every)
        self._lock = threading.Lock()
        self._checked = 0.0
        self.reloads = 0
        self.generation = -1  # which reading of the table is served (`_load` counts them)
        self._load()

    def _load(self) -> None:
        signature = _signature(self.path)
        source = PartyTable(str(self.path), self.party.id_column, columns=self.party.columns, encoding=self.encoding)
        table = read_table(source, as_text=True)  # values as written: the encoders take texts
        index: dict[str, int] = {}
        rows, keys, skipped = [], [], []
        features = self._encode_rows(table.values, table.origins, skipped)
        for position, key in enumerate(table.ids):
            if position not in skipped:
                index[key] = len(keys)
                keys.append(key)
                rows.append(position)
        if skipped:
            log.warning("%s: %d rows of %s cannot be encoded and are not served (the first is %s)",
                        self.party.party, len(skipped), self.path, table.origins[skipped[0]])  # fmt: skip
        self._table = (index, features[rows])  # replaced whole: a lookup reads one table, old or new
        self._signature = signature
        self.rows = len(keys)
        self.generation += 1

    def _encode_rows(self, values: list[list[str]], origins: list[str], skipped: list[int]) -> torch.Tensor:
        """Every row encoded; rows the encoders refuse are left out, their positions put in `skipped`."""
        try:
            return self.party.encode(values, origins)
        except ValueError:
            pass
        good, out = [], []
        for position, (row, origin) in enumerate(zip(values, origins, strict=True)):
            try:
                out.append(self.party.encode([row], [origin]))
                good.append(position)
            except ValueError as err:
                skipped.append(position)
                if len(skipped) == 1:
                    log.warning("%s: %s", self.party.party, err)  # the first refused value, by line and column
        features = torch.cat(out) if out else torch.zeros(0, *self.party.input_shape)
        full = torch.zeros(len(values), *self.party.input_shape)
        full[good] = features
        return full

    def refresh(self) -> None:
        """Read the table again if its files changed since it was read (checked at most every `check_every` s)."""
        now = time.monotonic()
        if now - self._checked < self.check_every:
            return
        with self._lock:
            if now - self._checked < self.check_every:
                return
            self._checked = now
            if _signature(self.path) == self._signature:
                return
            try:
                self._load()
            except (OSError, ValueError) as err:
                log.warning("%s: %s changed but cannot be read; still serving the rows read before: %s",
                            self.party.party, self.path, err)  # fmt: skip
                return
            self.reloads += 1
            log.info("%s: read %s again (%d rows)", self.party.party, self.path, self.rows)

    def lookup(self, ids: Sequence[str]) -> Lookup:
        """Which of `ids` the table holds, and their encoded features in request order."""
        self.refresh()
        index, features = self._table  # one consistent table, even while another is read
        positions = [index.get(k) for k in ids]
        found = [p for p in positions if p is not None]
        return Lookup([p is not None for p in positions], features[found] if found else features[:0])

    def snapshot(self) -> tuple[list[str], torch.Tensor]:
        """The IDs served now and their encoded features, row by row, from one reading of the table."""
        self.refresh()
        index, features = self._table
        return list(index), features

    @property
    def ids(self) -> list[str]:
        """The IDs served now, in the table's order."""
        return list(self._table[0])

    def __contains__(self, key: str) -> bool:
        return key in self._table[0]
