"""ResNet and VGG party models: strips down to 8x1, torchvision's layers, stems, pretrained files, bad options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torchvision
from jsonargparse import ArgumentError, ArgumentParser
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from lvfl.models import PartyModel, PartyModelFactory
from lvfl.models.resnet import ResNet18, ResNet34, ResNet50, ResNet101, ResNetBase
from lvfl.models.vgg import VGG11, VGG16, VGGBase

STRIPS = [(1, 28, 7), (3, 32, 8), (3, 32, 16), (1, 8, 2), (1, 8, 1)]
# every strip for the cheap models; the widest and the thinnest for the costly ones
CASES = (
    [(cls, shape) for cls in (ResNet18, VGG11) for shape in STRIPS]
    + [(cls, shape) for cls in (ResNet34, ResNet50, VGG16) for shape in [(3, 32, 16), (1, 8, 1)]]
    + [(ResNet18, (3, 32, 8), "imagenet"), (ResNet50, (1, 8, 1), "imagenet")]
)
IDS = [f"{case[0].__name__}-{'x'.join(map(str, case[1]))}{'-' + case[2] if len(case) > 2 else ''}" for case in CASES]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _whole(message: str) -> str:
    """A `pytest.raises` pattern matching exactly ``message``."""
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shapes_split_and_small_batch_training(case: tuple) -> None:
    cls, shape, *stem = case
    model = cls(shape, 16, 10, **({"stem": stem[0]} if stem else {}))

    model.eval()
    x = torch.randn(3, *shape)
    embedding = model.encoder(x)
    assert embedding.shape == (3, 16)
    assert model.head(embedding).shape == (3, 10)
    torch.testing.assert_close(model(x), model.head(embedding))

    encoder = {id(p) for p in model.encoder.parameters()}
    head = {id(p) for p in model.head.parameters()}
    assert encoder
    assert head
    assert not encoder & head
    assert encoder | head == {id(p) for p in model.parameters()}
    assert {name for name, _ in model.named_children()} == {"encoder", "head"}

    # train mode with the smallest batch BatchNorm accepts, even where the strip has reached 1x1
    model.train()
    loss = nn.functional.cross_entropy(model(torch.randn(2, *shape)), torch.tensor([1, 7]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert model.head[-1].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("cls", [ResNet18, VGG11])
def test_gradients_reach_every_parameter(cls: type[PartyModel]) -> None:
    model = cls((3, 32, 8), 16, 4)
    model(torch.randn(4, 3, 32, 8)).square().sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.abs().sum() > 0, name


def _stage_sizes(backbone: nn.Sequential, shape: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    sizes = {}
    x = torch.zeros(2, *shape)
    with torch.no_grad():
        for name, layer in backbone.named_children():
            x = layer(x)
            sizes[name] = tuple(x.shape[2:])
    return sizes


@pytest.mark.parametrize(
    ("shape", "stem", "sizes"),
    [
        ((1, 28, 7), "cifar", [(28, 7), (28, 7), (28, 7), (14, 4), (7, 2), (4, 1)]),
        ((1, 28, 7), "imagenet", [(14, 4), (7, 2), (7, 2), (4, 1), (2, 1), (1, 1)]),
        ((1, 8, 1), "cifar", [(8, 1), (8, 1), (8, 1), (4, 1), (2, 1), (1, 1)]),
        ((1, 8, 1), "imagenet", [(4, 1), (2, 1), (2, 1), (1, 1), (1, 1), (1, 1)]),
    ],
)
def test_resnet_stems_and_stride_two_on_one_pixel(shape: tuple[int, ...], stem: str, sizes: list) -> None:
    """torchvision's stride-2 layers map n pixels to ceil(n / 2): a 1-pixel axis stays 1, none reaches 0."""
    model = ResNet18(shape, 8, 2, stem=stem).eval()
    conv1 = model.encoder.backbone.conv1
    assert conv1.in_channels == shape[0]
    if stem == "cifar":
        assert (conv1.kernel_size, conv1.stride) == ((3, 3), (1, 1))
        assert isinstance(model.encoder.backbone.maxpool, nn.Identity)
    else:
        assert (conv1.kernel_size, conv1.stride) == ((7, 7), (2, 2))
        assert isinstance(model.encoder.backbone.maxpool, nn.MaxPool2d)
    stages = ["bn1", "maxpool", "layer1", "layer2", "layer3", "layer4"]
    measured = _stage_sizes(model.encoder.backbone, shape)
    assert [measured[s] for s in stages] == sizes
    # the strides stay torchvision's, also on the 1-pixel axis
    assert model.encoder.backbone.layer4[0].conv1.stride == (2, 2)


@pytest.mark.parametrize(
    ("shape", "kernels"),
    [
        ((1, 8, 1), [(2, 1), (2, 1), (2, 1), (1, 1), (1, 1)]),
        ((1, 28, 7), [(2, 2), (2, 2), (2, 2), (2, 1), (2, 1)]),
        ((3, 32, 16), [(2, 2), (2, 2), (2, 2), (2, 2), (2, 1)]),
    ],
)
def test_vgg_pools_only_axes_that_can_shrink(shape: tuple[int, ...], kernels: list) -> None:
    model = VGG11(shape, 8, 2)
    features = model.encoder.backbone.features
    assert [m.kernel_size for m in features if isinstance(m, nn.MaxPool2d)] == kernels
    assert _stage_sizes(features, shape)[str(len(features) - 1)] == (1, 1)
    assert features[0].in_channels == shape[0]


def _tensor_shapes(module: nn.Module, drop: str = "") -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if not (drop and k.startswith(drop))}


@pytest.mark.parametrize(
    ("cls", "block"),
    [(ResNet18, BasicBlock), (ResNet34, BasicBlock), (ResNet50, Bottleneck), (ResNet101, Bottleneck)],
)
def test_resnet_backbone_is_torchvisions(cls: type[ResNetBase], block: type[nn.Module]) -> None:
    with torch.device("meta"):  # structure only: no memory, no initialization
        reference = getattr(torchvision.models, cls.arch)(weights=None)
        ours = cls((3, 32, 8), 16, 10, stem="imagenet")
        narrow = cls((1, 32, 8), 16, 10)  # stem="cifar", one channel
    backbone = ours.encoder.backbone

    assert _tensor_shapes(backbone) == _tensor_shapes(reference, drop="fc.")
    for stage in ("layer1", "layer2", "layer3", "layer4"):
        assert all(isinstance(b, block) for b in getattr(backbone, stage))
        assert len(getattr(backbone, stage)) == len(getattr(reference, stage))
    assert ours.encoder.embed.in_features == reference.fc.in_features

    # the cifar stem swaps only conv1: 64x3x7x7 weights for 64x1x3x3
    count = sum(p.numel() for p in narrow.encoder.backbone.parameters())
    expected = sum(p.numel() for p in reference.parameters())
    expected -= sum(p.numel() for p in reference.fc.parameters()) + 64 * 3 * 7 * 7 - 64 * 1 * 3 * 3
    assert count == expected


@pytest.mark.parametrize("cls", [VGG11, VGG16])
def test_vgg_backbone_is_torchvisions(cls: type[VGGBase]) -> None:
    with torch.device("meta"):
        reference = getattr(torchvision.models, cls.arch)(weights=None)
        ours = cls((3, 32, 32), 16, 10)
    assert _tensor_shapes(ours.encoder.backbone) == _tensor_shapes(reference, drop="classifier.")
    assert [type(m) for m in ours.encoder.backbone.features] == [type(m) for m in reference.features]
    assert ours.encoder.embed.in_features == 512


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    reference = torchvision.models.resnet18(weights=None)
    for m in reference.modules():  # non-trivial BatchNorm statistics, so the loaded buffers matter in eval mode
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    torch.save(reference.state_dict(), path)
    return path


def test_resnet_pretrained_round_trip(resnet18_file: Path) -> None:
    state = torch.load(resnet18_file, weights_only=True)
    model = ResNet18((3, 32, 16), 16, 10, stem="imagenet", pretrained=str(resnet18_file)).eval()
    assert torch.equal(model.encoder.backbone.layer3[1].conv2.weight, state["layer3.1.conv2.weight"])
    assert torch.equal(model.encoder.backbone.bn1.running_var, state["bn1.running_var"])

    reference = torchvision.models.resnet18(weights=None)
    reference.load_state_dict(state)
    reference.fc = nn.Identity()
    x = torch.randn(2, 3, 32, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.encoder[:3](x), reference.eval()(x))  # backbone, pool, flatten


def test_pretrained_without_batch_norm_counters(resnet18_file: Path, tmp_path: Path) -> None:
    """Files saved before PyTorch 0.4.1 have no ``num_batches_tracked``; the weights are all there, so they load."""
    state = torch.load(resnet18_file, weights_only=True)
    old = {k: v for k, v in state.items() if not k.endswith(".num_batches_tracked")}
    assert len(old) < len(state)
    torch.save(old, tmp_path / "old.pt")
    model = ResNet18((3, 32, 8), 16, 10, stem="imagenet", pretrained=str(tmp_path / "old.pt"))
    assert torch.equal(
        model.encoder.backbone.layer4[0].downsample[1].running_mean, state["layer4.0.downsample.1.running_mean"]
    )


def test_vgg_pretrained_round_trip(tmp_path: Path) -> None:
    """torchvision's own VGG-11 features (2x2 pools) give the same features as ours on a 32x32 image."""
    with torch.device("meta"):
        reference = torchvision.models.vgg11_bn(weights=None)
    features = reference.features.to_empty(device="cpu")  # only the features; the classifier is 120M weights
    for m in features.modules():
        if isinstance(m, (nn.Conv2d, nn.BatchNorm2d)):
            m.reset_parameters()
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    state = {f"features.{k}": v for k, v in features.state_dict().items()}
    # the classifier's keys as a torchvision file has them; their contents are ignored, so stand-ins keep it small
    state |= {k: torch.zeros(1) for k in reference.state_dict() if k.startswith("classifier.")}
    path = tmp_path / "vgg11_bn.pt"
    torch.save(state, path)

    model = VGG11((3, 32, 32), 16, 10, pretrained=str(path)).eval()
    assert torch.equal(model.encoder.backbone.features[4].weight, state["features.4.weight"])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.encoder.backbone(x), features.eval()(x))


def test_pretrained_conv1_of_imagenet_stem_needs_stem_imagenet(resnet18_file: Path) -> None:
    message = (
        f"pretrained={str(resnet18_file)!r} does not fit ResNet18(stem='cifar') on input_shape=(3, 32, 8): "
        "conv1.weight is (64, 3, 7, 7) in the file but (64, 3, 3, 3) in the model. The file's first conv is 7x7 "
        "and this model's 3x3: ImageNet files need stem='imagenet' (torchvision's 7x7 conv1); stem='cifar' has a "
        "3x3 conv1."
    )
    with pytest.raises(ValueError, match=_whole(message)):
        ResNet18((3, 32, 8), 16, 10, pretrained=str(resnet18_file))


def test_pretrained_three_channels_on_one_channel_party(resnet18_file: Path) -> None:
    message = (
        f"pretrained={str(resnet18_file)!r} does not fit ResNet18(stem='imagenet') on input_shape=(1, 28, 7): "
        "conv1.weight is (64, 3, 7, 7) in the file but (64, 1, 7, 7) in the model. The file's first conv takes 3 "
        "input channels but this party's images have 1: use weights trained on 1-channel images, or "
        "pretrained=None."
    )
    with pytest.raises(ValueError, match=_whole(message)):
        ResNet18((1, 28, 7), 16, 10, stem="imagenet", pretrained=resnet18_file)


def test_pretrained_of_another_architecture(resnet18_file: Path) -> None:
    # ResNet-34 has 8 more BasicBlocks than ResNet-18, 10 tensors each besides num_batches_tracked: 5 shown + 75
    message = (
        f"pretrained={str(resnet18_file)!r} does not fit ResNet34(stem='imagenet') on input_shape=(3, 32, 8): "
        "missing from the file: layer1.2.conv1.weight, layer1.2.bn1.weight, layer1.2.bn1.bias, "
        "layer1.2.bn1.running_mean, layer1.2.bn1.running_var (and 75 more). Is it a resnet34 file? It should hold "
        "torchvision.models.resnet34().state_dict() (keys fc.* are ignored)."
    )
    with pytest.raises(ValueError, match=_whole(message)):
        ResNet34((3, 32, 8), 16, 10, stem="imagenet", pretrained=str(resnet18_file))


def test_pretrained_vgg_on_one_channel_party(tmp_path: Path) -> None:
    with torch.device("meta"):
        reference = torchvision.models.vgg11_bn(weights=None)
    state = {k: torch.zeros(v.shape if k.startswith("features.") else 1) for k, v in reference.state_dict().items()}
    path = tmp_path / "vgg11_bn.pt"
    torch.save(state, path)
    message = (
        f"pretrained={str(path)!r} does not fit VGG11 on input_shape=(1, 32, 8): features.0.weight is "
        "(64, 3, 3, 3) in the file but (64, 1, 3, 3) in the model. The file's first conv takes 3 input channels "
        "but this party's images have 1: use weights trained on 1-channel images, or pretrained=None."
    )
    with pytest.raises(ValueError, match=_whole(message)):
        VGG11((1, 32, 8), 16, 10, pretrained=str(path))


@pytest.mark.parametrize("cls", [ResNet18, VGG11])
def test_pretrained_missing_file(cls: type[PartyModel], tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere.pt")
    message = (
        f"pretrained={path!r}: no such file; pretrained takes a local file holding a torchvision state dict "
        "(weights are never downloaded)"
    )
    with pytest.raises(FileNotFoundError, match=_whole(message)):
        cls((3, 32, 8), 16, 10, pretrained=path)


def test_pretrained_file_that_is_not_a_state_dict(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save({"epoch": 3, "state_dict": {}}, checkpoint)
    message = (
        f"pretrained={str(checkpoint)!r} does not hold a state dict (a mapping of names to tensors); save one with "
        "torch.save(torchvision.models.resnet18().state_dict(), path)"
    )
    with pytest.raises(ValueError, match=_whole(message)):
        ResNet18((3, 32, 8), 16, 10, pretrained=str(checkpoint))

    text = tmp_path / "notes.txt"
    text.write_text("not a tensor file")
    with pytest.raises(ValueError, match=f"^pretrained={re.escape(repr(str(text)))} could not be read by torch.load"):
        VGG11((3, 32, 8), 16, 10, pretrained=str(text))


BAD_ARGUMENTS = [
    (ResNet18, ((3, 32, 8), 16, 10), {"stem": "resnet"}, "stem must be 'cifar' or 'imagenet', got stem='resnet'"),
    (ResNet50, ((3, 32, 8), 16, 10), {"stem": None}, "stem must be 'cifar' or 'imagenet', got stem=None"),
    (ResNet18, ((3, 32, 8), 16, 10), {"head_hidden": [0]}, "head_hidden must be a list of integers >= 1, got "
     "head_hidden=[0]"),
    (VGG16, ((3, 32, 8), 16, 10), {"head_hidden": [8, -1]}, "head_hidden must be a list of integers >= 1, got "
     "head_hidden=[8, -1]"),
    (ResNet34, ((32, 8), 16, 10), {}, "input_shape must have 3 axes (channels, height, width), got "
     "input_shape=(32, 8)"),
    (VGG11, ((1, 1, 32, 8), 16, 10), {}, "input_shape must have 3 axes (channels, height, width), got "
     "input_shape=(1, 1, 32, 8)"),
    (VGG11, ((3, 0, 8), 16, 10), {}, "input_shape must be a non-empty tuple of integers >= 1, got "
     "input_shape=(3, 0, 8)"),
    (ResNet18, ((3, 32, 8), 0, 10), {}, "embedding_dim must be an int >= 1, got 0"),
    (VGG16, ((3, 32, 8), 16, 0), {}, "num_outputs must be an int >= 1, got 0"),
    (ResNet18, ((3, 32, 8), 16, 10), {"pretrained": 3}, "pretrained must be a path to a local state-dict file or "
     "None, got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "args", "kwargs", "message"), BAD_ARGUMENTS)
def test_bad_arguments_raise(cls: type[PartyModel], args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=_whole(message)):
        cls(*args, **kwargs)


@pytest.mark.parametrize(("base", "message"), [(ResNetBase, "ResNetBase is abstract"), (VGGBase, "VGGBase is")])
def test_bases_are_abstract(base: type[PartyModel], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        base((3, 32, 8), 16, 10)


def test_from_config_with_head_hidden_and_stem() -> None:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=PartyModelFactory)
    init_args = {"stem": "imagenet", "head_hidden": [8]}
    cfg = parser.parse_object({"model": {"class_path": "lvfl.models.resnet.ResNet18", "init_args": init_args}})
    model = parser.instantiate(cfg).model((1, 8, 1), 4, 3)
    assert isinstance(model, ResNet18)
    assert model.encoder.backbone.conv1.kernel_size == (7, 7)
    assert [(m.in_features, m.out_features) for m in model.head if isinstance(m, nn.Linear)] == [(4, 8), (8, 3)]

    with pytest.raises(ArgumentError):
        parser.parse_object({"model": {"class_path": "lvfl.models.resnet.ResNet18", "init_args": {"stem": "x"}}})
