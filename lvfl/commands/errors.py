"""How the `lvfl` command reports a refused input: one line naming the option, party or value, no traceback.

The boundary between a user error and a bug:

- **User errors** print ``lvfl: error: <message>`` and exit with status 2:
    - a refused command line or config file (jsonargparse's `argparse.ArgumentError`: unknown option, bad type,
      class path that does not import, unreadable YAML, missing config file);
    - a config value that the class it configures refuses: the `ValueError` / `TypeError` / `KeyError` that a
      constructor raises while jsonargparse instantiates `model:`, `data:` and their nested classes;
    - a `ValueError` / `TypeError` / `KeyError` that lvfl or Lightning raises *on purpose* (a ``raise`` statement in
      their code) at set-up or fit time, such as bad data, a refused backend or too many parties; lvfl's
      `FloatingPointError` for a party whose loss or embedding diverged (it names the party and the step);
      Lightning's `MisconfigurationException`, and an `ImportError` raised on purpose for an optional package that
      a chosen option needs (``pip install ...``);
    - a missing or unreadable file (`FileNotFoundError`, `IsADirectoryError`, `NotADirectoryError`,
      `PermissionError`), and a checkpoint lvfl cannot load safely (`lvfl.checkpoints.CheckpointError`, a
      `ValueError`: empty, truncated, not a checkpoint, or holding pickled objects), each naming the file.
- **Everything else is a bug** and keeps its full traceback: an `AttributeError`, a `RuntimeError`, or a
  `TypeError` / `KeyError` that no ``raise`` statement in lvfl or Lightning produced (``None[0]``, ``{}["x"]``).

``--debug`` (or ``LVFL_DEBUG=1``) turns the reporting off: every error propagates with its traceback and no warning
is silenced.

This module holds the policy (which errors are the user's, which third-party warnings are noise) and the boundary
that applies it, `reported_errors`, which every subcommand runs inside; how a jsonargparse refusal reads in one
line is `lvfl.commands.argument_errors`'. A signal is not an error: `lvfl.commands.fit.main` reports SIGINT and
SIGTERM itself (exit status 130, 143).
Warnings that lvfl itself emits are never silenced here: they are fixed where they arise, or kept on purpose
(``allow_insecure=True``, a repeated label release).
"""

from __future__ import annotations

import argparse
import contextlib
import linecache
import logging
import os
import re
import sys
import warnings
from argparse import ArgumentError
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from lvfl.commands.argument_errors import one_line, summarize_argument_error, with_section

__all__ = [
    "DEBUG_ENV",
    "OneLineParser",
    "debug_requested",
    "quiet_third_party",
    "reported_errors",
    "user_error_message",
]

DEBUG_ENV = "LVFL_DEBUG"
"""Environment variable that, set to 1 / true / yes / on, shows tracebacks like ``--debug``."""

_USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, FloatingPointError)
_FILE_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
_DELIBERATE_SOURCES = ("lvfl", "lightning", "jsonargparse")  # packages whose `raise ValueError(...)` is a refusal

# Third-party warnings and tips that say nothing about the run: lvfl passes argv to LightningCLI itself, keeps its
# in-memory data loaders at num_workers=0 on purpose, and reuses each experiment's checkpoint folder (last.ckpt).
_SILENCED_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r"LightningCLI's args parameter is intended to run from within Python", UserWarning),
    (r".*does not have many workers", UserWarning),
    (r".*smaller than the logging interval", UserWarning),
    (r"GPU available but not used", UserWarning),
    (r".*isinstance\(treespec, LeafSpec\)", FutureWarning),
    (r".*isinstance\(treespec, LeafSpec\)", DeprecationWarning),
    (r"(?s).*skip_none parameter was deprecated", Warning),
    (r"(?s).*was deprecated in v4\.\d+\.\d+", Warning),
    (r"(?s).*By default only one JsonargparseDeprecationWarning", Warning),
)
# Lightning's advertisements for litlogger / litmodels, and its set-up chatter, which would otherwise come before a
# one-line error and between a fit's lines: the seed (public, in the config), the accelerators found (the fit summary
# names the device used), the restore (lvfl prints which checkpoint it loaded) and why fit stopped (the summary says)
_SILENCED_LOG_PREFIXES = (
    "💡 Tip:",
    "Seed set to",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "IPU available:",
    "LOCAL_RANK:",
    "`Trainer.fit` stopped:",
    "Restoring states from the checkpoint path",
    "Restored all states from the checkpoint",
    "Loaded model weights from the checkpoint",
)
_RANK_ZERO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
)


# ------------------------------------------------------------------------------------------------- debug switch
def debug_requested(argv: Sequence[str], environ: dict[str, str] | None = None) -> tuple[bool, list[str]]:
    """Whether tracebacks were asked for (``--debug`` anywhere in `argv`, or ``LVFL_DEBUG``), and argv without it."""
    environ = os.environ if environ is None else environ
    rest = [a for a in argv if a != "--debug"]
    from_env = environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return from_env or len(rest) != len(argv), rest


# ------------------------------------------------------------------------------------------------- the boundary
@contextlib.contextmanager
def reported_errors(debug: bool = False) -> Iterator[None]:
    """The command line's error boundary: a user error prints one line and exits with status 2; bugs propagate.

    Inside, third-party noise is silenced (`quiet_third_party`). An exception that `user_error_message` calls the
    user's prints ``lvfl: error: <message>`` to stderr and becomes ``SystemExit(2)``; any other keeps its
    traceback. With `debug` (``--debug``, ``LVFL_DEBUG=1``) nothing is caught or silenced. Every subcommand runs
    inside it.
    """
    if debug:
        yield
        return
    try:
        with quiet_third_party():
            yield
    except Exception as err:
        message = user_error_message(err)
        if message is None:
            raise
        print(f"lvfl: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose refusals are one line, ``lvfl: error: <prog>: <message>`` (no usage block), status 2.

    For the commands outside LightningCLI (`lvfl bench`, `pki`, `party`, `launch`); ``<prog> --help`` shows the usage.
    Abbreviated options are refused: an unknown prefix is a typo, not another option.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # noqa: D102 - argparse's hook
        print(f"lvfl: error: {self.prog}: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


# ------------------------------------------------------------------------------------------------- quiet runs
class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not re.sub(r"^\[rank: \d+\] ", "", str(record.msg)).startswith(_SILENCED_LOG_PREFIXES)


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence the third-party warnings and tips listed above (by message and category) for the duration.

    The command-line counterpart of `[tool.pytest.ini_options] filterwarnings` in pyproject.toml, plus Lightning's
    "💡 Tip" log lines, its set-up lines ("Seed set to 0", the accelerators found) and its "GPU available but not
    used" hint. Each entry is targeted by message and category;
    any other warning, and every warning lvfl itself emits (such as ``allow_insecure=True``), is still printed.
    """
    tip_filter = _DropTips()
    loggers = [logging.getLogger(name) for name in _RANK_ZERO_LOGGERS]
    with warnings.catch_warnings():
        for message, category in _SILENCED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        for logger in loggers:
            logger.addFilter(tip_filter)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeFilter(tip_filter)


# ------------------------------------------------------------------------------------------------- classification
def user_error_message(error: BaseException) -> str | None:
    """The one-line message for a user error (see the module docstring), or None for a bug.

    jsonargparse's wrappers around a refused value ("Does not validate against any of the Union subtypes", with the
    whole model namespace) are unwrapped to the message of the class that refused it, prefixed with the option
    section and class, e.g. ``data (lvfl.datamodules.Digits): batch_size must be at least 1, got 0``.
    """
    if isinstance(error, ArgumentError):
        return summarize_argument_error(str(error))
    chain = _cause_chain(error)
    wrappers = [e for e in chain if _raised_in(e, "jsonargparse")]
    refusal = next((e for e in chain if not _raised_in(e, "jsonargparse")), None)
    if refusal is None:
        return None
    if isinstance(refusal, _FILE_ERRORS):
        return one_line(str(refusal))
    if isinstance(refusal, ImportError) and _raised_by_raise_statement(refusal):  # "install X" for a chosen option
        return _message_of(refusal) if wrappers or _raised_in(refusal, *_DELIBERATE_SOURCES) else None
    if isinstance(refusal, _USER_ERRORS) and _raised_by_raise_statement(refusal):
        if wrappers:  # the class a config value was given to refused it: any package's own check counts
            return with_section(_message_of(refusal), wrappers[-1])
        if _raised_in(refusal, *_DELIBERATE_SOURCES):
            return _message_of(refusal)
        return None
    if _is_misconfiguration(refusal):
        return _message_of(refusal)
    return None


def _cause_chain(error: BaseException) -> list[BaseException]:
    """`error`, then what it was raised from (``raise ... from``) or during, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def _innermost_frame(error: BaseException) -> TracebackType | None:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _raised_in(error: BaseException, *packages: str) -> bool:
    """Whether the line that raised `error` is in one of `packages` (by the path of its source file)."""
    tb = _innermost_frame(error)
    if tb is None:
        return False
    parts = Path(tb.tb_frame.f_code.co_filename).parts
    return any(package in parts for package in packages)


def _raised_by_raise_statement(error: BaseException) -> bool:
    """Whether `error` comes from a ``raise`` statement (a deliberate refusal), not from a failing expression."""
    tb = _innermost_frame(error)
    if tb is None:
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip()
    return line.startswith("raise ") or line.startswith("raise(")


def _is_misconfiguration(error: BaseException) -> bool:
    return type(error).__name__ == "MisconfigurationException" and type(error).__module__.startswith("lightning")


def _message_of(error: BaseException) -> str:
    if isinstance(error, KeyError) and len(error.args) == 1:  # str(KeyError) quotes its message
        return one_line(str(error.args[0]))
    return one_line(str(error)) or type(error).__name__
