"""The student model `StudentDistillation` saves beside a run's checkpoints, and how `lvfl predict` loads it.

A run's folder may come from anyone, so nothing in it is unpickled. The student is two files:

- `student.pt` (`STUDENT_FILE`): its state dict, tensors only, read with `torch.load(..., weights_only=True)`, which
  refuses every object but tensors and plain containers (no code runs while reading it);
- `student.json` (`STUDENT_SPEC_FILE`): what rebuilds the module (`StudentSpec`): the model factory's class path
  and init args, the input shape, embedding width, number of outputs, the task kind (and, for a regression, the
  target's mean and scale, since the student answers on the standardized scale), and the SHA-256 of `student.pt`.

`load_student` rebuilds the module from the JSON and loads the weights into it (strictly: every key, every shape).
The JSON is a user-handed file too, and importing a class path from it and calling it could run anything: only a
class path that resolves to a subclass of `torch.nn.Module` is called (checked before the call), with the JSON's
plain values as its arguments (never themselves read as classes); anything else is refused in one message naming the
file and the value. Every failure to read the pair (a file missing, truncated or not JSON, wrong shapes, the pickled
module of an older lvfl) is a `ValueError` of one line naming the file and saying to refit.

Residual trust: importing the named module runs that module's top-level code (an installed module: the file cannot
supply code), and the class's `__init__` runs with the file's arguments.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import math
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "STUDENT_FILE",
    "STUDENT_SPEC_FILE",
    "StudentSpec",
    "describe_factory",
    "load_student",
    "save_student",
]

STUDENT_FILE = "student.pt"  #: the student's state dict (tensors only), in the run's checkpoint folder
STUDENT_SPEC_FILE = "student.json"  #: what rebuilds the student, beside `STUDENT_FILE`
FORMAT = "lvfl.student"
VERSION = 1
TASK_KINDS = ("binary", "multiclass", "regression")
REFIT = "refit the run with StudentDistillation to write it again"
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_KEYS = {
    "format", "version", "class_path", "init_args", "input_shape", "embedding_dim", "num_outputs", "task",
    "target_mean", "target_scale", "weights_sha256",
}  # fmt: skip


def _one_line(err: BaseException) -> str:
    """An exception's message on one line (torch's are multi-line), shortened."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _load_failure(err: BaseException) -> str:
    """Why torch.load(weights_only=True) refused a file, in a few words (never torch's advice to unpickle it)."""
    text = " ".join(str(err).split())
    if isinstance(err, pickle.UnpicklingError):
        found = re.search(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)", text)
        what = f"a pickled {found.group(1)}" if found else "pickled objects"
        return f"it holds {what}, and lvfl never unpickles objects (that could run code; older lvfl pickled the module)"
    first = re.split(r"(?<=[.!?]) ", text, maxsplit=1)[0]
    return f"truncated or damaged: {type(err).__name__}: {first[:200]}"


def _resolve_class(class_path: Any, where: Path) -> type[nn.Module]:
    """The `torch.nn.Module` subclass `class_path` names; anything else is refused before it is called."""
    refuse = (
        f"{where}: class_path {class_path!r} names no subclass of torch.nn.Module, the only thing a student file "
        f"may name (nothing else is called): {REFIT}"
    )
    if not isinstance(class_path, str) or not _CLASS_PATH.fullmatch(class_path):
        raise ValueError(refuse)
    module_name, _, name = class_path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception:  # no such module, or one that fails to import: either way not a student's class
        raise ValueError(refuse) from None
    obj = module.__dict__.get(name)  # the module's own attribute: no module-level __getattr__ runs
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise ValueError(refuse)
    return obj


def describe_factory(factory: Any) -> tuple[str, dict[str, Any]]:
    """The class path and init args that rebuild the student `factory` builds, as a config gives them.

    Accepts a `torch.nn.Module` subclass (no init args), `functools.partial(cls, **init_args)`, and the callable
    jsonargparse makes of a config's `{class_path: ..., init_args: ...}`; the init args must be plain JSON values.

    Raises:
        ValueError: the factory is something else (e.g. a lambda or a plain function), its class cannot be imported
            back by its path (a local class), or an init arg is no JSON value.
    """
    cls: Any = None
    init_args: dict[str, Any] = {}
    if isinstance(factory, type):
        cls = factory
    elif isinstance(factory, functools.partial):
        if isinstance(factory.func, type) and not factory.args:
            cls, init_args = factory.func, dict(factory.keywords)
        elif (
            factory.args
            and isinstance(factory.args[-1], type)
            and str(getattr(factory.func, "__module__", "")).startswith("jsonargparse")
        ):  # jsonargparse: partial(<instantiate>, <instantiator>, cls, **init_args)
            cls, init_args = factory.args[-1], dict(factory.keywords)
    if cls is None or not issubclass(cls, nn.Module):
        raise ValueError(
            f"the student's model factory {factory!r} is no torch.nn.Module class (or partial of one with keyword "
            "init args): a saved student is rebuilt from a class path and init args only"
        )
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    try:
        resolved = _resolve_class(class_path, Path("<factory>"))
    except ValueError:
        resolved = None
    if resolved is not cls:
        raise ValueError(f"the student's class {class_path} cannot be imported back by its path (a local class?)")
    try:
        init_args = json.loads(json.dumps(init_args, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"the student's init args {init_args!r} are not plain JSON values ({err})") from None
    return class_path, init_args


@dataclass(frozen=True)
class StudentSpec:
    """What rebuilds a saved student: `cls(input_shape, embedding_dim, num_outputs, **init_args)`, then its weights.

    Attributes:
        class_path: the student's class, a `torch.nn.Module` subclass, as `module.Class`.
        init_args: its hyperparameters, plain JSON values.
        input_shape: one sample of the active party's features, without the batch axis.
        embedding_dim: the student's embedding width.
        num_outputs: logits per sample (the classes), or 1 for a regression (a standardized value).
        task: "binary", "multiclass" or "regression".
        target_mean: a regression's target mean (the student's output times `target_scale` plus this is the target).
        target_scale: a regression's target scale.
    """

    class_path: str
    init_args: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] = ()
    embedding_dim: int = 1
    num_outputs: int = 1
    task: str = "multiclass"
    target_mean: float = 0.0
    target_scale: float = 1.0

    def to_json(self, weights_sha256: str) -> dict[str, Any]:
        """The JSON object written to `student.json`, with the digest of the weights file it goes with."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "class_path": self.class_path,
            "init_args": self.init_args,
            "input_shape": list(self.input_shape),
            "embedding_dim": self.embedding_dim,
            "num_outputs": self.num_outputs,
            "task": self.task,
        }
        if self.task == "regression":
            out |= {"target_mean": self.target_mean, "target_scale": self.target_scale}
        return out | {"weights_sha256": weights_sha256}

    @classmethod
    def from_json(cls, data: Any, where: Path) -> tuple[StudentSpec, str]:
        """The spec and weights digest of a parsed `student.json`; every field checked, else a ValueError naming it."""

        def bad(what: str, value: Any) -> ValueError:
            return ValueError(f"{where}: {what} {value!r} is not a valid lvfl student file entry: {REFIT}")

        if not isinstance(data, dict):
            raise bad("the top-level value", type(data).__name__)
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise bad("format/version", (data.get("format"), data.get("version")))
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise bad("keys", unknown)
        shape = data.get("input_shape")
        if not (isinstance(shape, list) and shape and all(_is_count(d) for d in shape)):
            raise bad("input_shape", shape)
        for key in ("embedding_dim", "num_outputs"):
            if not _is_count(data.get(key)):
                raise bad(key, data.get(key))
        task = data.get("task")
        if task not in TASK_KINDS:
            raise bad("task", task)
        init_args = data.get("init_args")
        if not (isinstance(init_args, dict) and all(k.isidentifier() for k in init_args)):
            raise bad("init_args", init_args)
        mean, scale = data.get("target_mean", 0.0), data.get("target_scale", 1.0)
        for key, value in (("target_mean", mean), ("target_scale", scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad(key, value)
        if scale <= 0:
            raise bad("target_scale", scale)
        digest = data.get("weights_sha256")
        if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise bad("weights_sha256", digest)
        class_path = data.get("class_path")
        _resolve_class(class_path, where)  # refused here, before anything else reads the spec
        spec = cls(
            class_path=class_path,
            init_args=init_args,
            input_shape=tuple(shape),
            embedding_dim=data["embedding_dim"],
            num_outputs=data["num_outputs"],
            task=task,
            target_mean=float(mean),
            target_scale=float(scale),
        )
        return spec, digest

    def build(self, where: Path) -> nn.Module:
        """A fresh module of this spec (seeded weights, to be overwritten), without touching the global RNG."""
        model_class = _resolve_class(self.class_path, where)  # checked again right before the call
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = model_class(tuple(self.input_shape), self.embedding_dim, self.num_outputs, **self.init_args)
        except Exception as err:  # a user-handed spec: any failure of the constructor is a bad file
            raise ValueError(
                f"{where}: {self.class_path} cannot be built from it ({_one_line(err)}): {REFIT}"
            ) from None
        if not isinstance(model, nn.Module):
            raise ValueError(f"{where}: {self.class_path} built no torch.nn.Module: {REFIT}")
        return model


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_atomically(path: Path, write: Any) -> None:
    """Write through a temporary file and rename, so a crash never leaves half a file under `path`."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_student(
    model: nn.Module,
    folder: str | Path,
    *,
    factory: Any,
    input_shape: tuple[int, ...],
    embedding_dim: int,
    task: Any,
) -> Path:
    """Save `model` as the run's student in `folder`: its state dict and the spec that rebuilds it.

    Args:
        model: the fitted student, as `factory(input_shape, embedding_dim, task.num_outputs)` built it.
        folder: the run's checkpoint folder.
        factory: the student's model factory (see `describe_factory`).
        input_shape: one sample of the active party's features.
        embedding_dim: the embedding width the factory was called with.
        task: the run's `lvfl.parties.TaskInfo` (its kind, number of outputs and, for a regression, target scale).

    Returns:
        The weights file written (`student.pt`; `student.json` beside it).

    Raises:
        ValueError: the factory cannot be described by a class path and JSON init args (nothing is written).
    """
    class_path, init_args = describe_factory(factory)
    spec = StudentSpec(
        class_path=class_path,
        init_args=init_args,
        input_shape=tuple(int(d) for d in input_shape),
        embedding_dim=int(embedding_dim),
        num_outputs=int(task.num_outputs),
        task=str(task.kind),
        target_mean=float(getattr(task, "target_mean", 0.0)),
        target_scale=float(getattr(task, "target_scale", 1.0)),
    )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / STUDENT_FILE
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    _write_atomically(path, lambda tmp: torch.save(state, tmp))
    text = json.dumps(spec.to_json(_sha256(path)), indent=2, allow_nan=False) + "\n"
    _write_atomically(folder / STUDENT_SPEC_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _read_spec(folder: Path) -> tuple[StudentSpec, str] | None:
    weights, spec_path = folder / STUDENT_FILE, folder / STUDENT_SPEC_FILE
    if not weights.exists() and not spec_path.exists():
        return None
    if not spec_path.is_file():
        raise ValueError(
            f"{weights}: no {STUDENT_SPEC_FILE} beside it, so it is the pickled module an older lvfl saved (no longer "
            f"unpickled: it could run code) or half a student: {REFIT}"
        )
    if not weights.is_file():
        raise ValueError(f"{spec_path}: the student's weights {STUDENT_FILE} are missing beside it: {REFIT}")
    try:
        data = json.loads(spec_path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{spec_path}: not a readable JSON student spec ({_one_line(err)}): {REFIT}") from None
    return StudentSpec.from_json(data, spec_path)


def load_student(folder: str | Path, task: Any = None) -> nn.Module | None:
    """The student saved in `folder`, rebuilt from `student.json` with the weights of `student.pt`; None if absent.

    Args:
        folder: the run's checkpoint folder.
        task: the run's `lvfl.parties.TaskInfo`, if known: a student of another task kind or width is refused.

    Raises:
        ValueError: (one line naming the file) a file is missing, unreadable, not the format, names something other
            than a `torch.nn.Module` subclass, does not match the other file, or does not fit `task`.
    """
    folder = Path(folder)
    loaded = _read_spec(folder)
    if loaded is None:
        return None
    spec, digest = loaded
    spec_path, weights = folder / STUDENT_SPEC_FILE, folder / STUDENT_FILE
    if task is not None and (spec.task != task.kind or spec.num_outputs != task.num_outputs):
        raise ValueError(
            f"{spec_path}: a {spec.task} student with {spec.num_outputs} outputs does not fit this run's "
            f"{task.kind} task ({task.num_outputs} outputs), so {folder} holds another run's student: {REFIT}"
        )
    if _sha256(weights) != digest:
        raise ValueError(
            f"{weights}: its SHA-256 is not the one {STUDENT_SPEC_FILE} records (changed or truncated): {REFIT}"
        )
    try:
        with warnings.catch_warnings():  # torch's remarks about the file's pickle protocol are no news here
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(weights, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as err:  # torch raises many types for a bad archive; every one is a bad file here
        raise ValueError(
            f"{weights}: not a state dict of tensors that torch.load(weights_only=True) reads ({_load_failure(err)}): "
            f"{REFIT}"
        ) from None
    if not (isinstance(state, dict) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items())):
        raise ValueError(f"{weights}: holds a {type(state).__name__}, not a state dict of tensors: {REFIT}")
    model = spec.build(spec_path)
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"{weights}: does not fit the {spec.class_path} that {STUDENT_SPEC_FILE} describes "
            f"({_one_line(err)}): {REFIT}"
        ) from None
    return model.eval()
