"""Serving latency and throughput: `lvfl serve` processes over localhost mutual TLS, beside `lvfl predict`, in one run.

    .venv/bin/python -m benchmarks.perf.serving [--requests 400] [--batch 10000] [--out docs/results/serving.json]

What it measures, on the bank/retailer example (2 parties) and the same data with the retailer's columns split over
three organisations (4 parties), each fitted for 2 epochs with a student and exported:

- each twice: every party serving in plain mode, then in oblivious mode (`--oblivious`, buckets of 64 rows: the
  passive parties' contributions fetched by oblivious lookups, their key sets prepared ahead on a thread of the
  active party's);
- one customer per request, online: a client (`lvfl.serving.client.ScoringClient`, one channel kept open, as a business
  application keeps it) sends one ID to the active party's `lvfl serve --api` (gRPC on this machine), which asks
  every passive party's `lvfl serve` (its own process, mutual TLS: which IDs it holds by their blinded points, then
  its contributions) and answers; p50 and p99 of the client's round trip over `--requests` requests (IDs every
  party holds, in random order), after a warm-up;
- the same request answered in the client's own process (`lvfl.serving.Scorer`, no API hop), to show the hop;
- batch: `--batch` new customers (rows drawn from the example's with fresh IDs, every party holding each) scored in
  one request of `lvfl score --server`; rows per second of the request;
- `lvfl predict` with `new_rows` on the same new customers, in one process that holds every party: its whole
  command's wall time (start-up, PSI, encoding, prediction) and rows per second of that.

Every process runs on this machine, so the figures are those of localhost with TLS on 2 shared cores; a network's
latency adds its round trip once per request (the passive parties are asked in parallel).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

EXAMPLE = REPO / "examples" / "bank_retailer"
STUDENT = '[{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 3}}]'
WARMUP = 30


def _lvfl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    done = subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "lvfl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"lvfl {args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tables(root: Path, parties: int) -> dict[str, Path]:
    """The example's tables: 2 parties as they are, 4 with the retailer's three columns at three organisations."""
    tables = {"party0": EXAMPLE / "bank.csv"}
    header, *rows = [line.split(",") for line in (EXAMPLE / "retailer.csv").read_text().splitlines()]
    groups = [[1, 2, 3]] if parties == 2 else [[1], [2], [3]]
    for k, keep in enumerate(groups, start=1):
        path = root / f"party{k}.csv"
        path.write_text("\n".join(",".join(r[j] for j in [0, *keep]) for r in [header, *rows]) + "\n")
        tables[f"party{k}"] = path
    return tables


def new_customers(root: Path, tables: dict[str, Path], count: int, seed: int = 0) -> dict[str, Path]:
    """`count` new customers every party holds: each party's row of a shared customer, under a fresh ID."""
    rng = random.Random(seed)
    read = {p: [line.split(",") for line in path.read_text().splitlines()] for p, path in tables.items()}
    by_id = {p: {r[0]: r for r in rows[1:]} for p, rows in read.items()}
    shared = sorted(set.intersection(*(set(ids) for ids in by_id.values())))
    picks = [rng.choice(shared) for _ in range(count)]
    out = {}
    for party, rows in read.items():
        header = rows[0]
        keep = [j for j, c in enumerate(header) if c != "status"]
        lines = [",".join(header[j] for j in keep)]
        lines += [",".join(f"NEW-{i:06d}" if j == 0 else by_id[party][key][j] for j in keep) for i, key in
                  enumerate(picks)]  # fmt: skip
        out[party] = root / f"new_{party}.csv"
        out[party].write_text("\n".join(lines) + "\n")
    return out


def data_yaml(tables: dict[str, Path], new: dict[str, Path] | None = None) -> str:
    """A config's data section for the tables (and the new rows) given."""

    def entry(party: str, path: Path, label: bool) -> str:
        if party == "party0":
            extra = ", label_column: status" if label else ""
            return f"      - {{path: {path}, id_column: customer_id{extra}, missing: mean}}\n"
        return f"      - {{path: {path}, id_column: client}}\n"

    text = "data:\n  init_args:\n    parties:\n" + "".join(entry(p, t, True) for p, t in tables.items())
    if new:
        text += "    new_rows:\n" + "".join(entry(p, t, False) for p, t in new.items())
    return text


class Serve:
    """An `lvfl serve` process, its output read on a thread."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "lvfl", "serve", *args, "--stop_after", "900"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(text in line for line in self.lines):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise SystemExit(f"lvfl serve did not say {text!r}: {self.lines}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(parties: int, root: Path, requests: int, batch: int) -> dict:
    """Fit, export, serve and time one federation of `parties` parties."""
    from lvfl.federation.federation_file import write_federation
    from lvfl.federation.pki import write_test_pki

    root.mkdir(parents=True)
    tables = write_tables(root, parties)
    (root / "data.yaml").write_text(data_yaml(tables))
    run = ["--config", str(EXAMPLE / "config.yaml"), "--config", str(root / "data.yaml"),
           f"--trainer.logger.init_args.save_dir={root / 'runs'}", "--trainer.enable_progress_bar=false"]  # fmt: skip
    _lvfl("fit", *run, "--trainer.max_epochs=2", f"--trainer.callbacks={STUDENT}")
    _lvfl("export", *run, "--ckpt_path", "last", "--out", str(root / "export"))
    names = list(tables)
    write_test_pki(root / "pki", names, ca_key=None)
    federation = write_federation(root / "pki" / "federation.yaml", names)
    new = new_customers(root, tables, batch)
    modes = {mode: serve_and_time(root, names, federation.path, new, requests, batch, mode == "oblivious")
             for mode in ("plain", "oblivious")}  # fmt: skip
    # lvfl predict with the same new rows, every party in one process
    (root / "new.yaml").write_text(data_yaml(tables, new))
    start = time.perf_counter()
    _lvfl("predict", *run, "--config", str(root / "new.yaml"), "--ckpt_path", "last", "--output",
          str(root / "predicted.csv"))  # fmt: skip
    predict_seconds = time.perf_counter() - start
    with (root / "predicted.csv").open(newline="") as f:
        predicted = {r["id"]: r for r in csv.DictReader(f)}
    out = {"parties": parties, "batch_rows": batch, "lvfl_predict_seconds": predict_seconds,
           "lvfl_predict_rows_per_s": batch / predict_seconds}  # fmt: skip
    for mode, timed in modes.items():
        out[mode] = {
            "online_p50_ms": 1e3 * statistics.median(timed["online"]),
            "online_p99_ms": 1e3 * percentile(timed["online"], 0.99),
            "in_process_p50_ms": 1e3 * statistics.median(timed["in_process"]),
            "in_process_p99_ms": 1e3 * percentile(timed["in_process"], 0.99),
            "batch_rows_per_s": batch / timed["batch_seconds"],
            "served_equals_lvfl_predict": all(
                predicted[r["id"]]["prediction"] == r["prediction"] for r in timed["rows"]
            ),
        }
    out["oblivious_over_plain_p50"] = out["oblivious"]["online_p50_ms"] / out["plain"]["online_p50_ms"]
    return out


def serve_and_time(
    root: Path, names: list[str], federation: Path, new: dict[str, Path], requests: int, batch: int, oblivious: bool
) -> dict:
    """Start every party's `lvfl serve` in one mode; time one-customer requests (API and in process) and the batch."""
    from lvfl.federation.federation_file import load_federation
    from lvfl.serving import ExportedParty, FeatureSource, Scorer
    from lvfl.serving.client import ScoringClient

    mode = ["--oblivious"] if oblivious else []
    api = f"127.0.0.1:{_free_port()}"
    servers = [
        Serve("--party", p, "--federation", str(federation), "--model", str(root / "export" / p), "--table",
              str(new[p]), *mode)
        for p in names[1:]
    ]  # fmt: skip
    active = Serve("--party", "party0", "--federation", str(federation), "--model",
                   str(root / "export" / "party0"), "--table", str(new["party0"]), "--api", api,
                   "--deadline", "5", *mode)  # fmt: skip
    try:
        for server in servers:
            server.wait_for("answers party0's contribution requests")
        active.wait_for("party0 scores at grpc")
        ids = [f"NEW-{i:06d}" for i in range(batch)]
        rng = random.Random(1)
        online = []
        client = ScoringClient(api)  # one channel, as a business application keeps it
        for i in range(WARMUP + requests):
            key = rng.choice(ids)
            start = time.perf_counter()
            rows = client.score([key], timeout=10)
            if i >= WARMUP:
                online.append(time.perf_counter() - start)
            assert rows[0]["path"] == "vfl", rows
        # the same in this process: the Scorer without the API hop (it greets the passive parties: a new session)
        party = ExportedParty(root / "export" / "party0", "party0")
        scorer = Scorer(load_federation(federation), party, FeatureSource(new["party0"], party),
                        load_federation(federation).key_path("party0"), deadline=5, oblivious=oblivious)  # fmt: skip
        assert set(scorer.greet(timeout=10).values()) == {""}
        in_process = []
        for i in range(WARMUP + requests):
            key = rng.choice(ids)
            start = time.perf_counter()
            scored = scorer.score([key])
            if i >= WARMUP:
                in_process.append(time.perf_counter() - start)
            assert scored.rows[0]["path"] == "vfl"
        scorer.close()
        start = time.perf_counter()
        rows = client.score(ids, deadline=300, timeout=600)  # one request: a batch job gives it time
        batch_seconds = time.perf_counter() - start
        client.close()
        assert sum(r["path"] == "vfl" for r in rows) == batch, {r["reason"] for r in rows}
    finally:
        for server in [*servers, active]:
            server.stop()
    return {"online": online, "in_process": in_process, "batch_seconds": batch_seconds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="online requests per federation (after warm-up)")
    parser.add_argument("--batch", type=int, default=10_000, help="new customers scored in the batch request")
    parser.add_argument("--parties", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(p, Path(tmp) / f"parties{p}", args.requests, args.batch) for p in args.parties]
    print(f"serving, localhost mutual TLS, {os.cpu_count()} cores; {args.requests} one-customer requests, batch of "
          f"{args.batch} new customers; oblivious: buckets of 64 rows")  # fmt: skip
    head = (f"{'parties':>7}  {'mode':>9}  {'online p50':>10}  {'online p99':>10}  {'in-proc p50':>11}  "
            f"{'in-proc p99':>11}  {'batch rows/s':>12}  same")  # fmt: skip
    print(head)
    for r in results:
        for mode in ("plain", "oblivious"):
            m = r[mode]
            print(f"{r['parties']:>7}  {mode:>9}  {m['online_p50_ms']:>8.2f}ms  {m['online_p99_ms']:>8.2f}ms  "
                  f"{m['in_process_p50_ms']:>9.2f}ms  {m['in_process_p99_ms']:>9.2f}ms  "
                  f"{m['batch_rows_per_s']:>12,.0f}  {m['served_equals_lvfl_predict']}")  # fmt: skip
        ratio, predict = r["oblivious_over_plain_p50"], r["lvfl_predict_rows_per_s"]
        print(f"{r['parties']:>7}  oblivious / plain, online p50: {ratio:.2f}x; lvfl predict in one process: "
              f"{predict:,.0f} rows/s ({r['lvfl_predict_seconds']:.1f} s)")  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
