"""The README's five-minute tour, run as written: a trained model, a predictions file, an export served without lvfl,
and the federation runs (the bank and the retailer, then four digits parties as four processes).

The commands are read from the README's first ```bash block under "A five-minute tour", so the README cannot drift
from what runs. They run in a fresh folder that sees the repository's `examples/` and `configs/`, as a newcomer's
clone does from its root.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO


def tour_block(index: int) -> str:
    """The README's `index`-th ```bash block under "A five-minute tour" (0: the tour, 1: serving)."""
    text = (REPO / "README.md").read_text().split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return text.split("```bash\n")[index + 1].split("```", 1)[0]


def tour_commands() -> list[list[str]]:
    block = tour_block(0)
    return [
        shlex.split(command, comments=True) for command in block.replace("\\\n", " ").splitlines() if command.strip()
    ]


def table_ids(path: Path) -> set[str]:
    return {row[next(iter(row))] for row in rows(path)}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path):
    for name in ("examples", "configs"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {k: v for k, v in os.environ.items() if k != "LVFL_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    activate, *commands = tour_commands()
    # typed as written in a fresh shell: the first line puts make demo's environment on the PATH, which holds `lvfl`
    assert activate == ["source", ".venv/bin/activate"]
    assert (REPO / ".venv/bin/activate").is_file() or not (REPO / ".venv").exists()
    assert Path(sys.executable).with_name("lvfl").is_file()  # the console script `lvfl` the tour then types
    assert [c[:2] for c in commands] == [
        ["lvfl", "fit"], ["lvfl", "test"], ["lvfl", "predict"], ["lvfl", "export"],
        ["python", "examples/serve_exported.py"], ["lvfl", "launch"], ["lvfl", "launch"], ["lvfl", "launch"],
    ]  # fmt: skip
    assert commands[6][2] == "predict"
    assert "lvfl.callbacks.StudentDistillation" in " ".join(commands[5])
    printed = {}
    for command in commands:
        program = [sys.executable, "-m", "lvfl"] if command[0] == "lvfl" else [sys.executable]
        done = subprocess.run(  # noqa: S603 - the README's own commands
            [*program, *command[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
        )
        assert done.returncode == 0, (command, done.stderr[-3000:])
        printed[" ".join(command[:3])] = done.stdout
    run = tmp_path / "runs" / "bank_retailer" / "version_0"
    assert {"best.ckpt", "last.ckpt", "student.pt", "student.json"} <= {p.name for p in (run / "checkpoints").iterdir()}
    assert "lvfl fit: 30 epochs" in printed["lvfl fit --config"]
    assert "  PSI: 604 IDs every party holds" in printed["lvfl fit --config"]
    assert (
        f"--ckpt_path best: loaded {Path('runs/bank_retailer/version_0/checkpoints/best.ckpt')}"
        in (printed["lvfl test --config"])
    )
    predicted, served = rows(tmp_path / "predictions.csv"), rows(tmp_path / "served.csv")
    assert len(predicted) == 180  # the bank's test customers
    assert {r["path"] for r in predicted} == {"vfl", "student"}
    by_id = {r["id"]: r for r in served}  # every customer of the bank, served from the exported folders
    assert len(by_id) == len(table_ids(REPO / "examples/bank_retailer/bank.csv"))
    for row in predicted:
        assert (by_id[row["id"]]["prediction"], by_id[row["id"]]["path"]) == (row["prediction"], row["path"])
    assert sorted(p.name for p in (tmp_path / "parties").iterdir()) == ["party0", "party1"]
    for party in ("party0", "party1"):  # the launched bank/retailer run: a process per party, each its own folder
        assert (tmp_path / "runs" / party / "bank_retailer" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    # the launched parties predict from their own best checkpoints: every test customer of the bank answered, each
    # row the simulation's (the launched run is bit-identical, its student included)
    launched = rows(tmp_path / "launched.csv")
    assert [r["id"] for r in launched] == [r["id"] for r in predicted]
    for mine, theirs in zip(launched, predicted, strict=True):
        assert mine == theirs
    assert {r["path"] for r in launched} == {"vfl", "student"}
    assert "0 unanswered" in printed["lvfl launch predict"]
    for party in ("party0", "party1", "party2", "party3"):  # four digits parties, four processes
        assert (tmp_path / "runs" / party / "easter_digits" / "version_0" / "checkpoints" / "last.ckpt").is_file()

    # serving: the second block, run as the shell script it is (two servers in the background, stopped at its end)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lvfl").write_text(f'#!/bin/sh\nexec {sys.executable} -m lvfl "$@"\n')
    (bin_dir / "lvfl").chmod(0o755)
    script = tour_block(1)
    assert script.count("lvfl serve") == 2
    assert "lvfl score --server" in script
    done = subprocess.run(  # noqa: S603 - the README's own commands
        ["bash", "-c", "set -m\n" + script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    scored = rows(tmp_path / "scored.csv")
    assert [r["id"] for r in scored] == [r["id"] for r in predicted]
    for mine, theirs in zip(scored, predicted, strict=True):
        assert (mine["prediction"], mine["path"], mine["reason"]) == (theirs["prediction"], theirs["path"], "")
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("{")]  # curl's: the JSON answer
    answer = json.loads(line)
    assert [a["id"] for a in answer["answers"]] == ["CUST-00312"]
    assert answer["answers"][0]["path"] == "vfl"
