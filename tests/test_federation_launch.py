"""Every party its own process (`lvfl launch`, `lvfl party`, `lvfl pki`): the same config as `lvfl fit` ends
bit-identical, party by party, with the same ledger tag by tag; each process holds only its own party's data; a
party that dies stops the others with one line naming it, and a restart from `--ckpt_path last` resumes to the
uninterrupted run's end; a peer of another run is refused."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from federation_parity import assert_parity, checkpoint, ledger
from helpers import REPO, lvfl

from lvfl.federation.federation_file import write_federation
from lvfl.federation.pki import write_test_pki

pytestmark = pytest.mark.slow  # several Python processes per test

SHORT = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2"]
CONFIGS = {
    "EASTER DHMasking, 4 parties": ["--config", "configs/easter/digits.yaml"],
    # with randomized response (the release stays at the active party; its generator pinned as PraVFed's below)
    "SplitNN DHMasking sum, randomized response": [
        "--config", "configs/splitnn/digits_dh_sum.yaml",
        '--model.init_args.label_mechanism={"class_path": "lvfl.privacy.RandomizedResponse", '
        '"init_args": {"epsilon": 1.0, "seed": 5}}',
    ],
    "Agg_VFL DHMasking": ["--config", "configs/aggvfl/digits_heter_dh.yaml"],
    # the label release is a secret draw: both runs pin the mechanism's own generator (its test-only seed, never the
    # config's seed_everything) so that they draw the same release
    "PraVFed LaplaceLabels DHMasking": [
        "--config", "configs/pravfed/digits.yaml", "--model.init_args.local_epochs=1",
        "--model.init_args.label_mechanism.init_args.seed=5",
    ],
}  # fmt: skip


def party_cmd(name: str, federation: Path, run_id: str, save_dir: Path, *fit: str, timeout: float = 20) -> list[str]:
    """The `lvfl party` command line of party `name`."""
    return [
        sys.executable, "-m", "lvfl", "party", "--party", name, "--federation", str(federation), "--run_id", run_id,
        "--timeout", f"{timeout:g}", *fit, f"--trainer.logger.init_args.save_dir={save_dir / name}",
        "--trainer.enable_progress_bar=false",
    ]  # fmt: skip


#: EASTER with Paillier, encrypting in-process (4 parties and the coordinator: 5 processes are enough)
PAILLIER = [
    "--config", "configs/easter/breast_cancer_paillier.yaml", "--model.init_args.aggregation.init_args.workers=1"
]  # fmt: skip


def fit_and_launch(tmp_path: Path, config: list[str]) -> tuple[Path, subprocess.CompletedProcess]:
    """`lvfl fit` into tmp_path/fit, then `lvfl launch` into tmp_path/launch with each process's `StateProbe`."""
    fit = lvfl("fit", *config, *SHORT, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}")
    assert fit.returncode == 0, fit.stderr[-3000:]
    probes = tmp_path / "probes"
    probes.mkdir()
    seeded = ["--allow_public_seeds"] if any("seed" in arg for arg in config) else []  # a parity test's release
    launch = lvfl(
        "launch", "--pki", str(tmp_path / "pki"), "--timeout", "30", *seeded, *config, *SHORT,
        f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}",
        '--trainer.callbacks+={"class_path": "federation_probe.StateProbe"}',
        env={"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "LVFL_PROBE_DIR": str(probes)},
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-2000:] + launch.stderr[-3000:]
    return probes, launch


@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_launch_ends_bit_identical_to_fit(tmp_path, config):
    probes, launch = fit_and_launch(tmp_path, config)
    names = [f"party{k}" for k in range(4)]
    parties = {k: tmp_path / "launch" / k for k in names}
    assert_parity(tmp_path / "fit", parties)
    assert_parity(tmp_path / "fit", parties, which="best")  # every party kept the epoch the active party chose
    if config == CONFIGS["EASTER DHMasking, 4 parties"]:  # each party exports its own folder from its own checkpoint
        assert_exports_equal(tmp_path, config, names)
    if config == CONFIGS["SplitNN DHMasking sum, randomized response"]:  # the parties test their best checkpoints
        assert_tests_equal(tmp_path, config)
    assert "== communication during fit" in launch.stdout + launch.stderr  # the active party's console
    for name in names:  # isolation: what each process held at the end of its fit
        state = json.loads((probes / f"{name}.json").read_text())
        assert state["tensors"], name
        others = [t for t in state["tensors"] if not t.startswith(f"party_models.{name}.")]
        assert others == [] or name == "party0", others  # the active party also owns e.g. a top model
        assert not any(t.startswith("party_models.") for t in others), others
        for split, held in state["splits"].items():
            assert held["features"] == [name], (name, split)
            assert held["labels"] == (name == "party0"), (name, split)
        assert state["scaling"] in ([], [name])
        assert state["key_peers"] == ([] if name == "party0" else [name])


def test_the_bank_and_the_retailer_launched_with_ecdh_end_bit_identical_to_fit(tmp_path):
    """`psi: ecdh` across processes (the other launches run the default, KKRT16's PSI): each party's own process
    runs its part of ECDH-PSI on its own table and the launch ends with `lvfl fit`'s parameters."""
    config = ["--config", "examples/bank_retailer/config.yaml", "--data.init_args.psi=ecdh"]
    _, launch = fit_and_launch(tmp_path, config)
    assert_parity(tmp_path / "fit", {k: tmp_path / "launch" / k for k in ("party0", "party1")})
    console = launch.stdout + launch.stderr  # the active party's lines
    assert "party0: PSI, hashing and blinding its IDs" in console
    assert "party0: PSI, the OT extension" not in console  # not KKRT16's


def assert_exports_equal(tmp_path: Path, config: list[str], names: list[str]) -> None:
    """`lvfl export` of the fit, and `lvfl export --party P` of each party's own checkpoint of the launch, give equal
    tensors: the same state dicts, and traced files that compute the same outputs on the same inputs."""
    out = tmp_path / "exports"
    done = lvfl("export", *config, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}", "--ckpt_path", "best",
                "--out", str(out / "fit"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in names:
        done = lvfl("export", *config, f"--trainer.logger.init_args.save_dir={tmp_path / 'launch' / name}",
                    "--ckpt_path", "best", "--out", str(out / "launch"), "--party", name)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    generator = torch.Generator().manual_seed(0)
    for name in names:
        fit, launched = out / "fit" / name, out / "launch" / name
        a, b = (torch.load(d / "state_dict.pt", weights_only=True) for d in (fit, launched))
        assert a.keys() == b.keys(), name
        assert all(torch.equal(a[k], b[k]) for k in a), name
        info = json.loads((fit / "party.json").read_text())
        x = torch.randn(5, *info["input_shape"], generator=generator)
        if "serving" in info:  # the active party's completion, on the same stand-in contributions
            serving = info["serving"]
            shapes = [serving["contributions"][k]["output_shape"] for k in serving["contribution_order"]]
            inputs = (x, *(torch.randn(5, *s, generator=generator) for s in shapes))
            file = "completion.pt"
        else:
            inputs, file = (x,), "contribution.pt"
        outputs = [torch.jit.load(str(d / file))(*inputs) for d in (fit, launched)]
        assert torch.equal(*outputs), name
    other = lvfl("export", *config, f"--trainer.logger.init_args.save_dir={tmp_path / 'launch' / 'party1'}",
                 "--ckpt_path", "best", "--out", str(out / "wrong"), "--party", "party2")  # fmt: skip
    assert other.returncode == 2
    assert "does not hold party2's tensors" in other.stderr


def assert_tests_equal(tmp_path: Path, config: list[str]) -> None:
    """`lvfl launch test --ckpt_path best` on the parties' own checkpoints logs `lvfl test`'s metrics, to the bit.

    Compared in the active party's `metrics.csv` (the CSV logger's exact values), not in the printed table, whose
    rounding and layout are the console's.
    """
    tested = {}
    for name, command in {"fit": ["test"], "launch": ["launch", "test"]}.items():
        done = lvfl(*command, *config, *SHORT, "--trainer.limit_test_batches=3", "--ckpt_path", "best",
                    f"--trainer.logger.init_args.save_dir={tmp_path / name}")  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        tested[name] = logged_tests(tmp_path / name / ("party0" if name == "launch" else ""))
    assert tested["fit"], tested
    assert tested["launch"] == tested["fit"]


def logged_tests(root: Path) -> dict[str, str]:
    """The `test/` metrics of the one run under `root` whose `metrics.csv` holds any, as the CSV logger wrote them."""
    found = []
    for path in sorted(root.rglob("metrics.csv")):
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        values = {key: row[key] for row in rows for key in row if key.startswith("test/") and row[key] != ""}
        if values:
            found.append(values)
    assert len(found) == 1, f"{len(found)} runs under {root} logged test metrics"
    return found[0]


def test_paillier_resumes_with_a_new_key_pair_to_the_uninterrupted_end(tmp_path):
    """A restart generates a fresh key pair at the coordinator (the secret key is never checkpointed); a decrypted
    Paillier sum is exact whatever the key, so every party resumes from its own last checkpoint to the fit's end."""
    config = [*PAILLIER, *SHORT]
    fit = lvfl("fit", *config, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}")
    assert fit.returncode == 0, fit.stderr[-3000:]
    save_dir = f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}"
    first = lvfl("launch", "--pki", str(tmp_path / "pki"), *config, "--trainer.max_epochs=1", save_dir)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    resumed = lvfl("launch", "--pki", str(tmp_path / "pki2"), *config, save_dir, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    everyone = {name: tmp_path / "launch" / name for name in [*(f"party{k}" for k in range(4)), "coordinator"]}
    assert_parity(tmp_path / "fit", everyone, resumed=True, holds_none={"coordinator"})
    for name, folder in everyone.items():  # the launch says where each party wrote; a log keeps the earlier launch's
        (newest,) = [p for p in folder.glob("*/version_*") if p.name == "version_1"]  # the resumed run's folder
        log = tmp_path / "launch" / f"{name}.log"
        (said,) = [line for line in resumed.stdout.splitlines() if line.startswith(f"lvfl launch: {name}: ")]
        assert said == f"lvfl launch: {name}: {newest}" + ("" if name == "party0" else f", log {log}")
        if name != "party0":  # the active party's output is the console's
            assert log.read_text().count("== lvfl launch fit, run launch-") == 2, name


STUDENT = (
    '--trainer.callbacks+={"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 3, '
    '"model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [8]}}}}'
)
PROBE = '--trainer.callbacks+={"class_path": "federation_probe.StateProbe"}'


def test_paillier_runs_with_its_coordinator_as_a_process_of_its_own(tmp_path):
    """EASTER with Paillier: the coordinator is a fifth process that generates the key pair and decrypts the masked
    sums, holding no party's tensor, features or labels; the parties end bit-identical to the fit (a decrypted
    Paillier sum is exact) and the ledgers agree, the coordinator's messages included."""
    config = PAILLIER
    probes, launch = fit_and_launch(tmp_path, config)
    assert "5 parties (party0, party1, party2, party3, coordinator)" in launch.stdout
    parties = {f"party{k}": tmp_path / "launch" / f"party{k}" for k in range(4)}
    coordinator = checkpoint(tmp_path / "launch" / "coordinator")
    fit_state = checkpoint(tmp_path / "fit")
    assert (coordinator["epoch"], coordinator["global_step"]) == (fit_state["epoch"], fit_state["global_step"])
    assert all(t.device.type == "meta" for t in coordinator["state_dict"].values())  # no party's tensor
    everyone = {**parties, "coordinator": tmp_path / "launch" / "coordinator"}
    assert_parity(tmp_path / "fit", everyone, holds_none={"coordinator"})
    assert not list(
        (tmp_path / "launch" / "coordinator").glob("*/version_*/checkpoints/best.ckpt")
    )  # it keeps last only
    best = checkpoint(tmp_path / "fit", "best")
    for name, directory in parties.items():  # every party kept the epoch the active party chose
        state = checkpoint(directory, "best")
        held = {k: t for k, t in state["state_dict"].items() if t.device.type != "meta"}
        assert held, name
        assert all(torch.equal(t, best["state_dict"][k]) for k, t in held.items()), name
    held = json.loads((probes / "coordinator.json").read_text())
    assert held["tensors"] == []
    assert held["scaling"] == []
    assert all(split["features"] == [] and not split["labels"] for split in held["splits"].values())
    sent = {(s, d, t) for s, d, t, _ in held["ledger"] if s == "coordinator"}
    assert {t for _, _, t in sent} == {"keys", "he_decrypted"}
    received = {(s, t) for s, d, t, _ in held["ledger"] if d == "coordinator"}
    assert received == {("party0", "he_aggregate")}  # its whole view, after the greeting: the masked aggregates
    assert_tests_equal(tmp_path, config)  # the coordinator tests from its last checkpoint (it keeps no best)


#: the bank/retailer example (each party's own table, aligned by PSI) under Paillier, encrypting in-process
PAILLIER_TABLES = [
    "--config", "examples/bank_retailer/config.yaml",
    '--model.init_args.aggregation={"class_path": "lvfl.privacy.Paillier", "init_args": {"workers": 1}}',
    "--trainer.enable_progress_bar=false",
]  # fmt: skip


def test_paillier_runs_on_the_parties_own_tables_its_coordinator_told_the_counts_only(tmp_path):
    """Paillier with PartyTables: the coordinator's process holds no table and takes no part in the PSI; the bank
    tells it the number of its samples and of the shared ones, the split, the task and the input columns, and it
    loops with the parties. Every party ends bit-identical to the fit, the ledgers agree (the coordinator's set-up
    messages included), and the coordinator's whole view is those set-up messages and the masked aggregates."""
    probes, launch = fit_and_launch(tmp_path, PAILLIER_TABLES)
    assert "3 parties (party0, party1, coordinator)" in launch.stdout
    everyone = {name: tmp_path / "launch" / name for name in ("party0", "party1", "coordinator")}
    assert_parity(tmp_path / "fit", everyone, holds_none={"coordinator"})
    held = json.loads((probes / "coordinator.json").read_text())
    assert held["tensors"] == []
    assert held["tables"] == []
    assert all(split["features"] == [] and not split["labels"] for split in held["splits"].values())
    received = {(s, t) for s, d, t, _ in held["ledger"] if d == "coordinator"}
    assert received == {("party0", tag) for tag in ("rows", "split", "task", "inputs", "he_aggregate")}
    sizes = {t: n for s, d, t, n in held["ledger"] if d == "coordinator" and t in ("rows", "task")}
    assert sizes == {"rows": 16, "task": 8}  # two counts; the number of classes
    # new customers in each organisation's own file: the coordinator is told how many every party holds
    tables = {name: REPO / "examples" / "bank_retailer" / f"{name}.csv" for name in ("bank", "retailer")}
    read = {name: [line.split(",") for line in path.read_text().splitlines()] for name, path in tables.items()}
    shared = sorted({r[0] for r in read["bank"][1:]} & {r[0] for r in read["retailer"][1:]})[:6]
    for name, rows in read.items():
        header, by_id = rows[0], {r[0]: r for r in rows[1:]}
        keys = shared + [k for k in sorted(by_id) if k not in shared][:2]  # 6 both hold, 2 of its own
        columns = [j for j, column in enumerate(header) if column != "status"]
        lines = [",".join(header[j] for j in columns)]
        lines += [",".join(f"NEW-{k}" if j == 0 else by_id[k][j] for j in columns) for k in keys]
        (tmp_path / f"new_{name}.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "new_rows.yaml").write_text(
        "data:\n  init_args:\n    new_rows:\n"
        f"      - {{path: {tmp_path / 'new_bank.csv'}, id_column: customer_id, missing: mean}}\n"
        f"      - {{path: {tmp_path / 'new_retailer.csv'}, id_column: client}}\n"
    )
    new = [*PAILLIER_TABLES, "--config", str(tmp_path / "new_rows.yaml"), "--ckpt_path", "last"]
    predicted = lvfl("predict", *new, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}", "--output",
                     str(tmp_path / "fit.csv"))  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    launched = lvfl("launch", "predict", "--pki", str(tmp_path / "pki"), "--timeout", "60", *new,
                    f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}", "--output",
                    str(tmp_path / "launch.csv"))  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    written = (tmp_path / "fit.csv").read_text()
    assert written.count(",vfl,") == 6, written
    assert (tmp_path / "launch.csv").read_text() == written


def test_ckks_runs_with_its_coordinator_as_a_process_of_its_own(tmp_path):
    """CKKS on the bank/retailer tables: the coordinator process generates the TenSEAL keys, sends each party the
    public context, and decrypts the masked aggregates, whose ciphertexts cross between processes as serialized
    bytes (the record "lvfl.CKKSShare"). CKKS decryptions carry fresh noise, so the launch is compared with the fit
    within it: the same messages tag by tag (bytes within 1%: SEAL compresses random ciphertexts to slightly varying
    sizes) and every party's parameters within 1e-4; the coordinator holds no tensor, feature or label, and
    receives the set-up counts and the masked aggregates only."""
    config = [*PAILLIER_TABLES[:2], '--model.init_args.aggregation={"class_path": "lvfl.privacy.CKKS"}',
              *PAILLIER_TABLES[3:]]  # fmt: skip
    probes, launch = fit_and_launch(tmp_path, config)
    assert "3 parties (party0, party1, coordinator)" in launch.stdout
    fit = checkpoint(tmp_path / "fit")
    sent = Counter()
    for name in ("party0", "party1", "coordinator"):
        state = checkpoint(tmp_path / "launch" / name)
        assert (state["epoch"], state["global_step"]) == (fit["epoch"], fit["global_step"]), name
        held = {k: t for k, t in state["state_dict"].items() if t.device.type != "meta"}
        assert bool(held) == (name != "coordinator"), name
        for key, tensor in held.items():
            assert torch.allclose(tensor, fit["state_dict"][key], rtol=0, atol=1e-4), (name, key)
        sent += ledger(state, sent_by=name)
    whole = ledger(fit)
    assert sent.keys() == whole.keys()
    for key, n in whole.items():
        assert abs(sent[key] - n) <= 0.01 * n, (key, sent[key], n)
    held = json.loads((probes / "coordinator.json").read_text())
    assert held["tensors"] == []
    assert held["tables"] == []
    received = {(s, t) for s, d, t, _ in held["ledger"] if d == "coordinator"}
    assert received == {("party0", tag) for tag in ("rows", "split", "task", "inputs", "he_aggregate")}


def test_an_attack_runs_in_the_attackers_process_and_scores_as_in_simulation(tmp_path):
    """Direct label inference by party1, launched: it runs in party1's process only (the other processes write no
    guesses), that process holds no label and no other party's features, and it writes guesses, not scores.
    `lvfl attack-score` with the same config then gives, epoch by epoch, exactly what the simulated attack logged
    on the same run (the launch is bit-identical to the fit)."""
    dli = '--trainer.callbacks+={"class_path": "lvfl.attacks.DirectLabelInference"}'
    config = ["--config", "configs/easter/digits.yaml", dli]
    probes, _ = fit_and_launch(tmp_path, config)
    (metrics,) = (tmp_path / "fit").glob("*/version_*/metrics.csv")
    with metrics.open(newline="") as f:
        simulated = [float(r["attack/dli/accuracy"]) for r in csv.DictReader(f) if r.get("attack/dli/accuracy")]
    (guesses,) = (tmp_path / "launch" / "party1").glob("*/version_*/attacks/dli.csv")
    assert not [p for name in ("party0", "party2", "party3") for p in (tmp_path / "launch" / name).rglob("attacks")]
    header = guesses.read_text().splitlines()[0].split(",")
    assert header == ["epoch", "step", "id", *(f"score_{k}" for k in range(10))]  # guesses only: no label column
    held = json.loads((probes / "party1.json").read_text())
    assert all(not split["labels"] for split in held["splits"].values())  # no truth in the attacker's process
    assert all(split["features"] == ["party1"] for split in held["splits"].values())
    out = tmp_path / "scores.json"
    scored = lvfl("attack-score", "--inferences", str(guesses), "--output", str(out), *config, *SHORT)
    assert scored.returncode == 0, scored.stderr[-3000:]
    deployed = [row["accuracy"] for row in json.loads(out.read_text())["epochs"]]
    assert deployed == simulated
    assert deployed[-1] >= 0.99
    assert "lvfl attack-score: dli by party1, epoch 1: samples" in scored.stdout


def test_norm_scoring_deployed_scores_its_leak_auc_as_in_simulation(tmp_path):
    """Li et al.'s norm scoring by party1 on the binary breast-cancer run, oriented by the class prior (no known
    labels: nothing but what party1's process holds): the leak AUC `lvfl attack-score` computes from the launched
    attacker's guesses equals, epoch by epoch, the simulated attack's."""
    norm = '--trainer.callbacks+={"class_path": "lvfl.attacks.NormScoring", "init_args": {"larger_norm_class": 0}}'
    config = ["--config", "configs/easter/breast_cancer.yaml", norm]
    fit_and_launch(tmp_path, config)
    (metrics,) = (tmp_path / "fit").glob("*/version_*/metrics.csv")
    with metrics.open(newline="") as f:
        key = "attack/norm_scoring/auc"
        simulated = [float(r[key]) for r in csv.DictReader(f) if r.get(key)]
    (guesses,) = (tmp_path / "launch" / "party1").glob("*/version_*/attacks/norm_scoring.csv")
    out = tmp_path / "scores.json"
    scored = lvfl("attack-score", "--inferences", str(guesses), "--output", str(out), *config, *SHORT)
    assert scored.returncode == 0, scored.stderr[-3000:]
    deployed = [row["auc"] for row in json.loads(out.read_text())["epochs"]]
    assert len(simulated) == 2
    assert deployed == pytest.approx(simulated, abs=1e-6)


def _metric(save_dir: Path, key: str) -> list[float]:
    """`key` per epoch from the one metrics.csv under `save_dir`."""
    (metrics,) = save_dir.glob("*/version_*/metrics.csv")
    with metrics.open(newline="") as f:
        return [float(r[key]) for r in csv.DictReader(f) if r.get(key)]


def test_side_knowledge_reaches_a_deployed_attacker_as_its_own_file_and_scores_as_in_simulation(tmp_path):
    """EASTER on digits with 2 parties (C * E - E_1 is the active party's embedding): party1 inverts the active
    party's features with 100 known samples of them, and completes its model with 40 known labels.

    A simulated run draws that side knowledge and writes it (attacks/NAME.known.csv); a simulated run handed those
    files (`side_knowledge`) logs exactly what the drawing run logged, so the file is the draw. Launched with the same
    files, the attacks run in party1's process, which holds no label and none of party0's features, and
    `lvfl attack-score` on their guesses gives the simulated inversion error and completion accuracy."""
    import yaml

    parties = yaml.safe_load((REPO / "configs/parties/digits.yaml").read_text())["model"]["init_args"]["parties"][:2]
    two = ["--config", "configs/easter/digits.yaml", "--data.init_args.num_parties=2",
           f"--model.init_args.parties={json.dumps(parties)}",
           '--model.init_args.aggregation={"class_path": "lvfl.privacy.Plain"}']  # fmt: skip
    attacks = {"embedding_inversion": ("EmbeddingInversion", "known_features", 100, "mse"),
               "pmc": ("PassiveModelCompletion", "known_labels", 40, "accuracy")}  # fmt: skip

    def callbacks(files: dict[str, Path] | None) -> list[str]:
        return [
            "--trainer.callbacks+=" + json.dumps({"class_path": f"lvfl.attacks.{cls}", "init_args": {
                option: n, **({"side_knowledge": str(files[name])} if files else {})}})
            for name, (cls, option, n, _) in attacks.items()
        ]  # fmt: skip

    drawn = lvfl("fit", *two, *callbacks(None), *SHORT, f"--trainer.logger.init_args.save_dir={tmp_path / 'drawn'}")
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    files = {name: next((tmp_path / "drawn").glob(f"*/version_*/attacks/{name}.known.csv")) for name in attacks}
    assert files["pmc"].read_text().splitlines()[0] == "id,label"
    assert len(files["embedding_inversion"].read_text().splitlines()) == 101
    config = [*two, *callbacks(files)]
    probes, _ = fit_and_launch(tmp_path, config)
    held = json.loads((probes / "party1.json").read_text())
    assert all(not split["labels"] for split in held["splits"].values())  # no truth in the attacker's process
    assert all(split["features"] == ["party1"] for split in held["splits"].values())
    for name, (_, _, _, metric) in attacks.items():
        simulated = _metric(tmp_path / "fit", f"attack/{name}/{metric}")
        assert simulated == _metric(tmp_path / "drawn", f"attack/{name}/{metric}"), name  # the file is the draw
        assert simulated, name
        (guesses,) = (tmp_path / "launch" / "party1").glob(f"*/version_*/attacks/{name}.csv")
        out = tmp_path / f"{name}.json"
        scored = lvfl("attack-score", "--inferences", str(guesses), "--output", str(out), *config, *SHORT)
        assert scored.returncode == 0, scored.stderr[-3000:]
        deployed = [row[metric] for row in json.loads(out.read_text())["epochs"]]
        assert deployed == pytest.approx(simulated, rel=1e-6, abs=1e-9), name
    baseline = _metric(tmp_path / "fit", "attack/embedding_inversion/baseline_mse")
    rescored = json.loads((tmp_path / "embedding_inversion.json").read_text())["epochs"]
    assert [row["baseline_mse"] for row in rescored] == pytest.approx(baseline, rel=1e-6)


def test_the_bank_and_the_retailer_each_on_its_own_disk_end_bit_identical_with_psi_and_student(tmp_path):
    """The bank/retailer example with a student, each party started by hand in a folder holding its own table only
    (the same config naming both files): PSI, split, task and input columns cross the wire; every parameter, the
    student and its figures, and the ledger up to the student's last message equal `lvfl fit`'s; each process read
    its own table only and holds labels only at the bank. `lvfl party predict` of the run writes, at the bank,
    the file `lvfl predict` writes, and `lvfl export --party P --federation F` at each party gives `lvfl export`'s
    folder."""
    sys.path.insert(0, str(REPO / "examples" / "bank_retailer"))
    from make_data import main as make_tables

    sys.path.pop(0)
    everything = tmp_path / "both"
    everything.mkdir()
    make_tables(everything)
    text = (REPO / "examples" / "bank_retailer" / "config.yaml").read_text()  # table paths relative to the file
    (everything / "bank_retailer.yaml").write_text(text)
    sites = {"party0": "bank.csv", "party1": "retailer.csv"}
    for name, table in sites.items():  # each organisation's disk: the config and its own table, not the other's
        (tmp_path / name).mkdir()
        (tmp_path / name / table).write_bytes((everything / table).read_bytes())
        (tmp_path / name / "bank_retailer.yaml").write_text(text)

    def at(folder: Path) -> list[str]:
        """The run's arguments with the config file on the disk of `folder`."""
        return [
            "--config",
            str(folder / "bank_retailer.yaml"),
            *SHORT,
            STUDENT,
            PROBE,
            "--trainer.enable_progress_bar=false",
        ]

    run = at(everything)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    probes = tmp_path / "probes"
    probes.mkdir()
    fit = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "lvfl", "fit", *run, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}"],
        cwd=everything, capture_output=True, text=True, timeout=300, check=False,
        env={**env, "LVFL_PROBE_DIR": str(probes)},
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    made = lvfl("pki", "--parties", *sites, "--out", str(tmp_path / "pki"))
    assert made.returncode == 0, made.stderr
    processes = {
        name: subprocess.Popen(  # noqa: S603
            party_cmd(
                name,
                tmp_path / "pki" / "federation.yaml",
                "bank-retailer",
                tmp_path / "launch",
                *at(tmp_path / name),
                timeout=60,
            ),
            cwd=tmp_path / name,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "LVFL_PROBE_DIR": str(probes)},
        )  # fmt: skip
        for name in sites
    }
    for name, process in processes.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, (name, err[-3000:])
    parties = {name: tmp_path / "launch" / name for name in sites}
    assert_parity(tmp_path / "fit", parties)
    assert_parity(tmp_path / "fit", parties, which="best")
    students = [next(d.glob("*/version_*/checkpoints/student.pt")) for d in (tmp_path / "fit", parties["party0"])]
    fitted, launched = (torch.load(path, weights_only=True) for path in students)
    assert fitted.keys() == launched.keys()
    assert all(torch.equal(fitted[k], launched[k]) for k in fitted)
    assert not list(parties["party1"].glob("*/version_*/checkpoints/student.*"))  # the student is the bank's alone
    figures = [student_figures(d) for d in (tmp_path / "fit", parties["party0"])]
    assert figures[0]
    assert figures[0] == figures[1]
    state = {name: json.loads((probes / f"{name}.json").read_text()) for name in ("fit", *sites)}
    sent = Counter()
    for name in sites:
        sent += Counter({(s, d, t): n for s, d, t, n in state[name]["ledger"] if s == name})
    whole = Counter({(s, d, t): n for s, d, t, n in state["fit"]["ledger"]})
    assert dict(sent) == dict(whole), "the ledgers differ"
    tags = {t for _, _, t in whole}
    assert {"psi/matrix", "split", "task", "inputs", "teacher/embeddings", "soft_labels"} <= tags, tags
    for name in sites:
        assert state[name]["tables"] == [name], state[name]["tables"]
        for split, held in state[name]["splits"].items():
            assert held["features"] == [name], (name, split)
            assert held["labels"] == (name == "party0"), (name, split)

    # lvfl predict of the deployed run: the bank asks for its IDs (shared, its own alone, unknown), the retailer serves
    bank_ids = [line.split(",")[0] for line in (everything / "bank.csv").read_text().splitlines()[1:]]
    shared = set(bank_ids) & {line.split(",")[0] for line in (everything / "retailer.csv").read_text().splitlines()}
    asked = tmp_path / "ids.csv"
    picks = [*sorted(shared)[:5], *sorted(set(bank_ids) - shared)[:3], "NOT-A-CUSTOMER"]
    asked.write_text("id\n" + "\n".join(picks) + "\n")
    # in the clear, then by oblivious lookups (the retailer learns no ID): the bank's file is lvfl predict's each time
    for oblivious in ("false", "true"):
        ask = ["--ckpt_path", "best", "--ids", str(asked), f"--oblivious={oblivious}"]
        predicted = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "lvfl", "predict", *run, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}",
             *ask, "--output", str(tmp_path / f"fit_{oblivious}.csv")],
            cwd=everything, capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        assert predicted.returncode == 0, predicted.stderr[-3000:]
        processes = {}
        for name in sites:
            cmd = party_cmd(name, tmp_path / "pki" / "federation.yaml", f"bank-retailer-predict-{oblivious}",
                            tmp_path / "launch", *at(tmp_path / name), *ask, "--output",
                            str(tmp_path / f"{name}_{oblivious}.csv"))  # fmt: skip
            cmd.insert(cmd.index("party") + 1, "predict")
            processes[name] = subprocess.Popen(  # noqa: S603
                cmd, cwd=tmp_path / name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
        said = {}
        for name, process in processes.items():
            said[name], err = process.communicate(timeout=300)
            assert process.returncode == 0, (name, err[-3000:])
        written = (tmp_path / f"fit_{oblivious}.csv").read_text()
        assert written.count("\n") == len(picks) + 1, written
        assert ",vfl," in written, written
        assert ",student," in written, written
        assert (tmp_path / f"party0_{oblivious}.csv").read_text() == written  # the bank writes lvfl predict's file
        assert not (tmp_path / f"party1_{oblivious}.csv").exists()  # the retailer served its part, wrote nothing
        if oblivious == "true":
            assert "through oblivious lookups" in said["party0"], said["party0"]
    plain, routed = (list(csv.reader((tmp_path / f"fit_{o}.csv").open(newline=""))) for o in ("false", "true"))
    assert [(r[0], r[1], r[-2], r[-1]) for r in routed] == [(r[0], r[1], r[-2], r[-1]) for r in plain]

    # new customers, in each organisation's own file of them: `lvfl launch predict` with the datamodule's new_rows
    # aligns them by a PSI of their own and writes the file `lvfl predict` writes for the same config
    retailer_ids = sorted(shared)[5:9]
    for source, target, keys in (
        ("bank.csv", "new_bank.csv", [*retailer_ids, *sorted(set(bank_ids) - shared)[3:5]]),
        ("retailer.csv", "new_retailer.csv", [*retailer_ids[::-1], *sorted(shared)[9:11]]),
    ):
        header, *rows = [line.split(",") for line in (everything / source).read_text().splitlines()]
        keep = [j for j, column in enumerate(header) if column != "status"]
        by_id = {row[0]: row for row in rows}
        lines = [",".join(header[j] for j in keep)]
        lines += [",".join(f"NEW-{key}" if j == 0 else by_id[key][j] for j in keep) for key in keys]
        (everything / target).write_text("\n".join(lines) + "\n")
    (everything / "new_rows.yaml").write_text(
        "data:\n  init_args:\n    new_rows:\n"
        "      - {path: new_bank.csv, id_column: customer_id, missing: mean}\n"
        "      - {path: new_retailer.csv, id_column: client}\n"
    )
    new = [*run, "--config", str(everything / "new_rows.yaml"), "--ckpt_path", "best"]
    for command, save_dir, output in (
        (["predict"], tmp_path / "fit", tmp_path / "new_fit.csv"),
        (["launch", "predict", "--timeout", "60"], tmp_path / "launch", tmp_path / "new_launch.csv"),
    ):
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "lvfl", *command, *new, f"--trainer.logger.init_args.save_dir={save_dir}",
             "--output", str(output)],
            cwd=everything, capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    written = (tmp_path / "new_fit.csv").read_text()
    assert [line.split(",")[0] for line in written.splitlines()[1:]] == [
        f"NEW-{key}" for key in [*retailer_ids, *sorted(set(bank_ids) - shared)[3:5]]
    ]
    assert written.count(",vfl,") == 4, written  # the four both hold; the bank's own two by the student
    assert written.count(",student,") == 2, written
    assert (tmp_path / "new_launch.csv").read_text() == written

    # each organisation exports its own folder (its encoders come from the set-up, run again with the other's export)
    exported = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "lvfl", "export", *run, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}",
         "--ckpt_path", "best", "--out", str(tmp_path / "exports" / "fit")],
        cwd=everything, capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    processes = {
        name: subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-m",
                "lvfl",
                "export",
                *at(tmp_path / name),
                f"--trainer.logger.init_args.save_dir={parties[name]}",
                "--ckpt_path",
                "best",
                "--out",
                str(tmp_path / "exports" / "own"),
                "--party",
                name,
                "--federation",
                str(tmp_path / "pki" / "federation.yaml"),
                "--timeout",
                "60",
            ],
            cwd=tmp_path / name,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for name in sites
    }
    for name, process in processes.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, (name, err[-3000:])
    identities = {}
    for name in sites:
        fitted, own = (tmp_path / "exports" / kind / name for kind in ("fit", "own"))
        infos = [json.loads((folder / "party.json").read_text()) for folder in (fitted, own)]
        identities[name] = [info.pop("export") for info in infos]
        assert infos[0] == infos[1], name  # encoders, scaling: all but the identity of the run exported
        a, b = (torch.load(folder / "state_dict.pt", weights_only=True) for folder in (fitted, own))
        assert a.keys() == b.keys(), name
        assert all(torch.equal(a[k], b[k]) for k in a), name
    # the launched parties' folders name one export (the run's ID, its step); the simulated run's is another
    fit_ids = {mine[0]["id"] for mine in identities.values()}
    own_ids = {mine[1]["id"] for mine in identities.values()}
    assert len(fit_ids) == 1, identities
    assert len(own_ids) == 1, identities
    assert fit_ids != own_ids, identities


def student_figures(save_dir: Path) -> dict[str, str]:
    """The `student/...` figures a run's CSV logger wrote (as text: equal means bit-equal)."""
    (path,) = save_dir.glob("*/version_0/metrics.csv")
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    out = {}
    for line in lines[1:]:
        for key, value in zip(header, line.split(","), strict=True):
            if key.startswith("student/") and value:
                out[key] = value
    return out


def start_parties(tmp_path: Path, config: list[str], timeout: float, *extra: str) -> dict[str, subprocess.Popen]:
    """`lvfl pki` for the 4 digits parties, then each `lvfl party` started by hand (output to <party>.out)."""
    names = [f"party{k}" for k in range(4)]
    pki = tmp_path / "pki"
    if not (pki / "federation.yaml").exists():
        made = lvfl("pki", "--parties", *names, "--out", str(pki))
        assert made.returncode == 0, made.stderr
    processes = {}
    for name in names:
        with (tmp_path / f"{name}.out").open("a") as out:
            processes[name] = subprocess.Popen(  # noqa: S603
                [*party_cmd(name, pki / "federation.yaml", "kill-test", tmp_path / "run", *config, timeout=timeout),
                 *extra],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
    return processes


def test_a_killed_party_stops_the_others_in_one_line_and_a_restart_resumes_bit_identical(tmp_path):
    config = ["--config", "configs/easter/digits.yaml", "--trainer.max_epochs=2", "--data.init_args.batch_size=16",
              "--trainer.limit_val_batches=2"]  # fmt: skip
    fit = lvfl("fit", *config, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}")
    assert fit.returncode == 0, fit.stderr[-3000:]
    timeout = 8.0
    processes = start_parties(tmp_path, config, timeout)
    first = tmp_path / "run" / "party2"
    deadline = time.monotonic() + 240
    while not list(first.glob("*/version_*/checkpoints/last.ckpt")):  # epoch 0 is checkpointed: kill party2 in epoch 1
        assert time.monotonic() < deadline
        assert all(p.poll() is None for p in processes.values())
        time.sleep(0.1)
    processes["party2"].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    for name, p in processes.items():
        p.wait(timeout=timeout + 60)
        if name == "party2":
            continue
        assert p.returncode == 2, name
        lines = [line for line in (tmp_path / f"{name}.out").read_text().splitlines() if line.startswith("lvfl:")]
        assert len(lines) == 1, (name, lines)
        assert "party2" in lines[0], lines
        assert "--ckpt_path last" in lines[0], lines
    assert time.monotonic() - killed_at < 2 * timeout + 30  # the deadline, not a hang
    restarted = start_parties(tmp_path, config, timeout, "--ckpt_path", "last")
    for name, p in restarted.items():
        assert p.wait(timeout=300) == 0, (tmp_path / f"{name}.out").read_text()[-3000:]
    assert_parity(tmp_path / "fit", {k: tmp_path / "run" / k for k in restarted}, resumed=True)


def test_a_party_of_another_run_or_config_is_refused_in_one_line(tmp_path):
    names = ["party0", "party1"]
    made = lvfl("pki", "--parties", *names, "--out", str(tmp_path / "pki"))
    assert made.returncode == 0, made.stderr
    federation = tmp_path / "pki" / "federation.yaml"
    config = ["--config", "configs/easter/digits.yaml", "--data.init_args.num_parties=2", *SHORT]
    variants = {  # whichever party's greeting is refused first, both lines name what differs
        "run": (["--run_id", "other"], ("'kill-test'", "'other'")),
        "config": (["--model.init_args.embedding_dim=16"], ("runs another configuration", "the model section")),
        # without --run_id each derives the run ID from its config: the differing section is still what is named
        "config, derived": (["--model.init_args.embedding_dim=16"], ("another configuration", "the model section")),
    }
    for what, (change, words) in variants.items():
        base = party_cmd("party0", federation, "kill-test", tmp_path / what, *config, timeout=10)
        other = party_cmd("party1", federation, "kill-test", tmp_path / what, *config, timeout=10)
        if what == "run":
            other[other.index("--run_id") + 1] = "other"
        else:
            other += change
        if what.endswith("derived"):
            for cmd in (base, other):
                del cmd[cmd.index("--run_id") : cmd.index("--run_id") + 2]
        procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # noqa: S603
                 for cmd in (base, other)]  # fmt: skip
        outputs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 2 for p in procs), outputs
        errors = [line for _, err in outputs for line in err.splitlines() if line.startswith("lvfl: error:")]
        assert len(errors) == 2, errors
        assert all(word in line for line in errors for word in words), errors


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "--config",
                "configs/easter/digits.yaml",
                '--trainer.callbacks+={"class_path": "lvfl.callbacks.LabelLeakageAudit"}',
            ],
            "does not run the LabelLeakageAudit callback yet",
        ),  # fmt: skip
        (
            [
                "--config",
                "configs/easter/digits.yaml",
                '--trainer.callbacks+={"class_path": "lvfl.attacks.PassiveModelCompletion"}',
            ],
            "runs PassiveModelCompletion in its party's process, where its side knowledge (known_labels, "
            "known_features) must be a file",
        ),  # fmt: skip
        (
            [
                "--config",
                "configs/easter/digits.yaml",
                '--trainer.callbacks+={"class_path": "lvfl.attacks.NoisySample"}',
            ],
            "does not run the NoisySample callback yet",
        ),  # fmt: skip
        (["--config", "configs/easter/digits.yaml", "--party", "party9"], "--party party9: the config's parties are"),
        (["export", "--config", "configs/easter/digits.yaml"], "predict; a party exports its own folder"),
        (
            ["--config", "configs/easter/digits.yaml", STUDENT.replace('"epochs": 3', '"epochs": 3, "cross_fit": 2')],
            "StudentDistillation with the PlainSoftLabels channel and no cross_fit; cross_fit does not run",
        ),
    ],
)
def test_what_does_not_run_across_processes_yet_is_refused_in_one_line(tmp_path, args, message):
    names = [f"party{k}" for k in range(4)]
    write_test_pki(tmp_path, names)
    write_federation(tmp_path / "federation.yaml", names)
    party = [] if "--party" in args else ["--party", "party0"]
    head = [args[0]] if args[0] in ("predict", "export") else []
    rest = args[1:] if head else args
    done = lvfl("party", *head, *party, "--federation", str(tmp_path / "federation.yaml"), *rest, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lvfl: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert message in errors[0]


def test_a_launch_over_a_delayed_paced_network_ends_bit_identical_and_counts_its_socket_bytes(tmp_path):
    """`--network wan` routes every connection through the link proxy: the run is the fit's, bit for bit, and the
    bytes the proxy forwarded (TLS, HTTP/2 and envelopes included) are at least the ledger's."""
    config = CONFIGS["EASTER DHMasking, 4 parties"]
    fit = lvfl("fit", *config, *SHORT, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}")
    assert fit.returncode == 0, fit.stderr[-3000:]
    launch = lvfl(
        "launch", "--network", "wan", "--timeout", "120", *config, *SHORT,
        f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}",
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-2000:] + launch.stderr[-3000:]
    assert_parity(tmp_path / "fit", {f"party{k}": tmp_path / "launch" / f"party{k}" for k in range(4)})
    assert "over a wan network" in launch.stdout
    # the active party's set-up report, phase by phase, from the launch's start to its first step
    report = re.search(r"lvfl party: set-up took ([\d.]+) s before the first step: (.*)", launch.stdout)
    assert report is not None, launch.stdout[-2000:]
    phases = [part.rsplit(" ", 2) for part in report.group(2).split("; ")]
    assert [name for name, _, _ in phases] == [  # a warm start: the party's process imported as the launcher began
        "the launcher's start", "process start and imports", "waiting for its part (config, certificates)",
        "config and greetings", "data, PSI, keys and models",
    ]  # fmt: skip
    assert sum(float(s) for _, s, _ in phases) == pytest.approx(float(report.group(1)), abs=0.25)
    # "the wan network carried ...", or "the wan network with 50 ms of jitter carried ..." in stress mode
    (line,) = [line for line in launch.stdout.splitlines() if line.startswith("lvfl launch: the wan network")]
    carried = int(line.split("carried ")[1].split(" bytes")[0].replace(",", ""))
    links = dict(part.rsplit(" ", 1) for part in line.split("(")[1].rstrip(")").split(", "))
    assert set(links) == {f"party0->party{k}" for k in (1, 2, 3)} | {f"party{k}->party0" for k in (1, 2, 3)}
    assert carried == sum(int(n.replace(",", "")) for n in links.values())
    assert carried >= sum(ledger(checkpoint(tmp_path / "fit")).values())
