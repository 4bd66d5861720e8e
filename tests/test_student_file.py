"""The saved student (`lvfl.inference.student_file`): tensors plus JSON, never unpickled, refused by name when bad."""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser

from lvfl.inference.student import build_student, fit_student
from lvfl.inference.student_file import (
    STUDENT_FILE,
    STUDENT_SPEC_FILE,
    describe_factory,
    load_student,
    save_student,
)
from lvfl.inference.teacher import StudentData
from lvfl.models import MLP, LogisticRegression
from lvfl.models.base import PartyModelFactory
from lvfl.parties import TaskInfo

BINARY = TaskInfo(num_classes=2, kind="binary")


def _fitted(factory=None, task: TaskInfo = BINARY) -> torch.nn.Module:
    """A student trained a few steps on toy data (so its weights are not the seeded initialisation)."""
    factory = factory if factory is not None else partial(MLP, hidden=[5])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, generator=g)
    regression = task.is_regression
    y = x[:, 0] + 0.1 * torch.randn(16, generator=g) if regression else (x[:, 0] > 0).long()
    data = StudentData(
        x, y, torch.zeros(16, dtype=torch.bool), torch.zeros(16, task.num_outputs), regression=regression
    )
    model = build_student(factory, (3,), 4, task.num_outputs, seed=1)
    return fit_student(model, data, lam=0.0, epochs=2, batch_size=8, seed=0).model


def _save(folder: Path, factory=None, task: TaskInfo = BINARY) -> torch.nn.Module:
    factory = factory if factory is not None else partial(MLP, hidden=[5])
    model = _fitted(factory, task)
    save_student(model, folder, factory=factory, input_shape=(3,), embedding_dim=4, task=task)
    return model


def _spec(folder: Path) -> dict:
    return json.loads((folder / STUDENT_SPEC_FILE).read_text())


def _write_spec(folder: Path, spec: dict) -> None:
    """Rewrite student.json (recording the digest of the student.pt now beside it, as a forger would)."""
    spec["weights_sha256"] = hashlib.sha256((folder / STUDENT_FILE).read_bytes()).hexdigest()
    (folder / STUDENT_SPEC_FILE).write_text(json.dumps(spec))


class Payload:
    """Unpickling this object touches `marker`: the code a crafted pickle would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# -- round trip --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("factory", "task"),
    [
        (partial(MLP, hidden=[5], activation="tanh"), BINARY),
        (LogisticRegression, TaskInfo(num_classes=3)),
        (partial(MLP, hidden=[5]), TaskInfo(num_classes=0, kind="regression", target_mean=150.0, target_scale=70.0)),
    ],
)
def test_round_trip_answers_exactly_like_the_fitted_student(tmp_path, factory, task):
    model = _save(tmp_path, factory, task)
    assert load_student(tmp_path / "missing") is None
    loaded = load_student(tmp_path, task=task)
    x = torch.randn(7, 3)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))
    assert type(loaded) is type(model)
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2
        assert torch.equal(a, b)
    spec = _spec(tmp_path)
    assert spec["input_shape"] == [3]
    assert (spec["embedding_dim"], spec["num_outputs"], spec["task"]) == (4, task.num_outputs, task.kind)
    assert ("target_scale" in spec) == task.is_regression
    # the weights file holds tensors only: it loads with weights_only=True, as a dict of tensors
    state = torch.load(tmp_path / STUDENT_FILE, weights_only=True)
    assert set(state) == set(model.state_dict())


def test_a_factory_is_described_by_its_class_path_and_config_init_args():
    assert describe_factory(LogisticRegression) == ("lvfl.models.logistic.LogisticRegression", {})
    assert describe_factory(partial(MLP, hidden=(8,))) == ("lvfl.models.mlp.MLP", {"hidden": [8]})
    # a config's {class_path, init_args}, as jsonargparse hands it to StudentDistillation(model=...)
    parser = ArgumentParser()
    parser.add_argument("--model", type=PartyModelFactory)
    config = parser.parse_args(["--model", '{"class_path": "lvfl.models.MLP", "init_args": {"hidden": [8]}}'])
    factory = parser.instantiate(config).model
    class_path, init_args = describe_factory(factory)
    assert class_path == "lvfl.models.mlp.MLP"
    assert init_args["hidden"] == [8]
    for bad in (lambda s, e, n: MLP(s, e, n), partial(MLP, (3,)), partial(MLP, activation=torch.nn.ReLU)):
        with pytest.raises(ValueError, match="student"):
            describe_factory(bad)


def test_a_missing_student_is_none_and_a_mismatching_task_is_refused(tmp_path):
    assert load_student(tmp_path) is None
    _save(tmp_path)
    with pytest.raises(
        ValueError, match=r"student\.json: a binary student with 2 outputs does not fit .* regression.*another"
    ):
        load_student(tmp_path, task=TaskInfo(num_classes=0, kind="regression"))


# -- nothing is unpickled ----------------------------------------------------------------------------------------
def test_a_crafted_pickle_does_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's escape hatch must not reopen the hole
    marker = tmp_path / "pwned"
    control = tmp_path / "control"
    control.mkdir()
    torch.save({"w": Payload(marker)}, control / STUDENT_FILE)
    torch.load(control / STUDENT_FILE, weights_only=False)  # the old loader: the payload runs
    assert marker.is_file()
    marker.unlink()

    alone = tmp_path / "alone"  # a crafted student.pt beside a checkpoint, no student.json
    alone.mkdir()
    torch.save({"w": Payload(marker)}, alone / STUDENT_FILE)
    with pytest.raises(ValueError, match=rf"{STUDENT_FILE}: no {STUDENT_SPEC_FILE} beside it.*refit") as err:
        load_student(alone)
    assert str(alone / STUDENT_FILE) in str(err.value)
    assert not marker.exists()

    forged = tmp_path / "forged"  # with a valid-looking student.json that records the crafted file's digest
    _save(forged)
    spec = _spec(forged)
    torch.save({"w": Payload(marker)}, forged / STUDENT_FILE)
    _write_spec(forged, spec)
    with pytest.raises(ValueError, match=r"weights_only=True.*pickled .*never unpickles.*refit") as err:
        load_student(forged)
    assert str(forged / STUDENT_FILE) in str(err.value)
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_the_pickled_module_of_an_older_lvfl_is_refused_not_loaded(tmp_path):
    model = _fitted()
    torch.save(model, tmp_path / STUDENT_FILE)  # the old format: the whole module, pickled
    with pytest.raises(ValueError, match="pickled module an older lvfl saved.*refit the run"):
        load_student(tmp_path)
    _save(tmp_path / "new")
    spec = _spec(tmp_path / "new")
    (tmp_path / "new" / STUDENT_FILE).write_bytes((tmp_path / STUDENT_FILE).read_bytes())
    _write_spec(tmp_path / "new", spec)
    with pytest.raises(ValueError, match=r"weights_only=True.*a pickled lvfl\.models\.mlp\.MLP"):
        load_student(tmp_path / "new")


@pytest.mark.parametrize(
    "class_path", ["os.system", "subprocess.Popen", "builtins.eval", "torch.nn.functional.relu", "no.such.Module", 3]
)
def test_a_crafted_json_naming_no_module_class_is_refused_before_any_call(tmp_path, class_path):
    marker = tmp_path / "pwned"
    _save(tmp_path)
    spec = _spec(tmp_path)
    spec["class_path"] = class_path
    spec["init_args"] = {"command": f"touch {marker}", "args": ["touch", str(marker)]}
    _write_spec(tmp_path, spec)
    with pytest.raises(ValueError, match="names no subclass of torch.nn.Module") as err:
        load_student(tmp_path)
    assert str(tmp_path / STUDENT_SPEC_FILE) in str(err.value)
    assert repr(class_path) in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda d, s: (d / STUDENT_SPEC_FILE).write_text("{not json"), "not a readable JSON student spec"),
        (lambda d, s: (d / STUDENT_SPEC_FILE).write_text('{"input_shape": NaN}'), "not a readable JSON"),
        (lambda d, s: (d / STUDENT_SPEC_FILE).write_bytes(b"\xff\xfe"), "not a readable JSON"),
        (lambda d, s: _write_spec(d, s | {"version": 2}), "format/version"),
        (lambda d, s: _write_spec(d, s | {"input_shape": [5]}), "does not fit the lvfl.models.mlp.MLP"),
        (lambda d, s: _write_spec(d, s | {"num_outputs": 0}), "num_outputs 0"),
        (lambda d, s: _write_spec(d, s | {"init_args": {"hidden": "x"}}), "cannot be built"),
        (lambda d, s: _write_spec(d, s | {"extra": 1}), "keys"),
        (lambda d, s: (d / STUDENT_FILE).write_bytes((d / STUDENT_FILE).read_bytes()[:100]), "SHA-256"),
        (lambda d, s: _truncate_and_record(d, s), "weights_only=True.*truncated or damaged"),
        (lambda d, s: _pickled_list_and_record(d, s), "not a state dict of tensors"),
        (lambda d, s: (d / STUDENT_FILE).unlink(), "weights student.pt are missing"),
    ],
)
def test_every_unreadable_pair_is_one_value_error_naming_the_file(tmp_path, corrupt, message):
    _save(tmp_path)
    corrupt(tmp_path, _spec(tmp_path))
    with pytest.raises(ValueError, match=message) as err:
        load_student(tmp_path)
    text = str(err.value)
    assert str(tmp_path) in text
    assert "refit" in text
    assert "\n" not in text


def _truncate_and_record(folder: Path, spec: dict) -> None:
    (folder / STUDENT_FILE).write_bytes((folder / STUDENT_FILE).read_bytes()[:200])
    _write_spec(folder, spec)


def _pickled_list_and_record(folder: Path, spec: dict) -> None:
    torch.save([torch.zeros(2)], folder / STUDENT_FILE)
    _write_spec(folder, spec)
