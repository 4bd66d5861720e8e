"""Label mechanisms in the baselines: whatever derived from labels reaches a passive party comes from the release."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import make_trainer, mlp_parties, recording, spy_on

from lvfl.callbacks import LabelLeakageAudit
from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import LaplaceLabels, RandomizedResponse
from lvfl.protocols import CVFL, AggVFL, SplitNN


def test_splitnn_sends_gradients_of_the_protected_labels(tmp_path):
    torch.manual_seed(0)
    mechanism = RandomizedResponse(epsilon=1.0, seed=3)
    model = recording(SplitNN, snapshot=True)(
        parties=mlp_parties(4),
        top_model=partial(MLP, hidden=[]),
        embedding_dim=8,
        top_hidden=16,
        label_mechanism=mechanism,
    )
    seen = spy_on(model.wire)
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=Digits(num_parties=4))
    encoder, top, batch = model.before[model.active], model.before["top"], model.batches[0]
    received = {src: p for src, dst, tag, p in seen if tag == "embeddings"}
    z = torch.cat([encoder.encoder(batch.features["party0"]).detach(), *received.values()], dim=1)
    z.requires_grad_(True)
    protected = model.protected_labels(batch.ids)
    assert not torch.equal(protected, batch.labels)
    (by_hand,) = torch.autograd.grad(F.cross_entropy(top(z), protected), z)
    (true_grad,) = torch.autograd.grad(F.cross_entropy(top(z), batch.labels), z)
    sent = {dst: p for src, dst, tag, p in seen if tag == "gradients"}
    assert list(sent) == list(received) == ["party1", "party2", "party3"]
    for i, k in enumerate(sent, start=1):
        assert torch.allclose(sent[k], by_hand[:, 8 * i : 8 * (i + 1)], atol=1e-6), k
        assert not torch.allclose(sent[k], true_grad[:, 8 * i : 8 * (i + 1)], atol=1e-6), k
    assert model.privacy_ledger.total_epsilon == 1.0


@pytest.mark.parametrize(("mechanism", "low", "high"), [(None, 0.99, 1.0), ("rr", -0.03, 0.03)])
def test_aggvfl_gradients_leak_only_the_release(tmp_path, mechanism, low, high):
    """Agg_VFL returns dCE/dlogits to each passive party: the audit reads the label off it, or only the release."""
    rr = RandomizedResponse(epsilon=1.0, seed=0) if mechanism else None
    model = AggVFL(parties=mlp_parties(4), embedding_dim=8, aggregate="mean", label_mechanism=rr)
    audit = LabelLeakageAudit()
    make_trainer(tmp_path, max_epochs=1, callbacks=[audit]).fit(model, datamodule=Digits(num_parties=4))
    (epoch,) = audit.history
    offset = rr.keep_probability(10) if rr else 0.0
    for party in ("party1", "party2", "party3"):
        assert low <= epoch[party] - offset <= high, (party, epoch[party], offset)


def test_cvfl_sends_the_laplace_release_as_float_rows(tmp_path):
    model = CVFL(
        parties=mlp_parties(4),
        top_model=partial(MLP, hidden=[16]),
        embedding_dim=8,
        label_mechanism=LaplaceLabels(epsilon=2.0, seed=0),
    )
    seen = spy_on(model.wire)
    make_trainer(tmp_path, limit_train_batches=2, limit_val_batches=0).fit(model, datamodule=Digits(num_parties=4))
    labels = [(dst, p) for src, dst, tag, p in seen if tag == "labels"]
    assert len(labels) == 2 * 3  # every round, every passive party
    for _, rows in labels:
        assert rows.dtype == torch.float32
        assert rows.shape[1] == 10
        assert not torch.all((rows == 0) | (rows == 1))  # noisy rows, not one-hot labels
    assert model.privacy_ledger.total_epsilon == 2.0
