"""`lvfl fit --twin`: the run beside a Plain twin of the same config and seed, and what its mechanisms cost."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

from lvfl.commands.fit import main, run_experiment
from lvfl.commands.twin import Measured, StepTimer, cost_rows, format_table, twin_args


def test_twin_args_drop_the_twin_option_and_swap_in_the_plain_backend(tmp_path):
    argv = ["fit", "--config", "a.yaml", "--twin", "true", "--trainer.max_epochs=2", "--twin=true"]
    args = twin_args(argv, str(tmp_path))
    assert args[:3] == ["--config", "a.yaml", "--trainer.max_epochs=2"]
    assert "--model.init_args.aggregation=lvfl.privacy.Plain" in args
    assert f"--trainer.logger.init_args.save_dir={tmp_path}" in args
    assert not [a for a in args if a.startswith("--twin")]


def test_cost_rows_give_the_relative_and_absolute_figures():
    timer, twin_timer = StepTimer(), StepTimer()
    timer.seconds, twin_timer.seconds = [0.003, 0.004, 0.005], [0.002, 0.002, 0.009]
    run = Measured.of(2.0, timer, {"keys": 300, "embeddings": 2_000_000})
    twin = Measured.of(1.0, twin_timer, {"embeddings": 1_000_000})
    (row,) = cost_rows("DHMasking", run, twin)
    assert row[0] == "DHMasking (aggregation)"
    assert row[1] == "+100.0% (4.00 ms vs 2.00 ms per step; fits 2.00 s vs 1.00 s)"  # medians of the steps
    assert row[2] == "+100.0% (2.000 MB vs 1.000 MB): embeddings +1.0000 MB, keys +0.0003 MB"  # (300 B of keys)
    assert cost_rows("Plain", run, None) == []  # Plain already and no PSI: nothing to report
    psi = cost_rows("Plain", Measured(1.0, 0.1, {"psi/blinded": 64_000, "psi/matches": 400}), None, 0.5)
    assert psi == [
        ("PSI (ID alignment)", "0.50 s while loading", "0.0644 MB (psi*/ tags; IDs joined in the clear: 0 B)")
    ]
    assert format_table(psi).splitlines()[1] == "| mechanism | time | bytes |"


@pytest.mark.slow
def test_lvfl_fit_twin_prints_the_cost_against_a_plain_fit_of_the_same_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    config = "configs/easter/wine.yaml"
    common = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    main(["fit", "--config", config, "--trainer.max_epochs=1", *common, "--twin=true"])
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("| DHMasking (aggregation) |")]
    run_mb, twin_mb = (float(x) for x in re.search(r"\(([\d.]+) MB vs ([\d.]+) MB\)", line).groups())
    plain, _ = run_experiment(config, 0, ["--trainer.max_epochs=1", "--model.init_args.aggregation=lvfl.privacy.Plain"])
    masked, _ = run_experiment(config, 0, ["--trainer.max_epochs=1"], test=False)
    # the run's bytes are its fit's (the same as a masked fit's); the twin's those of a Plain fit (without a test)
    assert run_mb == pytest.approx(masked["wire_bytes"] / 1e6, abs=5e-4)
    plain_fit, _ = run_experiment(
        config, 0, ["--trainer.max_epochs=1", "--model.init_args.aggregation=lvfl.privacy.Plain"], test=False
    )
    assert twin_mb == pytest.approx(plain_fit["wire_bytes"] / 1e6, abs=5e-4)
    assert plain["wire_bytes"] > plain_fit["wire_bytes"]  # (the test pass adds traffic: why the fits are compared)
    # the key exchange, only in the masked run: 3 signed keys up, 3 x 2 relayed down, 96 B each
    assert re.search(r": keys \+0\.0009 MB \|$", line), line


@pytest.mark.slow
def test_twin_is_refused_where_it_cannot_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    common = ["--config", "configs/easter/wine.yaml", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    with pytest.raises(SystemExit):
        main(["test", *common, "--twin=true"])
    assert "--twin is an option of lvfl fit; lvfl test refuses it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", *common, "--twin=true", "--ckpt_path", "last"])
    assert "--twin compares a whole fit with its Plain twin; it does not resume" in capsys.readouterr().err
