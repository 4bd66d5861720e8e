"""Tabular party models with categorical columns: shapes, the split, the FM and wide terms, code checks, training."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from lvfl.models import MLP, PartyModel
from lvfl.models.tabular import DeepFM, TabularMLP, WideDeep, fm_interaction

MODELS = [TabularMLP, DeepFM, WideDeep]
SMALL = {"hidden": [16]}  # keeps DeepFM and WideDeep (default 256-128) fast

LAYOUTS = {
    "mixed": (0, 5, 0, 2, 3),
    "numeric": (0, 0, 0, 0),
    "implicit-numeric": (),
    "categorical": (4, 2, 7),
    "one-column": (3,),
}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def make_batch(categories: tuple[int, ...], rows: int, columns: int | None = None) -> torch.Tensor:
    """Standard normal numeric columns and codes cycling through every category, as float32."""
    columns = len(categories) if categories else columns
    x = torch.randn(rows, columns)
    for j, c in enumerate(categories):
        if c:
            x[:, j] = torch.randperm(rows) % c
    return x


def build(cls: type[PartyModel], categories: tuple[int, ...], embedding_dim: int = 6, **kwargs) -> PartyModel:
    columns = len(categories) or 4
    return cls((columns,), embedding_dim, 3, categories=categories, **{**SMALL, **kwargs})


CASES = [(cls, name) for cls in MODELS for name in LAYOUTS]
CUSTOM = {"hidden": [], "head_hidden": [8], "activation": "tanh", "dropout": 0.25}


@pytest.mark.parametrize(("cls", "layout"), CASES, ids=[f"{c.__name__}-{n}" for c, n in CASES])
@pytest.mark.parametrize("custom", [False, True], ids=["default", "custom"])
def test_shapes_and_split(cls: type[PartyModel], layout: str, custom: bool) -> None:
    categories = LAYOUTS[layout]
    model = build(cls, categories, **(CUSTOM if custom else {})).eval()  # eval: dropout off
    x = make_batch(categories, 10, columns=4)

    embedding = model.encoder(x)
    logits = model.head(embedding)

    assert embedding.shape == (10, 6)
    assert logits.shape == (10, 3)
    torch.testing.assert_close(model(x), logits)
    assert model.categories == (categories or (0, 0, 0, 0))


@pytest.mark.parametrize(("cls", "layout"), CASES, ids=[f"{c.__name__}-{n}" for c, n in CASES])
def test_encoder_and_head_partition_parameters(cls: type[PartyModel], layout: str) -> None:
    model = build(cls, LAYOUTS[layout], head_hidden=[5])
    encoder = {id(p) for p in model.encoder.parameters()}
    head = {id(p) for p in model.head.parameters()}
    assert encoder
    assert head
    assert not encoder & head
    assert encoder | head == {id(p) for p in model.parameters()}
    assert {name for name, _ in model.named_children()} == {"encoder", "head"}
    assert not dict(model.named_buffers(remove_duplicate=False)).keys() & model.state_dict().keys()


@pytest.mark.parametrize(("cls", "layout"), CASES, ids=[f"{c.__name__}-{n}" for c, n in CASES])
def test_gradients_reach_every_parameter(cls: type[PartyModel], layout: str) -> None:
    categories = LAYOUTS[layout]
    model = build(cls, categories)
    x = make_batch(categories, 14, columns=4)  # 14 rows hold every code of every column
    model(x).square().sum().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    assert len(tables) == {TabularMLP: 1, DeepFM: 2, WideDeep: 2}[cls] * sum(c > 0 for c in categories)
    for table in tables:  # every code occurs in the batch, so every row of every table gets a gradient
        assert (table.weight.grad.abs().sum(1) > 0).all()


def test_tabular_mlp_embedding_widths() -> None:
    """``min(category_dim, c)`` per categorical column, concatenated after the numeric columns."""
    model = TabularMLP((4,), 5, 2, categories=(0, 3, 20, 0), category_dim=8, hidden=[7])
    widths = [(t.num_embeddings, t.embedding_dim) for t in model.encoder.embedding.tables]
    assert widths == [(3, 3), (20, 8)]
    linears = [(m.in_features, m.out_features) for m in model.encoder.modules() if isinstance(m, nn.Linear)]
    assert linears == [(2 + 3 + 8, 7), (7, 5)]
    assert isinstance(model.encoder.layers[-1], nn.ReLU)


@pytest.mark.parametrize("categories", [(), (0, 0, 0)])
def test_tabular_mlp_without_categories_has_mlp_parameters(categories: tuple[int, ...]) -> None:
    kwargs = {"hidden": [9, 7], "head_hidden": [4]}
    tabular = TabularMLP((3,), 5, 2, categories=categories, **kwargs)
    mlp = MLP((3,), 5, 2, **kwargs)
    assert [p.shape for p in tabular.parameters()] == [p.shape for p in mlp.parameters()]
    with torch.no_grad():
        for mine, theirs in zip(tabular.parameters(), mlp.parameters(), strict=True):
            theirs.copy_(mine)
    x = torch.randn(6, 3)
    torch.testing.assert_close(tabular(x), mlp(x))


def reference_fields(fields: nn.Module, categories: tuple[int, ...], x: torch.Tensor) -> torch.Tensor:
    """Each column's field vector, one sample and one column at a time, from the module's raw weights."""
    numeric = iter(fields.numeric_vectors.double()) if fields.numeric_vectors is not None else iter(())
    tables = iter(fields.tables)
    per_column = []
    for j, c in enumerate(categories):
        if c:
            weight = next(tables).weight.double()
            per_column.append(torch.stack([weight[int(value)] for value in x[:, j]]))
        else:
            vector = next(numeric)
            per_column.append(torch.stack([float(value) * vector for value in x[:, j]]))
    return torch.stack(per_column, dim=1)  # (B, f, d)


@pytest.mark.parametrize("categories", [(0, 5, 0, 2, 3), (0, 0, 0), (4, 6), (3,)])
def test_deepfm_terms_match_brute_force(categories: tuple[int, ...]) -> None:
    model = DeepFM((len(categories),), 6, 2, categories=categories, field_dim=4, hidden=[8])
    x = make_batch(categories, 12)

    with torch.no_grad():
        first, second, fields = model.encoder.fm_terms(x)
        v = reference_fields(model.encoder.fields, categories, x)
        w = reference_fields(model.encoder.first_order, categories, x)

    pairs = list(itertools.combinations(range(len(categories)), 2))
    interaction = sum((v[:, i] * v[:, j] for i, j in pairs), torch.zeros(12, 4, dtype=torch.float64))
    scalar = torch.tensor([sum(float(v[b, i] @ v[b, j]) for i, j in pairs) for b in range(12)], dtype=torch.float64)
    torch.testing.assert_close(fields.double(), v)  # the deep part reads these same fields
    torch.testing.assert_close(second.double(), interaction, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second.sum(1).double(), scalar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.double(), w.sum(1), atol=1e-6, rtol=1e-6)
    assert first.shape == (12, 1)


def test_fm_interaction_of_one_field_is_zero() -> None:
    assert torch.equal(fm_interaction(torch.randn(3, 1, 5)), torch.zeros(3, 5))


def test_deepfm_output_layer_reads_first_second_and_deep() -> None:
    model = DeepFM((3,), 6, 2, categories=(0, 4, 0), field_dim=5, hidden=[8, 7])
    assert (model.encoder.out.in_features, model.encoder.out.out_features) == (1 + 5 + 7, 6)
    assert model.encoder.deep[0].in_features == 3 * 5
    no_deep = DeepFM((3,), 6, 2, categories=(0, 4, 0), field_dim=5, hidden=[])
    assert no_deep.encoder.out.in_features == 1 + 5 + 3 * 5


def test_widedeep_wide_part_is_a_linear_model_over_one_hot_columns() -> None:
    categories = (0, 5, 0, 2)
    model = WideDeep((4,), 6, 2, categories=categories, hidden=[8])
    x = make_batch(categories, 10)
    wide = model.encoder.wide
    # the independent reference: materialize [numeric columns, one-hot codes] and one weight matrix
    inputs = torch.cat([x[:, [0, 2]], F.one_hot(x[:, 1].long(), 5), F.one_hot(x[:, 3].long(), 2)], dim=1)
    weights = torch.cat([wide.numeric_vectors, wide.tables[0].weight, wide.tables[1].weight])
    with torch.no_grad():
        numeric, codes = model.encoder.columns(x)
        torch.testing.assert_close(wide(numeric, codes).sum(1), inputs @ weights)
    deep_widths = [t.embedding_dim for t in model.encoder.deep_embedding.tables]
    assert deep_widths == [16, 16]
    assert model.encoder.deep[0].in_features == 2 + 16 + 16


CODE_ERRORS = [(5.0, 1, 5, "5.0"), (1.5, 3, 2, "1.5"), (-1.0, 4, 3, "-1.0"), (float("nan"), 1, 5, "nan")]


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize(
    ("value", "column", "cardinality", "shown"), CODE_ERRORS, ids=["too-large", "fraction", "negative", "nan"]
)
def test_bad_codes_raise_naming_column_and_cardinality(
    cls: type[PartyModel], value: float, column: int, cardinality: int, shown: str
) -> None:
    categories = (0, 5, 0, 2, 3)
    model = build(cls, categories)
    x = make_batch(categories, 4)
    x[1, column] = value
    x[3, column] = value  # only the first bad value is reported
    message = (
        f"column {column} is categorical with cardinality {cardinality}, so its values must be the integer codes "
        f"0..{cardinality - 1}; got {shown} in row 1"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model(x)


@pytest.mark.parametrize("cls", MODELS)
def test_wrong_width_at_forward_raises(cls: type[PartyModel]) -> None:
    model = build(cls, (0, 3, 0))
    with pytest.raises(ValueError, match=r"^expected features of shape \(batch, 3\), got \(2, 4\)$"):
        model(torch.zeros(2, 4))


BAD_ARGUMENTS = [
    (
        {"categories": (0, 3, 2)},
        r"^categories has 3 entries but input_shape=\(4,\) has 4 columns; give one cardinality per column$",
    ),
    ({"categories": (0, -3, 2, 0)}, r"categories must hold one integer per column.*got categories=\(0, -3, 2, 0\)$"),
    ({"categories": (0, 2.0, 2, 0)}, r"got categories=\(0, 2.0, 2, 0\)$"),
    ({"categories": (0, 2**24 + 1, 2, 0)}, r"at most 2\*\*24"),
    ({"hidden": [8, 0]}, r"hidden=\[8, 0\]"),
    ({"head_hidden": [-1]}, r"head_hidden=\[-1\]"),
    ({"dropout": 1.0}, r"^dropout must be a finite number in \[0, 1\), got 1.0$"),
    ({"dropout": -0.1}, r"^dropout must be a finite number in \[0, 1\), got -0.1$"),
    ({"activation": "swish"}, "unknown activation='swish'"),
]
PER_MODEL = [
    (TabularMLP, {"category_dim": 0}, "^category_dim must be an int >= 1, got 0$"),
    (DeepFM, {"field_dim": 0}, "^field_dim must be an int >= 1, got 0$"),
    (WideDeep, {"field_dim": 2.5}, "^field_dim must be an int >= 1, got 2.5$"),
]
ARGUMENT_CASES = [(cls, kw, msg) for cls in MODELS for kw, msg in BAD_ARGUMENTS] + PER_MODEL


@pytest.mark.parametrize(("cls", "kwargs", "message"), ARGUMENT_CASES)
def test_bad_arguments_raise(cls: type[PartyModel], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls((4,), 6, 2, **{"categories": (0, 3, 2, 0), **kwargs})


@pytest.mark.parametrize("cls", MODELS)
def test_input_shape_must_have_one_axis(cls: type[PartyModel]) -> None:
    with pytest.raises(ValueError, match=r"^input_shape must have 1 axes \(columns,\), got input_shape=\(2, 3\)$"):
        cls((2, 3), 6, 2)


def categorical_task(rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The label is whether column 1 (6 codes) holds 0, 2 or 5; columns 0 and 3 are noise, column 2 a noise code.

    The positive codes are not an interval, so a model reading the raw code as a number cannot separate them.
    """
    x = torch.randn(rows, 4, generator=generator)
    x[:, 1] = torch.randint(0, 6, (rows,), generator=generator)
    x[:, 2] = torch.randint(0, 3, (rows,), generator=generator)
    y = ((x[:, 1] == 0) | (x[:, 1] == 2) | (x[:, 1] == 5)).long()
    return x, y


@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("shuffled", [False, True], ids=["signal", "shuffled-labels"])
def test_learns_a_function_of_a_categorical_column(cls: type[PartyModel], shuffled: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    x, y = categorical_task(512, generator)
    x_test, y_test = categorical_task(1024, generator)
    if shuffled:  # the control: the same training with labels independent of the features stays at chance
        y = y[torch.randperm(len(y), generator=generator)]
    model = cls((4,), 8, 2, categories=(0, 6, 3, 0), hidden=[32])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if shuffled:
        assert 0.35 <= accuracy <= 0.65
    else:
        assert accuracy >= 0.95  # chance is 0.5
