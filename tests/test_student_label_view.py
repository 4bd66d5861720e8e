"""The student path adds nothing that depends on the true labels to a passive party's view.

DESIGN.md, "Label privacy covers a passive party's whole view": with a label mechanism, every message a passive
party receives is a function of the release, never of the true labels. The student path (the teacher's inference on
the overlap, the soft-label channel, Paillier's key and, with cross-fitting, K fold trainings) must keep that:

- a counterfactual at the teacher: the same fitted weights, a teacher whose active-side prediction reads the true
  labels outright (an oracle: the extreme of a private head that memorised them), run with two different label
  vectors: every message a passive party receives is bit-identical, while the soft labels the active party ends up
  with do change (so the comparison can fail);
- a structural check: no message from the active party to a passive one carries a prediction or a soft label;
- an end-to-end counterfactual: two fits with a `StudentDistillation` callback (and cross-fitting), the same seeds
  and the same release but different true labels: every passive inbox, training and student path, is identical;
- the soft labels the active party ends up with are the mean of every predicting party's softmax, computed here
  by hand from the protocols' split-inference hooks (plain exactly, Paillier within its fixed-point resolution).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from helpers import make_trainer, mlp_parties, relabelled

from lvfl.callbacks.student import StudentDistillation
from lvfl.datamodules import BreastCancer
from lvfl.inference.teacher import student_data, teacher_soft_label_parts
from lvfl.models import MLP
from lvfl.privacy import PaillierSoftLabels, PlainSoftLabels, RandomizedResponse, SoftLabelChannel, SoftLabelParts
from lvfl.protocols import EASTER, AggVFL, SplitNN, VFLModule

PARTIES = 3
PRODUCER = "party1"
#: the soft-label channels, by the name a test id shows
CHANNELS: dict[str, Callable[[], SoftLabelChannel]] = {"plain": PlainSoftLabels, "paillier": PaillierSoftLabels}
#: tags the student path may send from the active party to a passive one: the protocol's own inference messages
ALLOWED_DOWN = {"teacher/global_embedding", "cross_fit/teacher/global_embedding"}


def canonical(payload: Any) -> Any:
    """A payload as comparable plain data: tensors as (dtype, shape, raw bytes), containers recursively."""
    if isinstance(payload, torch.Tensor):
        t = payload.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), t.numpy().tobytes())
    if isinstance(payload, dict):
        return tuple((k, canonical(v)) for k, v in sorted(payload.items()))
    if isinstance(payload, (list, tuple)):
        return tuple(canonical(v) for v in payload)
    return payload


def oracle(protocol: type[VFLModule]) -> type[VFLModule]:
    """`protocol` whose active-side predictions (its own entry, Agg_VFL's aggregate) add 4 * onehot(true label)."""

    class Oracle(protocol):
        def party_logits(self, batch):
            out = super().party_logits(batch)
            hint = 4.0 * torch.nn.functional.one_hot(batch.labels, self.task.num_classes).to(torch.float32)
            for k in list(out):
                if k == self.active or k not in self.party_names:  # computed by the active party
                    out[k] = out[k] + hint.to(out[k])
            return out

    Oracle.__name__ = Oracle.__qualname__ = f"Oracle{protocol.__name__}"
    return Oracle


PROTOCOLS: dict[str, Callable[..., VFLModule]] = {
    "easter": lambda cls=EASTER, mech=None: cls(parties=mlp_parties(PARTIES), embedding_dim=8, label_mechanism=mech),
    "splitnn": lambda cls=SplitNN, mech=None: cls(
        parties=mlp_parties(PARTIES), top_model=partial(MLP, hidden=[8]), embedding_dim=8, top_hidden=8,
        label_mechanism=mech,
    ),
    "aggvfl": lambda cls=AggVFL, mech=None: cls(parties=mlp_parties(PARTIES), embedding_dim=8, label_mechanism=mech),
}  # fmt: skip
BASES = {"easter": EASTER, "splitnn": SplitNN, "aggvfl": AggVFL}


def fitted(protocol: str, tmp_path, use_oracle: bool = False, overlap: float = 0.5) -> tuple[VFLModule, Any]:
    """A small fitted teacher (with a label mechanism) and its datamodule."""
    dm = BreastCancer(num_parties=PARTIES, overlap=overlap, batch_size=64, seed=0)
    torch.manual_seed(0)
    cls = oracle(BASES[protocol]) if use_oracle else BASES[protocol]
    model = PROTOCOLS[protocol](cls, RandomizedResponse(epsilon=1.0, seed=0))
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(model, datamodule=dm)
    return model, dm


def warns_if_nothing_to_hide(parts: SoftLabelParts) -> contextlib.AbstractContextManager:
    """Paillier warns when the active party computes the whole teacher (it knows y~ already)."""
    return pytest.warns(UserWarning, match="hides nothing") if not parts.num_producer else contextlib.nullcontext()


def decrypted_soft_labels(he: PaillierSoftLabels, rows: list[list[int]]) -> torch.Tensor:
    """Test-only: decrypt [[Q]] with the coordinator's key and decode y~ = Q / (C 2**frac_bits)."""
    q = torch.tensor([[he._decrypt(c) for c in row] for row in rows], dtype=torch.float64)
    return q / (he.count * 2.0**he.frac_bits)


def reference_soft_labels(teacher: VFLModule, batch: Any) -> torch.Tensor:
    """By hand, not through `party_logits` or the wire: the mean of every predicting party's softmax.

    The active party's prediction from the split-inference hooks (`passive_contribution`, `complete_prediction`:
    EASTER's active head or private head, SplitNN's top model, Agg_VFL's aggregate); for EASTER also every passive
    head on the global embedding E = sum_k h_k(x_k) / C.
    """
    teacher.eval()
    with torch.no_grad():
        x = batch.features
        contributions = {k: teacher.passive_contribution(k, x[k]) for k in teacher.passive}
        probs = [teacher.complete_prediction(x[teacher.active], contributions).softmax(-1)]
        if isinstance(teacher, EASTER):
            e = sum(teacher.party_models[k].encoder(x[k]) for k in teacher.party_names) / teacher.num_parties
            probs += [teacher.party_models[k].head(e).softmax(-1) for k in teacher.passive]
    return torch.stack(probs).mean(0)


# -- (a) the teacher and the channel, counterfactually ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("channel_name", sorted(CHANNELS))
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_passive_inbox_of_the_teacher_path_does_not_depend_on_true_labels(protocol, channel_name, tmp_path):
    teacher, dm = fitted(protocol, tmp_path, use_oracle=True)
    batch = dm.train_set[list(range(10))]
    # set up once, before both worlds: a Paillier key is fresh randomness drawn before any label is read
    channel = CHANNELS[channel_name]()
    channel.setup(teacher.wire, teacher.active, PRODUCER)
    worlds = []
    for labels in (batch.labels, 1 - batch.labels):  # the true labels, then others; same weights, same release
        world = dataclasses.replace(batch, labels=labels)
        inbox: list[tuple] = []
        messages: list[tuple[str, str, str]] = []

        def observe(src: str, dst: str, tag: str, payload: Any, inbox=inbox, messages=messages) -> None:
            messages.append((src, dst, tag))
            if dst in teacher.passive:
                inbox.append((src, dst, tag, canonical(payload)))

        handle = teacher.wire.subscribe(observe)
        parts = teacher_soft_label_parts(teacher, world, PRODUCER)
        if isinstance(channel, PaillierSoftLabels):
            with warns_if_nothing_to_hide(parts):
                at_active = decrypted_soft_labels(channel, channel.send_soft_labels(parts))
        else:
            at_active = channel.send_soft_labels(parts)
        teacher.wire.unsubscribe(handle)
        worlds.append((inbox, messages, at_active))

    (first, messages, y_true), (second, _, y_other) = worlds
    assert first == second
    # the oracle's labels reached the active party's soft labels: had any of it gone down, the inboxes would differ
    assert (y_true - y_other).abs().max() > 0.05
    # structural: from the active party to a passive one, only the protocol's own inference messages
    down = {tag for src, dst, tag in messages if src == teacher.active and dst in teacher.passive}
    assert down <= ALLOWED_DOWN
    assert all(dst == teacher.active for _, dst, tag in messages if tag == "soft_labels")
    if protocol == "easter":  # the producer gets the other passive party's prediction; both get E
        assert (("party2", PRODUCER, "teacher/predictions")) in {m[:3] for m in first}
        assert down == {"teacher/global_embedding"}


@pytest.mark.slow
@pytest.mark.parametrize("channel_name", sorted(CHANNELS))
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_callback_sends_no_prediction_or_soft_label_to_a_passive_party(protocol, channel_name, tmp_path):
    """The whole StudentDistillation path, as configured by a user: active-to-passive messages it adds are only the
    protocol's inference messages, soft labels go to the active party only, the producer's part comes from it."""
    dm = BreastCancer(num_parties=PARTIES, overlap=0.1, batch_size=64, seed=0)
    torch.manual_seed(0)
    model = PROTOCOLS[protocol](mech=RandomizedResponse(epsilon=1.0, seed=0))
    seen: list[tuple[str, str, str]] = []
    model.wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag)))
    cb = StudentDistillation(lam=0.5, epochs=1, channel=CHANNELS[channel_name]())
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0, callbacks=[cb])
    expect_warning = channel_name == "paillier" and protocol != "easter"
    with pytest.warns(UserWarning, match="hides nothing") if expect_warning else contextlib.nullcontext():
        trainer.fit(model, datamodule=dm)
    assert "student/test/acc" in cb.metrics
    student_path = [m for m in seen if m[2].startswith(("teacher/", "soft_labels", "student_", "keys"))]
    down = {tag for src, dst, tag in student_path if src == model.active and dst in model.passive}
    assert down <= ALLOWED_DOWN
    soft = {(src, dst) for src, dst, tag in student_path if tag == "soft_labels"}
    assert soft == ({(PRODUCER, model.active)} if protocol == "easter" else set())
    into_passive = {tag for src, dst, tag in student_path if dst in model.passive}
    assert into_passive <= ALLOWED_DOWN | {"teacher/predictions", "keys"}
    assert all(src in model.passive for src, dst, tag in student_path if tag == "teacher/predictions")


# -- (a) end to end: two fits, same release, different true labels ---------------------------------------------------
Relabelled = relabelled(BreastCancer)


def passive_inbox_of_a_fit(relabel: bool, release: dict | None, tmp_path, **student: Any) -> tuple[list, VFLModule]:
    torch.manual_seed(0)
    dm = Relabelled(relabel, num_parties=PARTIES, overlap=0.2, batch_size=64, seed=0)
    model = PROTOCOLS["easter"](mech=RandomizedResponse(epsilon=1.0, seed=0))
    if release is not None:  # the first run's release: a fresh draw would differ by its own randomness
        model.label_release.load_state_dict(release)
    inbox: list[tuple] = []

    def observe(src: str, dst: str, tag: str, payload: Any) -> None:
        if dst in model.passive:  # a key is fresh randomness drawn before any label is read: compared by size
            inbox.append((src, dst, tag, len(payload) if tag.endswith("keys") else canonical(payload)))

    model.wire.subscribe(observe)
    cb = StudentDistillation(lam=0.5, epochs=1, **student)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0, callbacks=[cb]).fit(
        model, datamodule=dm
    )
    return inbox, model


@pytest.mark.slow
@pytest.mark.parametrize(
    "student_options",
    [lambda: {"cross_fit": 2}, lambda: {"channel": PaillierSoftLabels()}],  # a fresh channel per fit
    ids=["cross_fit", "paillier"],
)
def test_passive_inbox_of_training_and_student_path_does_not_depend_on_true_labels(student_options, tmp_path):
    first, model = passive_inbox_of_a_fit(False, None, tmp_path / "a", **student_options())
    second, other = passive_inbox_of_a_fit(True, model.label_release.state_dict(), tmp_path / "b", **student_options())
    student = student_options()
    assert not torch.equal(model.trainer.datamodule.train_set.labels, other.trainer.datamodule.train_set.labels)
    assert len(model.privacy_ledger) == len(other.privacy_ledger) == 1  # one release, folds included
    tags = {m[2] for m in first}
    teacher = "cross_fit/teacher/" if "cross_fit" in student else "teacher/"  # who labels the overlap
    assert {teacher + "global_embedding", teacher + "predictions"} <= tags  # the student path reached them
    if "cross_fit" in student:
        assert "cross_fit/gradients" in tags  # the fold trainings too
    assert len(first) == len(second)
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a == b, f"message {i} ({a[0]} -> {a[1]}, tag {a[2]!r}) changed with the true labels"


# -- (b) the soft labels the active party ends up with ---------------------------------------------------------------
@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_soft_labels_at_the_active_party_are_the_mean_of_every_predicting_partys_softmax(protocol, tmp_path):
    teacher, dm = fitted(protocol, tmp_path)
    reference = reference_soft_labels(teacher, dm.train_set[torch.arange(len(dm.train_set))])
    data = student_data(teacher, dm, producer=PRODUCER)  # the teacher's inference: the parts, before the channel
    assert float(data.soft_labels.abs().sum()) == 0.0  # the active party holds no y~ in the clear yet
    assert data.parts is not None
    assert data.parts.count == (PARTIES if protocol == "easter" else 1)
    assert data.parts.num_producer == (PARTIES - 1 if protocol == "easter" else 0)

    plain = PlainSoftLabels()
    plain.setup(teacher.wire, teacher.active, PRODUCER)
    at_active = plain.send_soft_labels(data.parts)
    torch.testing.assert_close(at_active, reference, atol=1e-6, rtol=0)
    clear = student_data(teacher, dm, soft_labels=at_active)  # y~ as the active party now holds it: no parts
    assert clear.parts is None
    torch.testing.assert_close(clear.soft_labels[clear.overlap], reference, atol=1e-6, rtol=0)

    few = data.parts[:6]  # Paillier encryptions are slow: a few rows suffice
    he = PaillierSoftLabels()
    he.setup(teacher.wire, teacher.active, PRODUCER)
    with warns_if_nothing_to_hide(few):
        got = decrypted_soft_labels(he, he.send_soft_labels(few))
    torch.testing.assert_close(got, reference[:6].double(), atol=2.0**-he.frac_bits + 1e-6, rtol=0)
