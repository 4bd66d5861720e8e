"""The top-model protocols on one base: C-VFL with 32 bits, top-k 1 and Q = 1 *is* split learning (SplitNN, concat).

Same seeds, data, party models, optimizers (heterogeneous: SGD with and without momentum, Adam) and label release:
the two must train bit-identically, because every party's gradient is computed by the same float32 operations on
the same values (the same concatenation, the same top-model parameters, the same labels; an uncompressed
`CompressedTensor` carries the float32 values as they are). The wire differs by design, and only downwards:
SplitNN sends each passive party dloss/dE_k; C-VFL sends it the ingredients (the other parties' embeddings, the top
model's parameters and the labels) from which it computes that same gradient itself. The test checks exactly that.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from helpers import make_trainer, mlp_parties
from torch.func import functional_call

from lvfl.compression import CompressedTensor, Compressor
from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import LaplaceLabels, RandomizedResponse
from lvfl.protocols import CVFL, PartyConfig, SplitNN
from lvfl.protocols.top_model import TopModelProtocol

PARTIES = 3

MECHANISMS = {
    "none": lambda: None,
    "rr": lambda: RandomizedResponse(epsilon=1.0, seed=0),
    "laplace": lambda: LaplaceLabels(epsilon=1.0, seed=0),
}


def heterogeneous_parties() -> list[PartyConfig]:
    """Three MLP parties with three optimizers: SGD with momentum, plain SGD, Adam (state that would expose a drift)."""
    sgd_momentum, sgd = mlp_parties(1, lr=0.1, momentum=0.9), mlp_parties(1, lr=0.05)
    adam = PartyConfig(model=partial(MLP, hidden=[16]), optimizer=partial(torch.optim.Adam, lr=0.01))
    return [*sgd_momentum, *sgd, adam]


def run(protocol: type[TopModelProtocol], mechanism: str, tmp_path, **kwargs: Any) -> tuple[Any, list, list]:
    """Build under seed 0, fit 2 epochs of 3 batches (+1 validation batch); returns the model, losses, messages."""
    torch.manual_seed(0)
    dm = Digits(num_parties=PARTIES, batch_size=64, seed=0)
    model = protocol(
        parties=heterogeneous_parties(),
        top_model=partial(MLP, hidden=[16]),
        embedding_dim=8,
        top_hidden=12,
        label_mechanism=MECHANISMS[mechanism](),
        **kwargs,
    )
    model.prepare_datamodule(dm)  # before the data are read: a label mechanism needs a label-free split
    model.build(dm.party_specs, dm.task)
    model.initial_state = {k: v.clone() for k, v in model.state_dict().items()}
    losses: list[dict[str, torch.Tensor]] = []
    record = model.record_train_losses
    model.record_train_losses = lambda step: (losses.append(dict(step)), record(step))
    messages: list[tuple[bool, str, str, str, Any]] = []  # (in training, src, dst, tag, payload)
    model.wire.subscribe(lambda src, dst, tag, payload: messages.append((model.training, src, dst, tag, payload)))
    make_trainer(tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=1).fit(model, datamodule=dm)
    return model, losses, messages


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_uncompressed_cvfl_with_one_local_iteration_is_split_learning(mechanism, tmp_path):
    split, split_losses, split_messages = run(SplitNN, mechanism, tmp_path / "splitnn", fusion="concat")
    cvfl, cvfl_losses, cvfl_messages = run(
        CVFL, mechanism, tmp_path / "cvfl", compressor=Compressor(bits=32, topk=1.0), local_iterations=1
    )
    active, passive = split.active, split.passive

    # the same models from the same seed: one base builds both (bottom models, top model, private top model)
    assert split.initial_state.keys() == cvfl.initial_state.keys()
    assert all(torch.equal(v, cvfl.initial_state[k]) for k, v in split.initial_state.items())
    if mechanism != "none":
        assert torch.equal(split.label_release.ids, cvfl.label_release.ids)
        assert torch.equal(split.label_release.labels, cvfl.label_release.labels)  # the same release

    # the same losses, bit for bit: C-VFL's every party evaluates split learning's one loss (and the private head's)
    assert len(split_losses) == len(cvfl_losses) == 6
    for step, (joint, per_party) in enumerate(zip(split_losses, cvfl_losses, strict=True)):
        for party in split.party_names:
            assert torch.equal(per_party[party], joint[active]), (step, party)
        if mechanism != "none":
            assert torch.equal(per_party[f"{active}/private_head"], joint[f"{active}/private_head"]), step

    # the same parameters, bit for bit, after six steps of heterogeneous optimizers
    trained = cvfl.state_dict()
    assert split.state_dict().keys() == trained.keys()
    for name, value in split.state_dict().items():
        assert torch.equal(value, trained[name]), name
        if name in split.initial_state and value.is_floating_point():
            assert not torch.equal(value, split.initial_state[name]), f"{name} did not move"

    # up the wire: the same embeddings, bytes and messages (training and validation); an uncompressed
    # CompressedTensor carries the float32 values as they are
    up_split = [m for m in split_messages if m[2] == active]
    up_cvfl = [m for m in cvfl_messages if m[2] == active]
    assert [m[:4] for m in up_split] == [m[:4] for m in up_cvfl]
    for (_, src, _, tag, tensor), (*_, compressed) in zip(up_split, up_cvfl, strict=True):
        assert tag == "embeddings"
        assert isinstance(compressed, CompressedTensor)
        assert torch.equal(compressed.decompress(), tensor), src
    for k in passive:
        assert split.wire.bytes[(k, active, "embeddings")] == cvfl.wire.bytes[(k, active, "embeddings")]

    # down the wire, C-VFL's message format: instead of dloss/dE_k (4 B d bytes), the C - 1 other embeddings
    # ((C - 1) x 4 B d), the top model (4 P) and the labels (B) ...
    for k in passive:
        assert (
            cvfl.wire.bytes[(active, k, "global_embedding")]
            == (PARTIES - 1) * split.wire.bytes[(active, k, "gradients")]
        )
        assert {tag for (src, dst, tag) in cvfl.wire.bytes if dst == k} == {"global_embedding", "model", "labels"}
        assert {tag for (src, dst, tag) in split.wire.bytes if dst == k} == {"gradients"}
    # ... from which passive party k computes exactly the gradient SplitNN sends it
    for k in passive:
        gradients = [m[4] for m in split_messages if m[2] == k]
        own = [m[4].decompress() for m in cvfl_messages if m[0] and m[1] == k]  # E_k as k sent it (exact at 32 bits)
        inbox = [m for m in cvfl_messages if m[2] == k]
        assert [m[3] for m in inbox] == ["global_embedding", "model", "labels"] * len(gradients)
        for step, sent in enumerate(gradients):
            others, state, labels = (m[4] for m in inbox[3 * step : 3 * step + 3])
            e_k = own[step].clone().requires_grad_(True)
            z = cvfl.fuse({j: c.decompress() for j, c in others.items()} | {k: e_k})
            loss = cvfl.task_loss(
                functional_call(cvfl.top, state, (z,)), labels if labels.is_floating_point() else labels.long()
            )
            (computed,) = torch.autograd.grad(loss, e_k)
            assert torch.equal(computed, sent), (k, step)


def test_both_protocols_are_top_model_protocols():
    assert issubclass(SplitNN, TopModelProtocol)
    assert issubclass(CVFL, TopModelProtocol)
    with pytest.raises(TypeError, match="abstract.*gather"):
        TopModelProtocol(parties=mlp_parties(2), top_model=MLP)


@pytest.mark.parametrize("protocol", [SplitNN, CVFL])
@pytest.mark.parametrize("top_hidden", [0, -3, 1.5, True, "8"])
def test_top_hidden_is_checked_once_for_both(protocol, top_hidden):
    with pytest.raises(ValueError, match=rf"^model.top_hidden must be an int >= 1, got {top_hidden!r}$"):
        protocol(parties=mlp_parties(2), top_model=MLP, top_hidden=top_hidden)


@pytest.mark.parametrize("protocol", [SplitNN, CVFL])
def test_bottom_models_drop_their_heads_and_the_active_optimizer_holds_the_top_model(protocol):
    dm = Digits(num_parties=PARTIES)
    model = protocol(parties=mlp_parties(PARTIES), top_model=MLP, embedding_dim=8, label_mechanism=MECHANISMS["rr"]())
    model.build(dm.party_specs, dm.task)
    assert all(isinstance(model.party_models[k].head, torch.nn.Identity) for k in model.party_names)
    assert model.predicting_parties == [model.active]
    assert model.top.encoder[1].in_features == model.private_head.encoder[1].in_features == PARTIES * 8
    owned = {k: {id(p) for p in model.party_parameters(k)} for k in model.party_names}
    assert {id(p) for p in (*model.top.parameters(), *model.private_head.parameters())} <= owned[model.active]
    assert sum(map(len, owned.values())) == len(list(model.parameters()))  # each parameter, one owner
