"""Fitted, exported and predicted runs of the bank/retailer example for the serving tests, and their helpers.

`served` (a session fixture, registered in conftest.py) fits each of `CASES` once for every serving test module:
EASTER with DH masking and randomized response, SplitNN, Agg_VFL with DH masking, PraVFed with label DP.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO

from lvfl.commands.entry import main as lvfl
from lvfl.commands.fit import main as fit_main
from lvfl.federation.federation_file import write_federation
from lvfl.federation.pki import write_test_pki

CONFIG = "examples/bank_retailer/config.yaml"
TABLES = {"party0": REPO / "examples/bank_retailer/bank.csv", "party1": REPO / "examples/bank_retailer/retailer.csv"}
STUDENT = '[{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 3}}]'
DH = "{class_path: lvfl.privacy.DHMasking}"
RR = "{class_path: lvfl.privacy.RandomizedResponse, init_args: {epsilon: 1.0, seed: 0}}"
PARTIES = (
    "[{model: {class_path: lvfl.models.MLP, init_args: {hidden: [32]}}, "
    "optimizer: {class_path: torch.optim.Adam, init_args: {lr: 0.01}}}]"
)
#: the protocols served, each with a backend and label mechanism (a model section replacing the example's)
CASES = {
    "EASTER-DHMasking-RandomizedResponse": f"class_path: lvfl.protocols.EASTER\ninit_args: {{embedding_dim: 16, "
    f"aggregation: {DH}, label_mechanism: {RR}, parties: {PARTIES}}}",
    "SplitNN": "class_path: lvfl.protocols.SplitNN\ninit_args: {embedding_dim: 16, top_model: {class_path: "
    f"lvfl.models.MLP, init_args: {{hidden: [16]}}}}, parties: {PARTIES}}}",
    "AggVFL-DHMasking": f"class_path: lvfl.protocols.AggVFL\ninit_args: {{embedding_dim: 16, aggregate: mean, "
    f"aggregation: {DH}, parties: {PARTIES}}}",
    "PraVFed": f"class_path: lvfl.protocols.PraVFed\ninit_args: {{embedding_dim: 16, local_epochs: 1, label_mechanism: "
    f"{{class_path: lvfl.privacy.LaplaceLabels, init_args: {{epsilon: 1.0, seed: 0}}}}, parties: {PARTIES}}}",
}


#: DHMasking needs two passive parties: the retailer's table split in two, a third organisation holding its channel
THREE_PARTIES = ("EASTER-DHMasking-RandomizedResponse", "AggVFL-DHMasking")


@dataclass
class Served:
    """A fitted, exported and predicted run, with a federation for its serving parties and their tables."""

    folder: Path
    export: Path
    predicted: Path
    federation: Path
    tables: dict[str, Path]


def three_tables(folder: Path) -> dict[str, Path]:
    """The bank's table, the retailer's spend and visits, and (a third party's) its channel column."""
    header, *rows = [line.split(",") for line in TABLES["party1"].read_text().splitlines()]
    tables = {"party0": TABLES["party0"], "party1": folder / "spend.csv", "party2": folder / "channel.csv"}
    for party, keep in (("party1", [0, 1, 2]), ("party2", [0, 3])):
        tables[party].write_text("\n".join(",".join(r[j] for j in keep) for r in [header, *rows]) + "\n")
    return tables


def fit_export_predict(name: str, root: Path) -> Served:
    """The bank/retailer example with `CASES[name]`'s model, fitted 1 epoch with a student, exported, predicted."""
    folder = root / name
    folder.mkdir()
    text = "model:\n  " + CASES[name].replace("\n", "\n  ") + "\n"
    tables = dict(TABLES)
    if name in THREE_PARTIES:
        tables = three_tables(folder)
        text += (
            "data:\n  init_args:\n    parties:\n"
            f"      - {{path: {tables['party0']}, id_column: customer_id, label_column: status, missing: mean}}\n"
            f"      - {{path: {tables['party1']}, id_column: client}}\n"
            f"      - {{path: {tables['party2']}, id_column: client}}\n"
        )
    (folder / "model.yaml").write_text(text)
    logs = f"--trainer.logger.init_args.save_dir={folder / 'runs'}"
    common = ["--config", CONFIG, "--config", str(folder / "model.yaml"), logs, "--trainer.enable_progress_bar=false"]
    cwd = Path.cwd()
    os.chdir(REPO)
    try:
        fit_main(["fit", *common, "--trainer.max_epochs=1", f"--trainer.callbacks={STUDENT}"])
        lvfl(["export", *common, "--ckpt_path", "last", "--out", str(folder / "export")])
        fit_main(["predict", *common, "--ckpt_path", "last", f"--output={folder / 'predicted.csv'}"])
    finally:
        os.chdir(cwd)
    write_test_pki(folder / "pki", list(tables), ca_key=None)
    federation = write_federation(folder / "pki" / "federation.yaml", list(tables))
    return Served(folder, folder / "export", folder / "predicted.csv", federation.path, tables)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    root = tmp_path_factory.mktemp("served")
    return {name: fit_export_predict(name, root) for name in CASES}


#: how long a test waits for a server's line, and how long a server lives at most (it stops by itself), in s
WAIT, SERVE_LIFETIME = 600, 1200


class Process:
    """An `lvfl serve` process, its output read on a thread (so a test can wait for a line)."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "lvfl", "serve", *args, "--stop_after", str(SERVE_LIFETIME)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = WAIT) -> str:
        """The first output line holding `text`; fails with the output if none comes within `timeout` s.

        The wait ends as soon as the line comes, so its bound is generous: five `lvfl serve` processes starting at
        once on a loaded 2-core machine take minutes to import PyTorch and print it.
        """
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}; output:\n" + "\n".join(self.lines[-30:]))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def passive(run: Served, export: Path | None = None, party: str = "party1", extra: tuple[str, ...] = ()) -> Process:
    """A passive party's `lvfl serve` for `run` (its own export folder and its own table), `extra` options added."""
    return Process("--party", party, "--federation", str(run.federation), "--model",
                   str(export or run.export / party), "--table", str(run.tables[party]), *extra)  # fmt: skip


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def assert_same_answers(served: list[dict[str, str]], predicted: list[dict[str, str]]) -> None:
    """ID by ID: the same path, prediction and reason, probabilities within 1e-6."""
    assert [r["id"] for r in served] == [r["id"] for r in predicted]
    assert list(served[0]) == list(predicted[0])  # lvfl predict's columns
    probs = [c for c in predicted[0] if c.startswith("prob_")]
    for mine, theirs in zip(served, predicted, strict=True):
        assert (mine["path"], mine["prediction"], mine["reason"]) == (
            theirs["path"], theirs["prediction"], theirs["reason"]), mine["id"]  # fmt: skip
        for c in probs:
            assert float(mine[c]) == pytest.approx(float(theirs[c]), abs=1e-6), (mine["id"], c)


def score_here(run: Served, ids: Path, out: Path, *extra: str) -> None:
    """`lvfl score` as the bank, in this process (no server), asking `run`'s passive `lvfl serve` processes."""
    from lvfl.commands import score as score_command

    score_command.main(["--party", "party0", "--federation", str(run.federation), "--model",
                        str(run.export / "party0"), "--table", str(TABLES["party0"]), "--ids", str(ids),
                        "--output", str(out), *extra])  # fmt: skip


def score_refused(run: Served, tmp_path: Path, capsys: pytest.CaptureFixture) -> list[str]:
    """`lvfl score` of one ID as the bank, which must stop with status 2 and write nothing: its standard error lines."""
    ids = tmp_path / "ids.txt"
    ids.write_text(read(run.predicted)[0]["id"] + "\n")
    with pytest.raises(SystemExit) as stopped:
        score_here(run, ids, tmp_path / "out.csv")
    assert stopped.value.code == 2
    assert not (tmp_path / "out.csv").exists()
    return capsys.readouterr().err.strip().splitlines()


def table_ids(path: Path) -> list[str]:
    """A CSV table's IDs (its first column), in file order."""
    return [line.split(",")[0] for line in path.read_text().splitlines()[1:]]


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
