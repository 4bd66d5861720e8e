"""A grid file: its checks, its cells, and the check that every cell parses before any runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

GRID_KEYS = {
    "name",
    "data",
    "parties",
    "protocols",
    "datasets",
    "seeds",
    "overrides",
    "target_accuracy",
    "reference",
    "out",
    "report",
}
PROTOCOL_KEYS = {"config", "overrides"}
#: What a protocol template falls back to when a dataset has no file of its own: `{dataset}` replaced by this.
DEFAULT_PROTOCOL = "default"
#: The bench's evaluation rule; part of every cell's fingerprint, so changing it reruns finished cells.
EVALUATION = "test at the best val/acc/mean checkpoint and after the last epoch; set-up bytes counted to target"
MONITOR = "val/acc/mean"


class GridError(ValueError):
    """A grid file that cannot run; the message names the bad entry."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid: `lvfl fit` + test on `configs` (several `--config`, in order) with `overrides`."""

    protocol: str
    dataset: str
    seed: int
    configs: tuple[str, ...]
    overrides: tuple[str, ...]

    @property
    def key(self) -> str:
        """Its folder below `<out>/cells/`."""
        protocol = re.sub(r"[^A-Za-z0-9._-]+", "_", self.protocol)
        return f"{protocol}/{self.dataset}/seed{self.seed}"

    def args(self, save_dir: str) -> list[str]:
        """The lvfl CLI arguments of this cell (without the subcommand); built by `lvfl.cli.run_args`."""
        from lvfl.cli import run_args

        callbacks = [
            {"class_path": "lvfl.callbacks.CommunicationMeter", "init_args": {"print_summary": False}},
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(Path(save_dir) / "best"),
                    "filename": "best",
                    "monitor": MONITOR,
                    "mode": "max",
                    "save_top_k": 1,
                    "save_last": False,
                    "enable_version_counter": False,
                },
            },
        ]
        return run_args(
            self.configs,
            self.seed,
            save_dir,
            self.overrides,
            name="logs",
            callbacks=callbacks,
            checkpointing=True,
            default_callbacks=True,
        )

    def fingerprint(self) -> str:
        """Changes whenever anything that could change the cell's result changes."""
        from lvfl import __version__

        texts = [Path(c).read_text() for c in self.configs]
        blob = json.dumps([texts, list(self.overrides), self.seed, __version__, EVALUATION])
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Grid:
    """A parsed grid file, its paths already resolved against the grid file's folder."""

    name: str
    protocols: dict[str, str]
    datasets: list[str]
    seeds: list[int]
    overrides: list[str] = field(default_factory=list)
    target_accuracy: float | dict[str, float] | None = None
    out: str = "runs/bench"
    report: str | None = None
    protocol_overrides: dict[str, list[str]] = field(default_factory=dict)
    reference: str | None = None
    data: str | None = None
    parties: str | None = None

    def target(self, dataset: str) -> float | None:
        """The accuracy whose cost `MB to target` measures on `dataset`."""
        if isinstance(self.target_accuracy, dict):
            return self.target_accuracy.get(dataset)
        return self.target_accuracy

    def protocol_config(self, protocol: str, dataset: str) -> str:
        """The protocol's file for `dataset`, else its `default` file (`{dataset}` -> `default`)."""
        template = self.protocols[protocol]
        own, default = template.format(dataset=dataset), template.format(dataset=DEFAULT_PROTOCOL)
        for path in (own, default):
            if Path(path).is_file():
                return path
        raise GridError(
            f"protocol {protocol!r} has no config for dataset {dataset!r}: neither {own} nor {default} exists"
        )

    def configs(self, protocol: str, dataset: str) -> tuple[str, ...]:
        """The `--config` files of one (protocol, dataset), in order: data, protocol, parties (those the grid names).

        The parties piece comes last because it sets `model.init_args` without a `class_path`, which jsonargparse
        accepts only once an earlier file has chosen the protocol (see configs/README.md).
        """
        data = [] if self.data is None else [self.piece("data", self.data, dataset)]
        parties = [] if self.parties is None else [self.piece("parties", self.parties, dataset)]
        return (*data, self.protocol_config(protocol, dataset), *parties)

    @staticmethod
    def piece(kind: str, template: str, dataset: str) -> str:
        """The `data` or `parties` file of `dataset`, which must exist."""
        path = template.format(dataset=dataset)
        if not Path(path).is_file():
            raise GridError(f"dataset {dataset!r} has no {kind} config: {path} does not exist")
        return path

    def cells(self) -> list[Cell]:
        """Every (protocol, dataset, seed), checking that every config file each one names exists."""
        cells = []
        for protocol in self.protocols:
            for dataset in self.datasets:
                configs = self.configs(protocol, dataset)
                overrides = (*self.overrides, *self.protocol_overrides.get(protocol, []))
                cells += [Cell(protocol, dataset, s, configs, overrides) for s in self.seeds]
        return cells


def resolve(base: Path, path: str) -> str:
    """`path` as written in a grid file: relative to the grid file's folder `base` (absolute paths stay as they are)."""
    return os.path.normpath(base / Path(path).expanduser())


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file; its relative paths are taken from the grid file's folder."""
    raw = yaml.safe_load(Path(path).read_text())
    base = Path(path).parent
    if not isinstance(raw, dict):
        raise GridError(f"{path}: a grid file is a mapping with keys {sorted(GRID_KEYS)}")
    unknown = set(raw) - GRID_KEYS
    if unknown:
        raise GridError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(GRID_KEYS)}")
    for key in ("protocols", "datasets", "seeds"):
        if not raw.get(key):
            raise GridError(f"{path}: `{key}` is required and must not be empty")
    pieces = {}
    for key in ("data", "parties"):
        template = raw.get(key)
        if template is not None and not (isinstance(template, str) and "{dataset}" in template):
            raise GridError(f"{path}: `{key}` {template!r} must be a path template containing {{dataset}}")
        pieces[key] = None if template is None else resolve(base, template)
    protocols = raw["protocols"]
    if not isinstance(protocols, dict):
        raise GridError(f"{path}: `protocols` maps a label to a config template with {{dataset}}")
    templates: dict[str, str] = {}
    protocol_overrides: dict[str, list[str]] = {}
    for label, entry in protocols.items():
        template, own = entry, []
        if isinstance(entry, dict):
            unknown = set(entry) - PROTOCOL_KEYS
            if unknown or "config" not in entry:
                raise GridError(
                    f"{path}: protocol {label!r}: an entry is a template or a mapping with keys "
                    f"{sorted(PROTOCOL_KEYS)} (`config` required); got keys {sorted(entry)}"
                )
            template, own = entry["config"], entry.get("overrides") or []
            _check_overrides(path, own, f"protocol {label!r}: ")
        if not isinstance(template, str) or "{dataset}" not in template:
            raise GridError(f"{path}: protocol {label!r}: template {template!r} must contain {{dataset}}")
        templates[str(label)] = resolve(base, template)
        protocol_overrides[str(label)] = list(own)
    reference = raw.get("reference")
    if reference is not None and str(reference) not in templates:
        raise GridError(f"{path}: `reference` {reference!r} is not one of the protocols {sorted(templates)}")
    seeds = raw["seeds"]
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise GridError(f"{path}: `seeds` must be integers, got {seeds}")
    target = raw.get("target_accuracy")
    targets = target.items() if isinstance(target, dict) else [("", target)] if target is not None else []
    for dataset, value in targets:
        if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1):
            where = f"[{dataset!r}]" if dataset else ""
            raise GridError(f"{path}: `target_accuracy`{where} must be in (0, 1], got {value!r}")
        if dataset and dataset not in raw["datasets"]:
            raise GridError(f"{path}: `target_accuracy` names dataset {dataset!r}, which is not in `datasets`")
    overrides = raw.get("overrides") or []
    _check_overrides(path, overrides)
    return Grid(
        name=str(raw.get("name", Path(path).stem)),
        protocols=templates,
        protocol_overrides=protocol_overrides,
        reference=None if reference is None else str(reference),
        datasets=[str(d) for d in raw["datasets"]],
        seeds=list(seeds),
        overrides=list(overrides),
        target_accuracy=(
            {str(k): float(v) for k, v in target.items()} if isinstance(target, dict) else target and float(target)
        ),
        # no `out` in the file: a folder below the current one, like any output path not written in the grid
        out=resolve(base, raw["out"]) if raw.get("out") is not None else f"runs/bench/{Path(path).stem}",
        report=None if raw.get("report") is None else resolve(base, raw["report"]),
        data=pieces["data"],
        parties=pieces["parties"],
    )


def _check_overrides(path: str | Path, overrides: Any, where: str = "") -> None:
    if not isinstance(overrides, list):
        raise GridError(f"{path}: {where}`overrides` must be a list of command-line options, got {overrides!r}")
    bad = [o for o in overrides if not (isinstance(o, str) and o.startswith("--"))]
    if bad:
        raise GridError(f"{path}: {where}overrides are command-line options like '--trainer.max_epochs=5'; bad: {bad}")


def check_cells(cells: Sequence[Cell]) -> None:
    """Parse and instantiate every distinct cell configuration, so a bad override fails before anything runs."""
    from lvfl.cli import build_cli

    seen = set()
    for cell in cells:
        if (cell.configs, cell.overrides) in seen:
            continue
        seen.add((cell.configs, cell.overrides))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                build_cli(cell.args(tmp), run=False)
            except SystemExit as exc:
                raise GridError(
                    f"cell {cell.protocol}/{cell.dataset}: the config(s) {' + '.join(cell.configs)} with overrides "
                    f"{list(cell.overrides)} do not parse (see the error printed above)"
                ) from exc
