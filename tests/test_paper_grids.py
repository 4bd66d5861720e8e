"""The paper grids (configs/bench/paper_easter_*.yaml, paper_pravfed_*.yaml): variants of a dataset, the paper's
numbers beside lvfl's, quick runs on stand-in files, and every cell's pieces parsing and instantiating."""

from __future__ import annotations

import json
import tempfile

import pytest
from helpers import REPO
from test_bench import RESULT, in_this_process, write_grid

from lvfl.commands import bench
from lvfl.commands.bench import quick
from lvfl.commands.bench import run as bench_run
from lvfl.commands.fit import build_cli, run_args

PAPER_GRIDS = sorted((REPO / "configs" / "bench").glob("paper_*.yaml"))
#: the methods each paper's grids quote, by the paper (its table's names)
PAPER_PROTOCOLS = {
    "EASTER": {"Local", "SplitNN (Pyvertical)", "CVFL (C_VFL)", "AggVFL (Agg_VFL)", "EASTER"},
    "PraVFed": {"Central", "Standalone", "Pyvertical (SplitNN)", "C_VFL", "Agg_VFL", "PraVFed"},
}
#: where each paper's data pieces live
DATA_PIECES = {"EASTER": "configs/paper/data", "PraVFed": "configs/paper/pravfed/data"}
EASTER = str(REPO / "configs/easter/{dataset}.yaml")


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


# ---------------------------------------------------------------------------------------------------- the grid file
def test_a_dataset_variant_fills_the_templates_with_its_dataset_and_adds_its_own_pieces(tmp_path):
    parties = tmp_path / "two.yaml"
    parties.write_text("model:\n  init_args:\n    embedding_dim: 8\n")
    variant = {"dataset": "wine", "parties": str(parties), "overrides": ["--data.init_args.num_parties=2"]}
    grid = bench.load_grid(write_grid(tmp_path, datasets=["wine", {"wine C=2": variant}], target_accuracy=None))
    cells = {c.dataset: c for c in grid.cells()}
    assert grid.datasets == ["wine", "wine C=2"]
    assert cells["wine"].configs == (str(REPO / "configs/easter/wine.yaml"),)
    assert cells["wine C=2"].configs == (str(REPO / "configs/easter/wine.yaml"), str(parties))
    assert cells["wine C=2"].overrides == ("--trainer.max_epochs=2", "--data.init_args.num_parties=2")
    assert cells["wine C=2"].key == "EASTER/wine_C_2/seed0"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"datasets": [{"w": {"dataset": "wine", "colour": 1}}]}, r"dataset 'w': an entry is a name or a mapping"),
        ({"datasets": [{"w": {"parties": "nowhere.yaml"}}]}, r"dataset 'w': its parties config .*nowhere.yaml"),
        ({"datasets": [{"w": {"dataset": "wine", "overrides": ["x=1"]}}]}, r"dataset 'w': overrides are"),
        ({"datasets": ["wine", "wine"]}, r"dataset 'wine' is listed twice"),
        ({"datasets": [["wine"]]}, r"neither a name nor a one-key mapping"),
        ({"paper": {"values": {}}}, r"`paper` is a mapping with keys"),
        ({"paper": {"source": "T", "values": {"Nope": {"wine": 1}}}}, r"names protocol 'Nope'"),
        ({"paper": {"source": "T", "values": {"EASTER": {"iris": 1}}}}, r"names dataset 'iris'"),
        ({"paper": {"source": "T", "values": {"EASTER": {"wine": 0.9e3}}}}, r"must be a percentage, got 900.0"),
        ({"paper": {"source": "T", "metric": "f1", "values": {}}}, r"`paper.metric` 'f1' must be one of"),
        ({"paper": {"source": "T", "metric": {"iris": "acc"}, "values": {}}}, r"`paper.metric` names dataset 'iris'"),
    ],
)
def test_bad_variants_and_paper_blocks_fail_naming_the_entry(tmp_path, monkeypatch, fields, match):
    monkeypatch.setattr(bench_run, "run_cell", lambda *a: pytest.fail("a cell ran"))
    with pytest.raises(bench.GridError, match=match):
        bench.run_grid(write_grid(tmp_path, target_accuracy=None, **fields))


def test_the_report_prints_the_papers_number_beside_lvfls_in_the_same_metric(tmp_path):
    paper = {"source": "Paper Table 9", "metric": {"wine": "auroc"}, "values": {"EASTER": {"wine": 77.5}}}
    grid = bench.load_grid(write_grid(tmp_path, datasets=["wine", "digits"], paper=paper, seeds=[0, 1]))
    results = {}
    for cell in grid.cells():
        auc = 0.70 if cell.seed == 0 else 0.80
        results[cell] = RESULT | {"test": RESULT["test"] | {"test/auroc/mean": auc}}
    rows = {r["dataset"]: r for r in bench.summarize(grid, results)}
    assert rows["wine"]["paper"] == 77.5
    assert rows["wine"]["lvfl_paper_metric"][0] == pytest.approx(75.0)  # AUC, not accuracy (0.9)
    assert rows["digits"]["paper"] is None
    assert rows["digits"]["lvfl_paper_metric"][0] == pytest.approx(90.0)  # accuracy elsewhere
    table = bench.write_table(grid, list(rows.values()), tmp_path)
    head, _, wine, digits = table.splitlines()[:4]
    assert head.startswith("| protocol | dataset | paper % | lvfl % |")
    assert wine.startswith("| EASTER | wine | 77.50 | 75.00 ± 7.07 |")
    assert digits.startswith("| EASTER | digits |  | 90.00 ± 0.00 |")
    assert "paper %: Paper Table 9." in table
    assert "test AUC for wine" in table
    csv = (tmp_path / "results.csv").read_text().splitlines()
    assert csv[0].startswith("protocol,dataset,seeds,paper_metric,paper_pct,lvfl_pct_mean,lvfl_pct_std,")
    assert csv[1].startswith("EASTER,wine,2,auroc,77.50,75.0000,7.0711,")

    results[next(c for c in results if c.dataset == "wine")] = {"error": "ValueError: boom"}
    rows = bench.summarize(grid, results)
    failed = bench.write_table(grid, rows, tmp_path).splitlines()[2]
    assert failed.startswith("| EASTER | wine | 77.50 |  | failed: seed 0 (1/2): ValueError: boom |")


# ---------------------------------------------------------------------------------------------------- quick runs
def test_shorten_adds_the_overrides_and_keeps_out_of_the_full_runs_folders(tmp_path):
    grid = bench.load_grid(write_grid(tmp_path, seeds=[0, 1, 2], report=str(tmp_path / "docs")))
    short = quick.shorten(grid, max_rows=50, max_epochs=1, seeds=[0], suffix="stand-ins")
    assert short.overrides[-2:] == ["--data.init_args.max_rows=50", "--trainer.max_epochs=1"]
    assert short.seeds == [0]
    assert short.out == short.report == f"{grid.out}-stand-ins"
    assert grid.seeds == [0, 1, 2]  # the grid itself is unchanged
    assert grid.report == str(tmp_path / "docs")
    with pytest.raises(bench.GridError, match=r"--max-rows must be a positive integer, got 0"):
        quick.shorten(grid, max_rows=0)


def test_stand_ins_need_max_rows_and_a_folder_of_their_own(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["configs/bench/paper_easter_table2.yaml", "--stand-ins", str(tmp_path)])
    assert "--stand-ins needs --max-rows" in capsys.readouterr().err
    grid = bench.load_grid(REPO / "configs/bench/paper_easter_table2.yaml")
    cell = next(c for c in grid.cells() if c.dataset == "mnist")
    (tmp_path / "MNIST").mkdir()
    (tmp_path / "MNIST" / "mine.txt").write_text("a user's file")
    with pytest.raises(bench.GridError, match=r"MNIST exists and holds no stand-in written by lvfl bench"):
        quick.with_stand_ins([cell], tmp_path, rows=20)
    assert (tmp_path / "MNIST" / "mine.txt").is_file()
    (stand_in,) = quick.with_stand_ins([cell], tmp_path / "s", rows=20)
    assert stand_in.overrides[-1] == f"--data.init_args.root={tmp_path / 's' / 'MNIST'}"
    first = sorted((tmp_path / "s" / "MNIST").rglob("*"))
    quick.with_stand_ins([cell], tmp_path / "s", rows=20)  # written once
    assert sorted((tmp_path / "s" / "MNIST").rglob("*")) == first


@pytest.mark.slow
def test_a_paper_grid_runs_end_to_end_on_stand_ins(tmp_path, monkeypatch):
    """`lvfl bench <paper grid> --stand-ins DIR --max-rows N`: every part runs, the paper column is filled."""
    monkeypatch.setattr(bench_run, "run_cell", in_this_process)  # the cell's own process is tested in test_bench
    grid = bench.load_grid(REPO / "configs/bench/paper_easter_table2.yaml")
    grid.protocols = {k: v for k, v in grid.protocols.items() if k in ("EASTER", "SplitNN (Pyvertical)")}
    grid.datasets = ["mnist", "criteo"]
    grid.out = str(tmp_path / "out")
    short = quick.shorten(grid, max_rows=120, max_epochs=1, seeds=[0], suffix="stand-ins")
    outcome = bench.run_grid(short, stand_ins=(tmp_path / "data", 120))
    assert not outcome.failures
    assert outcome.report_dir == tmp_path / "out-stand-ins"
    rows = {tuple(line.split(" | ")[:2]): line for line in outcome.table.splitlines()[2:6]}
    assert rows[("| EASTER", "mnist")].split(" | ")[2] == "98.16"  # Table II, beside lvfl's own figure
    assert rows[("| SplitNN (Pyvertical)", "criteo")].split(" | ")[2] == "74.18"
    assert "CRITEO: AUC" in outcome.table
    result = json.loads((tmp_path / "out-stand-ins/cells/EASTER/criteo/seed0/result.json").read_text())
    assert "test/auroc/mean" in result["test"]  # Criteo's paper figure is an AUC, so lvfl's must be too
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["Criteo", "MNIST"]
    assert not (REPO / "docs/results/paper_easter_table2").exists()  # the real report stays untouched


# ---------------------------------------------------------------------------------------------------- shipped grids
@pytest.mark.parametrize("path", PAPER_GRIDS, ids=lambda p: p.stem)
def test_paper_grids_quote_the_paper_for_every_row_it_has(path):
    grid = bench.load_grid(path)
    cells = grid.cells()
    assert grid.paper is not None
    paper = "PraVFed" if path.stem.startswith("paper_pravfed") else "EASTER"
    assert grid.paper.source.startswith(f"{paper} ")
    assert grid.out.startswith(str(REPO / "runs"))
    assert grid.report.startswith(str(REPO / "docs" / "results"))
    assert {c.configs[0] for c in cells} <= {str(p) for p in (REPO / DATA_PIECES[paper]).glob("*.yaml")}
    if path.stem == "paper_easter_fig6a":  # a figure without numbers: only the Table II point
        assert grid.paper.values == {"EASTER": {"fmnist emb=128": 89.88}}
        return
    assert set(grid.paper.values) == PAPER_PROTOCOLS[paper] & set(grid.protocols)
    for protocol, values in grid.paper.values.items():
        assert set(values) == set(grid.datasets), protocol
    assert all(grid.paper.metric_of(d) == ("auroc" if d.startswith("criteo") else "acc") for d in grid.datasets)


def distinct_pieces() -> list[bench.Cell]:
    """One cell per distinct (pieces, overrides) over the paper grids, seed 0."""
    seen, cells = set(), []
    for path in PAPER_GRIDS:
        for cell in bench.load_grid(path).cells():
            if (cell.configs, cell.overrides) not in seen:
                seen.add((cell.configs, cell.overrides))
                cells.append(cell)
    return cells


@pytest.mark.slow
def test_every_paper_grid_cell_parses():
    """Every distinct cell's configs and overrides parse (class paths import, option names exist)."""
    cells = distinct_pieces()
    assert len(cells) > 100
    with tempfile.TemporaryDirectory() as tmp:
        parser = build_cli(
            ["--config", "configs/easter/digits.yaml", f"--trainer.logger.init_args.save_dir={tmp}"], run=False
        ).parser
        for cell in cells:
            parser.parse_args(cell.args(tmp))


@pytest.mark.slow
def test_every_paper_piece_instantiates_on_stand_ins(tmp_path):
    """Every (data, parties) pair with EASTER or PraVFed and every protocol on every data piece builds, on stand-ins.

    (The other cells differ from these only in overrides that `test_every_paper_grid_cell_parses` parses.)
    """
    cells, seen = [], set()
    for cell in quick.with_stand_ins(distinct_pieces(), tmp_path / "data", rows=300):
        data, protocol, *parties = cell.configs
        each_party_piece = cell.protocol in ("EASTER", "PraVFed")  # the protocols whose every parties piece builds
        for key in ((data, *parties, cell.overrides) if each_party_piece else (), (data, protocol)):
            if key and key not in seen:
                seen.add(key)
                cells.append(cell)
                break
    assert len(cells) >= 60
    for cell in cells:
        # 300 stand-in rows: a third for validation holds CIFAR-100's 100 classes
        args = run_args(
            cell.configs, 0, str(tmp_path / "logs"), [*cell.overrides, "--data.init_args.val_fraction=0.34"]
        )
        cli = build_cli(args, run=False)
        assert len(cli.model.party_configs) in (1, len(cli.datamodule.party_specs)), cell.key


def test_labels_that_would_share_a_cell_folder_are_refused(tmp_path):
    with pytest.raises(bench.GridError, match=r"datasets 'wine C=2' and 'wine C_2' would share the cell folder"):
        bench.load_grid(
            write_grid(tmp_path, datasets=[{"wine C=2": {"dataset": "wine"}}, {"wine C_2": {"dataset": "wine"}}])
        )
