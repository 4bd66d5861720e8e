"""The deployment matrix's cases (docs/results.md, "The message schedule"): each a tiny run of a protocol, a backend
and 2-4 parties on their own tables, with the student or an attack, that must end in each party's own process as in
`lvfl fit`. The same cases run rehearsed in one process (tests/test_rehearsal.py; one of them in the fast tier) and a
subset as processes over sockets (tests/test_federation_schedule.py, slow).

The tables are the bank/retailer example's, the retailer's columns split over the passive organisations, each with
its own ID column and row order, so the PSI and the set-up run as a deployment's would.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from federation_parity import checkpoint, ledger
from helpers import REPO

#: each passive organisation: its file, its ID column, its columns of the retailer's table
PASSIVE = [("shop", "client", ["spend"]), ("visits", "cid", ["visits"]), ("channel", "key", ["channel"])]

#: each protocol's init_args beyond the parties and the backend (tiny models)
PROTOCOLS = {
    "EASTER": "    embedding_dim: 8\n",
    "PraVFed": "    embedding_dim: 8\n    local_epochs: 1\n    weighting: accuracy\n"
    "    label_mechanism: {class_path: lvfl.privacy.LaplaceLabels, init_args: {epsilon: 1.0, seed: 5}}\n",
    "SplitNN": "    embedding_dim: 8\n    fusion: FUSION\n    top_model: {class_path: lvfl.models.MLP, init_args: "
    "{hidden: [8]}}\n",
    "CVFL": "    embedding_dim: 8\n    top_model: {class_path: lvfl.models.MLP}\n    top_hidden: 8\n"
    "    local_iterations: 2\n    compressor: {class_path: lvfl.compression.Compressor, init_args: {bits: 8}}\n",
    "AggVFL": "    embedding_dim: 8\n",
}

BACKENDS = {
    "Plain": "{class_path: lvfl.privacy.Plain}",
    "DHMasking": "{class_path: lvfl.privacy.DHMasking}",
    "Paillier": "{class_path: lvfl.privacy.Paillier, init_args: {workers: 1}}",
    "CKKS": "{class_path: lvfl.privacy.CKKS}",
}

STUDENT = (
    '--trainer.callbacks+={"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 2, '
    '"model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [8]}}}}'
)
ATTACK = '--trainer.callbacks+={"class_path": "lvfl.attacks.DirectLabelInference"}'


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: a protocol, a backend, a number of parties, and what runs beside the protocol."""

    protocol: str
    backend: str
    parties: int
    student: bool = False
    attack: bool = False

    @property
    def name(self) -> str:
        extras = "".join(f", {what}" for what, on in (("student", self.student), ("attack", self.attack)) if on)
        return f"{self.protocol} {self.backend} {self.parties} parties{extras}"

    @property
    def approximate(self) -> bool:
        """CKKS decryptions carry fresh noise: its runs agree within its bound, not bit for bit."""
        return self.backend == "CKKS"

    @property
    def coordinator(self) -> bool:
        return self.backend in ("Paillier", "CKKS")

    def args(self, root: Path) -> list[str]:
        """The run's command-line arguments (the config written under `root`), for `lvfl fit` and every party."""
        config = write_case(root, self)
        extra = [STUDENT] if self.student else []
        extra += [ATTACK] if self.attack else []
        return ["--config", str(config), *extra, "--trainer.enable_progress_bar=false"]


#: a pairwise covering of protocols x backends x parties x (student, attack): every protocol with each backend it
#: takes, each party count with each protocol, the student with every protocol, an attack, an HE coordinator
MATRIX = [
    Case("EASTER", "Plain", 2, student=True),
    Case("EASTER", "DHMasking", 3, student=True),
    Case("EASTER", "DHMasking", 4, student=True, attack=True),
    Case("EASTER", "Paillier", 3),
    Case("EASTER", "CKKS", 2, student=True),
    Case("PraVFed", "DHMasking", 3, student=True),
    Case("PraVFed", "CKKS", 2),
    Case("PraVFed", "Plain", 4),
    Case("SplitNN", "Plain", 2, student=True),
    Case("SplitNN", "DHMasking", 4),
    Case("SplitNN", "Paillier", 2),
    Case("CVFL", "Plain", 3, student=True),
    Case("CVFL", "Plain", 4, attack=True),
    Case("AggVFL", "DHMasking", 3, student=True),
    Case("AggVFL", "Paillier", 2, student=True),
    Case("AggVFL", "Plain", 4),
]


def write_tables(root: Path, parties: int) -> list[str]:
    """The bank's table and `parties - 1` passive organisations' tables under `root`; their config entries."""
    sys.path.insert(0, str(REPO / "examples" / "bank_retailer"))
    from make_data import main as make_tables

    sys.path.pop(0)
    if not (root / "retailer.csv").exists():
        make_tables(root)
    header, *rows = [line.split(",") for line in (root / "retailer.csv").read_text().splitlines()]
    entries = ["      - {path: bank.csv, id_column: customer_id, label_column: status, missing: mean}"]
    for k, (name, id_column, columns) in enumerate(PASSIVE[: parties - 1], start=1):
        keep = [header.index(c) for c in columns]
        ordered = rows if k % 2 else rows[::-1]
        lines = [",".join([id_column, *columns])] + [",".join([r[0], *(r[j] for j in keep)]) for r in ordered]
        (root / f"{name}.csv").write_text("\n".join(lines) + "\n")
        entries.append(f"      - {{path: {name}.csv, id_column: {id_column}}}")
    return entries


def write_case(root: Path, case: Case) -> Path:
    """The case's config under `root` (tables beside it); its path. One epoch of 3 batches, 2 of validation."""
    root.mkdir(parents=True, exist_ok=True)
    entries = write_tables(root, case.parties)
    protocol = PROTOCOLS[case.protocol].replace("FUSION", "sum" if case.backend != "Plain" else "concat")
    config = root / f"{case.protocol}_{case.backend}_{case.parties}.yaml"
    config.write_text(
        "seed_everything: 0\n"
        "trainer:\n  max_epochs: 1\n  limit_train_batches: 3\n  limit_val_batches: 2\n  logger:\n"
        "    class_path: lightning.pytorch.loggers.CSVLogger\n    init_args: {save_dir: runs, name: case}\n"
        f"model:\n  class_path: lvfl.protocols.{case.protocol}\n  init_args:\n{protocol}"
        f"    aggregation: {BACKENDS[case.backend]}\n    parties:\n"
        "      - model: {class_path: lvfl.models.MLP, init_args: {hidden: [16]}}\n"
        "        optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}}\n"  # CKKS noise stays its size
        "data:\n  class_path: lvfl.datamodules.PartyTables\n  init_args:\n    parties:\n"
        + "\n".join(entries)
        + "\n    batch_size: 64\n    seed: 0\n"
    )
    return config


def party_names(case: Case) -> list[str]:
    return [f"party{k}" for k in range(case.parties)] + (["coordinator"] if case.coordinator else [])


def assert_same_run(case: Case, fit_dir: Path, party_dirs: dict[str, Path]) -> None:
    """Every party's checkpoint holds its own tensors, equal to the fit's (CKKS: within 1e-4); the ledgers' union is
    the fit's tag by tag (CKKS: bytes within 1%); the student, where there is one, is the fit's."""
    fit = checkpoint(fit_dir)
    sent, owners = {}, set()
    for name, directory in party_dirs.items():
        state = checkpoint(directory)
        assert (state["epoch"], state["global_step"]) == (fit["epoch"], fit["global_step"]), name
        held = {k: t for k, t in state["state_dict"].items() if t.device.type != "meta"}
        assert bool(held) == (name != "coordinator"), name
        for key, tensor in held.items():
            if case.approximate:
                assert torch.allclose(tensor, fit["state_dict"][key], rtol=0, atol=1e-4), (name, key)
            else:
                assert torch.equal(tensor, fit["state_dict"][key]), f"{name}: {key} differs from lvfl fit's"
        assert not owners & set(held), f"{name} holds another party's tensors"
        owners |= set(held)
        for key, n in ledger(state, sent_by=name).items():
            sent[key] = sent.get(key, 0) + n
    assert owners == set(fit["state_dict"]), set(fit["state_dict"]) - owners
    whole = dict(ledger(fit))
    assert sent.keys() == whole.keys(), set(sent) ^ set(whole)
    for key, n in whole.items():
        assert abs(sent[key] - n) <= (0.01 * n if case.approximate else 0), (key, sent[key], n)
    if case.student:
        students = [next(d.glob("*/version_*/checkpoints/student.pt")) for d in (fit_dir, party_dirs["party0"])]
        fitted, ran = (torch.load(path, weights_only=True) for path in students)
        assert fitted.keys() == ran.keys()
        for key in fitted:
            if case.approximate:
                assert torch.allclose(fitted[key], ran[key], rtol=0, atol=1e-3), key
            else:
                assert torch.equal(fitted[key], ran[key]), key


def write_new_rows(root: Path, case: Case) -> tuple[Path, int, int]:
    """Each organisation's file of new customers (IDs ``NEW-...``, its own columns, no label) and a config naming
    them (`data.init_args.new_rows`); returns it, how many every party holds, and how many the bank alone holds."""
    tables = [("bank.csv", "customer_id")] + [(f"{name}.csv", id_column) for name, id_column, _ in PASSIVE]
    read = [[line.split(",") for line in (root / file).read_text().splitlines()] for file, _ in tables[: case.parties]]
    ids = [{row[0] for row in rows[1:]} for rows in read]
    everyone = sorted(set.intersection(*ids))[:6]
    bank_only = sorted(ids[0] - set.union(*ids[1:]))[:3]
    entries = []
    for k, rows in enumerate(read):
        header, by_id = rows[0], {row[0]: row for row in rows[1:]}
        keep = [j for j, column in enumerate(header) if column != "status"]
        keys = [*everyone, *bank_only] if k == 0 else everyone[::-1]
        lines = [",".join(header[j] for j in keep)]
        lines += [",".join(f"NEW-{key}" if j == 0 else by_id[key][j] for j in keep) for key in keys]
        (root / f"new_{tables[k][0]}").write_text("\n".join(lines) + "\n")
        extra = ", missing: mean" if k == 0 else ""
        entries.append(f"      - {{path: new_{tables[k][0]}, id_column: {tables[k][1]}{extra}}}")
    config = root / "new_rows.yaml"
    config.write_text("data:\n  init_args:\n    new_rows:\n" + "\n".join(entries) + "\n")
    return config, len(everyone), len(bank_only)
