"""The old module paths of `lvfl.privacy` load: in imports, pickles, configs and a checkpoint that name them.

`lvfl.moved_modules.MOVED` maps each old module path (`lvfl.privacy.masking`) to the module that holds its code
(`lvfl.privacy.aggregation.masking`). Here every old path imports as its new module; a pickle naming an old module
loads; every class path in a shipped config or bench grid resolves, as shipped and rewritten to the old module paths,
and every runnable config parses both ways; and a checkpoint written by revision 333e000's bank/retailer example
(tests/fixtures/bank_retailer_333e000.ckpt, whose run fingerprint records `lvfl.privacy.plain.Plain`) tests with
the metrics that revision's own `lvfl test` printed. Without the table each of these fails; the counterfactuals
below take it away and see the old paths refused.
"""

from __future__ import annotations

import importlib
import inspect
import io
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers import REPO
from test_cli import quick

import lvfl.moved_modules
import lvfl.privacy
from lvfl.commands.fit import build_cli
from lvfl.moved_modules import MOVED
from lvfl.privacy import PlainSoftLabels
from lvfl.privacy.aggregation.paillier_share import PaillierShare
from lvfl.runs import class_path, fingerprint_differences, run_fingerprint

FIXTURE = REPO / "tests" / "fixtures" / "bank_retailer_333e000.ckpt"
EXAMPLE = REPO / "examples" / "bank_retailer" / "config.yaml"
#: what `lvfl test --config examples/bank_retailer/config.yaml --ckpt_path <FIXTURE>` printed at 333e000
METRICS_AT_333E000 = {
    "test/acc/mean": 0.7564102411270142,
    "test/acc/party0": 0.7008547186851501,
    "test/acc/party1": 0.811965823173523,
    "test/auroc/mean": 0.8707551956176758,
    "test/auroc/party0": 0.8363583087921143,
    "test/auroc/party1": 0.9051521420478821,
    "test/loss/party0": 0.5752029418945312,
    "test/loss/party1": 0.5355207920074463,
}
SHIPPED_YAML = sorted([*(REPO / "configs").rglob("*.yaml"), *(REPO / "examples").rglob("*.yaml")])
CLASS_PATH = re.compile(r"\blvfl(?:\.[A-Za-z_]\w*)+")


def _runnable(path: Path) -> bool:
    """A whole run's config (a model and a datamodule), not a piece or a bench grid."""
    config = yaml.safe_load(path.read_text())
    return isinstance(config, dict) and isinstance(config.get("model"), dict) and isinstance(config.get("data"), dict)


RUNNABLE = [p for p in SHIPPED_YAML if _runnable(p)]


def _old_names() -> dict[str, str]:
    """Each class a moved module defines, by name -> its path under the old module (`lvfl.privacy.label_dp.X`)."""
    names = {}
    for old, new in MOVED.items():
        for name, obj in vars(importlib.import_module(new)).items():
            if inspect.isclass(obj) and obj.__module__ == new and not name.startswith("_"):
                names[name] = f"{old}.{name}"
    return names


def with_old_paths(text: str) -> str:
    """`text` with every `lvfl.privacy.<Class>` of a moved module written as the old module's path to it."""
    old = _old_names()
    return re.sub(r"\blvfl\.privacy\.([A-Z]\w*)\b", lambda m: old.get(m.group(1), m.group(0)), text)


def resolve(path: str) -> Any:
    """What a dotted path names: the module, or the attribute of the longest importable prefix."""
    module, attributes = path, []
    while True:
        try:
            found = importlib.import_module(module)
            break
        except ModuleNotFoundError:
            module, _, attribute = module.rpartition(".")
            attributes.insert(0, attribute)
            if not module:
                raise
    for attribute in attributes:
        found = getattr(found, attribute)
    return found


@pytest.fixture
def without_the_table(monkeypatch) -> None:
    """The counterfactual: no moved module known, and no old path already imported under its old name."""
    monkeypatch.setattr(lvfl.moved_modules, "MOVED", {})
    for old in MOVED:
        if old not in sys.modules or sys.modules[old].__name__ != old:  # keep `lvfl.privacy.soft_labels`, a package
            monkeypatch.delitem(sys.modules, old, raising=False)
            monkeypatch.delattr(lvfl.privacy, old.rpartition(".")[2], raising=False)


@pytest.fixture
def fresh_old_paths(monkeypatch) -> None:
    """No old path already imported under its old name, so that loading one goes through the import hook."""
    for old in MOVED:
        if old in sys.modules and sys.modules[old].__name__ != old:
            monkeypatch.delitem(sys.modules, old)


# ------------------------------------------------------------------------------------------------- imports
#: the modules of `lvfl/privacy/` (revision 333e000) whose code moved into its sub-packages, written out here so that
#: a row dropped from the table fails below rather than leaving the test
OLD_MODULES = [
    "lvfl.privacy.base",
    "lvfl.privacy.ckks",
    "lvfl.privacy.embedding_defenses",
    "lvfl.privacy.gradient_defenses",
    "lvfl.privacy.label_dp",
    "lvfl.privacy.label_release",
    "lvfl.privacy.masking",
    "lvfl.privacy.paillier",
    "lvfl.privacy.paillier_soft_labels",
    "lvfl.privacy.plain",
    "lvfl.privacy.soft_labels",
]


@pytest.mark.parametrize("old", OLD_MODULES)
def test_every_old_module_path_imports_as_its_module_now(old: str, fresh_old_paths) -> None:
    assert old in MOVED, f"{old} has no row in lvfl.moved_modules.MOVED"
    module, moved = importlib.import_module(old), importlib.import_module(MOVED[old])
    names = getattr(moved, "__all__", None) or [n for n in vars(moved) if not n.startswith("_")]
    assert names
    for name in names:
        assert getattr(module, name) is getattr(moved, name), f"{old}.{name}"
    assert getattr(lvfl.privacy, old.rpartition(".")[2]) is module  # `lvfl.privacy.masking` as an attribute


def test_an_old_path_is_its_new_module_under_its_own_name(fresh_old_paths) -> None:
    from lvfl.privacy.masking import DHMasking  # noqa: PLC0415

    assert DHMasking is lvfl.privacy.DHMasking
    assert sys.modules["lvfl.privacy.masking"] is sys.modules["lvfl.privacy.aggregation.masking"]
    assert sys.modules["lvfl.privacy.masking"].__spec__.name == "lvfl.privacy.aggregation.masking"
    assert class_path(DHMasking) == "lvfl.privacy.aggregation.masking.DHMasking"


def test_without_the_table_an_old_path_does_not_import(without_the_table) -> None:
    with pytest.raises(ModuleNotFoundError, match="lvfl.privacy.masking"):
        importlib.import_module("lvfl.privacy.masking")
    with pytest.raises(AttributeError, match="label_dp"):
        _ = lvfl.privacy.label_dp


# ------------------------------------------------------------------------------------------------- pickles
def old_pickle(obj: Any, old: str, new: str) -> bytes:
    """`obj` pickled (protocol 0: modules as text) as if its class still lived in module `old`."""
    data = pickle.dumps(obj, protocol=0)
    assert f"{new}\n".encode() in data
    return data.replace(f"{new}\n".encode(), f"{old}\n".encode())


OBJECTS = [  # an object of a moved module, the old module its pickle names, and the module that defines it now
    (lambda: lvfl.privacy.Plain(), "lvfl.privacy.plain", "lvfl.privacy.aggregation.plain"),
    (lambda: lvfl.privacy.Paillier(workers=1), "lvfl.privacy.paillier", "lvfl.privacy.aggregation.paillier"),
    (
        lambda: PaillierShare((5, 7), (2,), 30, 1, 0, 0, 512),  # re-exported by the module that defined it
        "lvfl.privacy.paillier",
        "lvfl.privacy.aggregation.paillier_share",
    ),
    (
        lambda: lvfl.privacy.GradientSparsification(0.5),
        "lvfl.privacy.gradient_defenses",
        "lvfl.privacy.defenses.gradients",
    ),
    (lambda: PlainSoftLabels(), "lvfl.privacy.soft_labels", "lvfl.privacy.soft_labels.channels"),  # a package now
]


@pytest.mark.parametrize(("make", "old", "new"), OBJECTS)
def test_a_pickle_naming_the_old_module_loads(make, old: str, new: str, fresh_old_paths) -> None:
    obj = make()
    loaded = pickle.loads(old_pickle(obj, old, new))  # noqa: S301 - our own bytes
    assert type(loaded) is type(obj)
    buffer = io.BytesIO()
    torch.save({"recipe": obj}, buffer, pickle_protocol=0, _use_new_zipfile_serialization=False)
    written = buffer.getvalue().replace(f"{new}\n".encode(), f"{old}\n".encode())
    assert f"{old}\n".encode() in written
    assert type(torch.load(io.BytesIO(written), weights_only=False)["recipe"]) is type(obj)


def test_without_the_table_a_pickle_naming_the_old_module_is_refused(without_the_table) -> None:
    data = old_pickle(lvfl.privacy.Plain(), "lvfl.privacy.plain", "lvfl.privacy.aggregation.plain")
    with pytest.raises(ModuleNotFoundError, match="lvfl.privacy.plain"):
        pickle.loads(data)  # noqa: S301 - our own bytes


@pytest.mark.slow
def test_a_fresh_process_loads_old_paths_before_anything_else() -> None:
    """The first statement of a process may name an old path: importing its package installs the hook."""
    data = old_pickle(lvfl.privacy.Plain(), "lvfl.privacy.plain", "lvfl.privacy.aggregation.plain")
    code = (
        "import pickle, sys\n"
        "from lvfl.privacy.label_dp import LaplaceLabels\n"
        "plain = pickle.loads(sys.stdin.buffer.read())\n"
        "print(type(plain).__module__, LaplaceLabels.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["lvfl.privacy.aggregation.plain", "lvfl.privacy.labels.mechanisms"]


# ------------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("path", SHIPPED_YAML, ids=lambda p: str(p.relative_to(REPO)))
def test_every_class_path_a_shipped_config_names_resolves_as_shipped_and_by_the_old_paths(path: Path) -> None:
    text = path.read_text()
    for text_of in (text, with_old_paths(text)):
        for name in sorted(set(CLASS_PATH.findall(text_of))):
            resolve(name)


def test_the_old_path_rewrite_reaches_every_moved_class_a_config_names() -> None:
    """The rewrite is not vacuous: the shipped configs name backends, label mechanisms and gradient defenses."""
    rewritten = "".join(with_old_paths(p.read_text()) for p in SHIPPED_YAML)
    for old in (
        "lvfl.privacy.plain.Plain",
        "lvfl.privacy.masking.DHMasking",
        "lvfl.privacy.paillier.Paillier",
        "lvfl.privacy.ckks.CKKS",
        "lvfl.privacy.label_dp.LaplaceLabels",
        "lvfl.privacy.label_dp.RandomizedResponse",
        "lvfl.privacy.gradient_defenses.GaussianNoise",
    ):
        assert old in rewritten


def test_without_the_table_an_old_class_path_does_not_resolve(without_the_table) -> None:
    with pytest.raises((ModuleNotFoundError, AttributeError), match="masking"):
        resolve("lvfl.privacy.masking.DHMasking")


@pytest.fixture(scope="module")
def parser(tmp_path_factory) -> Any:
    """The fit command's parser (LightningCLI's, with lvfl's subclass modes), as `lvfl fit` builds it."""
    tmp = tmp_path_factory.mktemp("parser")
    return build_cli(["--config", str(REPO / "configs" / "easter" / "wine.yaml"), *quick(tmp)], run=False).parser


@pytest.mark.slow
@pytest.mark.parametrize("config", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_every_runnable_config_parses_as_shipped_and_by_the_old_paths(config: Path, parser, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    old = tmp_path / config.name
    old.write_text(with_old_paths(config.read_text()))
    for path in (config, old):
        parser.parse_args(["--config", str(path), *quick(tmp_path)])


# ------------------------------------------------------------------------------------------------- the checkpoint
def saved_run() -> dict[str, Any]:
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)["lvfl"]["run"]


def test_the_fixture_records_the_old_class_path() -> None:
    """The checkpoint was written before the move: its fingerprint names the backend under its old module."""
    assert saved_run()["aggregation"] == {"class": "lvfl.privacy.plain.Plain"}


def test_a_fingerprint_before_the_move_compares_as_its_run(monkeypatch) -> None:
    saved = saved_run()
    now = {**saved, "aggregation": {"class": class_path(lvfl.privacy.Plain)}}
    assert now["aggregation"] == {"class": "lvfl.privacy.aggregation.plain.Plain"}
    assert fingerprint_differences(saved, now) == []
    monkeypatch.setattr(lvfl.moved_modules, "MOVED", {})  # the counterfactual
    assert fingerprint_differences(saved, now) == [
        ("aggregation.class", "lvfl.privacy.plain.Plain", "lvfl.privacy.aggregation.plain.Plain")
    ]


@pytest.mark.slow
def test_the_333e000_checkpoint_tests_as_it_did_then(tmp_path, monkeypatch) -> None:
    """`lvfl test` of the example's config on the checkpoint 333e000 wrote: its weights, its metrics."""
    monkeypatch.chdir(REPO)
    tested = build_cli(["test", "--config", str(EXAMPLE), "--ckpt_path", str(FIXTURE), *quick(tmp_path)])
    weights = torch.load(FIXTURE, map_location="cpu", weights_only=True)["state_dict"]
    for name, value in tested.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    metrics = {k: float(v) for k, v in tested.trainer.callback_metrics.items() if k.startswith("test/")}
    assert metrics == pytest.approx(METRICS_AT_333E000, abs=1e-6)
    now = run_fingerprint(tested.model, tested.datamodule)
    assert fingerprint_differences(saved_run(), now) == []
    assert now["aggregation"]["class"] == "lvfl.privacy.aggregation.plain.Plain"
