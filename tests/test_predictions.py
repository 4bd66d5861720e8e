"""`lvfl predict` writes a file: one row per sample keyed by its business ID, decoded labels, the answering path."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from helpers import REPO

from lvfl.callbacks import PredictionWriter
from lvfl.cli import build_cli, main

CONFIG = "examples/bank_retailer/config.yaml"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bank/retailer example fitted for 2 epochs; returns its log folder (with checkpoints/last.ckpt)."""
    out = tmp_path_factory.mktemp("fit")
    cwd = Path.cwd()
    try:
        os.chdir(REPO)
        main(
            [
                "fit",
                "--config",
                CONFIG,
                f"--trainer.logger.init_args.save_dir={out}",
                "--trainer.max_epochs=2",
                "--trainer.enable_progress_bar=false",
            ]
        )
    finally:
        os.chdir(cwd)
    return out


def args(fitted: Path, *extra: str) -> list[str]:
    return [
        "--config",
        CONFIG,
        f"--trainer.logger.init_args.save_dir={fitted}",
        "--trainer.enable_progress_bar=false",
        "--ckpt_path",
        "last",
        *extra,
    ]


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_predict_writes_one_row_per_test_sample_equal_to_the_models_outputs(fitted, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    out = tmp_path / "preds.csv"
    main(["predict", *args(fitted, f"--output={out}")])
    assert f"predictions written to {out}" in capsys.readouterr().out
    rows = read(out)
    assert list(rows[0]) == ["id", "prediction", "prob_default", "prob_ok", "path"]

    # the same checkpoint in this process: the active party's model on the test split
    cli = build_cli([*args(fitted)[:-2]], run=False)
    checkpoint = torch.load(fitted / "bank_retailer" / "checkpoints" / "last.ckpt", weights_only=False)
    cli.datamodule.setup("test")
    cli.model.trainer = cli.trainer  # setup() reads the datamodule from the trainer
    cli.trainer.datamodule = cli.datamodule
    cli.model.setup("test")
    cli.model.load_state_dict(checkpoint["state_dict"])
    test = cli.datamodule.test_set
    batch = cli.datamodule.on_after_batch_transfer(test.gather(torch.arange(len(test))), 0)
    with torch.no_grad():
        probs = cli.model.party_logits(batch)["party0"].softmax(-1)
    assert [r["id"] for r in rows] == cli.datamodule.business_ids(test.ids)
    written = torch.tensor([[float(r["prob_default"]), float(r["prob_ok"])] for r in rows])
    torch.testing.assert_close(written, probs, rtol=1e-5, atol=1e-6)
    names = cli.datamodule.label_names
    assert [r["prediction"] for r in rows] == [names[c] for c in probs.argmax(1).tolist()]
    assert {r["path"] for r in rows} == {"vfl"}

    # and their accuracy is lvfl test's
    (metrics,) = build_cli(args(fitted)[:-2], run=False).trainer.test(
        cli.model, datamodule=cli.datamodule, verbose=False
    )
    accuracy = sum(r["prediction"] == names[int(y)] for r, y in zip(rows, test.labels, strict=True)) / len(rows)
    assert accuracy == pytest.approx(metrics["test/acc/party0"], abs=1e-6)


def test_parquet_output_and_the_mean_of_the_parties(fitted, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.chdir(REPO)
    main(["predict", *args(fitted, f"--output={tmp_path / 'p.parquet'}")])
    table = pq.read_table(tmp_path / "p.parquet").to_pydict()
    assert list(table) == ["id", "prediction", "prob_default", "prob_ok", "path"]
    writer = PredictionWriter(str(tmp_path / "m.csv"), party="mean")
    outputs = [{"ids": torch.tensor([0]), "probs": {"a": torch.tensor([[0.2, 0.8]]), "b": torch.tensor([[0.6, 0.4]])}}]
    torch.testing.assert_close(writer._answer(None, [o["probs"] for o in outputs]), torch.tensor([[0.4, 0.6]]))


def test_output_is_refused_outside_predict_and_needs_a_known_format(fitted, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        main(["test", *args(fitted, f"--output={tmp_path / 'x.csv'}")])
    assert "--output names the predictions file of lvfl predict; lvfl test writes none" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"path 'x.txt' must end in one of \['.csv', '.parquet'\]"):
        PredictionWriter("x.txt")
