"""End-to-end accuracy of the shipped configs, asserted inside bands (slow: full 30-epoch runs on embedded data).

Upper bounds catch a protocol that silently stopped protecting or averaging (e.g. the Local config learning from
features it must not see); lower bounds are the issue's acceptance figures.
"""

from __future__ import annotations

import pytest
from helpers import REPO

from lvfl.commands.fit import run_experiment

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def parties(metrics: dict[str, float], metric: str = "acc") -> dict[str, float]:
    return {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"test/{metric}/") and "mean" not in k}


def test_digits_every_party_learns_and_beats_local_by_40_points():
    easter, _ = run_experiment("configs/easter/digits.yaml", seed=0)
    local, _ = run_experiment("configs/easter/digits_local.yaml", seed=0)
    accs = parties(easter)
    assert len(accs) == 4
    # upper bound: the Central MLP on all 64 pixels reaches 0.966 +/- 0.003 (docs/results.md); a party of EASTER, which
    # sees 2 of 8 columns plus the averaged embedding, at 0.985 (355/360) or above means the test split or the labels
    # leaked into training (measured at seed 0: 0.955-0.958; seeds 1-4: 0.936-0.964)
    assert all(0.92 <= a < 0.985 for a in accs.values()), accs
    assert 0.2 < local["test/acc/mean"] < 0.6  # 2 of 8 pixel columns: well above chance, far below EASTER
    assert easter["test/acc/mean"] - local["test/acc/mean"] >= 0.40


def test_breast_cancer_every_party_at_least_095():
    metrics, _ = run_experiment("configs/easter/breast_cancer.yaml", seed=0)
    accs = parties(metrics)
    # upper bound: only a perfect score, the mark of test labels leaking into training. The test split is 114
    # samples and honest runs come close (seed 0: 0.956-0.965; seed 2: 0.982 = 112/114; Central on all 30 features:
    # 0.968 +/- 0.010 in docs/results.md), so a tighter bound would flag good seeds, not a broken setup
    assert all(0.95 <= a < 1.0 for a in accs.values()), accs
    assert all(a >= 0.97 for a in parties(metrics, "auroc").values())


def test_dh_masking_final_accuracy_matches_plain_within_half_a_point():
    dh, _ = run_experiment("configs/easter/digits.yaml", seed=0)
    plain, _ = run_experiment(
        "configs/easter/digits.yaml", seed=0, overrides=["--model.aggregation=lvfl.privacy.Plain"]
    )
    for party, acc in parties(plain).items():
        assert abs(parties(dh)[party] - acc) <= 0.005, (party, acc, parties(dh)[party])
    assert dh["wire_bytes"] > plain["wire_bytes"]  # the key exchange costs bytes (int32 shares: as many as float32)
