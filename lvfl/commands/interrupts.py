"""A command stopped by SIGINT or SIGTERM: exit status 130 or 143 and one line, never a silent 0 or a traceback.

`reporting_interrupts` wraps a subcommand; `lvfl.commands.fit.VFLCLI` turns a stop inside a fit into `Interrupted`
with the line that names the checkpoint to resume from.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from lightning.pytorch.utilities.rank_zero import rank_zero_only

__all__ = ["SIGNALS", "Interrupted", "reporting_interrupts"]


class Interrupted(BaseException):
    """A subcommand stopped by SIGINT or SIGTERM: `main` prints `message` (one line) and exits with 128 + `signum`.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` on the way out takes it for an error.
    """

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum, self.message = signum, message


class _SignalLog:
    """The first SIGINT or SIGTERM the running command received (None: none)."""

    received: int | None = None


SIGNALS = _SignalLog()


@contextlib.contextmanager
def reporting_interrupts(subcommand: str) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into exit status 130 and 143 with one line on stderr (for fit: where to resume).

    Left to Lightning (2.6), a fit stopped by SIGTERM ends with status 0 (its `SIGTERMException` is a bare
    SystemExit) and one stopped by SIGINT with 1, both silently; before the fit starts, SIGTERM kills the process.
    The handler installed here records the signal. SIGINT raises KeyboardInterrupt as Python's own handler does;
    so does SIGTERM where it is the process's handler. Inside a fit Lightning installs its SIGTERM handler, which
    calls this one and stops the fit at the next batch: the last completed epoch's `last.ckpt` stays the file to
    resume from (checkpoints are written atomically). A signal ignored when lvfl starts stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def record(signum: int, frame: FrameType | None) -> None:
        if SIGNALS.received is None:
            SIGNALS.received = signum
        if signum == signal.SIGINT or signal.getsignal(signum) is record:
            raise KeyboardInterrupt  # outside a fit's own SIGTERM handling: stop here

    SIGNALS.received = None
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    installed = [signum for signum, handler in previous.items() if handler is not signal.SIG_IGN]
    for signum in installed:
        signal.signal(signum, record)
    try:
        yield
    except Interrupted as stop:
        _exit_interrupted(stop.signum, stop.message)
    except (KeyboardInterrupt, SystemExit):
        if SIGNALS.received is None:
            raise
        name = signal.Signals(SIGNALS.received).name
        who = f"lvfl {subcommand}" if subcommand else "lvfl"
        _exit_interrupted(SIGNALS.received, f"{who}: stopped by {name} before it started running")
    finally:
        for signum in installed:
            signal.signal(signum, previous[signum])
        SIGNALS.received = None


def _exit_interrupted(signum: int, message: str) -> None:
    if getattr(rank_zero_only, "rank", 0) == 0:
        print(message, file=sys.stderr)
    raise SystemExit(128 + signum) from None
