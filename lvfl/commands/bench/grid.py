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
    "paper",
    "network",
    "twin",
    "metric",
    "out",
    "report",
    "attacks",
    "defenses",
}
#: the label of the undefended protocol in a grid with `defenses:` (an entry with no overrides); DCS's reference
NO_DEFENSE = "none"
PROTOCOL_KEYS = {"config", "overrides"}
DATASET_KEYS = {"dataset", "data", "parties", "overrides"}
PAPER_KEYS = {"source", "metric", "values"}
#: what a `paper:` block's numbers may measure: the test metric lvfl logs as `test/<metric>/mean`, in percent
PAPER_METRICS = ("acc", "auroc")
#: What a protocol template falls back to when a dataset has no file of its own: `{dataset}` replaced by this.
DEFAULT_PROTOCOL = "default"
#: The bench's evaluation rule; part of every cell's fingerprint, so changing it reruns finished cells.
EVALUATION = "test at the best val/acc/mean checkpoint and after the last epoch; set-up bytes counted to target"
#: what a grid may select checkpoints by and count "to target" in (`metric:`): the validation metric
#: `val/<metric>/mean`; accuracy, AUROC and R^2 are better higher, MAE and RMSE lower
SELECTION_METRICS = {"acc": "max", "auroc": "max", "r2": "max", "mae": "min", "rmse": "min"}


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
    network: str = ""  # the grid's `network:` block as JSON (NetworkSimulator's arguments), or "" for none
    twin: bool = False  # the grid's `twin: true`: also fit a Plain twin of the cell (when its backend is not Plain)
    metric: str = "acc"  # the grid's `metric:`: checkpoints are selected by `val/<metric>/mean`
    attacks: str = ""  # the grid's `attacks:` as JSON (callback specs of `lvfl.attacks`), or "" for none

    @property
    def monitor(self) -> str:
        """The validation metric the cell's best checkpoint is selected by."""
        return f"val/{self.metric}/mean"

    @property
    def key(self) -> str:
        """Its folder below `<out>/cells/`."""
        return f"{_folder(self.protocol)}/{_folder(self.dataset)}/seed{self.seed}"

    def args(self, save_dir: str) -> list[str]:
        """The lvfl CLI arguments of this cell (without the subcommand); built by `lvfl.commands.fit.run_args`."""
        from lvfl.commands.fit import run_args

        callbacks = [
            {"class_path": "lvfl.callbacks.CommunicationMeter", "init_args": {"print_summary": False}},
            {
                "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                "init_args": {
                    "dirpath": str(Path(save_dir) / "best"),
                    "filename": "best",
                    "monitor": self.monitor,
                    "mode": SELECTION_METRICS[self.metric],
                    "save_top_k": 1,
                    "save_last": False,
                    "enable_version_counter": False,
                },
            },
        ]
        if self.network:
            init = {**json.loads(self.network), "print_summary": False}
            callbacks.append({"class_path": "lvfl.callbacks.NetworkSimulator", "init_args": init})
        callbacks += json.loads(self.attacks) if self.attacks else []
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
        extra = [self.network] if self.network else []  # grids without these keep their cells' fingerprints
        extra += ["twin"] if self.twin else []
        extra += [f"metric={self.metric}"] if self.metric != "acc" else []
        extra += [f"attacks={self.attacks}"] if self.attacks else []
        blob = json.dumps([texts, list(self.overrides), self.seed, __version__, EVALUATION, *extra])
        return hashlib.sha256(blob.encode()).hexdigest()


def _folder(label: str) -> str:
    """A grid label as a folder name: runs of characters other than letters, digits, `._-` become one `_`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


@dataclass(frozen=True)
class DatasetEntry:
    """One entry of a grid's `datasets`: the dataset its templates take, or its own pieces, and its overrides.

    A plain name `cifar10` is `DatasetEntry("cifar10")`: the grid's `data`, protocol and `parties` templates with
    `{dataset}` = cifar10. A mapping entry (`cinic10 C=2: {dataset: cinic10, parties: ..., overrides: [...]}`)
    is a variant of a dataset: `dataset` fills the templates (default: the label), `data` / `parties` name files
    that replace the templates' (relative to the grid file), and `overrides` apply to its cells only.
    """

    dataset: str
    data: str | None = None
    parties: str | None = None
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Paper:
    """A grid's `paper:` block: the published numbers the report prints beside lvfl's, and where they come from."""

    source: str
    values: dict[str, dict[str, float]]  # protocol -> dataset label -> number (percent)
    metric: str | dict[str, str] = "acc"  # per dataset label, else for all

    def metric_of(self, dataset: str) -> str:
        """The metric of the paper's number for `dataset` (`acc` or `auroc`)."""
        return self.metric.get(dataset, "acc") if isinstance(self.metric, dict) else self.metric

    def value(self, protocol: str, dataset: str) -> float | None:
        """The paper's number for the cell, None where the paper has none."""
        return self.values.get(protocol, {}).get(dataset)


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
    entries: dict[str, DatasetEntry] = field(default_factory=dict)
    paper: Paper | None = None
    network: str = ""
    twin: bool = False
    metric: str = "acc"
    attacks: str = ""
    #: with `defenses:`, each protocol label of the grid -> (the protocol, the defense) it was expanded from
    defended: dict[str, tuple[str, str]] = field(default_factory=dict)

    def entry(self, dataset: str) -> DatasetEntry:
        """The `datasets` entry labelled `dataset` (a plain name is its own entry)."""
        return self.entries.get(dataset) or DatasetEntry(dataset)

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
        """The `--config` files of one (protocol, dataset entry), in order: data, protocol, parties (those named).

        The parties piece comes last because it sets `model.init_args` without a `class_path`, which jsonargparse
        accepts only once an earlier file has chosen the protocol (see configs/README.md). An entry's own `data` or
        `parties` file replaces the template's.
        """
        entry = self.entry(dataset)
        pieces = []
        for kind, own, template in (("data", entry.data, self.data), ("parties", entry.parties, self.parties)):
            if own is not None:
                if not Path(own).is_file():
                    raise GridError(f"dataset {dataset!r}: its {kind} config {own} does not exist")
                pieces.append([own])
            else:
                pieces.append([] if template is None else [self.piece(kind, template, entry.dataset)])
        data, parties = pieces
        return (*data, self.protocol_config(protocol, entry.dataset), *parties)

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
                own = self.entry(dataset).overrides
                overrides = (*self.overrides, *own, *self.protocol_overrides.get(protocol, []))
                cells += [
                    Cell(protocol, dataset, s, configs, overrides, self.network, self.twin, self.metric, self.attacks)
                    for s in self.seeds
                ]
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
    attacks = _attacks(path, raw.get("attacks"))
    templates, protocol_overrides, defended = _defended(path, raw.get("defenses"), templates, protocol_overrides)
    labels, entries = _datasets(path, base, raw["datasets"])
    for kind, names in (("protocols", list(templates)), ("datasets", labels)):
        folders: dict[str, str] = {}
        for name in names:
            other = folders.setdefault(_folder(name), name)
            if other != name:
                raise GridError(f"{path}: {kind} {other!r} and {name!r} would share the cell folder {_folder(name)!r}")
    reference = raw.get("reference")
    if reference is not None and defended and str(reference) in {p for p, _ in defended.values()}:
        reference = next(label for label, (p, d) in defended.items() if p == str(reference))
    if reference is not None and str(reference) not in templates:
        raise GridError(f"{path}: `reference` {reference!r} is not one of the protocols {sorted(templates)}")
    seeds = raw["seeds"]
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise GridError(f"{path}: `seeds` must be integers, got {seeds}")
    metric = raw.get("metric", "acc")
    if metric not in SELECTION_METRICS:
        raise GridError(f"{path}: `metric` {metric!r} is not one of {sorted(SELECTION_METRICS)}")
    target = raw.get("target_accuracy")
    targets = target.items() if isinstance(target, dict) else [("", target)] if target is not None else []
    bounded = metric in ("acc", "auroc", "r2")  # at most 1; MAE and RMSE are in the target's units
    for dataset, value in targets:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and value > 0 and (value <= 1 or not bounded)):
            where = f"[{dataset!r}]" if dataset else ""
            limits = "in (0, 1]" if bounded else "> 0"
            raise GridError(f"{path}: `target_accuracy`{where} must be {limits}, got {value!r}")
        if dataset and dataset not in labels:
            raise GridError(f"{path}: `target_accuracy` names dataset {dataset!r}, which is not in `datasets`")
    overrides = raw.get("overrides") or []
    _check_overrides(path, overrides)
    network = raw.get("network")
    if network is not None:
        from lvfl.callbacks.network import NetworkSimulator

        if not isinstance(network, dict):
            raise GridError(f"{path}: `network` holds NetworkSimulator's arguments (links, devices), got {network!r}")
        try:
            NetworkSimulator(**network)
        except (TypeError, ValueError) as err:
            raise GridError(f"{path}: `network`: {err}") from None
    twin = raw.get("twin", False)
    if not isinstance(twin, bool):
        raise GridError(f"{path}: `twin` is true or false (fit a Plain twin of every protected cell), got {twin!r}")
    return Grid(
        name=str(raw.get("name", Path(path).stem)),
        protocols=templates,
        protocol_overrides=protocol_overrides,
        reference=None if reference is None else str(reference),
        datasets=labels,
        entries=entries,
        paper=_paper(path, raw.get("paper"), list(templates), labels),
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
        network="" if network is None else json.dumps(network, sort_keys=True),
        twin=twin,
        metric=metric,
        attacks=attacks,
        defended=defended,
    )


def _attacks(path: str | Path, raw: Any) -> str:
    """The checked `attacks:` list (callback specs of `lvfl.attacks` classes) as JSON for the cells, "" if none."""
    if raw is None:
        return ""
    if not isinstance(raw, list) or not raw:
        raise GridError(f"{path}: `attacks` is a non-empty list of {{class_path: lvfl.attacks.<Attack>, init_args}}")
    from lvfl import attacks

    names = []
    for spec in raw:
        cls = spec.get("class_path", "") if isinstance(spec, dict) else ""
        found = getattr(attacks, cls.removeprefix("lvfl.attacks."), None) if cls.startswith("lvfl.attacks.") else None
        keys_ok = isinstance(spec, dict) and not set(spec) - {"class_path", "init_args"}
        if not (keys_ok and isinstance(found, type) and issubclass(found, attacks.AttackRecord)):
            raise GridError(
                f"{path}: `attacks` entry {spec!r} is not {{class_path: lvfl.attacks.<an attack>, init_args: ...}}"
            )
        names.append((spec.get("init_args") or {}).get("name") or found.name)
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise GridError(f"{path}: two `attacks` log under attack/{clash[0]}/: give one of them a `name` in init_args")
    return json.dumps(raw, sort_keys=True)


def _defended(
    path: str | Path, raw: Any, templates: dict[str, str], overrides: dict[str, list[str]]
) -> tuple[dict[str, str], dict[str, list[str]], dict[str, tuple[str, str]]]:
    """Every protocol crossed with every `defenses:` entry (label -> overrides): "<protocol> + <defense>" labels."""
    if raw is None:
        return templates, overrides, {}
    if not isinstance(raw, dict) or not raw:
        raise GridError(f"{path}: `defenses` maps a label to a list of overrides (`{NO_DEFENSE}: []` for none)")
    crossed: dict[str, str] = {}
    crossed_overrides: dict[str, list[str]] = {}
    defended: dict[str, tuple[str, str]] = {}
    for defense, extra in raw.items():
        _check_overrides(path, extra, f"defense {defense!r}: ")
        if str(defense) == NO_DEFENSE and extra:
            raise GridError(f"{path}: defense {NO_DEFENSE!r} is the undefended run; it takes no overrides")
    for protocol, template in templates.items():
        for defense, extra in raw.items():
            label = f"{protocol} + {defense}"
            crossed[label] = template
            crossed_overrides[label] = [*overrides.get(protocol, []), *extra]
            defended[label] = (protocol, str(defense))
    return crossed, crossed_overrides, defended


def _datasets(path: str | Path, base: Path, raw: Any) -> tuple[list[str], dict[str, DatasetEntry]]:
    """The labels of `datasets` in order and the entries given as mappings (paths resolved against `base`)."""
    if not isinstance(raw, list):
        raise GridError(f"{path}: `datasets` is a list of names or of one-key mappings label -> {{dataset, ...}}")
    labels: list[str] = []
    entries: dict[str, DatasetEntry] = {}
    for item in raw:
        if isinstance(item, dict) and len(item) == 1:
            ((label, fields),) = item.items()
            label = str(label)
            if not isinstance(fields, dict) or set(fields) - DATASET_KEYS:
                got = sorted(fields) if isinstance(fields, dict) else fields
                raise GridError(
                    f"{path}: dataset {label!r}: an entry is a name or a mapping with keys {sorted(DATASET_KEYS)}; "
                    f"got {got!r}"
                )
            own = list(fields.get("overrides") or [])
            _check_overrides(path, own, f"dataset {label!r}: ")
            files = {k: resolve(base, str(fields[k])) for k in ("data", "parties") if fields.get(k) is not None}
            entries[label] = DatasetEntry(str(fields.get("dataset", label)), overrides=tuple(own), **files)
        elif isinstance(item, str | int) and not isinstance(item, bool):
            label = str(item)
        else:
            raise GridError(f"{path}: `datasets` entry {item!r} is neither a name nor a one-key mapping")
        if label in labels:
            raise GridError(f"{path}: dataset {label!r} is listed twice in `datasets`")
        labels.append(label)
    return labels, entries


def _paper(path: str | Path, raw: Any, protocols: list[str], datasets: list[str]) -> Paper | None:
    """The checked `paper:` block: its source named, its numbers percentages of known protocols and datasets."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - PAPER_KEYS or not raw.get("source") or "values" not in raw:
        raise GridError(
            f"{path}: `paper` is a mapping with keys {sorted(PAPER_KEYS)} (`source`, naming the paper and table, and "
            f"`values`, protocol -> dataset -> number, required); got {raw!r}"
        )
    metric = raw.get("metric", "acc")
    for dataset, name in metric.items() if isinstance(metric, dict) else [("", metric)]:
        if name not in PAPER_METRICS:
            raise GridError(f"{path}: `paper.metric` {name!r} must be one of {list(PAPER_METRICS)}")
        if dataset and dataset not in datasets:
            raise GridError(f"{path}: `paper.metric` names dataset {dataset!r}, which is not in `datasets`")
    values = raw["values"]
    if not isinstance(values, dict):
        raise GridError(f"{path}: `paper.values` maps a protocol to {{dataset: number}}, got {values!r}")
    checked: dict[str, dict[str, float]] = {}
    for protocol, row in values.items():
        if str(protocol) not in protocols:
            raise GridError(f"{path}: `paper.values` names protocol {protocol!r}, which is not in `protocols`")
        if not isinstance(row, dict):
            raise GridError(f"{path}: `paper.values.{protocol}` maps a dataset to a number, got {row!r}")
        for dataset, value in row.items():
            if str(dataset) not in datasets:
                raise GridError(f"{path}: `paper.values.{protocol}` names dataset {dataset!r}, not in `datasets`")
            if not (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 100):
                raise GridError(f"{path}: `paper.values.{protocol}.{dataset}` must be a percentage, got {value!r}")
        checked[str(protocol)] = {str(d): float(v) for d, v in row.items()}
    metric = metric if isinstance(metric, str) else {str(k): v for k, v in metric.items()}
    return Paper(str(raw["source"]), checked, metric)


def _check_overrides(path: str | Path, overrides: Any, where: str = "") -> None:
    if not isinstance(overrides, list):
        raise GridError(f"{path}: {where}`overrides` must be a list of command-line options, got {overrides!r}")
    bad = [o for o in overrides if not (isinstance(o, str) and o.startswith("--"))]
    if bad:
        raise GridError(f"{path}: {where}overrides are command-line options like '--trainer.max_epochs=5'; bad: {bad}")


def check_cells(cells: Sequence[Cell]) -> None:
    """Parse and instantiate every distinct cell configuration, so a bad override fails before anything runs."""
    from lvfl.commands.fit import build_cli

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
