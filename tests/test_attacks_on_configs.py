"""Every attack runs on the repo's own configs: 4 parties with DH masking (digits), and the binary breast-cancer run.

A review found the backdoors stopping the 4-party masked config after its first epoch (the measurement spent the
run's next mask steps); the unit tests used 3 parties and Plain. Here each attack is attached to a config a user
would run, for 2 short epochs, and must finish and log its metrics.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from helpers import REPO

from lvfl.commands.fit import main as fit_main

SHORT = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
         "--trainer.enable_progress_bar=false"]  # fmt: skip
CASES = [
    ("configs/easter/digits.yaml", name, {})
    for name in (
        "DirectLabelInference",
        "BatchLabelInference",
        "PassiveModelCompletion",
        "EmbeddingInversion",
        "GradientReplacement",
        "NoisySample",
    )
] + [
    ("configs/easter/breast_cancer.yaml", "NormScoring", {"known_labels": 2}),
    ("configs/easter/breast_cancer.yaml", "DirectionScoring", {}),
]  # GenerativeRegression needs SplitNN with concat fusion, which no repo config runs (it refuses the others by name)


@pytest.mark.slow
@pytest.mark.parametrize(("config", "attack", "args"), CASES, ids=[f"{Path(c).stem}-{a}" for c, a, _ in CASES])
def test_an_attack_runs_to_the_end_of_a_repo_config(tmp_path, monkeypatch, config, attack, args) -> None:
    monkeypatch.chdir(REPO)
    callback = json.dumps({"class_path": f"lvfl.attacks.{attack}", "init_args": args})
    fit_main(["fit", "--config", config, *SHORT, f"--trainer.callbacks+={callback}",
              f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    (metrics,) = tmp_path.glob("*/version_0/metrics.csv")
    with metrics.open(newline="") as f:
        rows = list(csv.DictReader(f))
    logged = {k for row in rows for k, v in row.items() if k.startswith("attack/") and v != ""}
    assert logged, f"{attack} logged no attack/... metric"
    assert max(int(float(row["epoch"])) for row in rows if row["epoch"]) == 1  # the run reached its last epoch
    measured = {int(float(row["epoch"])) for row in rows if any(row[k] for k in logged)}
    assert 1 in measured, measured  # the attack measured at the end too, after the first epoch's measurement
