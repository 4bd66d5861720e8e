"""The suite's tiers: a test that starts a process is marked `slow`, so `make test-fast` never waits on one.

`make test-fast` (``-m "not slow and not gpu"``) is the developer's answer in minutes: unit and in-process tests.
What makes a test slow on a small machine is mostly a process of its own (an `lvfl` command, a launch, a pool of
workers: each imports PyTorch, a few seconds before it does anything). A list of such tests kept by hand goes
stale the day someone adds one, so the tier is checked instead: while an unmarked test's fixtures and body run,
every process started through `subprocess.Popen` or `multiprocessing` is recorded, and the test fails, naming the
command, unless it carries the `slow` mark. Fixtures of a wider scope (module, session) are charged to the first
test that uses them, as pytest sets them up there.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest


@contextmanager
def processes_started() -> Iterator[list[str]]:
    """Within the block, the commands of the processes started (`subprocess.Popen`, `multiprocessing`), in order."""
    started: list[str] = []
    popen_init: Callable[..., None] = subprocess.Popen.__init__
    process_start: Callable[..., None] = multiprocessing.process.BaseProcess.start

    def recording_popen(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        started.append(" ".join(map(str, args)) if isinstance(args, list | tuple) else str(args))
        popen_init(self, args, *rest, **kwargs)

    def recording_start(self: multiprocessing.process.BaseProcess) -> None:
        started.append(f"multiprocessing {self.name}")
        process_start(self)

    subprocess.Popen.__init__ = recording_popen  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = recording_start  # type: ignore[method-assign]
    try:
        yield started
    finally:
        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start = process_start  # type: ignore[method-assign]


def check_tier(item: pytest.Item, started: list[str]) -> None:
    """Fail `item` if it started a process and is not marked `slow` (the fast tier must not wait on processes)."""
    if started and item.get_closest_marker("slow") is None:
        first = started[0] if len(started[0]) <= 200 else started[0][:200] + "..."
        pytest.fail(
            f"{item.nodeid} starts {len(started)} process(es) (first: {first}) and is not marked slow; "
            "mark it @pytest.mark.slow so that make test-fast stays fast (tests/tiers.py)",
            pytrace=False,
        )
