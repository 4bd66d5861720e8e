"""Communication time under the EASTER paper's network settings: Figs. 4-5 (bandwidth, latency) and Table VII.

.venv/bin/python -m benchmarks.perf.network [--epochs 3] [--datasets digits fmnist] [--rows 1000] [--out docs/results]

Each (protocol, dataset) trains once with a `NetworkSimulator(keep_trace=True)`; the kept trace (every message of
every training step, with the compute between them) is then replayed under each network setting
(`NetworkSimulator.replay`), so a sweep costs no retraining. The protocols are EASTER, SplitNN (Pyvertical) and
AggVFL, each on the same pieces as `lvfl bench` composes them: `digits` (scikit-learn's digits, 4 parties,
`configs/data/digits.yaml`) and `fmnist` (the paper's FMNIST setting, `configs/paper/data/fmnist.yaml` with
`configs/paper/parties/small.yaml`, on stand-in files in FMNIST's real format, `--rows` images per split: no
download here, so its accuracy means nothing and its bytes and compute are those of the paper's models).

- Fig. 4 shape: communication time of the run (set-up plus every training step's critical path, no compute)
  against bandwidth, every party's link at the same rate and 10 ms one-way latency.
- Fig. 5 shape: the same at 50 Mbps (the paper's fixed bandwidth) against one-way latency, through the paper's
  bands (low 1-30 ms, medium 30-50 ms, high 50-100 ms).
- Table VII shape: EASTER with the passive parties A, B, C (party1..party3) each a high- (1) or low-performance (0)
  device (`lvfl.network.DEVICE_CLASSES`), the active party a high-performance one: simulated wall time of the run
  (communication and compute, the low device computing 4x slower). Accuracy is the run's: the simulator times a
  synchronous protocol and does not change what it computes, so it is the same in every row (as the paper finds).

Plots go to `--out` (network_bandwidth.png, network_latency.png); the tables are printed in Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, quiet
from lvfl.callbacks import NetworkSimulator
from lvfl.commands.fit import build_cli, run_args
from lvfl.network import DEVICE_CLASSES, LinkProfile

PROTOCOLS = {"EASTER": "easter", "SplitNN": "splitnn", "AggVFL": "aggvfl"}
BANDWIDTHS = [10, 20, 50, 100, 200, 500, 1000]  # Mbps
LATENCIES = [1, 15.5, 30, 40, 50, 75, 100]  # ms one way; the paper's bands: low 1-30, medium 30-50, high 50-100
DEVICE_ROWS = ["111", "110", "100", "000"]  # Table VII: A B C, 1 = high-performance, 0 = low-performance
REPO = Path(__file__).resolve().parents[2]


def pieces(dataset: str, protocol: str) -> list[str]:
    """The `--config` files of a protocol on a dataset, composed as `lvfl bench` does."""
    if dataset == "fmnist":
        data, parties = "configs/paper/data/fmnist.yaml", "configs/paper/parties/small.yaml"
    else:
        data, parties = f"configs/data/{dataset}.yaml", f"configs/parties/{dataset}.yaml"
    own = REPO / "configs" / "protocols" / protocol / f"{dataset}.yaml"
    piece = own if own.is_file() else own.with_name("default.yaml")
    return [str(REPO / data), str(piece), str(REPO / parties)]


def run(dataset: str, protocol: str, epochs: int, root: Path | None, rows: int) -> tuple[NetworkSimulator, dict]:
    """Fit and test one (protocol, dataset) with a trace-keeping simulator; the simulator and the test metrics."""
    overrides = [f"--trainer.max_epochs={epochs}"]
    if root is not None:
        overrides += [f"--data.init_args.root={root}", f"--data.init_args.max_rows={rows}"]
    sim = {"class_path": "lvfl.callbacks.NetworkSimulator", "init_args": {"keep_trace": True, "print_summary": False}}
    with tempfile.TemporaryDirectory() as tmp:
        cli = build_cli(run_args(pieces(dataset, protocol), 0, tmp, overrides, callbacks=[sim]), run=False)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        (metrics,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
        (simulator,) = [c for c in cli.trainer.callbacks if isinstance(c, NetworkSimulator)]
        return simulator, {**metrics, "parties": cli.model.party_names, "active": cli.model.active}


def comm_time(sim: NetworkSimulator, parties: list[str], link: LinkProfile) -> float:
    """Set-up plus the training steps' communication on their critical paths, every party on `link`."""
    replayed = sim.replay(dict.fromkeys(parties, link))
    return replayed["setup"] + replayed["comm"]


def plot(results: dict, xs: list[float], key: str, xlabel: str, path: Path, log: bool) -> None:
    """One panel per dataset, one line per protocol."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({d for d, _ in results})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for protocol in PROTOCOLS:
            if (dataset, protocol) in results:
                ax.plot(xs, results[(dataset, protocol)][key], marker="o", label=protocol)
        ax.set_title(dataset)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("communication time (s)")
        if log:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    """Train each (protocol, dataset) once, replay its trace under every setting, print the tables, save the plots."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["digits", "fmnist"])
    parser.add_argument("--rows", type=int, default=1000, help="stand-in images per split for fmnist")
    parser.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = parser.parse_args()
    quiet()
    results: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        for dataset in args.datasets:
            root = None
            if dataset == "fmnist":
                from lvfl.datamodules import FashionMNIST

                root = Path(data_dir) / "fmnist"
                FashionMNIST.write_stand_in(root, args.rows, seed=0)
            for label, protocol in PROTOCOLS.items():
                t0 = time.perf_counter()
                sim, metrics = run(dataset, protocol, args.epochs, root, args.rows)
                parties = metrics["parties"]
                bandwidth = [comm_time(sim, parties, LinkProfile(b, b, 10.0)) for b in BANDWIDTHS]
                latency = [comm_time(sim, parties, LinkProfile(50.0, 50.0, lat)) for lat in LATENCIES]
                devices = {}
                for row in DEVICE_ROWS:
                    classes = {metrics["active"]: "high"}
                    passive = [p for p in parties if p != metrics["active"]]
                    classes |= {p: "high" if bit == "1" else "low" for p, bit in zip(passive, row, strict=False)}
                    links = {p: DEVICE_CLASSES[c].link for p, c in classes.items()}
                    scale = {p: DEVICE_CLASSES[c].compute_scale for p, c in classes.items()}
                    devices[row] = sim.replay(links, scale)["wall"]
                results[(dataset, label)] = {
                    "bandwidth": bandwidth,
                    "latency": latency,
                    "devices": devices,
                    "acc": metrics.get("test/acc/mean", float("nan")),
                    "steps": sim.steps,
                    "mb": sum(m.nbytes for p in sim.trace for m in p.schedule) / 1e6,
                }
                print(f"done {label} on {dataset} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(
        results, BANDWIDTHS, "bandwidth", "bandwidth (Mbps), 10 ms one-way latency", out / "network_bandwidth.png", True
    )
    plot(results, LATENCIES, "latency", "one-way latency (ms) at 50 Mbps", out / "network_latency.png", False)

    print(f"\n{args.epochs} epochs per run, seed 0 ({machine()})")
    print("\nCommunication time (s) of the run against bandwidth (10 ms one-way latency): Fig. 4's shape\n")
    print("| dataset | protocol | steps | MB | " + " | ".join(f"{b} Mbps" for b in BANDWIDTHS) + " |")
    print("|---|---|---|---|" + "---|" * len(BANDWIDTHS))
    for (dataset, label), r in results.items():
        cells = " | ".join(f"{t:.2f}" for t in r["bandwidth"])
        print(f"| {dataset} | {label} | {r['steps']} | {r['mb']:.1f} | {cells} |")
    print("\nCommunication time (s) against one-way latency at 50 Mbps: Fig. 5's shape (bands: low <= 30 ms, ")
    print("medium 30-50 ms, high 50-100 ms)\n")
    print("| dataset | protocol | " + " | ".join(f"{lat:g} ms" for lat in LATENCIES) + " |")
    print("|---|---|" + "---|" * len(LATENCIES))
    for (dataset, label), r in results.items():
        print(f"| {dataset} | {label} | " + " | ".join(f"{t:.2f}" for t in r["latency"]) + " |")
    print("\nEASTER on heterogeneous devices: Table VII's shape (A B C = party1..3; 1 high-, 0 low-performance)\n")
    print("| dataset | A | B | C | test acc (mean of party models) | simulated wall time (s) | vs all high |")
    print("|---|---|---|---|---|---|---|")
    for (dataset, label), r in results.items():
        if label != "EASTER":
            continue
        base = r["devices"]["111"]
        for row, wall in r["devices"].items():
            print(f"| {dataset} | {' | '.join(row)} | {r['acc']:.4f} | {wall:.2f} | {wall / base:.2f}x |")
    ratios = [r["bandwidth"][0] / r["bandwidth"][-1] for r in results.values()]
    print(f"\n10 Mbps vs 1 Gbps: communication {statistics.mean(ratios):.1f}x longer on average")


if __name__ == "__main__":
    main()
