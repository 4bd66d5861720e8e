"""VFLAIR's attack setting on real Fashion-MNIST: five attacks by the passive party, each under the active party's
gradient defenses, with attack performance (AP), main-task performance (MP) and VFLAIR's Defense Capability Score.

    .venv/bin/python -m benchmarks.data.fmnist_from_npm                                  # the files under data/
    .venv/bin/python -m benchmarks.paper.vflair_attacks [--epochs 30] [--out docs/results/vflair_fmnist.json]

These are VFLAIR's settings (its MNIST attack configs), not VFLAIR's numbers, run on Fashion-MNIST instead of MNIST:
2 parties, each a two-layer MLP (392 -> 32 -> 10 on half an image), Adam at lr 0.01, batch 1024, 30 epochs, the active
party summing the two parties' logits (Agg_VFL `aggregate: sum`, VFLAIR's global model with no trainable layer). The
pieces: `configs/paper/data/fmnist_vflair.yaml` + `configs/protocols/aggvfl/default.yaml` +
`configs/paper/parties/vflair_mlp2.yaml`. The attacks, all by party1 (the passive party):

- direct label inference (the sign of the gradient row it receives);
- passive model completion with 4 known labels per class (40);
- batch label inference, 10,000 Adam steps at lr 0.05 on the first batch of each epoch;
- the label-replacement backdoor, 1% of the training samples poisoned, 10 known samples of the target class;
- the noisy-sample backdoor, noise of standard deviation 2 on 1% of the samples.

The three label inferences read the run without changing it, so they share one run per defense; each backdoor alters
training and runs alone. AP is an inference's metric at the last epoch, and a backdoor's averaged over every epoch
(as VFLAIR reports it; the last epoch is printed beside it). MP is the run's validation accuracy (the aggregate, on
the tenth of the training images held out) at the last epoch. DCS = 1 / (1 + sqrt((1 - beta) (AP - AP*)^2 + beta
(MP* - MP)^2)), beta = 0.5, AP* = 0, MP* the undefended run's MP of the same attack, differences one-sided (a
defense that raises MP earns nothing), as `lvfl bench` scores it. epsilon: label DP of a sample's gradient row,
released once an epoch for the run's epochs, delta = 1e-5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import machine
from benchmarks.paper.attacks import Stopped, fit
from lvfl import attacks as library  # (the benchmark beside this one is `attacks` too)
from lvfl.commands.bench.report import attack_performance, dcs
from lvfl.privacy import GaussianNoise, LaplaceNoise

REPO = Path(__file__).resolve().parents[2]

PIECES = (
    "configs/paper/data/fmnist_vflair.yaml",
    "configs/protocols/aggvfl/default.yaml",
    "configs/paper/parties/vflair_mlp2.yaml",
)
#: the label inferences, run together (none changes the run); each with the metric its AP is
INFERENCES = [
    ({"class_path": "lvfl.attacks.DirectLabelInference"}, "accuracy"),
    ({"class_path": "lvfl.attacks.PassiveModelCompletion", "init_args": {"known_labels": 40}}, "accuracy"),
    ({"class_path": "lvfl.attacks.BatchLabelInference", "init_args": {"iterations": 10_000, "lr": 0.05}}, "accuracy"),
]
#: the backdoors (their defaults are VFLAIR's: 1% poisoned, 10 known target samples, noise 2), one run each
BACKDOORS = [
    ({"class_path": "lvfl.attacks.GradientReplacement"}, "success_rate"),
    ({"class_path": "lvfl.attacks.NoisySample"}, "accuracy_drop"),
]
#: the active party's gradient defenses at rising strength (`model.gradient_defense`); None: undefended. MID and
#: distance correlation act on what a top model receives (SplitNN's `received_defense`): there is none here.
DEFENSES = [
    None,
    *({"class_path": "lvfl.privacy.GaussianNoise", "init_args": {"noise_multiplier": z}} for z in (0.25, 1.0, 4.0)),
    *({"class_path": "lvfl.privacy.LaplaceNoise", "init_args": {"scale": b}} for b in (0.25, 1.0, 4.0)),
    *({"class_path": "lvfl.privacy.GradientSparsification", "init_args": {"keep": k}} for k in (0.5, 0.1)),
]


def label(defense: dict | None) -> str:
    """A defense as a table cell."""
    if defense is None:
        return "none"
    name = defense["class_path"].rsplit(".", 1)[1]
    return f"{name}({', '.join(f'{k}={v}' for k, v in defense['init_args'].items())})"


def epsilon(defense: dict | None, epochs: int) -> float | None:
    """The noise defense's label-DP epsilon over the run (delta 1e-5), None for the others."""
    if defense is None or not defense["class_path"].endswith(("GaussianNoise", "LaplaceNoise")):
        return None
    cls = GaussianNoise if defense["class_path"].endswith("GaussianNoise") else LaplaceNoise
    return cls(**defense["init_args"]).epsilon(epochs, 1e-5)


def series(rows: list[dict], key: str) -> list[float]:
    """The values logged under `key`, one per epoch."""
    return [float(r[key]) for r in rows if r.get(key)]


def run(attacks: list[dict], defense: dict | None, epochs: int, out: Path) -> list[dict]:
    """One run of the setting with `attacks` under `defense`: its metrics.csv rows."""
    extra = () if defense is None else (f"--model.init_args.gradient_defense={json.dumps(defense)}",)
    return fit("aggvfl/default", "fmnist", attacks, None, epochs, out, extra, pieces=PIECES)


def grid(epochs: int) -> list[dict]:
    """Every attack under every defense: one record per (attack, defense)."""
    records: list[dict] = []
    ideal: dict[str, float] = {}
    groups = [INFERENCES, *([entry] for entry in BACKDOORS)]
    with tempfile.TemporaryDirectory() as tmp:
        for g, group in enumerate(groups):
            for d, defense in enumerate(DEFENSES):
                try:
                    rows = run([attack for attack, _ in group], defense, epochs, Path(tmp, f"{g}-{d}"))
                except Stopped as stop:  # a run the defense made diverge: said, not scored
                    for attack, metric in group:
                        records.append({"attack": _name(attack), "metric": metric, "defense": label(defense),
                                        "stopped": str(stop).removeprefix("lvfl: error: ")})  # fmt: skip
                        print(_row(records[-1]), flush=True)
                    continue
                mp = series(rows, "val/acc/aggregate")[-1]
                for attack, metric in group:
                    name = _name(attack)
                    values = series(rows, f"attack/{name}/{metric}")
                    backdoor = attack in [a for a, _ in BACKDOORS]
                    value = statistics.mean(values) if backdoor else values[-1]
                    ap = attack_performance(metric, value)
                    if defense is None:
                        ideal[name] = mp
                    baseline = series(rows, f"attack/{name}/baseline_{metric}")
                    records.append(
                        {
                            "attack": name,
                            "metric": metric,
                            "defense": label(defense),
                            "ap": ap,
                            "first_epoch": values[0],
                            "last_epoch": values[-1],
                            "baseline": baseline[-1] if baseline else None,
                            "mp": mp,
                            "dcs": dcs(ap, mp, ideal[name]),
                            "epsilon": epsilon(defense, epochs),
                        }
                    )
                    print(_row(records[-1]), flush=True)
    return records


def _name(attack: dict) -> str:
    return getattr(library, attack["class_path"].rsplit(".", 1)[1]).name


def _row(r: dict) -> str:
    if "stopped" in r:
        return f"| {r['attack']} {r['metric']} | {r['defense']} | stopped: {r['stopped'][:120]} | | | | | | |"
    eps = "" if r["epsilon"] is None else f"{r['epsilon']:.1f}"
    base = "" if r["baseline"] is None else f"{r['baseline']:.4f}"
    return (f"| {r['attack']} {r['metric']} | {r['defense']} | {r['ap']:.4f} | {r['first_epoch']:.4f} | "
            f"{r['last_epoch']:.4f} | {base} | "
            f"{r['mp']:.4f} | {r['dcs']:.4f} | {eps} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30, help="VFLAIR's 30")
    parser.add_argument("--out", type=Path, default=None, help="also write the records here as JSON")
    args = parser.parse_args()
    print(f"# VFLAIR's attack setting on Fashion-MNIST (2 parties, MLP 392-32-10, Adam lr 0.01, batch 1024), "
          f"{args.epochs} epochs; attacks by party1. AP: an inference's metric at the last epoch, a backdoor's "
          "averaged over every epoch (VFLAIR's); MP: validation accuracy at the last epoch; DCS: beta 0.5, AP* 0, "
          "MP* undefended, one-sided")  # fmt: skip
    print()
    print("| attack | defense | AP | epoch 1 | last epoch | baseline | MP | DCS | epsilon |")
    print("|---|---|---|---|---|---|---|---|---|")
    records = grid(args.epochs)
    print(f"# {machine()}")
    if args.out is not None:
        args.out.write_text(json.dumps({"epochs": args.epochs, "machine": machine(), "rows": records}, indent=1))


if __name__ == "__main__":
    main()
