"""Student distillation (`lvfl.inference.student`, `lvfl.callbacks.student`) against hand-written references."""

from __future__ import annotations

import csv
import math
from functools import partial

import numpy as np
import pytest
import torch
from helpers import REPO, easter, make_trainer
from sklearn.metrics import accuracy_score, roc_auc_score

from lvfl.callbacks.student import StudentDistillation
from lvfl.commands.fit import build_cli
from lvfl.datamodules import BreastCancer
from lvfl.inference.student import build_student, fit_student
from lvfl.inference.teacher import StudentData, student_data, teacher_soft_label_parts, teacher_soft_labels
from lvfl.models import MLP, LogisticRegression
from lvfl.privacy import PaillierSoftLabels, PlainSoftLabels, SoftLabelParts
from lvfl.privacy.soft_labels import check_lam, student_loss
from lvfl.wire import Wire


def _toy(n: int = 12, features: int = 3, seed: int = 0) -> StudentData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
    overlap = torch.arange(n) % 2 == 0
    soft = torch.rand(n, 2, generator=g).softmax(-1) * overlap[:, None]
    return StudentData(features=x, labels=y, overlap=overlap, soft_labels=soft)


@pytest.mark.parametrize("lam", [-0.1, 1.01, "0.5", None])
def test_lam_outside_unit_interval_raises_naming_it(lam):
    with pytest.raises(ValueError, match=r"lam must be a finite number in \[0, 1\]"):
        check_lam(lam)
    with pytest.raises(ValueError, match=r"lam must be a finite number in \[0, 1\]"):
        StudentDistillation(lam=lam)


@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_student_loss_matches_hand_written_reference(lam):
    torch.manual_seed(0)
    logits = torch.randn(5, 3, dtype=torch.float64)
    labels = torch.tensor([0, 2, 1, 1, 0])
    overlap = torch.tensor([True, False, True, True, False])
    soft = torch.rand(5, 3, dtype=torch.float64).softmax(-1)
    total = 0.0
    for i in range(5):
        z = logits[i].tolist()
        log_norm = math.log(sum(math.exp(v) for v in z))
        log_p = [v - log_norm for v in z]
        ce = -log_p[int(labels[i])]
        if overlap[i]:
            kd = -sum(float(soft[i, j]) * log_p[j] for j in range(3))
            total += (1 - lam) * ce + lam * kd
        else:
            total += ce
    got = student_loss(logits, labels, soft, overlap, lam)
    assert float(got) == pytest.approx(total / 5, rel=1e-12)


def test_lam_zero_has_no_teacher_term_and_is_a_local_model():
    data = _toy(n=20)
    other = StudentData(data.features, data.labels, data.overlap, torch.rand(20, 2))
    opt = partial(torch.optim.SGD, lr=0.3)
    fits = []
    for d in (data, other):
        model = build_student(partial(MLP, hidden=[4]), (3,), 4, 2, seed=7)
        fits.append(fit_student(model, d, lam=0.0, epochs=3, batch_size=8, optimizer=opt, seed=1).model)
    # a Local model: plain cross-entropy on every sample, same initialisation and batch order
    ref = build_student(partial(MLP, hidden=[4]), (3,), 4, 2, seed=7)
    ref_opt = opt(ref.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for idx in torch.randperm(20, generator=g).split(8):
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(data.features[idx]), data.labels[idx]).backward()
            ref_opt.step()
    for a, b, r in zip(fits[0].parameters(), fits[1].parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(a, r)


def _ledger_delta(wire: Wire, run) -> dict[tuple[str, str, str], int]:
    before = dict(wire.bytes)
    run()
    return {k: n - before.get(k, 0) for k, n in wire.bytes.items() if n != before.get(k, 0)}


def test_teacher_soft_labels_are_the_mean_of_party_probabilities():
    dm = BreastCancer(num_parties=2, overlap=0.5)
    torch.manual_seed(0)
    model = easter(2)
    model.build(dm.party_specs, dm.task)
    batch = dm.train_set[list(range(6))]
    soft = teacher_soft_labels(model, batch)
    with torch.no_grad():
        e = sum(model.party_models[k].encoder(batch.features[k]) for k in model.party_names) / 2
        ref = sum(model.party_models[k].head(e).softmax(-1) for k in model.party_names) / 2
    torch.testing.assert_close(soft, ref)
    data = student_data(model, dm)
    assert data.features.shape[0] == len(dm.active_set("train"))
    assert int(data.overlap.sum()) == len(dm.train_set)
    assert float(data.soft_labels.abs().sum()) == 0.0  # before the channel: no y~ at the active party
    channel = PlainSoftLabels()
    channel.setup(model.wire, model.active, "party1")
    at_active = channel.send_soft_labels(data.parts)
    assert at_active.shape == (len(dm.train_set), 2)
    torch.testing.assert_close(at_active.sum(-1), torch.ones(len(dm.train_set)))
    clear = student_data(model, dm, soft_labels=at_active)  # y~ as the active party now holds it
    assert clear.parts is None
    assert float(clear.soft_labels[~clear.overlap].abs().sum()) == 0.0
    torch.testing.assert_close(clear.soft_labels[clear.overlap], at_active)


def test_the_teachers_inference_meters_the_backends_messages_under_teacher_too():
    """With Paillier the combine step sends messages of its own (`he_aggregate`, `he_decrypted`): the teacher's
    inference puts them under `teacher/` like the protocol's, so the ledger keeps the teacher's traffic apart."""
    from lvfl.privacy import Paillier

    dm = BreastCancer(num_parties=3, overlap=0.5)
    torch.manual_seed(0)
    model = easter(3, aggregation=Paillier(workers=1))
    model.build(dm.party_specs, dm.task)
    model.eval()
    batch = dm.train_set[list(range(4))]
    with torch.no_grad():
        protocol = _ledger_delta(model.wire, lambda: model.party_logits(batch))
    assert {"he_aggregate", "he_decrypted"} <= {t for _, _, t in protocol}
    prefixed = {(s, d, "teacher/" + t): n for (s, d, t), n in protocol.items()}
    assert _ledger_delta(model.wire, lambda: teacher_soft_labels(model, batch, producer="party0")) == prefixed


@pytest.mark.parametrize("num_parties", [2, 3])
def test_teacher_inference_is_metered_with_passive_predictions_delivered_to_the_producer(num_parties):
    """Reference: the protocol's own `party_logits` ledger for the same batch, tags prefixed. With the active party as
    producer, exactly that; with a passive producer, the passive predictions go to it instead of the active party,
    and nothing the active party computed is sent anywhere."""
    dm = BreastCancer(num_parties=num_parties, overlap=0.5)
    torch.manual_seed(0)
    model = easter(num_parties)
    model.build(dm.party_specs, dm.task)
    model.eval()
    batch = dm.train_set[list(range(6))]
    with torch.no_grad():
        protocol = _ledger_delta(model.wire, lambda: model.party_logits(batch))
    assert protocol  # EASTER's inference sends embeddings and predictions
    prefixed = {(s, d, "teacher/" + t): n for (s, d, t), n in protocol.items()}
    at_active = _ledger_delta(model.wire, lambda: teacher_soft_labels(model, batch, producer="party0"))
    assert at_active == prefixed

    producer = "party1"
    at_producer = _ledger_delta(model.wire, lambda: teacher_soft_labels(model, batch, producer=producer))
    expected = dict(prefixed)
    row = 6 * 2 * 4  # one party's float32 logits for 6 samples, 2 classes
    for k in model.passive:
        assert expected.pop((k, "party0", "teacher/predictions")) == row
        if k != producer:
            expected[(k, producer, "teacher/predictions")] = row
    assert at_producer == expected
    assert not any(s == "party0" and t == "teacher/predictions" for s, _, t in at_producer)
    assert _ledger_delta(model.wire, lambda: teacher_soft_labels(model, batch)) == expected  # the default producer
    parts = teacher_soft_label_parts(model, batch)
    assert (parts.num_producer, parts.num_active) == (num_parties - 1, 1)
    with pytest.raises(ValueError, match="producer must be one of the parties"):
        teacher_soft_labels(model, batch, producer="party9")


def _toy_parts(data: StudentData, seed: int = 1) -> SoftLabelParts:
    """Split the toy overlap's y~ into a producer part and an active part of two predictions: y~ = (S_p + S_a) / 2."""
    soft = data.soft_labels[data.overlap].double()
    share = torch.rand(soft.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    active = soft * share  # in [0, y~]
    return SoftLabelParts(producer=(2 * soft - active).float(), active=active.float(), num_producer=1, num_active=1)


@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_paillier_student_equals_plain_student(lam):
    base = _toy(n=12, features=3)
    parts = _toy_parts(base)
    soft = torch.zeros_like(base.soft_labels)
    soft[base.overlap] = parts.mean()  # what the plain channel gives the active party
    data = StudentData(base.features, base.labels, base.overlap, soft)
    opt = partial(torch.optim.SGD, lr=0.5)
    plain = build_student(LogisticRegression, (3,), 1, 2, seed=3)
    fit_plain = fit_student(plain, data, lam=lam, epochs=2, batch_size=6, optimizer=opt, seed=5)

    wire = Wire()
    he = PaillierSoftLabels()
    he.setup(wire, active="party0", producer="party1")
    secure = build_student(LogisticRegression, (3,), 1, 2, seed=3)
    encrypted = StudentData(base.features, base.labels, base.overlap, torch.zeros_like(soft), parts=parts)
    fit_he = fit_student(secure, encrypted, lam=lam, epochs=2, batch_size=6, optimizer=opt, seed=5, channel=he)
    assert he.count == 2

    for a, b in zip(fit_plain.model.parameters(), fit_he.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert fit_he.losses == pytest.approx(fit_plain.losses, abs=1e-4)
    tags = wire.bytes_by_tag()
    ct = he.ciphertext_nbytes
    assert tags["keys"] == 2 * 256
    assert tags["soft_labels"] == 6 * 2 * ct  # 6 overlapping samples x 2 classes, one value per ciphertext
    steps = 4
    assert tags["student_grad"] == steps * 2 * (3 + 1) * ct  # M x (K + 1) coordinates per step
    assert tags["student_grad_decrypted"] == steps * 2 * (3 + 1) * he.plaintext_nbytes
    assert tags["student_loss"] == steps * ct
    assert tags["student_converged"] == 2


def test_paillier_soft_labels_are_the_producer_part_plus_the_active_part():
    """[[Q]] at the active party decrypts to q(S_p) + q(S_a): the active party's part was added homomorphically."""
    data = _toy(n=8, features=2)
    parts = _toy_parts(data)
    wire = Wire()
    seen: list[tuple[str, str, str]] = []
    wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag)))
    he = PaillierSoftLabels()
    he.setup(wire, active="party0", producer="party1")
    rows = he.send_soft_labels(parts)
    got = torch.tensor([[he._decrypt(c) for c in row] for row in rows], dtype=torch.float64)  # test-only decryption
    expected = torch.from_numpy(he.encode(parts.producer) + he.encode(parts.active)).double()
    assert torch.equal(got, expected)
    torch.testing.assert_close(got / (2 * 2.0**he.frac_bits), parts.mean().double(), atol=2.0**-he.frac_bits, rtol=0)
    assert seen[-1] == ("party1", "party0", "soft_labels")
    with pytest.raises(ValueError, match="needs the soft labels' parts"):
        fit_student(build_student(LogisticRegression, (2,), 1, 2, seed=0), data, lam=0.5, epochs=1, channel=he)


def test_paillier_refuses_short_keys():
    with pytest.raises(ValueError, match=r"PaillierSoftLabels\(key_size=\.\.\.\) must be at least 2048"):
        PaillierSoftLabels(key_size=1024)


def sklearn_test_metrics(student: torch.nn.Module, dm) -> dict[str, float]:
    """Independent of torchmetrics: sklearn's accuracy and ROC AUC of the student on the active party's test samples,
    all of them, the overlap and the active-only ones."""
    full = dm.active_set("test")
    overlap = dm.overlap_mask("test").numpy()
    with torch.no_grad():
        probs = student.eval()(full.features[dm.active_party_name]).softmax(-1).numpy()
    labels = full.labels.numpy()
    out = {}
    for suffix, keep in (("", np.ones_like(overlap)), ("/overlap", overlap), ("/active_only", ~overlap)):
        out[f"acc{suffix}"] = accuracy_score(labels[keep], probs[keep].argmax(1))
        out[f"auroc{suffix}"] = roc_auc_score(labels[keep], probs[keep, 1])
    return out


def test_callback_logs_student_metrics_to_csv(tmp_path):
    dm = BreastCancer(num_parties=2, overlap=0.5, batch_size=64)
    cb = StudentDistillation(lam=0.5, epochs=3, model=partial(MLP, hidden=[8]), embedding_dim=4)
    trainer = make_trainer(tmp_path, callbacks=[cb])
    torch.manual_seed(0)
    model = easter(2)
    trainer.fit(model, datamodule=dm)
    (path,) = tmp_path.rglob("metrics.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keys = {k for row in rows for k, v in row.items() if v not in ("", None)}
    reference = sklearn_test_metrics(cb.student, dm)
    for key in ("acc", "auroc", "acc/overlap", "auroc/overlap", "acc/active_only", "auroc/active_only"):
        assert f"student/test/{key}" in keys
        assert 0.5 < cb.metrics[f"student/test/{key}"] == pytest.approx(reference[key], abs=1e-6)
    assert "student/train/loss" in keys
    tags = model.wire.bytes_by_tag()
    assert tags["soft_labels"] == len(dm.train_set) * 2 * 4  # the producer's part S_p, float32, plain
    # the teacher's inference over the overlap: party1's prediction stays at party1 (the producer), party0's own
    # prediction is never sent, so no predictions cross the wire at all with two parties
    assert "teacher/predictions" not in tags
    assert tags["teacher/embeddings"] > 0
    sent_down = {t for (s, d, t) in model.wire.bytes if s == "party0" and d == "party1"}
    assert sent_down <= {"global_embedding", "gradients", "teacher/global_embedding", "split"}


# -- the channel option ------------------------------------------------------------------------------------------
def test_channel_must_be_a_soft_label_channel_naming_the_option():
    with pytest.raises(TypeError, match="channel must be a lvfl.privacy.SoftLabelChannel"):
        StudentDistillation(channel="paillier")
    assert isinstance(StudentDistillation().channel, PlainSoftLabels)  # the default
    assert StudentDistillation().channel is not StudentDistillation().channel  # one per callback, never shared


def test_paillier_channel_options_follow_the_shared_rules():
    for bad in (0, 41, True, 16.0):  # the one fixed-point rule of every backend: an int in [1, 40]
        with pytest.raises((TypeError, ValueError), match=r"PaillierSoftLabels\(frac_bits=\.\.\.\)"):
            PaillierSoftLabels(frac_bits=bad)
    assert PaillierSoftLabels(frac_bits=40).frac_bits == 40
    with pytest.raises(ValueError, match=r"PaillierSoftLabels\(coordinator=\.\.\.\)"):
        PaillierSoftLabels(coordinator="")
    with pytest.raises(ValueError, match="must be distinct parties"):
        PaillierSoftLabels().check_roles("party0", "party0")
    with pytest.raises(ValueError, match="must be distinct parties"):
        PaillierSoftLabels(coordinator="party1").setup(Wire(), "party0", "party1")


def test_a_channel_sends_only_once_set_up_and_parts_need_a_channel():
    data = _toy(n=8, features=2)
    parts = _toy_parts(data)
    with pytest.raises(RuntimeError, match="call setup"):
        PlainSoftLabels().send_soft_labels(parts)
    with pytest.raises(RuntimeError, match="call setup"):
        PaillierSoftLabels().send_soft_labels(parts)
    before_channel = StudentData(data.features, data.labels, data.overlap, torch.zeros_like(data.soft_labels), parts)
    with pytest.raises(ValueError, match="pass channel="):
        fit_student(build_student(LogisticRegression, (2,), 1, 2, seed=0), before_channel, lam=0.5, epochs=1)


def test_plain_channel_trains_the_student_that_clear_soft_labels_train():
    """The channel's y~ (S_p sent, S_a added, / C) gives the very student that y~ handed over in the clear gives."""
    base = _toy(n=12, features=3)
    parts = _toy_parts(base)
    soft = torch.zeros_like(base.soft_labels)
    soft[base.overlap] = parts.mean()
    opt = partial(torch.optim.SGD, lr=0.5)
    clear = fit_student(
        build_student(partial(MLP, hidden=[4]), (3,), 4, 2, seed=3),
        StudentData(base.features, base.labels, base.overlap, soft),
        lam=0.5, epochs=2, batch_size=5, optimizer=opt, seed=5,
    )  # fmt: skip
    wire = Wire()
    channel = PlainSoftLabels()
    channel.setup(wire, "party0", "party1")
    sent = fit_student(
        build_student(partial(MLP, hidden=[4]), (3,), 4, 2, seed=3),
        StudentData(base.features, base.labels, base.overlap, torch.zeros_like(soft), parts=parts),
        lam=0.5, epochs=2, batch_size=5, optimizer=opt, seed=5, channel=channel,
    )  # fmt: skip
    for a, b in zip(clear.model.parameters(), sent.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert sent.losses == clear.losses
    assert wire.bytes_by_tag() == {"soft_labels": 6 * 2 * 4}  # S_p, float32, once; nothing else


def test_a_config_chooses_the_channel_by_class_path(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    text = (REPO / "configs/easter/breast_cancer_student.yaml").read_text()
    channel = "        channel: {class_path: lvfl.privacy.PaillierSoftLabels, init_args: {key_size: 3072}}\n"
    text = text.replace("        cross_fit: 5\n", "        cross_fit: 5\n" + channel)
    config = tmp_path / "student_paillier.yaml"
    config.write_text(text)
    cli = build_cli(["--config", str(config), f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, StudentDistillation)]
    assert isinstance(cb.channel, PaillierSoftLabels)
    assert (cb.channel.key_size, cb.channel.frac_bits, cb.channel.coordinator) == (3072, 16, "coordinator")
