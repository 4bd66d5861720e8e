"""Which checkpoint a command means, and loading it without unpickling anything: the one place lvfl reads a `.ckpt`.

- `load_checkpoint(path)`: the checkpoint as a dict, read with ``torch.load(weights_only=True)`` whatever torch's
  default or ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` say. A checkpoint is a file a user can be handed, and unpickling
  an arbitrary object runs code; lvfl's own checkpoints hold only tensors and plain data, so they load this way.
  Every way a file can fail to be a checkpoint (missing, a directory, empty, truncated, text, pickled objects)
  raises an error whose one-line message names the file and what is wrong with it (`CheckpointError`, or the
  `FileNotFoundError` / `IsADirectoryError` that `lvfl.commands.errors` reports as a user error).
- `resolve_ckpt_path(trainer, ckpt_path)`: the file that ``--ckpt_path last`` or ``--ckpt_path best`` names, found
  on disk so that it works in a new process (Lightning resolves "best" only from the callback of a fit in the same
  process). Every fit writes its own version folder, ``<save_dir>/<name>/version_N/checkpoints/``
  (`ExperimentCheckpoint`), so a second fit never touches the first's files; ``last`` and ``best`` are looked up
  within one run, the newest version that holds a checkpoint (an older run's file is named by its path). ``last``
  is its ``last.ckpt``, ``best`` the best epoch by the task's main validation metric (``best.ckpt`` beside it) or
  any monitored top-1 checkpoint kept under a fixed file name.
- `describe_checkpoint(path, checkpoint)`: what the CLI prints about the file it loaded; `weights_only_kwargs()`:
  what to pass Lightning's `Trainer.fit/test/...` so that its own load of the file is weights-only too.

`lvfl.commands.fit` (fit, validate, test, predict), `lvfl export` and `lvfl bench` load checkpoints through these.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "SPECIAL_CKPT_PATHS",
    "best_file",
    "CheckpointError",
    "describe_checkpoint",
    "experiment_folder",
    "load_checkpoint",
    "named_version",
    "refuse_a_used_version",
    "resolve_ckpt_path",
    "run_checkpoint_folder",
    "weights_only_kwargs",
]

#: the `--ckpt_path` values that name a checkpoint of the run's experiment instead of a file
SPECIAL_CKPT_PATHS = ("last", "best")

_METRIC_HINT = "val/acc/mean, val/auroc/mean or val/r2/mean by task"


class CheckpointError(ValueError):
    """A file that is not a checkpoint lvfl can load safely (the message names the file and what is wrong)."""


# ---------------------------------------------------------------------------------------------------- loading
def load_checkpoint(path: str | os.PathLike[str], what: str | None = None) -> dict[str, Any]:
    """The checkpoint at `path`, loaded on the CPU with ``weights_only=True``: tensors and plain data, never objects.

    Args:
        path: the checkpoint file.
        what: how messages name it (default ``checkpoint <path>``), e.g. ``--ckpt_path best (<path>)``.

    Raises:
        FileNotFoundError: there is no such file.
        IsADirectoryError: `path` is a directory.
        CheckpointError: the file is empty, truncated or damaged, not a `torch.save` file, holds pickled objects
            that loading would have to run code for, or is not a Lightning checkpoint (a dict with a state_dict).
    """
    import torch

    file = Path(path)
    where = what or f"checkpoint {file}"
    if not file.exists():
        raise FileNotFoundError(f"{where}: no such file")
    if file.is_dir():
        inside = file / "last.ckpt"
        hint = f" (e.g. {inside})" if inside.is_file() else ""
        raise IsADirectoryError(f"{where} is a directory, not a checkpoint file: give a .ckpt file{hint}")
    if not file.is_file():
        raise CheckpointError(f"{where} is not a regular file")
    if file.stat().st_size == 0:
        raise CheckpointError(f"{where} is empty (0 bytes): not a checkpoint (was its writing interrupted?)")
    try:
        with warnings.catch_warnings():  # "Detected pickle protocol 4": a remark about the file, not news
            warnings.simplefilter("ignore", UserWarning)
            checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except pickle.UnpicklingError as err:
        raise CheckpointError(_unpickling_message(where, str(err))) from err
    except Exception as err:  # anything torch.load raises on a file is about the file: truncated, text, damaged
        raise CheckpointError(
            f"{where} is not a readable checkpoint: truncated, damaged or not written by torch.save "
            f"({type(err).__name__}: {_first_sentence(str(err))})"
        ) from err
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{where} holds a {type(checkpoint).__name__}, not a Lightning checkpoint (a dict with a state_dict)"
        )
    if "state_dict" not in checkpoint:
        keys = ", ".join(sorted(map(str, checkpoint))[:8]) or "none"
        raise CheckpointError(f"{where} is not a Lightning checkpoint: it has no state_dict (its keys: {keys})")
    return checkpoint


def _unpickling_message(where: str, text: str) -> str:
    """One line for torch's weights-only refusal: the object type it met, or the pickle operation."""
    unsafe = re.search(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)", text)
    operand = re.search(r"Unsupported operand \d+", text)
    if unsafe:
        detail = f"it holds a pickled {unsafe.group(1)}"
    elif operand:
        detail = (
            f"it is no torch.save file of tensors and plain data (the weights-only unpickler met {operand.group(0)})"
        )
    elif "Weights only load failed" in text:
        detail = "torch.load(weights_only=True) refused its content"
    else:
        return f"{where} is not a checkpoint file ({_first_sentence(text)})"
    return (
        f"{where} is not a checkpoint lvfl can load safely: {detail}. lvfl loads checkpoints with "
        "weights_only=True (tensors and plain data only), because unpickling other objects can run arbitrary code; "
        "a checkpoint written by lvfl never holds any"
    )


def _first_sentence(text: str) -> str:
    line = " ".join(text.split())
    sentence = line.split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 160 else sentence[:157] + "..."


def describe_checkpoint(path: str | os.PathLike[str], checkpoint: Mapping[str, Any]) -> str:
    """``epoch 3`` (1-based: the epochs the file's weights were trained for), and the score it was kept for.

    The score is the monitored metric of a checkpoint callback whose best file `path` is (``val/acc/mean 0.8125``).
    """
    parts = []
    if isinstance(checkpoint.get("epoch"), int):
        parts.append(f"epoch {checkpoint['epoch'] + 1}")
    name = Path(path).name
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, Mapping):
            continue
        best, score, monitor = state.get("best_model_path"), state.get("best_model_score"), state.get("monitor")
        if monitor and best and Path(str(best)).name == name and score is not None:
            parts.append(f"{monitor} {float(score):.4f}")
            break
    return ", ".join(parts)


def weights_only_kwargs() -> dict[str, bool]:
    """``{"weights_only": True}`` for Lightning's `Trainer.fit/validate/test/predict`, where they take it.

    Lightning >= 2.6 passes it on to its `torch.load`; older versions use torch's default, and there the check that
    `load_checkpoint` makes first is what keeps pickled objects out.
    """
    import inspect

    from lightning.pytorch import Trainer

    return {"weights_only": True} if "weights_only" in inspect.signature(Trainer.test).parameters else {}


# ---------------------------------------------------------------------------------------------------- resolution
def resolve_ckpt_path(trainer: Any, ckpt_path: str | os.PathLike[str] | None) -> Path | None:
    """The file that `ckpt_path` names for `trainer`'s run: None for None, a path as given, or `last` / `best` found.

    ``last`` and ``best`` are looked up in one run's checkpoint folder (`run_checkpoint_folder`): after a fit in this
    process, the one it wrote; else the newest version of the experiment (``<save_dir>/<name>/version_N``) holding
    a checkpoint. ``last``: its ``last.ckpt``. ``best``: the best file a checkpoint callback of this process kept,
    else the file a monitored top-1 checkpoint keeps under a fixed name (`ExperimentCheckpoint`'s ``best.ckpt``) in
    that folder. Nothing is loaded.

    Raises:
        FileNotFoundError: nothing was fitted with this experiment yet (the folder looked in is named).
        ValueError: the run has no checkpoint callback to look with, or it keeps no best epoch (and why).
    """
    if ckpt_path is None:
        return None
    if str(ckpt_path) == "last":
        return _last(trainer)
    if str(ckpt_path) == "best":
        return _best(trainer)
    return Path(ckpt_path)


def experiment_folder(trainer: Any) -> Path | None:
    """``<save_dir>/<name>`` of the trainer's first logger (the folder of its version folders), or None."""
    if not trainer.loggers:
        return None
    logger = trainer.loggers[0]
    save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
    return Path(save_dir) / str(logger.name)


def named_version(trainer: Any) -> str | None:
    """The version folder's name when the logger was given a version (``version_3``, or a string as given), else None.

    Read before the logger picks its next free version (Lightning's loggers keep a given version in `_version`).
    """
    if not trainer.loggers:
        return None
    version = getattr(trainer.loggers[0], "_version", None)
    if version is None:
        return None
    return version if isinstance(version, str) else f"version_{version}"


def _version_number(folder: Path) -> int:
    match = re.fullmatch(r"version_(\d+)", folder.name)
    return int(match.group(1)) if match else -1


def run_checkpoint_folder(trainer: Any, folder_name: str = "checkpoints") -> Path | None:
    """The checkpoint folder of the run `--ckpt_path last|best` means (None: the experiment has no version yet).

    The newest ``version_N`` (by N) of the experiment whose folder holds a ``.ckpt``: a later `lvfl test`, which
    logs into a version of its own and writes no checkpoint, does not hide the fit before it. An older run's file
    is named by its path.
    """
    root = experiment_folder(trainer)
    if root is None:
        return None
    versions = sorted((p for p in root.glob("version_*") if p.is_dir()), key=_version_number, reverse=True)
    for version in versions:
        if any((version / folder_name).glob("*.ckpt")):
            return version / folder_name
    return None


def refuse_a_used_version(trainer: Any) -> None:
    """Refuse a logger version named on purpose whose folder holds files already: lvfl never overwrites a run.

    (Lightning's loggers would write into it: the CSV logger deletes its metrics, a fit replaces its checkpoints.)
    """
    named, root = named_version(trainer), experiment_folder(trainer)
    if named is None or root is None:
        return
    folder = root / named
    if folder.is_dir() and any(folder.iterdir()):
        raise ValueError(
            f"--trainer.logger.init_args.version: {folder} holds a run already, and lvfl does not overwrite one; "
            "name another version, or leave the version out (each command then writes the next free one)"
        )


#: what a version folder holds before its command produced anything: the config it ran with, the logger's own files
_BOOKKEEPING = ("config.yaml", "hparams.yaml", "metrics.csv")


def drop_an_empty_run_folder(trainer: Any) -> Path | None:
    """Remove this command's version folder when it holds nothing the command produced; the folder removed, or None.

    A refused run, `lvfl predict --output` elsewhere and `lvfl export` would otherwise each leave `version_N` with its
    config and a metrics file of set-up counts, and the run tree fills with them (a newcomer's good run was
    `version_9`). Kept: any folder with a checkpoint, predictions, an attack's file or a logged result in it. A
    folder whose version was picked by the logger is this command's own (`refuse_a_used_version` refuses an occupied
    one by name).
    """
    if trainer is None or not trainer.loggers or not trainer.is_global_zero:
        return None
    logger = trainer.loggers[0]
    version = getattr(logger, "_version", None)
    log_dir = getattr(logger, "log_dir", None) if version is not None else None
    folder = Path(log_dir) if log_dir else None
    if folder is None or not folder.is_dir():
        return None
    for path in folder.rglob("*"):
        if path.is_dir():
            continue
        relative = path.relative_to(folder)
        if len(relative.parts) != 1 or relative.name not in _BOOKKEEPING:
            return None
        if relative.name == "metrics.csv" and _logged_results(path):
            return None
    shutil.rmtree(folder)
    return folder


def _logged_results(metrics: Path) -> bool:
    """Whether a metrics file holds a result: a value under any name but the step, the epoch and set-up counts."""
    lines = metrics.read_text().splitlines()
    header = lines[0].split(",") if lines else []
    return len(lines) > 1 and any(name not in ("step", "epoch") and not name.startswith("setup/") for name in header)


def _keepers(trainer: Any) -> list[Any]:
    from lightning.pytorch.callbacks import ModelCheckpoint

    return [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]


def _folders(trainer: Any, keepers: list[Any]) -> list[Path]:
    """Where the keepers' files are: a folder given to a keeper as it is, else the run's (`run_checkpoint_folder`)."""
    folders: list[Path] = []
    for keeper in keepers:
        given = keeper.dirpath if not getattr(keeper, "dirpath_is_run_folder", False) else None
        folder = Path(given) if given is not None else run_checkpoint_folder(trainer)
        if folder is not None and folder not in folders:
            folders.append(folder)
    return folders


def _no_callback(which: str) -> ValueError:
    return ValueError(
        f"--ckpt_path {which}: this run has no checkpoint callback (trainer.enable_checkpointing is false, or "
        "default_callbacks is false and the config lists none), so it knows no checkpoint folder; pass the path "
        "of a checkpoint"
    )


def _looked_in(trainer: Any, folders: list[Path]) -> str:
    if folders:
        return ", ".join(str(f) for f in folders)
    root = experiment_folder(trainer)
    return "the run's log folder" if root is None else f"any {root}/version_*/checkpoints"


def _last(trainer: Any) -> Path:
    """The run's last checkpoint: this process's fit's, else the one in the run's folder (or an exception's)."""
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    keepers = _keepers(trainer)
    exception_keepers = [cb for cb in trainer.callbacks if isinstance(cb, OnExceptionCheckpoint)]
    if not keepers and not exception_keepers:
        raise _no_callback("last")
    for keeper in keepers:  # a fit in this process: the file it wrote
        written = getattr(keeper, "last_model_path", "")
        if written and os.path.isfile(written):
            return Path(written)
    folders = _folders(trainer, keepers)
    candidates = [getattr(cb, "ckpt_path", None) for cb in exception_keepers]
    for keeper in keepers:
        name = f"{keeper.CHECKPOINT_NAME_LAST}{keeper.FILE_EXTENSION}"
        candidates += [str(folder / name) for folder in folders]
    found = [Path(p) for p in candidates if p and os.path.isfile(p)]
    if not found:
        raise FileNotFoundError(
            f"--ckpt_path last: there is no last checkpoint in {_looked_in(trainer, folders)} (nothing was fitted "
            "with this configuration yet); fit first, or pass the path of a checkpoint"
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def _best(trainer: Any) -> Path:
    """The best epoch's file: kept by a callback of this process, else found in the run's folder (`best_file`)."""
    keepers = _keepers(trainer)
    if not keepers:
        raise _no_callback("best")
    for keeper in keepers:  # a fit in this process: the callback knows its best file
        if keeper.best_model_path and os.path.isfile(keeper.best_model_path):
            return Path(keeper.best_model_path)
    folders = _folders(trainer, keepers)
    files = [(keeper, best_file(keeper, folder)) for keeper in keepers for folder in folders]
    for _, file in files:
        if file is not None and file.is_file():
            return file
    if not folders:
        raise FileNotFoundError(
            f"--ckpt_path best: there is no checkpoint in {_looked_in(trainer, folders)} (nothing was fitted with "
            "this configuration yet); fit first, or pass the path of a checkpoint"
        )
    known = [(keeper, file) for keeper, file in files if file is not None]
    if not known:
        raise ValueError(
            "--ckpt_path best: the run's checkpoint callbacks keep no best epoch under a fixed file name (that "
            "needs a monitor, save_top_k=1 and a filename without {fields}), so a new process cannot find it; pass "
            "the path of a checkpoint, or use --ckpt_path last"
        )
    keeper, file = known[0]
    last = file.parent / f"{keeper.CHECKPOINT_NAME_LAST}{keeper.FILE_EXTENSION}"
    metric = keeper.monitor or _METRIC_HINT
    if last.is_file():
        raise ValueError(
            f"--ckpt_path best: there is no {file.name} in {file.parent}: the fit that wrote {last.name} there "
            f"validated no epoch (the best epoch is kept by {metric}; a run without validation has none); "
            "use --ckpt_path last"
        )
    raise FileNotFoundError(
        f"--ckpt_path best: there is no {file.name} in {file.parent} (nothing was fitted with this configuration "
        "yet); fit first, or pass the path of a checkpoint"
    )


def best_file(keeper: Any, folder: str | os.PathLike[str] | None = None) -> Path | None:
    """Where `keeper` (a `ModelCheckpoint`) keeps its best epoch under a fixed name, or None if it has none.

    That is a top-1 checkpoint (``save_top_k=1``) with a monitor (`ExperimentCheckpoint`, whose `auto_monitor` says
    it picks its monitor at set-up) and a file name without ``{metric}`` fields, in `folder` (default: the keeper's
    own, once known).
    """
    monitored = keeper.monitor is not None or getattr(keeper, "auto_monitor", False)
    name = keeper.filename
    folder = keeper.dirpath if folder is None else folder
    if not monitored or keeper.save_top_k != 1 or folder is None or not name or "{" in name:
        return None
    return Path(folder) / f"{name}{keeper.FILE_EXTENSION}"
