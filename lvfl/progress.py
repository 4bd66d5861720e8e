"""Progress of long set-up work (reading a table, the PSI, encoding): a bar on a terminal, lines elsewhere.

A bank's table of a million customers takes minutes to read, align and encode before the first step; a person
waiting on that must see what runs and how far it got. On a terminal each phase draws a tqdm bar (the count, its
rate and the time so far), left in place when the phase ends. Elsewhere (a log file, a launched party's output) a
bar would be carriage returns, so each phase prints lines instead: one when it has run `EVERY` seconds more since
the last (its count so far), and one when it ends, with its count, its time and the process's peak memory so far.
Both go to standard error, as Lightning's own notices do, so that standard output keeps what a run reports.

Every phase also keeps its figures (`Phase.seconds`, `Phase.count`, and the process's peak resident memory when it
ended, `Phase.peak_mb`); `lvfl.datamodules.tables.PartyTables.phases` holds those of its set-up.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

from tqdm import tqdm

__all__ = ["EVERY", "Phase", "peak_memory_mb"]

#: seconds between two lines of a phase that runs long, where no bar draws
EVERY = 10.0


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports kB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


@dataclass
class Phase:
    """One phase of long work: ``with Phase("party0: reading its table", unit="rows") as phase: phase.advance(n)``.

    Args:
        name: what runs, as the person reads it (its party first where a party runs it).
        total: how many `unit`s it will take, where known (a bar then shows how far it is); None: a running count.
        unit: what `advance` counts.
        stream: where it reports; standard error by default. A bar is drawn where it is a terminal.
    """

    name: str
    total: int | None = None
    unit: str = "rows"
    stream: IO[str] | None = None
    count: int = 0
    seconds: float = 0.0
    peak_mb: float = 0.0
    _started: float = field(default=0.0, repr=False)
    _last_line: float = field(default=0.0, repr=False)
    _bar: Any = field(default=None, repr=False)

    def __enter__(self) -> Phase:
        out = self._out()
        self._started = self._last_line = time.monotonic()
        if _is_terminal(out):
            scale = self.total is None or self.total >= 10_000  # 1.20M of 2.00M rows; but 3/3 columns
            self._bar = tqdm(total=self.total, desc=self.name, unit=f" {self.unit}", unit_scale=scale, file=out)
        return self

    def advance(self, n: int = 1) -> None:
        """Count `n` more units done; where no bar draws, a line if the last one is `EVERY` seconds old."""
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_line >= EVERY:
            self._last_line = now
            done = f"{self.count:,}" + (f" of {self.total:,}" if self.total is not None else "")
            self._print(f"{self.name}: {done} {self.unit} so far, {now - self._started:.0f} s")

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.seconds = time.monotonic() - self._started
        self.peak_mb = peak_memory_mb()
        if self._bar is not None:
            self._bar.close()
            return
        if kind is None:
            self._print(
                f"{self.name}: {self.count:,} {self.unit} in {self.seconds:.1f} s, peak memory {self.peak_mb:,.0f} MB"
            )

    def _out(self) -> IO[str]:
        return self.stream if self.stream is not None else sys.stderr

    def _print(self, line: str) -> None:
        print(line, file=self._out(), flush=True)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())
