"""`lvfl bench`: bad grids fail before any cell runs, finished cells are reused, the summary is right."""

from __future__ import annotations

import json

import pytest
from helpers import REPO

from lvfl import bench


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def write_grid(tmp_path, **fields) -> str:
    grid = {
        "name": "t",
        "protocols": {"EASTER": "configs/easter/{dataset}.yaml"},
        "datasets": ["wine"],
        "seeds": [0],
        "overrides": ["--trainer.max_epochs=2"],
        "target_accuracy": 0.3,
        "out": str(tmp_path / "out"),
    } | fields
    path = tmp_path / "grid.yaml"
    path.write_text(json.dumps(grid))  # JSON is YAML
    return str(path)


def no_cell_may_run(*args, **kwargs):
    raise AssertionError("a cell ran")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"protocols": {"Nope": "configs/nope/{dataset}.yaml"}}, r"protocol 'Nope' has no config for dataset 'wine'"),
        ({"datasets": ["wine", "mnist9"]}, r"dataset 'mnist9'"),
        ({"protocols": {"EASTER": "configs/easter/wine.yaml"}}, r"must contain \{dataset\}"),
        ({"seeds": ["zero"]}, r"seeds"),
        ({"overrides": ["trainer.max_epochs=2"]}, r"command-line options"),
        ({"colour": "blue"}, r"unknown key\(s\) \['colour'\]"),
        ({"target_accuracy": 1.5}, r"target_accuracy"),
        ({"target_accuracy": {"wine": 0}}, r"target_accuracy`\['wine'\] must be in"),
        ({"target_accuracy": {"iris": 0.5}}, r"names dataset 'iris'"),
        (
            {"protocols": {"E": {"config": "configs/easter/{dataset}.yaml", "ovr": []}}},
            r"protocol 'E'.*\['config', 'ovr'\]",
        ),
        ({"protocols": {"E": {"config": "configs/easter/{dataset}.yaml", "overrides": ["x=1"]}}}, r"protocol 'E'.*bad"),
        ({"reference": "SplitNN"}, r"`reference` 'SplitNN' is not one of the protocols \['EASTER'\]"),
    ],
)
def test_bad_grid_fails_naming_the_entry(tmp_path, monkeypatch, fields, match):
    monkeypatch.setattr(bench, "run_cell", no_cell_may_run)
    with pytest.raises(bench.GridError, match=match):
        bench.run_grid(write_grid(tmp_path, **fields))
    assert not (tmp_path / "out").exists()


def test_bad_override_fails_before_any_cell_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_cell", no_cell_may_run)
    grid = write_grid(tmp_path, overrides=["--trainer.max_epochs=2", "--model.init_args.embeding_dim=8"])
    with pytest.raises(bench.GridError, match=r"EASTER/wine.*embeding_dim"):
        bench.run_grid(grid)
    assert "embeding_dim" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_grid_runs_then_reuses_every_cell(tmp_path, monkeypatch):
    grid = write_grid(tmp_path, seeds=[0, 1])
    table, out = bench.run_grid(grid)
    results = [json.loads(p.read_text()) for p in sorted(out.rglob("result.json"))]
    assert len(results) == 2
    for r in results:
        assert r["history"]["epoch"] == [1, 2]
        assert len(r["epoch_seconds"]) == 2
        assert r["wire_bytes"] > 0
        assert r["peak_rss_mib"] > 0
        val = r["history"]["val_acc"]
        assert r["best_epoch"] == val.index(max(val)) + 1  # tested at the first best validation epoch
        assert r["history"]["setup_bytes"] > 0  # DH key exchange (the wine config masks)
        if r["best_epoch"] == 2:
            assert r["test"] == r["test_last"]
    assert not list(out.rglob("*.ckpt"))  # the best checkpoint is dropped once tested
    mean_acc = [r["test"]["test/acc/mean"] for r in results]
    expected = f"{sum(mean_acc) / 2:.4f}"
    assert expected in table
    mb = sum(r["wire_bytes"] for r in results) / 2 / 1e6
    assert f"{mb:.2f}" in table
    assert (out / "results.csv").is_file()
    assert (out / "t_wine.png").stat().st_size > 1000

    monkeypatch.setattr(bench, "run_cell", no_cell_may_run)  # a finished grid recomputes nothing
    again, _ = bench.run_grid(grid)
    assert again == table


def test_changed_config_invalidates_the_cell(tmp_path):
    grid = bench.load_grid(write_grid(tmp_path))
    (cell,) = grid.cells()
    out = tmp_path / "out"
    (out / "cells" / cell.key).mkdir(parents=True)
    (out / "cells" / cell.key / "result.json").write_text(json.dumps({"fingerprint": cell.fingerprint()}))
    assert bench.cached_result(cell, out) is not None
    changed = bench.Cell(cell.protocol, cell.dataset, cell.seed, cell.config, ("--trainer.max_epochs=3",))
    assert bench.cached_result(changed, out) is None


def test_mb_to_target_counts_setup_and_training_bytes_until_the_first_hit():
    history = {"epoch": [1, 2, 3], "val_acc": [0.2, 0.6, 0.9], "train_bytes": [1e6, 2e6, 4e6], "setup_bytes": 5e5}
    assert bench.mb_to_target(history, 0.5) == pytest.approx(3.5)
    assert bench.mb_to_target(history, 0.1) == pytest.approx(1.5)
    assert bench.mb_to_target(history, 0.95) is None
    assert bench.mb_to_target(history, None) is None


def test_protocol_overrides_and_reference_column(tmp_path):
    """A protocol entry's own overrides reach its cells only; `reference` adds MB-to-target deltas in percent."""
    path = write_grid(
        tmp_path,
        protocols={
            "A": "configs/easter/{dataset}.yaml",
            "B eps=2": {"config": "configs/easter/{dataset}.yaml", "overrides": ["--trainer.max_epochs=3"]},
        },
        reference="A",
    )
    grid = bench.load_grid(path)
    cells = {c.protocol: c for c in grid.cells()}
    assert cells["A"].overrides == ("--trainer.max_epochs=2",)
    assert cells["B eps=2"].overrides == ("--trainer.max_epochs=2", "--trainer.max_epochs=3")
    assert cells["B eps=2"].key == "B_eps_2/wine/seed0"

    def result(setup, per_epoch, acc):
        history = {"epoch": [1, 2], "val_acc": [0.1, 0.9], "train_bytes": [per_epoch] * 2, "setup_bytes": setup}
        test = {"test/acc/mean": acc, "test/acc/party0": acc}
        return {
            "test": test,
            "test_last": test,
            "wire_bytes": 1,
            "history": history,
            "epoch_seconds": [1.0],
            "peak_rss_mib": 1.0,
        }

    results = {cells["A"]: result(0, 2e6, 0.9), cells["B eps=2"]: result(1e6, 0.5e6, 0.8)}
    rows = {r["protocol"]: r for r in bench.summarize(grid, results)}
    assert rows["A"]["mb_to_target"] == pytest.approx(4.0)  # the target (0.3) is reached at epoch 2
    assert rows["B eps=2"]["mb_to_target"] == pytest.approx(2.0)  # 1 MB set-up + 2 x 0.5
    assert rows["B eps=2"]["vs_reference"] == pytest.approx(-50.0)
    table = bench.write_table(grid, list(rows.values()), tmp_path)
    assert "MB to target vs A" in table
    assert "-50.00%" in table


def test_shipped_grids_name_existing_configs():
    for path in sorted((REPO / "configs" / "bench").glob("*.yaml")):
        grid = bench.load_grid(path)
        assert grid.cells(), path  # every protocol has a config for every dataset
