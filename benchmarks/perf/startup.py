"""How long `lvfl launch` takes beside `lvfl fit` on the bank / retailer example, whole command and set-up, in one run.

    .venv/bin/python -m benchmarks.perf.startup [--repeats 3] [--epochs N]

Both commands run the README's example (`examples/bank_retailer/config.yaml`: two parties' own tables, PSI, EASTER
with DH masking) from a fresh process, one torch thread per process (`OMP_NUM_THREADS=1 lvfl fit` and `lvfl launch
--threads 1`: the same count, so the runs stay bit-identical), alternating for `--repeats` rounds; the medians are
printed side by side:

- the whole command's wall time, start to exit;
- the training, as each run's summary line states it (`lvfl fit: N epochs in X s`);
- the launch's set-up before the first training step, phase by phase, as its active party prints it
  (`lvfl party: set-up took ...`: the launcher, process start and imports, config and greetings, data, PSI, keys
  and models).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "examples/bank_retailer/config.yaml"


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """`python -m lvfl COMMAND`'s wall time and its output (stdout and stderr)."""
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *command], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return elapsed, done.stdout + done.stderr


def training_seconds(output: str) -> float:
    """The `N epochs in X s` figure of the run's summary."""
    found = re.search(r"lvfl fit: \d+ epochs in ([\d.]+) s", output)
    if found is None:
        raise SystemExit("no 'lvfl fit: N epochs in X s' line in the output")
    return float(found.group(1))


def setup_phases(output: str) -> dict[str, float]:
    """The active party's set-up report: total and each phase, in seconds."""
    found = re.search(r"lvfl party: set-up took ([\d.]+) s before the first step: (.*)", output)
    if found is None:
        raise SystemExit("no 'lvfl party: set-up took' line in the launch's output")
    phases = {"total": float(found.group(1))}
    for part in found.group(2).split("; "):
        name, _, seconds = part.rpartition(" ")[0].rpartition(" ")
        phases[name] = float(seconds)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (fit, launch); medians are reported")
    parser.add_argument("--epochs", type=int, default=None, help="the config's 30 by default")
    args = parser.parse_args()
    from benchmarks.common import machine

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    epochs = [] if args.epochs is None else [f"--trainer.max_epochs={args.epochs}"]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            common = ["--config", CONFIG, *epochs, "--trainer.enable_progress_bar=false"]
            fit = timed(["fit", *common, f"--trainer.logger.init_args.save_dir={tmp}/fit{i}"], env)
            launch = timed(
                ["launch", "--threads", "1", *common, f"--trainer.logger.init_args.save_dir={tmp}/launch{i}"], env
            )
            rounds.append((fit, launch))
    print(f"# {CONFIG}, {args.epochs or 'the config'} epochs, one torch thread per process, {args.repeats} rounds")
    print(f"# {machine()}")
    print()
    median = statistics.median
    fit_s, launch_s = [f[0] for f, _ in rounds], [la[0] for _, la in rounds]
    train_fit = [training_seconds(f[1]) for f, _ in rounds]
    train_launch = [training_seconds(la[1]) for _, la in rounds]
    print("| | lvfl fit | lvfl launch | launch - fit |")
    print("|---|---|---|---|")
    print(f"| whole command (s) | {median(fit_s):.1f} | {median(launch_s):.1f} | "
          f"{median(la - f for f, la in zip(fit_s, launch_s, strict=True)):+.1f} |")  # fmt: skip
    print(f"| training (s) | {median(train_fit):.1f} | {median(train_launch):.1f} | "
          f"{median(la - f for f, la in zip(train_fit, train_launch, strict=True)):+.1f} |")  # fmt: skip
    print(f"| everything else (s) | {median(a - b for a, b in zip(fit_s, train_fit, strict=True)):.1f} | "
          f"{median(a - b for a, b in zip(launch_s, train_launch, strict=True)):.1f} | |")  # fmt: skip
    phases = [setup_phases(la[1]) for _, la in rounds]
    print()
    print("The launch's set-up before the first step (its active party's report, medians):")
    for name in phases[0]:
        print(f"- {name}: {median(p[name] for p in phases):.1f} s")
    each = [(round(f, 1), round(la, 1)) for f, la in zip(fit_s, launch_s, strict=True)]
    print(f"\nrounds (fit, launch whole command, s): {each}")


if __name__ == "__main__":
    main()
