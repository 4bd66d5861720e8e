"""`lvfl export`: each party's folder holds only its own tensors, and the folders predict what lvfl reports.

The reference is lvfl itself: `lvfl predict`'s file and the model's `party_logits` in this process. The exported
folders are served by `examples/serve_exported.py` in a process that cannot import lvfl.
"""

from __future__ import annotations

import csv
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import torch
from helpers import REPO, checkpoints_of, make_trainer, mlp_parties

from lvfl.commands.entry import main as lvfl
from lvfl.commands.fit import build_cli, main
from lvfl.compression import Compressor
from lvfl.datamodules import Digits
from lvfl.export import export_parties, owned_keys
from lvfl.inference.student_file import load_student
from lvfl.models import MLP
from lvfl.privacy import LaplaceLabels, RandomizedResponse
from lvfl.protocols import CVFL, EASTER, AggVFL, Central, Local, PraVFed, SplitNN

CONFIG = "examples/bank_retailer/config.yaml"
SCRIPT = REPO / "examples" / "serve_exported.py"
TABLES = {"party0": "examples/bank_retailer/bank.csv", "party1": "examples/bank_retailer/retailer.csv"}
STUDENT = '[{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 3}}]'
MECHANISM = '{"class_path": "lvfl.privacy.RandomizedResponse", "init_args": {"epsilon": 1.0, "seed": 0}}'
RUNS = {
    "plain": [],
    # the split is then drawn without the true labels (stratify: auto), in fit, predict and export alike
    "label_mechanism": [f"--model.init_args.label_mechanism={MECHANISM}"],
}
#: serve_exported.py run as a script in a process where `import lvfl` fails
WITHOUT_LVFL = (
    "import sys, runpy; sys.modules['lvfl'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


@dataclass
class Run:
    """A fitted bank/retailer run: its log folder, its export, `lvfl predict`'s file and the options it ran with."""

    logs: Path
    out: Path
    predicted: Path
    args: list[str]


def fit_export_predict(name: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The bank/retailer example fitted for 1 epoch with a student, exported, and predicted by `lvfl predict`."""
    logs, out = tmp_path_factory.mktemp(f"fit_{name}"), tmp_path_factory.mktemp(f"export_{name}")
    args = ["--config", CONFIG, f"--trainer.logger.init_args.save_dir={logs}", *RUNS[name]]
    common = [*args, "--trainer.enable_progress_bar=false"]
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        main(["fit", *common, "--trainer.max_epochs=1", f"--trainer.callbacks={STUDENT}"])
        lvfl(["export", *common, "--ckpt_path", "last", "--out", str(out)])
        predicted = logs / "lvfl_predict.csv"
        main(["predict", *common, "--ckpt_path", "last", f"--output={predicted}"])
    finally:
        os.chdir(cwd)
    return Run(logs, out, predicted, args)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return fit_export_predict("plain", tmp_path_factory)


@pytest.fixture(scope="module")
def label_mechanism(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return fit_export_predict("label_mechanism", tmp_path_factory)


def loaded(run: Run):
    """The fitted run rebuilt in this process with the checkpoint's weights, in eval mode."""
    cli = build_cli(run.args, run=False)
    cli.trainer.datamodule = cli.datamodule
    cli.model.trainer = cli.trainer
    cli.model.setup("predict")
    state = torch.load(checkpoints_of(run.logs / "bank_retailer") / "last.ckpt", weights_only=False)["state_dict"]
    cli.model.load_state_dict(state)
    return cli.model.eval(), cli.datamodule, state


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def jit_load(path: Path) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # TorchScript's deprecation notice
        return torch.jit.load(str(path))


def assert_stores_only(path: Path, allowed) -> None:
    """Every array stored in the TorchScript file `path` is one of the `allowed` tensors (or a scalar constant)."""
    own = {t.detach().cpu().contiguous().numpy().tobytes() for t in allowed}
    with zipfile.ZipFile(path) as archive:
        stored = [n for n in archive.namelist() if re.search(r"/\d+$", n)]  # tensor storages: <dir>/<n>
        assert stored, path
        for name in stored:
            data = archive.read(name)
            assert data in own or len(data) <= 8, f"{path.name}: {name} ({len(data)} bytes) is no tensor of its party"


def exported_logits(out: Path, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """The active party's logits from the exported files alone, wired as the active party's party.json says."""
    (active,) = [p.parent for p in out.glob("*/party.json") if json.loads(p.read_text())["role"] == "active"]
    serving = json.loads((active / "party.json").read_text())["serving"]
    with torch.no_grad():
        sent = [jit_load(out / k / "contribution.pt")(features[k]) for k in serving["contribution_order"]]
        return jit_load(active / serving["completion"]["file"])(features[active.name], *sent)


@pytest.mark.slow
def test_each_folder_holds_its_partys_tensors_and_none_of_the_others(plain, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    model, _, state = loaded(plain)
    own = {p: torch.load(plain.out / p / "state_dict.pt") for p in ("party0", "party1")}
    assert set(own["party0"]) | set(own["party1"]) == set(state)  # every tensor goes somewhere ...
    assert not set(own["party0"]) & set(own["party1"])  # ... to one party
    for party, tensors in own.items():
        assert all(k.startswith(f"party_models.{party}.") for k in tensors), party
        for key, value in tensors.items():
            assert torch.equal(value, state[key])
    theirs = [v for k, v in state.items() if k.startswith("party_models.party0.")]
    for value in own["party1"].values():  # not even under another name
        assert not any(v.shape == value.shape and torch.equal(v, value) for v in theirs)
    # the TorchScript files too: every array stored in them is one of the party's own tensors (no other party's,
    # no example rows kept from tracing)
    student = load_student(checkpoints_of(plain.logs / "bank_retailer")).state_dict()
    assert_stores_only(plain.out / "party0" / "completion.pt", own["party0"].values())
    assert_stores_only(plain.out / "party0" / "student.pt", student.values())
    assert_stores_only(plain.out / "party1" / "contribution.pt", own["party1"].values())
    assert {p.name for p in (plain.out / "party1").iterdir()} == {"state_dict.pt", "contribution.pt", "party.json"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_the_exported_completion_is_the_prediction_lvfl_reports(name, request, monkeypatch) -> None:
    """completion(own features, contributions) == party_logits[active] on the test split; with a label mechanism that
    is the private head, whose predictions differ from the release-trained head's that earlier exports served."""
    run = request.getfixturevalue(name)
    monkeypatch.chdir(REPO)
    model, dm, _ = loaded(run)
    test = dm.test_set
    batch = dm.on_after_batch_transfer(test.gather(torch.arange(len(test))), 0)
    with torch.no_grad():
        reported = model.party_logits(batch)["party0"]
        released_head = model.party_models["party0"].head
        local = {k: model.party_models[k].encoder(batch.features[k]) for k in ("party0", "party1")}
        old_path = released_head((local["party0"] + local["party1"]) / 2)
    logits = exported_logits(run.out, batch.features)
    torch.testing.assert_close(logits, reported, rtol=0, atol=1e-6)
    if name == "plain":
        torch.testing.assert_close(old_path, reported, rtol=0, atol=1e-6)  # no private head: the same head
    else:
        assert (old_path.softmax(-1) - reported.softmax(-1)).abs().max() > 1e-3  # another head: other answers


def test_party_json_carries_encoders_scaling_the_combination_and_only_the_actives_labels(plain) -> None:
    bank = json.loads((plain.out / "party0" / "party.json").read_text())
    shop = json.loads((plain.out / "party1" / "party.json").read_text())
    assert bank["role"] == "active"
    assert bank["label_names"] == ["default", "ok"]
    assert "label_names" not in shop
    assert bank["task"] == {"num_classes": 2, "kind": "binary", "target_mean": 0.0, "target_scale": 1.0}
    assert "task" not in shop
    assert "serving" not in shop
    assert [e["name"] for e in bank["encoders"]] == ["income", "age", "segment"]
    assert bank["feature_names"][:2] == ["income", "income missing"]
    assert shop["feature_names"] == ["spend", "visits", "channel=online", "channel=store", "channel=<unseen>"]
    assert len(shop["scaling"]["mean"]) == len(shop["feature_names"])
    assert shop["input_shape"] == [5]
    assert (bank["id_column"], shop["id_column"]) == ("customer_id", "client")
    assert shop["contribution"]["file"] == "contribution.pt"
    assert shop["contribution"]["to"] == "party0"
    assert shop["contribution"]["output_shape"] == [16]  # the example's embedding_dim
    serving = bank["serving"]
    assert serving["protocol"] == "lvfl.protocols.easter.EASTER"
    assert serving["contribution_order"] == ["party1"]
    assert serving["combination"]["num_parties"] == 2
    assert serving["combination"]["head"] == "party_models.party0.head"  # no label mechanism: no private head
    assert serving["output"]["kind"] == "class_logits"
    assert serving["output"]["label_names"] == ["default", "ok"]
    assert serving["student"]["file"] == "student.pt"


def test_with_a_label_mechanism_party_json_names_the_private_head(label_mechanism) -> None:
    serving = json.loads((label_mechanism.out / "party0" / "party.json").read_text())["serving"]
    assert serving["combination"]["head"].startswith("private_head")
    assert "party_models.party0.head, trained on the label release, is not used" in serving["combination"]["head"]


def serve_without_lvfl(run: Run, ids: list[str], output: Path, export: Path | None = None) -> list[dict[str, str]]:
    """`examples/serve_exported.py` on the raw tables, in a process that cannot import lvfl; returns its rows."""
    (output.parent / "ids.txt").write_text("\n".join(ids) + "\n")
    tables = [a for party, path in TABLES.items() for a in ("--table", f"{party}={REPO / path}")]
    command = [sys.executable, "-c", WITHOUT_LVFL, str(SCRIPT), str(export or run.out), *tables]
    command += ["--ids", str(output.parent / "ids.txt"), "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=output.parent, check=False)
    assert done.returncode == 0, done.stderr
    return read(output)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_the_serving_script_without_lvfl_answers_like_lvfl_predict(name, request, tmp_path, monkeypatch) -> None:
    """The same IDs, paths and predictions as `lvfl predict`, probabilities within 1e-5; the IDs only the bank holds
    are answered by the exported student exactly as the saved student answers in this process."""
    run = request.getfixturevalue(name)
    monkeypatch.chdir(REPO)
    _, dm, _ = loaded(run)
    predicted = read(run.predicted)
    only = dm.business_ids(dm.active_only_set("test").ids)
    vfl = [r["id"] for r in predicted if r["path"] == "vfl"]
    assert len(vfl) == len(dm.test_set)
    assert only
    wanted = [k for pair in zip(vfl, only, strict=False) for k in pair] + vfl[len(only) :] + only[len(vfl) :]
    served = serve_without_lvfl(run, wanted, tmp_path / "served.csv")
    assert [r["id"] for r in served] == wanted
    assert list(served[0]) == list(predicted[0])  # lvfl predict's columns
    assert list(served[0])[:5] == ["id", "prediction", "prob_default", "prob_ok", "path"]
    by_id = {r["id"]: r for r in served}
    for row in predicted:  # lvfl predict's rows (the VFL model's; the student's too where it writes them)
        mine = by_id[row["id"]]
        assert (mine["path"], mine["prediction"], mine["reason"]) == (row["path"], row["prediction"], ""), row["id"]
        for label in ("default", "ok"):
            assert float(mine[f"prob_{label}"]) == pytest.approx(float(row[f"prob_{label}"]), abs=1e-5)
    student = load_student(checkpoints_of(run.logs / "bank_retailer"))
    x = dm.active_rows(dm.sample_ids_for(only)).features["party0"]
    with torch.no_grad():
        expected = student.eval()(x).softmax(-1)
    rows = [by_id[k] for k in only]
    assert {r["path"] for r in rows} == {"student"}
    written = torch.tensor([[float(r["prob_default"]), float(r["prob_ok"])] for r in rows])
    torch.testing.assert_close(written, expected, rtol=0, atol=1e-5)
    assert [r["prediction"] for r in rows] == [["default", "ok"][int(c)] for c in expected.argmax(1)]


@pytest.mark.slow
def test_without_a_student_the_ids_only_the_active_party_holds_get_a_reason(plain, tmp_path, monkeypatch) -> None:
    """A checkpoint with no student beside it (as `lvfl predict` looks for one) exports none; the serving script
    then writes the IDs only the active party holds with an empty prediction and a reason."""
    monkeypatch.chdir(REPO)
    (tmp_path / "elsewhere").mkdir()
    bare = tmp_path / "elsewhere" / "last.ckpt"
    shutil.copyfile(checkpoints_of(plain.logs / "bank_retailer") / "last.ckpt", bare)
    out = tmp_path / "export"
    lvfl(["export", *plain.args, "--trainer.enable_progress_bar=false", "--ckpt_path", str(bare), "--out", str(out)])
    _, dm, _ = loaded(plain)
    assert not (out / "party0" / "student.pt").exists()
    assert json.loads((out / "party0" / "party.json").read_text())["serving"]["student"] is None
    only = dm.business_ids(dm.active_only_set("test").ids[:2])
    shared = dm.business_ids(dm.test_set.ids[:1])
    serve = runpy.run_path(str(SCRIPT))["serve"]
    rows = serve(out, {p: REPO / path for p, path in TABLES.items()}, [only[0], shared[0], "NOBODY-1", only[1]])
    assert [(r["id"], r["path"]) for r in rows] == [(only[0], ""), (shared[0], "vfl"), ("NOBODY-1", ""), (only[1], "")]
    assert rows[0]["prediction"] == rows[0]["prob_ok"] == ""
    assert "held by the active party only" in rows[0]["reason"]
    assert rows[1]["reason"] == ""
    assert rows[2]["reason"] == "not an ID of the active party"
    assert rows[1]["prediction"] in ("default", "ok")


# ---------------------------------------------------------------------------------------------------- every protocol
RR = partial(RandomizedResponse, epsilon=1.0, seed=0)
PROTOCOLS = {
    "EASTER": lambda: EASTER(parties=mlp_parties(4), embedding_dim=8),
    "EASTER-label_mechanism": lambda: EASTER(parties=mlp_parties(4), embedding_dim=8, label_mechanism=RR()),
    "SplitNN-concat": lambda: SplitNN(parties=mlp_parties(4), top_model=partial(MLP, hidden=[8]), embedding_dim=8),
    "SplitNN-concat-label_mechanism": lambda: SplitNN(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[8]), embedding_dim=8, label_mechanism=RR()
    ),
    "SplitNN-sum": lambda: SplitNN(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[8]), embedding_dim=8, fusion="sum"
    ),
    "AggVFL-weighted": lambda: AggVFL(parties=mlp_parties(4), embedding_dim=8, aggregate="weighted"),
    "AggVFL-weighted-label_mechanism": lambda: AggVFL(
        parties=mlp_parties(4), embedding_dim=8, aggregate="weighted", label_mechanism=RR()
    ),
    "CVFL": lambda: CVFL(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[8]), embedding_dim=8, compressor=Compressor(bits=8)
    ),
    "PraVFed": lambda: PraVFed(
        parties=mlp_parties(4), embedding_dim=8, label_mechanism=LaplaceLabels(epsilon=1.0, seed=0), local_epochs=1
    ),
    "Local": lambda: Local(parties=mlp_parties(4), embedding_dim=8),
}


def fitted(protocol, tmp_path: Path):
    """`protocol` fitted for 3 steps on digits (4 parties); returns it in eval mode with its datamodule."""
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64)
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0)
    trainer.fit(protocol, datamodule=dm)
    return protocol.eval(), dm


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_protocols_exported_completion_equals_its_party_logits(name, tmp_path) -> None:
    model, dm = fitted(PROTOCOLS[name](), tmp_path)
    folders = export_parties(model, dm, {}, tmp_path / "export")
    assert set(folders) == set(model.party_names)
    test = dm.test_set
    batch = dm.on_after_batch_transfer(test.gather(torch.arange(len(test))), 0)
    with torch.no_grad():
        reported = model.party_logits(batch)["aggregate" if isinstance(model, AggVFL) else model.active]
    logits = exported_logits(tmp_path / "export", batch.features)
    torch.testing.assert_close(logits, reported, rtol=0, atol=1e-6)
    assert torch.equal(logits.argmax(-1), reported.argmax(-1))
    serving = json.loads((folders[model.active] / "party.json").read_text())["serving"]
    assert serving["contribution_order"] == model.passive
    assert serving["combination"]["combine"]  # every protocol says how it combines
    keys = owned_keys(model)  # each file stores only its party's tensors
    state = model.state_dict()
    for party, folder in folders.items():
        file = "completion.pt" if party == model.active else "contribution.pt"
        assert_stores_only(folder / file, [state[k] for k in keys[party]])


@pytest.mark.parametrize("name", ["AggVFL-weighted", "PraVFed"])
def test_the_weights_party_json_states_are_the_ones_the_export_applies(name, tmp_path) -> None:
    """A reader without lvfl recomputes the combination from party.json's numbers and the parties' own models."""
    model, dm = fitted(PROTOCOLS[name](), tmp_path)
    folders = export_parties(model, dm, {}, tmp_path / "export")
    combination = json.loads((folders[model.active] / "party.json").read_text())["serving"]["combination"]
    weights = combination["weights"]
    x = dm.on_after_batch_transfer(dm.test_set.gather(torch.arange(32)), 0).features
    with torch.no_grad():
        sent = {k: jit_load(folders[k] / "contribution.pt")(x[k]) for k in model.passive}
        if isinstance(model, AggVFL):  # logits = sum_j w_j L_j
            assert sorted(weights) == model.party_names
            assert len(set(weights.values())) > 1
            own = model.party_models[model.active](x[model.active])
            expected = weights[model.active] * own + sum(weights[k] * sent[k] for k in model.passive)
            got = jit_load(folders[model.active] / "completion.pt")(x[model.active], *sent.values())
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        else:  # each contribution is w_k E_k
            assert sorted(weights) == model.passive
            for k in model.passive:
                torch.testing.assert_close(sent[k], weights[k] * model.party_models[k].encoder(x[k]))


def test_a_protocol_without_a_split_prediction_or_one_that_does_not_trace_is_refused_by_name(tmp_path) -> None:
    dm = Digits(num_parties=4, batch_size=64)
    central = Central(parties=mlp_parties(4), embedding_dim=8)
    central.build(dm.party_specs, dm.task)
    with pytest.raises(TypeError, match="Central does not support split .* no combination to export"):
        export_parties(central, dm, {}, tmp_path / "central")
    assert not (tmp_path / "central").exists()  # refused before anything is written
    topk = CVFL(parties=mlp_parties(4), top_model=MLP, embedding_dim=8, compressor=Compressor(topk=0.5))
    topk.build(dm.party_specs, dm.task)
    with pytest.raises(ValueError, match=r"contribution \(CVFL.passive_contribution\) does not trace"):
        export_parties(topk, dm, {}, tmp_path / "cvfl")


def test_a_completion_that_reads_another_partys_tensor_is_refused(tmp_path) -> None:
    class Leaky(EASTER):
        def complete_prediction(self, active_features, contributions):
            spy = next(self.party_models["party1"].parameters()).sum()  # party1's weights at the active party
            return super().complete_prediction(active_features, contributions) + spy

    dm = Digits(num_parties=4, batch_size=64)
    leaky = Leaky(parties=mlp_parties(4), embedding_dim=8)
    leaky.build(dm.party_specs, dm.task)
    with pytest.raises(ValueError, match="party0's completion .* reads a parameter its party does not own"):
        export_parties(leaky, dm, {}, tmp_path / "leaky")


@pytest.mark.slow
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
def test_the_active_party_owns_the_top_model_and_aggregation_weights(
    config, extra, active_extra, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(REPO)
    cli = build_cli(["--config", config, f"--trainer.logger.init_args.save_dir={tmp_path}", *extra], run=False)
    cli.trainer.datamodule = cli.datamodule
    cli.model.trainer = cli.trainer
    cli.model.setup("fit")
    keys = owned_keys(cli.model)
    assert sorted(k for ks in keys.values() for k in ks) == sorted(cli.model.state_dict())
    assert any(k.startswith(active_extra) for k in keys["party0"])
    assert not any(k.startswith(active_extra) for p in ("party1", "party2", "party3") for k in keys[p])
