"""Party models: shapes, the encoder/head split, gradients, argument checks and use from configs."""

from __future__ import annotations

import json

import pytest
import torch
from jsonargparse import ArgumentError, ArgumentParser, Namespace
from torch import nn

from lvfl.models import ACTIVATIONS, CNN, MLP, LeNet, PartyModel, PartyModelFactory

TABULAR = [(30,), (13,)]
IMAGES = [(1, 8, 2), (1, 8, 1), (1, 8, 8), (3, 32, 8), (1, 28, 7)]

CASES = (
    [(MLP, shape, {}) for shape in TABULAR + IMAGES]
    + [(MLP, (13,), {"hidden": [], "head_hidden": [8, 4], "activation": "tanh", "dropout": 0.5})]
    + [(CNN, shape, {}) for shape in IMAGES]
    + [(CNN, (1, 8, 1), {"channels": [4, 4, 4, 4, 4], "kernel_size": 5, "head_hidden": [12]})]
    + [(CNN, (2, 1, 1), {"kernel_size": 1})]
    + [(LeNet, shape, {}) for shape in IMAGES]
    + [(LeNet, (1, 1, 1), {"activation": "tanh"})]
)
IDS = [f"{cls.__name__}-{'x'.join(map(str, shape))}{'-custom' if kw else ''}" for cls, shape, kw in CASES]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize(("cls", "shape", "kwargs"), CASES, ids=IDS)
def test_shapes_and_split(cls: type[PartyModel], shape: tuple[int, ...], kwargs: dict) -> None:
    model = cls(shape, 16, 10, **kwargs).eval()  # eval: dropout off, so forward is deterministic
    x = torch.randn(5, *shape)

    embedding = model.encoder(x)
    logits = model.head(embedding)

    assert embedding.shape == (5, 16)
    assert logits.shape == (5, 10)
    torch.testing.assert_close(model(x), logits)
    assert model.input_shape == shape
    assert (model.embedding_dim, model.num_outputs) == (16, 10)


@pytest.mark.parametrize(("cls", "shape", "kwargs"), CASES, ids=IDS)
def test_head_accepts_any_embedding(cls: type[PartyModel], shape: tuple[int, ...], kwargs: dict) -> None:
    """EASTER applies each head to the average of all parties' embeddings, not to the party's own."""
    models = [cls(shape, 8, 3, **kwargs), MLP((7,), 8, 3)]
    average = torch.stack([m.encoder(torch.randn(4, *m.input_shape)) for m in models]).mean(0)
    assert models[0].head(average).shape == (4, 3)


@pytest.mark.parametrize(("cls", "shape", "kwargs"), CASES, ids=IDS)
def test_gradients_reach_every_parameter(cls: type[PartyModel], shape: tuple[int, ...], kwargs: dict) -> None:
    model = cls(shape, 16, 4, **kwargs)
    x = torch.randn(8, *shape)
    model(x).square().sum().backward()  # depends on every logit
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name  # seeded, so a dead unit cannot make this flaky


@pytest.mark.parametrize(("cls", "shape", "kwargs"), CASES, ids=IDS)
def test_encoder_and_head_partition_parameters(cls: type[PartyModel], shape: tuple[int, ...], kwargs: dict) -> None:
    model = cls(shape, 16, 4, **kwargs)
    encoder = {id(p) for p in model.encoder.parameters()}
    head = {id(p) for p in model.head.parameters()}
    everything = {id(p) for p in model.parameters()}
    assert encoder
    assert head
    assert not encoder & head
    assert encoder | head == everything
    # and nothing else hangs off the model that a protocol would miss
    assert {name for name, _ in model.named_children()} == {"encoder", "head"}


def test_mlp_layers() -> None:
    model = MLP((2, 3), 5, 2, hidden=[7, 6], head_hidden=[4], dropout=0.25)
    linears = [(m.in_features, m.out_features) for m in model.encoder if isinstance(m, nn.Linear)]
    assert linears == [(6, 7), (7, 6), (6, 5)]
    assert isinstance(model.encoder[-1], nn.ReLU)  # the embedding is a hidden representation
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 3  # after hidden layers, not the embedding
    head = [(m.in_features, m.out_features) for m in model.head if isinstance(m, nn.Linear)]
    assert head == [(5, 4), (4, 2)]
    assert isinstance(model.head[-1], nn.Linear)  # logits, no activation


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_builds(name: str) -> None:
    for model in (MLP((4,), 3, 2, activation=name), LeNet((1, 4, 1), 3, 2, activation=name)):
        assert any(isinstance(m, ACTIVATIONS[name]) for m in model.modules())


def test_lenet_layout() -> None:
    model = LeNet((1, 28, 28), 84, 10)
    convs = [(m.in_channels, m.out_channels, m.kernel_size) for m in model.encoder if isinstance(m, nn.Conv2d)]
    assert convs == [(1, 6, (5, 5)), (6, 16, (5, 5))]
    linears = [(m.in_features, m.out_features) for m in model.encoder if isinstance(m, nn.Linear)]
    assert linears == [(16 * 7 * 7, 120), (120, 84)]
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (84, 10)


@pytest.mark.parametrize(
    ("shape", "flat"),
    [((1, 8, 1), 32 * 2 * 1), ((1, 8, 2), 32 * 2 * 1), ((3, 32, 8), 32 * 8 * 2), ((1, 28, 7), 32 * 7 * 2)],
)
def test_cnn_pools_only_axes_that_can_shrink(shape: tuple[int, ...], flat: int) -> None:
    model = CNN(shape, 16, 10)
    linear = next(m for m in model.encoder if isinstance(m, nn.Linear))
    assert linear.in_features == flat


def test_models_have_independent_parameters() -> None:
    """Two parties built from one factory must not share weights."""
    a, b = MLP((4,), 3, 2), MLP((4,), 3, 2)
    assert not {id(p) for p in a.parameters()} & {id(p) for p in b.parameters()}


def test_input_shape_list_is_accepted() -> None:
    assert MLP([1, 8, 2], 4, 2).input_shape == (1, 8, 2)


BAD_ARGUMENTS = [
    (MLP, ((13,), 0, 2), {}, "embedding_dim must be an int >= 1, got 0$"),
    (MLP, ((13,), 4, 0), {}, "num_outputs must be an int >= 1, got 0$"),
    (CNN, ((1, 8, 2), -1, 2), {}, "embedding_dim must be an int >= 1, got -1$"),
    (LeNet, ((1, 8, 2), 4, 0), {}, "num_outputs must be an int >= 1, got 0$"),
    (MLP, ((13,), 4.0, 2), {}, "embedding_dim must be an int >= 1, got 4.0$"),
    (MLP, ((), 4, 2), {}, r"input_shape=\(\)"),
    (MLP, ((13, 0), 4, 2), {}, r"input_shape=\(13, 0\)"),
    (MLP, (13, 4, 2), {}, "input_shape=13"),
    (CNN, ((13,), 4, 2), {}, r"input_shape must have 3 axes \(channels, height, width\), got input_shape=\(13,\)"),
    (LeNet, ((8, 8), 4, 2), {}, r"3 axes .* input_shape=\(8, 8\)"),
    (MLP, ((13,), 4, 2), {"activation": "swish"}, "unknown activation='swish'; allowed: elu, gelu, leaky_relu"),
    (LeNet, ((1, 8, 2), 4, 2), {"activation": "ReLU"}, "unknown activation='ReLU'; allowed: .*relu"),
    (MLP, ((13,), 4, 2), {"dropout": 1.0}, r"dropout must be in \[0, 1\), got dropout=1.0"),
    (MLP, ((13,), 4, 2), {"hidden": [8, 0]}, r"hidden=\[8, 0\]"),
    (MLP, ((13,), 4, 2), {"head_hidden": [-3]}, r"head_hidden=\[-3\]"),
    (CNN, ((1, 8, 2), 4, 2), {"channels": []}, r"channels=\[\]"),
    (CNN, ((1, 8, 2), 4, 2), {"kernel_size": 0}, "kernel_size must be an int >= 1, got 0$"),
    (CNN, ((1, 8, 2), 4, 2), {"head_hidden": [0]}, r"head_hidden=\[0\]"),
]


@pytest.mark.parametrize(("cls", "args", "kwargs", "message"), BAD_ARGUMENTS)
def test_bad_arguments_raise(cls: type[PartyModel], args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(*args, **kwargs)


def test_wrong_input_at_forward_fails_loudly() -> None:
    model = MLP((13,), 4, 2)
    with pytest.raises(RuntimeError):
        model(torch.randn(3, 12))


@pytest.fixture
def factory_parser() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=PartyModelFactory)
    return parser


def _build(parser: ArgumentParser, cfg: Namespace) -> PartyModelFactory:
    return parser.instantiate(cfg).model


def test_class_as_factory_from_object(factory_parser: ArgumentParser) -> None:
    cfg = factory_parser.parse_object({"model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [32]}}})
    factory = _build(factory_parser, cfg)
    model = factory((30,), 16, 2)
    assert isinstance(model, MLP)
    assert model.encoder[1].out_features == 32
    assert model.encoder(torch.randn(3, 30)).shape == (3, 16)
    assert model(torch.randn(3, 30)).shape == (3, 2)


def test_class_as_factory_from_yaml_and_cli(factory_parser: ArgumentParser) -> None:
    yaml = "model:\n  class_path: CNN\n  init_args:\n    channels: [8]\n    kernel_size: 5\n"
    factory = _build(factory_parser, factory_parser.parse_string(yaml))
    model = factory((1, 8, 1), 4, 10)
    assert isinstance(model, CNN)
    assert model.encoder[0].out_channels == 8
    assert model(torch.randn(2, 1, 8, 1)).shape == (2, 10)

    cfg = factory_parser.parse_args(["--model=LeNet", "--model.activation=tanh"])
    model = _build(factory_parser, cfg)((1, 8, 2), 4, 3)
    assert isinstance(model, LeNet)
    assert isinstance(model.encoder[1], nn.Tanh)

    cfg = factory_parser.parse_args(["--model", json.dumps({"class_path": "lvfl.models.MLP"})])
    assert factory_parser.dump(cfg).startswith("model:\n  class_path: lvfl.models.MLP\n  init_args:")


@pytest.mark.parametrize(
    "init_args",
    [{"embedding_dim": 3}, {"input_shape": [13]}, {"hiddden": [3]}],
    ids=["protocol-owned-embedding_dim", "protocol-owned-input_shape", "typo"],
)
def test_factory_refuses_arguments_the_protocol_supplies(factory_parser: ArgumentParser, init_args: dict) -> None:
    with pytest.raises(ArgumentError, match=f"Option '{next(iter(init_args))}' is not accepted"):
        factory_parser.parse_object({"model": {"class_path": "lvfl.models.MLP", "init_args": init_args}})


def test_factories_per_party_and_class_default() -> None:
    """Heterogeneous parties: a dict of factories, and a bare class as the default."""

    class Protocol:
        def __init__(
            self, party_model: PartyModelFactory = MLP, party_models: dict[str, PartyModelFactory] | None = None
        ) -> None:
            self.party_model = party_model
            self.party_models = party_models

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(Protocol, "protocol")
    yaml = (
        "protocol:\n  party_models:\n"
        "    active: {class_path: MLP, init_args: {hidden: [8]}}\n"
        "    passive_1: lvfl.models.LeNet\n"
    )
    protocol = parser.instantiate(parser.parse_string(yaml)).protocol
    assert isinstance(protocol.party_model((5,), 4, 2), MLP)
    assert isinstance(protocol.party_models["active"]((5,), 4, 2), MLP)
    assert isinstance(protocol.party_models["passive_1"]((1, 8, 1), 4, 2), LeNet)
