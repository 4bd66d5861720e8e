"""`lvfl fit` stopped by SIGINT or SIGTERM exits with 130 or 143 and one line naming the checkpoint to resume from.

Each case runs `python -m lvfl fit` in its own process on a small config with far more epochs than it will run, waits
for the first `last.ckpt` (or, for the no-checkpoint case, for the first training batch), signals it, and reads its
exit status and the last line of its stderr. The processes of a test run at the same time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO
from lightning.pytorch import Callback

from lvfl.checkpoints import load_checkpoint

MLP = "{class_path: lvfl.models.MLP, init_args: {hidden: [4]}}"
TESTS = Path(__file__).resolve().parent


class SlowStart(Callback):
    """Marks the first training batch by creating `path`, and makes every batch take a second (no epoch ends soon)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        Path(self.path).touch()
        time.sleep(1.0)


#: Python keeps SIGINT ignored if its parent ignored it (a background job): the child restores the default itself,
#: then runs `python -m lvfl`. Not a `preexec_fn`, which forks and runs Python in the child before exec: the test
#: process may hold gRPC threads (the federation tests), whose fork handlers can abort such a child.
DEFAULT_SIGINT_THEN_LVFL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); sys.argv[0] = 'lvfl'; "
    "runpy.run_module('lvfl', run_name='__main__', alter_sys=True)"
)


_STARTED: list[subprocess.Popen] = []  # every fit a test started, killed at its teardown if still running


@pytest.fixture(autouse=True)
def _no_fit_outlives_its_test():
    """A test that fails before stopping its fits must not leave them training (they run 100,000 epochs)."""
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


class Fit:
    """`lvfl fit` of a tiny Wine run for 100,000 epochs in a child process logging under `folder`."""

    def __init__(self, folder: Path, *extra: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "tiny.yaml"
        config.write_text(
            "model:\n  class_path: lvfl.protocols.EASTER\n  init_args:\n    embedding_dim: 4\n"
            f"    parties:\n      - {{model: {MLP}}}\n"
            "data:\n  class_path: lvfl.datamodules.Wine\n  init_args: {num_parties: 2, batch_size: 32}\n"
        )
        args = [
            *("-m", "lvfl", "fit", "--config", str(config)),
            f"--trainer.logger.init_args.save_dir={folder}",
            "--trainer.logger.init_args.name=tiny",
            "--trainer.max_epochs=100000",
            "--trainer.enable_progress_bar=false",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if k != "LVFL_DEBUG"}
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        self.last = folder / "tiny" / "version_0" / "checkpoints" / "last.ckpt"  # the first fit in `folder`
        self.process = subprocess.Popen(  # noqa: S603 - lvfl's own command
            [sys.executable, "-c", DEFAULT_SIGINT_THEN_LVFL, *args[2:]],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _STARTED.append(self.process)

    def wait_for(self, path: Path, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"lvfl fit ended early ({self.process.returncode}): {self.process.stderr.read()}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"no {path} after {timeout} s")
            time.sleep(0.05)

    def stop(self, signum: int, timeout: float = 120.0) -> tuple[int, str]:
        """Send `signum`; (exit status, stderr) once the process ended."""
        self.process.send_signal(signum)
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        return self.process.returncode, err


@pytest.mark.slow
def test_a_signal_during_fit_exits_with_its_status_and_names_last_ckpt(tmp_path):
    fits = {signum: Fit(tmp_path / signum.name) for signum in (signal.SIGINT, signal.SIGTERM)}
    for fit in fits.values():
        fit.wait_for(fit.last)
    stopped = {signum: fit.stop(signum) for signum, fit in fits.items()}
    for signum, (status, err) in stopped.items():
        last = fits[signum].last.resolve()
        assert status == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
        line = err.strip().splitlines()[-1]
        epochs = load_checkpoint(last)["epoch"] + 1
        assert line == (
            f"lvfl fit: stopped by {signum.name}; resume with --ckpt_path {last} "
            f"(written after epoch {epochs}, the last completed)"
        ), err
        assert "Traceback" not in err


@pytest.mark.slow
def test_a_signal_before_the_first_checkpoint_says_there_is_none(tmp_path):
    started = tmp_path / "started"
    slow = f'{{"class_path": "test_interrupts.SlowStart", "init_args": {{"path": "{started}"}}}}'
    fit = Fit(tmp_path, f"--trainer.callbacks+={slow}")
    fit.wait_for(started)
    status, err = fit.stop(signal.SIGTERM)
    assert status == 143, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("lvfl fit: stopped by SIGTERM; no checkpoint was written yet"), err
    assert "nothing to resume from" in line
    assert not fit.last.exists()
    assert "Traceback" not in err
