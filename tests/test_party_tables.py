"""`PartyTables`: each party's own CSV with its own ID column, aligned by PSI, the intersection driving overlap."""

from __future__ import annotations

import csv
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers import each_in_a_thread

from lvfl.alignment import message_bytes
from lvfl.datamodules import PartyTable, PartyTables
from lvfl.federation.rehearsal import MemoryCarrier
from lvfl.models import MLP
from lvfl.protocols import EASTER, PartyConfig
from lvfl.shadows import Shadow
from lvfl.wire import Wire


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
    return PartyTables(parties, batch_size=32, **{"scale": False, **kwargs})


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


def test_kkrt_aligns_the_tables_as_ecdh_does_and_a_bad_psi_is_refused_by_name(bank_retailer) -> None:
    ecdh, kkrt = tables(bank_retailer, psi="ecdh"), tables(bank_retailer)
    assert kkrt.psi == "kkrt"  # the default
    for split in ("train", "val", "test"):
        a, b = getattr(ecdh, f"{split}_set"), getattr(kkrt, f"{split}_set")
        assert ecdh.business_ids(a.ids) == kkrt.business_ids(b.ids)
        for party in ("party0", "party1"):
            assert torch.equal(a.features[party], b.features[party])
    tags = {m[3] for m in kkrt.alignment_messages()}
    assert tags == {"psi/setup", "psi/choices", "psi/seeds", "psi/matrix", "psi/values", "psi/matches"}
    with pytest.raises(ValueError, match=r"PartyTables: psi must be one of \['ecdh', 'kkrt'\], got psi='rsa'"):
        tables(bank_retailer, psi="rsa")


PSI_ORDER = {  # the order of each PSI module's docstring, party1 being the bank's one partner
    "kkrt": [  # the default
        ("party0", "party1", "psi/setup"),
        ("party1", "party0", "psi/choices"),
        ("party0", "party1", "psi/seeds"),
        ("party0", "party1", "psi/matrix"),
        ("party1", "party0", "psi/values"),
    ],
    "ecdh": [  # message 3 first, which needs nothing from party0
        ("party1", "party0", "psi/peer"),
        ("party0", "party1", "psi/blinded"),
        ("party1", "party0", "psi/reblinded"),
    ],
}


@pytest.mark.parametrize("psi", [None, "ecdh"])
def test_the_psi_messages_reach_the_protocols_wire_as_set_up_traffic(bank_retailer, tmp_path: Path, psi) -> None:
    """The default PSI (`psi` unset) is KKRT16's; ECDH-PSI's messages reach the wire the same way."""
    dm = tables(bank_retailer) if psi is None else tables(bank_retailer, psi=psi)
    protocol = psi or "kkrt"
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
    seen = []  # what a party's observer sees: the PSI's messages too, not only their bytes
    model.wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag)))
    trainer.fit(model, datamodule=dm)
    psi = {k: v for k, v in model.wire.bytes_by_tag().items() if k.startswith("psi/")}
    sizes = {"party0": 900, "party1": 900}
    assert psi == {f"psi/{k}": v for k, v in message_bytes(sizes, "party0", 604, protocol).items()}
    assert seen[: len(PSI_ORDER[protocol]) + 2] == [
        *PSI_ORDER[protocol],
        ("party0", "party1", "psi/matches"),
        ("party0", "party1", "split"),  # then the retailer's rows of each split, one byte per shared customer
    ]
    assert model.wire.bytes[("party0", "party1", "split")] == 604


def test_fit_prints_and_logs_the_psis_counts(bank_retailer, tmp_path: Path, capsys) -> None:
    """The intersection's size was printed nowhere: fit prints one line and logs `setup/psi/...` to every logger
    (what the active party learns: each list's size, each pairwise overlap, the common intersection)."""
    import csv as csv_module

    model = EASTER([PartyConfig(partial(MLP, hidden=[8]))], embedding_dim=4)
    logger = pl.loggers.CSVLogger(tmp_path, name="psi")
    trainer = pl.Trainer(
        max_epochs=1, limit_train_batches=1, limit_val_batches=0, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=tables(bank_retailer))
    assert "lvfl: PSI: party0 900 IDs; party1 900 IDs (604 shared with the active party); every party holds 604" in (
        capsys.readouterr().out
    )
    (path,) = tmp_path.rglob("metrics.csv")
    with path.open(newline="") as f:
        rows = list(csv_module.DictReader(f))
    logged = {k: float(v) for row in rows for k, v in row.items() if k.startswith("setup/psi/") and v}
    assert logged == {
        "setup/psi/party0/ids": 900.0,
        "setup/psi/party1/ids": 900.0,
        "setup/psi/party1/shared_with_active": 604.0,
        "setup/psi/intersection": 604.0,
    }


PSI_PHASES = {
    "kkrt": [  # the default
        ("party0: PSI, hashing its IDs into bins", 900, "IDs"),
        ("party0: PSI, the OT extension with party1", 1143, "bins"),  # ceil(1.27 x 900)
        ("party1: PSI, its rows of the OT extension", 1143, "bins"),
        ("party1: PSI, its OPRF values for party0", 2700, "values"),  # three for each of its 900 IDs
        ("party0: PSI, matching party1's values", 900, "IDs"),
    ],
    "ecdh": [
        ("party0: PSI, hashing and blinding its IDs", 900, "IDs"),
        ("party1: PSI, hashing and blinding its IDs", 900, "IDs"),
        ("party0: PSI, blinding party1's IDs again", 900, "IDs"),
        ("party1: PSI, blinding party0's IDs again", 900, "IDs"),
    ],
}


@pytest.mark.parametrize("psi", ["kkrt", "ecdh"])
def test_each_phase_of_the_set_up_reports_as_it_runs_and_keeps_its_figures(bank_retailer, capsys, psi) -> None:
    """Reading, each PSI step, the split, fitting, encoding: a line each on standard error (no terminal), in order."""
    dm = tables(bank_retailer, psi=psi)
    dm.setup("fit")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("party")]
    want = [
        ("party0: reading its table", 900, "rows"),
        ("party1: reading its table", 900, "rows"),
        *PSI_PHASES[psi],
        ("party0: drawing the split", 900, "rows"),
        ("party0: fitting its encoders", 2, "columns"),
        ("party1: fitting its encoders", 2, "columns"),
        ("party0: encoding its columns", 2, "columns"),
        ("party1: encoding its columns", 2, "columns"),
    ]
    assert [(p.name, p.count, p.unit) for p in dm.phases] == want
    assert lines == [
        f"{p.name}: {p.count:,} {p.unit} in {p.seconds:.1f} s, peak memory {p.peak_mb:,.0f} MB" for p in dm.phases
    ]
    assert all(p.peak_mb > 0 for p in dm.phases)


def corrupt(path: str, line: int, column: int, value: str) -> None:
    """Set one field of a CSV (line numbers as an editor shows them, the header on line 1)."""
    with Path(path).open(newline="") as f:
        rows = list(csv.reader(f))
    rows[line - 1][column] = value
    write_csv(Path(path), rows[0], rows[1:])


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (("retailer", 1, 1, "customer"), r"retailer.csv: no column 'client'"),
        (
            ("bank", 3, 0, "ID_OF_LINE_2"),
            r"bank.csv, line 3: ID 'ID_OF_LINE_2' occurs twice \(first at .*bank.csv, line 2\)",
        ),
        (("bank", 40, 1, ""), r"bank.csv, line 40: column 'income' is missing a value \(missing: refuse"),
        (("bank", 40, 2, "old"), r"bank.csv, line 40: column 'age' holds 'old', not a number"),
    ],
    ids=["id column", "duplicate", "missing", "text"],
)
def test_bad_tables_are_refused_naming_file_column_and_line(bank_retailer, edit, match) -> None:
    table, line, column, value = edit
    if value == "ID_OF_LINE_2":
        corrupt(bank_retailer["bank"], 2, 0, value)
    corrupt(bank_retailer[table], line, column, value)
    with pytest.raises(ValueError, match=match):
        tables(bank_retailer).setup("fit")


def test_a_refused_missing_value_names_the_first_in_the_file_and_how_many_rows(bank_retailer) -> None:
    """Blanks on lines 51 and 7 (read in the split's order, line 51 may come first): the refusal names line 7, the
    first in the file, and counts the rows a policy would have to fill."""
    corrupt(bank_retailer["bank"], 51, 1, "")
    corrupt(bank_retailer["bank"], 7, 1, "NA")
    with pytest.raises(ValueError, match=r"bank.csv, line 7: column 'income' is missing a value \(and 1 more of the "
                       r"table's 900 rows\) \(missing: refuse; set the table's `missing`"):  # fmt: skip
        tables(bank_retailer).setup("fit")


def test_a_misspelt_column_is_refused_with_the_closest_the_file_holds(bank_retailer) -> None:
    parties = [
        PartyTable(bank_retailer["bank"], id_column="customer_di", label_column="status"),
        PartyTable(bank_retailer["retailer"], id_column="client"),
    ]
    with pytest.raises(ValueError, match=r"no column 'customer_di' \(the file's columns: .*\); did you mean "
                       r"'customer_id'\?"):  # fmt: skip
        PartyTables(parties, batch_size=32).setup("fit")


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


# ---------------------------------------------------------------------------------------------------- encoding
@pytest.fixture
def with_categories(tmp_path: Path) -> dict:
    """The bank with a categorical `segment` and ~5% missing incomes; the retailer with a categorical `region`."""
    rng = np.random.default_rng(1)
    ids = [f"C{i:05d}" for i in rng.permutation(400)]
    bank = {
        i: [
            "" if rng.random() < 0.05 else f"{rng.normal(50, 10):.3f}",
            str(rng.choice(["retail", "premium", "student"])),
        ]
        for i in ids
    }
    status = {i: "ok" if rng.random() < 0.6 else "default" for i in ids}
    region = {i: str(rng.choice(["north", "south"])) for i in ids[:300]}
    return {
        "bank": write_csv(
            tmp_path / "bank.csv", ["id", "income", "segment", "status"], [[i, *v, status[i]] for i, v in bank.items()]
        ),
        "retailer": write_csv(tmp_path / "retailer.csv", ["id", "region"], [[i, r] for i, r in region.items()]),
        "values": bank,
    }


def encoded(data: dict, **kwargs) -> PartyTables:
    return PartyTables(
        [
            PartyTable(data["bank"], id_column="id", label_column="status", missing="mean"),
            PartyTable(data["retailer"], id_column="id"),
        ],
        scale=False,
        **kwargs,
    )


def training_ids(dm: PartyTables) -> list[str]:
    return dm.business_ids(dm.active_set("train").ids)


def test_imputation_and_levels_come_from_the_training_rows_only(with_categories) -> None:
    dm = encoded(with_categories)
    names = dm.feature_names
    assert names["party0"] == [
        "income",
        "income missing",
        "segment=premium",
        "segment=retail",
        "segment=student",
        "segment=<missing>",
        "segment=<unseen>",
    ]
    assert names["party1"] == ["region=north", "region=south", "region=<unseen>"]  # refuse: no <missing> level
    values = with_categories["values"]
    train_incomes = [float(values[i][0]) for i in training_ids(dm) if values[i][0]]
    every = dm.active_set("test")
    x = every.features["party0"].numpy()
    for j, key in enumerate(dm.business_ids(every.ids)):
        income, segment = values[key]
        expected = float(income) if income else np.mean(train_incomes)
        assert x[j, 0] == pytest.approx(expected, rel=1e-6)
        assert x[j, 1] == (0.0 if income else 1.0)
        assert x[j, 2:].tolist() == [float(f"segment={segment}" == n) for n in names["party0"][2:]]

    # a level seen only in a test row maps to <unseen>; a changed test value leaves the fitted encoders alone
    key = dm.business_ids(every.ids[:1])[0]
    rows = {i: v for i, v in values.items()}
    rows[key] = ["1000000", "vip"]
    with Path(with_categories["bank"]).open(newline="") as f:
        status = {r[0]: r[-1] for r in csv.reader(f)}
    write_csv(
        Path(with_categories["bank"]),
        ["id", "income", "segment", "status"],
        [[i, *v, status[i]] for i, v in rows.items()],
    )
    again = encoded(with_categories)
    assert again.feature_names == names
    assert again.encoders["party0"][0].fill == dm.encoders["party0"][0].fill
    test = again.active_set("test")
    j = again.business_ids(test.ids).index(key)
    assert test.features["party0"][j, -1].item() == 1.0  # segment=<unseen>


def test_codes_give_the_party_models_their_cardinalities(with_categories) -> None:
    dm = encoded(with_categories, encoding="codes")
    specs = {s.name: s for s in dm.party_specs}
    assert dm.feature_names["party0"] == ["income", "income missing", "segment"]
    assert specs["party0"].categories == (0, 0, 5)  # premium, retail, student, <missing>, <unseen>
    assert specs["party1"].categories == (3,)
    codes = dm.train_set.features["party1"][:, 0]
    assert set(codes.tolist()) <= {0.0, 1.0}


def test_a_mixed_column_and_a_bad_policy_are_refused(with_categories) -> None:
    corrupt(with_categories["retailer"], 5, 1, "17")
    with pytest.raises(ValueError, match=r"retailer.csv, line 5: column 'region' holds '17', a number among text"):
        encoded(with_categories).setup("fit")
    with pytest.raises(
        ValueError, match=r"`missing` must be one of \['refuse', 'mean', 'median', 'mode', 'level'\], got 'zero'"
    ):
        PartyTables(
            [
                PartyTable(with_categories["bank"], id_column="id", label_column="status", missing="zero"),
                PartyTable(with_categories["retailer"], id_column="id"),
            ]
        ).setup("fit")


# ---------------------------------------------------------------------------------------------------- formats
def test_a_directory_of_csv_parts_and_a_parquet_file_read_as_the_single_csvs_do(bank_retailer, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with Path(bank_retailer["bank"]).open(newline="") as f:
        header, *rows = list(csv.reader(f))
    parts = tmp_path / "bank_parts"
    parts.mkdir()
    write_csv(parts / "part-0.csv", header, rows[:500])
    write_csv(parts / "part-1.csv", header, rows[500:])
    with Path(bank_retailer["retailer"]).open(newline="") as f:
        r_header, *r_rows = list(csv.reader(f))
    columns = {name: [row[j] for row in r_rows] for j, name in enumerate(r_header)}
    table = pa.table(
        {
            "client": columns["client"],
            "spend": [float(v) for v in columns["spend"]],
            "visits": [int(v) for v in columns["visits"]],
        }
    )
    pq.write_table(table, tmp_path / "retailer.parquet")

    single = tables(bank_retailer)
    split = PartyTables(
        [
            PartyTable(str(parts), id_column="customer_id", label_column="status"),
            PartyTable(str(tmp_path / "retailer.parquet"), id_column="client", columns=["spend", "visits"]),
        ],
        batch_size=32,
        scale=False,
    )
    for name in ("train", "test"):
        a, b = getattr(single, f"{name}_set"), getattr(split, f"{name}_set")
        assert single.business_ids(a.ids) == split.business_ids(b.ids)
        for party in ("party0", "party1"):
            assert torch.equal(a.features[party], b.features[party]), (name, party)


def test_parquet_nulls_are_missing_values_named_by_row_and_mixed_directories_are_refused(
    bank_retailer, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"client": ["C00300", "C00301"], "spend": [1.0, None]}), tmp_path / "r.parquet")
    dm = PartyTables(
        [
            PartyTable(bank_retailer["bank"], id_column="customer_id", label_column="status"),
            PartyTable(str(tmp_path / "r.parquet"), id_column="client"),
        ]
    )
    with pytest.raises(ValueError, match=r"r.parquet, row 2: column 'spend' is missing a value"):
        dm.setup("fit")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_text("client,spend\n")
    pq.write_table(pa.table({"client": ["x"]}), mixed / "b.parquet")
    with pytest.raises(ValueError, match=r"mixes .csv and .parquet files"):
        PartyTables(
            [
                PartyTable(bank_retailer["bank"], id_column="customer_id", label_column="status"),
                PartyTable(str(mixed), id_column="client"),
            ]
        ).setup("fit")


@pytest.mark.slow
def test_per_column_policies_mode_and_their_indicators(with_categories, tmp_path: Path) -> None:
    values = with_categories["values"]
    keys = list(values)
    for key in keys[:40:4]:  # some missing segments too
        values[key] = [values[key][0], ""]
    with Path(with_categories["bank"]).open(newline="") as f:
        status = {r[0]: r[-1] for r in csv.reader(f)}
    header = ["id", "income", "segment", "status"]
    write_csv(Path(with_categories["bank"]), header, [[i, *v, status[i]] for i, v in values.items()])
    table = PartyTable(
        with_categories["bank"],
        id_column="id",
        label_column="status",
        missing="refuse",
        missing_columns={"income": "median", "segment": "mode"},
    )
    dm = PartyTables([table, PartyTable(with_categories["retailer"], id_column="id")], scale=False)
    names = dm.feature_names["party0"]
    assert names == [
        "income",
        "income missing",
        "segment=premium",
        "segment=retail",
        "segment=student",
        "segment=<unseen>",
        "segment missing",
    ]
    train = [values[i] for i in training_ids(dm)]
    median = float(np.median([float(v[0]) for v in train if v[0]]))
    segments = [v[1] for v in train if v[1]]
    mode = max(sorted(set(segments)), key=segments.count)
    assert dm.encoders["party0"][0].fill == pytest.approx(median)
    assert dm.encoders["party0"][1].fill_level == mode
    every = dm.active_set("train")
    x = every.features["party0"].numpy()
    for j, key in enumerate(dm.business_ids(every.ids)):
        income, segment = values[key]
        assert x[j, 1] == float(not income)
        assert x[j, 6] == float(not segment)
        assert x[j, 2 + ["premium", "retail", "student"].index(segment or mode)] == 1.0

    codes = PartyTables([table, PartyTable(with_categories["retailer"], id_column="id")], encoding="codes")
    assert codes.feature_names["party0"] == ["income", "income missing", "segment", "segment missing"]
    assert codes.party_specs[0].categories == (0, 0, 4, 0)  # the indicator is numeric, not a code column


def test_a_policy_that_does_not_fit_the_column_is_refused(with_categories) -> None:
    def build(**missing_columns):
        table = PartyTable(
            with_categories["bank"], id_column="id", label_column="status", missing_columns=missing_columns
        )
        return PartyTables([table, PartyTable(with_categories["retailer"], id_column="id")])

    with pytest.raises(ValueError, match=r"column 'segment' is categorical; its missing policy can be mode or level"):
        build(segment="mean").setup("fit")
    with pytest.raises(ValueError, match=r"column 'income' is numeric; missing 'level' is for categorical columns"):
        build(income="level").setup("fit")
    with pytest.raises(ValueError, match=r"`missing_columns` names 'colour', which is not a feature column"):
        build(colour="mode").setup("fit")


def _labelled(tmp_path: Path, labels: list[str]) -> list[PartyTable]:
    """A bank labelled by `labels` (one row each, cycled over 120 rows) and a retailer holding the same IDs."""
    rng = np.random.default_rng(3)
    ids = [f"P{i:03d}" for i in range(120)]
    bank = write_csv(tmp_path / "b.csv", ["pid", "x", "label"],
                     [[i, round(float(rng.normal()), 3), labels[k % len(labels)]]
                      for k, i in enumerate(ids)])  # fmt: skip
    shop = write_csv(tmp_path / "s.csv", ["pid", "y"], [[i, round(float(rng.normal()), 3)] for i in ids])
    return [PartyTable(bank, id_column="pid", label_column="label"), PartyTable(shop, id_column="pid")]


def test_the_stated_task_is_checked_against_the_classes_found(tmp_path: Path) -> None:
    three = _labelled(tmp_path, ["low", "medium", "high"])
    dm = PartyTables(three, batch_size=32, task="multiclass")
    dm.setup("fit")
    assert dm.label_names == ["high", "low", "medium"]
    assert dm.task.num_classes == 3
    with pytest.raises(ValueError, match=r"b.csv: the label column 'label' holds 3 classes \(high, low, medium\), "
                       r"but task: binary needs 2"):  # fmt: skip
        PartyTables(three, batch_size=32, task="binary").setup("fit")
    two = _labelled(tmp_path, ["no", "yes"])
    with pytest.raises(ValueError, match=r"holds 2 classes \(no, yes\), but task: multiclass needs 3 or more"):
        PartyTables(two, batch_size=32, task="multiclass").setup("fit")
    with pytest.raises(ValueError, match=r"task must be one of \['classification', 'binary', 'multiclass', "):
        PartyTables(two, task="binery")


@pytest.mark.slow
def test_a_numeric_label_of_many_values_is_refused_as_a_quantity_not_read_as_classes(tmp_path: Path) -> None:
    """An interest rate (hundreds of distinct numbers) under the default task: one line naming task: regression,
    not scikit-learn's words about one-member classes; stated as regression it trains, and class codes pass."""
    rates = [f"{4 + 0.01 * k:.2f}" for k in range(120)]
    with pytest.raises(ValueError, match=r"the label column 'label' holds 120 distinct numbers \(4.00, 4.01, "
                       r"4.02, 4.03, 4.04, ... 115 more\): a quantity, .* set task: regression"):  # fmt: skip
        PartyTables(_labelled(tmp_path, rates), batch_size=32).setup("fit")
    regression = PartyTables(_labelled(tmp_path, rates), batch_size=32, task="regression")
    regression.setup("fit")
    assert regression.task.kind == "regression"
    with pytest.raises(ValueError, match=r"holds 3 distinct numbers \(0.5, 1.5, 2\)"):  # a fraction: a quantity
        PartyTables(_labelled(tmp_path, ["0.5", "1.5", "2"]), batch_size=32).setup("fit")
    codes = PartyTables(
        _labelled(tmp_path, [str(k) for k in range(24)]), batch_size=32, task="multiclass", stratify="none"
    )  # 24 classes, 120 rows: too few to stratify
    codes.setup("fit")
    assert codes.task.num_classes == 24
    small = PartyTables(_labelled(tmp_path, ["0", "1", "2"]), batch_size=32)  # a few integer codes pass as they are
    small.setup("fit")
    assert small.task.num_classes == 3


def test_a_partys_own_process_holds_its_slices_once_and_the_others_as_shadows_from_the_start(bank_retailer) -> None:
    """Each party in its own wire view (threads over a `MemoryCarrier`, as `lvfl launch`'s processes): its slices
    are the simulation's, bit for bit; the other party's are shadows before `hold_only` runs, so their columns of
    `load()`'s array are never read; the active party's VFL view of a split is a view of its own slice, no copy."""
    whole = tables(bank_retailer, scale=True)
    whole.setup()
    transport = MemoryCarrier(timeout=60)
    own = {name: tables(bank_retailer, scale=True) for name in ("party0", "party1")}

    def run(name: str) -> None:
        own[name].exchange_on(Wire(here=name, carrier=transport))
        own[name].setup()

    each_in_a_thread(run, list(own))
    for name, dm in own.items():
        other = "party1" if name == "party0" else "party0"
        for split in ("train", "val", "test"):
            stored = dm._prepared.splits[split].stored
            assert torch.equal(stored[name], whole._prepared.splits[split].stored[name]), (name, split)
            assert isinstance(stored[other], Shadow)
            assert stored[other].shape == whole._prepared.splits[split].stored[other].shape
    active = own["party0"]._prepared
    for split in ("train", "val", "test"):  # the shared rows lead each split: the VFL slice is the first of them
        vfl, alone = active.splits[split].stored["party0"], active.active_splits[split].stored["party0"]
        assert vfl.data_ptr() == alone.data_ptr()
        assert len(vfl) < len(alone)
    width = 4 * 2  # float32, two feature columns each: the bank's 900 rows, the retailer's 604 shared ones
    assert (own["party0"].held_feature_bytes(), own["party1"].held_feature_bytes()) == (900 * width, 604 * width)
    assert whole.held_feature_bytes() == (900 + 604) * width  # in simulation: every party's, each once
