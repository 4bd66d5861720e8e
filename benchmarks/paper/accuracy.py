"""Per-party test accuracy (mean +- std over seeds) of the EASTER configs and the Local config.

Every config with a protecting backend (DHMasking, Paillier, CKKS) also runs with `Plain` on the same seeds, so
the table shows what the protection costs in accuracy (the HE backends' check: within 0.5 points of Plain).

.venv/bin/python -m benchmarks.paper.accuracy [--seeds 0 1 2] [--configs configs/easter/digits.yaml ...]
.venv/bin/python -m benchmarks.paper.accuracy --seeds 0 --configs configs/easter/digits_ckks.yaml \
    configs/easter/breast_cancer_paillier.yaml
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import machine, quiet, run_config

PROTECTING_BACKENDS = ("DHMasking", "Paillier", "CKKS")
DEFAULT_CONFIGS = [
    "configs/easter/digits.yaml",
    "configs/easter/digits_local.yaml",
    "configs/easter/digits_hetero_optim.yaml",
    "configs/easter/breast_cancer.yaml",
    "configs/easter/wine.yaml",
    "configs/easter/diabetes.yaml",
]


def fmt(values: list[float]) -> str:
    """mean +- std (sample std; 0 for one seed)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def main() -> None:
    """Run every config for every seed and print one Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--no-plain", action="store_true", help="no Plain rows for protected configs")
    args = parser.parse_args()
    quiet()
    cells_to_run = []
    for config in args.configs:
        cells_to_run.append((config, config, []))
        text = Path(config).read_text()
        if not args.no_plain and any(f"lvfl.privacy.{b}" in text for b in PROTECTING_BACKENDS):
            cells_to_run.append((f"{config} + Plain", config, ["--model.aggregation=lvfl.privacy.Plain"]))
    rows = []
    for label, config, overrides in cells_to_run:
        runs, t0 = [], time.perf_counter()
        for seed in args.seeds:
            runs.append(run_config(config, seed, overrides))
        parties = sorted(
            {k.split("/")[-1] for r in runs for k in r if k.startswith("test/acc/") and k != "test/acc/mean"}
        )
        cells = {p: fmt([r[f"test/acc/{p}"] for r in runs]) for p in parties}
        cells["worst"] = f"{min(r[f'test/acc/{p}'] for r in runs for p in parties):.4f}"
        mean = fmt([r["test/acc/mean"] for r in runs])
        mb = statistics.mean(r["wire_bytes"] for r in runs) / 1e6
        rows.append((label, cells, mean, mb, (time.perf_counter() - t0) / len(runs)))
        print(f"done {label}: mean {mean}", file=sys.stderr, flush=True)
    width = max(len(c) for c, *_ in rows)
    all_parties = sorted({p for _, cells, *_ in rows for p in cells} - {"worst"}) + ["worst"]
    print(f"\nTest accuracy, mean ± std over seeds {args.seeds} ({machine()})\n")
    print(f"| {'config':<{width}} | " + " | ".join(all_parties) + " | mean of parties | MB on wire | s/run |")
    print(f"|{'-' * (width + 2)}|" + "|".join("---" for _ in all_parties) + "|---|---|---|")
    for config, cells, mean, mb, secs in rows:
        line = " | ".join(cells.get(p, "–") for p in all_parties)
        print(f"| {config:<{width}} | {line} | {mean} | {mb:.2f} | {secs:.1f} |")


if __name__ == "__main__":
    main()
