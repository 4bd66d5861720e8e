"""`PartyTables`: each party's own CSV with its own ID column, aligned by PSI, the intersection driving overlap."""

from __future__ import annotations

import csv
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lvfl.datamodules import PartyTable, PartyTables
from lvfl.models import MLP
from lvfl.privacy.psi import message_bytes
from lvfl.protocols import EASTER, PartyConfig


def write_csv(path: Path, header: list[str], rows: list[list]) -> str:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def bank_retailer(tmp_path: Path) -> dict:
    """A bank (active: income, age, label "default"/"ok") and a retailer (spend, visits): ~900 IDs each, 604 shared,
    in different orders, the retailer's rows keyed by a column of another name."""
    rng = np.random.default_rng(0)
    bank_ids = [f"C{i:05d}" for i in rng.permutation(900)]
    retail_ids = [f"C{i:05d}" for i in rng.permutation(np.arange(296, 1196))]
    income = {i: round(float(rng.normal(50, 10)), 3) for i in bank_ids}
    bank_rows = [[i, income[i], int(rng.integers(18, 80)), "default" if income[i] < 45 else "ok"] for i in bank_ids]
    retail = {i: [round(float(rng.normal(5, 2)), 3), int(rng.integers(0, 30))] for i in retail_ids}
    bank = write_csv(tmp_path / "bank.csv", ["customer_id", "income", "age", "status"], bank_rows)
    retailer = write_csv(
        tmp_path / "retailer.csv", ["visits", "client", "spend"], [[v[1], i, v[0]] for i, v in retail.items()]
    )
    return {"bank": bank, "retailer": retailer, "bank_rows": {r[0]: r for r in bank_rows}, "retail": retail}


def tables(data: dict, **kwargs) -> PartyTables:
    parties = [
        PartyTable(data["bank"], id_column="customer_id", label_column="status"),
        PartyTable(data["retailer"], id_column="client", columns=["spend", "visits"]),
    ]
    return PartyTables(parties, batch_size=32, scale=False, **kwargs)


def test_rows_line_up_by_business_id_and_the_intersection_is_what_every_party_holds(bank_retailer) -> None:
    dm = tables(bank_retailer)
    assert [s.input_shape for s in dm.party_specs] == [(2,), (2,)]
    assert dm.label_names == ["default", "ok"]
    shared = set(bank_retailer["bank_rows"]) & set(bank_retailer["retail"])
    assert len(shared) == 604
    served = 0
    for split in ("train", "val", "test"):
        vfl = getattr(dm, f"{split}_set")  # the VFL view: the samples every party holds
        ids = dm.business_ids(vfl.ids)
        assert set(ids) <= shared
        served += len(ids)
        bank = vfl.features["party0"].numpy()
        retail = vfl.features["party1"].numpy()
        for j, key in enumerate(ids):  # an independent join by business ID
            row = bank_retailer["bank_rows"][key]
            np.testing.assert_allclose(bank[j], [row[1], row[2]], rtol=1e-6)
            np.testing.assert_allclose(retail[j], bank_retailer["retail"][key], rtol=1e-6)
            assert vfl.labels[j].item() == dm.label_names.index(row[3])
        only = dm.active_only_set(split)
        assert not set(dm.business_ids(only.ids)) & shared  # the rest exist at the bank only
    assert served == 604


def test_the_psi_messages_reach_the_protocols_wire_as_set_up_traffic(bank_retailer, tmp_path: Path) -> None:
    dm = tables(bank_retailer)
    sgd = partial(torch.optim.SGD, lr=0.1)
    model = EASTER([PartyConfig(partial(MLP, hidden=[8]), sgd)], embedding_dim=4)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    psi = {k: v for k, v in model.wire.bytes_by_tag().items() if k.startswith("psi/")}
    assert psi == {f"psi/{k}": v for k, v in message_bytes({"party0": 900, "party1": 900}, "party0", 604).items()}


BANK_HEADER = ["customer_id", "income", "age", "status"]


@pytest.mark.parametrize(
    ("table", "header", "rows", "match"),
    [
        ("retailer", ["visits", "customer", "spend"], [[1, "C00001", 2.0]], r"retailer.csv: no column 'client'"),
        ("bank", BANK_HEADER, [["C00001", 1, 2, "ok"]] * 2, r"bank.csv: ID 'C00001' occurs twice \(lines 2 and 3\)"),
        ("bank", BANK_HEADER, [["C00001", "", 2, "ok"]], r"bank.csv, line 2: column 'income' is missing a value"),
        (
            "bank",
            BANK_HEADER,
            [["C00001", 1, "old", "ok"]],
            r"bank.csv, line 2: column 'age' holds 'old', not a number",
        ),
    ],
    ids=["id column", "duplicate", "missing", "text"],
)
def test_bad_tables_are_refused_naming_file_column_and_line(bank_retailer, table, header, rows, match) -> None:
    write_csv(Path(bank_retailer[table]), header, rows)
    with pytest.raises(ValueError, match=match):
        tables(bank_retailer).setup("fit")


def test_the_label_column_belongs_to_the_active_party_only(bank_retailer) -> None:
    with pytest.raises(ValueError, match=r"exactly the active party's table \(party 0\) names a `label_column`"):
        PartyTables(
            [
                PartyTable(bank_retailer["bank"], id_column="customer_id"),
                PartyTable(bank_retailer["retailer"], id_column="client", label_column="spend"),
            ]
        )
    with pytest.raises(ValueError, match=r"overlap=0.5 draws which samples every party holds"):
        tables(bank_retailer, overlap=0.5).setup("fit")


def test_three_parties_hold_the_common_intersection(bank_retailer, tmp_path: Path) -> None:
    third = [[f"C{i:05d}", float(i % 7)] for i in range(0, 1300, 2)][::-1]
    path = write_csv(tmp_path / "insurer.csv", ["id", "claims"], third)
    dm = PartyTables(
        [
            PartyTable(bank_retailer["bank"], id_column="customer_id", label_column="status"),
            PartyTable(bank_retailer["retailer"], id_column="client"),
            PartyTable(path, id_column="id"),
        ],
        scale=False,
    )
    shared = set(bank_retailer["bank_rows"]) & set(bank_retailer["retail"]) & {r[0] for r in third}
    ids = [k for split in ("train", "val", "test") for k in dm.business_ids(getattr(dm, f"{split}_set").ids)]
    assert sorted(ids) == sorted(shared)
    claims = {r[0]: r[1] for r in third}
    train = dm.train_set
    np.testing.assert_array_equal(
        train.features["party2"][:, 0].numpy(), [claims[k] for k in dm.business_ids(train.ids)]
    )
