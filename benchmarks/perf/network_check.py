"""`NetworkSimulator` checked against a real delayed network: launched epochs through the link proxy beside the
simulator's prediction for the same profile and config, in one run.

    .venv/bin/python -m benchmarks.perf.network_check [--profiles lan wan] [--protocols easter splitnn easter-local4]
        [--parties 2 4] [--epochs 5] [--repeats 3]

For each profile (a `lvfl.network.LINK_PRESETS` name, every party on it), protocol and party count:

- **simulated**: `lvfl fit` of the config with `NetworkSimulator(links=profile)`; its epoch time is the simulator's
  (`sim/epoch_time`: every training step's messages replayed over the links, with the compute the fit measured);
- **measured**: `lvfl launch --network profile` of the same config: every party its own process, their connections
  through `lvfl.federation.link_proxy.LinkProxy`, which delays and paces them as the profile's links would; its epoch
  time is the active party's wall time from the start to the end of each training epoch;
- the simulator twice: the links alone, and with each message's processing at both ends (`NetworkSimulator`'s
  `message_ms`: `--message_ms`, or by default a quarter of lvfl's localhost round trip measured at the start of the
  run, `benchmarks/perf/transport_latency.py`'s lvfl pair on digits EASTER's 128 x 64 tensor);
- the simulator a third time with the compute of the launch: a launched process runs the whole protocol (the other
  parties' parts as shadows) and its own Lightning loop, on cores it shares with the other parties, which the
  in-process fit that the simulator times compute from does not; and the proxy's own hops (two localhost
  connections and its threads' hand-offs for each chunk) cost time no network model holds. So the script also
  launches the config through the proxy on `unlimited` links (1 Tbps, no latency: the launch and the proxy, no
  network), finds the factor on the fit's measured compute (`compute_scale`, every party alike) at which the
  simulator on those links with the same processing gives that launch's epoch, and replays the fit's trace over
  the profile's links with it: the simulator's network model, on the deployment's compute;
- their ratios (measured / simulated): a launch's epoch is the median over its epochs after the first (the first
  holds one-time work in both runs: the proxy's TLS handshakes, the allocator's first pages), and a cell's the median
  over `--repeats` launches (on this 2-core machine one launch's epochs can all be 40% slower than the next's);
- the bytes the proxy carried over the ledger's (`CommunicationMeter`'s payload bytes of the whole launch, set-up
  included): what TLS, HTTP/2, gRPC and lvfl's envelopes add.

Validation is off (`limit_val_batches=0`): the simulator times training traffic only. Every process has one torch
thread (`OMP_NUM_THREADS=1`, as `benchmarks/perf/federation_cost.py`). The configs: EASTER `configs/easter/digits.yaml`
(DH masking), SplitNN `configs/splitnn/digits_dh_sum.yaml` (DH masking, sum), cut to their first N parties;
`easter-local4` is EASTER under `schedule: local_updates` (4 updates per exchange, batch 4 x 128),
`easter-pipelined4` under `schedule: pipelined` (the same, each exchange's halves riding with its neighbours').
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
CONFIGS = {
    "easter": "configs/easter/digits.yaml",
    "easter-local4": "configs/easter/digits.yaml",
    "splitnn": "configs/splitnn/digits_dh_sum.yaml",
    "easter-pipelined4": "configs/easter/digits.yaml",
}
#: each protocol's options beyond its config: EASTER's latency-hiding schedule, 4 updates per exchange of 4 x 128
OPTIONS = {
    "easter-local4": [
        "--model.init_args.schedule=local_updates",
        "--model.init_args.local_updates=4",
        "--data.init_args.batch_size=512",
    ],
    "easter-pipelined4": [
        "--model.init_args.schedule=pipelined",
        "--model.init_args.local_updates=4",
        "--data.init_args.batch_size=512",
    ],
}


#: the factors on the fit's measured compute that the simulator is replayed at, to match a localhost launch's epoch
SCALES = tuple(round(0.5 * 1.1**i, 4) for i in range(40))  # 0.5 to 20.6, 10% apart


class EpochClock(Callback):
    """Writes this process's training epoch times, the simulator's, and its ledger to $LVFL_CHECK_DIR/<party>.json."""

    def __init__(self) -> None:
        self.epochs: list[float] = []
        self.simulated: dict[str, list[float]] = {}  # per simulator, by its message_ms
        self.scaled: list[dict[str, list[float]]] = []  # per epoch: free links and the profile's at each of SCALES
        self._started = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:  # noqa: D102
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: D102
        from lvfl.callbacks import NetworkSimulator

        self.epochs.append(time.perf_counter() - self._started)
        for callback in trainer.callbacks:  # listed before this one: its epoch is closed
            if isinstance(callback, NetworkSimulator):
                self.simulated.setdefault("processed", []).append(callback._epoch_s)  # noqa: SLF001 - sim/epoch_time
                self.simulated.setdefault("links only", []).append(self.replayed(callback, trainer.current_epoch))
                self.scaled.append(self.rescaled(callback, trainer.current_epoch))

    @staticmethod
    def replayed(simulator, epoch: int, message_s: float = 0.0, factor: float = 1.0, links=None) -> float:  # noqa: ANN001
        """The simulator's epoch replayed from its trace with `message_s` of processing a message, its compute
        times `factor`, over `links` (default the run's)."""
        from lvfl.network import simulate

        links = links or simulator._links  # noqa: SLF001 - the run's own profiles
        scale = {party: factor * simulator._scale.get(party, 1.0) for party in links}  # noqa: SLF001
        return sum(
            simulate(p.schedule, links, scale, p.tail_s, seed=simulator.seed + i, message_s=message_s).step_s
            for i, p in enumerate(simulator.trace)
            if p.epoch == epoch and p.kind != "setup"
        )

    def rescaled(self, simulator, epoch: int) -> dict[str, list[float]]:  # noqa: ANN001
        """The epoch replayed at each of SCALES, on `unlimited` links and on the run's, with the run's processing."""
        from lvfl.network import LINK_PRESETS

        free = dict.fromkeys(simulator._links, LINK_PRESETS["unlimited"])  # noqa: SLF001
        message_s = simulator.message_s
        return {
            "free": [self.replayed(simulator, epoch, message_s, f, free) for f in SCALES],
            "links": [self.replayed(simulator, epoch, message_s, f) for f in SCALES],
        }

    def on_fit_end(self, trainer, pl_module) -> None:  # noqa: D102
        wire = pl_module.wire
        sent = sum(n for (src, _, _), n in wire.bytes.items() if wire.here in (None, src))  # a party: what it sent
        record = {"epochs": self.epochs, "simulated": self.simulated, "scaled": self.scaled, "ledger": sent}
        Path(os.environ["LVFL_CHECK_DIR"], f"{wire.here or 'fit'}.json").write_text(json.dumps(record))


def run(command: list[str], out: Path) -> str:
    """`python -m lvfl COMMAND` with the clock, one torch thread per process; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LVFL_CHECK_DIR": str(out), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *command], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def carried(stdout: str) -> int:
    """The bytes `lvfl launch --network` says its proxy carried."""
    (line,) = [line for line in stdout.splitlines() if " network carried " in line]
    return int(line.split(" network carried ")[1].split(" bytes")[0].replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["lan", "wan"])
    parser.add_argument("--protocols", nargs="+", default=["easter", "splitnn"], choices=list(CONFIGS))
    parser.add_argument("--parties", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--repeats", type=int, default=3, help="launches of each cell (the median is taken: a launch's epochs move "
        "together with the machine's state)"
    )  # fmt: skip
    parser.add_argument(
        "--message_ms",
        type=float,
        default=None,
        help="each message's processing at each end for the simulator (ms); default: measured in this run, a "
        "quarter of lvfl's localhost round trip (benchmarks/perf/transport_latency.py's lvfl pair)",
    )
    args = parser.parse_args()
    from benchmarks.common import machine
    from benchmarks.perf.federation_cost import first_parties

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.message_ms is None:
            args.message_ms = round(round_trip(tmp / "round_trip") * 1e3 / 4, 4)
        print(f"# per-message processing at each end: {args.message_ms} ms", file=sys.stderr, flush=True)
        for protocol in args.protocols:
            for count in args.parties:
                config = str(first_parties(Path(CONFIGS[protocol]), count, tmp))
                common = [
                    "--config", config, f"--trainer.max_epochs={args.epochs}", "--trainer.limit_val_batches=0",
                    "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
                    *OPTIONS.get(protocol, []),
                ]  # fmt: skip
                unlimited, _, _ = launch_epoch("unlimited", common, tmp / f"{protocol}_{count}_unlimited", args.repeats)
                for profile in args.profiles:
                    cell = tmp / f"{protocol}_{count}_{profile}"
                    fit_dir = cell / "fit"
                    fit_dir.mkdir(parents=True)
                    simulator = {  # with each message's processing; the trace gives the links alone too
                        "class_path": "lvfl.callbacks.NetworkSimulator",
                        "init_args": {
                            "links": profile, "print_summary": False, "message_ms": args.message_ms, "keep_trace": True,
                        },
                    }  # fmt: skip
                    run(
                        ["fit", *common, f"--trainer.callbacks+={json.dumps(simulator)}",
                         '--trainer.callbacks+={"class_path": "benchmarks.perf.network_check.EpochClock"}',
                         f"--trainer.logger.init_args.save_dir={cell / 'fit_logs'}"],
                        fit_dir,
                    )  # fmt: skip
                    measured, socket_bytes, ledger = launch_epoch(profile, common, cell / "launch", args.repeats)
                    fit = json.loads((fit_dir / "fit.json").read_text())
                    rows.append((profile, protocol, count, fit, measured, socket_bytes, ledger, unlimited))
                    print(f"# done: {profile} {protocol} {count} parties", file=sys.stderr, flush=True)
    report(args, rows, machine())


def launch_epoch(network: str, common: list[str], folder: Path, repeats: int) -> tuple[float, int, int]:
    """The median over `repeats` launches through the proxy on `network` of each one's median epoch (the epochs
    after the first), and the last launch's socket bytes and ledger."""
    epochs = []
    for i in range(repeats):
        out = folder / f"launch{i}"
        out.mkdir(parents=True)
        stdout = run(
            ["launch", "--network", network, *common,
             '--trainer.callbacks+={"class_path": "benchmarks.perf.network_check.EpochClock"}',
             f"--trainer.logger.init_args.save_dir={out / 'logs'}"],
            out,
        )  # fmt: skip
        record = json.loads((out / "party0.json").read_text())
        epochs.append(statistics.median(record["epochs"][1:] or record["epochs"]))
        ledger = sum(json.loads(p.read_text())["ledger"] for p in out.glob("*.json"))
    return statistics.median(epochs), carried(stdout), ledger


def round_trip(folder: Path, messages: int = 300) -> float:
    """lvfl's median round trip (s) of digits EASTER's message (128 x 64 float32) between two fresh processes."""
    from benchmarks.perf.transport_latency import pair
    from lvfl.federation.federation_file import write_federation
    from lvfl.federation.pki import write_test_pki

    write_test_pki(folder, ["a", "b"])
    federation = write_federation(folder / "federation.yaml", ["a", "b"])
    shape = argparse.Namespace(messages=messages, rows=128, cols=64)
    return pair("lvfl", federation.path, shape, folder / "times.json")


def report(args: argparse.Namespace, rows: list, machine: str) -> None:
    """One row per profile, protocol and party count: measured and simulated epoch, their ratio, socket bytes."""
    print(f"# NetworkSimulator against the link proxy: {args.epochs} epochs, validation off, one torch thread each; "
          f"per-message processing {args.message_ms} ms at each end")  # fmt: skip
    print(f"# {machine}")
    print()
    print("| profile | protocol | parties | measured epoch (s) | simulated, links only (s) | ratio "
          f"| simulated, + {args.message_ms} ms a message at each end (s) | measured / simulated "
          "| launched on `unlimited` (s) | compute factor | simulated, launch's compute (s) | measured / simulated "
          "| socket bytes / ledger |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for profile, protocol, count, fit, measured, socket_bytes, ledger, unlimited in rows:
        links_only, processed = (
            statistics.median(fit["simulated"][key][1:] or fit["simulated"][key]) for key in ("links only", "processed")
        )
        ratio = measured / processed
        factor, deployed = launch_compute(fit["scaled"][1:] or fit["scaled"], unlimited)
        print(f"| {profile} | {protocol} | {count} | {measured:.3f} | {links_only:.3f} | {measured / links_only:.3f} "
              f"| {processed:.3f} | {ratio:.3f} {mark(ratio)} | {unlimited:.3f} | {factor:.2f} | {deployed:.3f} "
              f"| {measured / deployed:.3f} {mark(measured / deployed)} "
              f"| {socket_bytes / ledger:.3f} ({socket_bytes:,} / {ledger:,}) |")  # fmt: skip


def mark(ratio: float) -> str:
    return "ok" if abs(ratio - 1) <= 0.15 else "MISSED"


def launch_compute(scaled: list[dict[str, list[float]]], unlimited: float) -> tuple[float, float]:
    """The factor on the fit's compute at which the simulator on `unlimited` links gives the launch's epoch there
    (interpolated between SCALES, the epochs' curves averaged), and the simulator's epoch on the profile's at it."""
    free, links = ([statistics.mean(curve) for curve in zip(*(e[key] for e in scaled), strict=True)]
                   for key in ("free", "links"))  # fmt: skip
    if not free[0] <= unlimited <= free[-1]:
        raise SystemExit(f"the launch's epoch on unlimited links, {unlimited:.3f} s, is outside the simulator's range "
                         f"at factors {SCALES[0]}-{SCALES[-1]} ({free[0]:.3f}-{free[-1]:.3f} s)")  # fmt: skip
    i = next(i for i in range(1, len(SCALES)) if free[i] >= unlimited)
    w = (unlimited - free[i - 1]) / (free[i] - free[i - 1])
    return SCALES[i - 1] + w * (SCALES[i] - SCALES[i - 1]), links[i - 1] + w * (links[i] - links[i - 1])


if __name__ == "__main__":
    main()
