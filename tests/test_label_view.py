"""Label DP covers a passive party's whole view: a counterfactual for every protocol that takes a label mechanism.

Two runs with the same seeds, the same data split and the *same* label release, but different true labels for the
training samples: every message a passive party receives (training and validation, every tag) must be bit-identical.
If anything that leaves the active party depended on the true labels (an encoder, a top model, an aggregate trained
on them), some message would change. A negative control runs the same counterfactual without a mechanism, where the
inbox must change, so the comparison can fail.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from helpers import bank_retailer_tables, make_trainer, mlp_parties, relabelled

from lvfl.compression import CompressedTensor, Compressor
from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import MID, DHMasking, DistanceCorrelation, LaplaceLabels, RandomizedResponse
from lvfl.protocols import CVFL, EASTER, AggVFL, PraVFed, SplitNN, VFLModule

PARTIES = 3


def canonical(payload: Any) -> Any:
    """A payload as comparable plain data: tensors as (dtype, shape, raw bytes), containers recursively."""
    if isinstance(payload, torch.Tensor):
        t = payload.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), t.numpy().tobytes())
    if isinstance(payload, CompressedTensor):
        return ("compressed", canonical(vars(payload)))
    if isinstance(payload, dict):
        return tuple((k, canonical(v)) for k, v in sorted(payload.items()))
    if isinstance(payload, (list, tuple)):
        return tuple(canonical(v) for v in payload)
    if isinstance(payload, torch.dtype):
        return str(payload)
    return payload


def protocols() -> dict[str, Callable[..., VFLModule]]:
    top = partial(MLP, hidden=[16])
    return {
        "easter": lambda mech: EASTER(parties=mlp_parties(PARTIES), embedding_dim=8, label_mechanism=mech),
        "easter_dh": lambda mech: EASTER(
            parties=mlp_parties(PARTIES), embedding_dim=8, aggregation=DHMasking(), label_mechanism=mech
        ),
        # the latency-hiding schedules: the same messages, exchanged once per three (two) updates; pipelined, each
        # batch's first half-exchange with the previous batch's second
        **{
            f"easter_{schedule}": partial(
                lambda mech, schedule, updates: EASTER(
                    parties=mlp_parties(PARTIES),
                    embedding_dim=8,
                    label_mechanism=mech,
                    schedule=schedule,
                    local_updates=updates,
                ),
                schedule=schedule,
                updates=updates,
            )
            for schedule, updates in (("local_updates", 3), ("pipelined", 2))
        },
        # delay compensation: a passive party's own arithmetic on what it received; the messages are the same kind
        "easter_pipelined_compensated": lambda mech: EASTER(
            parties=mlp_parties(PARTIES),
            embedding_dim=8,
            label_mechanism=mech,
            schedule="pipelined",
            local_updates=2,
            delay_compensation=True,
        ),
        "splitnn_concat": lambda mech: SplitNN(
            parties=mlp_parties(PARTIES), top_model=top, embedding_dim=8, top_hidden=8, label_mechanism=mech
        ),
        # the active party's received-embedding defenses learn from the release too, never from the true labels
        "splitnn_mid": lambda mech: SplitNN(
            parties=mlp_parties(PARTIES), top_model=top, embedding_dim=8, label_mechanism=mech, received_defense=MID()
        ),
        "splitnn_dcor": lambda mech: SplitNN(
            parties=mlp_parties(PARTIES),
            top_model=top,
            embedding_dim=8,
            label_mechanism=mech,
            received_defense=DistanceCorrelation(lam=0.1),
        ),
        "splitnn_sum": lambda mech: SplitNN(
            parties=mlp_parties(PARTIES), top_model=top, embedding_dim=8, fusion="sum", label_mechanism=mech
        ),
        "cvfl": lambda mech: CVFL(
            parties=mlp_parties(PARTIES),
            top_model=top,
            embedding_dim=8,
            top_hidden=8,
            local_iterations=2,
            compressor=Compressor(bits=8),
            label_mechanism=mech,
        ),
        "aggvfl_mean": lambda mech: AggVFL(parties=mlp_parties(PARTIES), embedding_dim=8, label_mechanism=mech),
        "aggvfl_weighted": lambda mech: AggVFL(
            parties=mlp_parties(PARTIES), embedding_dim=8, aggregate="weighted", label_mechanism=mech
        ),
        "pravfed": lambda mech: PraVFed(
            parties=mlp_parties(PARTIES), embedding_dim=8, local_epochs=1, label_mechanism=mech
        ),
    }


MECHANISMS = {
    "rr": lambda: RandomizedResponse(epsilon=1.0, seed=0),
    "laplace": lambda: LaplaceLabels(epsilon=1.0, seed=0),
}


Relabelled = relabelled(Digits)


def passive_inbox(
    build: Callable[[], VFLModule], relabel: bool, release: dict | None, tmp_path
) -> tuple[list[tuple], VFLModule]:
    """Fit one small run; returns every (src, dst, tag, payload) a passive party received, in order."""
    torch.manual_seed(0)
    dm = Relabelled(relabel, num_parties=PARTIES, batch_size=64, seed=0)
    model = build()
    if release is not None:  # the same release as the first run: a fresh draw would differ by its own randomness
        model.label_release.load_state_dict(release)
    inbox: list[tuple] = []

    def observe(src: str, dst: str, tag: str, payload: Any) -> None:
        if dst not in (dm.active_party_name, "coordinator"):  # a passive party (set-up messages come before build)
            # a key exchange is fresh randomness drawn before any label is read: compared by its size only
            inbox.append((src, dst, tag, len(payload) if tag == "keys" else canonical(payload)))

    model.wire.subscribe(observe)
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=1)
    trainer.fit(model, datamodule=dm)
    return inbox, model


#: combinations a protocol refuses by design: delay compensation needs hard labels (LaplaceLabels' are soft)
REFUSED = {("easter_pipelined_compensated", "laplace")}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [(p, m) for p in sorted(protocols()) for m in sorted(MECHANISMS) if (p, m) not in REFUSED],
)
def test_passive_view_does_not_depend_on_true_labels(protocol, mechanism, tmp_path):
    def build() -> VFLModule:
        return protocols()[protocol](MECHANISMS[mechanism]())

    first, model = passive_inbox(build, relabel=False, release=None, tmp_path=tmp_path / "a")
    release = model.label_release.state_dict()
    second, other = passive_inbox(build, relabel=True, release=release, tmp_path=tmp_path / "b")
    assert not torch.equal(model.trainer.datamodule.train_set.labels, other.trainer.datamodule.train_set.labels)
    assert len(other.privacy_ledger) == 1  # the injected release, not a second draw
    assert first, "a passive party must receive something in training, or the check proves nothing"
    assert len(first) == len(second)
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a == b, f"message {i} ({a[0]} -> {a[1]}, tag {a[2]!r}) changed with the true labels"


@pytest.mark.slow
@pytest.mark.parametrize(
    "protocol",
    [
        "easter",
        "easter_local_updates",
        "easter_pipelined",
        "easter_pipelined_compensated",
        "splitnn_concat",
        "cvfl",
        "aggvfl_mean",
    ],  # fmt: skip
)
def test_without_a_mechanism_the_passive_view_changes_with_the_labels(protocol, tmp_path):
    """Negative control: with no label mechanism the same counterfactual must change the passive inbox."""

    def build() -> VFLModule:
        return protocols()[protocol](None)

    first, _ = passive_inbox(build, relabel=False, release=None, tmp_path=tmp_path / "a")
    second, _ = passive_inbox(build, relabel=True, release=None, tmp_path=tmp_path / "b")
    assert len(first) == len(second)
    assert any(a != b for a, b in zip(first, second, strict=True))


def test_private_head_is_the_only_true_label_path_and_reports_the_active_prediction(tmp_path):
    """With a mechanism, the active party's reported prediction comes from its private head, trained on true labels."""
    torch.manual_seed(0)
    dm = Digits(num_parties=PARTIES, batch_size=64, seed=0)
    model = EASTER(parties=mlp_parties(PARTIES), embedding_dim=8, label_mechanism=RandomizedResponse(epsilon=1.0))
    model.build(dm.party_specs, dm.task)
    assert model.private_head is not None
    private = {id(p) for p in model.private_head.parameters()}
    assert private <= {id(p) for p in model.party_parameters(model.active)}  # the active party's optimizer owns it
    for k in model.passive:
        assert not private & {id(p) for p in model.party_parameters(k)}
    batch = next(iter(dm.train_dataloader()))
    model.release_labels(dm.train_set.ids, dm.train_set.labels)
    local = {k: model.party_models[k].encoder(batch.features[k]) for k in model.party_names}
    e = sum(local.values()) / PARTIES
    loss = model.private_loss(e, batch)
    loss.backward()
    assert all(p.grad is None for p in model.party_models[model.active].parameters())  # detached input
    assert all(p.grad is not None for p in model.private_head.parameters())
    logits = model.party_logits(batch)[model.active]
    assert torch.allclose(logits, model.private_head(e), atol=1e-6)
    assert EASTER(parties=mlp_parties(PARTIES), embedding_dim=8).private_head is None  # none without a mechanism


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["easter", "splitnn_concat"])
def test_own_tables_whole_passive_view_does_not_depend_on_true_labels(protocol, tmp_path):
    """The own-data path, whole view: each party's CSV, the PSI and the split message on the wire, then training.
    The true labels change in the bank's file (so the split, the encoders and the scaling are recomputed from it);
    with the same release, every message the retailer receives is identical (the PSI's by size: fresh keys)."""

    def inbox_of(relabel: bool, release: dict | None) -> tuple[list, VFLModule]:
        torch.manual_seed(0)
        dm = bank_retailer_tables(relabel, tmp_path)
        model = {
            "easter": lambda m: EASTER(parties=mlp_parties(2), embedding_dim=8, label_mechanism=m),
            "splitnn_concat": lambda m: SplitNN(
                parties=mlp_parties(2), top_model=partial(MLP, hidden=[8]), embedding_dim=8, label_mechanism=m
            ),
        }[protocol](RandomizedResponse(epsilon=1.0, seed=0))
        if release is not None:
            model.label_release.load_state_dict(release)
        seen: list[tuple] = []
        model.wire.subscribe(
            lambda src, dst, tag, payload: (
                seen.append((src, dst, tag, len(payload) if tag.startswith("psi/") else canonical(payload)))
                if dst == "party1"
                else None
            )
        )
        make_trainer(tmp_path / str(relabel), max_epochs=2, limit_train_batches=3, limit_val_batches=1).fit(
            model, datamodule=dm
        )
        return seen, model

    first, model = inbox_of(False, None)
    second, other = inbox_of(True, model.label_release.state_dict())
    assert not torch.equal(model.trainer.datamodule.train_set.labels, other.trainer.datamodule.train_set.labels)
    tags = [m[2] for m in first]
    assert tags[:4] == ["psi/setup", "psi/seeds", "psi/matrix", "psi/matches"]  # the default PSI's, KKRT16's
    assert "split" in tags
    assert len(first) == len(second)
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a == b, f"message {i} ({a[0]} -> {a[1]}, tag {a[2]!r}) changed with the true labels"


def test_a_gradient_defense_covers_the_gradient_rows_not_easters_global_embedding(tmp_path):
    """The limit of a gradient defense's epsilon, as docs/privacy.md states it: it covers each sample's gradient row
    a passive party receives, not the rest of its view. EASTER with Gaussian noise (its test-only seed, so both runs
    draw the same noise), the same counterfactual as above: the gradients change (within what epsilon bounds), and so
    do later global-embedding rows, which the active party's own model, trained on the true labels, shapes, and
    which the noise never touches."""
    from lvfl.privacy import GaussianNoise

    def build() -> VFLModule:
        return EASTER(parties=mlp_parties(PARTIES), embedding_dim=8, gradient_defense=GaussianNoise(1.0, seed=0))

    first, _ = passive_inbox(build, relabel=False, release=None, tmp_path=tmp_path / "a")
    second, _ = passive_inbox(build, relabel=True, release=None, tmp_path=tmp_path / "b")
    assert [m[:3] for m in first] == [m[:3] for m in second]
    changed = {m[2] for m, n in zip(first, second, strict=True) if m != n}
    assert "gradients" in changed
    assert "global_embedding" in changed  # not covered by the defense's epsilon: a label mechanism covers it
