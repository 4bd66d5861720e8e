"""How long a newcomer waits for a refusal: a missing party table against one found only after the full import.

    .venv/bin/python -m benchmarks.perf.refusal_time            # 3 rounds, each command in a fresh process

Each round runs, in fresh `python -m lvfl` processes from scratch copies of `examples/`:
- `lvfl fit` of the bank/retailer config with its retailer table renamed away: refused by the front door's early
  check, before torch and Lightning load;
- `lvfl fit` of the same config with a misspelt trainer option (`--trainer.max_epoch`), which only LightningCLI can
  judge, so it is refused after the full import: the floor every refusal paid before the early checks.
Prints each round's seconds side by side, their ratio, and the medians. Both must exit 2 with `lvfl: error:`; the
script stops otherwise. The machine is shared and noisy: compare within one run, not across runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "examples/bank_retailer/config.yaml"


def timed(args: list[str], cwd: Path) -> tuple[float, str]:
    """Seconds until `python -m lvfl args` exits, and its refusal line."""
    start = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    seconds = time.perf_counter() - start
    line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode != 2 or not line.startswith("lvfl: error:"):
        raise SystemExit(f"expected a refusal from {args}, got exit {done.returncode}: {done.stderr[-500:]}")
    return seconds, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as tmp:
        folder, intact = Path(tmp) / "missing", Path(tmp) / "intact"
        for where in (folder, intact):
            shutil.copytree(REPO / "examples", where / "examples")
        (folder / "examples/bank_retailer/retailer.csv").rename(folder / "examples/bank_retailer/retailer.old")
        early, late = [], []
        for i in range(rounds):
            missing, said_missing = timed(["fit", "--config", CONFIG], folder)
            option, said_option = timed(["fit", "--config", CONFIG, "--trainer.max_epoch=3"], intact)
            early.append(missing)
            late.append(option)
            if i == 0:
                print(f"missing table:     {said_missing}")
                print(f"misspelt option:   {said_option[:100]}")
                print(f"{'round':>5}  {'missing table (s)':>18}  {'after full import (s)':>22}  {'ratio':>6}")
            print(f"{i + 1:>5}  {missing:>18.2f}  {option:>22.2f}  {missing / option:>6.3f}")
        print(
            f"median  {statistics.median(early):>17.2f}  {statistics.median(late):>22.2f}"
            f"  {statistics.median(early) / statistics.median(late):>6.3f}"
        )


if __name__ == "__main__":
    main()
