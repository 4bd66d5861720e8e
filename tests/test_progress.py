"""`lvfl.progress.Phase`: a bar on a terminal, lines elsewhere (at its end, every `EVERY` s), its figures kept."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import pytest

import lvfl.progress as progress
from lvfl.crypto import ecdh_blinding
from lvfl.crypto.ecdh_blinding import PSIKey
from lvfl.progress import Phase


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_phase_ends_with_its_count_and_time_and_keeps_its_figures() -> None:
    out = io.StringIO()
    with Phase("party0: reading its table", total=5, stream=out) as phase:
        phase.advance(2)
        phase.advance(3)
    assert out.getvalue().splitlines() == [
        f"party0: reading its table: 5 rows in {phase.seconds:.1f} s, peak memory {phase.peak_mb:,.0f} MB"
    ]
    assert phase.count == 5
    assert phase.seconds >= 0
    assert phase.peak_mb > 10  # a Python process with torch loaded holds far more than 10 MB


def test_a_long_phase_prints_a_line_every_so_often(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 103.0, 111.0, 115.0, 122.0, 130.0])  # enter, then one reading per advance, then exit
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with Phase("party1: PSI, hashing and blinding its IDs", total=40, unit="IDs", stream=out) as phase:
        for _ in range(4):
            phase.advance(10)
    assert out.getvalue().splitlines() == [
        "party1: PSI, hashing and blinding its IDs: 20 of 40 IDs so far, 11 s",  # 11 s after the start
        "party1: PSI, hashing and blinding its IDs: 40 of 40 IDs so far, 22 s",  # 11 s after that line
        f"party1: PSI, hashing and blinding its IDs: 40 IDs in 30.0 s, peak memory {phase.peak_mb:,.0f} MB",
    ]


def test_on_a_terminal_a_phase_draws_a_bar_and_no_lines() -> None:
    out = Terminal()
    with Phase("party0: encoding its columns", total=3, unit="columns", stream=out) as phase:
        for _ in range(3):
            phase.advance()
    drawn = out.getvalue()
    assert "\r" in drawn
    assert "party0: encoding its columns" in drawn
    assert "3/3" in drawn
    assert " in 0." not in drawn  # the closing line is for where no bar draws


def test_a_failed_phase_keeps_its_time_and_prints_no_closing_line() -> None:
    out = io.StringIO()
    phase = Phase("party0: reading its table", stream=out)

    def fails() -> None:
        with phase:
            phase.advance(7)
            raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        fails()
    assert out.getvalue() == ""
    assert phase.count == 7


def test_a_psi_key_reports_each_chunk_as_it_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """On workers, `done` hears of each chunk, in order, and the counts add up to the batch; here, of all at once."""
    monkeypatch.setattr(ecdh_blinding, "PARALLEL_FROM", 10)
    monkeypatch.setattr(ecdh_blinding, "CHUNK", 4)
    ids = [f"c{i}".encode() for i in range(11)]
    heard: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        on_workers = PSIKey(bytes(range(32)), pool)
        blinded = on_workers.blind(ids, heard.append)
        assert heard == [4, 4, 3]
        heard.clear()
        again = on_workers.reblind(blinded, heard.append)
        assert heard == [4, 4, 3]
    heard.clear()
    here = PSIKey(bytes(range(32)))
    assert here.blind(ids, heard.append) == blinded  # the same points either way
    assert here.reblind(blinded) == again
    assert heard == [11]
