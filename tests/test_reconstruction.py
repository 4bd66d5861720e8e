"""Feature reconstruction by the active party (`lvfl.attacks.GenerativeRegression`, Luo et al.'s GRN)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from helpers import easter, make_trainer, mlp_parties

from lvfl.attacks import GenerativeRegression
from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.protocols import SplitNN


class CutGRN(GenerativeRegression):
    """GRN fit to the observed rows shuffled: the link between a sample and what was observed for it is cut."""

    def observed(self, target: torch.Tensor) -> torch.Tensor:
        return target[torch.randperm(len(target), generator=torch.Generator().manual_seed(0))]


def fit(tmp_path, callbacks, model=None):
    pl.seed_everything(0)
    model = model or SplitNN(parties=mlp_parties(2, momentum=0.9), top_model=MLP, embedding_dim=16)
    trainer = make_trainer(tmp_path, max_epochs=3, callbacks=callbacks, limit_val_batches=0)
    trainer.fit(model, datamodule=Digits(num_parties=2, batch_size=64))
    return model


@pytest.mark.slow
def test_grn_reconstructs_from_what_the_active_party_observed_and_nothing_when_the_link_is_cut(tmp_path):
    settings = {"hidden": (128,), "steps": 1000, "lr": 0.01}
    attacks = {
        (match, cut): (CutGRN if cut else GenerativeRegression)(match=match, name=f"{match}{cut}", **settings)
        for match in ("embedding", "prediction")
        for cut in (False, True)
    }
    fit(tmp_path, list(attacks.values()))
    last = {key: attack.history[-1] for key, attack in attacks.items()}
    assert [h["epoch"] for h in attacks["embedding", False].history] == [2.0]  # the trained model only
    for match in ("embedding", "prediction"):
        assert last[match, False]["mse"] < 0.85 * last[match, True]["mse"], last
    embedding = last["embedding", False]
    assert embedding["mse"] < 0.7 * embedding["random_mse"]  # Luo et al.'s baseline: a uniform guess in the range
    features = Digits(num_parties=2)
    features.prepare_data()
    features.setup("fit")
    x = features.train_set.decode({"party1": features.train_set.stored["party1"]})["party1"]
    x = x.reshape(len(x), -1)
    assert embedding["baseline_mse"] == pytest.approx((x - x.mean(0)).pow(2).mean().item(), rel=1e-5)


def test_grn_leaves_the_run_bit_identical(tmp_path):
    plain = fit(tmp_path / "plain", [])
    attacked = fit(tmp_path / "grn", [GenerativeRegression(hidden=(16,), steps=20)])
    assert all(torch.equal(v, attacked.state_dict()[k]) for k, v in plain.state_dict().items())


def test_grn_refuses_a_protocol_without_a_top_model_and_an_active_victim(tmp_path):
    with pytest.raises(ValueError, match="GenerativeRegression does not apply to EASTER"):
        fit(tmp_path, [GenerativeRegression()], model=easter(2))
    with pytest.raises(ValueError, match="victim must be a passive party"):
        fit(tmp_path, [GenerativeRegression(victim="party0")])
    with pytest.raises(ValueError, match="match must be 'prediction' or 'embedding'"):
        GenerativeRegression(match="logits")


def test_grn_reads_the_victims_ranges_only_as_declared_side_knowledge(tmp_path):
    """feature_range='victim' scales the generator to the victim's training ranges (declared side knowledge); with
    public bounds the attack scales to those: its random baseline (a uniform guess in the range it writes into) is
    the closed form for [low, high] on the victim's features, not for the victim's own ranges."""
    public = GenerativeRegression(hidden=(16,), steps=20, feature_range=[-0.5, 0.25], name="public")
    victim = GenerativeRegression(hidden=(16,), steps=20, name="victim")
    fit(tmp_path, [public, victim])
    features = Digits(num_parties=2)
    features.prepare_data()
    features.setup("fit")
    x = features.train_set.decode({"party1": features.train_set.stored["party1"]})["party1"]
    x = x.reshape(len(x), -1).float()

    def uniform_guess(lo, hi):
        return ((hi - lo).pow(2) / 12 + ((lo + hi) / 2 - x).pow(2)).mean().item()

    low, high = torch.full((x.shape[1],), -0.5), torch.full((x.shape[1],), 0.25)
    assert public.history[-1]["random_mse"] == pytest.approx(uniform_guess(low, high), rel=1e-5)
    own = uniform_guess(x.min(dim=0).values, x.max(dim=0).values)
    assert victim.history[-1]["random_mse"] == pytest.approx(own, rel=1e-5)
    with pytest.raises(ValueError, match="feature_range must be 'victim'"):
        GenerativeRegression(feature_range=[1.0, 0.0])
