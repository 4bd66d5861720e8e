"""Label mechanisms: statistical checks against closed forms and scipy references, accounting, bad input."""

from __future__ import annotations

import io
import math

import pytest
import scipy.stats
import torch

from lvfl.privacy.labels.mechanisms import (
    LabelMechanism,
    LaplaceLabels,
    PrivacyLedger,
    RandomizedResponse,
    laplace_argmax_keep_probability,
    laplace_one_hot,
    randomized_response,
    randomized_response_keep_probability,
)

N = 200_000
SIGMAS = 4.0  # tolerance in standard errors
P_MIN = 1e-4  # reject a goodness-of-fit test below this p-value


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def uniform_labels(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(0, k, (n,), generator=gen(seed))


# --- randomized response ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "k"), [(0.1, 2), (1.0, 2), (1.0, 10), (4.0, 10), (0.5, 100), (8.0, 3)])
def test_rr_keeps_true_label_with_closed_form_probability(epsilon: float, k: int) -> None:
    labels = uniform_labels(N, k, seed=1)
    out = randomized_response(labels, k, epsilon, gen(2))
    p = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    assert randomized_response_keep_probability(epsilon, k) == pytest.approx(p, rel=1e-12)
    kept = (out == labels).double().mean().item()
    se = math.sqrt(p * (1 - p) / N)
    assert abs(kept - p) <= SIGMAS * se, (kept, p, se)


def test_rr_keep_probability_known_values() -> None:
    assert randomized_response_keep_probability(math.log(3), 2) == pytest.approx(0.75)
    assert randomized_response_keep_probability(math.log(9), 10) == pytest.approx(0.5)
    assert randomized_response_keep_probability(1000.0, 10) == 1.0  # no overflow
    assert RandomizedResponse(1.0).keep_probability(2) == pytest.approx(math.e / (math.e + 1))


@pytest.mark.parametrize("true_label", [0, 4, 9])
def test_rr_non_kept_labels_uniform_over_other_classes(true_label: int) -> None:
    k, epsilon = 10, 1.0
    labels = torch.full((N,), true_label, dtype=torch.long)
    out = randomized_response(labels, k, epsilon, gen(3 + true_label))
    flipped = out[out != true_label]
    counts = torch.bincount(flipped, minlength=k)
    assert counts[true_label] == 0
    others = counts[torch.arange(k) != true_label].numpy()
    assert others.min() > 0
    assert scipy.stats.chisquare(others).pvalue > P_MIN


def test_rr_mixed_labels_flip_offsets_uniform() -> None:
    # with every true class present, (out - y) mod k over flipped samples is uniform on 1..k-1
    k = 7
    labels = uniform_labels(N, k, seed=5)
    out = randomized_response(labels, k, 0.5, gen(6))
    offsets = (out - labels) % k
    counts = torch.bincount(offsets[offsets != 0], minlength=k)[1:].numpy()
    assert scipy.stats.chisquare(counts).pvalue > P_MIN


def test_rr_output_type_and_range() -> None:
    labels = torch.tensor([0, 1, 2, 2], dtype=torch.int32)
    out = RandomizedResponse(0.1, seed=0).release(labels, 3)
    assert out.dtype == torch.long
    assert out.shape == (4,)
    assert int(out.min()) >= 0
    assert int(out.max()) < 3


# --- Laplace one-hot -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_laplace_noise_has_scale_two_over_epsilon(epsilon: float) -> None:
    k, n = 10, 50_000
    labels = uniform_labels(n, k, seed=7)
    released = laplace_one_hot(labels, k, epsilon, gen(8), dtype=torch.float64)
    assert released.shape == (n, k)
    noise = (released - torch.nn.functional.one_hot(labels, k).double()).flatten()
    m, b = noise.numel(), 2.0 / epsilon
    assert LaplaceLabels(epsilon).scale == pytest.approx(b)
    # X ~ Lap(b): mean 0 (sd sqrt(2) b), |X| ~ Exp(b) (mean b, sd b), X^2 mean 2 b^2 (sd sqrt(20) b^2)
    assert abs(noise.mean().item()) <= SIGMAS * math.sqrt(2) * b / math.sqrt(m)
    assert abs(noise.abs().mean().item() - b) <= SIGMAS * b / math.sqrt(m)
    assert abs(noise.pow(2).mean().item() - 2 * b * b) <= SIGMAS * math.sqrt(20) * b * b / math.sqrt(m)
    # and the whole distribution, against scipy's Laplace (independent reference), on a subsample
    assert scipy.stats.kstest(noise[:100_000].numpy(), "laplace", args=(0.0, b)).pvalue > P_MIN


def test_laplace_recovers_one_hot_in_expectation() -> None:
    k, epsilon = 4, 1.0
    labels = uniform_labels(N, k, seed=9)
    released = LaplaceLabels(epsilon, seed=10, dtype=torch.float64).release(labels, k)
    b = 2.0 / epsilon
    for c in range(k):
        rows = released[labels == c]
        se = math.sqrt(2) * b / math.sqrt(rows.shape[0])
        target = torch.nn.functional.one_hot(torch.tensor(c), k).double()
        assert (rows.mean(0) - target).abs().max().item() <= SIGMAS * se


@pytest.mark.parametrize(("epsilon", "k"), [(0.5, 2), (1.0, 10), (4.0, 3)])
def test_laplace_argmax_keep_probability_matches_monte_carlo(epsilon: float, k: int) -> None:
    labels = uniform_labels(N, k, seed=11)
    released = LaplaceLabels(epsilon, seed=12).release(labels, k)
    hit = (released.argmax(1) == labels).double().mean().item()
    p = LaplaceLabels(epsilon).keep_probability(k)
    assert abs(hit - p) <= SIGMAS * math.sqrt(p * (1 - p) / N), (hit, p)


def test_laplace_argmax_keep_probability_limits() -> None:
    assert laplace_argmax_keep_probability(1e-4, 5) == pytest.approx(0.2, abs=1e-3)  # no information: 1/k
    assert laplace_argmax_keep_probability(200.0, 5) == pytest.approx(1.0, abs=1e-9)


def test_laplace_output_type_and_device() -> None:
    labels = torch.tensor([1, 0])
    out = LaplaceLabels(1.0, seed=0).release(labels, 2)
    assert out.dtype == torch.float32
    assert out.shape == (2, 2)
    assert out.device == labels.device


# --- randomness: explicit generators only ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LaplaceLabels, RandomizedResponse])
def test_generators_are_explicit(cls: type[LabelMechanism]) -> None:
    labels = uniform_labels(1000, 5, seed=13)
    before = torch.get_rng_state()
    a = cls(1.0, seed=42).release(labels, 5)
    b = cls(1.0, seed=42).release(labels, 5)
    c = cls(1.0, seed=42).release(labels, 5, generator=gen(43))
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is untouched
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # unseeded mechanisms draw their seed from OS randomness: two of them disagree
    assert not torch.equal(cls(1.0).release(labels, 5), cls(1.0).release(labels, 5))
    # successive releases of one mechanism are fresh draws
    mech = cls(1.0, seed=1)
    assert not torch.equal(mech.release(labels, 5), mech.release(labels, 5))


# --- accounting ------------------------------------------------------------------------------------------------------


def test_ledger_adds_up_over_two_releases_and_round_trips() -> None:
    ledger = PrivacyLedger()
    labels = uniform_labels(100, 3, seed=14)
    assert ledger.total_epsilon == 0.0
    ledger.release(LaplaceLabels(0.5, seed=0), labels, 3, tag="train")
    assert ledger.total_epsilon == pytest.approx(0.5)
    with pytest.warns(UserWarning, match=r"release #2 under tag 'train'.*adds.*1\.5"):
        ledger.release(RandomizedResponse(1.0, seed=0), labels, 3, tag="train")
    ledger.record(RandomizedResponse(0.25), num_labels=40, tag="eval")
    assert ledger.total_epsilon == pytest.approx(1.75)
    assert ledger.epsilon_by_tag() == pytest.approx({"train": 1.5, "eval": 0.25})
    assert [(r.mechanism, r.num_labels) for r in ledger.releases] == [
        ("laplace", 100),
        ("randomized_response", 100),
        ("randomized_response", 40),
    ]

    buffer = io.BytesIO()
    torch.save(ledger.state_dict(), buffer)
    buffer.seek(0)
    restored = PrivacyLedger()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.releases == ledger.releases
    assert restored.total_epsilon == ledger.total_epsilon
    assert len(restored) == 3


def test_ledger_rejects_malformed_state() -> None:
    with pytest.raises(ValueError, match="malformed PrivacyLedger state"):
        PrivacyLedger().load_state_dict({"releases": [{"mechanism": "laplace", "epsilon": -1.0}]})
    with pytest.raises(ValueError, match="malformed PrivacyLedger state"):
        PrivacyLedger().load_state_dict({})


# --- bad input -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [LaplaceLabels, RandomizedResponse])
@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_bad_epsilon(cls: type[LabelMechanism], epsilon: float) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        cls(epsilon)


@pytest.mark.parametrize("epsilon", [None, "1.0", True])
def test_epsilon_must_be_a_number(epsilon: object) -> None:
    with pytest.raises(TypeError, match="epsilon"):
        RandomizedResponse(epsilon)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [LaplaceLabels, RandomizedResponse])
@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (torch.tensor([0, 3]), r"labels must lie in \[0, num_classes=3\)"),
        (torch.tensor([-1, 0]), r"labels must lie in \[0, num_classes=3\)"),
        (torch.tensor([0.0, 1.0]), "integer class-index"),
        (torch.tensor([[0, 1]]), "1-D"),
    ],
)
def test_bad_labels(cls: type[LabelMechanism], labels: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cls(1.0, seed=0).release(labels, 3)


@pytest.mark.parametrize("cls", [LaplaceLabels, RandomizedResponse])
def test_mechanism_on_a_task_it_does_not_fit(cls: type[LabelMechanism]) -> None:
    mech = cls(1.0)
    mech.check_task(2, "binary")
    mech.check_task(10, "multiclass")
    with pytest.raises(ValueError, match=f"{cls.__name__} protects class labels and does not fit a 'regression'"):
        mech.check_task(1, "regression")
    with pytest.raises(ValueError, match=rf"num_classes for {cls.__name__} must be an int >= 2, got 1"):
        mech.check_task(1, "multiclass")
    with pytest.raises(ValueError, match=r"num_classes for a label mechanism must be an int >= 2, got 1"):
        mech.release(torch.zeros(3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match=rf"num_classes for {cls.__name__} must be an int >= 2, got 1"):
        mech.keep_probability(1)
