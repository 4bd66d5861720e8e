"""`lvfl launch`'s warm start (`lvfl.commands.warm_start`, `warm_party`): party processes started before the config
is read answer the launcher's question as the launcher itself would, run their part as `python -m lvfl` would, restart
where their imports depended on the part, end when given none; a warm launch ends bit-identical to a cold one."""

from __future__ import annotations

import multiprocessing.spawn
import os
import re
import signal
import sys

import pytest
import torch
from helpers import REPO, checkpoints_of, lvfl

from lvfl.checkpoints import load_checkpoint
from lvfl.commands.launch_parties import config_parties
from lvfl.commands.warm_start import IMPORT_TIME, WarmParty, needs_fresh_process, take_front_door, warm_start_possible

DIGITS = ["--config", "configs/easter/digits.yaml"]


def test_a_part_needs_a_fresh_process_only_where_the_imports_depended_on_it():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "2"}
    assert not needs_fresh_process(base, {**base, "LVFL_PARTY_STARTED": "1.0", "PATH": "/usr/bin"})
    assert needs_fresh_process(base, {**base, "OMP_NUM_THREADS": "1"})
    assert needs_fresh_process(base, {"PATH": "/bin"})  # unset where the process had it
    for name in IMPORT_TIME:
        assert needs_fresh_process({}, {name: "0"}), name


@pytest.mark.parametrize(("visible", "warm"), [("0,1", False), ("0", True), ("", True), (" 2 , 3 ", False)])
def test_a_launch_starts_warm_only_where_each_party_needs_no_gpu_of_its_own(monkeypatch, visible, warm):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert warm_start_possible() is (warm and sys.platform != "win32")


@pytest.mark.slow
def test_a_warm_process_that_ended_before_its_part_answers_nothing_and_takes_no_part(tmp_path):
    """One that could not start (here Python itself cannot) gives no answer and no process: the launcher then reads
    the config itself and starts the part afresh (`launch._run_parties`)."""
    broken = WarmParty({**os.environ, "PYTHONHOME": str(tmp_path / "no-python-here")})
    broken.process.wait(timeout=60)
    assert broken.ask({"do": "parties", "args": DIGITS, "allow_public_seeds": False, "fits": True}) is None
    assert broken.run(["party", "--help"], os.environ, None) is None
    broken.close()


@pytest.mark.slow  # two Python processes that import PyTorch and Lightning
def test_a_warm_party_answers_as_the_launcher_would_then_runs_its_part_or_ends(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    first, second = WarmParty(env), WarmParty(env)
    try:
        question = {"do": "parties", "args": DIGITS, "allow_public_seeds": False, "fits": True}
        names, active, save_dir, ranks = config_parties(DIGITS)
        assert first.ask(question) == {"names": names, "active": active, "save_dir": save_dir, "ranks": ranks}
        assert ranks == 1
        assert names == ["party0", "party1", "party2", "party3"]
        refused = first.ask({**question, "args": [*DIGITS, "--model.init_args.no_such_option=1"]})
        assert set(refused) == {"error"}  # the launcher reads the config itself, to refuse it in its own words
        log = tmp_path / "party.log"
        log.write_text("== header ==\n")
        # another thread count than it imported with: the process is replaced by a fresh one, output and all
        process = first.run(["party", "--help"], {**env, "OMP_NUM_THREADS": "1"}, log)
        assert process.wait(timeout=120) == 0
        text = log.read_text()
        assert text.startswith("== header ==\n")  # appended, after the header
        assert "usage: lvfl party" in text
        process = second.run(["party", "--help"], env, None)  # the same settings: this process runs it
        assert process.wait(timeout=120) == 0
    finally:
        first.close()
        second.close()
    third, fourth = WarmParty(env), WarmParty(env)
    # given no part, it ends by itself, with success (asked first, so that it has imported: closed while importing on
    # a loaded machine, it may outlast close()'s 10 s and be killed, which is right for the launcher but not this test)
    assert third.ask(question) is not None
    third.close()
    assert third.process.returncode == 0
    assert fourth.ask(question) is not None  # imported, waiting for its part
    fourth.process.send_signal(signal.SIGINT)  # Ctrl-C reaches the launcher's whole process group
    assert fourth.process.wait(timeout=60) == 130  # the interrupted status, no traceback of its own
    fourth.close()


def _held(save_dir):
    """Each party's tensors of its last checkpoint (a party's own only; the rest are on the meta device)."""
    held = {}
    for party in ("party0", "party1"):
        (experiment,) = {p.parent for p in (save_dir / party).glob("*/version_*")}
        state = load_checkpoint(checkpoints_of(experiment) / "last.ckpt")["state_dict"]
        held[party] = {k: t for k, t in state.items() if t.device.type != "meta"}
    return held


@pytest.mark.slow  # two launches of two parties
def test_a_warm_launch_ends_bit_identical_to_a_cold_one(tmp_path):
    config = [
        "--config", "examples/bank_retailer/config.yaml", "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
    ]  # fmt: skip
    reports = {}
    for how, env in (("warm", {}), ("cold", {"CUDA_VISIBLE_DEVICES": "0,1"})):  # two GPUs in sight: a cold start
        done = lvfl("launch", "--threads", "1", *config, f"--trainer.logger.init_args.save_dir={tmp_path / how}",
                    env={**env, "LVFL_PARTY_IMPORTED": "0"}, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        found = re.search(r"lvfl party: set-up took [\d.]+ s before the first step: (.*)", done.stdout)
        assert found is not None, done.stdout[-2000:]
        reports[how] = [part.rsplit(" ", 2)[0] for part in found.group(1).split("; ")]
    assert reports["warm"] == [
        "the launcher's start", "process start and imports", "waiting for its part (config, certificates)",
        "config and greetings", "data, PSI, keys and models",
    ]  # fmt: skip
    assert reports["cold"] == [  # a stray mark in the launcher's environment is not taken for a warm start's
        "the launcher (config, certificates)", "process start and imports", "config and greetings",
        "data, PSI, keys and models",
    ]  # fmt: skip
    warm, cold = _held(tmp_path / "warm"), _held(tmp_path / "cold")
    for party in warm:
        assert warm[party], party
        assert warm[party].keys() == cold[party].keys(), party
        for key, tensor in warm[party].items():
            assert torch.equal(tensor, cold[party][key]), f"{party}: {key}"


def test_a_warm_party_spawns_its_workers_as_python_m_lvfl_does(monkeypatch):
    """A spawned child (a PSI worker) skips a package's `__main__`, so it does not import what a warm process did."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(main, "__spec__", main.__spec__)
    take_front_door(["party", "--party", "party1"])
    assert multiprocessing.spawn.get_preparation_data("worker")["init_main_from_name"] == "lvfl.__main__"
    assert sys.argv[1:] == ["party", "--party", "party1"]
    assert sys.argv[0].endswith(os.path.join("lvfl", "__main__.py"))
