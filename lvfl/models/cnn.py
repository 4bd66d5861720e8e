"""Small convolutional party model for image strips, down to 1 pixel wide."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lvfl.checks import check_int
from lvfl.models.base import PartyModel, check_input_shape, check_widths, flat_size, make_head, pool_kernel


class CNN(PartyModel):
    """Convolutional encoder with a fully connected head, for ``(channels, height, width)`` inputs.

    The encoder is ``[Conv2d(k, padding="same") -> ReLU -> MaxPool2d] * len(channels) -> Flatten ->
    Linear(embedding_dim) -> ReLU``. A vertical split gives each party a strip of the image, e.g. 8x1 pixels of an
    8x8 digit, so each pooling layer halves only the axes longer than 1 pixel (with ``ceil_mode=True``, odd sizes
    round up): no axis ever shrinks to zero and the strip's length is still reduced. The activation after the
    embedding layer follows `lvfl.models.MLP`.

    Args:
        input_shape: ``(channels, height, width)`` of one sample.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        channels: output channels of each conv block; at least one block.
        kernel_size: side of the square conv kernels; ``padding="same"`` keeps the size, so any size >= 1 works.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        pool: max-pool after every conv block (True) or never (False: PraVFed's CNN, two 1x1 convolutions
            straight into the fully connected layers).

    Example:
        >>> import torch
        >>> model = CNN((1, 8, 2), embedding_dim=16, num_outputs=10)
        >>> model(torch.randn(4, 1, 8, 2)).shape
        torch.Size([4, 10])
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        channels: Sequence[int] = (16, 32),
        kernel_size: int = 3,
        head_hidden: Sequence[int] = (),
        pool: bool = True,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        in_channels, height, width = check_input_shape(input_shape, ndim=3, what="(channels, height, width)")
        channels = check_widths("channels", channels)
        if not channels:
            raise ValueError("channels must list at least one conv block, got channels=[]")
        check_int(kernel_size, "kernel_size", 1)
        head_hidden = check_widths("head_hidden", head_hidden)

        blocks: list[nn.Module] = []
        for out_channels in channels:
            kernel = pool_kernel(height, width) if pool else (1, 1)
            blocks += [nn.Conv2d(in_channels, out_channels, kernel_size, padding="same"), nn.ReLU()]
            blocks += [nn.MaxPool2d(kernel, ceil_mode=True)] if pool else []
            in_channels, height, width = out_channels, -(-height // kernel[0]), -(-width // kernel[1])
        features = nn.Sequential(*blocks, nn.Flatten())
        self.encoder = nn.Sequential(
            *features, nn.Linear(flat_size(features, self.input_shape), embedding_dim), nn.ReLU()
        )
        self.head = make_head(embedding_dim, head_hidden, num_outputs)
