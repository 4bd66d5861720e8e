"""`lvfl bench`: bad grids fail before any cell runs, finished cells are reused, the summary is right."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import REPO

from lvfl.commands import bench
from lvfl.commands.bench import report as bench_report
from lvfl.commands.bench import run as bench_run
from lvfl.commands.fit import run_experiment

EASTER = str(REPO / "configs/easter/{dataset}.yaml")  # a whole config per dataset (no pieces)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def write_grid(tmp_path, **fields) -> str:
    grid = {
        "name": "t",
        "protocols": {"EASTER": EASTER},
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


def in_this_process(cell, out):
    """`run_cell` without the fresh process (the import of torch and Lightning alone costs seconds per cell)."""
    cell_dir = out / "cells" / cell.key
    cell_dir.mkdir(parents=True, exist_ok=True)
    result = bench_run.run_cell_in_process(cell, cell_dir)
    (cell_dir / "result.json").write_text(json.dumps(result))
    return result


#: a finished cell's result as `run_cell` returns it (figures chosen, not measured)
RESULT = {
    "test": {"test/acc/mean": 0.9, "test/acc/party0": 0.9},
    "test_last": {"test/acc/mean": 0.9},
    "wire_bytes": 1e6,
    "history": {"epoch": [1], "val_acc": [0.9], "train_bytes": [1e6], "setup_bytes": 0.0},
    "epoch_seconds": [1.0],
    "peak_rss_mib": 1.0,
}


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"protocols": {"Nope": "nope/{dataset}.yaml"}}, r"protocol 'Nope' has no config for dataset 'wine'"),
        ({"datasets": ["wine", "mnist9"]}, r"dataset 'mnist9'"),
        ({"protocols": {"EASTER": "configs/easter/wine.yaml"}}, r"must contain \{dataset\}"),
        ({"data": "data/wine.yaml"}, r"`data` 'data/wine.yaml' must be a path template containing \{dataset\}"),
        ({"parties": "nowhere/{dataset}.yaml"}, r"dataset 'wine' has no parties config: .*nowhere/wine.yaml"),
        ({"seeds": ["zero"]}, r"seeds"),
        ({"overrides": ["trainer.max_epochs=2"]}, r"command-line options"),
        ({"colour": "blue"}, r"unknown key\(s\) \['colour'\]"),
        ({"target_accuracy": 1.5}, r"target_accuracy"),
        ({"target_accuracy": {"wine": 0}}, r"target_accuracy`\['wine'\] must be in"),
        ({"target_accuracy": {"iris": 0.5}}, r"names dataset 'iris'"),
        (
            {"protocols": {"E": {"config": EASTER, "ovr": []}}},
            r"protocol 'E'.*\['config', 'ovr'\]",
        ),
        ({"protocols": {"E": {"config": EASTER, "overrides": ["x=1"]}}}, r"protocol 'E'.*bad"),
        ({"reference": "SplitNN"}, r"`reference` 'SplitNN' is not one of the protocols \['EASTER'\]"),
        ({"network": {"links": "wifi"}}, r"`network`: NetworkSimulator links: unknown link preset 'wifi'"),
        ({"network": "lan"}, r"`network` holds NetworkSimulator's arguments"),
        ({"twin": "yes"}, r"`twin` is true or false"),
        ({"metric": "f1"}, r"`metric` 'f1' is not one of \['acc', 'auroc', 'mae', 'r2', 'rmse'\]"),
        ({"metric": "r2", "target_accuracy": 40}, r"`target_accuracy` must be in \(0, 1\], got 40"),
        ({"attacks": [{"class_path": "lvfl.callbacks.LabelLeakageAudit"}]}, r"`attacks` entry .* is not"),
        (
            {"attacks": [{"class_path": "lvfl.attacks.DirectLabelInference"}] * 2},
            r"two `attacks` log under attack/dli/",
        ),
        ({"defenses": {"none": ["--model.init_args.gradient_defense=null"]}}, r"defense 'none' is the undefended"),
        ({"defenses": {"noise": ["model.x=1"]}}, r"defense 'noise': overrides are command-line options"),
    ],
)
def test_bad_grid_fails_naming_the_entry(tmp_path, monkeypatch, fields, match):
    monkeypatch.setattr(bench_run, "run_cell", no_cell_may_run)
    with pytest.raises(bench.GridError, match=match):
        bench.run_grid(write_grid(tmp_path, **fields))
    assert not (tmp_path / "out").exists()


def test_bad_override_fails_before_any_cell_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_run, "run_cell", no_cell_may_run)
    grid = write_grid(tmp_path, overrides=["--trainer.max_epochs=2", "--model.init_args.embeding_dim=8"])
    with pytest.raises(bench.GridError, match=r"EASTER/wine.*embeding_dim"):
        bench.run_grid(grid)
    assert "embeding_dim" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_grid_runs_then_reuses_every_cell(tmp_path, monkeypatch):
    grid = write_grid(tmp_path, seeds=[0, 1])
    real_run_cell, processes = bench_run.run_cell, []

    def first_in_its_own_process(cell, out):  # seed 0 in a fresh process as always, seed 1 here (seconds saved)
        processes.append(cell.seed)
        return (real_run_cell if len(processes) == 1 else in_this_process)(cell, out)

    monkeypatch.setattr(bench_run, "run_cell", first_in_its_own_process)
    outcome = bench.run_grid(grid)
    assert processes == [0, 1]
    table, out = outcome.table, outcome.report_dir
    assert not outcome.failures
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

    monkeypatch.setattr(bench_run, "run_cell", no_cell_may_run)  # a finished grid recomputes nothing
    assert bench.run_grid(grid).table == table


@pytest.mark.slow
def test_a_network_grid_reports_the_simulated_time_to_target(tmp_path, monkeypatch):
    """`network:` adds a NetworkSimulator to every cell; the table gains the simulated seconds to the target."""
    grid = write_grid(tmp_path, network={"links": "50mbps_50ms"}, target_accuracy=0.01)
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)
    outcome = bench.run_grid(grid)
    (result,) = [json.loads(p.read_text()) for p in outcome.report_dir.rglob("result.json")]
    sim = result["history"]["sim_wall_s"]
    assert len(sim) == 2
    assert 0 < sim[0] < sim[1]
    assert "sim. s to target" in outcome.table
    assert f"| {sim[0]:.1f} |" in outcome.table  # target 0.01: reached after the first epoch
    simulated = bench.load_grid(grid).cells()[0]
    plain = bench.load_grid(write_grid(tmp_path)).cells()[0]  # the same grid without `network` (same file)
    assert plain.fingerprint() != simulated.fingerprint()
    assert "NetworkSimulator" not in " ".join(plain.args(str(tmp_path)))


@pytest.mark.slow
def test_a_twin_grid_fits_a_plain_twin_of_each_protected_cell(tmp_path, monkeypatch):
    """`twin: true`: the wine config masks (DHMasking); its Plain twin is fitted in the cell and tabulated."""
    grid = write_grid(tmp_path, twin=True, overrides=["--trainer.max_epochs=1"])
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)
    outcome = bench.run_grid(grid)
    (result,) = [json.loads(p.read_text()) for p in outcome.report_dir.rglob("result.json")]
    twin = result["twin"]
    assert twin["backend"] == "DHMasking"
    # independently: the same fits run by run_experiment, masked as configured and with the Plain backend
    config, one = str(REPO / "configs/easter/wine.yaml"), ["--trainer.max_epochs=1"]
    masked, _ = run_experiment(config, 0, one, test=False)
    plain, _ = run_experiment(config, 0, [*one, "--model.init_args.aggregation=lvfl.privacy.Plain"], test=False)
    assert twin["bytes"] == masked["wire_bytes"]
    assert twin["twin_bytes"] == plain["wire_bytes"]
    assert twin["bytes"] > twin["twin_bytes"]  # at least the key exchange
    assert twin["step_s"] > 0
    assert twin["twin_step_s"] > 0
    assert "Privacy cost beside a Plain twin" in outcome.table
    assert "| EASTER | wine | DHMasking |" in outcome.table


@pytest.mark.slow
def test_a_regression_grid_selects_by_validation_r2_and_reports_it(tmp_path, monkeypatch):
    """`metric: r2`: the best checkpoint is the best validation R^2, the table reports R^2, targets count in R^2;
    for MAE (lower is better) a target is reached at or below it."""
    grid = write_grid(
        tmp_path,
        protocols={"EASTER": str(REPO / "configs/protocols/easter/{dataset}.yaml")},
        data=str(REPO / "configs/data/{dataset}.yaml"),
        parties=str(REPO / "configs/parties/{dataset}.yaml"),
        datasets=["diabetes_regression"],
        metric="r2",
        target_accuracy=0.05,
        overrides=["--trainer.max_epochs=3"],
    )
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)
    outcome = bench.run_grid(grid)
    (result,) = [json.loads(p.read_text()) for p in outcome.report_dir.rglob("result.json")]
    val = result["history"]["val_acc"]  # the grid's metric, here validation R^2
    assert result["best_epoch"] == val.index(max(val)) + 1
    assert "test/r2/mean" in result["test"]
    assert "| r2 mean | r2 mean (last epoch) |" in outcome.table
    assert f"{result['test']['test/r2/mean']:.4f}" in outcome.table
    assert bench_report.reaches(40.0, 45.0, "mae")
    assert not bench_report.reaches(50.0, 45.0, "mae")
    assert bench_report.reaches(0.5, 0.4, "r2")


def test_changed_config_invalidates_the_cell(tmp_path):
    grid = bench.load_grid(write_grid(tmp_path))
    (cell,) = grid.cells()
    out = tmp_path / "out"
    (out / "cells" / cell.key).mkdir(parents=True)
    (out / "cells" / cell.key / "result.json").write_text(json.dumps({"fingerprint": cell.fingerprint()}))
    assert bench.cached_result(cell, out) is not None
    changed = bench.Cell(cell.protocol, cell.dataset, cell.seed, cell.configs, ("--trainer.max_epochs=3",))
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
            "A": EASTER,
            "B eps=2": {"config": EASTER, "overrides": ["--trainer.max_epochs=3"]},
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


GRIDS = sorted((REPO / "configs" / "bench").glob("*.yaml"))
#: the grids on the embedded sets (the paper grids' pieces and cells are tested in test_paper_grids.py)
EMBEDDED_GRIDS = [p for p in GRIDS if not p.stem.startswith("paper_")]


def test_shipped_grids_name_existing_configs():
    for path in GRIDS:
        grid = bench.load_grid(path)
        assert grid.cells(), path  # every protocol has a config for every dataset
        assert grid.out.startswith(str(REPO / "runs")), "out is below the repository's runs/, from any directory"


def composition(protocol: str, dataset: str) -> tuple[str, ...]:
    """The pieces `lvfl bench` composes for a protocol on a dataset (configs/README.md)."""
    own = REPO / "configs" / "protocols" / protocol / f"{dataset}.yaml"
    piece = own if own.is_file() else own.with_name("default.yaml")
    return (
        str(REPO / "configs" / "data" / f"{dataset}.yaml"),
        str(piece),
        str(REPO / "configs" / "parties" / f"{dataset}.yaml"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", EMBEDDED_GRIDS, ids=lambda p: p.stem)
def test_shipped_grids_parse(path):
    """Every cell of every shipped grid parses and instantiates (what `lvfl bench` checks before running).

    A cell is its pieces plus its overrides. Every protocol piece on every dataset is parsed and instantiated by
    `tests/test_cli.py::test_every_composition_instantiates`, so here each cell's pieces must be one of those, and
    each distinct override list is parsed once, on the first dataset it applies to (an override names an option of
    the protocol, whatever the dataset).
    """
    cells = bench.load_grid(path).cells()
    protocols = [p.name for p in (REPO / "configs" / "protocols").iterdir() if p.is_dir()]
    datasets = [p.stem for p in (REPO / "configs" / "data").glob("*.yaml")]
    covered = {composition(p, d) for p in protocols for d in datasets}
    assert {c.configs for c in cells} <= covered, "a grid cell outside the compositions test_cli instantiates"
    first_with = {}
    for cell in cells:
        if cell.overrides:
            first_with.setdefault((cell.configs[1], cell.overrides), cell)
    bench.check_cells(list(first_with.values()))


# ---------------------------------------------------------------------------------------------------- composed grids
def write(path, text: str = "") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_paths_in_a_grid_are_relative_to_the_grid_file(tmp_path, monkeypatch):
    """Templates, `out` and `report` resolve against the grid's folder, whatever the working directory."""
    write(tmp_path / "cfg" / "data" / "wine.yaml")
    write(tmp_path / "cfg" / "parties" / "wine.yaml")
    write(tmp_path / "cfg" / "proto" / "default.yaml")
    own = write(tmp_path / "cfg" / "proto" / "digits.yaml")  # a dataset the protocol treats differently
    write(tmp_path / "cfg" / "data" / "digits.yaml")
    write(tmp_path / "cfg" / "parties" / "digits.yaml")
    grid_file = tmp_path / "cfg" / "bench" / "g.yaml"
    fields = {
        "data": "../data/{dataset}.yaml",
        "parties": "../parties/{dataset}.yaml",
        "protocols": {"P": "../proto/{dataset}.yaml"},
        "datasets": ["wine", "digits"],
        "seeds": [0],
        "out": "../../runs/g",
        "report": "report",
    }
    write(grid_file, json.dumps(fields))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    grid = bench.load_grid(grid_file)
    assert grid.out == str(tmp_path / "runs" / "g")
    assert grid.report == str(tmp_path / "cfg" / "bench" / "report")
    wine, digits = grid.cells()
    cfg = tmp_path / "cfg"
    assert wine.configs == (f"{cfg}/data/wine.yaml", f"{cfg}/proto/default.yaml", f"{cfg}/parties/wine.yaml")
    assert digits.configs == (f"{cfg}/data/digits.yaml", own, f"{cfg}/parties/digits.yaml")
    # the same grid read from its own folder, by a relative path: the same files
    monkeypatch.chdir(tmp_path / "cfg" / "bench")
    again = bench.load_grid("g.yaml")
    assert [[Path(p).resolve() for p in c.configs] for c in again.cells()] == [
        [Path(p) for p in c.configs] for c in (wine, digits)
    ]
    assert Path(again.out).resolve() == tmp_path / "runs" / "g"


@pytest.mark.slow
def test_a_new_dataset_joins_the_baselines_grid_with_two_files(tmp_path, monkeypatch):
    """The issue's acceptance check: a copy of configs/, two new YAML files, the name in `datasets`, and it runs."""
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    before = sorted(configs.rglob("*"))
    # the two new files: a dataset the grid has not seen (the wine data as 3 parties, one model entry for all)
    write(
        configs / "data" / "wine3.yaml",
        "trainer: {max_epochs: 30, log_every_n_steps: 5}\n"
        "data:\n  class_path: lvfl.datamodules.Wine\n  init_args: {num_parties: 3, batch_size: 32, seed: 0}\n",
    )
    write(
        configs / "parties" / "wine3.yaml",
        "model:\n  init_args:\n    embedding_dim: 16\n    parties:\n"
        "      - model: {class_path: lvfl.models.MLP, init_args: {hidden: [16]}}\n"
        "        optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.05, momentum: 0.9}}\n",
    )
    grid_file = configs / "bench" / "baselines.yaml"
    raw = yaml.safe_load(grid_file.read_text())
    raw["datasets"].append("wine3")
    raw["target_accuracy"]["wine3"] = 0.5
    grid_file.write_text(yaml.safe_dump(raw))
    assert len(sorted(configs.rglob("*"))) == len(before) + 2
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the grid's paths are its own, not the working directory's

    grid = bench.load_grid(grid_file)
    new = [c for c in grid.cells() if c.dataset == "wine3"]
    assert {c.protocol for c in new} == set(grid.protocols), "every protocol takes it (its default piece)"
    bench.check_cells(new)  # and every one of them parses and instantiates

    # a tiny run of it, through its default protocol piece: 1 seed, 1 epoch, one protocol (every protocol's
    # composition was instantiated above; running a cell is the same for each)
    grid.datasets, grid.seeds, grid.overrides = ["wine3"], [0], ["--trainer.max_epochs=1"]
    grid.protocols = {"SplitNN": grid.protocols["SplitNN"]}
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)  # the cell's own process is tested elsewhere
    outcome = bench.run_grid(grid)
    assert not outcome.failures
    assert outcome.report_dir == tmp_path / "docs" / "results"
    rows = [line for line in outcome.table.splitlines() if "| wine3 |" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| SplitNN"]
    cells = tmp_path / "runs" / "bench" / "baselines" / "cells"
    result = json.loads((cells / "SplitNN" / "wine3" / "seed0" / "result.json").read_text())
    assert sorted(k for k in result["test"] if k.startswith("test/acc/party")) == ["test/acc/party0"]  # top model
    assert result["wire_bytes"] > 0  # three parties: embeddings up, gradients down
    assert result["history"]["epoch"] == [1]  # the grid's override reached the cell: one epoch


# ---------------------------------------------------------------------------------------------------- failures
@pytest.mark.slow
def test_a_failed_cell_stops_the_grid_or_with_keep_going_is_reported(tmp_path, capsys, monkeypatch):
    broken = {"config": EASTER, "overrides": ["--data.init_args.num_parties=20"]}  # parses; fails when fitted
    grid = write_grid(tmp_path, protocols={"Broken": broken, "EASTER": EASTER}, overrides=["--trainer.max_epochs=1"])
    out = tmp_path / "out" / "cells"

    # a real cell process that fails: the grid stops there, naming the cell, the error and the log
    with pytest.raises(SystemExit) as stopped:
        bench.main([grid])
    message = str(stopped.value.code)
    assert message.startswith("lvfl bench: cell Broken/wine/seed0 failed: ValueError: ")
    assert "num_parties=20" in message
    assert str(out / "Broken" / "wine" / "seed0" / "run.log") in message
    assert not (out / "EASTER").exists(), "without --keep-going the grid stops at the first failure"
    reason = message.split("failed: ", 1)[1].rsplit(" (its output is in ", 1)[0]

    # --keep-going: the same failure (replayed, not rerun) is recorded, the next cell still runs, the exit is 1
    ran = []

    def replay(cell, out_dir):
        ran.append(cell.protocol)
        if cell.protocol == "Broken":
            raise bench_run.CellFailed(cell, reason, out_dir / "cells" / cell.key / "run.log")
        return RESULT

    monkeypatch.setattr(bench_run, "run_cell", replay)
    with pytest.raises(SystemExit) as finished:
        bench.main([grid, "--keep-going"])
    assert finished.value.code == 1, "a grid with a failed cell does not exit 0"
    assert ran == ["Broken", "EASTER"]
    captured = capsys.readouterr()
    assert "Broken/wine/seed0: ValueError" in captured.err
    (broken_row,) = [line for line in captured.out.splitlines() if line.startswith("| Broken |")]
    assert f"| failed: seed 0 (1/1): {reason}" in broken_row
    (easter_row,) = [line for line in captured.out.splitlines() if line.startswith("| EASTER |")]
    assert "0.9000 ± 0.0000" in easter_row


def test_a_failed_row_keeps_no_figures(tmp_path):
    grid = bench.load_grid(write_grid(tmp_path, seeds=[0, 1]))
    ok, bad = grid.cells()
    (row,) = bench.summarize(grid, {ok: RESULT, bad: {"error": "ValueError: no | way"}})
    assert row["failed"] == "failed: seed 1 (1/2): ValueError: no / way"
    assert row["acc_mean"] is None
    table = bench.write_table(grid, [row], tmp_path)
    assert table.splitlines()[2].startswith("| EASTER | wine | failed: seed 1 (1/2): ValueError: no / way |")
    assert table.splitlines()[2].count("|") == table.splitlines()[0].count("|")
    assert "failed: seed 1" in (tmp_path / "results.csv").read_text()


def test_rows_still_improving_when_training_stopped_are_marked(tmp_path):
    """A seed whose best validation epoch is in the last tenth of its epochs is counted and the table says the row
    is compared before convergence; a row whose seeds peaked earlier carries no mark and the note is absent."""
    assert bench_report.still_improving(50, 50)
    assert bench_report.still_improving(46, 50)
    assert not bench_report.still_improving(45, 50)
    assert bench_report.still_improving(3, 3)
    assert not bench_report.still_improving(2, 3)
    grid = bench.load_grid(write_grid(tmp_path, seeds=[0, 1]))
    first, second = grid.cells()

    def result(best_epoch: int) -> dict:
        return RESULT | {"best_epoch": best_epoch, "epoch_seconds": [1.0] * 50}

    (row,) = bench.summarize(grid, {first: result(50), second: result(30)})
    assert row["convergence"] == {"best_epoch": 40, "epochs": 50, "improving": 1, "seeds": 2}
    table = bench.write_table(grid, [row], tmp_path)
    assert "| 40.0/50 †1/2 |" in table
    assert "compared before convergence" in table
    with (tmp_path / "results.csv").open() as f:
        (line,) = list(csv.DictReader(f))
    assert (line["best_epoch_mean"], line["epochs"], line["improving_seeds"]) == ("40.00", "50", "1")
    (row,) = bench.summarize(grid, {first: result(20), second: result(30)})
    table = bench.write_table(grid, [row], tmp_path)
    assert "| 25.0/50 |" in table
    assert "compared before convergence" not in table


def test_plots_show_the_seed_band_and_keep_the_legend_off_the_axes(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    grid = bench.load_grid(write_grid(tmp_path, seeds=[0, 1, 2]))
    results = {
        cell: {"history": {"epoch": [1, 2], "val_acc": [0.5 + k / 10, 0.7 + k / 10], "train_bytes": [1e6, 1e6]}}
        for k, cell in enumerate(grid.cells())
    }
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    (path,) = bench.write_plots(grid, results, tmp_path)
    assert path.stat().st_size > 1000
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        lows_highs = band.get_paths()[0].vertices[:, 1]
        assert lows_highs.min() == pytest.approx(0.5)  # the band spans the seeds' min ...
        assert lows_highs.max() == pytest.approx(0.9)  # ... to max
        assert ax.get_legend() is None
    (legend,) = fig.legends
    box, axes = legend.get_window_extent(), [ax.get_window_extent() for ax in fig.axes]
    assert all(box.x0 >= a.x1 for a in axes), "the legend sits right of both panels"


# ---------------------------------------------------------------------------------------------------- attacks
GAUSSIAN = '{"class_path": "lvfl.privacy.GaussianNoise", "init_args": {"noise_multiplier": 1.0}}'


@pytest.mark.slow
def test_an_attack_grid_crosses_defenses_and_reports_ap_mp_and_dcs(tmp_path, monkeypatch):
    grid = write_grid(
        tmp_path,
        attacks=[{"class_path": "lvfl.attacks.DirectLabelInference"}],
        defenses={"none": [], "gaussian": [f"--model.init_args.gradient_defense={GAUSSIAN}"]},
    )
    loaded = bench.load_grid(grid)
    assert list(loaded.protocols) == ["EASTER + none", "EASTER + gaussian"]
    assert loaded.defended["EASTER + gaussian"] == ("EASTER", "gaussian")
    (tmp_path / "plain").mkdir()
    plain = bench.load_grid(write_grid(tmp_path / "plain")).cells()[0]
    assert plain.fingerprint() != loaded.cells()[0].fingerprint()  # the attacks are part of the cell
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)
    outcome = bench.run_grid(grid)
    with (outcome.report_dir / "attacks.csv").open() as f:
        rows = {r["defense"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"none", "gaussian"}
    undefended, defended = rows["none"], rows["gaussian"]
    assert float(undefended["ap"]) >= 0.99  # DLI reads every label of EASTER's prediction gradients
    assert float(defended["ap"]) < 0.9 * float(undefended["ap"])
    ap, mp = float(undefended["ap"]), float(undefended["mp"])
    assert float(undefended["dcs"]) == pytest.approx(bench_report.dcs(ap, mp, mp), abs=1e-4)
    assert float(undefended["dcs"]) == pytest.approx(1 / (1 + (0.5 * ap**2) ** 0.5), abs=1e-4)
    results = [json.loads(p.read_text()) for p in outcome.report_dir.rglob("result.json")]
    logged = sorted(r["attacks"]["attack/dli/accuracy"] for r in results)
    assert logged == pytest.approx(sorted(float(r["value"]) for r in rows.values()), abs=1e-4)
    assert "| EASTER | gaussian | wine | dli | accuracy |" in outcome.table
    assert (outcome.report_dir / "t_wine_dli.png").is_file()


def test_an_auc_below_chance_scores_as_its_mirror_and_dcs_is_one_sided():
    """A scoring attack ranking the classes backwards (AUC 0.37) leaks what 0.63 does: AP is the same, and so is the
    DCS; a defense that raises the main task above the undefended run's earns nothing for it."""
    assert bench_report.attack_performance("auc", 0.37) == pytest.approx(0.63)
    assert bench_report.attack_performance("auc", 0.63) == pytest.approx(0.63)
    assert bench_report.attack_performance("accuracy", 0.3) == 0.3  # an accuracy below chance is not mirrored
    assert bench_report.attack_performance("mse", 0.2) == pytest.approx(0.8)
    chance = bench_report.dcs(bench_report.attack_performance("auc", 0.5), 0.9, 0.9)
    backwards = bench_report.dcs(bench_report.attack_performance("auc", 0.37), 0.9, 0.9)
    assert backwards < chance
    assert bench_report.dcs(0.5, 0.95, 0.9) == bench_report.dcs(0.5, 0.9, 0.9)  # a higher MP earns nothing
    assert bench_report.dcs(0.5, 0.85, 0.9) < bench_report.dcs(0.5, 0.9, 0.9)
