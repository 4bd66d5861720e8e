"""Student distillation under partial overlap (non-overlapping inference paper, Sec. 5.2, Table 3 and Fig. 10).

For each dataset, overlap alpha and seed, one EASTER teacher (the VFL model) is fitted on the overlapping training
samples; then, on the active party's features alone and all its training samples, students of two families are
fitted with `fit_student` for every lambda of the sweep:

- `logistic`: `lvfl.models.LogisticRegression` (the paper's student), Adam lr 0.01, batch 64, 20 epochs;
- `mlp`: the active party's own model and optimizer in the teacher's config (breast_cancer: `MLP(hidden=[64])`, SGD
  lr 0.05 momentum 0.9, batch 32, 30 epochs; clickthrough: `MLP(hidden=[64])`, Adam lr 0.003, batch 64, 10 epochs).

Each family is also trained on cross-fitted soft labels (`family+cfK`, `--cross-fit K`, default 5): every overlapping
training sample's soft label comes from one of K fold teachers (EASTER, same config and epochs) that did not train on
it (`lvfl.inference.cross_fit`), instead of from the fitted teacher's own, nearly hard, training predictions.

Within a family, lambda = 0 is the Local model (the active party's own features and labels, the same model trained
the same way), so Local and student differ only in the distillation term. Tables per family: test AUROC of Local,
the student at lambda = 0.5 and the VFL model (its mean over parties of softmax, i.e. the teacher's soft labels), then
the lambda sweep, then the acceptance lines.

- breast_cancer: `configs/easter/breast_cancer.yaml` (4 parties, DH-masked) with `--data.init_args.overlap=<alpha>`.
- clickthrough: an EASTER config written in this script (2 parties, `lvfl.datamodules.ClickThrough`, 4000 rows,
  fixed `data_seed=0`, the split and overlap seeded by the run's seed), the first two parties' models of the
  breast_cancer config, Adam lr 0.003, batch 64, 10 epochs (with the breast_cancer config's SGD lr 0.05 and 30
  epochs the teacher overfits the small overlap: VFL AUROC 0.63, below Local's 0.65, at alpha 0.5 seed 0), `Plain`
  aggregation (DHMasking refuses one passive party: with no peer to share a mask with it would be the embedding in
  the clear; accuracy is the same either way).

Runs with one torch thread by default (`--threads`): every step here is tiny, and spinning OpenMP threads cost
far more than they gain (measured in docs/results.md section 6).

.venv/bin/python -m benchmarks.paper.student | tee /tmp/student_results.md
.venv/bin/python -m benchmarks.paper.student --seeds 0 --alphas 0.5 --datasets breast_cancer --families mlp
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torchmetrics

from benchmarks.common import machine, quiet
from lvfl.commands.fit import run_experiment
from lvfl.inference.cross_fit import cross_fitted_soft_labels, untrained_copy
from lvfl.inference.evaluation import evaluate_student
from lvfl.inference.student import build_student, fit_student
from lvfl.inference.teacher import default_producer, student_data, teacher_soft_labels
from lvfl.models import MLP, LogisticRegression
from lvfl.privacy import PlainSoftLabels

ALPHAS = [0.1, 0.25, 0.5, 0.75, 0.9]
LAMS = [0.0, 0.25, 0.5, 0.75, 1.0]
DATASETS = ["breast_cancer", "clickthrough"]
BREAST_CANCER = "configs/easter/breast_cancer.yaml"
CLICKTHROUGH_YAML = """\
seed_everything: 0
trainer:
  max_epochs: 10
  log_every_n_steps: 5
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {save_dir: runs, name: easter_clickthrough}
model:
  class_path: lvfl.protocols.EASTER
  init_args:
    embedding_dim: 32
    aggregation: lvfl.privacy.Plain
    parties:
      - model: {class_path: lvfl.models.MLP, init_args: {hidden: [64]}}
        optimizer: {class_path: torch.optim.Adam, init_args: {lr: 0.003}}
      - model: {class_path: lvfl.models.MLP, init_args: {hidden: [32], activation: tanh}}
        optimizer: {class_path: torch.optim.Adam, init_args: {lr: 0.003}}
data:
  class_path: lvfl.datamodules.ClickThrough
  init_args: {num_samples: 4000, data_seed: 0, num_parties: 2, batch_size: 64, seed: 0}
"""
NAN = float("nan")


@dataclass(frozen=True)
class Family:
    """How a student (and its Local model, lambda = 0) is built and trained."""

    factory: object
    optimizer: object
    batch_size: int
    epochs: int
    embedding_dim: int = 32


LOGISTIC = Family(LogisticRegression, partial(torch.optim.Adam, lr=0.01), 64, 20, 16)
#: the active party's model and optimizer of each teacher config (party0 in configs/easter/breast_cancer.yaml, with
#: the datamodule's batch size and the trainer's epochs; party0 in CLICKTHROUGH_YAML)
FAMILIES = {
    "logistic": {"breast_cancer": LOGISTIC, "clickthrough": LOGISTIC},
    "mlp": {
        "breast_cancer": Family(partial(MLP, hidden=[64]), partial(torch.optim.SGD, lr=0.05, momentum=0.9), 32, 30),
        "clickthrough": Family(partial(MLP, hidden=[64]), partial(torch.optim.Adam, lr=0.003), 64, 10),
    },
}


def fmt(values: list[float]) -> str:
    """mean ± std (sample std) over the finite values; '–' if none."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "–"
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    missing = f" (n={len(finite)})" if len(finite) < len(values) else ""
    return f"{statistics.mean(finite):.4f} ± {std:.4f}{missing}"


def mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.mean(finite) if finite else NAN


def auroc_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test AUROC of a student on (x, y); NaN when the set is empty or holds one class."""
    return evaluate_student(model, x, y, 2).get("auroc", NAN)


def run_cell(
    config: str, dataset: str, seed: int, overrides: list[str], lams: list[float], variants: list[str], folds: int
) -> dict:
    """Fit one teacher, then per student variant one student per lambda; AUROCs of the teacher and every student."""
    kept = {}
    _, cli = run_experiment(
        config, seed, overrides, test=False, before_fit=lambda c: kept.update(template=untrained_copy(c.model))
    )
    teacher, dm = cli.model, cli.datamodule
    # the VFL model on the overlapping test samples (the only ones it can answer): mean of the parties' softmax
    test_vfl = dm.test_set
    soft = teacher_soft_labels(teacher, test_vfl[torch.arange(len(test_vfl))])
    labels = test_vfl.labels
    vfl = (
        float(torchmetrics.functional.auroc(soft[:, 1], labels, task="binary")) if labels.unique().numel() == 2 else NAN
    )
    # the teacher's inference, then the plain channel once: y~ at the active party for every student below
    channel = PlainSoftLabels()
    channel.setup(teacher.wire, teacher.active, default_producer(teacher))
    own = channel.send_soft_labels(student_data(teacher, dm, "train").parts)
    datasets = {"": student_data(teacher, dm, "train", soft_labels=own)}
    if any("+cf" in v for v in variants):
        cf = cross_fitted_soft_labels(kept["template"], dm, folds, cli.trainer.max_epochs, teacher.wire, seed=seed)
        datasets["+cf"] = student_data(teacher, dm, "train", soft_labels=cf)
    full, mask = dm.active_set("test"), dm.overlap_mask("test")
    x, y = full.features[dm.active_party_name], full.labels
    data = datasets[""]
    out = {"vfl": vfl, "n_test": len(y), "n_test_overlap": int(mask.sum()), "n_train": len(data.labels)}
    out["n_train_overlap"] = int(data.overlap.sum())
    out["soft_gap"] = {
        k: float((1 - d.soft_labels[d.overlap].gather(1, d.labels[d.overlap, None])).mean())
        for k, d in datasets.items()
    }
    for variant in variants:
        family, _, source = variant.partition("+")
        spec, data = FAMILIES[family][dataset], datasets["+cf" if source else ""]
        for lam in lams:
            model = build_student(spec.factory, tuple(data.features.shape[1:]), spec.embedding_dim, 2, seed)
            fit_student(
                model, data, lam, epochs=spec.epochs, batch_size=spec.batch_size, optimizer=spec.optimizer, seed=seed
            )
            out[variant, lam] = {
                "all": auroc_of(model, x, y),
                "overlap": auroc_of(model, x[mask], y[mask]),
                "active_only": auroc_of(model, x[~mask], y[~mask]),
            }
    return out


def report(family: str, results: dict, seeds: list[int], epochs: object, lams: list[float]) -> None:
    """Print the Table 3 and Fig. 10 analogues and the acceptance lines of one student variant."""
    specs = FAMILIES[family.partition("+")[0]]
    source = (
        "cross-fitted soft labels (each from a fold teacher that did not train on the sample)"
        if "+cf" in family
        else "the fitted teacher's own soft labels on its training samples"
    )
    training = "; ".join(
        f"{d}: {getattr(s.factory, 'func', s.factory).__name__}{dict(getattr(s.factory, 'keywords', {})) or ''}, "
        f"{getattr(s.optimizer, 'func', s.optimizer).__name__}{dict(getattr(s.optimizer, 'keywords', {}))}, batch "
        f"{s.batch_size}, {s.epochs} epochs"
        for d, s in specs.items()
    )
    print(
        f"\n## Student family `{family}`\n\n### Table 3 analogue: test AUROC, mean ± std over seeds {seeds}\n\n"
        f"Teacher: EASTER, {epochs} epochs, on the overlapping training samples. Local and student ({training}) on "
        f"the active party's features and all its training samples, distilled from {source}; "
        "Local is the student at lambda = 0 (own labels "
        "only), the student uses lambda = 0.5. Local and student are evaluated on **all** the active party's test "
        "samples (and, for the student, split into the overlap and the active-only samples); the VFL model (the "
        "teacher's mean over parties of softmax, the soft labels it gives the student) only on the **overlapping** "
        "test samples, the only ones it can answer, so its column is on a smaller, different test set.\n"
    )
    print(
        "| dataset | alpha | test rows (overlap) | Local (all) | student λ=0.5 (all) | Δ student − Local (wins) | "
        "student (overlap) | student (active-only) | Local (overlap) | VFL (overlap only) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (dataset, alpha), runs in results.items():
        delta = [r[family, 0.5]["all"] - r[family, 0.0]["all"] for r in runs]
        wins = sum(d > 0 for d in delta)
        rows = f"{runs[0]['n_test']} ({statistics.mean(r['n_test_overlap'] for r in runs):.0f})"
        print(
            f"| {dataset} | {alpha} | {rows} | {fmt([r[family, 0.0]['all'] for r in runs])} | "
            f"{fmt([r[family, 0.5]['all'] for r in runs])} | {mean(delta):+.4f} ({wins}/{len(runs)}) | "
            f"{fmt([r[family, 0.5]['overlap'] for r in runs])} | "
            f"{fmt([r[family, 0.5]['active_only'] for r in runs])} | "
            f"{fmt([r[family, 0.0]['overlap'] for r in runs])} | {fmt([r['vfl'] for r in runs])} |"
        )

    print(
        f"\n### Fig. 10 analogue (`{family}`): student test AUROC (all the active party's test samples) vs lambda, "
        f"mean ± std over seeds {seeds}; one teacher per (dataset, alpha, seed), lambda = 0 is Local\n"
    )
    print("| dataset | alpha | " + " | ".join(f"λ={lam:g}" for lam in lams) + " |")
    print("|---|---|" + "|".join("---" for _ in lams) + "|")
    for (dataset, alpha), runs in results.items():
        cells = " | ".join(fmt([r[family, lam]["all"] for r in runs]) for lam in lams)
        print(f"| {dataset} | {alpha} | {cells} |")

    print(f"\n### Acceptance check (`{family}`)\n")
    for (dataset, alpha), runs in results.items():
        local, student = mean([r[family, 0.0]["all"] for r in runs]), mean([r[family, 0.5]["all"] for r in runs])
        wins = sum(r[family, 0.5]["all"] > r[family, 0.0]["all"] for r in runs)
        if dataset == "breast_cancer" and alpha >= 0.5:
            verdict = "YES" if student > local else "NO"
            print(
                f"- student beats Local on breast_cancer at alpha = {alpha} (mean over {len(runs)} seeds)? {verdict}: "
                f"student {student:.4f} vs Local {local:.4f} ({student - local:+.4f}; student higher in "
                f"{wins}/{len(runs)} seeds)"
            )
        else:
            print(
                f"- {dataset} alpha = {alpha}: student {student:.4f} vs Local {local:.4f} ({student - local:+.4f}; "
                f"student higher in {wins}/{len(runs)} seeds)"
            )
    for (dataset, alpha), runs in results.items():
        vfl, student_ov = mean([r["vfl"] for r in runs]), mean([r[family, 0.5]["overlap"] for r in runs])
        verdict = "yes" if student_ov <= vfl + 0.005 else "NO"
        print(
            f"- student <= or near VFL ({dataset}, alpha = {alpha}, both on the overlapping test samples)? {verdict}: "
            f"student {student_ov:.4f} vs VFL {vfl:.4f} ({student_ov - vfl:+.4f})"
        )


def main() -> None:
    """Fit every (dataset, alpha, seed) teacher once, its students for every lambda, and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alphas", type=float, nargs="+", default=ALPHAS)
    parser.add_argument("--lams", type=float, nargs="+", default=LAMS)
    parser.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    parser.add_argument("--teacher-epochs", type=int, default=None, help="EASTER epochs (default: the config's, 30)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--cross-fit", type=int, default=5, help="folds of the cross-fitted variants (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lams = sorted(set(args.lams) | {0.0, 0.5})
    suffixes = [""] + ([f"+cf{args.cross_fit}"] if args.cross_fit else [])
    variants = [f + suffix for suffix in suffixes for f in args.families]
    quiet()
    t_start = time.perf_counter()
    results: dict[tuple[str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        click_config = Path(tmp) / "easter_clickthrough.yaml"
        click_config.write_text(CLICKTHROUGH_YAML)
        configs = {"breast_cancer": BREAST_CANCER, "clickthrough": str(click_config)}
        for dataset in args.datasets:
            for alpha in args.alphas:
                overrides = [f"--data.init_args.overlap={alpha}"]
                if args.teacher_epochs is not None:
                    overrides.append(f"--trainer.max_epochs={args.teacher_epochs}")
                t0 = time.perf_counter()
                runs = [
                    run_cell(configs[dataset], dataset, s, overrides, lams, variants, args.cross_fit)
                    for s in args.seeds
                ]
                results[dataset, alpha] = runs
                summary = ", ".join(
                    f"{f}: local {fmt([r[f, 0.0]['all'] for r in runs])} "
                    f"student {fmt([r[f, 0.5]['all'] for r in runs])}"
                    for f in variants
                )
                print(
                    f"done {dataset} alpha={alpha}: VFL {fmt([r['vfl'] for r in runs])}, {summary} "
                    f"({(time.perf_counter() - t0) / len(runs):.1f} s/seed)",
                    file=sys.stderr,
                    flush=True,
                )
    elapsed = time.perf_counter() - t_start
    epochs = args.teacher_epochs if args.teacher_epochs is not None else "30 (breast_cancer) / 10 (clickthrough)"

    for variant in variants:
        report(variant, results, args.seeds, epochs, lams)
    print("\nMean 1 - y~[true class] on the overlapping training samples (how far the soft labels are from hard):\n")
    for (dataset, alpha), runs in results.items():
        gaps = ", ".join(f"{k or 'own'}: {mean([r['soft_gap'][k] for r in runs]):.4f}" for k in runs[0]["soft_gap"])
        print(f"- {dataset} alpha = {alpha}: {gaps}")
    print(f"\nTotal {elapsed / 60:.1f} min on {machine()}")


if __name__ == "__main__":
    main()
