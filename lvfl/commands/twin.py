"""What privacy costs a run: its time and bytes beside a Plain twin of the same config and seed.

`lvfl fit --twin=true` fits the configuration as given, then fits it again with `--model.init_args.aggregation=
lvfl.privacy.Plain` (everything else equal: config files, overrides, seed, so the same split, initialization and
batches) and prints a table at the end; `lvfl fit --config configs/easter/wine.yaml --trainer.max_epochs=3
--twin=true` printed, on this 2-core machine:

    == privacy cost vs a Plain twin (same config and seed) ==
    | mechanism | time | bytes |
    |---|---|---|
    | DHMasking (aggregation) | +56.8% (5.54 ms vs 3.53 ms per step; fits 0.39 s vs 0.24 s) | +0.1% (0.371 MB vs
      0.370 MB): keys +0.0003 MB |

and with `PartyTables` a row for the PSI (`examples/bank_retailer/config.yaml`: 0.23 s, 0.0888 MB).

The aggregation row compares the two fits (the only difference between them is the backend, so the difference is
the backend's: its key set-up, protecting and combining, and the larger messages). Time is the median training
step (`StepTimer`), robust to the first fit's one-time warm-up that a comparison of whole fits would charge to the
run; the whole fits' times are given beside it. The bytes are split by the wire tags whose totals differ. The PSI
row is measured within the run (`PartyTables.psi_seconds`, the `psi*/` tags), since a Plain twin aligns the same
way: its alternative, joining IDs in the clear, sends nothing.
Label-DP mechanisms cost neither time nor bytes (they change what is sent, not how much); oblivious transfer runs
at prediction (`lvfl predict --oblivious` prints its bytes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import Callback

MB = 1e6
PLAIN = "lvfl.privacy.Plain"
#: the command-line options of a run that its twin leaves out (the twin writes no files of its own)
TWIN_OPTION = "--twin"


class StepTimer(Callback):
    """The wall time of every training step (from batch start to batch end), for the twin comparison."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Start the step's clock."""
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Record the step."""
        self.seconds.append(time.perf_counter() - self._started)


@dataclass(frozen=True)
class Measured:
    """What a fit cost: its wall time and median training step (s), and the bytes per wire tag."""

    seconds: float
    step_seconds: float
    bytes_by_tag: Mapping[str, int]

    @staticmethod
    def of(fit_seconds: float, timer: StepTimer, bytes_by_tag: Mapping[str, int]) -> Measured:
        """From a fit's duration, its step timer and its wire's ledger."""
        step = statistics.median(timer.seconds) if timer.seconds else float("nan")
        return Measured(fit_seconds, step, dict(bytes_by_tag))

    @property
    def total_bytes(self) -> int:
        """All bytes on the wire."""
        return sum(self.bytes_by_tag.values())


def twin_args(argv: Sequence[str], save_dir: str) -> list[str]:
    """The CLI arguments (no subcommand) of the Plain twin of the run `argv` (`fit` and its options).

    Drops `--twin` (as `--twin=true` or `--twin true`), then adds the Plain backend, logs and checkpoints under
    `save_dir`, no progress bar. The twin keeps the run's best checkpoint (`ExperimentCheckpoint`), since keeping one
    puts the best-epoch byte on the wire (`VFLModule.share_best_epoch`), which is no cost of privacy.
    """
    args = list(argv[1:] if argv and not argv[0].startswith("-") else argv)
    kept, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == TWIN_OPTION:
            skip = i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        if arg.startswith(TWIN_OPTION + "="):
            continue
        kept.append(arg)
    return [
        *kept,
        f"--model.init_args.aggregation={PLAIN}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        "--trainer.enable_checkpointing=true",
        '--trainer.callbacks+={"class_path": "lvfl.callbacks.ExperimentCheckpoint"}',
        "--trainer.enable_progress_bar=false",
        "--default_callbacks=false",  # no second communication summary
    ]


def _pct(mine: float, base: float) -> str:
    return "n/a" if base == 0 else f"{100 * (mine - base) / base:+.1f}%"


def cost_rows(
    backend: str, run: Measured, twin: Measured | None, psi_seconds: float | None = None
) -> list[tuple[str, str, str]]:
    """The table's rows: (mechanism, time, bytes). `twin` is None when the run's backend is Plain already."""
    rows = []
    if twin is not None:
        tags = sorted(set(run.bytes_by_tag) | set(twin.bytes_by_tag))
        deltas = [(t, run.bytes_by_tag.get(t, 0) - twin.bytes_by_tag.get(t, 0)) for t in tags]
        split = ", ".join(f"{t} {d / MB:+.4f} MB" for t, d in deltas if d and not t.startswith("psi"))
        steps = f"{1e3 * run.step_seconds:.2f} ms vs {1e3 * twin.step_seconds:.2f} ms per step"
        fits = f"fits {run.seconds:.2f} s vs {twin.seconds:.2f} s"
        time = f"{_pct(run.step_seconds, twin.step_seconds)} ({steps}; {fits})"
        mine, base = run.total_bytes, twin.total_bytes
        size = f"{_pct(mine, base)} ({mine / MB:.3f} MB vs {base / MB:.3f} MB)"
        rows.append((f"{backend} (aggregation)", time, size + (f": {split}" if split else "")))
    psi = sum(n for t, n in run.bytes_by_tag.items() if t.startswith("psi"))
    if psi_seconds is not None:
        rows.append(
            (
                "PSI (ID alignment)",
                f"{psi_seconds:.2f} s while loading",
                f"{psi / MB:.4f} MB (psi*/ tags; IDs joined in the clear: 0 B)",
            )
        )
    return rows


def format_table(rows: Sequence[tuple[str, str, str]], note: str = "") -> str:
    """The rows as the Markdown table printed at the end of a protected run."""
    lines = ["== privacy cost vs a Plain twin (same config and seed) ==", "| mechanism | time | bytes |"]
    lines.append("|---|---|---|")
    lines += [f"| {m} | {t} | {b} |" for m, t, b in rows]
    return "\n".join(lines + ([note] if note else []))
