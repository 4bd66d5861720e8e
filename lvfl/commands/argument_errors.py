"""What a refused argument says: jsonargparse's nested refusals in one line, and a refused party setting named.

jsonargparse reports a refused option or config value as a tree of parser keys, class paths, the subtypes of every
optional level and the whole given value; `summarize_argument_error` turns that into ``<option>: <reason>`` with a
close match for a misspelt option or class, and `with_section` prefixes a value that a class refused with the
config section and class it was given to. `check_party_optimizers` runs before the classes are built, so that a
refused optimizer names the party it belongs to. `lvfl.commands.errors` decides which errors are the user's and
prints them; this module only words them.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["check_party_optimizers", "one_line", "summarize_argument_error", "with_section"]


def with_section(message: str, wrapper: BaseException) -> str:
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


def one_line(text: str) -> str:
    """`text` on one line: every run of whitespace, newlines included, one space (a refusal is printed as one line)."""
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------- party checks
def check_party_optimizers(config: Any) -> None:
    """Refuse a party's optimizer or scheduler settings from the parsed config, naming the party.

    `PartyConfig` checks its optimizer when it is made, but it does not know which entry of `model.parties` it
    is; run before instantiation (`VFLCLI.before_instantiate_classes`), this names it: ``model.parties[1]
    (party1): optimizer torch.optim.SGD: Invalid learning rate: -0.1``. Entries that are not plain class paths
    with init args are left to instantiation.
    """
    from lvfl.parties import party_name
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
        return one_line(re.sub(r'\s*in "<unicode string>", (line \d+, column \d+)', r" (\1)", message))
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
    return one_line(text)


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
