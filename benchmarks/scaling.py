"""C = 2..10 parties: accuracy, time per epoch, peak memory and bytes per step (EASTER Table VI's shape).

.venv/bin/python benchmarks/scaling.py [--grid configs/bench/scaling.yaml] [--force]

Runs (or reuses) the grid `configs/bench/scaling.yaml` with `lvfl bench`'s machinery (each cell in its own
process: its peak RSS is its own; on a CUDA host the cells also record `torch.cuda.max_memory_allocated`), then
prints one table per figure with a column per C, and how each cost grows with C:

- bytes per training step (set-up excluded) and the set-up bytes (the DH key exchange: K public keys up and
  K (K - 1) relayed down, 32 bytes each, for K = C - 1 passive parties);
- the least-squares fit of bytes per step and of seconds per epoch to a + b C + c C^2, with the share of the
  quadratic term at C = 10, which says whether a cost is linear in C (models, embeddings) or quadratic (pairwise
  masks: every passive party draws K - 1 masks per step).

DHMasking needs two passive parties, so its C = 2 cells fail by design (the table says so); C-VFL concatenates and
has no masked variant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, quiet  # noqa: E402

from lvfl import bench  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def steps_per_epoch(num_parties: int) -> int:
    """Training steps of one epoch of the grid's data (breast cancer, batch 32)."""
    from lvfl.datamodules import BreastCancer

    dm = BreastCancer(num_parties=num_parties, batch_size=32, seed=0)
    dm.setup("fit")
    return len(dm.train_dataloader())


def quadratic_share(cs: list[int], values: list[float]) -> tuple[np.ndarray, float]:
    """Coefficients (a, b, c) of the least-squares fit a + b C + c C^2, and c C^2 / fit at the largest C."""
    coeffs = np.polyfit(np.asarray(cs, dtype=float), np.asarray(values, dtype=float), 2)[::-1]
    top = max(cs)
    fitted = coeffs[0] + coeffs[1] * top + coeffs[2] * top**2
    return coeffs, float(coeffs[2] * top**2 / fitted) if fitted else float("nan")


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
    print("\nGrowth with C: least-squares a + b C + c C^2, and the quadratic term's share of the fit at C = 10\n")
    print("| protocol | figure | a | b | c | c C^2 share at C = 10 |")
    print("|---|---|---|---|---|---|")
    for protocol, row in figures.items():
        for key in ("kb_step", "s_epoch"):
            points = sorted(row.get(key, {}).items())
            if len(points) < 3:
                continue
            coeffs, share = quadratic_share([c for c, _ in points], [v for _, v in points])
            cells = " | ".join(f"{x:.4g}" for x in coeffs)
            print(f"| {protocol} | {titles[key][0].split(' (')[0]} | {cells} | {100 * share:.1f}% |")
    for (protocol, c), reason in sorted(errors.items()):
        print(f"\n{protocol} at C = {c}: {reason}")


if __name__ == "__main__":
    main()
