"""Refusals that need no PyTorch, made before the front door loads it: a missing config file or party table.

Why: `lvfl fit` imports torch and Lightning before LightningCLI reads a single option, about seven seconds on a laptop,
so every mistake, even a misspelt file name, was refused only after them. These checks read the command line and the
config files with PyYAML alone and refuse in the same one line the full run would print, well under a second in.
They are conservative: whatever they cannot decide for certain (a table list replaced on the command line, a file
that does not parse) is left to the full run, which checks everything again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lvfl.commands.config_files import TABLE_LISTS, config_values

__all__ = ["early_refusal"]

#: command-line options that may replace the config files' table lists: left to the full run
REPLACED = (
    "--data=",
    "--data.class_path",
    "--data.init_args=",
    "--data.init_args.parties",
    "--data.init_args.new_rows",
)


def _tables(config: Any) -> dict[str, list[Any]] | None:
    """The config's party-table lists (`data.init_args.parties`, `new_rows`), or None where it sets no `data`."""
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict):
        return None
    init = data.get("init_args")
    init = init if isinstance(init, dict) else {}
    return {key: init[key] for key in TABLE_LISTS if isinstance(init.get(key), list)}


def early_refusal(args: Sequence[str], check_tables: bool = True) -> str | None:
    """The one-line refusal of a config file or party table that does not exist, or None (the full run decides).

    `check_tables` False checks the config files only: `lvfl party` runs where only its own party's table is on the
    disk, though the config names every party's.
    """
    effective: tuple[Path, dict[str, list[Any]]] | None = None
    for _, value in config_values(args):
        path = Path(value).expanduser()
        if not path.is_file():
            return f"--config {value}: no such file"
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None  # LightningCLI says what is wrong with it
        tables = _tables(config)
        if tables is not None:  # the last config that sets `data` decides (a fragment without tables: no check)
            effective = (path.resolve().parent, tables) if tables else None
    if not check_tables or effective is None or any(arg == "--data" or arg.startswith(REPLACED) for arg in args):
        return None
    base, tables = effective
    for entries in tables.values():
        for entry in entries:
            given = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(given, str) or not given:
                continue
            table = Path(given).expanduser()
            table = table if table.is_absolute() else (base / table).resolve()
            if not table.exists():
                return f"party table {table} does not exist (the `path` of a PartyTables entry)"
    return None
