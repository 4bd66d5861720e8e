"""The own-data path end to end on the bank/retailer example, as a user runs it: the figures docs/results.md quotes.

    .venv/bin/python -m benchmarks.data.own_data [--epochs 30] [--mechanism]

Runs the `lvfl` commands in fresh processes, in a temporary folder:

1. `lvfl fit` of `examples/bank_retailer/config.yaml` with `StudentDistillation` (the PSI's counts, printed by fit);
2. `lvfl test --ckpt_path last` and `--ckpt_path best` (the epoch the best validation metric chose);
3. `lvfl predict` on the default test split, plain and `--oblivious=true`: how many rows each path answered, and
   whether the two files are the same rows with the same answers;
4. `lvfl export --ckpt_path best`, then `examples/serve_exported.py` in a process where `import lvfl` fails: does it
   reproduce `lvfl predict --ckpt_path best`'s file (rows, predictions, largest probability difference)?
5. a crafted checkpoint (a pickle whose loading would create a file) handed to `lvfl export`: the exit status, and
   whether the file appeared.

`--mechanism` adds randomized response at epsilon = 1 (the split is then drawn without the labels).
"""

from __future__ import annotations

import argparse
import csv
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "examples/bank_retailer/config.yaml"
STUDENT = '[{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 20}}]'
MECHANISM = '{"class_path": "lvfl.privacy.RandomizedResponse", "init_args": {"epsilon": 1.0}}'
WITHOUT_LVFL = (
    "import sys, runpy; sys.modules['lvfl'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def lvfl(*args: str) -> str:
    """Run `lvfl ARGS` in a fresh process from the repository; return its output (fail loudly if it fails)."""
    command = [sys.executable, "-m", "lvfl", *args]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        raise SystemExit(f"lvfl {' '.join(args[:1])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def metric(output: str, name: str) -> str:
    match = re.search(rf"{re.escape(name)}\s+[│|]?\s*([0-9.]+)", output)  # Lightning's table, boxed on a terminal
    return f"{float(match.group(1)):.3f}" if match else "?"


class Marker:
    """Loading this pickle would create `path`: what a crafted checkpoint does when it is unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--mechanism", action="store_true", help="randomized response at epsilon = 1")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        base = ["--config", CONFIG, f"--trainer.logger.init_args.save_dir={out}", "--trainer.enable_progress_bar=false"]
        if options.mechanism:
            base.append(f"--model.init_args.label_mechanism={MECHANISM}")
        fitted = lvfl("fit", *base, f"--trainer.max_epochs={options.epochs}", f"--trainer.callbacks={STUDENT}")
        psi = next((line for line in fitted.splitlines() if line.startswith("lvfl: PSI:")), "(no PSI line)")
        print(psi)
        for which in ("last", "best"):
            said = lvfl("test", *base, "--ckpt_path", which)
            loaded = next((line for line in said.splitlines() if "--ckpt_path best: loaded" in line), "")
            acc, auroc = metric(said, "test/acc/mean"), metric(said, "test/auroc/mean")
            epoch = f" ({loaded.split('(')[-1]}" if loaded else ""
            print(f"lvfl test --ckpt_path {which}: mean of the parties' models acc {acc}, AUROC {auroc}{epoch}")

        plain, routed = out / "plain.csv", out / "oblivious.csv"
        said = lvfl("predict", *base, "--ckpt_path", "best", f"--output={plain}")
        print(next(line for line in said.splitlines() if "rows written to" in line).replace(str(out), "<tmp>"))
        lvfl("predict", *base, "--ckpt_path", "best", f"--output={routed}", "--oblivious=true")
        a, b = read(plain), read(routed)
        same = [(r["id"], r["path"], r["prediction"], r["reason"]) for r in a] == [
            (r["id"], r["path"], r["prediction"], r["reason"]) for r in b
        ]
        gap = max(abs(float(x["prob_ok"]) - float(y["prob_ok"])) for x, y in zip(a, b, strict=True) if x["path"])
        print(
            f"plain vs --oblivious: same rows, paths and predictions: {same}; largest probability difference {gap:.2e}"
        )

        parties = out / "parties"
        lvfl("export", *base, "--ckpt_path", "best", "--out", str(parties))
        served = out / "served.csv"
        tables = [
            "--table",
            "party0=examples/bank_retailer/bank.csv",
            "--table",
            "party1=examples/bank_retailer/retailer.csv",
        ]
        ids = out / "ids.txt"
        ids.write_text("\n".join(r["id"] for r in a) + "\n")
        script = str(REPO / "examples" / "serve_exported.py")
        cmd = [
            sys.executable,
            "-c",
            WITHOUT_LVFL,
            script,
            str(parties),
            *tables,
            "--ids",
            str(ids),
            "--output",
            str(served),
        ]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)  # noqa: S603
        c = read(served)
        rows_equal = [(r["id"], r["path"], r["prediction"]) for r in a] == [
            (r["id"], r["path"], r["prediction"]) for r in c
        ]
        gap = max(abs(float(x["prob_ok"]) - float(y["prob_ok"])) for x, y in zip(a, c, strict=True) if x["path"])
        print(
            f"exported folders, served without lvfl: {len(c)} rows equal to lvfl predict's: {rows_equal}; "
            f"largest probability difference {gap:.2e}"
        )

        marker = out / "pwned"
        crafted = out / "crafted.ckpt"
        crafted.write_bytes(pickle.dumps({"state_dict": Marker(marker)}))
        export = [sys.executable, "-m", "lvfl", "export", *base, "--ckpt_path", str(crafted), "--out", str(out / "x")]
        proc = subprocess.run(export, cwd=REPO, capture_output=True, text=True, check=False)  # noqa: S603
        line = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        print(f"crafted checkpoint to lvfl export: exit {proc.returncode}, code ran: {marker.exists()}; {line[:110]}")


if __name__ == "__main__":
    main()
