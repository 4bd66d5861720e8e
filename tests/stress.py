"""The test suite's stress mode: every core kept busy, and every `lvfl launch` on jittering links.

A federation must not depend on timing (docs/federation.md, "The message schedule"): a busy machine makes a run
slower, never different, and never red. `pytest --stress` (or ``LVFL_STRESS=1``) runs the suite as such a machine
would: one busy loop per core for the whole session, at the tests' own priority, and ``LVFL_LAUNCH_JITTER_MS`` set
so that every `lvfl launch` a test starts routes its parties through the link proxy with 0-50 ms of random delay
per chunk (`lvfl launch --jitter_ms`). The loops end with the session, or on their own after `MAX_SECONDS`, or when
the process that started them is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys

#: the jitter every launch gets in stress mode, in ms (each chunk: a uniform draw in [0, JITTER_MS])
JITTER_MS = 50.0
#: the longest a busy loop runs, in seconds, whatever happens to the session
MAX_SECONDS = 4 * 3600

_LOOP = (
    "import os, time\n"
    "parent, end = os.getppid(), time.monotonic() + {seconds}\n"
    "while time.monotonic() < end and os.getppid() == parent:\n"
    "    for _ in range(200_000):\n"
    "        pass\n"
)


def stress_requested(option: bool) -> bool:
    """Whether stress mode is on: the pytest option, or ``LVFL_STRESS=1`` in the environment."""
    return option or os.environ.get("LVFL_STRESS", "") not in ("", "0")


def start_busy_loops(count: int | None = None) -> list[subprocess.Popen]:
    """One busy Python loop per core (or `count`), each ending by itself (see the module docstring)."""
    code = _LOOP.format(seconds=MAX_SECONDS)
    return [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)  # noqa: S603 - our own loop
        for _ in range(count or os.cpu_count() or 1)
    ]


def stop(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        loop.kill()
    for loop in loops:
        loop.wait(timeout=30)
