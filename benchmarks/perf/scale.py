"""lvfl at a bank's size: each phase's time and peak memory per party, in simulation and deployed, in one run.

    .venv/bin/python -m benchmarks.perf.scale [--rows 1000000] [--parties 3] [--numeric 100] [--categorical 10]
        [--overlap 0.7] [--new-rows 100000] [--part-rows 250000] [--batch-size 1024] [--skip-launch] [--out DIR]
        [--psi kkrt|ecdh]
    .venv/bin/python -m benchmarks.perf.scale --rows N --from-logs   # the tables again, from the last run's logs

Writes its own data first (`--out`, default `runs/bench/scale/<rows>`, or `<rows>x<parties>` for other than 3
parties; kept, and reused when the same options wrote it): per party, `--rows` customers as Parquet parts of
`--part-rows` rows, `--numeric` numeric and `--categorical` categorical columns (20 levels each) and a customer ID;
a share `--overlap` of the customers is every party's, the rest each party's own; the active party (party0) holds a
binary label that depends on every party's columns. Then:

1. `lvfl fit`, every party in one process: reading, the PSI, the split, encoding (each phase as `lvfl.progress.Phase`
   prints it: time, and the process's peak memory when it ended), then one epoch of EASTER with DH masking (with
   two parties, Plain: DH masking needs two passive parties);
2. `lvfl predict` of `--new-rows` new customers per party (the same overlap), from the fit's last checkpoint;
3. `lvfl launch` of the same fit, one process per party: each party's phases from its own lines (the active
   party's console, the others' logs), so each figure is that party's process alone.

Printed: one table per command, a row per phase and party (seconds, peak memory in MB), with the command's wall
time and, for a fit, the epoch as its line states it and the fit as its summary does (set-up included). One torch
thread per process (`OMP_NUM_THREADS=1`), so that the launched parties do not share the cores twice over.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
LEVELS = 20  #: levels of each categorical column
#: a phase's closing line, as `lvfl.progress.Phase` prints it where no bar draws
PHASE = re.compile(r"^(party\d+): (.+): ([\d,]+) (\w+) in ([\d.]+) s, peak memory ([\d,]+) MB$")
EPOCH = re.compile(r"^epoch 1/1\b.*\s([\d.]+) s$")  #: the epoch's line: from the fit's start, after the set-up
FIT = re.compile(r"^lvfl fit: 1 epoch in ([\d.]+) s")  #: the fit's summary line: the set-up and the epoch
#: the fit summary's memory line: the process's peak, the features and the model parameters it holds
MEMORY = re.compile(
    r"^memory: peak ([\d,]+) MB in this process \(([\d,]+) MB before the data's set-up\); it holds ([\d.,]+ [kM]B) "
    r"of features and ([\d.,]+ [kM]B)"
)


def customer_ids(rows: int, overlap: float, party: int) -> np.ndarray:
    """Party `party`'s customers: the shared ones (the first `overlap` of `rows`), then its own, as ID numbers."""
    shared = round(overlap * rows)
    own = np.arange(rows - shared) + shared + party * (rows - shared)
    return np.concatenate([np.arange(shared), own])


def write_tables(folder: Path, options: argparse.Namespace, rows: int, prefix: str, labels: bool) -> list[Path]:
    """Each party's table as Parquet parts under `folder/party<k>/`; a label (with `labels`) from every party."""
    numbers = [customer_ids(rows, options.overlap, k) for k in range(options.parties)]
    universe = int(max(n.max() for n in numbers)) + 1
    rng = np.random.default_rng(0 if labels else 1)
    weights = rng.normal(size=options.parties)
    signal = np.zeros(universe, dtype=np.float32)  # each customer's score: one numeric column of each party
    paths = []
    for k, ids in enumerate(numbers):
        party_rng = np.random.default_rng([k, 0 if labels else 1])
        order = party_rng.permutation(len(ids))  # each party's file in its own order
        ids = ids[order]
        x = party_rng.normal(size=(len(ids), options.numeric)).astype(np.float32)
        signal[ids] += weights[k] * x[:, 0]
        codes = party_rng.integers(0, LEVELS, size=(len(ids), options.categorical), dtype=np.int32)
        paths.append(folder / f"party{k}")
        paths[-1].mkdir(parents=True, exist_ok=True)
        tables = (ids, x, codes)
        if k == 0:
            first = tables
            continue
        _write_parts(paths[-1], options, prefix, *tables, None)
    ids, x, codes = first
    label = None
    if labels:
        noise = np.random.default_rng(7).normal(scale=0.5, size=len(ids))
        label = np.where(signal[ids] + noise > 0, "yes", "no")
    _write_parts(paths[0], options, prefix, ids, x, codes, label)
    return paths


def _write_parts(folder, options, prefix, ids, x, codes, label) -> None:  # noqa: ANN001
    levels = pa.array([f"L{v:02d}" for v in range(LEVELS)])
    for part, start in enumerate(range(0, len(ids), options.part_rows)):
        stop = min(start + options.part_rows, len(ids))
        columns = {"customer_id": pa.array(np.char.add(prefix, ids[start:stop].astype(str)))}
        columns |= {f"x{j}": pa.array(x[start:stop, j]) for j in range(x.shape[1])}
        columns |= {
            f"c{j}": pa.DictionaryArray.from_arrays(pa.array(codes[start:stop, j]), levels)
            for j in range(codes.shape[1])
        }
        if label is not None:
            columns["label"] = pa.array(label[start:stop])
        pq.write_table(pa.table(columns), folder / f"part-{part:03d}.parquet")


def write_config(out: Path, data: list[Path], new: list[Path], batch_size: int, psi: str = "kkrt") -> tuple[Path, Path]:
    """The fit's config (EASTER, DH masking, one epoch) and the piece that adds the new rows for `lvfl predict`.

    Two parties train with the Plain backend instead: DH masking needs two passive parties to share a mask.
    """
    parties = [{"path": str(data[0]), "id_column": "customer_id", "label_column": "label"}]
    parties += [{"path": str(p), "id_column": "customer_id"} for p in data[1:]]
    config = {
        "seed_everything": 0,
        "trainer": {
            "max_epochs": 1,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(out / "runs")},
            },
        },
        "model": {
            "class_path": "lvfl.protocols.EASTER",
            "init_args": {
                "embedding_dim": 16,
                "aggregation": {"class_path": "lvfl.privacy.DHMasking" if len(data) > 2 else "lvfl.privacy.Plain"},
                "parties": [
                    {
                        "model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [64]}},
                        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.001}},
                    }
                ],
            },
        },
        "data": {
            "class_path": "lvfl.datamodules.PartyTables",
            "init_args": {"parties": parties, "batch_size": batch_size, "seed": 0, "psi": psi},
        },
    }
    new_rows = {"data": {"init_args": {"new_rows": [{"path": str(p), "id_column": "customer_id"} for p in new]}}}
    paths = out / "scale.yaml", out / "new_rows.yaml"
    paths[0].write_text(json.dumps(config, indent=1))  # JSON is YAML
    paths[1].write_text(json.dumps(new_rows, indent=1))
    return paths


def run(args: list[str], log: Path) -> tuple[float, str]:
    """`python -m lvfl ARGS` from the repository, one torch thread; its wall time and its output (kept in `log`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"lvfl {args[0]} failed ({done.returncode}), see {log}:\n{done.stderr[-3000:]}")
    return seconds, done.stdout + done.stderr


def phases(text: str) -> list[tuple[str, str, str, float, float]]:
    """(party, phase, count, seconds, peak MB) of every phase's closing line in `text`, in order."""
    found = []
    for line in text.splitlines():
        match = PHASE.match(line.strip())
        if match:
            party, name, count, unit, seconds, peak = match.groups()
            found.append((party, name, f"{count} {unit}", float(seconds), float(peak.replace(",", ""))))
    return found


def report(title: str, seconds: float | None, texts: dict[str, str]) -> None:
    """The phases' table of a command's output (`texts`: each process's, by who it holds), then each process's peak."""
    text = "\n".join(texts.values())
    whole = f"{seconds:.1f} s, the whole command" if seconds is not None else "from its log"
    print(f"### {title}: {whole}")
    print()
    print("| party | phase | count | seconds | peak memory (MB) |")
    print("|---|---|---|---|---|")
    for party, name, count, took, peak in phases(text):
        print(f"| {party} | {name} | {count} | {took:.1f} | {peak:,.0f} |")
    for pattern, what in (
        (EPOCH, "one epoch of training (its line)"),
        (FIT, "the fit, set-up and epoch (its summary)"),
    ):
        found = next((m.group(1) for line in text.splitlines() if (m := pattern.match(line.strip()))), None)
        if found is not None:
            print(f"| | {what} | | {float(found):.1f} | |")
    print()
    rows = [
        (who, m.groups())
        for who, out in texts.items()
        for line in out.splitlines()
        if (m := MEMORY.match(line.strip()))
    ]
    if rows:
        print("| process | peak memory, the whole fit (MB) | before the data's set-up (MB) | features it holds "
              "| model parameters |")  # fmt: skip
        print("|---|---|---|---|---|")
        for who, (peak, before, features, params) in rows:
            print(f"| {who} | {peak} | {before} | {features} | {params} |")
        print()


def simulate(out: Path, config: Path, new_rows: Path, options: argparse.Namespace) -> None:
    """`lvfl fit`, then `lvfl predict` of the new rows, every party in one process; each command's tables."""
    seconds, text = run(["fit", "--config", str(config)], out / "fit.log")
    report("lvfl fit (simulation)", seconds, {"every party": text})
    seconds, text = run(
        ["predict", "--config", str(config), "--config", str(new_rows), "--ckpt_path", "last",
         "--output", str(out / "predictions.csv")],
        out / "predict.log",
    )  # fmt: skip
    report(f"lvfl predict of {options.new_rows:,} new customers per party (simulation)", seconds, {"every party": text})


def launched(out: Path, console: str) -> dict[str, str]:
    """Each launched party's output: the active party's is the launch's console, the others' their logs."""
    logs = {p.stem: p.read_text() for p in sorted((out / "launch").glob("party*.log"))}
    return {"party0": console, **logs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="customers per party")
    parser.add_argument(
        "--parties", type=int, default=3, help="DH masking needs 3 (two passive parties); 2 train Plain"
    )
    parser.add_argument("--numeric", type=int, default=100, help="numeric columns per party")
    parser.add_argument("--categorical", type=int, default=10, help="categorical columns per party")
    parser.add_argument("--overlap", type=float, default=0.7, help="the share of customers every party holds")
    parser.add_argument("--new-rows", type=int, default=100_000, help="new customers per party, for lvfl predict")
    parser.add_argument("--part-rows", type=int, default=250_000, help="rows per Parquet part")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--psi", choices=["kkrt", "ecdh"], default="kkrt", help="PartyTables' psi (its default, kkrt)")
    parser.add_argument("--skip-launch", action="store_true", help="simulation only")
    parser.add_argument("--skip-simulation", action="store_true", help="lvfl launch only")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/bench/scale/<rows>")
    parser.add_argument("--from-logs", action="store_true", help="print the tables of the last run's logs in --out")
    options = parser.parse_args()
    if not 0 < options.overlap <= 1 or options.parties < 2 or options.rows < 1:
        parser.error("--overlap must be in (0, 1], --parties at least 2, --rows at least 1")
    from benchmarks.common import machine

    out = options.out or REPO / "runs" / "bench" / "scale" / (
        f"{options.rows}" + ("" if options.parties == 3 else f"x{options.parties}")
    )
    if options.from_logs:  # the whole commands' times are in the run's own printout, not in the logs
        for log, title in (("fit", "lvfl fit (simulation)"), ("predict", "lvfl predict (simulation)")):
            if (out / f"{log}.log").exists():
                report(title, None, {"every party": (out / f"{log}.log").read_text()})
        if (out / "launch.log").exists():
            report("lvfl launch (a process per party)", None, launched(out, (out / "launch.log").read_text()))
        return
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "data.json"
    runs_only = ("skip_launch", "skip_simulation", "out", "batch_size")  # options that do not change the data
    wanted = {k: v for k, v in vars(options).items() if k not in runs_only}
    started = time.perf_counter()
    if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
        data = write_tables(out / "data", options, options.rows, "C", labels=True)
        new = write_tables(out / "new", options, options.new_rows, "N", labels=False)
        stamp.write_text(json.dumps(wanted))
        wrote = f"wrote the tables in {time.perf_counter() - started:.0f} s"
    else:
        data = [out / "data" / f"party{k}" for k in range(options.parties)]
        new = [out / "new" / f"party{k}" for k in range(options.parties)]
        wrote = "the tables written before"
    config, new_rows = write_config(out, data, new, options.batch_size, options.psi)
    print(f"# {options.parties} parties x {options.rows:,} customers ({options.overlap:.0%} shared), "
          f"{options.numeric} numeric + {options.categorical} categorical columns each, Parquet parts of "
          f"{options.part_rows:,} rows; {wrote} ({out})")  # fmt: skip
    print(f"# {machine()}; one torch thread per process")
    print()
    if not options.skip_simulation:
        simulate(out, config, new_rows, options)
    if not options.skip_launch:
        save = out / "launch"
        for old in save.glob("party*.log"):  # a launch appends to its parties' logs: this run's lines only
            old.unlink()
        seconds, text = run(
            ["launch", "--threads", "1", "--config", str(config), f"--trainer.logger.init_args.save_dir={save}"],
            out / "launch.log",
        )
        report("lvfl launch (a process per party)", seconds, launched(out, text))


if __name__ == "__main__":
    main()
