"""Multilayer perceptron party model, for tabular features (and any other shape, flattened)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from lvfl.models.base import PartyModel, check_widths, dense_layers, make_activation, make_head


class MLP(PartyModel):
    """Fully connected encoder and head.

    The encoder is ``Flatten -> [Linear -> act -> Dropout] * len(hidden) -> Linear(embedding_dim) -> act``, with
    ``-> Dropout(embedding_dropout)`` last when that is set (PraVFed's MLP: dim_in -> 50 -> dropout -> classes). The
    activation after the embedding layer makes the embedding a hidden representation, as in split-learning bottom
    models, so that the head (which sees the average of all parties' embeddings) starts from a nonlinear feature.
    The head is ``[Linear -> act -> Dropout] * len(head_hidden) -> Linear(num_outputs)`` and returns logits.

    Args:
        input_shape: shape of one sample; flattened, so ``(13,)`` and ``(1, 8, 2)`` both work.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        hidden: widths of the encoder's hidden layers before the embedding layer; empty for a single layer.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS`.
        dropout: dropout probability after every hidden layer (not after the embedding), in ``[0, 1)``.
        embedding_dropout: dropout probability after the embedding layer's activation, in ``[0, 1)``; 0 adds none.

    Example:
        >>> import torch
        >>> model = MLP((13,), embedding_dim=8, num_outputs=3, hidden=[32])
        >>> model.head(model.encoder(torch.randn(4, 13))).shape
        torch.Size([4, 3])
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        hidden: Sequence[int] = (64,),
        head_hidden: Sequence[int] = (),
        activation: str = "relu",
        dropout: float = 0.0,
        embedding_dropout: float = 0.0,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        hidden = check_widths("hidden", hidden)
        head_hidden = check_widths("head_hidden", head_hidden)
        make_activation(activation)  # fail before building anything
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got dropout={dropout!r}")
        if not 0.0 <= embedding_dropout < 1.0:
            raise ValueError(f"embedding_dropout must be in [0, 1), got embedding_dropout={embedding_dropout!r}")

        width = math.prod(self.input_shape)
        self.encoder = nn.Sequential(
            nn.Flatten(),
            *dense_layers(width, hidden, activation, dropout),
            nn.Linear(hidden[-1] if hidden else width, embedding_dim),
            make_activation(activation),
            *([nn.Dropout(embedding_dropout)] if embedding_dropout > 0 else []),
        )
        self.head = make_head(embedding_dim, head_hidden, num_outputs, activation, dropout)
