"""PraVFed's privacy-budget ablation in the shape of its Tables V and VI, from a finished `lvfl bench` grid.

.venv/bin/lvfl bench configs/bench/pravfed_epsilon.yaml          # runs (or reuses) the 90 cells
.venv/bin/python -m benchmarks.paper.epsilon_table [docs/results/pravfed_epsilon/results.csv]

Rows: epsilon; columns: dataset x aggregation (weighted = accuracy-weighted, Eq. 8/9; average = plain mean);
cells: test accuracy of the active party's model (mean +- std over seeds), at the best-validation checkpoint (the
bench's evaluation rule), then the difference weighted - average per epsilon.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict

LABEL = re.compile(r"^(weighted|average) eps=([0-9.]+)$")


def main() -> None:
    """Print the pivoted table of the grid's results.csv."""
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/results/pravfed_epsilon/results.csv"
    cells: dict[tuple[str, str, str], tuple[float, float]] = {}
    datasets: list[str] = []
    epsilons: set[str] = set()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            match = LABEL.match(row["protocol"])
            if match is None:
                continue
            weighting, eps = match.groups()
            epsilons.add(eps)
            if row["dataset"] not in datasets:
                datasets.append(row["dataset"])
            cells[(weighting, eps, row["dataset"])] = (float(row["acc_mean_mean"]), float(row["acc_mean_std"]))
    order = sorted(epsilons, key=float)
    head = [f"{d} {w}" for d in datasets for w in ("weighted", "average")]
    print("| ε | " + " | ".join(head) + " |")
    print("|---|" + "---|" * len(head))
    for eps in order:
        values = [cells.get((w, eps, d)) for d in datasets for w in ("weighted", "average")]
        print(f"| {eps} | " + " | ".join("–" if v is None else f"{v[0]:.4f} ± {v[1]:.4f}" for v in values) + " |")
    print("\nweighted - average (points):\n")
    print("| ε | " + " | ".join(datasets) + " |")
    print("|---|" + "---|" * len(datasets))
    gaps: dict[str, list[float]] = defaultdict(list)
    for eps in order:
        row = []
        for d in datasets:
            w, a = cells.get(("weighted", eps, d)), cells.get(("average", eps, d))
            if w is None or a is None:
                row.append("–")
                continue
            gaps[d].append(100 * (w[0] - a[0]))
            row.append(f"{100 * (w[0] - a[0]):+.2f}")
        print(f"| {eps} | " + " | ".join(row) + " |")
    means = [f"{sum(gaps[d]) / len(gaps[d]):+.2f}" if gaps[d] else "–" for d in datasets]
    print("| mean | " + " | ".join(means) + " |")


if __name__ == "__main__":
    main()
