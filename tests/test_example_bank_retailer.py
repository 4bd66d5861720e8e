"""examples/bank_retailer: the committed CSVs are what make_data.py writes, and its config fits from the CLI."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import REPO

from lvfl.alignment import message_bytes
from lvfl.commands.fit import build_cli

EXAMPLE = REPO / "examples" / "bank_retailer"


def test_the_committed_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in ("bank.csv", "retailer.csv"):
        assert (tmp_path / name).read_bytes() == (EXAMPLE / name).read_bytes(), name


@pytest.mark.slow
def test_the_example_config_fits_with_the_psi_on_the_wire(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    cli = build_cli(
        [
            "--config",
            "examples/bank_retailer/config.yaml",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    dm = cli.datamodule
    assert dm.label_names == ["default", "ok"]
    assert "income missing" in dm.feature_names["party0"]  # 5% missing incomes, mean-imputed with an indicator
    assert sum(len(getattr(dm, f"{s}_set")) for s in ("train", "val", "test")) == 604
    psi = {k: v for k, v in cli.model.wire.bytes_by_tag().items() if k.startswith("psi/")}
    assert psi == {f"psi/{k}": v for k, v in message_bytes({"party0": 900, "party1": 900}, "party0", 604).items()}
