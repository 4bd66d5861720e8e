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

This module holds the policy (which errors are the user's, how a jsonargparse refusal reads, which third-party
warnings are noise) and the boundary that applies it, `reported_errors`, which `lvfl.cli.main` and `lvfl export`
run inside. A signal is not an error: `lvfl.cli.main` reports SIGINT and SIGTERM itself (exit status 130, 143).
Warnings that lvfl itself emits are never silenced here: they are fixed where they arise, or kept on purpose
(``allow_insecure=True``, a repeated label release).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import importlib
import inspect
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

__all__ = [
    "DEBUG_ENV",
    "OneLineParser",
    "check_party_optimizers",
    "debug_requested",
    "quiet_third_party",
    "reported_errors",
    "summarize_argument_error",
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
    traceback. With `debug` (``--debug``, ``LVFL_DEBUG=1``) nothing is caught or silenced. `lvfl.cli.main` (fit,
    validate, test, predict) and `lvfl export` run inside it.
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
        print(f"lvfl: error: {self.prog}: {_one_line(message)} (see {self.prog} --help)", file=sys.stderr)
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
        return _one_line(str(refusal))
    if isinstance(refusal, ImportError) and _raised_by_raise_statement(refusal):  # "install X" for a chosen option
        return _message_of(refusal) if wrappers or _raised_in(refusal, *_DELIBERATE_SOURCES) else None
    if isinstance(refusal, _USER_ERRORS) and _raised_by_raise_statement(refusal):
        if wrappers:  # the class a config value was given to refused it: any package's own check counts
            return _with_section(_message_of(refusal), wrappers[-1])
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
        return _one_line(str(error.args[0]))
    return _one_line(str(error)) or type(error).__name__


def _with_section(message: str, wrapper: BaseException) -> str:
    """Prefix `message` with the option section and class that jsonargparse was instantiating, when it says."""
    match = re.search(r"Given value: (?:Namespace\(|\{')class_path'?[=:] ?'([\w.]+)'", str(wrapper))
    if not match:
        return message
    class_path = match.group(1)
    section = _section_of(class_path)
    where = f"{section} ({class_path})" if section else class_path
    return f"{where}: {message}"


def _section_of(class_path: str) -> str | None:
    """The config section that takes `class_path` (data, model, model.aggregation, ...), if it is an lvfl base's."""
    from lvfl.datamodules import Partitioner, VerticalDataModule
    from lvfl.privacy import AggregationBackend, LabelMechanism
    from lvfl.protocols import VFLModule

    cls = _import_object(class_path)
    if not isinstance(cls, type):
        return None
    sections = (
        ("data", VerticalDataModule),
        ("data.partitioner", Partitioner),
        ("model", VFLModule),
        ("model.aggregation", AggregationBackend),
        ("model.label_mechanism", LabelMechanism),
    )
    return next((name for name, base in sections if issubclass(cls, base)), None)


def _import_object(path: str) -> object | None:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------- party checks
def check_party_optimizers(config: Any) -> None:
    """Refuse a party's optimizer or scheduler settings from the parsed config, naming the party.

    `PartyConfig` checks its optimizer when it is made, but it does not know which entry of `model.parties` it
    is; run before instantiation (`VFLCLI.before_instantiate_classes`), this names it: ``model.parties[1]
    (party1): optimizer torch.optim.SGD: Invalid learning rate: -0.1``. Entries that are not plain class paths
    with init args are left to instantiation.
    """
    from lvfl.datamodules import party_name
    from lvfl.protocols import PartyConfig

    parties = _get(config, "model.init_args.parties")
    if not isinstance(parties, list):
        return
    participants = _get(config, "data.init_args.participants")
    if participants is None and isinstance(num_parties := _get(config, "data.init_args.num_parties"), int):
        participants = list(range(num_parties))
    for index, entry in enumerate(parties):
        factories = [_factory(_get(entry, key)) for key in ("optimizer", "lr_scheduler")]
        if any(f is _UNKNOWN for f in factories):
            continue
        try:
            PartyConfig.check_optimization(*factories)
        except (ValueError, TypeError) as err:
            if len(parties) == 1:
                who = " (every party)"
            elif isinstance(participants, list) and len(participants) == len(parties):
                who = f" ({party_name(sorted(participants)[index])})"
            else:
                who = ""
            raise ValueError(f"model.parties[{index}]{who}: {err}") from err


_UNKNOWN = object()


def _get(config: Any, dotted: str) -> Any:
    """`config[a][b]...` for a jsonargparse Namespace or dict, or None where a level is missing."""
    value = config
    for key in dotted.split("."):
        value = value.get(key) if hasattr(value, "get") else getattr(value, key, None)
        if value is None:
            return None
    return value


def _factory(spec: Any) -> Any:
    """A callable for a `{class_path, init_args}` spec (None for None; `_UNKNOWN` when it cannot be made here)."""
    if spec is None:
        return None
    class_path = _get(spec, "class_path")
    cls = _import_object(class_path) if isinstance(class_path, str) else None
    if not isinstance(cls, type):
        return _UNKNOWN
    init_args = _get(spec, "init_args")
    if init_args is None:
        kwargs = {}
    elif isinstance(init_args, dict):
        kwargs = dict(init_args)
    else:  # a jsonargparse Namespace (an argparse.Namespace): its top-level keys
        kwargs = dict(vars(init_args))
    if any(isinstance(v, dict) or hasattr(v, "__dict__") and hasattr(v, "get") for v in kwargs.values()):
        # nested class specs (Namespaces or dicts): jsonargparse builds those
        return _UNKNOWN
    return functools.partial(cls, **kwargs)


# ------------------------------------------------------------------------------------------------- parse errors
_NOISE = re.compile(
    r"^(Does not validate against any of the Union subtypes|Subtypes: .*|Errors:|Given value type: .*|"
    r"Expected a <class 'NoneType'>)$"
)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")
_GIVEN = re.compile(r"^Given value: (.*)$")
_NO_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted$")
_CALLABLE_TYPE = re.compile(r"^Type .+? expects a function or a callable class: (.*?)(?:\. Got value: (.*))?$")
_EXPECTED = re.compile(r"^Expected an? (?!path but )(.+?)(?:\. Got value: .*)?$")
_NOT_A_PATH = re.compile(r"^Expected a path but .* either not accessible or invalid$")


def summarize_argument_error(message: str) -> str:
    r"""One line for jsonargparse's nested refusal text: ``<option>: <the innermost reason>``.

    jsonargparse reports a refused value as a tree: ``Parser key "model":`` and ``Problem with given class_path
    '...'`` headers, "Does not validate against any of the Union subtypes" for every optional level, the subtypes
    tried and the whole given value. The reason is the deepest leaf; the option is the chain of parser keys above it.

    Example:
        >>> summarize_argument_error(
        ...     'Parser key "data":\n  Problem with given class_path \'lvfl.datamodules.Digits\':\n'
        ...     "    Option 'batch_sise' is not accepted"
        ... )
        "data: lvfl.datamodules.Digits has no option 'batch_sise' (did you mean batch_size?)"
    """
    leaves = _leaves(message)
    if not any(keys or classes for keys, classes, _, _ in leaves):  # not a tree: a YAML error, a bad subcommand
        return _one_line(re.sub(r'\s*in "<unicode string>", (line \d+, column \d+)', r" (\1)", message))
    informative = [leaf for leaf in leaves if not _NOT_A_PATH.match(leaf[2])] or leaves
    keys, classes, text, given = max(informative, key=lambda leaf: len(leaf[0]) + len(leaf[1]))
    expected = [m.group(1) for k, c, t, _ in informative if (k, c) == (keys, classes) and (m := _EXPECTED.match(t))]
    if len(expected) > 1 and given is not None:  # a Union: every type it accepts
        literals = [re.fullmatch(r"typing\.Literal\[(.*)\]", e) for e in expected]
        choices = f"one of {', '.join(m.group(1) for m in literals if m)}" if all(literals) else " or ".join(expected)
        text = f"Expected {choices}. Got value: {given}"
    option = ".".join(keys)
    reason = _reason(text, classes[-1] if classes else None, given)
    return f"{option}: {reason}" if option else reason


def _leaves(message: str) -> list[tuple[list[str], list[str], str, str | None]]:
    """(parser keys, class paths, text, given value) of each leaf of jsonargparse's error tree."""
    stack: list[tuple[int, str, str]] = []  # (indent, "key" | "class", name)
    given: dict[int, str] = {}  # indent -> the "Given value" at that level
    found: list[tuple[list[str], list[str], str, int]] = []
    for raw in message.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        if line.startswith("- "):
            indent, line = indent + 2, line[2:].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        for level in [level for level in given if level > indent]:
            del given[level]
        if _NOISE.match(line):
            continue
        if match := _GIVEN.match(line):
            given[indent] = match.group(1)
            continue
        for pattern, kind in ((_PARSER_KEY, "key"), (_CLASS_PATH, "class")):
            if match := pattern.match(line):
                stack.append((indent, kind, match.group(1)))
                line = match.group(2).strip()
                break
        if line:
            keys = [name for _, kind, name in stack if kind == "key"]
            classes = [name for _, kind, name in stack if kind == "class"]
            found.append((keys, classes, line, indent))
    out = []
    for keys, classes, line, indent in found:
        value = next((given[level] for level in sorted(given, reverse=True) if level <= indent), None)
        out.append((keys, classes, line, value))
    return out


def _reason(text: str, class_path: str | None, given: str | None) -> str:
    """Reword the common jsonargparse leaves; add a close match for a misspelt option or class name."""
    if match := _CALLABLE_TYPE.match(text):  # a factory (optimizer, party model): the reason is inside
        text, value = match.group(1), match.group(2) or ""
        class_path = next(iter(re.findall(r"class_path='([\w.]+)'", value)), class_path)
    if match := _NO_ATTRIBUTE.search(text):
        module, name = match.groups()
        reason = f"no class {name!r} in {module}"
        return reason + _did_you_mean(name, _public_names(module), prefix=f"{module}.")
    if match := _NOT_ACCEPTED.match(text):
        option = match.group(1).split(".")[0]  # 'modle.init_args.hidden': the misspelt key is 'modle'
        owner = f"{class_path} has" if class_path else "there is"
        return f"{owner} no option {option!r}" + _did_you_mean(option, _parameters(class_path))
    text = re.sub(r"<class '([\w.]+)'>", r"\1", text)
    text = re.sub(r"typing\.Literal\[([^\]]*)\]", r"one of \1", text)
    if (match := re.match(r"^Expected (?:an? )?(.+?)(?:\. Got value: (.*))?$", text)) and (
        value := match.group(2) or given
    ):
        if value.startswith("NestedArg("):
            value_match = re.search(r"val='(.*)'\)$", value)
            value = value_match.group(1) if value_match else value
        return f"expected {match.group(1)}, got {value!r}"
    return _one_line(text)


def _did_you_mean(name: str, candidates: Sequence[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _public_names(module: str) -> list[str]:
    try:
        return [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
    except ImportError:
        return []


def _parameters(class_path: str | None) -> list[str]:
    """The keyword parameters a class (or function) takes, following ``**kwargs`` up the class's bases."""
    target = _import_object(class_path) if class_path else None
    if target is None:
        return []
    functions = [c.__init__ for c in target.__mro__ if "__init__" in vars(c)] if isinstance(target, type) else [target]
    names: list[str] = []
    for function in functions:
        try:
            params = inspect.signature(function).parameters
        except (TypeError, ValueError):
            break
        names += [p for p, spec in params.items() if spec.kind not in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD)]
        if not any(spec.kind is spec.VAR_KEYWORD for spec in params.values()):
            break
    return [n for n in dict.fromkeys(names) if n != "self"]
