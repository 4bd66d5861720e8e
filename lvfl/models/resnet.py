"""ResNet party models (18, 34, 50) made of torchvision's own residual blocks, for image strips.

Also home to the two helpers every torchvision-based party model shares (`lvfl.models.vgg` imports them):
`check_pretrained`, which vets the ``pretrained`` option before anything is built, and
`load_torchvision_weights`, which loads a local torchvision state dict into a backbone or says exactly why not.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from lvfl.checks import OptionError
from lvfl.models.base import PartyModel, check_input_shape, check_widths, make_head

STEMS = ("cifar", "imagenet")
"""Values of the ResNet models' ``stem`` option."""

_SHOWN = 5  # keys listed per kind of mismatch; the rest are counted, so a wrong file gives a readable error


def check_pretrained(pretrained: str | os.PathLike[str] | None) -> Path | None:
    """Return ``pretrained`` as a `Path` to an existing file, or None; called before building so a typo fails fast.

    Raises:
        OptionError: ``pretrained`` is neither None nor a path.
        FileNotFoundError: no file at that path. lvfl never downloads weights, so a URL lands here too.
    """
    if pretrained is None:
        return None
    if not isinstance(pretrained, (str, os.PathLike)):
        raise OptionError(f"pretrained must be a path to a local state-dict file or None, got {pretrained!r}")
    path = Path(pretrained)
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained={os.fspath(pretrained)!r}: no such file; pretrained takes a local file holding a "
            "torchvision state dict (weights are never downloaded)"
        )
    return path


def _keys(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown + (f" (and {len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else "")


def _shape(tensor: torch.Tensor) -> str:
    return str(tuple(tensor.shape))


def load_torchvision_weights(
    backbone: nn.Module,
    path: Path,
    *,
    arch: str,
    described: str,
    classifier: str,
    first_conv: str,
    kernel_hint: str = "",
) -> None:
    """Load a torchvision state dict from ``path`` into ``backbone``, ignoring only the classifier's keys.

    The backbone mirrors torchvision's attribute names, so its state dict is the file's minus ``classifier.*``.
    Anything else that does not fit is refused rather than skipped: a silently half-loaded backbone trains, but
    from a start nobody asked for. The one tolerated gap is a BatchNorm ``num_batches_tracked`` counter: files
    saved before PyTorch 0.4.1 lack it, and BatchNorm fills it in itself.

    Args:
        backbone: the module to load into, in place.
        path: the file, read with ``torch.load(weights_only=True)`` (no code in the file runs).
        arch: torchvision's builder name, e.g. ``"resnet18"``, for the hint on how to save a fitting file.
        described: the model as the error should name it, e.g. ``"ResNet18(stem='cifar') on input_shape=..."``.
        classifier: prefix of the classifier's keys, which the party model replaces by its own layers.
        first_conv: key of the first conv's weight, whose shape depends on the party's channels (and stem).
        kernel_hint: what to say when the first conv's kernel size differs (e.g. which stem has which kernel).

    Raises:
        ValueError: the file is not a state dict, or its keys or shapes do not fit; the message names the
            ``pretrained`` option, the file, the keys and what to change.
    """
    where = f"pretrained={os.fspath(path)!r}"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load reports a foreign file as anything from KeyError to UnpicklingError
        raise ValueError(f"{where} could not be read by torch.load(weights_only=True): {err!r}") from err
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(
            f"{where} does not hold a state dict (a mapping of names to tensors); save one with "
            f"torch.save(torchvision.models.{arch}().state_dict(), path)"
        )
    state = {k: v for k, v in state.items() if not k.startswith(classifier + ".")}
    own = backbone.state_dict()
    missing = [k for k in own if k not in state and not k.endswith(".num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    mismatched = [k for k in state if k in own and state[k].shape != own[k].shape]
    if not (missing or unexpected or mismatched):
        backbone.load_state_dict(state)
        return

    problems = [f"{k} is {_shape(state[k])} in the file but {_shape(own[k])} in the model" for k in mismatched[:_SHOWN]]
    if len(mismatched) > _SHOWN:
        problems.append(f"{len(mismatched) - _SHOWN} more shapes differ")
    if missing:
        problems.append(f"missing from the file: {_keys(missing)}")
    if unexpected:
        problems.append(f"not in the model: {_keys(unexpected)}")
    hints = []
    if first_conv in mismatched and state[first_conv].dim() == own[first_conv].dim() == 4:
        (_, file_in, *file_kernel), (_, own_in, *own_kernel) = state[first_conv].shape, own[first_conv].shape
        if file_in != own_in:
            hints.append(
                f"The file's first conv takes {file_in} input channels but this party's images have {own_in}: "
                f"use weights trained on {own_in}-channel images, or pretrained=None."
            )
        if file_kernel != own_kernel:
            sizes = "x".join(map(str, file_kernel)), "x".join(map(str, own_kernel))
            hint = f"The file's first conv is {sizes[0]} and this model's {sizes[1]}"
            hints.append(f"{hint}: {kernel_hint}." if kernel_hint else f"{hint}.")
    if missing or unexpected or set(mismatched) - {first_conv}:
        hints.append(
            f"Is it a {arch} file? It should hold torchvision.models.{arch}().state_dict() "
            f"(keys {classifier}.* are ignored)."
        )
    raise ValueError(" ".join([f"{where} does not fit {described}: {'; '.join(problems)}.", *hints]))


def init_like_torchvision(conv: nn.Conv2d) -> nn.Conv2d:
    """Initialize a conv as torchvision's ResNet and VGG do, so a replaced layer starts like the one it replaces."""
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


def pooled_encoder(backbone: nn.Module, width: int, embedding_dim: int) -> nn.Sequential:
    """Backbone -> global average pool -> flatten -> Linear(embedding_dim) -> ReLU, with torchvision's names kept."""
    return nn.Sequential(
        OrderedDict(
            backbone=backbone,
            pool=nn.AdaptiveAvgPool2d(1),
            flatten=nn.Flatten(),
            embed=nn.Linear(width, embedding_dim),
            act=nn.ReLU(),
        )
    )


class ResNetBase(PartyModel):
    """A torchvision ResNet as the encoder, with a choice of stem for small images; use a subclass, e.g. `ResNet18`.

    The encoder is ``backbone -> global average pool -> Flatten -> Linear(embedding_dim) -> ReLU`` and the head
    ``make_head(embedding_dim, head_hidden, num_outputs)``. The backbone is torchvision's ``conv1, bn1, relu,
    maxpool, layer1..layer4`` under the same names (its residual stages are torchvision's, untouched), so its
    state dict is torchvision's without ``fc.*`` and torchvision files load as they are.

    Stems: ``"cifar"`` (the default) is the usual CIFAR ResNet stem, a 3x3 stride-1 conv and no max-pool, because
    torchvision's ImageNet stem (``"imagenet"``: 7x7 stride-2 conv, then a stride-2 max-pool) would shrink a 32x8
    strip to 8x2 before the first residual block. Either way the first conv takes the party's number of channels.

    Narrow strips: every downsampling layer here (3x3 conv with padding 1, 1x1 shortcut conv, 7x7 conv with
    padding 3, 3x3 max-pool with padding 1, all stride 2) maps an axis of n pixels to ceil(n / 2), never 0. On an
    axis of 1 pixel it stays 1 and the stride is a no-op (the kernel's centre sees the pixel, the rest padding),
    so torchvision's strides need no per-axis change to run on 8x1 strips; keeping them keeps the layers and the
    state dict torchvision's. An 8x1 strip reaches 1x1 at ``layer4``, where BatchNorm in train mode has one value
    per sample and channel: it runs from a batch of 2, but a batch of 2 normalizes every channel to about +-1
    whatever the input, leaving earlier layers only a gradient through BatchNorm's ``eps``; train such parties
    with batches of several samples.

    Args:
        input_shape: ``(channels, height, width)`` of one sample.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        stem: ``"cifar"`` (3x3 conv, no max-pool) or ``"imagenet"`` (torchvision's 7x7 stride-2 conv + max-pool).
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        pretrained: path to a local file holding a torchvision state dict of the same architecture, e.g. saved by
            ``torch.save(torchvision.models.resnet18().state_dict(), path)``; loaded into the backbone with ``fc.*``
            ignored. Its ``conv1`` must match the stem (ImageNet files are 7x7: ``stem="imagenet"``) and the
            party's channels. None (the default) keeps torchvision's random initialization.
    """

    block: ClassVar[type[BasicBlock | Bottleneck]]
    """torchvision's residual block."""
    layers: ClassVar[tuple[int, int, int, int]]
    """Blocks per stage, as torchvision's builders pass them."""
    arch: ClassVar[str]
    """torchvision's builder name (``torchvision.models.<arch>``), for messages."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        stem: Literal["cifar", "imagenet"] = "cifar",
        head_hidden: Sequence[int] = (),
        pretrained: str | None = None,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        if not hasattr(self, "block"):
            raise TypeError("ResNetBase is abstract: use ResNet18, ResNet34, ResNet50 or ResNet101")
        in_channels, _, _ = check_input_shape(input_shape, ndim=3, what="(channels, height, width)")
        if stem not in STEMS:
            raise OptionError(f"stem must be 'cifar' or 'imagenet', got stem={stem!r}")
        head_hidden = check_widths("head_hidden", head_hidden)
        path = check_pretrained(pretrained)

        net = ResNet(self.block, list(self.layers))
        width = net.conv1.out_channels
        if stem == "cifar":
            conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
            maxpool: nn.Module = nn.Identity()
        else:
            conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
            maxpool = net.maxpool
        backbone = nn.Sequential(
            OrderedDict(
                conv1=init_like_torchvision(conv1),
                bn1=net.bn1,
                relu=net.relu,
                maxpool=maxpool,
                layer1=net.layer1,
                layer2=net.layer2,
                layer3=net.layer3,
                layer4=net.layer4,
            )
        )
        if path is not None:
            load_torchvision_weights(
                backbone,
                path,
                arch=self.arch,
                described=f"{type(self).__name__}(stem={stem!r}) on input_shape={self.input_shape}",
                classifier="fc",
                first_conv="conv1.weight",
                kernel_hint="ImageNet files need stem='imagenet' (torchvision's 7x7 conv1); stem='cifar' has a "
                "3x3 conv1",
            )
        self.encoder = pooled_encoder(backbone, net.fc.in_features, embedding_dim)
        self.head = make_head(embedding_dim, head_hidden, num_outputs)


class ResNet18(ResNetBase):
    """ResNet-18 (torchvision's `BasicBlock`, stages of 2, 2, 2, 2 blocks, 512 features); see `ResNetBase`.

    Example:
        >>> import torch
        >>> model = ResNet18((1, 8, 2), embedding_dim=16, num_outputs=10)
        >>> model.encoder(torch.randn(2, 1, 8, 2)).shape
        torch.Size([2, 16])
    """

    block = BasicBlock
    layers = (2, 2, 2, 2)
    arch = "resnet18"


class ResNet34(ResNetBase):
    """ResNet-34 (torchvision's `BasicBlock`, stages of 3, 4, 6, 3 blocks, 512 features); see `ResNetBase`.

    Example:
        >>> import torch
        >>> model = ResNet34((3, 32, 8), embedding_dim=16, num_outputs=10, stem="imagenet")
        >>> model(torch.randn(2, 3, 32, 8)).shape
        torch.Size([2, 10])
    """

    block = BasicBlock
    layers = (3, 4, 6, 3)
    arch = "resnet34"


class ResNet50(ResNetBase):
    """ResNet-50 (torchvision's `Bottleneck`, stages of 3, 4, 6, 3 blocks, 2048 features); see `ResNetBase`.

    Example:
        >>> import torch
        >>> model = ResNet50((3, 32, 16), embedding_dim=16, num_outputs=10, head_hidden=[32])
        >>> model(torch.randn(2, 3, 32, 16)).shape
        torch.Size([2, 10])
    """

    block = Bottleneck
    layers = (3, 4, 6, 3)
    arch = "resnet50"


class ResNet101(ResNetBase):
    """ResNet-101 (torchvision's `Bottleneck`, stages of 3, 4, 23, 3 blocks, 2048 features); see `ResNetBase`.

    VFedMH (its Table II) trains ResNet18, ResNet50 and ResNet101 side by side.

    Example:
        >>> import torch
        >>> model = ResNet101((3, 32, 8), embedding_dim=16, num_outputs=10)
        >>> model(torch.randn(2, 3, 32, 8)).shape
        torch.Size([2, 10])
    """

    block = Bottleneck
    layers = (3, 4, 23, 3)
    arch = "resnet101"
