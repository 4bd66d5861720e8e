"""Label inference by a passive party from the messages it receives: direct inference, norm and direction scoring.

- `DirectLabelInference` (DLI): where a passive party receives the gradient of the loss in its *own prediction*
  R_k (EASTER, Agg_VFL), a softmax cross-entropy row is (softmax(R_k) - onehot(y)) / B, whose one negative component
  is the label (Fu et al., "Label inference attacks against vertical federated learning", USENIX Security 2022);
  where it receives labels (C_VFL each batch, PraVFed's release once), they are the guess. With a label mechanism
  either carries the release, not the label: the attack recovers the release, so its accuracy falls to the
  mechanism's keep probability.
- `NormScoring` and `DirectionScoring` (Li et al., "Label leakage and protection in two-party split learning",
  ICLR 2022, arXiv 2102.08504): for a binary task, where the gradient is taken at a cut layer under a top model
  (SplitNN), the label is not in one component but in the gradient's size (the rarer class's examples are
  predicted worse, so their gradients are larger) and direction (for one logit, dL/dE_i = (p_i - y_i) dz/dE_i:
  opposite signs for the two classes along nearly the same direction). Their metric is the leak AUC.
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812

from lvfl.attacks.base import Attack, PartyView
from lvfl.messages import EMBEDDING_GRADIENT, LABELS, PREDICTION_GRADIENT

__all__ = [
    "DirectLabelInference",
    "DirectionScoring",
    "NormScoring",
    "gradient_label_scores",
    "infer_labels_from_gradients",
]


def gradient_label_scores(grad: torch.Tensor) -> torch.Tensor:
    """Per-class scores of the label from prediction gradients, higher meaning more likely (B x M -> B x max(M, 2)).

    Multi-logit rows (softmax cross-entropy, including binary tasks with 2 logits): the score is -grad, since the
    true class's component p_y - 1 is the only negative one. Single-logit rows (binary, sigmoid + BCE): the
    gradient is sigmoid(z) - y, negative exactly when y = 1, so the returned column pair is (g, -g): its sign is
    the guess and its magnitude (|sigmoid(z) - y|) the attacker's confidence.

    Raises:
        ValueError: if `grad` is not a B x M matrix.
    """
    if grad.ndim != 2 or grad.shape[1] < 1:
        raise ValueError(f"expected prediction gradients of shape (batch, logits), got {tuple(grad.shape)}")
    if grad.shape[1] == 1:
        return torch.cat([grad, -grad], dim=1)
    return -grad


def infer_labels_from_gradients(grad: torch.Tensor) -> torch.Tensor:
    """The labels a passive party infers from the prediction gradients it received (B x M -> B).

    Multi-logit: argmin of each row (the one negative component). Single logit: 1 where the gradient is negative,
    else 0. Exact for cross-entropy gradients unless the row is all zeros (a saturated softmax in float), where the
    guess falls back to class 0.
    """
    if grad.ndim == 2 and grad.shape[1] == 1:
        return (grad[:, 0] < 0).long()
    return gradient_label_scores(grad).argmax(dim=1)


def _batch_rows(payloads: list, batch: int) -> list[torch.Tensor]:
    """The payloads that are tensors with one row per sample of the batch (a whole-set release is not)."""
    return [p for p in payloads if isinstance(p, torch.Tensor) and p.ndim >= 1 and p.shape[0] == batch]


def _label_scores(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Class indices -> one-hot scores; label rows (a Laplace release) are scores already."""
    if labels.is_floating_point():
        return labels.float()
    return F.one_hot(labels.long(), num_classes).float()


class DirectLabelInference(Attack):
    """Direct label inference (DLI): the label read off the gradient of the party's own prediction, or the labels sent.

    Applies where a passive party receives `PREDICTION_GRADIENT` (EASTER, Agg_VFL) or `LABELS` (C_VFL, PraVFed);
    refuses SplitNN (its passive parties receive a cut-layer gradient: use `NormScoring` or `DirectionScoring`).
    Metric: `attack/dli/accuracy`, against guessing the most frequent class; with a label mechanism also
    `attack/dli/epsilon_bound`, the most an eps-label-DP release lets any guess from it keep.
    """

    name: ClassVar[str] = "dli"
    reads: ClassVar[tuple[str, ...]] = (PREDICTION_GRADIENT, LABELS)
    bounded_by_release: ClassVar[bool] = True  # it reads the release (or a gradient computed from it) alone

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """The last prediction gradient of the step, else this step's labels, else the release received at set-up."""
        batch = len(view.ids)
        grads = _batch_rows(view.received(PREDICTION_GRADIENT), batch)
        if grads:
            return gradient_label_scores(grads[-1].reshape(batch, -1).float())
        labels = _batch_rows(view.received(LABELS), batch)
        if labels:
            return _label_scores(labels[-1], view.num_classes)
        released = [p for p in view.received(LABELS, setup=True) if isinstance(p, torch.Tensor)]
        if released and released[-1].shape[0] == len(view.train_ids):  # rows in ascending training-ID order
            rows = torch.searchsorted(view.train_ids, view.ids)
            if bool((view.train_ids[rows.clamp(max=len(view.train_ids) - 1)] == view.ids).all()):
                return _label_scores(released[-1].cpu()[rows], view.num_classes)
        return None


class _BinaryGradientScoring(Attack):
    """Li et al.'s scoring attacks: binary tasks, on the gradient a passive party receives (cut layer or prediction)."""

    reads: ClassVar[tuple[str, ...]] = (EMBEDDING_GRADIENT, PREDICTION_GRADIENT)
    metrics: ClassVar[tuple[str, ...]] = ("auc",)

    def check_task(self, num_classes: int) -> None:
        """Refuse a task that is not binary: the leak AUC ranks samples between two classes."""
        if num_classes != 2:
            raise ValueError(
                f"{type(self).__name__} is for binary tasks (Li et al.); this task has {num_classes} classes"
            )

    @staticmethod
    def gradient(view: PartyView) -> torch.Tensor | None:
        """The step's last gradient as one row per sample (B, d), or None."""
        batch = len(view.ids)
        grads = _batch_rows(view.received(EMBEDDING_GRADIENT) + view.received(PREDICTION_GRADIENT), batch)
        return grads[-1].reshape(batch, -1).float() if grads else None


class NormScoring(_BinaryGradientScoring):
    """Norm scoring: rank samples by their gradient's L2 norm (Li et al., Sec. 3.2).

    Args:
        larger_norm_class: the class the attacker expects the larger norms for (side knowledge of the class prior:
            Li et al.'s analysis gives them to the rarer class, whose examples the model predicts worse). None: read
            it off the samples of known label, the mean norm of each class's last `window` known samples (the order
            can flip as the model learns: measured on breast_cancer's SplitNN, the rarer class has the larger norms
            in the first epoch and the smaller ones after); then `known_labels` must be at least 2, one of each
            class.
        window: how many of each class's latest known samples orient it (one sample's norm varies a lot).
        **kwargs: `Attack`'s (party, known_labels, seed, name).

    Metric: `attack/norm_scoring/auc`, the leak AUC for label 1 (0.5 is a random guess).
    """

    name: ClassVar[str] = "norm_scoring"

    def __init__(self, larger_norm_class: int | None = None, window: int = 8, **kwargs: Any) -> None:
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"NormScoring: window must be a positive integer, got {window!r}")
        if larger_norm_class not in (0, 1, None):
            raise ValueError(f"NormScoring: larger_norm_class must be 0, 1 or None, got {larger_norm_class!r}")
        if larger_norm_class is None and kwargs.get("known_labels", 0) < 2:
            raise ValueError(
                "NormScoring: give larger_norm_class (which class has the larger gradient norms), or known_labels "
                ">= 2 to read it off samples of known label"
            )
        super().__init__(**kwargs)
        self.larger_norm_class, self.window = larger_norm_class, window
        self._known_norms: tuple[deque[float], deque[float]] = (deque(maxlen=window), deque(maxlen=window))

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """Scores (B, 2): the norm for the class with larger norms, its negative for the other."""
        grad = self.gradient(view)
        if grad is None:
            return None
        norm = grad.norm(dim=1)
        larger = self.larger_norm_class
        if larger is None:
            positions, labels = view.known_in_batch()
            for position, label in zip(positions.tolist(), labels.tolist(), strict=True):
                self._known_norms[label].append(float(norm[position]))
            if not all(self._known_norms):
                return None  # not yet a sample of each class: no orientation
            means = [sum(norms) / len(norms) for norms in self._known_norms]
            larger = int(means[1] > means[0])
        return torch.stack([norm, -norm] if larger == 0 else [-norm, norm], dim=1)


class DirectionScoring(_BinaryGradientScoring):
    """Direction scoring: rank samples by their gradient's cosine with a known example's (Li et al., Sec. 3.3).

    The reference direction is the mean gradient of the batch's samples of known label 1 minus that of known label
    0 (side knowledge: `known_labels` labelled samples, at least one); a batch with none keeps the last reference.

    Metrics: `attack/direction_scoring/auc`, the leak AUC for label 1, and `.../accuracy`, the cosine's sign as the
    guess, on the samples whose labels it was not given.
    """

    name: ClassVar[str] = "direction_scoring"
    metrics: ClassVar[tuple[str, ...]] = ("auc", "accuracy")  # accuracy: the cosine's sign as the guess
    min_known_labels: ClassVar[int] = 1

    def __init__(self, known_labels: int = 2, **kwargs: Any) -> None:
        super().__init__(known_labels=known_labels, **kwargs)
        self._reference: torch.Tensor | None = None

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """Scores (B, 2): minus and plus the cosine with the reference direction."""
        grad = self.gradient(view)
        if grad is None:
            return None
        positions, labels = view.known_in_batch()
        if len(positions):
            known = grad[positions]
            reference = torch.zeros(grad.shape[1])
            if bool((labels == 1).any()):
                reference = reference + known[labels == 1].mean(dim=0)
            if bool((labels == 0).any()):
                reference = reference - known[labels == 0].mean(dim=0)
            if bool(reference.norm() > 0):
                self._reference = reference
        if self._reference is None:
            return None
        cosine = F.cosine_similarity(grad, self._reference.unsqueeze(0), dim=1)
        return torch.stack([-cosine, cosine], dim=1)
