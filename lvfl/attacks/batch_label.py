"""Batch-level label inference (Zou et al.): a passive party inverts one batch's gradient to the batch's labels.

Zou et al. ("Defending batch-level label inference and replacement attacks in vertical federated learning", IEEE
Transactions on Big Data 2022) invert a whole batch's gradient at once, as gradient inversion does in horizontal FL:
the attacker holds its own output H_k for the batch and the gradient g the active party sent for it, and searches
for dummy labels (and a dummy rest of the model) whose loss has that gradient in H_k:

    min over (y_hat, R_hat, W_hat)  || d CE(W_hat H_k + R_hat, softmax(y_hat)) / d H_k  -  g ||^2

- where g is the gradient of the party's own *prediction* (EASTER, Agg_VFL: the top is a sum, so W_hat is the
  identity times the aggregation's coefficient, as VFLAIR's "real top model" variant), R_hat stands for the other
  parties' predictions;
- where g is a cut-layer gradient under a top model (SplitNN), W_hat is a dummy linear top model on H_k and R_hat
  the rest of its logits (VFLAIR's dummy-top variant). The gradient then fixes the labels only up to a renaming of
  the classes (permuting W_hat's rows with the labels gives the same gradient); the attacker names each recovered
  class by the majority label of its known samples (`known_labels`, side knowledge), else leaves it as found.

VFLAIR (`BatchLabelReconstruction`) reads the gradient of the bottom model's weights, which the party computes from
g and its own input: g itself holds at least as much. Its settings: Adam, lr 0.05, 10,000 iterations, on the first
batch of training; here `iterations` and how many batches per epoch (`batches`) are options.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812

from lvfl.attacks.base import Attack, PartyView
from lvfl.attacks.label import _batch_rows
from lvfl.messages import EMBEDDING_GRADIENT, PREDICTION_GRADIENT

__all__ = ["BatchLabelInference", "invert_batch_gradient"]


def invert_batch_gradient(
    own: torch.Tensor,
    grad: torch.Tensor,
    num_classes: int,
    dummy_top: bool,
    iterations: int,
    lr: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Dummy label logits (B, K) whose mean cross-entropy has gradient `grad` in `own` (B, d); see the module.

    With `dummy_top` False, `own` is the party's prediction (d = K) and the logits are s * own + R_hat, with R_hat
    free and s > 0 the aggregation's coefficient of the prediction (1 for a sum, 1/C for a mean, a learned weight),
    searched for: so only `own`'s shape matters. With it True, a dummy linear top W_hat (K x d) on `own` is searched
    for instead.
    """
    batch = own.shape[0]
    own, grad = own.detach().float().reshape(batch, -1), grad.detach().float().reshape(batch, -1)
    if not dummy_top and own.shape[1] != num_classes:
        raise ValueError(
            f"a prediction gradient has one column per class ({num_classes}); this party's output has {own.shape[1]}"
        )
    # the gradient is of the batch's mean loss: rescale it (and the matching term) to per-sample size, so the
    # objective does not vanish with 1/B^2 for large batches
    target = grad * batch
    dummy_labels = torch.randn(batch, num_classes, generator=generator).requires_grad_(True)
    rest = torch.randn(batch, num_classes, generator=generator).requires_grad_(True)
    params = [dummy_labels, rest]
    if dummy_top:
        weight = (torch.randn(num_classes, own.shape[1], generator=generator) / own.shape[1] ** 0.5).requires_grad_()
    else:  # the aggregation's coefficient of the party's prediction: 1 (sum), 1/C (mean), a learned weight
        weight = torch.zeros(()).requires_grad_()  # log of a positive scale
    params.append(weight)
    optimizer = torch.optim.Adam(params, lr=lr)
    with torch.enable_grad():
        for _ in range(iterations):
            optimizer.zero_grad()
            h = own.clone().requires_grad_(True)
            logits = (h @ weight.T if dummy_top else weight.exp() * h) + rest
            loss = -(F.softmax(dummy_labels, dim=1) * F.log_softmax(logits, dim=1)).sum(dim=1).sum()
            (dummy_grad,) = torch.autograd.grad(loss, h, create_graph=True)
            (dummy_grad - target).pow(2).sum().backward()
            optimizer.step()
    return dummy_labels.detach()


class BatchLabelInference(Attack):
    """Batch-level label inference (Zou et al.): the batch's labels by inverting the gradient it received.

    Args:
        iterations: Adam steps of the inversion per attacked batch (VFLAIR: 10,000).
        lr: their learning rate (VFLAIR: 0.05).
        batches: how many batches of each epoch it attacks, from the first (VFLAIR: the first batch of training).
        **kwargs: `Attack`'s (party, known_labels, seed, name). Known labels name the recovered classes under a
            top model (SplitNN); under a sum top the gradient names them itself.

    Metric: `attack/bli/accuracy` over the attacked batches' samples, against guessing the most frequent class.
    """

    name: ClassVar[str] = "bli"
    reads: ClassVar[tuple[str, ...]] = (PREDICTION_GRADIENT, EMBEDDING_GRADIENT)
    needs_own_encoding: ClassVar[bool] = True
    bounded_by_release: ClassVar[bool] = True  # the gradient it inverts is computed from the release alone

    def __init__(self, iterations: int = 10_000, lr: float = 0.05, batches: int = 1, **kwargs: Any) -> None:
        for option, value in (("iterations", iterations), ("batches", batches)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchLabelInference: {option} must be a positive integer, got {value!r}")
        if not (isinstance(lr, int | float) and lr > 0):
            raise ValueError(f"BatchLabelInference: lr must be positive, got {lr!r}")
        super().__init__(**kwargs)
        self.iterations, self.lr, self.batches = iterations, float(lr), batches

    def infer(self, view: PartyView) -> torch.Tensor | None:
        """Class scores for an attacked batch: the inverted dummy labels, classes named by the known samples."""
        if view.batch_idx >= self.batches:
            return None
        batch = len(view.ids)
        prediction = _batch_rows(view.received(PREDICTION_GRADIENT), batch)
        embedding = _batch_rows(view.received(EMBEDDING_GRADIENT), batch)
        grads = prediction or embedding
        if not grads:
            return None
        dummy_top = not prediction
        # under a sum top the logits are the party's prediction plus the others' (R_hat, free): its own value adds
        # nothing, the gradient's width is the class count; under a top model its own encoding is the input
        own = view.own_encoding if dummy_top else grads[-1].reshape(batch, -1)
        if own is None:
            return None
        generator = torch.Generator().manual_seed(self.seed * 100_003 + view.epoch * 1_009 + view.batch_idx)
        with torch.random.fork_rng(devices=[]):
            scores = invert_batch_gradient(
                own.cpu(), grads[-1].cpu(), view.num_classes, dummy_top, self.iterations, self.lr, generator
            )
        return self.name_classes(scores, view) if dummy_top else scores

    @staticmethod
    def name_classes(scores: torch.Tensor, view: PartyView) -> torch.Tensor:
        """Rename the recovered classes by the majority true label of the known samples in each (identity if none)."""
        positions, labels = view.known_in_batch()
        if not len(positions):
            return scores
        found = scores[positions].argmax(dim=1)
        k = view.num_classes
        votes = torch.zeros(k, k)
        votes.index_put_((found, labels), torch.ones(len(found)), accumulate=True)
        # a greedy one-to-one naming, most-voted pairs first; classes with no known sample keep what is left
        mapping: dict[int, int] = {}
        used: set[int] = set()
        for flat in votes.flatten().argsort(descending=True).tolist():
            found_class, label = divmod(flat, k)
            if votes[found_class, label] <= 0:
                break
            if found_class not in mapping and label not in used:
                mapping[found_class], _ = label, used.add(label)
        free = iter(c for c in range(k) if c not in used)
        order = [mapping[c] if c in mapping else next(free) for c in range(k)]
        renamed = torch.empty_like(scores)
        renamed[:, order] = scores
        return renamed
