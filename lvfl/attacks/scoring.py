"""How an attack is scored against the truth: its metrics with their trivial baselines, and an epoch's tally.

The simulated shell (`lvfl.attacks.base.Attack`) and `lvfl attack-score` (a deployed attack's guesses, scored apart)
score with the same `evaluate`, so a deployed attack's scores equal the simulated attack's on the same run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["Tally", "evaluate"]


@dataclass
class Tally:
    """One epoch's scored samples, step by step: the attack's guesses and the truth (labels or features; CPU)."""

    scores: list[torch.Tensor] = field(default_factory=list)
    truths: list[torch.Tensor] = field(default_factory=list)

    def add(self, scores: torch.Tensor, truth: torch.Tensor) -> None:
        """Keep one step's scored guesses and their truth, on the CPU."""
        self.scores.append(scores.detach().float().cpu())
        self.truths.append(truth.detach().cpu())

    def __len__(self) -> int:
        return sum(len(t) for t in self.truths)


def evaluate(
    scores: torch.Tensor | Sequence[torch.Tensor],
    labels: torch.Tensor | Sequence[torch.Tensor],
    metrics: tuple[str, ...],
    prior: torch.Tensor | None = None,
) -> dict[str, float]:
    """The attack's metrics over scored samples (one tensor, or one per step), with trivial baselines and the count.

    - accuracy: the fraction whose argmax class is the true label, over every sample; its baseline is guessing the
      most frequent class of these samples (an attacker who knows the class prior and nothing else);
      `accuracy_se` is its binomial standard error.
    - mse (a feature attack: `labels` are the true features): the mean squared error per feature; its baseline,
      `baseline_mse`, guesses `prior` (the mean of the samples the attacker knows) for every sample, or zeros.
    - auc (binary): Li et al.'s leak AUC, the ROC AUC of column 1 minus column 0 for label 1, per step and averaged
      over the steps that hold both classes (scores of different steps come from different models and references,
      so they are ranked within a step, as the attacker ranks them); its baseline is 0.5.
    """
    from torchmetrics.functional.classification import binary_auroc

    steps_scores = [scores] if isinstance(scores, torch.Tensor) else list(scores)
    steps_labels = [labels] if isinstance(labels, torch.Tensor) else list(labels)
    every_score, every_label = torch.cat(steps_scores), torch.cat(steps_labels)
    n = len(every_label)
    out: dict[str, float] = {"samples": float(n)}
    if "mse" in metrics:
        guess, truth = every_score.float().reshape(n, -1), every_label.float().reshape(n, -1)
        base = torch.zeros(truth.shape[1]) if prior is None else prior.float().reshape(-1)
        out["mse"] = (guess - truth).pow(2).mean().item()
        out["baseline_mse"] = (base.unsqueeze(0) - truth).pow(2).mean().item()
    if "accuracy" in metrics:
        accuracy = (every_score.argmax(dim=1) == every_label).double().mean().item()
        out["accuracy"] = accuracy
        out["accuracy_se"] = math.sqrt(accuracy * (1 - accuracy) / n)
        out["baseline_accuracy"] = torch.bincount(every_label).max().item() / n
    if "auc" in metrics:
        if every_score.shape[1] != 2:
            raise ValueError(f"the leak AUC is for binary tasks; these scores have {every_score.shape[1]} classes")
        aucs = [
            binary_auroc(s[:, 1] - s[:, 0], y).item()
            for s, y in zip(steps_scores, steps_labels, strict=True)
            if len(torch.unique(y)) == 2
        ]
        if aucs:
            out["auc"] = sum(aucs) / len(aucs)
            out["baseline_auc"] = 0.5
    return out
