"""No checkpoint is unpickled: every load is `weights_only=True`, and a file that is not a checkpoint is one line.

A crafted checkpoint (an object whose `__reduce__` creates a marker file when unpickled) handed to `lvfl fit`, `test`,
`predict` and `export` never runs: each exits with status 2 and one line `lvfl: error: ...` naming the file, even with
`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`. Every `torch.load` those commands make on a good checkpoint passes
`weights_only=True`, and lvfl's own checkpoints (DHMasking, a label mechanism, lvfl's and Lightning's callbacks) hold
nothing that needs more. A truncated, empty or text file, a directory, a missing path, `--weights_only=false` and
`lvfl export` without a checkpoint are one line each too; `lvfl export` refuses a checkpoint of another run.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO, checkpoints_of, tiny_wine_cli

from lvfl.checkpoints import CheckpointError, load_checkpoint
from lvfl.commands.entry import main as lvfl
from lvfl.commands.fit import main

COMMANDS = ["fit", "test", "predict", "export"]


class Marker:
    """Unpickling it opens (creates) `path`: what a crafted checkpoint could do with any code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.path), "w")


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LVFL_DEBUG", raising=False)


def tiny(tmp_path: Path, parties: int = 2) -> list[str]:
    """A small EASTER run on Wine logging under `tmp_path` (2 training batches, 1 validation batch an epoch)."""
    return tiny_wine_cli(tmp_path, parties, "--trainer.limit_val_batches=1")


def command(name: str, args: list[str], ckpt_path: str | None, tmp_path: Path) -> list[str]:
    """`lvfl <name>` on `args` with `ckpt_path` (export also gets --out)."""
    if name == "export":
        return ["export", *args, *(["--ckpt_path", ckpt_path] if ckpt_path else []), "--out", str(tmp_path / "out")]
    return [name, *args, *([f"--ckpt_path={ckpt_path}"] if ckpt_path else [])]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `lvfl argv`, expecting status 2 and exactly one `lvfl: error:` line (returned), and no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        lvfl(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lvfl: error:")]
    assert len(lines) == 1, err
    for noise in ("Traceback", "usage:"):
        assert noise not in err, err
    return lines[0]


# ---------------------------------------------------------------------------------------------------- crafted files
def crafted(tmp_path: Path, kind: str, marker: Path) -> Path:
    """A checkpoint-looking file whose unpickling creates `marker`: torch.save's zip format, or a bare pickle."""
    path = tmp_path / f"crafted_{kind}.ckpt"
    content = {"state_dict": {}, "epoch": 0, "hook": Marker(marker)}
    if kind == "zip":
        torch.save(content, path)
    else:
        path.write_bytes(pickle.dumps(content, protocol=2))
    return path


@pytest.mark.parametrize("kind", ["zip", "pickle"])
def test_the_crafted_files_run_code_when_unpickled(tmp_path, kind):
    """The files the tests below hand lvfl are real attacks: a weights_only=False load creates the marker."""
    marker = tmp_path / "pwned"
    path = crafted(tmp_path, kind, marker)
    if kind == "zip":
        torch.load(path, weights_only=False)
    else:
        pickle.loads(path.read_bytes())  # noqa: S301 - the point of the test
    assert marker.exists()


@pytest.mark.parametrize("kind", ["zip", "pickle"])
@pytest.mark.parametrize("name", COMMANDS)
def test_a_crafted_checkpoint_never_runs(tmp_path, monkeypatch, capsys, name, kind):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch's default does not matter
    marker = tmp_path / "pwned"
    path = crafted(tmp_path, kind, marker)
    line = refused(command(name, tiny(tmp_path), str(path), tmp_path), capsys)
    assert not marker.exists(), "the crafted checkpoint ran code"
    assert f"--ckpt_path {path}" in line
    assert "weights_only=True" in line
    assert "lvfl can load safely" in line


# ---------------------------------------------------------------------------------------------------- good files
@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A 3-party run with DHMasking, randomized-response labels and extra callbacks, fitted 2 epochs; (tmp, args).

    Each of them puts its own state into the checkpoint (the backend's settings, the label release and its privacy
    ledger, the callbacks' state dicts), all of which must load with weights_only=True.
    """
    tmp = tmp_path_factory.mktemp("safe")
    callbacks = [
        {"class_path": "lvfl.callbacks.LabelLeakageAudit"},
        {"class_path": "lvfl.callbacks.NetworkSimulator", "init_args": {"links": "lan", "print_summary": False}},
        {
            "class_path": "lightning.pytorch.callbacks.EarlyStopping",
            "init_args": {"monitor": "val/acc/mean", "mode": "max", "patience": 5},
        },
    ]
    args = [
        *tiny(tmp, parties=3),
        "--model.init_args.aggregation=lvfl.privacy.DHMasking",
        "--model.init_args.label_mechanism=lvfl.privacy.RandomizedResponse",
        "--model.init_args.label_mechanism.epsilon=2.0",
        "--trainer.callbacks=" + json.dumps(callbacks),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        main(["fit", *args, "--trainer.max_epochs=2"])
    return tmp, args


def test_lvfls_own_checkpoints_hold_only_safe_loadable_content(fitted):
    tmp, _ = fitted
    folder = checkpoints_of(tmp / "tiny")
    for name in ("last.ckpt", "best.ckpt"):
        assert torch.serialization.get_unsafe_globals_in_checkpoint(folder / name) == []
        checkpoint = load_checkpoint(folder / name)
        assert checkpoint["lvfl"]["label_privacy"]["labels"] is not None, "the label release is in it"
        states = " ".join(checkpoint["callbacks"])
        for callback in (
            "ExperimentCheckpoint",
            "ExactResume",
            "LabelLeakageAudit",
            "NetworkSimulator",
            "EarlyStopping",
        ):
            assert callback in states


def spy_on_torch_load(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The `weights_only` argument of every `torch.load` call from now on (None: not given)."""
    calls: list[Any] = []
    real_load = torch.load

    def spy(*a: Any, **kw: Any) -> Any:
        calls.append(kw.get("weights_only"))
        return real_load(*a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    return calls


@pytest.mark.parametrize("name", COMMANDS)
def test_every_load_is_weights_only(fitted, tmp_path, monkeypatch, name):
    """Fit (a resume), test, predict and export call torch.load with weights_only=True only, whatever the default."""
    root, args = fitted
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    calls = spy_on_torch_load(monkeypatch)
    extra = ["--trainer.max_epochs=3"] if name == "fit" else []
    if name == "predict":
        extra = [f"--output={tmp_path / 'p.csv'}"]
    lvfl([*command(name, args, "last", tmp_path), *extra])
    assert calls, "the checkpoint was loaded"
    assert all(c is True for c in calls), calls
    if name == "fit":  # the resume happened (and restored the callbacks' state from the safe load)
        assert load_checkpoint(checkpoints_of(root / "tiny") / "last.ckpt")["epoch"] == 2


def test_lvfl_bench_loads_its_best_checkpoint_weights_only(tmp_path, monkeypatch):
    from lvfl.commands.bench import Cell
    from lvfl.commands.bench.run import run_cell_in_process

    config = tiny(tmp_path)[1]
    cell = Cell("EASTER", "wine", 0, (config,), ("--trainer.max_epochs=2", "--trainer.limit_train_batches=2"))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    calls = spy_on_torch_load(monkeypatch)
    result = run_cell_in_process(cell, tmp_path / "cell")
    assert result["best_epoch"] in (1, 2)
    assert calls, "the best checkpoint was loaded"
    assert all(c is True for c in calls), calls


def test_weights_only_false_is_refused_naming_the_option(fitted, capsys):
    _, args = fitted
    for name in ("fit", "test"):
        line = refused([name, *args, "--ckpt_path=last", "--weights_only=false"], capsys)
        assert "--weights_only=false" in line
        assert "weights_only=True" in line


# ---------------------------------------------------------------------------------------------------- bad files
def truncated(tmp_path: Path, good: Path) -> Path:
    path = tmp_path / "truncated.ckpt"
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def empty(tmp_path: Path, good: Path) -> Path:
    path = tmp_path / "empty.ckpt"
    path.write_bytes(b"")
    return path


def text(tmp_path: Path, good: Path) -> Path:
    path = tmp_path / "notes.ckpt"
    path.write_text("epoch 3 looked best\n")
    return path


def directory(tmp_path: Path, good: Path) -> Path:
    return good.parent


def missing(tmp_path: Path, good: Path) -> Path:
    return tmp_path / "no_such_run.ckpt"


# (file maker, phrases of the one-line message besides the path)
BAD_FILES = {
    "truncated": (truncated, ["not a readable checkpoint", "truncated"]),
    "empty": (empty, ["is empty (0 bytes)"]),
    "text": (text, ["not a readable checkpoint"]),
    "directory": (directory, ["is a directory", "last.ckpt"]),
    "missing": (missing, ["no such file"]),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_load_checkpoint_names_the_file_and_the_fault(fitted, tmp_path, kind):
    make, phrases = BAD_FILES[kind]
    path = make(tmp_path, checkpoints_of(fitted[0] / "tiny") / "last.ckpt")
    errors = {"directory": IsADirectoryError, "missing": FileNotFoundError}
    with pytest.raises(errors.get(kind, CheckpointError)) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert all(phrase in str(info.value) for phrase in phrases)


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_checkpoint_is_one_line(fitted, tmp_path, capsys, kind, name):
    make, phrases = BAD_FILES[kind]
    path = make(tmp_path, checkpoints_of(fitted[0] / "tiny") / "last.ckpt")
    line = refused(command(name, tiny(tmp_path), str(path), tmp_path), capsys)
    assert f"--ckpt_path {path}" in line
    for phrase in phrases:
        assert phrase in line


def test_export_without_a_checkpoint_is_one_line(tmp_path, capsys):
    args = tiny(tmp_path)
    line = refused(command("export", args, None, tmp_path), capsys)
    assert "lvfl export needs --ckpt_path" in line
    line = refused(command("export", args, "last", tmp_path), capsys)
    assert "no last checkpoint in" in line
    assert str(tmp_path / "tiny" / "version_*" / "checkpoints") in line


# ---------------------------------------------------------------------------------------------------- another run
@pytest.mark.slow
def test_export_refuses_a_checkpoint_of_another_run(tmp_path, capsys):
    """A seed-0 checkpoint exported with seed 1 would pair its weights with another split's scaling."""
    args = tiny(tmp_path)
    main(["fit", *args, "--trainer.max_epochs=1", "--data.init_args.seed=0"])
    line = refused(command("export", [*args, "--data.init_args.seed=1"], "last", tmp_path), capsys)
    assert f"checkpoint {checkpoints_of(tmp_path / 'tiny') / 'last.ckpt'} belongs to another run" in line
    assert "data.settings.seed=0, this run has data.settings.seed=1" in line
    assert not (tmp_path / "out").exists(), "nothing was exported"
    lvfl(command("export", [*args, "--data.init_args.seed=0"], "last", tmp_path))  # its own run exports
    assert (tmp_path / "out" / "party1" / "party.json").is_file()
