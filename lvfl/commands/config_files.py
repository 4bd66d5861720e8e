"""What a command line's config files mean beyond their keys: paths relative to the file, a run's saved config.

- `resolve_table_paths(args)`: a config file's party tables (`data.init_args.parties[*].path` and `new_rows`) are
  named relative to the config file's own folder, as a bench grid's paths are relative to the grid file, so a
  config runs from any working directory. Each `--config FILE` that names a relative table path is passed on as
  the same config with those paths made absolute; a path given on the command line
  (`--data.init_args.parties=...`) stays relative to the working directory, as every command-line path does.
  The run's saved `config.yaml` then holds absolute paths, which `with_saved_config` relies on.
- `check_public_seeds(model, allowed, command)`: the config is public, every party reads it, so it must not fix the
  seed of privacy noise (a label mechanism's release, a gradient defense's noise, a party's `embedding_noise`):
  `lvfl party` and `lvfl launch` refuse one unless `--allow_public_seeds` (tests comparing runs), `lvfl fit` warns.
- `with_saved_config(args, command)`: `lvfl test`, `predict` and `export` from a checkpoint alone. Without any
  `--config`, a `--ckpt_path FILE` inside a run's version folder (`runs/<name>/version_N/checkpoints/best.ckpt`)
  brings the `config.yaml` that fit saved in that folder; the checkpoint's own fingerprint check still refuses a
  config of another run.

Only the YAML a file holds is read here; everything else about a config stays jsonargparse's (LightningCLI).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lvfl.checkpoints import SPECIAL_CKPT_PATHS

__all__ = [
    "ALLOW_PUBLIC_SEEDS_HELP",
    "SAVED_CONFIG",
    "SETUP_TIMEOUT",
    "SETUP_TIMEOUT_HELP",
    "TABLE_LISTS",
    "check_public_seeds",
    "config_values",
    "resolve_table_paths",
    "saved_config_of",
    "with_saved_config",
]

#: the datamodule options that list party tables, each entry with a `path` (`lvfl.datamodules.PartyTables`)
TABLE_LISTS = ("parties", "new_rows")

#: the name LightningCLI saves a run's config under, in the run's version folder
SAVED_CONFIG = "config.yaml"


def config_values(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index of the value in `args`, value) of every ``--config VALUE`` and ``--config=VALUE``."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            found.append((i + 1, args[i + 1]))
        elif arg.startswith("--config="):
            found.append((i, arg[len("--config=") :]))
    return found


def _option_value(args: Sequence[str], option: str) -> str | None:
    """The last value given to `option` (``--option V`` or ``--option=V``), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(f"{option}="):
            value = arg[len(option) + 1 :]
    return value


def _resolved(config: Any, base: Path) -> bool:
    """Make `config`'s relative table paths absolute against `base`, in place; whether any changed."""
    data = config.get("data") if isinstance(config, dict) else None
    init = data.get("init_args") if isinstance(data, dict) else None
    if not isinstance(init, dict):
        return False
    changed = False
    for key in TABLE_LISTS:
        tables = init.get(key)
        if not isinstance(tables, list):
            continue
        for table in tables:
            path = table.get("path") if isinstance(table, dict) else None
            if isinstance(path, str) and path and not Path(path).expanduser().is_absolute():
                table["path"] = str((base / Path(path).expanduser()).resolve())
                changed = True
    return changed


def resolve_table_paths(args: Sequence[str]) -> list[str]:
    """`args` with each config file that names relative party-table paths passed on with them resolved (module doc).

    Such a config file is replaced by a copy with the paths made absolute, in a temporary folder of this process; a
    file that does not parse is left as given, for LightningCLI to report.
    """
    out = [str(a) for a in args]
    for index, value in config_values(out):
        path = Path(value)
        if not path.is_file():
            continue
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not _resolved(config, path.resolve().parent):
            continue
        written = _written(config, path.name)
        out[index] = written if out[index] == value else f"--config={written}"
    return out


def _written(config: Any, name: str) -> str:
    """`config` written to a file of this process's own temporary folder (removed at exit), under `name`.

    (jsonargparse's `--config` also takes YAML text, but tries it as a file name first, which fails for a long one.)
    """
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = tempfile.mkdtemp(prefix="lvfl-config-")
        atexit.register(shutil.rmtree, _FOLDER, True)
    folder = Path(tempfile.mkdtemp(dir=_FOLDER))
    (folder / name).write_text(yaml.safe_dump(config, sort_keys=False))
    return str(folder / name)


_FOLDER: str | None = None


def saved_config_of(checkpoint: str | Path) -> Path | None:
    """The `config.yaml` of the run a checkpoint file belongs to: in its version folder, or beside it; else None."""
    path = Path(checkpoint)
    for folder in (path.parent.parent, path.parent):
        if (folder / SAVED_CONFIG).is_file():
            return folder / SAVED_CONFIG
    return None


def with_saved_config(
    args: Sequence[str], command: str, ckpt_path: str | None = None, keep_only: Sequence[str] | None = None
) -> list[str]:
    """`args`, led by ``--config <the run's config.yaml>`` when they name a checkpoint file but no config (module doc).

    The checkpoint is `ckpt_path`, else the ``--ckpt_path`` in `args`. With `keep_only`, the config is passed on
    with only those top-level keys (a subcommand's own options, such as `ckpt_path`, are not `lvfl export`'s).

    Raises:
        ValueError: no config is given and `--ckpt_path` is `last`/`best` (which run?), or the checkpoint's run
            folder holds no saved config.
    """
    out = [str(a) for a in args]
    if config_values(out):
        return out
    given = ckpt_path if ckpt_path is not None else _option_value(out, "--ckpt_path")
    if given is None or any(a in ("-h", "--help") for a in out):
        return out
    if given in SPECIAL_CKPT_PATHS:
        raise ValueError(
            f"{command} --ckpt_path {given} names a run's file by the run's config: give --config (the run's), or "
            "the checkpoint's path (runs/<name>/version_N/checkpoints/...), whose saved config.yaml is read"
        )
    saved = saved_config_of(given)
    if saved is None:
        folder = Path(given).parent
        if not Path(given).exists():
            raise FileNotFoundError(f"{command} --ckpt_path {given}: no such file")
        raise ValueError(
            f"{command} --ckpt_path {given}: no {SAVED_CONFIG} in {folder.parent} or {folder} (lvfl fit saves the "
            "run's config in its version folder); give the run's --config"
        )
    if keep_only is None:
        return ["--config", str(saved), *out]
    config = yaml.safe_load(saved.read_text()) or {}
    kept = {k: v for k, v in config.items() if k in keep_only}
    return ["--config", _written(kept, saved.name), *out]


#: how long a party waits for a peer's set-up message while the peer is up (`lvfl party --setup_timeout`)
SETUP_TIMEOUT = 3600.0
SETUP_TIMEOUT_HELP = (
    "seconds to wait for a peer's set-up message (PSI, split) while the peer is up and working, checked every "
    f"--timeout: set-up grows with the tables (a PSI of a million IDs takes minutes); default {SETUP_TIMEOUT:g}"
)

ALLOW_PUBLIC_SEEDS_HELP = (
    "run privacy noise seeded by the config (a label mechanism's, a gradient defense's or a party's embedding_noise "
    "seed), which every party reads and so could strip: for tests that compare a deployment with lvfl fit only"
)


def check_public_seeds(
    model: Any, allowed: bool, command: str, why_allowed: str = "because --allow_public_seeds"
) -> None:
    """Refuse privacy noise drawn from a seed the (public) config fixes, naming the option; warn when `allowed`.

    `model` is the run's protocol (`VFLModule.fixed_noise_seeds` says which noise its config seeds); `command` names
    the command in the message (``lvfl party``), `why_allowed` ends the warning.
    """
    seeds = getattr(model, "fixed_noise_seeds", dict)()
    if not seeds:
        return
    named = ", ".join(f"model.init_args.{option}={seed}" for option, seed in seeds.items())
    why = (
        f"{named}: the config fixes the seed of privacy noise, and every party reads the config, so any party can "
        "regenerate that noise and strip it"
    )
    if not allowed:
        raise ValueError(
            f"{command}: {why}; leave the seed out (the noise is then drawn from the OS), or pass "
            "--allow_public_seeds for a test that compares runs"
        )
    warnings.warn(f"{command}: {why}; running anyway {why_allowed}", UserWarning, stacklevel=2)
