"""`lvfl attack-score`: score a deployed attack's guesses against the truth, a step apart from the attacker's process.

    lvfl attack-score --inferences runs/party1/easter_digits/version_0/attacks/dli.csv \
        --config configs/easter/digits.yaml [--output scores.json]

Deployed, an attack runs in its party's own process, which holds no truth, and writes its guesses per epoch
(`lvfl.attacks.guesses`: `attacks/<name>.csv` and its description `attacks/<name>.json`). This command is the other
half, run by whoever holds both the guesses and the truth (a maintainer measuring a federation): it sets the run's
datamodule up from the same config as one process that holds every party's data (for `PartyTables`, every table),
takes the truth of the training samples by sample ID (their labels, or for a feature attack the active party's
features as scaled for training), leaves out the samples the attacker knew (its description lists them), and computes
the attack's metrics per epoch with the function the simulation scores with (`lvfl.attacks.evaluate`), so a deployed
attack's scores equal the simulated attack's on the same run. It prints one line per epoch and writes them as JSON
with `--output`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from lvfl.attacks import evaluate
from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors
from lvfl.commands.fit import build_cli
from lvfl.text_files import read_csv_rows, read_text

__all__ = ["main", "read_guesses", "score_guesses"]

DESCRIPTION = (
    "Score a deployed attack's guesses (the attacks/NAME.csv its party's process wrote) against the truth, from the "
    "run's config set up as one process that holds every party's data; the rest of the arguments are the config's."
)


def read_guesses(path: Path) -> tuple[dict, dict[int, list[tuple[int, list[int], list[list[float]]]]]]:
    """The attack's description and its guesses: {epoch: [(step, sample IDs, scores per sample)]}, in file order.

    Raises:
        FileNotFoundError, ValueError: no such file or description, or a row that is not epoch, step, ID, scores.
    """
    about_path = path.with_suffix(".json")
    if not path.is_file() or not about_path.is_file():
        raise FileNotFoundError(f"--inferences {path}: it and its description {about_path.name} must exist (a deployed "
                                "attack writes both in its party's run folder, attacks/)")  # fmt: skip
    try:
        about = json.loads(read_text(about_path, f"--inferences {path}: its description {about_path.name}"))
    except json.JSONDecodeError as err:
        raise ValueError(f"--inferences {path}: its description {about_path.name} is not JSON ({err})") from None
    if not isinstance(about, dict):
        raise ValueError(f"--inferences {path}: its description {about_path.name} is not a JSON object")
    epochs: dict[int, list[tuple[int, list[int], list[list[float]]]]] = {}
    rows = iter(read_csv_rows(path, f"--inferences {path}"))
    header = next(rows, None)
    width = 3 + int(about.get("width", about.get("num_classes", 0)))
    if header is None or header[:3] != ["epoch", "step", "id"] or len(header) != width:
        raise ValueError(f"--inferences {path}: not an attack's guesses (header {str(header)[:200]})")
    for line, row in enumerate(rows, start=2):
        if len(row) != width:
            raise ValueError(f"--inferences {path}, line {line}: {len(row)} fields, expected {width}")
        try:
            epoch, step, sample = int(row[0]), int(row[1]), int(row[2])
            scores = [float(v) for v in row[3:]]
        except ValueError:
            raise ValueError(f"--inferences {path}, line {line}: not epoch, step, ID and scores") from None
        if not all(math.isfinite(v) for v in scores):
            raise ValueError(f"--inferences {path}, line {line}: a score is not finite (NaN is no guess)")
        steps = epochs.setdefault(epoch, [])
        if not steps or steps[-1][0] != step:
            steps.append((step, [], []))
        steps[-1][1].append(sample)
        steps[-1][2].append(scores)
    return about, epochs


def score_guesses(about: dict, epochs: dict, truth: dict[int, int] | dict[int, torch.Tensor]) -> list[dict[str, float]]:
    """Per epoch, the attack's metrics (`lvfl.attacks.evaluate`) against `truth`, on the samples it did not know.

    `truth` maps a sample ID to its true label, or for a feature attack to its true feature row; the samples the
    attacker knew are left out as the simulation leaves them out.

    Raises:
        ValueError: a guessed sample ID the truth does not hold.
    """
    known = {int(s) for s in about.get("known_ids", [])}
    prior = torch.tensor(about["prior"], dtype=torch.float32) if about.get("prior") else None
    out = []
    for epoch, steps in sorted(epochs.items()):
        missing = [s for _, ids, _ in steps for s in ids if s not in truth]
        if missing:
            raise ValueError(f"the guesses name sample IDs the run's training split does not hold: {missing[:5]}")
        kept = [[(s, row) for s, row in zip(ids, rows, strict=True) if s not in known] for _, ids, rows in steps]
        scores = [torch.tensor([row for _, row in step], dtype=torch.float32) for step in kept]
        if about.get("target") == "active_features":
            truths = [torch.stack([truth[s].reshape(-1) for s, _ in step]) for step in kept if step]
            scores = [t for t in scores if len(t)]
        else:
            truths = [torch.tensor([truth[s] for s, _ in step], dtype=torch.long) for step in kept]
        out.append({"epoch": float(epoch), **evaluate(scores, truths, tuple(about["metrics"]), prior=prior)})
    return out


def main(argv: list[str]) -> None:
    """`lvfl attack-score` (see the module docstring)."""
    debug, argv = debug_requested(argv)
    with reported_errors(debug):
        parser = OneLineParser(prog="lvfl attack-score", description=DESCRIPTION)
        parser.add_argument("--inferences", type=Path, required=True, help="the attack's attacks/NAME.csv")
        parser.add_argument("--output", type=Path, default=None, help="also write the scores as JSON here")
        own, config = parser.parse_known_args(argv)
        if not config:
            raise ValueError("give the run's config (--config FILE, and any option it ran with) after --inferences")
        about, epochs = read_guesses(own.inferences)
        cli = build_cli(config, run=False)
        datamodule = cli.datamodule
        cli.model.prepare_datamodule(datamodule)  # the split the run drew (label-free under a label mechanism)
        datamodule.setup("fit")
        train = datamodule.train_set  # set up in this one process: every party's data, the true labels
        if about.get("target") == "active_features":
            active = datamodule.active_party_name
            rows = train.decode({active: train.stored[active]})[active].cpu()
            truth = dict(zip(train.ids.tolist(), rows, strict=True))
        else:
            truth = dict(zip(train.ids.tolist(), train.labels.tolist(), strict=True))
        scores = score_guesses(about, epochs, truth)
        for row in scores:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "epoch")
            print(f"lvfl attack-score: {about['name']} by {about['party']}, epoch {int(row['epoch'])}: {shown}")
        if own.output is not None:
            own.output.write_text(json.dumps({"attack": about, "epochs": scores}, indent=1) + "\n")
        sys.stdout.flush()
