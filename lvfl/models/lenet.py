"""LeNet-5 party model, adapted to the narrow image strips of a vertical split."""

from __future__ import annotations

from torch import nn

from lvfl.models.base import PartyModel, check_input_shape, dense_layers, flat_size, make_activation, pool_kernel


class LeNet(PartyModel):
    """LeNet-5 with its last hidden layer as the embedding.

    The encoder is ``Conv2d(6, 5, padding=2) -> act -> pool -> Conv2d(16, 5, padding=2) -> act -> pool -> Flatten ->
    Linear(120) -> act -> Linear(embedding_dim) -> act`` (LeNet-5's 84-unit layer becomes the embedding), and the
    head is ``Linear(embedding_dim, num_outputs)`` (LeNet-5's output layer).

    Two changes from LeNet-5 make it run on strips as thin as 8x1 pixels: both convolutions are padded to keep the
    size (the original second conv is unpadded and would need at least 5x5 inputs), and each max pooling halves only
    the axes longer than 1 pixel, rounding up (``ceil_mode=True``), so no axis reaches zero. Pooling is max pooling
    and the activation defaults to ReLU, the usual modern reading; ``activation="tanh"`` is closer to the original.

    Args:
        input_shape: ``(channels, height, width)`` of one sample.
        embedding_dim: width of the embedding (84 in LeNet-5).
        num_outputs: number of logits.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS`.

    Example:
        >>> import torch
        >>> model = LeNet((1, 28, 7), embedding_dim=84, num_outputs=10)
        >>> model.encoder(torch.randn(4, 1, 28, 7)).shape
        torch.Size([4, 84])
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        activation: str = "relu",
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        in_channels, height, width = check_input_shape(input_shape, ndim=3, what="(channels, height, width)")
        make_activation(activation)  # fail before building anything

        first_pool = pool_kernel(height, width)
        second_pool = pool_kernel(-(-height // first_pool[0]), -(-width // first_pool[1]))
        features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2),
            make_activation(activation),
            nn.MaxPool2d(first_pool, ceil_mode=True),
            nn.Conv2d(6, 16, kernel_size=5, padding=2),
            make_activation(activation),
            nn.MaxPool2d(second_pool, ceil_mode=True),
            nn.Flatten(),
        )
        self.encoder = nn.Sequential(
            *features, *dense_layers(flat_size(features, self.input_shape), [120, embedding_dim], activation)
        )
        self.head = nn.Linear(embedding_dim, num_outputs)


class LeNet3(PartyModel):
    """LeNet as PraVFed Sec. V-A2 counts its layers: three convolutions, one pooling layer, three dense layers.

    The paper gives the counts only; the widths are LeNet-5's, whose C5 is its third convolution: ``Conv2d(6, 5) ->
    act -> Conv2d(16, 5) -> act -> pool -> Conv2d(120, 5) -> act -> Flatten -> Linear(84) -> act ->
    Linear(embedding_dim) -> act``, and the head ``Linear(embedding_dim, num_outputs)``. Every convolution is padded
    to keep the size and the one pooling halves only the axes longer than 1 pixel, as in `LeNet`, so 28x7 strips
    (and thinner) work.

    Args:
        input_shape: ``(channels, height, width)`` of one sample.
        embedding_dim: width of the embedding (the second dense layer).
        num_outputs: number of logits.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS`.

    Example:
        >>> import torch
        >>> model = LeNet3((1, 28, 7), embedding_dim=50, num_outputs=10)
        >>> model.head(model.encoder(torch.randn(4, 1, 28, 7))).shape
        torch.Size([4, 10])
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        activation: str = "relu",
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        in_channels, height, width = check_input_shape(input_shape, ndim=3, what="(channels, height, width)")
        make_activation(activation)  # fail before building anything
        features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=2),
            make_activation(activation),
            nn.Conv2d(6, 16, kernel_size=5, padding=2),
            make_activation(activation),
            nn.MaxPool2d(pool_kernel(height, width), ceil_mode=True),
            nn.Conv2d(16, 120, kernel_size=5, padding=2),
            make_activation(activation),
            nn.Flatten(),
        )
        self.encoder = nn.Sequential(
            *features, *dense_layers(flat_size(features, self.input_shape), [84, embedding_dim], activation)
        )
        self.head = nn.Linear(embedding_dim, num_outputs)
