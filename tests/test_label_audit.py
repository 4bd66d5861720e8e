"""The label-leakage audit: the attack on hand-made gradients, wire observers, and EASTER's inherent leak."""

from __future__ import annotations

import csv
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import easter, make_trainer, mlp_parties

from lvfl.callbacks import CommunicationMeter
from lvfl.callbacks.label_audit import LabelLeakageAudit, gradient_label_scores, infer_labels_from_gradients
from lvfl.datamodules import Digits
from lvfl.privacy import DHMasking
from lvfl.wire import Wire, payload_nbytes


# ------------------------------------------------------------------------------------------------ the attack alone
@pytest.mark.parametrize("num_classes", [2, 3, 10])
def test_attack_recovers_labels_from_softmax_minus_onehot(num_classes):
    g = torch.Generator().manual_seed(num_classes)
    logits = torch.randn(500, num_classes, generator=g) * 3
    labels = torch.randint(num_classes, (500,), generator=g)
    grad = logits.softmax(-1) - F.one_hot(labels, num_classes).float()
    assert torch.equal(infer_labels_from_gradients(grad), labels)
    # the gradient autograd returns for mean-reduced cross-entropy is the same up to 1/B: same guesses
    logits.requires_grad_(True)
    (autograd,) = torch.autograd.grad(F.cross_entropy(logits, labels), logits)
    assert torch.allclose(autograd, grad / 500, atol=1e-7)
    assert torch.equal(infer_labels_from_gradients(autograd), labels)


def test_single_logit_binary_gradient_sign_and_norm_scores():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 1, generator=g, requires_grad=True)
    labels = torch.randint(2, (400,), generator=g)
    (grad,) = torch.autograd.grad(F.binary_cross_entropy_with_logits(z[:, 0], labels.float()), z)
    assert torch.equal(infer_labels_from_gradients(grad), labels)
    scores = gradient_label_scores(grad)
    assert scores.shape == (400, 2)
    assert torch.equal(scores.argmax(1), labels)
    assert torch.allclose(scores.abs()[:, 1], grad.abs()[:, 0])  # the magnitude is the gradient norm


def test_attack_rejects_non_matrix_gradients():
    with pytest.raises(ValueError, match="batch, logits"):
        infer_labels_from_gradients(torch.zeros(4))


# ------------------------------------------------------------------------------------------------ wire observers
def test_observers_see_exactly_what_the_ledger_counts(tmp_path):
    model = easter(4, aggregation=DHMasking())
    seen: Counter[tuple[str, str, str]] = Counter()
    seen_bytes: Counter[tuple[str, str, str]] = Counter()

    def observer(src: str, dst: str, tag: str, payload) -> None:
        seen[(src, dst, tag)] += 1
        seen_bytes[(src, dst, tag)] += payload_nbytes(payload)

    handle = model.wire.subscribe(observer)
    make_trainer(tmp_path, limit_train_batches=3, limit_val_batches=2).fit(model, datamodule=Digits(batch_size=64))
    assert seen == model.wire.messages
    assert seen_bytes == model.wire.bytes
    expected = {"split", "keys", "embeddings", "global_embedding", "predictions", "gradients"}
    assert {tag for _, _, tag in seen} == expected  # the split: the active party's, sent at set-up

    model.wire.unsubscribe(handle)
    before = sum(seen.values())
    model.wire.send("party1", "party0", torch.zeros(2, 3), tag="embeddings")
    assert sum(seen.values()) == before
    model.wire.unsubscribe(handle)  # idempotent


def test_observer_gets_the_received_object_detached():
    wire = Wire()
    got = []
    wire.subscribe(lambda src, dst, tag, payload: got.append(payload))
    x = torch.ones(3, 2, requires_grad=True)
    received = wire.send("party0", "party1", x * 2, tag="gradients")
    assert got[0] is received
    assert not received.requires_grad
    assert wire.messages[("party0", "party1", "gradients")] == 1


# ------------------------------------------------------------------------------------------------ EASTER's leak
def test_easter_without_label_mechanism_leaks_every_label(tmp_path):
    dm = Digits(num_parties=4, batch_size=64)
    model = easter(4)
    audit = LabelLeakageAudit()
    make_trainer(tmp_path, max_epochs=2, callbacks=[audit, CommunicationMeter(print_summary=False)]).fit(
        model, datamodule=dm
    )
    assert [h["epoch"] for h in audit.history] == [0.0, 1.0]
    for epoch in audit.history:
        assert set(epoch) == {"epoch", "party1", "party2", "party3"}  # passive parties only
        for party in ("party1", "party2", "party3"):
            assert epoch[party] >= 0.99, (party, epoch)
    state = audit.state_dict()  # the last epoch's counts: training samples only, validation never scored
    assert state["total"] == {k: len(dm.train_set) for k in ("party1", "party2", "party3")}
    assert model.wire.observers == ()  # unsubscribed at the end of fit

    (path,) = list(tmp_path.rglob("metrics.csv"))
    rows = [r for r in csv.DictReader(path.open()) if r.get("audit/label_attack_acc/party1")]
    assert len(rows) == 2
    for row in rows:
        for party in ("party1", "party2", "party3"):
            assert float(row[f"audit/label_attack_acc/{party}"]) >= 0.99
        assert "audit/label_attack_acc/party0" not in row or not row["audit/label_attack_acc/party0"]


def test_state_dict_round_trip():
    audit = LabelLeakageAudit()
    state = {"epoch": 3, "correct": {"party1": 7}, "total": {"party1": 9}, "history": [{"epoch": 2.0, "party1": 0.5}]}
    audit.load_state_dict(state)
    assert audit.state_dict() == state
    assert audit.history == [{"epoch": 2.0, "party1": 0.5}]


def test_randomized_response_caps_the_attack_at_its_keep_probability(tmp_path):
    """With k-ary randomized response the gradient carries the released label: the attack hits it, not the truth."""
    from lvfl.privacy import RandomizedResponse
    from lvfl.protocols import EASTER

    mechanism = RandomizedResponse(epsilon=1, seed=0)
    keep = mechanism.keep_probability(10)
    assert keep == pytest.approx(math.e / (math.e + 9))  # ~0.232
    model = EASTER(parties=mlp_parties(4), embedding_dim=8, label_mechanism=mechanism)
    audit = LabelLeakageAudit()
    make_trainer(tmp_path, max_epochs=1, callbacks=[audit]).fit(model, datamodule=Digits(num_parties=4, batch_size=64))
    (epoch,) = audit.history
    for party in ("party1", "party2", "party3"):
        assert abs(epoch[party] - keep) <= 0.03, (party, epoch[party], keep)
