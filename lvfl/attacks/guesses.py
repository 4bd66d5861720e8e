"""A deployed attack's guesses: `attacks/<name>.csv` in the attacking party's run folder, described beside it.

Deployed, the attacking party's process holds no truth, so the attack scores nothing there: each epoch it appends its
guesses to `attacks/<name>.csv` (epoch, step, sample ID, one score per class, or the guessed features) and describes
itself in `attacks/<name>.json` (the attack, its metrics, the task, which samples it knew). `lvfl attack-score`
(`lvfl.commands.attack_score`) reads both and scores them against the truth, in a separate step.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["Guess", "inferences_path", "write_guesses"]

#: one step's guesses: (epoch, step, the batch's sample IDs, one row of scores or features per sample)
Guess = tuple[int, int, torch.Tensor, torch.Tensor]


def inferences_path(log_dir: str | Path, name: str) -> Path:
    """Where a deployed attack named `name` writes its guesses in its party's run folder `log_dir`."""
    return Path(log_dir) / "attacks" / f"{name}.csv"


def write_guesses(
    log_dir: str | Path,
    name: str,
    epoch: int,
    guesses: Sequence[Guess],
    describe: Callable[[int], dict[str, Any]],
) -> None:
    """Append one epoch's `guesses` to the attack's file in `log_dir` (`inferences_path`).

    The file starts over at epoch 0 or where it is missing, with its header and its description, `describe(width)`
    for guesses of `width` values per sample, written beside it (`.json`); until the attack guesses, nothing is
    written. The description's `target` names the columns: `score_<k>` for labels, `x_<k>` for features.
    """
    path = inferences_path(log_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = not path.exists() or epoch == 0
    if fresh and not guesses:  # nothing guessed yet (an inversion's first epoch): the file starts later
        return
    header: list[str] | None = None
    if fresh:
        width = guesses[0][3].shape[1]
        about = describe(width)
        path.with_suffix(".json").write_text(json.dumps(about, indent=1) + "\n")
        column = "score" if about["target"] == "labels" else "x"
        header = ["epoch", "step", "id", *(f"{column}_{k}" for k in range(width))]
    with path.open("w" if fresh else "a", newline="") as f:
        out = csv.writer(f)
        if header is not None:
            out.writerow(header)
        for guess_epoch, step, ids, scores in guesses:
            for sample, row in zip(ids.tolist(), scores.tolist(), strict=True):
                out.writerow([guess_epoch, step, sample, *(repr(float(v)) for v in row)])
