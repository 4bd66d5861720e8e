"""Party processes started before the launcher knows their parts: the warm start of `lvfl launch`.

Why: a party process spends seconds importing PyTorch and Lightning, and the launcher spent as long again reading
the config (the party names come out of LightningCLI) before it could start any. Started first, by a launcher that
imports neither, the party processes import while the first of them reads the config for the launcher; each is then
given its part, the same command line, environment and log that a process started afterwards would get, and runs it
as `python -m lvfl party` does (`lvfl.commands.warm_party`). What a party runs and holds is the same either way: only
when its process began differs. A part that needs the process set up otherwise as it imports (another thread count,
another GPU) restarts the process from scratch with it.

This module is light (the standard library only): the launcher imports it before anything heavy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

__all__ = [
    "IMPORT_TIME",
    "LAUNCH_STARTED",
    "PARTY_IMPORTED",
    "PARTY_STARTED",
    "SUBCOMMANDS",
    "WarmParty",
    "needs_fresh_process",
    "take_front_door",
    "warm_start_possible",
]

#: environment variables `lvfl launch` sets for each party: when the launch began, when it started this party's
#: process, and (warm start) when that process had imported what a party needs
LAUNCH_STARTED, PARTY_STARTED, PARTY_IMPORTED = "LVFL_LAUNCH_STARTED", "LVFL_PARTY_STARTED", "LVFL_PARTY_IMPORTED"

#: the subcommands `lvfl party` runs (`lvfl party [SUBCOMMAND] ...`; fit when none is given)
SUBCOMMANDS = ("fit", "validate", "test", "predict")

#: variables read as a process imports or first uses PyTorch: a part that sets one otherwise than the warm process was
#: started with restarts the process with it
IMPORT_TIME = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")

#: the file descriptor a warm process answers the launcher on (its stdout is the party's console)
REPLY_FD = "LVFL_WARM_REPLY_FD"


def take_front_door(argv: list[str]) -> None:
    """Make this process `python -m lvfl ARGV` as far as Python can tell: `sys.argv` and the `__main__` module.

    `__main__` matters to the processes a party spawns (the PSI's workers, `lvfl.crypto.ecdh_blinding.worker_pool`):
    multiprocessing's spawn runs the parent's main module again in each child, unless it is a package's `__main__`
    as `python -m lvfl`'s is, and the warm process's own (`lvfl.commands.warm_party`) imports PyTorch and Lightning,
    about 900 MB in every worker.
    """
    front_door = importlib.util.find_spec("lvfl.__main__")  # found, not imported
    sys.argv = [front_door.origin, *argv]
    sys.modules["__main__"].__spec__ = front_door


def needs_fresh_process(current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether a part with environment `wanted` needs a fresh process, this one having imported under `current`."""
    return any(current.get(name) != wanted.get(name) for name in IMPORT_TIME)


def warm_start_possible() -> bool:
    """Whether this launch can start its parties warm.

    On POSIX (the reply pipe is an inherited descriptor), and with at most one GPU in sight. Why: on a host with
    several, each party gets a GPU of its own through `CUDA_VISIBLE_DEVICES`, and counting them takes PyTorch, which
    the launcher loads only then (a cold start).
    """
    if os.name != "posix":
        return False
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()]) <= 1
    gpus = [p for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    return len(gpus) <= 1 and not Path("/dev/kfd").exists()  # /dev/kfd: an AMD GPU, counted by torch.cuda as well


class WarmParty:
    """One party process, started to import before its part is known (`python -m lvfl.commands.warm_party`).

    The launcher asks it questions that need PyTorch (`ask`: the config's party names), then gives it its part
    (`run`), or lets it go (`close`). `env` is the environment it starts with: what is set as it imports (threads)
    must be what its part needs, or the part restarts it.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        read, write = os.pipe()
        self.started = time.time()
        try:
            self.process = subprocess.Popen(  # noqa: S603 - lvfl's own module
                [sys.executable, "-m", "lvfl.commands.warm_party"],
                stdin=subprocess.PIPE,
                env={**env, PARTY_STARTED: f"{self.started:.6f}", REPLY_FD: str(write)},
                pass_fds=(write,),
                text=True,
            )
        finally:
            os.close(write)
        self.replies: IO[str] = os.fdopen(read, "r")
        self.given = False

    def ask(self, question: dict[str, Any]) -> dict[str, Any] | None:
        """Send `question`, wait for the answer; None when the process ended without one (it failed to start)."""
        try:
            self._send(question)
        except (BrokenPipeError, OSError):
            return None
        line = self.replies.readline()
        return json.loads(line) if line else None

    def run(self, argv: list[str], env: Mapping[str, str], log: Path | None) -> subprocess.Popen | None:
        """Give the process its part: `python -m lvfl ARGV` with environment `env`; None if it ended before.

        `env` is what a process started now would get, but for when it started; its output is appended to `log`
        (None: the launcher's console).
        """
        try:
            self._send({"do": "run", "argv": argv, "env": dict(env), "log": None if log is None else str(log)})
        except (BrokenPipeError, OSError):  # it ended (a failed import): the launcher starts the part afresh
            return None
        self.given = True
        self._hang_up()
        return self.process

    def close(self) -> None:
        """Let a process that got no part go: it ends on its own once its input closes; killed after 10 s."""
        if self.given:
            return
        self._hang_up()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _send(self, message: dict[str, Any]) -> None:
        if self.process.stdin is None:
            raise BrokenPipeError("the warm party process's input is closed")
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def _hang_up(self) -> None:
        for stream in (self.process.stdin, self.replies):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # the process is gone: nothing left to close
                pass
