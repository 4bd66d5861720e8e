"""What every party its own process costs: `lvfl launch` beside `lvfl fit` on the same config, in one run.

    .venv/bin/python -m benchmarks.perf.federation_cost [--epochs 6] [--batch-size N] [--parties N] [--repeats 3]
        [--config configs/easter/digits.yaml]

Both runs are fresh processes on this machine (`lvfl fit`: one process; `lvfl launch`: one per party, mutual-TLS
gRPC on localhost), alternating for `--repeats` rounds (a shared machine's slow spells hit both), and the medians
over the rounds are printed side by side:

- the median training step (the active party's, from batch start to batch end) and their ratio (the median of
  each round's ratio);
- the CPU time a step costs (every thread of a process: torch, gRPC, the transport's), per party and summed: on a
  machine with fewer cores than parties the launched step cannot be shorter than that sum over the cores;
- the bytes: the ledger (payload bytes every party sent, equal to `lvfl fit`'s by construction and checked here),
  the encoded envelopes (protobuf: header, schema, raw tensor buffers; `Transport.envelope_bytes`), and the bytes the
  loopback interface carried during the launch (HTTP/2 framing, TLS records and TCP/IP headers included; read from
  /proc/net/dev, so any other loopback traffic on the machine during the run is counted too), each over the ledger;
- the `NetworkSimulator`'s predicted step time for the in-process run's schedule on a loopback-like link (10 Gbps,
  0.05 ms one way), beside the step time measured across processes (from one more fit, before the rounds: the
  simulator's hooks are not in the fits whose steps are compared).

Both runs use one torch thread per process (`OMP_NUM_THREADS=1`: the same count in both, which keeps them
bit-identical; with torch's default of a thread per core in each of 4 processes the launched step is slower still).
The launch's processes share this machine's cores (4 parties on 2 cores here), so its step time includes that
contention as well as the messages' serialization, TLS and gRPC.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch import Callback

REPO = Path(__file__).resolve().parents[2]
#: a loopback-like access link for the simulator: 10 Gbps each way, 0.05 ms one way
LOOPBACK = {"up_mbps": 10_000.0, "down_mbps": 10_000.0, "latency_ms": 0.05}


class Record(Callback):
    """Writes what a process measured (its step times, its ledger, its transport's bytes) to $LVFL_COST_DIR."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.cpu: list[float] = []  # this process's CPU time (every thread) from batch start to batch end
        self._started = self._cpu = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: D102
        self._started, self._cpu = time.perf_counter(), time.process_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: D102
        self.steps.append(time.perf_counter() - self._started)
        self.cpu.append(time.process_time() - self._cpu)

    def on_fit_end(self, trainer, pl_module) -> None:  # noqa: D102
        from lvfl.callbacks import NetworkSimulator
        from lvfl.network import simulate

        wire = pl_module.wire
        here = wire.here or "fit"
        record = {"steps": self.steps, "cpu": self.cpu, "ledger": [[*k, n] for k, n in wire.bytes.items()]}
        link = getattr(wire.carrier, "transport", None)
        if link is not None:
            record["envelope"] = [[*k, n] for k, n in link.envelope_bytes.items()]
        for cb in trainer.callbacks:
            if isinstance(cb, NetworkSimulator):
                record["simulated_steps"] = [
                    simulate(p.schedule, cb._links, cb._scale, p.tail_s).step_s for p in cb.trace if p.kind == "step"
                ]
        Path(os.environ["LVFL_COST_DIR"], f"{here}.json").write_text(json.dumps(record))


def loopback_bytes() -> int:
    """Bytes the loopback interface has transmitted since boot (each byte on lo is sent once and received once)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def run(command: list[str], out: Path) -> float:
    """Run `python -m lvfl COMMAND` with the Record callback, one torch thread per process; its wall time (s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LVFL_COST_DIR": str(out), "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *command], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def first_parties(config: Path, count: int, folder: Path) -> Path:
    """`config` with its first `count` parties only (data `num_parties`, model `parties`), written into `folder`."""
    import yaml

    data = yaml.safe_load((REPO / config).read_text())
    data["data"]["init_args"]["num_parties"] = count
    parties = data["model"]["init_args"]["parties"]
    data["model"]["init_args"]["parties"] = parties[:count] if len(parties) > 1 else parties
    aggregation = data["model"]["init_args"].get("aggregation") or {}
    if count == 2 and aggregation.get("class_path", "").endswith("DHMasking"):
        # one passive party has no peer to mask with (DHMasking refuses unless told): its share goes as it is, the
        # same bytes and nearly the same work; what is measured here is the processes' cost, not the masks'
        aggregation.setdefault("init_args", {})["allow_insecure"] = True
    out = folder / f"{config.stem}_{count}_parties.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/easter/digits.yaml")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=None, help="the config's own by default (128 for digits)")
    parser.add_argument(
        "--parties",
        type=int,
        default=None,
        help="keep the config's first N parties (its data num_parties and model parties cut to N): with as many "
        "cores as parties, the launch's processes do not share cores (N=2 runs DHMasking with allow_insecure: one "
        "passive party has no peer to mask with)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (fit, launch); medians are reported")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = args.config if args.parties is None else str(first_parties(Path(args.config), args.parties, tmp))
        batch = [] if args.batch_size is None else [f"--data.init_args.batch_size={args.batch_size}"]
        common_args = [
            "--config", config, f"--trainer.max_epochs={args.epochs}", *batch, "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false", "--trainer.limit_val_batches=0",
            '--trainer.callbacks+={"class_path": "benchmarks.perf.federation_cost.Record"}',
        ]  # fmt: skip
        simulator = {"class_path": "lvfl.callbacks.NetworkSimulator", "init_args": {"links": LOOPBACK}}
        simulator["init_args"].update(keep_trace=True, print_summary=False)
        # the simulator's prediction comes from a fit of its own: its hooks would add to the measured fit's steps
        (tmp / "simulated").mkdir()
        run(
            ["fit", *common_args, f"--trainer.callbacks+={json.dumps(simulator)}",
             f"--trainer.logger.init_args.save_dir={tmp / 'fit_logs'}"],
            tmp / "simulated",
        )  # fmt: skip
        simulated = json.loads((tmp / "simulated" / "fit.json").read_text())
        rounds = []
        for i in range(args.repeats):  # fit and launch alternate, so that a slow spell of the machine hits both
            fit_dir, launch_dir = tmp / f"fit{i}", tmp / f"launch{i}"
            fit_dir.mkdir()
            launch_dir.mkdir()
            fit_s = run(["fit", *common_args, f"--trainer.logger.init_args.save_dir={tmp / 'fit_logs'}"], fit_dir)
            before = loopback_bytes()
            launch_s = run(
                ["launch", "--pki", str(tmp / f"pki{i}"), *common_args,
                 f"--trainer.logger.init_args.save_dir={tmp / 'launch_logs'}"],
                launch_dir,
            )  # fmt: skip
            loopback = loopback_bytes() - before
            fit = json.loads((fit_dir / "fit.json").read_text())
            parties = {p.stem: json.loads(p.read_text()) for p in sorted(launch_dir.glob("*.json"))}
            rounds.append((fit_s, launch_s, loopback, fit, parties))
    report(args, rounds, simulated)


def report(args: argparse.Namespace, rounds: list, simulated_fit: dict) -> None:
    """Print the medians over the rounds side by side (each round: one fit, then one launch)."""
    from benchmarks.common import machine

    active = min(rounds[0][4])  # party0 in the configs here
    equal = []
    for _, _, _, fit, parties in rounds:
        sent = {(s, d, t): n for name, r in parties.items() for s, d, t, n in r["ledger"] if s == name}
        equal.append(sent == {(s, d, t): n for s, d, t, n in fit["ledger"]})
    _, _, _, fit, parties = rounds[0]
    ledger = sum(n for name, r in parties.items() for s, _, _, n in r["ledger"] if s == name)
    envelope = sum(n for name, r in parties.items() for src, _, _, n in r["envelope"] if src == name)

    def median(values: list[float]) -> float:
        return statistics.median(values)

    step_fit = [median(f["steps"][1:]) for _, _, _, f, _ in rounds]
    step_launch = [median(p[active]["steps"][1:]) for _, _, _, _, p in rounds]
    ratios = [b / a for a, b in zip(step_fit, step_launch, strict=True)]
    step_sim = median(simulated_fit["simulated_steps"][1:])
    fit_s, launch_s = median([r[0] for r in rounds]), median([r[1] for r in rounds])
    loopback = median([r[2] for r in rounds])
    cpu_fit = median([median(f["cpu"][1:]) for _, _, _, f, _ in rounds]) * 1e3
    cpu = {name: median([median(r[4][name]["cpu"][1:]) for r in rounds]) * 1e3 for name in parties}
    batch = "the config's batch size" if args.batch_size is None else f"batch {args.batch_size}"
    print(f"# lvfl launch vs lvfl fit: {args.config}, {len(parties)} parties, {args.epochs} epochs, {batch} "
          f"({len(fit['steps'])} steps), OMP_NUM_THREADS=1 in every process; {len(rounds)} "
          "rounds (a fit, then a launch), medians over the rounds")  # fmt: skip
    print(f"# {machine()}")
    print(f"ledgers equal, tag by tag: {all(equal)} ({sum(equal)} of {len(equal)} rounds)")
    rows = zip(step_fit, step_launch, ratios, strict=True)
    each = [f"{a * 1e3:.2f} / {b * 1e3:.2f} ms ({r:.2f}x)" for a, b, r in rows]
    print(f"step of each round, fit / launch: {', '.join(each)}")
    print()
    print("| | lvfl fit (1 process) | lvfl launch (1 process per party) | ratio |")
    print("|---|---|---|---|")
    print(f"| median training step | {median(step_fit) * 1e3:.2f} ms | {median(step_launch) * 1e3:.2f} ms | "
          f"{median(ratios):.2f}x |")  # fmt: skip
    print(f"| whole command (start-up included) | {fit_s:.1f} s | {launch_s:.1f} s | {launch_s / fit_s:.2f}x |")
    simulated = f"{step_sim * 1e3:.2f} ms (predicted from the fit)"
    measured = f"{median(step_launch) * 1e3:.2f} ms (measured)"
    print(f"| NetworkSimulator's step, loopback link | {simulated} | {measured} | "
          f"{median(step_launch) / step_sim:.2f}x |")  # fmt: skip
    per_party = ", ".join(f"{n} {t:.2f}" for n, t in cpu.items())
    print(f"| CPU time per step (every thread) | {cpu_fit:.2f} ms | {per_party} ms (sum {sum(cpu.values()):.2f}) | "
          f"{sum(cpu.values()) / cpu_fit:.2f}x |")  # fmt: skip
    print()
    print("| bytes | count | over the ledger |")
    print("|---|---|---|")
    print(f"| ledger (payload bytes sent, every party) | {ledger:,} | 1.000 |")
    print(f"| protobuf envelopes (header, schema, raw buffers) | {envelope:,} | {envelope / ledger:.3f} |")
    print(f"| loopback interface during the launch (HTTP/2, TLS, TCP/IP) | {loopback:,.0f} | {loopback / ledger:.3f} |")


if __name__ == "__main__":
    main()
