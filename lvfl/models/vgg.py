"""VGG party models (11 and 16 layers, with batch norm) made of torchvision's own layers, for image strips."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from torch import nn
from torchvision.models.vgg import cfgs, make_layers

from lvfl.models.base import PartyModel, check_input_shape, check_widths, make_head, pool_kernel
from lvfl.models.resnet import check_pretrained, init_like_torchvision, load_torchvision_weights, pooled_encoder


class VGGBase(PartyModel):
    """torchvision's batch-norm VGG features as the encoder, pooling only axes that can shrink; use `VGG11`/`VGG16`.

    The encoder is ``backbone -> global average pool -> Flatten -> Linear(512, embedding_dim) -> ReLU`` and the
    head ``make_head(embedding_dim, head_hidden, num_outputs)``. The backbone holds torchvision's ``features``
    (built by ``torchvision.models.vgg.make_layers`` from torchvision's config, initialized as torchvision's `VGG`
    does) under that name, so its state dict is torchvision's without ``classifier.*`` and torchvision files load
    as they are.

    Three changes make it fit a party: the first conv takes the party's number of channels; each of the five 2x2
    max-pools halves only the axes longer than 1 pixel, rounding up, as `lvfl.models.base.pool_kernel` does,
    because torchvision's pools would take an 8x1 strip to zero width at the first pool; and torchvision's
    7x7 adaptive pool and 4096-wide classifier (over 100 million weights, most of the model) give way to a global
    average pool and one Linear layer, which is also why the model is not built by ``vgg11_bn()`` and then cut.
    A strip reaching 1x1 before the last stage has one value per sample and channel in its last BatchNorm layers:
    train mode runs from a batch of 2, but a batch of 2 normalizes those channels to about +-1 whatever the input,
    leaving earlier layers only a gradient through BatchNorm's ``eps``; use batches of several samples.

    Args:
        input_shape: ``(channels, height, width)`` of one sample.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        pretrained: path to a local file holding a torchvision state dict of the same architecture, e.g. saved by
            ``torch.save(torchvision.models.vgg11_bn().state_dict(), path)``; loaded into the backbone with
            ``classifier.*`` ignored. Its first conv must take the party's number of channels. None (the default)
            keeps torchvision's random initialization.
    """

    config: ClassVar[str]
    """Key of ``torchvision.models.vgg.cfgs``: ``"A"`` is VGG-11, ``"D"`` VGG-16."""
    arch: ClassVar[str]
    """torchvision's builder name (``torchvision.models.<arch>``), for messages."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        head_hidden: Sequence[int] = (),
        pretrained: str | None = None,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        if not hasattr(self, "config"):
            raise TypeError("VGGBase is abstract: use VGG11 or VGG16")
        in_channels, height, width = check_input_shape(input_shape, ndim=3, what="(channels, height, width)")
        head_hidden = check_widths("head_hidden", head_hidden)
        path = check_pretrained(pretrained)

        features = make_layers(cfgs[self.config], batch_norm=True)
        first = features[0]
        features[0] = nn.Conv2d(in_channels, first.out_channels, first.kernel_size, padding=first.padding)
        for index, layer in enumerate(list(features)):
            if isinstance(layer, nn.Conv2d):
                init_like_torchvision(layer)
            elif isinstance(layer, nn.MaxPool2d):
                kernel = pool_kernel(height, width)
                features[index] = nn.MaxPool2d(kernel, ceil_mode=True)
                height, width = -(-height // kernel[0]), -(-width // kernel[1])
        backbone = nn.Sequential(OrderedDict(features=features))
        if path is not None:
            load_torchvision_weights(
                backbone,
                path,
                arch=self.arch,
                described=f"{type(self).__name__} on input_shape={self.input_shape}",
                classifier="classifier",
                first_conv="features.0.weight",
            )
        last_conv = [m for m in features if isinstance(m, nn.Conv2d)][-1]
        self.encoder = pooled_encoder(backbone, last_conv.out_channels, embedding_dim)
        self.head = make_head(embedding_dim, head_hidden, num_outputs)


class VGG11(VGGBase):
    """VGG-11 with batch norm (torchvision's ``vgg11_bn`` features, config ``"A"``); see `VGGBase`.

    Example:
        >>> import torch
        >>> model = VGG11((1, 8, 1), embedding_dim=16, num_outputs=10)
        >>> model(torch.randn(2, 1, 8, 1)).shape
        torch.Size([2, 10])
    """

    config = "A"
    arch = "vgg11_bn"


class VGG16(VGGBase):
    """VGG-16 with batch norm (torchvision's ``vgg16_bn`` features, config ``"D"``); see `VGGBase`.

    Example:
        >>> import torch
        >>> model = VGG16((3, 32, 8), embedding_dim=16, num_outputs=10)
        >>> model.encoder(torch.randn(2, 3, 32, 8)).shape
        torch.Size([2, 16])
    """

    config = "D"
    arch = "vgg16_bn"
