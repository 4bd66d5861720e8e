"""Runs never clobber: every fit its own version folder, `last`/`best` within one run, a checkpoint that is enough.

Also: party-table paths in a config resolve against the config file's folder, whatever the working directory.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO, tiny_wine_cli

from lvfl.checkpoints import load_checkpoint
from lvfl.commands.config_files import resolve_table_paths
from lvfl.commands.entry import main
from lvfl.commands.fit import build_cli

EXAMPLE = REPO / "examples/bank_retailer"


def files_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


def loaded_line(out: str, command: str, which: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(f"lvfl {command}: --ckpt_path {which}: loaded")]
    return line


@pytest.mark.slow
def test_a_second_fit_leaves_the_first_runs_files_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    args = tiny_wine_cli(tmp_path)
    main(["fit", *args, "--trainer.max_epochs=2"])
    first = tmp_path / "tiny" / "version_0"
    before = files_of(first)
    assert {"checkpoints/last.ckpt", "checkpoints/best.ckpt", "config.yaml", "metrics.csv"} <= set(before)
    main(["fit", *args, "--trainer.max_epochs=1"])
    assert files_of(first) == before, "the second fit touched the first run's files"
    second = tmp_path / "tiny" / "version_1" / "checkpoints"
    assert load_checkpoint(second / "last.ckpt")["epoch"] == 0
    capsys.readouterr()
    main(["test", *args, "--ckpt_path=last"])  # the newest run
    assert loaded_line(capsys.readouterr().out, "test", "last").split()[5] == str(second / "last.ckpt")
    older = first / "checkpoints" / "best.ckpt"
    main(["test", *args, f"--ckpt_path={older}"])  # an older run: by its path
    assert f"lvfl test: --ckpt_path {older}: loaded {older} (epoch" in capsys.readouterr().out
    assert files_of(first) == before
    with pytest.raises(SystemExit) as info:  # a version named on purpose is never written over
        main(["test", *args, "--ckpt_path=last", "--trainer.logger.init_args.version=0"])
    assert info.value.code == 2
    assert f"{first} holds a run already, and lvfl does not overwrite one" in capsys.readouterr().err
    assert files_of(first) == before


def best_epoch(experiment: Path, versions: list[str], metric: str = "val/acc/mean") -> tuple[int, float]:
    """(epoch, value) of the first epoch with the best `metric` over the versions' metrics.csv, in order."""
    scored = []
    for version in versions:
        with (experiment / version / "metrics.csv").open() as f:
            scored += [(float(r[metric]), int(r["epoch"])) for r in csv.DictReader(f) if r.get(metric)]
    value = max(v for v, _ in scored)
    return min(e for v, e in scored if v == value), value


@pytest.mark.slow
def test_a_resumed_fit_keeps_the_best_epoch_of_the_whole_run(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    args = tiny_wine_cli(tmp_path)
    main(["fit", *args, "--trainer.max_epochs=2"])
    experiment = tmp_path / "tiny"
    kept = load_checkpoint(experiment / "version_0/checkpoints/best.ckpt")
    # resumed without validation: no resumed epoch can be "best", so version_1's best.ckpt is the run's, carried over
    main(["fit", *args, "--trainer.max_epochs=3", "--ckpt_path=last", "--trainer.limit_val_batches=0"])
    carried = load_checkpoint(experiment / "version_1/checkpoints/best.ckpt")
    assert carried["epoch"] == kept["epoch"]
    assert all(carried["state_dict"][k].equal(v) for k, v in kept["state_dict"].items())
    assert load_checkpoint(experiment / "version_1/checkpoints/last.ckpt")["epoch"] == 2
    # resumed with validation: best.ckpt is the best epoch over every epoch of the run, in either folder
    main(["fit", *args, "--trainer.max_epochs=5", "--ckpt_path=last"])
    epoch, value = best_epoch(experiment, ["version_0", "version_2"])
    best = load_checkpoint(experiment / "version_2/checkpoints/best.ckpt")
    assert best["epoch"] == epoch
    (state,) = [s for k, s in best["callbacks"].items() if k.startswith("ExperimentCheckpoint")]
    assert float(state["best_model_score"]) == pytest.approx(value)


def test_table_paths_in_a_config_resolve_against_its_folder(tmp_path, monkeypatch):
    """Counterfactual: the working directory holds other tables of the same names; the config's own are read."""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("bank.csv", "retailer.csv", "config.yaml"):
        shutil.copyfile(EXAMPLE / name, site / name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "bank.csv").write_text("customer_id,income,status\n1,2,ok\n")
    monkeypatch.chdir(elsewhere)
    resolved = resolve_table_paths(["fit", "--config", "../site/config.yaml"])
    config = yaml.safe_load(Path(resolved[2]).read_text())
    paths = [t["path"] for t in config["data"]["init_args"]["parties"]]
    assert paths == [str(site / "bank.csv"), str(site / "retailer.csv")]
    cli = build_cli(["--config", "../site/config.yaml", f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    assert [t.path for t in cli.datamodule.tables] == paths
    # a path given on the command line stays relative to the working directory
    assert resolve_table_paths(["fit", "--data.init_args.parties=[{path: bank.csv}]"]) == [
        "fit",
        "--data.init_args.parties=[{path: bank.csv}]",
    ]


@pytest.fixture(scope="module")
def fitted_example(tmp_path_factory) -> Path:
    """The bank/retailer example fitted for 3 epochs from a folder that is not the repository; its run folder."""
    tmp = tmp_path_factory.mktemp("alone")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp)
        main(["fit", "--config", str(EXAMPLE / "config.yaml"), "--trainer.max_epochs=3",
              f"--trainer.logger.init_args.save_dir={tmp / 'runs'}"])  # fmt: skip
    return tmp / "runs" / "bank_retailer" / "version_0"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:FutureWarning")
def test_export_predict_and_test_work_from_a_checkpoint_alone(fitted_example, tmp_path, monkeypatch, capsys):
    best = fitted_example / "checkpoints" / "best.ckpt"
    saved = yaml.safe_load((fitted_example / "config.yaml").read_text())
    assert [Path(t["path"]).is_absolute() for t in saved["data"]["init_args"]["parties"]] == [True, True]
    monkeypatch.chdir(tmp_path)
    with_config = ["--config", str(EXAMPLE / "config.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}"]
    main(["export", "--ckpt_path", str(best), "--out", "alone"])
    main(["export", *with_config, "--ckpt_path", str(best), "--out", "configured"])
    alone, configured = files_of(tmp_path / "alone"), files_of(tmp_path / "configured")
    assert alone.keys() == configured.keys()
    assert alone
    for name in alone:  # TorchScript files name their classes by a per-process counter: compare their tensors
        if name.endswith(("contribution.pt", "completion.pt")):
            a, b = (torch.jit.load(str(tmp_path / kind / name)).state_dict() for kind in ("alone", "configured"))
            assert a.keys() == b.keys(), name
            assert all(a[k].equal(b[k]) for k in a), name
        else:
            assert alone[name][0] == configured[name][0], name
    main(["predict", "--ckpt_path", str(best), "--output", "alone.csv"])
    main(["predict", *with_config, "--ckpt_path", str(best), "--output", "configured.csv"])
    assert (tmp_path / "alone.csv").read_text() == (tmp_path / "configured.csv").read_text()
    capsys.readouterr()
    main(["test", "--ckpt_path", str(best)])
    out = capsys.readouterr().out
    assert f"lvfl test: the run's config: {fitted_example / 'config.yaml'}" in out
    assert f"lvfl test: --ckpt_path {best}: loaded {best} (epoch" in out


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.load.*:FutureWarning")
def test_only_a_command_that_produced_something_leaves_a_version_folder(fitted_example, tmp_path, monkeypatch, capsys):
    """`lvfl predict --output` elsewhere and `lvfl export` leave no `version_N` of config and set-up counts only, and a
    run refused at set-up leaves none; `lvfl test` keeps its folder, whose metrics are its result."""
    best, runs = fitted_example / "checkpoints" / "best.ckpt", fitted_example.parent
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in runs.iterdir())
    main(["predict", "--ckpt_path", str(best), "--output", "p.csv"])
    main(["export", "--ckpt_path", str(best), "--out", "parties"])
    with pytest.raises(SystemExit):  # refused once the run's folder exists: at the data's set-up
        main(["fit", "--config", str(EXAMPLE / "config.yaml"), "--data.init_args.task=multiclass",
              f"--trainer.logger.init_args.save_dir={runs.parent}"])  # fmt: skip
    assert "but task: multiclass needs 3 or more" in capsys.readouterr().err
    assert (tmp_path / "p.csv").is_file()
    assert (tmp_path / "parties").is_dir()
    assert sorted(p.name for p in runs.iterdir()) == before
    main(["test", "--ckpt_path", str(best)])
    (new,) = set(p.name for p in runs.iterdir()) - set(before)
    with (runs / new / "metrics.csv").open(newline="") as f:
        assert any(name.startswith("test/") for name in next(csv.reader(f)))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["test", "--ckpt_path", "best"], "lvfl test --ckpt_path best names a run's file by the run's config: give"),
        (["export", "--ckpt_path", "last", "--out", "x"], "lvfl export --ckpt_path last names a run's file by the"),
    ],
)
def test_last_or_best_without_a_config_is_refused_saying_why(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"lvfl: error: {message}"), line


def test_a_checkpoint_outside_a_run_folder_needs_its_config(fitted_example, tmp_path, capsys):
    loose = tmp_path / "loose.ckpt"
    shutil.copyfile(fitted_example / "checkpoints" / "last.ckpt", loose)
    with pytest.raises(SystemExit):
        main(["test", "--ckpt_path", str(loose)])
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"lvfl: error: lvfl test --ckpt_path {loose}: no config.yaml in {tmp_path.parent} or {tmp_path} (lvfl fit "
        "saves the run's config in its version folder); give the run's --config"
    )
