"""C = 2..10 parties: accuracy, time per epoch, peak memory and bytes per step (EASTER Table VI's shape).

.venv/bin/python -m benchmarks.perf.scaling [--grid configs/bench/scaling.yaml] [--force]

Runs (or reuses) the grid `configs/bench/scaling.yaml` with `lvfl bench`'s machinery (each cell in its own
process: its peak RSS is its own; on a CUDA host the cells also record `torch.cuda.max_memory_allocated`), then
prints one table per figure with a column per C, and how each cost grows with C:

- bytes per training step (set-up excluded) and the set-up bytes (the DH key exchange: K public keys up and
  K (K - 1) relayed down, 32 bytes each, for K = C - 1 passive parties);
- how each cost grows with the number of passive parties K = C - 1: the exponent e of the least-squares fit
  value ~ K^e (1: linear, 2: quadratic), for bytes per step, set-up bytes and seconds per epoch, and for the
  pairwise masks alone (DHMasking's protect and combine for one step, timed here for K = 2..9: every passive party
  draws K - 1 masks, K (K - 1) mask streams a step).

DHMasking needs two passive parties, so its C = 2 cells fail by design (the table says so); C-VFL concatenates and
has no masked variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from benchmarks.common import machine, quiet
from lvfl.commands import bench

REPO = Path(__file__).resolve().parents[2]


def steps_per_epoch(num_parties: int) -> int:
    """Training steps of one epoch of the grid's data (breast cancer, batch 32)."""
    from lvfl.datamodules import BreastCancer

    dm = BreastCancer(num_parties=num_parties, batch_size=32, seed=0)
    dm.setup("fit")
    return len(dm.train_dataloader())


def exponent(ks: list[int], values: list[float]) -> float:
    """The least-squares slope of log(value) against log(K): about 1 for a cost linear in K, 2 for a quadratic one."""
    pairs = [(k, v) for k, v in zip(ks, values, strict=True) if v and v > 0]
    if len(pairs) < 2:
        return float("nan")
    return float(np.polyfit(np.log([k for k, _ in pairs]), np.log([v for _, v in pairs]), 1)[0])


def mask_seconds(passive: int, rows: int = 128, dim: int = 128, reps: int = 21) -> float:
    """Median seconds of one step of DHMasking (every passive party's protect, the active party's combine)."""
    import time

    import torch

    from lvfl.parties import PartySpec
    from lvfl.privacy import DHMasking
    from lvfl.wire import Wire

    parties = [PartySpec("a", "active", (1,))] + [PartySpec(f"p{i}", "passive", (1,), i) for i in range(1, passive + 1)]
    backend = DHMasking()
    backend.setup(parties, "a", Wire())
    x, zero = torch.randn(rows, dim), torch.zeros(rows, dim)
    times = []
    for step in range(reps):
        started = time.perf_counter()
        backend.combine(zero, {p.name: backend.protect(p.name, x, step=step) for p in parties[1:]})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    """Run the grid, print the Table VI pivot and the growth fits."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grid", default=str(REPO / "configs" / "bench" / "scaling.yaml"))
    parser.add_argument("--force", action="store_true", help="rerun finished cells")
    args = parser.parse_args()
    quiet()
    grid = bench.load_grid(args.grid)
    outcome = bench.run_grid(grid, force=args.force, keep_going=True)
    out = Path(grid.out)
    cs = {d: int(d.split("=")[1]) for d in grid.datasets}
    figures: dict[str, dict[str, dict[int, float | None]]] = {}
    errors: dict[tuple[str, int], str] = {}
    for cell in grid.cells():
        path = out / "cells" / cell.key / "result.json"
        c = cs[cell.dataset]
        row = figures.setdefault(cell.protocol, {})
        if not path.is_file() or cell in outcome.failures:
            errors[(cell.protocol, c)] = outcome.failures.get(cell, "no result")
            continue
        r = json.loads(path.read_text())
        steps = steps_per_epoch(c) * len(r["history"]["train_bytes"])
        row.setdefault("acc", {})[c] = r["test"]["test/acc/mean"]
        row.setdefault("s_epoch", {})[c] = float(np.median(r["epoch_seconds"]))
        row.setdefault("rss", {})[c] = r["peak_rss_mib"]
        row.setdefault("gpu", {})[c] = r.get("peak_gpu_mib")
        row.setdefault("kb_step", {})[c] = sum(r["history"]["train_bytes"]) / steps / 1e3
        row.setdefault("setup_kb", {})[c] = r["history"]["setup_bytes"] / 1e3
    columns = sorted(set(cs.values()))
    print(f"\nScaling with the number of parties C ({machine()}); grid {args.grid}, 10 epochs, seed 0\n")
    titles = {
        "acc": ("test accuracy (mean of party models, best val epoch)", ".4f"),
        "s_epoch": ("seconds per training epoch (median)", ".3f"),
        "rss": ("peak RSS of the cell's process (MiB)", ".0f"),
        "gpu": ("peak CUDA memory allocated (MiB)", ".0f"),
        "kb_step": ("kB on the wire per training step (validation and set-up excluded)", ".2f"),
        "setup_kb": ("kB of set-up traffic (key exchange)", ".3f"),
    }
    for key, (title, spec) in titles.items():
        if key == "gpu" and not any(v for p in figures.values() for v in p.get("gpu", {}).values()):
            continue
        print(f"\n{title}\n")
        print("| protocol | " + " | ".join(f"C = {c}" for c in columns) + " |")
        print("|---|" + "---|" * len(columns))
        for protocol, row in figures.items():
            cells = []
            for c in columns:
                value = row.get(key, {}).get(c)
                cells.append("failed" if (protocol, c) in errors else format(value, spec) if value is not None else "")
            print(f"| {protocol} | " + " | ".join(cells) + " |")
    print("\nGrowth with the number of passive parties K = C - 1: the exponent of the least-squares fit")
    print("value ~ K^e over the Cs each row has (1: linear in K, 2: quadratic)\n")
    print("| protocol | kB per step | set-up kB | s per epoch |")
    print("|---|---|---|---|")
    for protocol, row in figures.items():
        cells = []
        for key in ("kb_step", "setup_kb", "s_epoch"):
            points = sorted(row.get(key, {}).items())
            e = exponent([c - 1 for c, _ in points], [v for _, v in points])
            cells.append("–" if e != e else f"{e:.2f}")
        print(f"| {protocol} | " + " | ".join(cells) + " |")
    ks = [1, 2, 3, 5, 7, 9]
    masks = [mask_seconds(k) for k in ks if k >= 2]
    ks = [k for k in ks if k >= 2]
    print("\nDHMasking alone, one step (every passive party protects a 128 x 128 embedding, the active party")
    timings = ", ".join(f"K = {k}: {1e3 * t:.2f} ms" for k, t in zip(ks, masks, strict=True))
    print(f"combines), median of 21: {timings};")
    print(f"exponent {exponent(ks, masks):.2f} (each of the K parties draws K - 1 masks: K (K - 1) streams a step)")
    reasons: dict[str, list[str]] = {}
    for (protocol, c), reason in sorted(errors.items()):
        reasons.setdefault(reason, []).append(f"{protocol} at C = {c}")
    for reason, where in reasons.items():
        print(f"\nfailed, {', '.join(where)}: {reason}")


if __name__ == "__main__":
    main()
