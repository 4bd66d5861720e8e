"""`LogisticRegression`: the linear student of the non-overlap paper, built like every party model."""

from __future__ import annotations

import math

from torch import nn

from lvfl.models.base import PartyModel

__all__ = ["LogisticRegression"]


class LogisticRegression(PartyModel):
    """A linear student: `head = Linear(input_width, num_outputs)` on the flattened features, softmax on top.

    The encoder is only `Flatten`, so `embedding_dim` is ignored (the attribute holds the input width instead);
    the argument is kept so that it builds like every party model, `LogisticRegression(input_shape, dim, classes)`.
    Under the Paillier path the whole model is the last linear layer, so it learns exactly the plain objective.
    """

    def __init__(self, input_shape: tuple[int, ...], embedding_dim: int, num_outputs: int) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        width = math.prod(self.input_shape)
        self.embedding_dim = width
        self.encoder = nn.Flatten()
        self.head = nn.Linear(width, num_outputs)
