"""Gradient defenses (`lvfl.privacy.defenses.gradients`): clipping, noise scales, sparsity, epsilon, vs references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import make_trainer, mlp_parties

from lvfl.attacks import DirectLabelInference
from lvfl.datamodules import Digits
from lvfl.privacy import GaussianNoise, GradientSparsification, LaplaceNoise
from lvfl.protocols import EASTER


def test_gaussian_noise_clips_each_sample_row_and_adds_noise_of_the_stated_std():
    batch = 50
    big = torch.randn(batch, 10) * 100 / batch  # every sample's own row far over the clip
    quiet = GaussianNoise(noise_multiplier=1e-9, clip=1.5, seed=0).apply(big)
    assert torch.allclose((quiet * batch).norm(dim=1), torch.full((batch,), 1.5), atol=1e-5)
    assert torch.allclose(quiet / quiet.norm(dim=1, keepdim=True), big / big.norm(dim=1, keepdim=True), atol=1e-5)
    noise = GaussianNoise(noise_multiplier=2.0, clip=0.5, seed=1).apply(torch.zeros(4000, 25)) * 4000
    assert noise.std().item() == pytest.approx(2.0 * 0.5, rel=0.02)  # sigma = z * C, on a sample's own row
    assert noise.mean().item() == pytest.approx(0.0, abs=0.01)


def test_laplace_noise_clips_in_l1_and_adds_noise_of_the_stated_scale():
    batch = 40
    big = torch.randn(batch, 6) * 10
    quiet = LaplaceNoise(scale=1e-9, clip=2.0, seed=0).apply(big)
    assert torch.allclose((quiet * batch).abs().sum(dim=1), torch.full((batch,), 2.0), atol=1e-4)
    noise = LaplaceNoise(scale=0.7, clip=2.0, seed=3).apply(torch.zeros(4000, 25)) * 4000
    assert noise.abs().mean().item() == pytest.approx(0.7, rel=0.02)  # E|Laplace(b)| = b
    assert noise.var().item() == pytest.approx(2 * 0.7**2, rel=0.05)  # Var = 2 b^2


def test_laplace_noise_is_finite_even_where_a_uniform_draw_hits_its_endpoint(monkeypatch):
    """The inverse-CDF form turned a uniform draw of exactly 0 into -inf (one float32 draw in 2^24: VFLAIR's 1024 x 10
    gradients met it within a few hundred steps); with every uniform draw at 0, the noise stays finite."""
    monkeypatch.setattr(torch, "rand", lambda *shape, **kwargs: torch.zeros(*shape))
    noise = LaplaceNoise(scale=1.0, clip=2.0, seed=0).apply(torch.zeros(64, 10))
    assert torch.isfinite(noise).all()


def test_sparsification_keeps_each_row_largest_entries_like_numpy():
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(30, 4, 5, generator=g)  # rows of 20 entries
    kept = GradientSparsification(keep=0.25).apply(grad)
    assert kept.shape == grad.shape
    rows, out = grad.reshape(30, -1).numpy(), kept.reshape(30, -1).numpy()
    for row, sent in zip(rows, out, strict=True):
        top = np.argsort(-np.abs(row))[:5]
        expected = np.zeros_like(row)
        expected[top] = row[top]
        np.testing.assert_array_equal(sent, expected)
    assert GradientSparsification(keep=0.01).apply(grad).reshape(30, -1).ne(0).sum(dim=1).eq(1).all()


def test_gaussian_epsilon_agrees_with_opacus_and_the_closed_form():
    """A release of a row clipped to C with N(0, (zC)^2) noise is a Gaussian mechanism of sensitivity 2C: Opacus's
    RDP accountant at noise multiplier z / 2 and sample rate 1 (lvfl claims no amplification by sampling) gives its
    epsilon; so does the closed form, the Gaussian's RDP releases * alpha * (2C)^2 / (2 (zC)^2) converted by Balle
    et al.'s bound (Theorem 21), minimised over a fine grid of orders."""
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    delta = 1e-5
    orders = [1 + x / 100 for x in range(1, 20000)]
    for z, releases in ((0.25, 5), (1.0, 1), (1.0, 5), (4.0, 30)):
        mine = GaussianNoise(noise_multiplier=z, clip=3.0).epsilon(releases, delta)
        rdp = compute_rdp(q=1.0, noise_multiplier=z / 2, steps=releases, orders=orders)
        assert mine == pytest.approx(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0], rel=1e-2)
        closed = min(
            releases * a * 2 / z**2 - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a) for a in orders
        )
        assert mine == pytest.approx(closed, rel=1e-2)
    assert GaussianNoise(1.0).epsilon(10, delta) > GaussianNoise(1.0).epsilon(1, delta)
    assert GaussianNoise(4.0).epsilon(10, delta) < GaussianNoise(1.0).epsilon(10, delta)
    assert LaplaceNoise(scale=2.0, clip=2.0).epsilon(3) == pytest.approx(6.0)
    assert GradientSparsification(0.5).epsilon(3) is None


def test_bad_parameters_are_refused_by_name():
    with pytest.raises(ValueError, match="GaussianNoise: noise_multiplier must be a positive number, got 0"):
        GaussianNoise(noise_multiplier=0)
    with pytest.raises(ValueError, match="LaplaceNoise: clip must be a positive number"):
        LaplaceNoise(clip=-1)
    with pytest.raises(ValueError, match=r"GradientSparsification: keep must be in \(0, 1\], got 1.5"):
        GradientSparsification(keep=1.5)


def test_noise_is_drawn_from_os_randomness_not_a_seed():
    a, b = GaussianNoise(1.0), GaussianNoise(1.0)
    torch.manual_seed(0)  # the config's seed does not fix it
    first = a.apply(torch.zeros(8, 4))
    torch.manual_seed(0)
    assert not torch.equal(first, b.apply(torch.zeros(8, 4)))


@pytest.mark.slow
def test_the_passive_party_receives_and_trains_on_the_defended_gradient(tmp_path):
    received = []
    model = EASTER(parties=mlp_parties(3), embedding_dim=8, gradient_defense=GaussianNoise(2.0, clip=1.0))
    model.wire.subscribe(lambda src, dst, tag, payload: tag == "gradients" and received.append(payload))
    attack = DirectLabelInference()
    trainer = make_trainer(tmp_path, max_epochs=1, callbacks=[attack], limit_val_batches=0, limit_train_batches=6)
    trainer.fit(model, datamodule=Digits(num_parties=3, batch_size=64))
    # undefended, every row has exactly one negative entry (softmax minus one-hot); noise of std 2 per entry breaks it
    negatives = torch.cat(received).lt(0).sum(dim=1)
    assert negatives.float().mean() > 3
    assert attack.history[-1]["accuracy"] < 0.5  # the attack reads the noisy gradient: it is no longer exact


def test_per_sample_rows_are_clipped_and_noised_as_they_are():
    rows = torch.randn(30, 8) * 10
    quiet = GaussianNoise(noise_multiplier=1e-9, clip=2.0, seed=0).apply_per_sample(rows)
    assert torch.allclose(quiet.norm(dim=1), torch.full((30,), 2.0), atol=1e-4)  # each row itself clipped to 2
    noise = GaussianNoise(noise_multiplier=0.5, clip=4.0, seed=1).apply_per_sample(torch.zeros(3000, 20))
    assert noise.std().item() == pytest.approx(2.0, rel=0.02)  # sigma = z * C on the row, not over the batch


def test_a_partys_embedding_noise_is_on_what_it_sends(tmp_path, monkeypatch):
    from lvfl.models import MLP
    from lvfl.protocols import SplitNN
    from lvfl.protocols.party_config import PartyConfig

    parties = mlp_parties(2)
    noisy = PartyConfig(model=parties[1].model, optimizer=parties[1].optimizer,
                        embedding_noise=GaussianNoise(noise_multiplier=0.5, clip=100.0, seed=3))  # fmt: skip
    model = SplitNN(parties=[parties[0], noisy], top_model=MLP, embedding_dim=8)
    clean, sent = [], []
    local_embeddings = SplitNN.local_embeddings

    def spy(self, batch):
        out = local_embeddings(self, batch)
        clean.append(out["party1"].detach().clone())
        return out

    monkeypatch.setattr(SplitNN, "local_embeddings", spy)
    model.wire.subscribe(lambda src, dst, tag, p: sent.append(p) if tag == "embeddings" else None)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0).fit(
        model, datamodule=Digits(num_parties=2, batch_size=256)
    )
    difference = torch.cat([s - c for s, c in zip(sent, clean, strict=True)])
    assert len(sent) == 1
    assert difference.std().item() == pytest.approx(0.5 * 100.0, rel=0.05)  # clip far above the rows: pure noise
    assert model._configs["party0"].embedding_noise is None
