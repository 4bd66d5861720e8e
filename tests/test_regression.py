"""Regression tasks: standardized targets, MSE, MAE/RMSE/R^2 in the target's units, predictions, and refusals."""

from __future__ import annotations

import csv
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import make_trainer, mlp_parties
from sklearn.datasets import load_diabetes
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

from lvfl.callbacks import PredictionWriter, StudentDistillation
from lvfl.datamodules import Diabetes, PartyTable, PartyTables
from lvfl.datamodules.base import VerticalDataModule
from lvfl.models import MLP
from lvfl.parties import TaskInfo
from lvfl.privacy import PaillierSoftLabels, RandomizedResponse
from lvfl.protocols import CVFL, EASTER, AggVFL, Central, PraVFed, SplitNN


def diabetes(**kwargs) -> Diabetes:
    dm = Diabetes(task="regression", num_parties=kwargs.pop("num_parties", 2), batch_size=64, **kwargs)
    dm.setup("fit")
    return dm


# ----------------------------------------------------------------------------------------------------- the task
def test_task_info_regression_has_no_classes_one_output_and_undoes_the_standardization():
    task = TaskInfo(num_classes=0, kind="regression", target_mean=150.0, target_scale=70.0)
    assert task.is_regression
    assert task.num_outputs == 1
    assert torch.equal(task.to_target(torch.tensor([0.0, 1.0, -2.0])), torch.tensor([150.0, 220.0, 10.0]))
    with pytest.raises(ValueError, match="num_classes must be 0"):
        TaskInfo(num_classes=2, kind="regression")
    with pytest.raises(ValueError, match="target_scale"):
        TaskInfo(num_classes=0, kind="regression", target_scale=0.0)
    assert TaskInfo(num_classes=3).num_outputs == 3
    assert not TaskInfo(num_classes=3).is_regression


def test_diabetes_regression_labels_are_the_raw_targets_standardized_by_the_training_rows():
    dm = diabetes()
    raw = load_diabetes(scaled=False).target  # independent reference: scikit-learn's own targets, by sample ID
    train = dm.train_set
    assert train.labels.dtype == torch.float32
    y_train = raw[train.ids.numpy()]
    assert dm.task.target_mean == pytest.approx(y_train.mean())
    assert dm.task.target_scale == pytest.approx(y_train.std())
    for split in ("train", "val", "test"):
        data = getattr(dm, f"{split}_set")
        np.testing.assert_allclose(dm.task.to_target(data.labels).numpy(), raw[data.ids.numpy()], rtol=1e-5)
    # the same rows as the binary task (the split is stratified on the target's quantile bins either way)
    binary = Diabetes(num_parties=2, batch_size=64)
    binary.setup("fit")
    for split in ("train", "val", "test"):
        assert torch.equal(getattr(binary, f"{split}_set").ids, getattr(dm, f"{split}_set").ids)
    assert binary.task.kind == "binary"
    assert dm.task.kind == "regression"


def test_diabetes_refuses_an_unknown_task():
    with pytest.raises(ValueError, match="task must be 'binary' or 'regression'.*'ordinal'"):
        Diabetes(task="ordinal")


class Targets(VerticalDataModule):
    """A regression datamodule with whatever targets a test gives it (the base's unstratified split)."""

    regression = True

    def __init__(self, y, **kwargs) -> None:
        self.y = y
        super().__init__(num_parties=2, **kwargs)

    def load(self):
        rng = np.random.default_rng(0)
        return rng.normal(size=(len(self.y), 4)), np.asarray(self.y)


def test_a_regression_split_is_unstratified_and_bad_targets_are_refused_by_row():
    y = np.linspace(-3.0, 5.0, 50)
    dm = Targets(y)
    dm.setup("fit")
    ids = torch.cat([dm.train_set.ids, dm.val_set.ids, dm.test_set.ids]).sort().values
    assert torch.equal(ids, torch.arange(50))
    assert len(dm.test_set) == 10
    bad = y.copy()
    bad[[7, 21]] = np.nan
    with pytest.raises(ValueError, match=r"finite; rows \[7, 21\] hold NaN or inf"):
        Targets(bad).setup("fit")
    with pytest.raises(ValueError, match="must be numbers, got dtype <U"):
        Targets(np.array(["a"] * 50)).setup("fit")
    with pytest.raises(ValueError, match="constant.*nothing to learn"):
        Targets(np.full(50, 2.5)).setup("fit")


# ----------------------------------------------------------------------------------------------- training, metrics
def test_the_loss_is_mse_on_standardized_targets_and_a_classification_loss_is_unchanged():
    model = EASTER(mlp_parties(2), embedding_dim=4)
    model.build(diabetes().party_specs, diabetes().task)
    out, y = torch.randn(5, 1), torch.randn(5)
    assert torch.equal(model.task_loss(out, y), F.mse_loss(out.squeeze(-1), y))
    with pytest.raises(ValueError, match=r"outputs shape \(N, 1\), got \(5, 2\)"):
        model.task_loss(torch.randn(5, 2), y)
    assert model.party_models["party0"](torch.randn(3, 5)).shape == (3, 1)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["easter", "splitnn", "aggvfl", "cvfl", "central"])
def test_metrics_are_in_the_targets_units_and_equal_scikit_learns_on_the_predictions(tmp_path, protocol):
    torch.manual_seed(0)  # the models' initialization: the figure below must not depend on the tests run before
    dm = diabetes()
    parties = mlp_parties(2, lr=0.005, momentum=0.9)
    model = {
        "easter": lambda: EASTER(parties, embedding_dim=8),
        "splitnn": lambda: SplitNN(parties, top_model=MLP, embedding_dim=8),
        "aggvfl": lambda: AggVFL(parties, embedding_dim=8),
        "cvfl": lambda: CVFL(parties, top_model=MLP, embedding_dim=8),
        "central": lambda: Central(parties, embedding_dim=8),
    }[protocol]()
    trainer = make_trainer(tmp_path, max_epochs=20)
    trainer.fit(model, datamodule=dm)
    (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
    preds = trainer.predict(model, dataloaders=dm.test_dataloader())
    y = dm.task.to_target(dm.test_set.labels).numpy()
    key = "aggregate" if protocol == "aggvfl" else model.active
    values = torch.cat([p["values"][key] for p in preds]).numpy()
    assert torch.equal(torch.cat([p["ids"] for p in preds]), dm.test_set.ids)
    suffix = "mean" if protocol == "aggvfl" else model.active
    assert metrics[f"test/r2/{suffix}"] == pytest.approx(r2_score(y, values), abs=1e-4)
    assert metrics[f"test/mae/{suffix}"] == pytest.approx(mean_absolute_error(y, values), rel=1e-4)
    assert metrics[f"test/rmse/{suffix}"] == pytest.approx(mean_squared_error(y, values) ** 0.5, rel=1e-4)
    assert not any("acc" in k or "auroc" in k for k in metrics)
    assert metrics[f"test/r2/{suffix}"] > 0.3  # it learns: the mean predictor scores 0, a linear fit about 0.45


def test_cvfl_sends_regression_labels_as_float32(tmp_path):
    dm = diabetes()
    model = CVFL(mlp_parties(2), top_model=MLP, embedding_dim=4)
    sent = []
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    model.wire.subscribe(lambda src, dst, tag, payload: sent.append((tag, payload)))
    trainer.fit(model, datamodule=dm)
    ((_, payload),) = [s for s in sent if s[0] == "labels"]
    assert payload.dtype == torch.float32
    assert len(payload) == 64
    assert model.wire.bytes_by_tag()["labels"] == 4 * 64  # 4 bytes per sample on the ledger


# ----------------------------------------------------------------------------------------------------- refusals
def test_what_needs_class_labels_refuses_a_regression_by_name(tmp_path):
    dm = diabetes()
    with pytest.raises(ValueError, match="LaplaceLabels protects class labels.*'regression'"):
        PraVFed(mlp_parties(2), embedding_dim=4).build(dm.party_specs, dm.task)
    with pytest.raises(ValueError, match="RandomizedResponse protects class labels.*'regression'"):
        EASTER(mlp_parties(2), embedding_dim=4, label_mechanism=RandomizedResponse(1.0)).build(dm.party_specs, dm.task)
    student = StudentDistillation(model=partial(MLP, hidden=[8]), epochs=1, channel=PaillierSoftLabels())
    trainer = make_trainer(tmp_path, max_epochs=1, callbacks=[student])
    with pytest.raises(ValueError, match="PaillierSoftLabels carries class probabilities and cannot distil a regr"):
        trainer.fit(EASTER(mlp_parties(2), embedding_dim=4), datamodule=dm)


# -------------------------------------------------------------------------------------------- predictions, tables
def test_prediction_writer_writes_values_in_the_targets_units(tmp_path):
    dm = diabetes()
    model = EASTER(mlp_parties(2, lr=0.01), embedding_dim=4)
    make_trainer(tmp_path, max_epochs=2).fit(model, datamodule=dm)
    writer = PredictionWriter(str(tmp_path / "p.csv"))
    trainer = make_trainer(tmp_path, callbacks=[writer])
    preds = trainer.predict(model, dataloaders=dm.test_dataloader(), return_predictions=True)
    with (tmp_path / "p.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "prediction", "path", "reason"]
    expected = torch.cat([p["values"][model.active] for p in preds])
    assert [r["id"] for r in rows] == [str(int(i)) for i in dm.test_set.ids]
    np.testing.assert_allclose([float(r["prediction"]) for r in rows], expected.numpy(), rtol=1e-6)
    assert {r["path"] for r in rows} == {"vfl"}
    assert 25 < expected.mean() < 346


def write_tables(tmp_path, labels: list[str]) -> list[PartyTable]:
    rng = np.random.default_rng(1)
    n = len(labels)
    with (tmp_path / "a.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cid", "x1", "spend"])
        w.writerows([[f"c{i}", f"{rng.normal():.3f}", labels[i]] for i in range(n)])
    with (tmp_path / "b.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "x2", "x3"])
        w.writerows([[f"c{i}", f"{rng.normal():.3f}", f"{rng.normal():.3f}"] for i in reversed(range(n))])
    return [
        PartyTable(path=str(tmp_path / "a.csv"), id_column="cid", label_column="spend"),
        PartyTable(path=str(tmp_path / "b.csv"), id_column="key"),
    ]


def test_party_tables_regress_on_a_numeric_label_column_and_refuse_a_text_by_line(tmp_path):
    values = [f"{10.0 + 3 * i:.1f}" for i in range(40)]
    dm = PartyTables(write_tables(tmp_path, values), task="regression", batch_size=8)
    dm.setup("fit")
    assert dm.task.is_regression
    assert dm.label_names == []
    data = dm.train_set
    keys = dm.business_ids(data.ids)
    np.testing.assert_allclose(dm.task.to_target(data.labels).numpy(), [10.0 + 3 * int(k[1:]) for k in keys], rtol=1e-5)
    values[17] = "n/a"
    with pytest.raises(ValueError, match=r"a.csv, line 19: the label column 'spend' holds 'n/a', not a finite"):
        PartyTables(write_tables(tmp_path, values), task="regression").setup("fit")
    with pytest.raises(
        ValueError, match=r"task must be one of \['classification', 'binary', 'multiclass', 'regression'\]"
    ):
        PartyTables(write_tables(tmp_path, values), task="regresion")


@pytest.mark.slow
def test_lvfl_fit_then_predict_writes_values_for_the_regression_pieces(tmp_path, monkeypatch):
    from helpers import REPO

    from lvfl.commands.fit import main

    monkeypatch.chdir(REPO)
    pieces = [
        *("--config", "configs/data/diabetes_regression.yaml"),
        *("--config", "configs/protocols/splitnn/default.yaml"),
        *("--config", "configs/parties/diabetes_regression.yaml"),
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    main(["fit", *pieces, "--trainer.max_epochs=2"])
    ids = tmp_path / "ids.txt"
    ids.write_text("5\n3\n")  # two of the 442 samples, in this order
    out = tmp_path / "pred.csv"
    main(["predict", *pieces, "--ckpt_path", "last", "--output", str(out), "--ids", str(ids)])
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["id"], r["path"]) for r in rows] == [("5", "vfl"), ("3", "vfl")]
    assert all(np.isfinite(float(r["prediction"])) for r in rows)
