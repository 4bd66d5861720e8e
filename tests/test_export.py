"""`lvfl export`: each party's folder holds only its own tensors, and its TorchScript files reproduce its model."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import REPO

from lvfl.cli import build_cli, main
from lvfl.entry import main as lvfl
from lvfl.export import owned_keys

CONFIG = "examples/bank_retailer/config.yaml"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bank/retailer example fitted for 1 epoch and exported; (log folder, export folder)."""
    logs, out = tmp_path_factory.mktemp("fit"), tmp_path_factory.mktemp("export")
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        common = [
            "--config",
            CONFIG,
            f"--trainer.logger.init_args.save_dir={logs}",
            "--trainer.enable_progress_bar=false",
        ]
        main(["fit", *common, "--trainer.max_epochs=1"])
        lvfl(["export", *common, "--ckpt_path", "last", "--out", str(out)])
    finally:
        os.chdir(cwd)
    return logs, out


def loaded(logs: Path):
    """The fitted run rebuilt in this process with the checkpoint's weights."""
    cli = build_cli(["--config", CONFIG, f"--trainer.logger.init_args.save_dir={logs}"], run=False)
    cli.trainer.datamodule = cli.datamodule
    cli.model.trainer = cli.trainer
    cli.model.setup("predict")
    state = torch.load(logs / "bank_retailer" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    cli.model.load_state_dict(state)
    return cli.model, cli.datamodule, state


def test_each_folder_holds_its_partys_tensors_and_none_of_the_others(exported, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    logs, out = exported
    model, _, state = loaded(logs)
    own = {p: torch.load(out / p / "state_dict.pt") for p in ("party0", "party1")}
    assert set(own["party0"]) | set(own["party1"]) == set(state)  # every tensor goes somewhere ...
    assert not set(own["party0"]) & set(own["party1"])  # ... to one party
    for party, tensors in own.items():
        assert all(k.startswith(f"party_models.{party}.") for k in tensors), party
        for key, value in tensors.items():
            assert torch.equal(value, state[key])
    theirs = [v for k, v in state.items() if k.startswith("party_models.party0.")]
    for value in own["party1"].values():  # not even under another name
        assert not any(v.shape == value.shape and torch.equal(v, value) for v in theirs)


def test_the_torchscript_files_reproduce_the_in_process_model(exported, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    logs, out = exported
    model, dm, _ = loaded(logs)
    test = dm.test_set
    batch = dm.on_after_batch_transfer(test.gather(torch.arange(len(test))), 0)
    with torch.no_grad():
        for party in ("party0", "party1"):
            x = batch.features[party]
            net = model.party_models[party]
            encoder = torch.jit.load(str(out / party / "encoder.pt"))
            head = torch.jit.load(str(out / party / "head.pt"))
            embedding = net.encoder(x)
            torch.testing.assert_close(encoder(x), embedding)
            torch.testing.assert_close(head(embedding), net.head(embedding))


def test_party_json_carries_encoders_scaling_and_only_the_actives_labels(exported) -> None:
    _, out = exported
    bank = json.loads((out / "party0" / "party.json").read_text())
    shop = json.loads((out / "party1" / "party.json").read_text())
    assert bank["role"] == "active"
    assert bank["label_names"] == ["default", "ok"]
    assert "label_names" not in shop
    assert bank["task"] == {"num_classes": 2, "kind": "binary", "target_mean": 0.0, "target_scale": 1.0}
    assert "task" not in shop
    assert [e["name"] for e in bank["encoders"]] == ["income", "age", "segment"]
    assert bank["feature_names"][:2] == ["income", "income missing"]
    assert shop["feature_names"] == ["spend", "visits", "channel=online", "channel=store", "channel=<unseen>"]
    assert len(shop["scaling"]["mean"]) == len(shop["feature_names"])
    assert shop["input_shape"] == [5]


@pytest.mark.parametrize(
    ("config", "extra", "active_extra"),
    [
        ("configs/splitnn/digits_dh_sum.yaml", [], "top."),
        (
            "configs/aggvfl/digits_heter_dh.yaml",
            ["--model.init_args.aggregate=weighted", "--model.init_args.aggregation=lvfl.privacy.Plain"],
            "weight_logits",
        ),
    ],
)
def test_the_active_party_owns_the_top_model_and_aggregation_weights(config, extra, active_extra, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        cli = build_cli(["--config", config, f"--trainer.logger.init_args.save_dir={tmp}", *extra], run=False)
    cli.trainer.datamodule = cli.datamodule
    cli.model.trainer = cli.trainer
    cli.model.setup("fit")
    keys = owned_keys(cli.model)
    assert sorted(k for ks in keys.values() for k in ks) == sorted(cli.model.state_dict())
    assert any(k.startswith(active_extra) for k in keys["party0"])
    assert not any(k.startswith(active_extra) for p in ("party1", "party2", "party3") for k in keys[p])
