"""Party models for tabular features with categorical columns: `TabularMLP`, `DeepFM` and `WideDeep`.

A party's features are one float tensor of shape ``(B, f)``. The datamodule describes the columns with
``categories``, one int per column: ``0`` for a numeric column (already standardized), ``c > 0`` for a categorical
column whose values are the integer codes ``0..c-1`` stored as floats (exact below ``2**24``). The protocol builds
the model as ``Model(input_shape, embedding_dim, num_outputs, categories=spec.categories)``.

In vertical FL each party holds only its own columns, so each party model owns the embedding tables of its own
categorical columns; nothing here is shared between parties.

The building blocks, used by all three models:

- `TabularColumns` checks a batch and splits it into the numeric values and the categorical codes;
- `ColumnEmbedding` concatenates the numeric values with one learned vector per categorical column (an MLP input);
- `FieldEmbedding` turns every column into a vector of one width (a "field", the unit of DeepFM and of linear
  models over one-hot columns);
- `fm_interaction` is the factorization machine's pairwise term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from lvfl.checks import check_int, check_real, is_int
from lvfl.models.base import (
    PartyModel,
    check_input_shape,
    check_positive_int,
    check_widths,
    dense_layers,
    make_activation,
    make_head,
)

__all__ = [
    "ColumnEmbedding",
    "DeepFM",
    "FieldEmbedding",
    "TabularColumns",
    "TabularMLP",
    "WideDeep",
    "check_categories",
    "fm_interaction",
]

MAX_CARDINALITY = 2**24
"""Largest cardinality whose codes are all exact in float32, the dtype the codes travel in."""


def check_categories(categories: Sequence[int], input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Return ``categories`` as a tuple with one cardinality per column (``0`` = numeric).

    An empty ``categories`` means every column is numeric. Otherwise it must have one entry per column of the
    one-axis ``input_shape``, each an integer in ``[0, 2**24]``.

    Raises:
        ValueError: naming ``categories`` and what is wrong with it.
    """
    try:
        cards = tuple(categories)
    except TypeError:
        raise ValueError(f"categories must be a sequence of integers, got categories={categories!r}") from None
    if any(not is_int(c) or not 0 <= c <= MAX_CARDINALITY for c in cards):
        raise ValueError(
            "categories must hold one integer per column, 0 for a numeric column or the number of codes "
            f"(at most 2**24) for a categorical one, got categories={categories!r}"
        )
    (columns,) = input_shape
    if not cards:
        return (0,) * columns
    if len(cards) != columns:
        raise ValueError(
            f"categories has {len(cards)} entries but input_shape={input_shape!r} has {columns} columns; "
            "give one cardinality per column"
        )
    return tuple(int(c) for c in cards)


def fm_interaction(fields: torch.Tensor) -> torch.Tensor:
    """The factorization machine's second-order term, per embedding coordinate.

    For fields ``e_1..e_F`` of shape ``(B, F, d)`` this is ``sum_{i<j} e_i * e_j`` (elementwise, shape ``(B, d)``),
    computed in ``O(F d)`` by the identity ``0.5 * ((sum_i e_i)**2 - sum_i e_i**2)`` (Rendle 2010, Lemma 3). Summed
    over the last axis it is the FM's ``sum_{i<j} <v_i, v_j> x_i x_j`` when ``e_i = v_i x_i``.
    """
    return 0.5 * (fields.sum(1).square() - fields.square().sum(1))


class TabularColumns(nn.Module):
    """Checks a ``(B, f)`` batch and splits it into numeric values ``(B, n)`` and categorical codes ``(B, k)``.

    The check is vectorized (one comparison per value and one device sync per batch): a code that is negative,
    not an integer, NaN or not below its column's cardinality raises a ValueError naming the column (in the
    party's own numbering), its cardinality, the row and the value; ``nn.Embedding`` would otherwise fail with an
    index error that names none of them, or on the GPU with a device-side assert.

    Holds no parameters; its index buffers are not saved in the state dict (they follow from ``categories``).
    """

    def __init__(self, categories: Sequence[int]) -> None:
        super().__init__()
        self.categories = tuple(categories)
        numeric = [j for j, c in enumerate(self.categories) if c == 0]
        categorical = [j for j, c in enumerate(self.categories) if c > 0]
        self.register_buffer("numeric_columns", torch.tensor(numeric, dtype=torch.long), persistent=False)
        self.register_buffer("categorical_columns", torch.tensor(categorical, dtype=torch.long), persistent=False)
        cards = [float(self.categories[j]) for j in categorical]
        self.register_buffer("cardinalities", torch.tensor(cards, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(numeric, codes)``: the numeric columns as given and the categorical ones as int64 codes."""
        width = len(self.categories)
        if x.ndim != 2 or x.shape[1] != width:
            raise ValueError(f"expected features of shape (batch, {width}), got {tuple(x.shape)}")
        numeric = x[:, self.numeric_columns]
        values = x[:, self.categorical_columns]
        if not values.numel():
            return numeric, values.long()
        bad = (values != values.floor()) | (values < 0) | (values >= self.cardinalities)
        if bad.any():
            row, k = (int(i) for i in bad.nonzero()[0])
            column, card = int(self.categorical_columns[k]), self.categories[int(self.categorical_columns[k])]
            raise ValueError(
                f"column {column} is categorical with cardinality {card}, so its values must be the integer codes "
                f"0..{card - 1}; got {float(values[row, k])!r} in row {row}"
            )
        return numeric, values.long()


class ColumnEmbedding(nn.Module):
    """The numeric values followed by one learned vector per categorical column: ``(B, n + sum(dims))``.

    The MLP input of `TabularMLP` and of `WideDeep`'s deep part: numeric columns enter as they are (as in the
    Wide & Deep paper, which concatenates continuous features with the embeddings), categorical column ``j`` as
    row ``code`` of its own ``nn.Embedding(c_j, dims[j])``. Tables keep PyTorch's ``N(0, 1)`` initialization, the
    same scale as a standardized numeric column.

    Args:
        categories: one cardinality per column, ``0`` for numeric (see `check_categories`).
        dims: the embedding width of each categorical column, in column order.

    Attributes:
        tables: one ``nn.Embedding`` per categorical column, in column order.
        width: the output width, ``n + sum(dims)``.
    """

    def __init__(self, categories: Sequence[int], dims: Sequence[int]) -> None:
        super().__init__()
        cards = [c for c in categories if c > 0]
        dims = list(dims)
        if len(dims) != len(cards):
            raise ValueError(f"dims must have one entry per categorical column ({len(cards)}), got dims={dims!r}")
        self.tables = nn.ModuleList(nn.Embedding(c, d) for c, d in zip(cards, dims, strict=True))
        self.width = (len(categories) - len(cards)) + sum(dims)

    def forward(self, numeric: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Concatenate ``numeric`` with the looked-up vector of every column of ``codes``."""
        return torch.cat([numeric, *(table(codes[:, k]) for k, table in enumerate(self.tables))], dim=1)


class FieldEmbedding(nn.Module):
    """Every column as a vector of one width, in column order: ``(B, f, dim)``.

    Numeric column ``j`` becomes ``x_j * v_j`` with a learned vector ``v_j``; categorical column ``j`` becomes row
    ``code`` of its own ``nn.Embedding(c_j, dim)``, which is ``V_j^T onehot(code)``. So the same module gives
    DeepFM's field embeddings (``dim = field_dim``) and, summed over the fields, a linear model over the numeric
    and one-hot categorical columns (``dim`` = its number of outputs) without materializing the one-hot vectors.

    Args:
        categories: one cardinality per column, ``0`` for numeric (see `check_categories`).
        dim: the width of every field vector.
        std: standard deviation of the normal initialization of every vector.

    Attributes:
        numeric_vectors: ``(n, dim)`` parameter, row ``i`` for the ``i``-th numeric column; None without any.
        tables: one ``nn.Embedding(c_j, dim)`` per categorical column, in column order.
    """

    def __init__(self, categories: Sequence[int], dim: int, std: float) -> None:
        super().__init__()
        numeric = [j for j, c in enumerate(categories) if c == 0]
        categorical = [j for j, c in enumerate(categories) if c > 0]
        self.numeric_vectors = nn.Parameter(torch.randn(len(numeric), dim) * std) if numeric else None
        self.tables = nn.ModuleList(nn.Embedding(categories[j], dim) for j in categorical)
        for table in self.tables:
            nn.init.normal_(table.weight, std=std)
        # concatenating numeric then categorical fields puts column j at position rank[j]; undo that
        rank = torch.argsort(torch.tensor(numeric + categorical, dtype=torch.long))
        self.register_buffer("column_order", rank, persistent=False)

    def forward(self, numeric: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Return the ``(B, f, dim)`` field vectors of a batch split by `TabularColumns`."""
        fields = []
        if self.numeric_vectors is not None:
            fields.append(numeric.unsqueeze(-1) * self.numeric_vectors)  # (B, n, dim)
        if len(self.tables):
            fields.append(torch.stack([table(codes[:, k]) for k, table in enumerate(self.tables)], dim=1))
        return torch.cat(fields, dim=1)[:, self.column_order]


def _check_common(
    input_shape: tuple[int, ...],
    categories: Sequence[int],
    hidden: Sequence[int],
    head_hidden: Sequence[int],
    activation: str,
    dropout: float,
) -> tuple[tuple[int, ...], list[int], list[int], float]:
    """Validate the options all three models share, before anything is built."""
    shape = check_input_shape(input_shape, 1, "(columns,)")
    cards = check_categories(categories, shape)
    hidden = check_widths("hidden", hidden)
    head_hidden = check_widths("head_hidden", head_hidden)
    make_activation(activation)
    dropout = check_real(dropout, "dropout", 0.0, 1.0, open_high=True)
    return cards, hidden, head_hidden, dropout


class TabularMLPEncoder(nn.Module):
    """`TabularMLP`'s encoder: `ColumnEmbedding`, hidden layers, then ``Linear(embedding_dim) -> act``."""

    def __init__(
        self,
        categories: tuple[int, ...],
        category_dims: Sequence[int],
        embedding_dim: int,
        hidden: Sequence[int],
        activation: str,
        dropout: float,
    ) -> None:
        super().__init__()
        self.columns = TabularColumns(categories)
        self.embedding = ColumnEmbedding(categories, category_dims)
        width = self.embedding.width
        self.layers = nn.Sequential(
            *dense_layers(width, hidden, activation, dropout),
            nn.Linear(hidden[-1] if hidden else width, embedding_dim),
            make_activation(activation),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, f)`` features to ``(B, embedding_dim)``."""
        return self.layers(self.embedding(*self.columns(x)))


class TabularMLP(PartyModel):
    """An MLP over the numeric columns and one learned embedding per categorical column.

    Categorical column ``j`` with ``c_j`` codes gets its own ``nn.Embedding(c_j, min(category_dim, c_j))``: ``c_j``
    points never need more than ``c_j`` dimensions (their affine span has ``c_j - 1``), so the first Linear layer
    over the embedding is as expressive as over the one-hot vector, and binary columns stay cheap, while
    ``category_dim`` caps the width of wide columns. The embeddings are concatenated after the numeric columns and
    go through the same layers as `lvfl.models.MLP`; with no categorical column the model has MLP's parameters.

    Args:
        input_shape: ``(f,)``, the number of the party's columns.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        categories: one cardinality per column, ``0`` for numeric; empty if every column is numeric.
        category_dim: the largest embedding width of a categorical column.
        hidden: widths of the encoder's hidden layers before the embedding layer; empty for a single layer.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS`.
        dropout: dropout probability after every hidden layer (not after the embedding), in ``[0, 1)``.

    Example:
        >>> import torch
        >>> model = TabularMLP((3,), embedding_dim=8, num_outputs=2, categories=(0, 4, 2))
        >>> model(torch.tensor([[0.5, 3.0, 1.0], [-1.2, 0.0, 0.0]])).shape
        torch.Size([2, 2])
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        categories: Sequence[int] = (),
        category_dim: int = 8,
        hidden: Sequence[int] = (64,),
        head_hidden: Sequence[int] = (),
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        cards, hidden, head_hidden, dropout = _check_common(
            self.input_shape, categories, hidden, head_hidden, activation, dropout
        )
        category_dim = check_int(category_dim, "category_dim", 1)
        self.categories = cards
        dims = [min(category_dim, c) for c in cards if c > 0]
        self.encoder = TabularMLPEncoder(cards, dims, embedding_dim, hidden, activation, dropout)
        self.head = make_head(embedding_dim, head_hidden, num_outputs, activation, dropout)


class DeepFMEncoder(nn.Module):
    """`DeepFM`'s encoder; `fm_terms` exposes the factorization machine's two terms."""

    def __init__(
        self,
        categories: tuple[int, ...],
        field_dim: int,
        embedding_dim: int,
        hidden: Sequence[int],
        activation: str,
        dropout: float,
    ) -> None:
        super().__init__()
        num_fields = len(categories)
        self.columns = TabularColumns(categories)
        # field vectors of norm about 1; the first-order sum over F fields starts with variance about 1
        self.fields = FieldEmbedding(categories, field_dim, std=field_dim**-0.5)
        self.first_order = FieldEmbedding(categories, 1, std=num_fields**-0.5)
        width = num_fields * field_dim
        self.deep = nn.Sequential(*dense_layers(width, hidden, activation, dropout))
        self.out = nn.Linear(1 + field_dim + (hidden[-1] if hidden else width), embedding_dim)
        self.activation = make_activation(activation)

    def fm_terms(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return the FM's first-order sum ``(B, 1)``, its interaction vector ``(B, field_dim)`` and the fields.

        The interaction vector summed over its last axis is the FM's ``sum_{i<j} <v_i, v_j> x_i x_j``; the fields
        ``(B, f, field_dim)`` are the shared embeddings the deep part reads.
        """
        numeric, codes = self.columns(x)
        fields = self.fields(numeric, codes)
        first = self.first_order(numeric, codes).sum(1)
        return first, fm_interaction(fields), fields

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, f)`` features to ``(B, embedding_dim)``."""
        first, second, fields = self.fm_terms(x)
        deep = self.deep(fields.flatten(1))
        return self.activation(self.out(torch.cat([first, second, deep], dim=1)))


class FieldModel(PartyModel):
    """What DeepFM and Wide&Deep share: the options, their checks and the head; `encoder_class` is the difference.

    One `__init__` for both keeps their config options (jsonargparse reads this signature) identical by construction.
    """

    encoder_class: ClassVar[type[nn.Module]]

    def __init__(
        self,
        input_shape: tuple[int, ...],
        embedding_dim: int,
        num_outputs: int,
        categories: Sequence[int] = (),
        field_dim: int = 16,
        hidden: Sequence[int] = (256, 128),
        head_hidden: Sequence[int] = (),
        activation: str = "relu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__(input_shape, embedding_dim, num_outputs)
        cards, hidden, head_hidden, dropout = _check_common(
            self.input_shape, categories, hidden, head_hidden, activation, dropout
        )
        field_dim = check_positive_int("field_dim", field_dim)
        self.categories = cards
        self.encoder = self.encoder_class(cards, field_dim, embedding_dim, hidden, activation, dropout)
        self.head = make_head(embedding_dim, head_hidden, num_outputs, activation, dropout)


class DeepFM(FieldModel):
    """DeepFM (Guo et al. 2017) as a party's bottom model: a factorization machine and an MLP on shared fields.

    Every column is a field of width ``field_dim`` (`FieldEmbedding`: numeric ``x_j * v_j``, categorical
    ``V_j[code]``). The FM component is the first-order sum ``sum_j w_j x_j`` (its own width-1 fields) plus the
    pairwise interactions ``sum_{i<j} <v_i, v_j> x_i x_j``, computed by `fm_interaction`; the deep component is an
    MLP over the concatenated fields. Both read the same field embeddings, as in the paper.

    From a scalar to a party embedding: the paper's output is ``sigmoid(y_FM + y_DNN)`` with ``y_FM`` the first-order
    sum plus the interaction vector summed over its ``field_dim`` coordinates and ``y_DNN`` a linear function of the
    last hidden layer. That sum is one fixed linear function of ``[first-order, interaction vector, last hidden
    layer]``. In split (vertical) learning the party does not predict; it hands an embedding to the head, which sees
    the aggregate of all parties' embeddings. So the encoder keeps the terms apart and maps their concatenation
    through a learned ``Linear(1 + field_dim + hidden[-1], embedding_dim)`` and the activation: the paper's logit is
    one direction that layer can learn, and the head (top model) takes the place of the final sigmoid, so it can
    also combine this party's FM terms with other parties' features.

    The default ``hidden=(256, 128)`` is smaller than the paper's 400-400-400: that was sized for Criteo's 39 fields,
    while a party holds only its share of a table's columns and hands on a small embedding.

    Args:
        input_shape: ``(f,)``, the number of the party's columns.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        categories: one cardinality per column, ``0`` for numeric; empty if every column is numeric.
        field_dim: width of every field embedding (the FM's factor size ``k``).
        hidden: widths of the deep component's hidden layers; empty to pass the fields straight to the output.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS` (the paper uses ReLU).
        dropout: dropout probability after every hidden layer (not after the embedding), in ``[0, 1)``.

    Example:
        >>> import torch
        >>> model = DeepFM((3,), embedding_dim=8, num_outputs=2, categories=(0, 4, 2), hidden=[16])
        >>> model(torch.tensor([[0.5, 3.0, 1.0], [-1.2, 0.0, 0.0]])).shape
        torch.Size([2, 2])
    """

    encoder_class = DeepFMEncoder


class WideDeepEncoder(nn.Module):
    """`WideDeep`'s encoder: ``act(wide(x) + deep(x))``, both of width ``embedding_dim``."""

    def __init__(
        self,
        categories: tuple[int, ...],
        field_dim: int,
        embedding_dim: int,
        hidden: Sequence[int],
        activation: str,
        dropout: float,
    ) -> None:
        super().__init__()
        self.columns = TabularColumns(categories)
        # a linear model over numeric + one-hot columns, initialized like nn.Linear with one input per column
        self.wide = FieldEmbedding(categories, embedding_dim, std=len(categories) ** -0.5)
        self.deep_embedding = ColumnEmbedding(categories, [field_dim for c in categories if c > 0])
        width = self.deep_embedding.width
        self.deep = nn.Sequential(
            *dense_layers(width, hidden, activation, dropout), nn.Linear(hidden[-1] if hidden else width, embedding_dim)
        )
        self.activation = make_activation(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, f)`` features to ``(B, embedding_dim)``."""
        numeric, codes = self.columns(x)
        wide = self.wide(numeric, codes).sum(1)
        deep = self.deep(self.deep_embedding(numeric, codes))
        return self.activation(wide + deep)


class WideDeep(FieldModel):
    """Wide & Deep (Cheng et al. 2016) as a party's bottom model: a linear model plus an MLP over embeddings.

    The wide part is a linear model over the numeric columns and the one-hot categorical columns, with one output
    per embedding unit: per-column ``nn.Embedding(c_j, embedding_dim)`` rows and ``x_j * w_j`` for numeric
    columns, summed (`FieldEmbedding` summed over fields), so the one-hot vectors are never built. The deep part
    concatenates the numeric columns with a ``field_dim`` embedding per categorical column and runs an MLP ending in
    ``Linear(embedding_dim)``, whose bias is the model's only bias. The embedding is ``act(wide + deep)``: the
    paper's joint logit ``w_wide^T x + w_deep^T a + b`` computed per embedding unit, so both parts train jointly
    and the head (top model) replaces the paper's sigmoid. The paper's hand-made cross-product features are not
    built; give them as extra categorical columns, or use `DeepFM` to learn pairwise interactions.

    Args:
        input_shape: ``(f,)``, the number of the party's columns.
        embedding_dim: width of the embedding.
        num_outputs: number of logits.
        categories: one cardinality per column, ``0`` for numeric; empty if every column is numeric.
        field_dim: width of each categorical column's embedding in the deep part.
        hidden: widths of the deep part's hidden layers; empty for a linear deep part.
        head_hidden: widths of the head's hidden layers; empty for a linear head.
        activation: name of the nonlinearity, one of `lvfl.models.base.ACTIVATIONS`.
        dropout: dropout probability after every hidden layer (not after the embedding), in ``[0, 1)``.

    Example:
        >>> import torch
        >>> model = WideDeep((3,), embedding_dim=8, num_outputs=2, categories=(0, 4, 2), hidden=[16])
        >>> model(torch.tensor([[0.5, 3.0, 1.0], [-1.2, 0.0, 0.0]])).shape
        torch.Size([2, 2])
    """

    encoder_class = WideDeepEncoder
