"""Label mechanisms: how the active party's labels are protected when anything derived from them leaves it.

A label mechanism releases *protected labels* that satisfy epsilon-label-DP (Ghazi et al., 2021): changing one
sample's label changes the distribution of the release by at most a factor e^epsilon. Two mechanisms:

- `LaplaceLabels`: PraVFed's mechanism (Eq. 8, Sec. IV-D1 and its proof, Eq. 10-14) applied to the one-hot label,
  `Y' = onehot(Y) + Lap(2 / epsilon)` per entry, a float tensor (N, M).
- `RandomizedResponse`: k-ary randomized response, a LongTensor (N,) of labels, each kept with probability
  `e^epsilon / (e^epsilon + k - 1)` and otherwise replaced by a uniformly drawn *other* label.

Whatever is computed from a release afterwards (argmax, a loss, a model trained on it, the gradients returned to a
passive party) is post-processing and keeps the guarantee. `PrivacyLedger` accounts for the epsilon spent: each
release of the same samples spends its epsilon again (basic, sequential composition), so a protocol draws a
release once, sends it once, and records it once.

Randomness (see STYLE.md: functional core, explicit generators). The functions `laplace_one_hot` and
`randomized_response` take a `torch.Generator` and never touch the global RNG. A mechanism holds its own generator:
with `seed=None` (the default, what production should use) it is seeded from OS randomness (`secrets`); a fixed
`seed` is for tests and reproducible experiments only, since anyone who knows the seed can strip the noise.
Known limits, stated rather than hidden: torch's generators are not cryptographically secure PRNGs, and Laplace
noise sampled in floating point is not exactly epsilon-DP against an adversary who inspects the low-order bits of
the release (Mironov, CCS 2012); randomized response has no such floating-point issue.
"""

from __future__ import annotations

import math
import secrets
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lvfl.checks import check_int, check_positive

#: task kinds a categorical label mechanism fits (the kinds of `lvfl.parties.TaskInfo`)
CLASSIFICATION_KINDS = ("binary", "multiclass")

#: L1 sensitivity of a one-hot label: changing one label moves two entries by 1
ONE_HOT_L1_SENSITIVITY = 2.0


# ---------------------------------------------------------------------------------------------------------------------
# Functional core: validation and the two mechanisms as pure functions of (labels, generator).
# ---------------------------------------------------------------------------------------------------------------------


def check_epsilon(epsilon: float) -> float:
    """`epsilon` as a float; an `OptionError` (a ValueError and a TypeError) naming it unless a finite number > 0."""
    return check_positive(epsilon, "epsilon")


def check_labels(labels: torch.Tensor, num_classes: int) -> None:
    """Raise a ValueError unless `labels` is a 1-D integer tensor with values in [0, num_classes)."""
    check_int(num_classes, "num_classes for a label mechanism", low=2)
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must be an integer class-index tensor, got dtype {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D (N,), got shape {tuple(labels.shape)}")
    low, high = (int(labels.min()), int(labels.max())) if labels.numel() else (0, 0)
    if low < 0 or high >= num_classes:
        raise ValueError(f"labels must lie in [0, num_classes={num_classes}), got values in [{low}, {high}]")


def randomized_response_keep_probability(epsilon: float, num_classes: int) -> float:
    """Probability that k-ary randomized response keeps the true label: e^eps / (e^eps + k - 1).

    Computed as 1 / (1 + (k - 1) e^-eps), which does not overflow for large epsilon.
    """
    epsilon = check_epsilon(epsilon)
    if num_classes < 2:
        raise ValueError(f"randomized response needs num_classes >= 2, got {num_classes}")
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def laplace_noise(shape: tuple[int, ...], scale: float, generator: torch.Generator) -> torch.Tensor:
    """Laplace(0, scale) samples (float64) on the generator's device, drawn from `generator` only.

    Uses Lap(b) = b * (E1 - E2) with E1, E2 independent Exp(1): both draws are finite (unlike the inverse-CDF form,
    which returns -inf when the uniform draw hits its endpoint).
    """
    device = generator.device
    e1 = torch.empty(shape, dtype=torch.float64, device=device).exponential_(generator=generator)
    e2 = torch.empty(shape, dtype=torch.float64, device=device).exponential_(generator=generator)
    return scale * (e1 - e2)


def laplace_one_hot(
    labels: torch.Tensor,
    num_classes: int,
    epsilon: float,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """PraVFed Eq. 8 on one-hot labels: `onehot(labels) + Lap(2 / epsilon)` per entry, shape (N, num_classes).

    (epsilon, 0)-label-DP: two one-hot labels differ in L1 norm by at most 2 (= the sensitivity), and the Laplace
    mechanism with scale sensitivity / epsilon is epsilon-DP for an L1 sensitivity (PraVFed Eq. 13).
    """
    epsilon = check_epsilon(epsilon)
    check_labels(labels, num_classes)
    scale = ONE_HOT_L1_SENSITIVITY / epsilon
    noise = laplace_noise((labels.shape[0], num_classes), scale, generator).to(labels.device)
    one_hot = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float64)
    return (one_hot + noise).to(dtype)


def randomized_response(
    labels: torch.Tensor, num_classes: int, epsilon: float, generator: torch.Generator
) -> torch.Tensor:
    """k-ary randomized response: each label kept w.p. e^eps / (e^eps + k - 1), else a uniform *other* label.

    epsilon-label-DP: for any output o, Pr[o | y] / Pr[o | y'] <= (e^eps / (e^eps + k - 1)) / (1 / (e^eps + k - 1))
    = e^eps. Returns a LongTensor (N,) on the labels' device.
    """
    epsilon = check_epsilon(epsilon)
    check_labels(labels, num_classes)
    keep_p = randomized_response_keep_probability(epsilon, num_classes)
    n, device = labels.shape[0], generator.device
    keep = torch.rand(n, generator=generator, device=device, dtype=torch.float64) < keep_p
    # a uniform draw from the k - 1 other classes: r in [0, k-2], shifted past the true label
    r = torch.randint(0, num_classes - 1, (n,), generator=generator, device=device)
    true = labels.long().to(device)
    other = r + (r >= true).long()
    return torch.where(keep, true, other).to(labels.device)


def laplace_argmax_keep_probability(epsilon: float, num_classes: int, grid_points: int = 400_001) -> float:
    """Pr[argmax(onehot(y) + Lap(2/eps)) == y]: what a passive party's best guess from a Laplace release achieves.

    With X, X_j iid Lap(b), b = 2 / eps, this is Pr[1 + X > max_j X_j] = integral f(x) F(x + 1)^(k-1) dx, computed by
    the trapezoid rule on [-40 b - 2, 40 b + 2] (the tails beyond hold mass e^-40).
    """
    epsilon = check_epsilon(epsilon)
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    b = ONE_HOT_L1_SENSITIVITY / epsilon
    half = 40.0 * b + 2.0
    x = torch.linspace(-half, half, grid_points, dtype=torch.float64)
    pdf = torch.exp(-x.abs() / b) / (2 * b)
    y = x + 1.0
    cdf = torch.where(y < 0, 0.5 * torch.exp(y / b), 1.0 - 0.5 * torch.exp(-y / b))
    return float(torch.trapezoid(pdf * cdf.pow(num_classes - 1), x).clamp(0.0, 1.0))


def os_seeded_generator(seed: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from `seed`, or from OS randomness (`secrets`) when `seed` is None (production)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(63) if seed is None else int(seed))
    return generator


# ---------------------------------------------------------------------------------------------------------------------
# Mechanisms: hold epsilon and a generator, call the functions above.
# ---------------------------------------------------------------------------------------------------------------------


class LabelMechanism(ABC):
    """A label-DP mechanism the active party applies before anything derived from labels leaves it.

    Args:
        epsilon: the privacy budget of one release, finite and > 0.
        seed: seed of the mechanism's own generator. None (default, for production) seeds it from OS randomness;
            a fixed seed is for tests and reproducibility only, since whoever knows it can remove the noise.
    """

    #: short name recorded in the `PrivacyLedger`
    name: str = "label_mechanism"

    def __init__(self, epsilon: float, seed: int | None = None) -> None:
        self.epsilon = check_epsilon(epsilon)
        # a fixed seed, named where a public config must not hold one (`VFLModule.fixed_noise_seeds`); not `seed`, so
        # that the run fingerprint (which records the settings an object keeps under their own names) does not change
        self.fixed_seed = seed
        self.generator = os_seeded_generator(seed)

    def check_task(self, num_classes: int, kind: str) -> None:
        """Raise a ValueError if the mechanism does not fit the task (both mechanisms need class labels)."""
        if kind not in CLASSIFICATION_KINDS:
            raise ValueError(
                f"{type(self).__name__} protects class labels and does not fit a {kind!r} task "
                f"(supported kinds: {', '.join(CLASSIFICATION_KINDS)})"
            )
        check_int(num_classes, f"num_classes for {type(self).__name__}", low=2)

    def release(self, labels: torch.Tensor, num_classes: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The protected labels for `labels` (N,); draws from `generator`, or the mechanism's own when None.

        Each call is a fresh release that spends `epsilon` again: draw once, send once, record it in a
        `PrivacyLedger` (or call `PrivacyLedger.release`, which does both).
        """
        return self._release(labels, num_classes, self.generator if generator is None else generator)

    @abstractmethod
    def _release(self, labels: torch.Tensor, num_classes: int, generator: torch.Generator) -> torch.Tensor:
        """Draw the release from `generator` (the mechanism itself; `release` picks the generator)."""

    def release_shadow(self, num_labels: int, num_classes: int) -> torch.Tensor:
        """The dtype and shape of a release of `num_labels` labels, on the meta device (no data, no secret drawn).

        What a passive party's own process holds in place of a release before it receives it (docs/federation.md):
        found by releasing one label from a throw-away generator, never the mechanism's own.
        """
        one = self._release(torch.zeros(1, dtype=torch.long), num_classes, torch.Generator().manual_seed(0))
        return torch.empty((int(num_labels), *one.shape[1:]), dtype=one.dtype, device="meta")

    @abstractmethod
    def keep_probability(self, num_classes: int) -> float:
        """Probability that the best single guess from one protected label is the true label."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(epsilon={self.epsilon!r})"


class LaplaceLabels(LabelMechanism):
    """PraVFed's label perturbation (Eq. 8) on one-hot labels: `Y' = onehot(Y) + Lap(2 / epsilon)`, (epsilon, 0)-DP.

    The release is a float tensor (N, M) of noisy one-hot rows, which PraVFed's passive parties regress on with
    MSE (Eq. 4). The sensitivity is the L1 distance between two one-hot labels, Delta f = 2, so each entry gets
    Laplace noise of scale 2 / epsilon; the noise is zero-mean, so the one-hot is recovered in expectation.

    Why one-hot rather than noising the integer class index: `Y + Lap(Delta f / eps)` on the index with
    Delta f = M - 1 and clamping to [0, M - 1] imposes an order on the classes (class 3 is "between" 2 and 4, so
    noise moves a label to its numeric neighbours and a regression target rewards predicting the mean class), and
    clamping piles the noise mass onto the two boundary classes, a bias that grows with the noise. The one-hot form
    is order-free and unbiased; clamping or rounding it would be post-processing (keeps DP) but reintroduces bias,
    so it is left to the consumer. Any post-processing, such as argmax, keeps the guarantee.

    `keep_probability` is Pr[argmax(Y') = Y], computed numerically (`laplace_argmax_keep_probability`).

    Example:
        >>> mech = LaplaceLabels(epsilon=1.0, seed=0)  # fixed seed: doctest only
        >>> mech.release(torch.tensor([0, 2]), num_classes=3).shape
        torch.Size([2, 3])
    """

    name = "laplace"

    def __init__(self, epsilon: float, seed: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(epsilon, seed)
        self.dtype = dtype

    @property
    def scale(self) -> float:
        """The Laplace scale b = Delta f / epsilon = 2 / epsilon."""
        return ONE_HOT_L1_SENSITIVITY / self.epsilon

    def _release(self, labels: torch.Tensor, num_classes: int, generator: torch.Generator) -> torch.Tensor:
        return laplace_one_hot(labels, num_classes, self.epsilon, generator, self.dtype)

    def keep_probability(self, num_classes: int) -> float:
        """Pr[argmax(Y') = Y] for one release with `num_classes` classes."""
        self.check_task(num_classes, "binary" if num_classes == 2 else "multiclass")
        return laplace_argmax_keep_probability(self.epsilon, num_classes)


class RandomizedResponse(LabelMechanism):
    """k-ary randomized response: keep the label w.p. e^eps / (e^eps + k - 1), else a uniform other label; eps-DP.

    The release is a LongTensor (N,) of class labels, a drop-in replacement for the true labels in any loss. It is
    the standard mechanism for class labels (Warner 1965; Ghazi et al., 2021, "Deep learning with label differential
    privacy") and, for a single label, the optimal one: no eps-DP mechanism keeps the label more often.

    Example:
        >>> mech = RandomizedResponse(epsilon=1.0, seed=0)  # fixed seed: doctest only
        >>> round(mech.keep_probability(2), 4)
        0.7311
    """

    name = "randomized_response"

    def _release(self, labels: torch.Tensor, num_classes: int, generator: torch.Generator) -> torch.Tensor:
        return randomized_response(labels, num_classes, self.epsilon, generator)

    def keep_probability(self, num_classes: int) -> float:
        """e^eps / (e^eps + k - 1): the probability a released label equals the true one."""
        self.check_task(num_classes, "binary" if num_classes == 2 else "multiclass")
        return randomized_response_keep_probability(self.epsilon, num_classes)


# ---------------------------------------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseRecord:
    """A ledger entry for one release of protected labels: the mechanism, the epsilon spent, how many labels, a tag.

    (The release itself, the protected labels of a run, is `lvfl.privacy.labels.release.LabelRelease`.)
    """

    mechanism: str
    epsilon: float
    num_labels: int
    tag: str = "train"


class PrivacyLedger:
    """The label-DP budget spent so far, one entry per release.

    `total_epsilon` is basic (sequential) composition: the sum of every release's epsilon. That is the guarantee
    for a sample covered by every release, and a valid upper bound for all samples whatever the releases cover;
    the ledger does not track sample identities, so it never claims the smaller bound that parallel composition
    would give for releases over disjoint samples (`epsilon_by_tag` gives the per-tag sums for such an argument).
    Recording a second release under a tag already used warns, since re-releasing the same labels spends the
    budget again. `state_dict` holds plain Python values, so the ledger checkpoints with `weights_only=True`.

    Example:
        >>> ledger = PrivacyLedger()
        >>> _ = ledger.release(RandomizedResponse(1.0, seed=0), torch.tensor([0, 1, 1]), num_classes=2)
        >>> ledger.total_epsilon
        1.0
    """

    def __init__(self) -> None:
        self.releases: list[ReleaseRecord] = []

    def record(self, mechanism: LabelMechanism, num_labels: int, tag: str = "train") -> ReleaseRecord:
        """Record one release of `num_labels` labels by `mechanism`; warns when `tag` was already released."""
        check_int(num_labels, "num_labels", low=0)
        entry = ReleaseRecord(mechanism.name, check_epsilon(mechanism.epsilon), int(num_labels), str(tag))
        previous = [r for r in self.releases if r.tag == entry.tag]
        self.releases.append(entry)
        if previous:
            warnings.warn(
                f"label release #{len(previous) + 1} under tag {entry.tag!r}: basic composition adds the epsilons, "
                f"epsilon for {entry.tag!r} is now {self.epsilon_by_tag()[entry.tag]:g} "
                f"(total {self.total_epsilon:g})",
                stacklevel=2,
            )
        return entry

    def release(
        self,
        mechanism: LabelMechanism,
        labels: torch.Tensor,
        num_classes: int,
        tag: str = "train",
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Draw a release with `mechanism` and record it, so that no release goes unaccounted."""
        protected = mechanism.release(labels, num_classes, generator)
        self.record(mechanism, int(labels.shape[0]), tag)
        return protected

    @property
    def total_epsilon(self) -> float:
        """Basic composition over all releases: the sum of their epsilons (0.0 when nothing was released)."""
        return math.fsum(r.epsilon for r in self.releases)

    def epsilon_by_tag(self) -> dict[str, float]:
        """Sum of epsilons per tag."""
        out: dict[str, float] = {}
        for r in self.releases:
            out[r.tag] = out.get(r.tag, 0.0) + r.epsilon
        return out

    def __len__(self) -> int:
        return len(self.releases)

    def state_dict(self) -> dict[str, Any]:
        """The releases as plain dicts (checkpoint-safe)."""
        return {"releases": [asdict(r) for r in self.releases]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned; raises a ValueError on a malformed state."""
        try:
            releases = [
                ReleaseRecord(
                    mechanism=str(r["mechanism"]),
                    epsilon=check_epsilon(r["epsilon"]),
                    num_labels=int(r["num_labels"]),
                    tag=str(r["tag"]),
                )
                for r in state["releases"]
            ]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed PrivacyLedger state: {err}") from err
        self.releases = releases

    def __repr__(self) -> str:
        return f"PrivacyLedger(releases={len(self.releases)}, total_epsilon={self.total_epsilon:g})"
