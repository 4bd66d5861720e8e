"""A grid's report: one row per (protocol, dataset) in a Markdown table and a CSV, and plots of the seed spread."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lvfl.commands.bench.grid import NO_DEFENSE, SELECTION_METRICS, Cell, Grid

MB = 1e6


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def reaches(value: float, target: float, metric: str = "acc") -> bool:
    """Whether a validation figure of `metric` reaches `target` (at least it; at most it for MAE and RMSE)."""
    return value >= target if SELECTION_METRICS[metric] == "max" else value <= target


def mb_to_target(history: dict[str, list[float]], target: float | None, metric: str = "acc") -> float | None:
    """Cumulative MB (set-up, then training) at the first epoch whose validation `metric` reaches `target`."""
    if target is None:
        return None
    total = float(history.get("setup_bytes", 0.0))
    for value, nbytes in zip(history["val_acc"], history["train_bytes"], strict=True):
        total += nbytes
        if reaches(value, target, metric):
            return total / MB
    return None


def sim_to_target(history: dict[str, Any], target: float | None, metric: str = "acc") -> float | None:
    """Simulated wall time (s, `NetworkSimulator`) at the end of the first epoch whose val `metric` reaches `target`."""
    if target is None or "sim_wall_s" not in history:
        return None
    for value, seconds in zip(history["val_acc"], history["sim_wall_s"], strict=True):
        if reaches(value, target, metric):
            return float(seconds)
    return None


def twin_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The mean over seeds of a protected cell's cost beside its Plain twin (`twin: true` grids), or None."""
    twins = [r.get("twin") for r in runs]
    if not twins or not all(twins):
        return None

    def mean(key: str) -> float:
        return statistics.mean(t[key] for t in twins)

    return {
        "backend": twins[0]["backend"],
        "step_ms": 1e3 * mean("step_s"),
        "twin_step_ms": 1e3 * mean("twin_step_s"),
        "mb": mean("bytes") / MB,
        "twin_mb": mean("twin_bytes") / MB,
    }


def twin_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: each protected (protocol, dataset) beside its Plain twin, median step time and MB of the fits."""
    lines = [
        "Privacy cost beside a Plain twin (same configs and seed; median training step, bytes of the fit):",
        "",
        "| protocol | dataset | backend | ms/step | Plain twin ms/step | time | MB | Plain twin MB | bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r.get("twin")
        if not t:
            continue
        time_pct = 100 * (t["step_ms"] - t["twin_step_ms"]) / t["twin_step_ms"]
        bytes_pct = 100 * (t["mb"] - t["twin_mb"]) / t["twin_mb"]
        lines.append(
            f"| {r['protocol']} | {r['dataset']} | {t['backend']} | {t['step_ms']:.2f} | {t['twin_step_ms']:.2f} | "
            f"{time_pct:+.1f}% | {t['mb']:.3f} | {t['twin_mb']:.3f} | {bytes_pct:+.1f}% |"
        )
    return "\n".join(lines) + "\n"


def failure_text(failed: Sequence[tuple[int, str]], seeds: int) -> str:
    """What a row with failed seeds shows instead of its figures: `failed: seed k of n: <reason>` in one line."""
    seed, reason = failed[0]
    more = f" (and {len(failed) - 1} more seed(s))" if len(failed) > 1 else ""
    return f"failed: seed {seed} ({len(failed)}/{seeds}): {reason}{more}".replace("|", "/").replace("\n", " ")


def summarize(grid: Grid, results: dict[Cell, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (protocol, dataset) with the figures of the table.

    A result with an `error` (a cell that failed under `--keep-going`) makes its row a failure: the row keeps no
    figures, since a mean over the surviving seeds would not compare with the other rows; `failed` says why.
    """
    rows = []
    for protocol in grid.protocols:
        for dataset in grid.datasets:
            mine = {c: r for c, r in results.items() if c.protocol == protocol and c.dataset == dataset}
            failed = [(c.seed, r["error"]) for c, r in mine.items() if "error" in r]
            row: dict[str, Any] = {"protocol": protocol, "dataset": dataset, "seeds": len(mine)}
            row["target"] = grid.target(dataset)
            if grid.paper is not None:
                metric = grid.paper.metric_of(dataset)
                ours = [100 * r["test"][f"test/{metric}/mean"] for r in mine.values() if "error" not in r]
                row["paper"] = grid.paper.value(protocol, dataset)
                row["paper_metric"] = metric
                row["lvfl_paper_metric"] = _mean_std(ours) if ours and not failed else None
            if failed or not mine:
                row |= {"failed": failure_text(failed, len(mine)) if failed else "failed: no result", "parties": []}
                keys = ("acc_mean", "acc_mean_last", "mb_total", "mb_to_target", "vs_reference", "sim_to_target")
                row |= dict.fromkeys(keys)
                row |= {"reached": "", "s_per_epoch": None, "peak_rss_mib": None, "convergence": None}
                rows.append(row)
                continue
            runs = list(mine.values())
            prefix = f"test/{grid.metric}/"  # the grid's metric (accuracy by default); kept under acc_* keys
            parties = sorted({k.split("/")[-1] for r in runs for k in r["test"] if k.startswith(prefix)} - {"mean"})
            for party in [*parties, "mean"]:
                values = [r["test"][f"{prefix}{party}"] for r in runs if f"{prefix}{party}" in r["test"]]
                row[f"acc_{party}"] = _mean_std(values) if values else None
            row["parties"] = parties
            last = [r["test_last"][f"{prefix}mean"] for r in runs if f"{prefix}mean" in r.get("test_last", {})]
            row["acc_mean_last"] = _mean_std(last) if last else None
            row["mb_total"] = statistics.mean(r["wire_bytes"] for r in runs) / MB
            to_target = [mb_to_target(r["history"], row["target"], grid.metric) for r in runs]
            reached = [m for m in to_target if m is not None]
            row["mb_to_target"] = statistics.mean(reached) if reached and len(reached) == len(runs) else None
            row["reached"] = f"{len(reached)}/{len(runs)}"
            sim = [sim_to_target(r["history"], row["target"], grid.metric) for r in runs]
            row["sim_to_target"] = statistics.mean(sim) if all(s is not None for s in sim) else None
            row["twin"] = twin_summary(runs)
            row["s_per_epoch"] = statistics.mean(statistics.median(r["epoch_seconds"]) for r in runs)
            row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
            row["convergence"] = convergence(runs)
            rows.append(row)
    if grid.reference is not None:
        ref = {r["dataset"]: r["mb_to_target"] for r in rows if r["protocol"] == grid.reference}
        for row in rows:
            base = ref.get(row["dataset"])
            mine = row["mb_to_target"]
            row["vs_reference"] = None if base in (None, 0) or mine is None else 100 * (mine - base) / base
    return rows


def still_improving(best_epoch: int, epochs: int) -> bool:
    """Whether a run's best validation epoch fell in the last tenth of its training (at least the last epoch).

    Such a run was still improving when it stopped: its figure says where training was cut, not where the method
    converges, and comparing it with a converged number (a paper's, another protocol's) compares stopping points.
    """
    return best_epoch > epochs - max(1, epochs // 10)


def convergence(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The best validation epoch over the seeds (mean), the epochs trained, and how many seeds were still improving."""
    known = [(int(r["best_epoch"]), len(r["epoch_seconds"])) for r in runs if "best_epoch" in r]
    if not known:
        return None
    return {
        "best_epoch": statistics.mean(b for b, _ in known),
        "epochs": max(e for _, e in known),
        "improving": sum(still_improving(b, e) for b, e in known),
        "seeds": len(known),
    }


def _convergence_cell(row: dict[str, Any]) -> str:
    conv = row.get("convergence")
    if conv is None:
        return ""
    mark = f" †{conv['improving']}/{conv['seeds']}" if conv["improving"] else ""
    return f"{conv['best_epoch']:.1f}/{conv['epochs']}{mark}"


CONVERGENCE_NOTE = (
    "best epoch: the best-validation epoch (mean over seeds) of the epochs trained. † k/n: in k of n seeds it fell in "
    "the last tenth of training, so the run was still improving when it stopped and its row is compared before "
    "convergence."
)


def _fmt(cell: tuple[float, float] | None) -> str:
    return "" if cell is None else f"{cell[0]:.4f} ± {cell[1]:.4f}"


def _num(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def paper_note(grid: Grid) -> str:
    """The line under a table with paper columns: where the numbers come from and what they measure."""
    if grid.paper is None:
        raise ValueError(f"grid {grid.name!r} has no `paper:` block")
    metric = grid.paper.metric
    measures = METRIC_NAMES[metric] if isinstance(metric, str) else METRIC_NAMES["acc"]
    for name in METRIC_NAMES if isinstance(metric, dict) else ():
        datasets = [d for d, m in metric.items() if m == name and name != "acc"]
        measures += f"; {METRIC_NAMES[name]} for {', '.join(datasets)}" if datasets else ""
    return (
        f"paper %: {grid.paper.source}. lvfl %: the same metric for lvfl's run, mean over seeds +- std, of the mean "
        f"over the party models at the best-validation checkpoint ({measures})."
    )


METRIC_NAMES = {"acc": "test accuracy", "auroc": "test AUC"}


def _paper_cells(row: dict[str, Any]) -> list[str]:
    paper = "" if row.get("paper") is None else f"{row['paper']:.2f}"
    ours = row.get("lvfl_paper_metric")
    return [paper, "" if ours is None else f"{ours[0]:.2f} ± {ours[1]:.2f}"]


def write_table(grid: Grid, rows: list[dict[str, Any]], out: Path) -> str:
    """Markdown table and CSV of the rows; returns the Markdown. A failed row says why in its first figure column.

    A grid with a `paper:` block gains two columns after the dataset, the paper's number and lvfl's in the same
    metric, and a note under the table naming the source.
    """
    party_cols = sorted({p for r in rows for p in r["parties"]})
    paper_head = [] if grid.paper is None else ["paper %", "lvfl %"]
    m = grid.metric
    head = ["protocol", "dataset", *paper_head, *[f"{m} {p}" for p in party_cols]]
    head += [f"{m} mean", f"{m} mean (last epoch)", "best epoch"]
    head += ["MB total", "MB to target"]
    if grid.reference is not None:
        head.append(f"MB to target vs {grid.reference}")
    head += ["sim. s to target"] if grid.network else []
    head += ["s/epoch", "peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        csv_head = ["protocol", "dataset", "seeds"]
        csv_head += [] if grid.paper is None else ["paper_metric", "paper_pct", "lvfl_pct_mean", "lvfl_pct_std"]
        for p in [*party_cols, "mean"]:
            csv_head += [f"{m}_{p}_mean", f"{m}_{p}_std"]
        csv_head += [f"{m}_mean_last_mean", f"{m}_mean_last_std", "best_epoch_mean", "epochs", "improving_seeds"]
        csv_head += ["mb_total", "target", "mb_to_target", "reached"]
        writer.writerow(
            [*csv_head, "mb_to_target_vs_reference_pct", "sim_s_to_target", "s_per_epoch", "peak_rss_mib", "failed"]
        )
        for r in rows:
            paper_csv = [] if grid.paper is None else [r["paper_metric"], _num(r["paper"], ".2f")]
            if grid.paper is not None:
                ours = r["lvfl_paper_metric"]
                paper_csv += ["", ""] if ours is None else [f"{ours[0]:.4f}", f"{ours[1]:.4f}"]
            if r.get("failed"):  # the reason in the first figure column, every other figure blank
                paper = [] if grid.paper is None else _paper_cells(r)
                row = [r["protocol"], r["dataset"], *paper, r["failed"]]
                lines.append("| " + " | ".join([*row, *[""] * (len(head) - len(row))]) + " |")
                blanks = [""] * (len(csv_head) - 3 - len(paper_csv) + 4)  # figures, reference %, sim, s/epoch, RSS
                writer.writerow([r["protocol"], r["dataset"], r["seeds"], *paper_csv, *blanks, r["failed"]])
                continue
            to_target = "" if r["mb_to_target"] is None else f"{r['mb_to_target']:.2f}"
            target = "–" if r["target"] is None else f"{to_target} ({m} {r['target']:g}: {r['reached']} seeds)"
            paper = [] if grid.paper is None else _paper_cells(r)
            cells = [r["protocol"], r["dataset"], *paper, *[_fmt(r.get(f"acc_{p}")) for p in party_cols]]
            versus = "" if r.get("vs_reference") is None else f"{r['vs_reference']:+.2f}%"
            cells += [
                _fmt(r["acc_mean"]),
                _fmt(r["acc_mean_last"]),
                _convergence_cell(r),
                f"{r['mb_total']:.2f}",
                target,
            ]
            cells += [versus] if grid.reference is not None else []
            cells += [_num(r.get("sim_to_target"), ".1f") or "–"] if grid.network else []
            cells += [f"{r['s_per_epoch']:.3f}", f"{r['peak_rss_mib']:.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
            values = [r["protocol"], r["dataset"], r["seeds"], *paper_csv]
            for p in [*party_cols, "mean"]:
                stat = r.get(f"acc_{p}")
                values += ["", ""] if stat is None else [f"{stat[0]:.6f}", f"{stat[1]:.6f}"]
            stat = r["acc_mean_last"]
            values += ["", ""] if stat is None else [f"{stat[0]:.6f}", f"{stat[1]:.6f}"]
            conv = r.get("convergence")
            values += ["", "", ""] if conv is None else [f"{conv['best_epoch']:.2f}", conv["epochs"], conv["improving"]]
            values += [f"{r['mb_total']:.6f}", r["target"] or "", to_target, r["reached"]]
            values += [_num(r.get("vs_reference"), ".4f"), _num(r.get("sim_to_target"), ".3f")]
            values += [f"{r['s_per_epoch']:.6f}"]
            writer.writerow([*values, f"{r['peak_rss_mib']:.1f}", ""])
    table = "\n".join(lines) + "\n" + ("" if grid.paper is None else "\n" + paper_note(grid) + "\n")
    if any((r.get("convergence") or {}).get("improving") for r in rows):
        table += "\n" + CONVERGENCE_NOTE + "\n"
    if any(r.get("twin") for r in rows):
        table += "\n" + twin_table(rows)
    (out / "table.md").write_text(table)
    return table


def write_plots(grid: Grid, results: dict[Cell, dict[str, Any]], out: Path) -> list[Path]:
    """Per dataset: validation accuracy vs epoch and vs cumulative MB, one line per protocol.

    The line is the mean over seeds; the shaded band around it spans the seeds' minimum to maximum (with 3 seeds a
    standard deviation says little that the two extremes do not). Against MB the x position is the seeds' mean
    cumulative MB. One legend for both panels sits outside the axes, right of them, so it never covers a curve.
    Failed cells are left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    for dataset in grid.datasets:
        fig, (ax_epoch, ax_mb) = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained")
        seeds = 0
        for protocol in grid.protocols:
            runs = [
                r["history"]
                for c, r in results.items()
                if c.protocol == protocol and c.dataset == dataset and "error" not in r
            ]
            n = min((len(h["epoch"]) for h in runs), default=0)
            if n == 0:
                continue
            seeds = max(seeds, len(runs))
            acc = np.array([h["val_acc"][:n] for h in runs])
            mb = np.mean([h.get("setup_bytes", 0.0) + np.cumsum(h["train_bytes"][:n]) for h in runs], axis=0) / MB
            epochs = runs[0]["epoch"][:n]
            mean, low, high = acc.mean(axis=0), acc.min(axis=0), acc.max(axis=0)
            (line,) = ax_epoch.plot(epochs, mean, label=protocol)
            ax_epoch.fill_between(epochs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            ax_mb.plot(mb, mean, color=line.get_color())
            ax_mb.fill_between(mb, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        what = "validation accuracy" if grid.metric == "acc" else f"validation {grid.metric}"
        ax_epoch.set(xlabel="epoch", ylabel=f"{what} (mean of party models)", title=dataset)
        ax_mb.set(xlabel="cumulative MB, set-up + training (10^6 bytes)", ylabel=what, title=dataset)
        if any(ax_mb.get_lines()):
            ax_mb.set_xscale("symlog", linthresh=0.1)
        for ax in (ax_epoch, ax_mb):
            ax.grid(alpha=0.3)
        if ax_epoch.get_lines():
            fig.legend(
                loc="outside right upper",
                fontsize=8,
                title=f"line: mean of {seeds} seed(s)\nband: min to max",
                title_fontsize=8,
            )
        path = out / f"{grid.name}_{dataset}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------------- attacks
#: the metric each attack is judged by (its attack performance, AP), in order of preference
AP_METRICS = ("accuracy", "auc", "mse", "success_rate", "accuracy_drop")


def dcs(ap: float, mp: float, ideal_mp: float, beta: float = 0.5) -> float:
    """VFLAIR's Defense Capability Score: 1 / (1 + sqrt((1 - beta) AP'^2 + beta max(ideal MP - MP, 0)^2)).

    AP' is the attack performance above the ideal 0 (VFLAIR's), never below it; the ideal MP is the undefended run's.
    """
    return 1 / (1 + math.sqrt((1 - beta) * max(ap, 0.0) ** 2 + beta * max(ideal_mp - mp, 0.0) ** 2))


def attack_performance(metric: str, value: float) -> float:
    """AP in [0, 1], higher meaning a stronger attack: the metric itself, 1 - MSE for a reconstruction (VFLAIR's).

    An AUC counts as max(AUC, 1 - AUC): a ranking that puts the classes backwards leaks as much, the attacker reads
    it flipped (VFLAIR orients its noisy-sample AUC so); unoriented, a defense pushing the AUC below 0.5 would score
    better than one leaving the attacker at chance.
    """
    if metric == "mse":
        return max(0.0, 1.0 - value)
    return max(value, 1.0 - value) if metric == "auc" else value


def attack_rows(grid: Grid, results: dict[Cell, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (protocol [+ defense], dataset, attack): MP, AP (means over seeds), DCS, the epsilon bound."""
    rows = []
    names = sorted({k.split("/")[1] for r in results.values() for k in r.get("attacks", {})})
    mp_key = f"test/{grid.metric}/mean"
    for protocol in grid.protocols:
        base, defense = grid.defended.get(protocol, (protocol, ""))
        for dataset in grid.datasets:
            runs = [r for c, r in results.items() if c.protocol == protocol and c.dataset == dataset]
            runs = [r for r in runs if "error" not in r]
            if not runs:
                continue
            mp = statistics.mean(r["test"][mp_key] for r in runs if mp_key in r["test"])
            for name in names:
                logged = [r.get("attacks", {}) for r in runs]
                metric = next((m for m in AP_METRICS if all(f"attack/{name}/{m}" in a for a in logged)), None)
                if metric is None:
                    continue
                value = statistics.mean(a[f"attack/{name}/{metric}"] for a in logged)
                bounds = [a.get(f"attack/{name}/epsilon_bound") for a in logged]
                baseline = [a.get(f"attack/{name}/baseline_{metric}") for a in logged]
                rows.append(
                    {
                        "protocol": protocol,
                        "base": base,
                        "defense": defense,
                        "dataset": dataset,
                        "attack": name,
                        "metric": metric,
                        "value": value,
                        "ap": attack_performance(metric, value),
                        "baseline": statistics.mean(baseline) if all(b is not None for b in baseline) else None,
                        "epsilon_bound": bounds[0] if all(b is not None for b in bounds) else None,
                        "mp": mp,
                        "seeds": len(runs),
                    }
                )
    for row in rows:  # DCS against the same protocol's undefended run on the same dataset
        ideal = [
            r["mp"]
            for r in rows
            if r["base"] == row["base"] and r["dataset"] == row["dataset"] and r["defense"] in ("", NO_DEFENSE)
        ]
        row["dcs"] = dcs(row["ap"], row["mp"], ideal[0]) if ideal and grid.defended else None
    return rows


def write_attack_table(rows: list[dict[str, Any]], out: Path) -> str:
    """`attacks.md` and `attacks.csv`: per protocol, defense, dataset and attack, its AP beside MP, DCS, the bound."""
    head = ["protocol", "defense", "dataset", "attack", "metric", "value", "baseline", "AP", "MP", "DCS", "eps bound"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    with (out / "attacks.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([h.lower().replace(" ", "_") for h in head] + ["seeds"])
        for r in rows:
            cells = [
                r["base"],
                r["defense"] or "–",
                r["dataset"],
                r["attack"],
                r["metric"],
                f"{r['value']:.4f}",
                _num(r["baseline"], ".4f"),
                f"{r['ap']:.4f}",
                f"{r['mp']:.4f}",
                _num(r["dcs"], ".4f"),
                _num(r["epsilon_bound"], ".4f"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
            writer.writerow([*cells, r["seeds"]])
    note = (
        "AP: the attack's metric at its last logged epoch (1 - MSE for a reconstruction), mean over seeds; MP: the "
        "test metric at the best-validation checkpoint; DCS: VFLAIR's Defense Capability Score (beta 0.5, ideal AP 0, "
        f"ideal MP the `{NO_DEFENSE}` run's); eps bound: e^eps / (e^eps + K - 1), the most an eps-label-DP release "
        "lets a guess from it keep."
    )
    table = "\n".join(lines) + "\n\n" + note + "\n"
    (out / "attacks.md").write_text(table)
    return table


def write_attack_plots(grid: Grid, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Per dataset and attack: AP against MP, one point per protocol and defense (the privacy-utility plot).

    Where a label mechanism's epsilon bound is logged, a black bar marks it at the same MP.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for dataset, attack in sorted({(r["dataset"], r["attack"]) for r in rows}):
        fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
        for r in (r for r in rows if r["dataset"] == dataset and r["attack"] == attack):
            ax.scatter(r["mp"], r["ap"])
            ax.annotate(r["protocol"], (r["mp"], r["ap"]), fontsize=7)
            if r["epsilon_bound"] is not None:  # the most a guess from the label release keeps, beside the measure
                ax.scatter(r["mp"], r["epsilon_bound"], marker="_", s=300, color="black")
                ax.annotate("eps bound", (r["mp"], r["epsilon_bound"]), fontsize=6, va="top")
        ax.set(xlabel=f"main-task performance (test {grid.metric})", ylabel=f"attack performance ({attack})")
        ax.set_title(f"{dataset}: {attack}", fontsize=9)
        ax.grid(alpha=0.3)
        path = out / f"{grid.name}_{dataset}_{attack}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
