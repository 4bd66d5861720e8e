"""The party model interface: an encoder (embedding network h) followed by a head (prediction network p).

Every party model is built by one call, ``Model(input_shape, embedding_dim, num_outputs, **hyperparameters)``:

- ``input_shape`` (``tuple[int, ...]``): the shape of one sample of the party's features, without the batch axis;
- ``embedding_dim`` (``int``): the width of the encoder's output, the same for every party of one run, because the
  EASTER protocol applies each party's head to the *average* of all parties' embeddings;
- ``num_outputs`` (``int``): the number of logits the head returns;
- model hyperparameters after these three, each with a type hint and a default.

The first three are positional and in this order so that a YAML config can name a model class with its
hyperparameters only (jsonargparse ``class_path`` + ``init_args`` for a `PartyModelFactory`), and the protocol
completes the call once the datamodule has told it each party's input shape and the number of classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from lvfl.checks import check_int, is_int

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
}
"""Activation names accepted by the models' ``activation`` option; a name keeps configs free of class paths."""


class PartyModel(nn.Module):
    """One party's network, split into an ``encoder`` (features -> embedding) and a ``head`` (embedding -> logits).

    Protocols call the two halves separately (the head sees the aggregated embedding, not the party's own), so
    subclasses must put every parameter in exactly one of them; ``forward`` is only the local, unsplit model.

    Subclasses call ``super().__init__(input_shape, embedding_dim, num_outputs)`` first, which validates and stores
    the three shared arguments, then assign ``self.encoder`` and ``self.head``.

    Attributes:
        input_shape: shape of one sample of the party's features (no batch axis).
        embedding_dim: width of the encoder's output.
        num_outputs: number of logits the head returns.
        encoder: maps a batch of shape ``(B, *input_shape)`` to ``(B, embedding_dim)``.
        head: maps ``(B, embedding_dim)`` to ``(B, num_outputs)``.
    """

    encoder: nn.Module
    head: nn.Module

    def __init__(self, input_shape: tuple[int, ...], embedding_dim: int, num_outputs: int) -> None:
        super().__init__()
        self.input_shape = check_input_shape(input_shape)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.num_outputs = check_positive_int("num_outputs", num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the party's model on its own features alone: ``head(encoder(x))``."""
        return self.head(self.encoder(x))


PartyModelFactory = Callable[[tuple[int, ...], int, int], PartyModel]
"""Builds a party model from ``(input_shape, embedding_dim, num_outputs)``; a `PartyModel` class is one.

In a config, give the class path and its hyperparameters; jsonargparse returns a callable that takes the first three
arguments positionally::

    party_model:
      class_path: lvfl.models.MLP
      init_args:
        hidden: [32]

A bare class path (``party_model: lvfl.models.LeNet``) or short name (``CNN``) uses the defaults. A plain function
with this signature is accepted only as a bare path: jsonargparse rejects ``init_args`` for it, so new models with
hyperparameters should be `PartyModel` subclasses.
"""


def check_positive_int(name: str, value: int) -> int:
    """Return ``value`` if it is an integer >= 1, else raise a ValueError naming the option."""
    return check_int(value, name, 1)


def check_input_shape(input_shape: Sequence[int], ndim: int | None = None, what: str = "") -> tuple[int, ...]:
    """Return ``input_shape`` as a tuple after checking it has positive sizes (and ``ndim`` axes, if given).

    Args:
        input_shape: shape of one sample, without the batch axis; a list (as YAML gives) is accepted.
        ndim: the number of axes the model needs, or None for any number >= 1.
        what: how the model names the expected layout in the error, e.g. ``"(channels, height, width)"``.
    """
    try:
        shape = tuple(input_shape)
    except TypeError:
        raise ValueError(f"input_shape must be a tuple of integers, got input_shape={input_shape!r}") from None
    if not shape or any(not is_int(d) or d < 1 for d in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of integers >= 1, got input_shape={input_shape!r}")
    if ndim is not None and len(shape) != ndim:
        layout = f" {what}" if what else ""
        raise ValueError(f"input_shape must have {ndim} axes{layout}, got input_shape={shape!r}")
    return shape


def check_widths(name: str, widths: Sequence[int]) -> list[int]:
    """Return a list of layer widths after checking each is an integer >= 1."""
    widths = list(widths)
    if any(not is_int(w) or w < 1 for w in widths):
        raise ValueError(f"{name} must be a list of integers >= 1, got {name}={widths!r}")
    return widths


def make_activation(name: str) -> nn.Module:
    """Build the activation module called ``name`` (see `ACTIVATIONS`), or raise listing the allowed names."""
    try:
        return ACTIVATIONS[name]()
    except (KeyError, TypeError):
        allowed = ", ".join(sorted(ACTIVATIONS))
        raise ValueError(f"unknown activation={name!r}; allowed: {allowed}") from None


def dense_layers(width: int, widths: Sequence[int], activation: str, dropout: float = 0.0) -> list[nn.Module]:
    """Hidden fully connected layers, ``[Linear -> act -> Dropout] * len(widths)``, starting from ``width`` inputs.

    Dropout is left out when ``dropout == 0`` so that printed models show only what runs.
    """
    layers: list[nn.Module] = []
    for out in widths:
        layers += [nn.Linear(width, out), make_activation(activation)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = out
    return layers


def make_head(
    embedding_dim: int, head_hidden: Sequence[int], num_outputs: int, activation: str = "relu", dropout: float = 0.0
) -> nn.Sequential:
    """The prediction network p: optional hidden layers, then a Linear layer to ``num_outputs`` logits."""
    head_hidden = list(head_hidden)
    width = head_hidden[-1] if head_hidden else embedding_dim
    return nn.Sequential(*dense_layers(embedding_dim, head_hidden, activation, dropout), nn.Linear(width, num_outputs))


def pool_kernel(height: int, width: int) -> tuple[int, int]:
    """Halve each spatial axis longer than 1 and leave the others alone.

    Vertical splits give parties narrow strips such as 8x1 pixels; pooling only the axes that can shrink keeps the
    height reduction on those strips while a 1-pixel-wide axis never pools to zero.
    """
    return (2 if height > 1 else 1, 2 if width > 1 else 1)


def flat_size(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Number of values ``features`` returns per sample, found by running it once on a zero sample.

    A dry run rather than arithmetic on kernel sizes keeps the Linear layer after a conv stack right for any
    padding and pooling rule.
    """
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).numel())
