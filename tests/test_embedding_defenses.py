"""The active party's defenses on the embeddings it receives (`lvfl.privacy.defenses.embeddings`), vs references."""

from __future__ import annotations

import itertools

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers import make_trainer, mlp_parties

from lvfl.attacks import DirectionScoring
from lvfl.datamodules import BreastCancer, Digits
from lvfl.models import MLP
from lvfl.privacy import MID, DistanceCorrelation
from lvfl.privacy.defenses.embeddings import distance_correlation
from lvfl.protocols import SplitNN


def reference_dcor(x: np.ndarray, y: np.ndarray) -> float:
    """Szekely's sample distance correlation, written out with loops."""
    n = len(x)

    def centred(m):
        d = np.array([[np.linalg.norm(m[i] - m[j]) for j in range(n)] for i in range(n)])
        return d - d.mean(0, keepdims=True) - d.mean(1, keepdims=True) + d.mean()

    a, b = centred(x), centred(y)
    dcov2, vx, vy = (a * b).mean(), (a * a).mean(), (b * b).mean()
    return float(np.sqrt(dcov2 / np.sqrt(vx * vy)))


def test_distance_correlation_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    x, noise = torch.randn(40, 5, generator=g), torch.randn(40, 3, generator=g)
    y = torch.cat([x[:, :2] ** 2, noise[:, :1]], dim=1)
    assert distance_correlation(x, y).item() == pytest.approx(reference_dcor(x.numpy(), y.numpy()), rel=1e-4)
    assert distance_correlation(x, 2 * x + 1).item() == pytest.approx(1.0, abs=1e-5)
    big = torch.randn(400, 5, generator=g)
    independent = distance_correlation(big, torch.randn(400, 3, generator=g)).item()
    assert independent < 0.3 < distance_correlation(big, big[:, :2] ** 2).item()


def test_mid_kl_is_the_gaussians_kl_to_a_standard_normal():
    mid = MID(lam=2.0, bottleneck=3)
    mid.build(["party1"], 6)
    e = torch.randn(8, 6)
    out = mid("party1", e)
    assert out.shape == e.shape
    h = mid.encoders["party1"](e)
    mu, sigma = h[:, :3], torch.nn.functional.softplus(h[:, 3:] - 5.0)
    reference = (
        torch.distributions.kl_divergence(
            torch.distributions.Normal(mu, sigma), torch.distributions.Normal(torch.zeros(3), torch.ones(3))
        )
        .sum(1)
        .mean()
    )
    assert mid.penalty({"party1": e}, torch.zeros(8, dtype=torch.long), 2).item() == pytest.approx(
        2.0 * reference.item(), rel=1e-4
    )


def sent_gradients(tmp_path, defense):
    """The gradients party1 received in the first two steps of a seeded SplitNN fit with `defense`."""
    pl.seed_everything(0)
    model = SplitNN(parties=mlp_parties(2), top_model=MLP, embedding_dim=8, received_defense=defense)
    got = []
    model.wire.subscribe(lambda src, dst, tag, p: got.append(p.clone()) if tag == "gradients" else None)
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(model, datamodule=Digits(num_parties=2, batch_size=64))
    return got, model


@pytest.mark.parametrize("make", [lambda lam: DistanceCorrelation(lam=lam), lambda lam: MID(lam=lam)])
def test_a_received_defense_shapes_the_gradient_sent_down(tmp_path, make):
    plain, _ = sent_gradients(tmp_path / "plain", None)
    zero, _ = sent_gradients(tmp_path / "zero", DistanceCorrelation(lam=0.0))
    assert all(torch.equal(a, b) for a, b in zip(plain, zero, strict=True))  # no term, no change
    defended, model = sent_gradients(tmp_path / "on", make(1.0))
    assert not torch.allclose(plain[0], defended[0])
    active = {id(p) for p in model.party_parameters("party0")}
    assert all(id(p) in active for p in model.received_defense.parameters())  # the active party trains MID


def test_mid_and_dcor_weaken_direction_scoring_on_splitnn(tmp_path):
    aucs = {}
    for name, defense in (("mid", MID(lam=0.01)), ("dcor", DistanceCorrelation(lam=0.3))):
        pl.seed_everything(0)
        attack = DirectionScoring(known_labels=4)
        model = SplitNN(parties=mlp_parties(2), top_model=MLP, received_defense=defense)
        trainer = make_trainer(tmp_path / name, max_epochs=2, callbacks=[attack], limit_val_batches=0)
        trainer.fit(model, datamodule=BreastCancer(num_parties=2, batch_size=32))
        aucs[name] = attack.history[-1]["auc"]
    # undefended this setting reaches >= 0.95 (tests/test_attacks.py)
    assert all(auc < 0.85 for auc in aucs.values()), aucs


def test_received_defenses_refuse_a_sum_fusion_and_bad_settings():
    with pytest.raises(ValueError, match="received_defense works on each passive party's slot"):
        SplitNN(parties=mlp_parties(2), top_model=MLP, fusion="sum", received_defense=MID())
    for bad in itertools.chain(
        [lambda: MID(lam=-1.0), lambda: MID(bottleneck=0)], [lambda: DistanceCorrelation(lam=float("nan"))]
    ):
        with pytest.raises(ValueError, match="MID|DistanceCorrelation"):
            bad()
