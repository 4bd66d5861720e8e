"""`lvfl predict` writes a file: one row per sample keyed by its business ID, decoded labels, the answering path."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
import torch
from helpers import REPO, checkpoints_of

from lvfl.callbacks import PredictionWriter
from lvfl.commands.fit import build_cli, main
from lvfl.commands.predict import NO_STUDENT, UNKNOWN_ID
from lvfl.inference.student_file import load_student

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


@pytest.mark.slow
def test_predict_writes_one_row_per_test_sample_equal_to_the_models_outputs(fitted, tmp_path, monkeypatch, capsys):
    """Every test sample of the active party gets a row: the shared ones the VFL model's answer, the bank's own a
    reason (this run saved no student); none is dropped."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "preds.csv"
    main(["predict", *args(fitted, f"--output={out}")])
    said = capsys.readouterr().out
    everything = read(out)
    assert list(everything[0]) == ["id", "prediction", "prob_default", "prob_ok", "path", "reason"]
    rows = [r for r in everything if r["path"] == "vfl"]
    unanswered = [r for r in everything if r["path"] == ""]
    assert len(rows) + len(unanswered) == len(everything)
    counts = f"{len(rows)} by the VFL model, 0 by the student, {len(unanswered)} unanswered"
    assert f"{len(everything)} rows written to {out}: {counts}" in said

    # the same checkpoint in this process: the active party's model on the test split
    cli = build_cli([*args(fitted)[:-2]], run=False)
    checkpoint = torch.load(checkpoints_of(fitted / "bank_retailer") / "last.ckpt", weights_only=False)
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
    only = cli.datamodule.active_only_set("test").ids
    assert len(only) > 0
    assert [r["id"] for r in everything] == cli.datamodule.business_ids(cli.datamodule.active_set("test").ids)
    assert {r["id"] for r in unanswered} == set(cli.datamodule.business_ids(only))
    assert all(r["prediction"] == r["prob_ok"] == "" and r["reason"] == NO_STUDENT for r in unanswered)
    written = torch.tensor([[float(r["prob_default"]), float(r["prob_ok"])] for r in rows])
    torch.testing.assert_close(written, probs, rtol=1e-5, atol=1e-6)
    names = cli.datamodule.label_names
    assert [r["prediction"] for r in rows] == [names[c] for c in probs.argmax(1).tolist()]
    assert all(r["reason"] == "" for r in rows)

    # and their accuracy is lvfl test's
    (metrics,) = build_cli(args(fitted)[:-2], run=False).trainer.test(
        cli.model, datamodule=cli.datamodule, verbose=False
    )
    accuracy = sum(r["prediction"] == names[int(y)] for r, y in zip(rows, test.labels, strict=True)) / len(rows)
    assert accuracy == pytest.approx(metrics["test/acc/party0"], abs=1e-6)


@pytest.mark.slow
def test_parquet_output_and_the_mean_of_the_parties(fitted, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.chdir(REPO)
    main(["predict", *args(fitted, f"--output={tmp_path / 'p.parquet'}")])
    table = pq.read_table(tmp_path / "p.parquet").to_pydict()
    assert list(table) == ["id", "prediction", "prob_default", "prob_ok", "path", "reason"]
    assert None in table["prob_ok"]  # a row nobody answered: empty, not a made-up number
    writer = PredictionWriter(str(tmp_path / "m.csv"), party="mean")
    outputs = [{"ids": torch.tensor([0]), "probs": {"a": torch.tensor([[0.2, 0.8]]), "b": torch.tensor([[0.6, 0.4]])}}]
    torch.testing.assert_close(writer._answer(None, [o["probs"] for o in outputs]), torch.tensor([[0.4, 0.6]]))


def test_output_is_refused_outside_predict_and_needs_a_known_format(fitted, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        main(["test", *args(fitted, f"--output={tmp_path / 'x.csv'}")])
    assert "--output is an option of lvfl predict; lvfl test refuses it" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"path 'x.txt' must end in one of \['.csv', '.parquet'\]"):
        PredictionWriter("x.txt")


@pytest.mark.slow
def test_predict_answers_the_requested_ids_in_their_order_from_any_split(fitted, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    cli = build_cli([*args(fitted)[:-2]], run=False)
    dm = cli.datamodule
    wanted = [*dm.business_ids(dm.test_set.ids[:2]), *dm.business_ids(dm.train_set.ids[:3])][::-1]
    (tmp_path / "ids.csv").write_text("customer\n" + "\n".join(wanted) + "\n")
    out = tmp_path / "some.csv"
    main(["predict", *args(fitted, f"--output={out}", f"--ids={tmp_path / 'ids.csv'}")])
    rows = read(out)
    assert [r["id"] for r in rows] == wanted
    assert {r["path"] for r in rows} == {"vfl"}

    # the same samples' outputs in this process
    checkpoint = torch.load(checkpoints_of(fitted / "bank_retailer") / "last.ckpt", weights_only=False)
    cli.trainer.datamodule = dm
    cli.model.trainer = cli.trainer
    cli.model.setup("predict")
    cli.model.load_state_dict(checkpoint["state_dict"])
    subset = dm.vfl_rows(dm.sample_ids_for(wanted))
    batch = dm.on_after_batch_transfer(subset.gather(torch.arange(len(subset))), 0)
    with torch.no_grad():
        probs = cli.model.party_logits(batch)["party0"].softmax(-1)
    written = torch.tensor([[float(r["prob_default"]), float(r["prob_ok"])] for r in rows])
    torch.testing.assert_close(written, probs, rtol=1e-5, atol=1e-6)

    # an ID only the bank holds (no student) and one nobody holds get a reason; the others their answers
    only = dm.business_ids(dm.active_only_set("test").ids[:1])
    (tmp_path / "bad.txt").write_text(f"{wanted[0]}\nNOBODY-1\n{only[0]}\n")
    main(["predict", *args(fitted, f"--output={tmp_path / 'bad.csv'}", f"--ids={tmp_path / 'bad.txt'}")])
    assert [(r["id"], r["path"], r["reason"]) for r in read(tmp_path / "bad.csv")] == [
        (wanted[0], "vfl", ""),
        ("NOBODY-1", "", UNKNOWN_ID),
        (only[0], "", NO_STUDENT),
    ]
    assert "3 rows written" in capsys.readouterr().out


def test_without_business_ids_the_ids_are_sample_ids() -> None:
    from lvfl.datamodules import Digits

    dm = Digits(num_parties=2)
    ids = dm.test_set.ids[:3].tolist()
    assert dm.sample_ids_for([str(i) for i in ids]) == ids
    assert torch.equal(dm.vfl_rows(ids[::-1]).ids, torch.tensor(ids[::-1]))
    with pytest.raises(KeyError, match=r"IDs \['x7', '99999'\] name no sample of Digits"):
        dm.sample_ids_for(["x7", "99999", "1"])


@pytest.fixture(scope="module")
def with_student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example fitted for 2 epochs with StudentDistillation (which saves student.pt beside the checkpoints)."""
    out = tmp_path_factory.mktemp("student")
    student = '[{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 5}}]'
    cwd = Path.cwd()
    try:
        os.chdir(REPO)
        main(["fit", *args(out)[:-2], "--trainer.max_epochs=2", f"--trainer.callbacks={student}"])
    finally:
        os.chdir(cwd)
    return out


@pytest.mark.slow
def test_ids_only_the_active_party_holds_are_answered_by_the_saved_student(with_student, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    saved = checkpoints_of(with_student / "bank_retailer") / "student.pt"
    assert saved.is_file()
    dm = build_cli([*args(with_student)[:-2]], run=False).datamodule
    only = dm.business_ids(dm.active_only_set("test").ids[:2])
    shared = dm.business_ids(dm.test_set.ids[:1])
    wanted = [only[0], shared[0], only[1]]
    (tmp_path / "ids.txt").write_text("\n".join(wanted) + "\n")
    main(["predict", *args(with_student, f"--output={tmp_path / 'p.csv'}", f"--ids={tmp_path / 'ids.txt'}")])
    rows = read(tmp_path / "p.csv")
    assert [(r["id"], r["path"]) for r in rows] == [(only[0], "student"), (shared[0], "vfl"), (only[1], "student")]
    student = load_student(saved.parent)
    x = dm.active_rows(dm.sample_ids_for([only[0], only[1]])).features["party0"]
    with torch.no_grad():
        expected = student.eval()(x).softmax(-1)
    written = torch.tensor([[float(r["prob_default"]), float(r["prob_ok"])] for r in (rows[0], rows[2])])
    torch.testing.assert_close(written, expected, rtol=1e-5, atol=1e-6)

    # every ID the student's: no VFL batch runs, the file is still written
    (tmp_path / "only.txt").write_text(only[1] + "\n")
    main(["predict", *args(with_student, f"--output={tmp_path / 'o.csv'}", f"--ids={tmp_path / 'only.txt'}")])
    assert [(r["id"], r["path"]) for r in read(tmp_path / "o.csv")] == [(only[1], "student")]


@pytest.mark.slow
def test_oblivious_predict_rebuilds_the_router_from_the_run_and_answers_like_the_plain_path(
    with_student, tmp_path, monkeypatch, capsys
):
    """`--oblivious`: in a new CLI run, the Router is rebuilt from the checkpoint (the passive tables) and student.pt;
    it answers every requested ID with the same path and probabilities as the plain `lvfl predict`, its lookups on
    the wire under the oblivious-transfer tags; without a student an active-only ID is refused by name."""
    monkeypatch.chdir(REPO)
    dm = build_cli([*args(with_student)[:-2]], run=False).datamodule
    only = dm.business_ids(dm.active_only_set("test").ids[:2])
    shared = dm.business_ids(dm.test_set.ids[:3])
    wanted = [shared[0], only[0], shared[1], only[1], shared[2]]
    (tmp_path / "ids.txt").write_text("\n".join(wanted) + "\n")
    ids = f"--ids={tmp_path / 'ids.txt'}"
    main(["predict", *args(with_student, f"--output={tmp_path / 'plain.csv'}", ids)])
    capsys.readouterr()
    main(["predict", *args(with_student, f"--output={tmp_path / 'ot.csv'}", ids, "--oblivious=true")])
    said = capsys.readouterr().out
    plain, routed = read(tmp_path / "plain.csv"), read(tmp_path / "ot.csv")
    assert [(r["id"], r["path"]) for r in routed] == [(r["id"], r["path"]) for r in plain]
    assert [r["path"] for r in routed] == ["vfl", "student", "vfl", "student", "vfl"]
    for a, b in zip(plain, routed, strict=True):
        assert a["prediction"] == b["prediction"]
        assert float(a["prob_ok"]) == pytest.approx(float(b["prob_ok"]), abs=1e-5)
    assert "5 IDs through oblivious lookups" in said
    assert all(tag in said for tag in ("ot_prepare", "ot_query", "ot_answer"))

    # without a student, an ID only the active party holds gets a reason, as on the plain path
    (tmp_path / "no_student").mkdir()
    bare = tmp_path / "no_student" / "last.ckpt"
    bare.write_bytes((checkpoints_of(with_student / "bank_retailer") / "last.ckpt").read_bytes())
    for name, extra in (("bare_ot.csv", ["--oblivious=true"]), ("bare_plain.csv", [])):
        out = f"--output={tmp_path / name}"
        main(["predict", *args(with_student)[:-2], "--ckpt_path", str(bare), ids, out, *extra])
    bare_ot, bare_plain = read(tmp_path / "bare_ot.csv"), read(tmp_path / "bare_plain.csv")
    assert [(r["path"], r["reason"]) for r in bare_ot] == [(r["path"], r["reason"]) for r in bare_plain]
    assert [r["reason"] for r in bare_ot] == ["", NO_STUDENT, "", NO_STUDENT, ""]
    with pytest.raises(SystemExit):
        main(["test", *args(with_student, "--oblivious=true")])
    assert "--oblivious is an option of lvfl predict" in capsys.readouterr().err


def copy_rows(source: Path, target: Path, keys: list[str], id_column: int = 0) -> list[str]:
    """`target`: the rows of `source` with these IDs, each under a new ID `NEW-<old>`, no label column kept."""
    with source.open(newline="") as f:
        header, *rows = list(csv.reader(f))
    by_key = {r[id_column]: r for r in rows}
    keep = [j for j, name in enumerate(header) if name != "status"]
    with target.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([header[j] for j in keep])
        for key in keys:
            row = list(by_key[key])
            row[id_column] = f"NEW-{key}"
            writer.writerow([row[j] for j in keep])
    return [f"NEW-{k}" for k in keys]


def new_rows_config(tmp_path: Path, bank: Path, retailer: Path) -> str:
    path = tmp_path / "new_rows.yaml"
    path.write_text(
        "data:\n  init_args:\n    new_rows:\n"
        f"      - {{path: {bank}, id_column: customer_id, missing: mean}}\n"
        f"      - {{path: {retailer}, id_column: client}}\n"
    )
    return str(path)


@pytest.mark.slow
def test_new_rows_are_aligned_encoded_and_answered_like_the_rows_they_copy(with_student, tmp_path, monkeypatch):
    """New rows that copy known customers under new IDs get those customers' predictions: the same encoders and
    scaling reach them, the VFL model answers the shared ones and the student the bank's own."""
    monkeypatch.chdir(REPO)
    dm = build_cli([*args(with_student)[:-2]], run=False).datamodule
    shared = dm.business_ids(dm.test_set.ids[:3])
    only = dm.business_ids(dm.active_only_set("test").ids[:2])
    bank = tmp_path / "new_bank.csv"
    new_bank = copy_rows(REPO / "examples/bank_retailer/bank.csv", bank, [shared[0], only[0], shared[1], only[1]])
    copy_rows(REPO / "examples/bank_retailer/retailer.csv", tmp_path / "new_retail.csv", [shared[1], shared[0]])
    (tmp_path / "old.txt").write_text("\n".join([shared[0], only[0], shared[1], only[1]]) + "\n")
    main(["predict", *args(with_student, f"--output={tmp_path / 'old.csv'}", f"--ids={tmp_path / 'old.txt'}")])
    extra = new_rows_config(tmp_path, bank, tmp_path / "new_retail.csv")
    main(["predict", *args(with_student, "--config", extra, f"--output={tmp_path / 'new.csv'}")])
    old, new = read(tmp_path / "old.csv"), read(tmp_path / "new.csv")
    assert [r["id"] for r in new] == new_bank
    assert [r["path"] for r in new] == ["vfl", "student", "vfl", "student"] == [r["path"] for r in old]
    for a, b in zip(old, new, strict=True):
        assert float(a["prob_ok"]) == pytest.approx(float(b["prob_ok"]), abs=1e-6), (a["id"], b["id"])


@pytest.mark.slow
def test_new_rows_only_the_bank_holds_get_a_reason_without_a_student(fitted, tmp_path, monkeypatch, capsys):
    """One new customer only the bank holds no longer fails the whole batch (leaving it out would need the bank to
    learn the retailer's IDs): it is written with an empty prediction and the reason, the others answered."""
    monkeypatch.chdir(REPO)
    dm = build_cli([*args(fitted)[:-2]], run=False).datamodule
    only = dm.business_ids(dm.active_only_set("test").ids[:1])
    shared = dm.business_ids(dm.test_set.ids[:1])
    bank = tmp_path / "b.csv"
    new_shared, new_only = copy_rows(REPO / "examples/bank_retailer/bank.csv", bank, [shared[0], only[0]])
    copy_rows(REPO / "examples/bank_retailer/retailer.csv", tmp_path / "r.csv", shared)
    config = new_rows_config(tmp_path, bank, tmp_path / "r.csv")
    main(["predict", *args(fitted, "--config", config, f"--output={tmp_path / 'n.csv'}")])
    rows = read(tmp_path / "n.csv")
    assert [(r["id"], r["path"], r["reason"]) for r in rows] == [(new_shared, "vfl", ""), (new_only, "", NO_STUDENT)]
    assert "1 by the VFL model, 0 by the student, 1 unanswered" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("student", [True, False], ids=["student", "no_student"])
def test_plain_and_oblivious_files_are_the_same_rows_on_the_default_split(
    student, with_student, tmp_path, monkeypatch, capsys
):
    """The acceptance check: on the example's test split, plain `lvfl predict` and `--oblivious=true` write the same
    rows (the shared customers by the VFL model, the bank's own by the student, or with the reason without one), the
    same predictions and probabilities; the console counts each path."""
    monkeypatch.chdir(REPO)
    ckpt = checkpoints_of(with_student / "bank_retailer") / "last.ckpt"
    if not student:
        (tmp_path / "bare").mkdir()
        (tmp_path / "bare" / "last.ckpt").write_bytes(ckpt.read_bytes())
        ckpt = tmp_path / "bare" / "last.ckpt"
    base = [*args(with_student)[:-2], "--ckpt_path", str(ckpt)]
    main(["predict", *base, f"--output={tmp_path / 'plain.csv'}"])
    plain_said = capsys.readouterr().out
    main(["predict", *base, f"--output={tmp_path / 'ot.csv'}", "--oblivious=true"])
    ot_said = capsys.readouterr().out
    plain, routed = read(tmp_path / "plain.csv"), read(tmp_path / "ot.csv")
    dm = build_cli([*args(with_student)[:-2]], run=False).datamodule
    assert [r["id"] for r in plain] == [r["id"] for r in routed] == dm.business_ids(dm.active_set("test").ids)
    assert [(r["path"], r["reason"], r["prediction"]) for r in plain] == [
        (r["path"], r["reason"], r["prediction"]) for r in routed
    ]
    shared, own = len(dm.test_set), len(dm.active_only_set("test"))
    counts = f"{shared} by the VFL model, {own if student else 0} by the student, {0 if student else own} unanswered"
    assert counts in plain_said
    assert counts in ot_said
    for a, b in zip(plain, routed, strict=True):
        if a["path"]:
            assert float(a["prob_ok"]) == pytest.approx(float(b["prob_ok"]), abs=1e-5)
