"""The best epoch: `ExperimentCheckpoint` keeps `best.ckpt` beside `last.ckpt`, and `--ckpt_path best` finds it anew.

The best epoch is selected by the task's main validation metric (`val/acc/mean`, `val/auroc/mean` for a binary task,
`val/r2/mean` for a regression, all maximised). `lvfl test`, `lvfl predict` and `lvfl export` with `--ckpt_path best`
load it in a new CLI (no callback remembers it, as in a new process) and say which file they loaded; a run that
validated no epoch has no best, and `--ckpt_path best` is refused in one line saying why. Lightning's
`EarlyStopping` on `val/acc/mean` stops an lvfl fit.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from helpers import REPO, checkpoints_of, tiny_wine_cli
from torch.utils.data import DataLoader, TensorDataset

from lvfl.callbacks import ExperimentCheckpoint
from lvfl.callbacks.checkpoint import main_validation_metric
from lvfl.checkpoints import load_checkpoint, resolve_ckpt_path
from lvfl.commands.entry import main as lvfl
from lvfl.commands.fit import build_cli, main
from lvfl.parties import TaskInfo

# a metric that peaks in the second of four epochs: best.ckpt must hold epoch 2, last.ckpt epoch 4
SCRIPTED = [0.5, 0.9, 0.7, 0.8]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LVFL_DEBUG", raising=False)


def test_the_main_metric_of_each_task():
    assert main_validation_metric(TaskInfo(num_classes=3)) == "val/acc/mean"
    assert main_validation_metric(TaskInfo(num_classes=2, kind="binary")) == "val/auroc/mean"
    assert main_validation_metric(TaskInfo(num_classes=0, kind="regression")) == "val/r2/mean"


# ---------------------------------------------------------------------------------------------------- the callback
class Scripted(pl.LightningModule):
    """Logs `val/acc/mean` from `SCRIPTED`, one value per validation epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc/mean", SCRIPTED[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ScriptedData(pl.LightningDataModule):
    """A multiclass task (so the monitor is val/acc/mean) over four constant rows."""

    task = TaskInfo(num_classes=3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 2)), batch_size=2)


def scripted_fit(folder: Path, **trainer_args) -> ExperimentCheckpoint:
    keeper = ExperimentCheckpoint(dirpath=folder)
    args = {"max_epochs": len(SCRIPTED), "logger": False, "enable_progress_bar": False, "num_sanity_val_steps": 0}
    pl.Trainer(callbacks=[keeper], enable_model_summary=False, **{**args, **trainer_args}).fit(
        Scripted(), datamodule=ScriptedData()
    )
    return keeper


def test_best_ckpt_holds_the_best_epoch_and_last_ckpt_the_last(tmp_path):
    keeper = scripted_fit(tmp_path)
    assert keeper.monitor == "val/acc/mean"
    assert keeper.mode == "max"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]
    best, last = load_checkpoint(tmp_path / "best.ckpt"), load_checkpoint(tmp_path / "last.ckpt")
    assert best["epoch"] == 1, "the second epoch's 0.9 is the best"
    assert last["epoch"] == len(SCRIPTED) - 1, "last.ckpt is written after every epoch, improving or not"
    assert Path(keeper.best_model_path) == tmp_path / "best.ckpt"
    assert float(keeper.best_model_score) == pytest.approx(0.9)


def test_a_run_without_validation_keeps_last_ckpt_and_no_best(tmp_path, recwarn):
    (tmp_path / "best.ckpt").write_bytes(b"an earlier run's")  # a fresh fit removes it: it is not this run's
    keeper = scripted_fit(tmp_path, limit_val_batches=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert load_checkpoint(tmp_path / "last.ckpt")["epoch"] == len(SCRIPTED) - 1
    assert keeper.best_model_path == ""
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]


def test_a_given_monitor_keeps_lightnings_mode_default(tmp_path):
    keeper = ExperimentCheckpoint(dirpath=tmp_path, monitor="val/loss/mean")
    assert (keeper.monitor, keeper.mode, keeper.filename) == ("val/loss/mean", "min", "best")
    several = ExperimentCheckpoint(save_top_k=3)
    assert several.filename is None, "several best files keep Lightning's names"
    assert several.monitor is None, "chosen from the task at set-up"


# ---------------------------------------------------------------------------------------------------- the CLI
def tiny(tmp_path: Path) -> list[str]:
    """A small EASTER run on Wine (multiclass, 2 parties) logging under `tmp_path`: a second or two per epoch."""
    return tiny_wine_cli(tmp_path)


def val_history(tmp_path: Path, metric: str) -> list[float]:
    (metrics,) = (tmp_path / "tiny").glob("version_*/metrics.csv")
    with metrics.open() as f:
        return [float(row[metric]) for row in csv.DictReader(f) if row.get(metric)]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """`tiny` fitted for 4 epochs in this process; (its checkpoint folder, its arguments)."""
    tmp = tmp_path_factory.mktemp("best")
    args = tiny(tmp)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        main(["fit", *args, "--trainer.max_epochs=4"])
    return checkpoints_of(tmp / "tiny"), args


def test_fit_keeps_the_epoch_with_the_best_val_acc(fitted):
    folder, _ = fitted
    history = val_history(folder.parent.parent.parent, "val/acc/mean")
    assert len(history) == 4
    best = load_checkpoint(folder / "best.ckpt")
    assert best["epoch"] == history.index(max(history)), "the first epoch reaching the best val/acc/mean"
    assert load_checkpoint(folder / "last.ckpt")["epoch"] == 3


def test_test_best_in_a_new_cli_loads_best_ckpt_and_says_so(fitted, capsys):
    folder, args = fitted
    cli = build_cli(["test", *args, "--ckpt_path=best"])
    assert Path(cli.trainer.ckpt_path) == folder / "best.ckpt"
    assert f"lvfl test: --ckpt_path best: loaded {folder / 'best.ckpt'} (epoch" in capsys.readouterr().out
    best = load_checkpoint(folder / "best.ckpt")["state_dict"]
    state = cli.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in best.items())
    assert resolve_ckpt_path(cli.trainer, "best") == folder / "best.ckpt"
    assert resolve_ckpt_path(cli.trainer, "last") == folder / "last.ckpt"


@pytest.mark.slow
def test_test_best_in_a_new_process(fitted):
    folder, args = fitted
    env = {k: v for k, v in os.environ.items() if k != "LVFL_DEBUG"}
    result = subprocess.run(
        [sys.executable, "-m", "lvfl", "test", *args, "--ckpt_path=best"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"lvfl test: --ckpt_path best: loaded {folder / 'best.ckpt'} (epoch" in result.stdout
    # (Lightning's own "Restoring states from ..." line is silenced; the in-process test compares the weights)


@pytest.mark.slow
def test_predict_best_equals_predict_with_the_best_file(fitted, tmp_path, capsys):
    folder, args = fitted
    main(["predict", *args, "--ckpt_path=best", f"--output={tmp_path / 'best.csv'}"])
    assert f"lvfl predict: --ckpt_path best: loaded {folder / 'best.ckpt'}" in capsys.readouterr().out
    main(["predict", *args, f"--ckpt_path={folder / 'best.ckpt'}", f"--output={tmp_path / 'path.csv'}"])
    best, path = (tmp_path / "best.csv").read_text(), (tmp_path / "path.csv").read_text()
    assert best == path
    assert len(best.splitlines()) > 1


def test_export_best_writes_the_best_epochs_tensors(fitted, tmp_path, capsys):
    folder, args = fitted
    lvfl(["export", *args, "--ckpt_path", "best", "--out", str(tmp_path / "parties")])
    assert f"lvfl export: --ckpt_path best: loaded {folder / 'best.ckpt'}" in capsys.readouterr().out
    best = load_checkpoint(folder / "best.ckpt")["state_dict"]
    exported = {
        k: v
        for party in ("party0", "party1")
        for k, v in torch.load(tmp_path / "parties" / party / "state_dict.pt").items()
    }
    assert exported.keys() == best.keys()
    assert all(torch.equal(exported[k], best[k]) for k in best)


@pytest.mark.slow
def test_best_without_validation_is_refused_saying_why(tmp_path, capsys):
    args = tiny(tmp_path)
    main(["fit", *args, "--trainer.max_epochs=1", "--trainer.limit_val_batches=0"])
    folder = checkpoints_of(tmp_path / "tiny")
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]
    for command in (
        ["test", *args, "--ckpt_path=best"],
        ["export", *args, "--ckpt_path", "best", "--out", str(tmp_path)],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            lvfl(command)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        (line,) = [line for line in err.splitlines() if line.startswith("lvfl: error:")]
        assert f"--ckpt_path best: there is no best.ckpt in {folder}" in line
        assert "validated no epoch" in line
        assert "--ckpt_path last" in line
        assert "Traceback" not in err


def test_early_stopping_on_val_acc_stops_the_fit(tmp_path):
    stop = '{"class_path": "lightning.pytorch.callbacks.EarlyStopping", '
    stop += '"init_args": {"monitor": "val/acc/mean", "mode": "max", "patience": 1, "min_delta": 1.0}}'
    cli = build_cli(["fit", *tiny(tmp_path), "--trainer.max_epochs=20", f"--trainer.callbacks+={stop}"])
    (early,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, pl.callbacks.EarlyStopping)]
    # no epoch improves on the first by 1.0: patience 1 stops the fit after its second epoch
    assert early.stopped_epoch == 1
    assert cli.trainer.current_epoch == 2
    assert len(val_history(tmp_path, "val/acc/mean")) == 2
