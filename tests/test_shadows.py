"""Shadow tensors: a replayed operator gives what the meta kernel gives (dtype, shape, strides, requires_grad),
gradients flow through replays with the right shapes, and mixing with a real tensor raises every time."""

from __future__ import annotations

import pytest
import torch

from lvfl.shadows import Shadow, _ShapeOnly, as_shadow, empty_shadow
from lvfl.wire import is_shadow, shadow

OPERATIONS = {
    "sub detach": lambda a, b: a - a.detach(),
    "div scalar": lambda a, b: a / 4,
    "add": lambda a, b: a + b,
    "matmul": lambda a, b: a @ b.t(),
    "transpose (strides)": lambda a, b: a.t(),
    "sum": lambda a, b: a.sum(),
    "softmax": lambda a, b: a.softmax(-1),
    "cat": lambda a, b: torch.cat([a, b], dim=0),
    "stack": lambda a, b: torch.stack([a, b]),
    "argmax (no gradient)": lambda a, b: a.argmax(-1),
    "to double": lambda a, b: a.to(torch.float64),
    "index": lambda a, b: a[1:3],
    "float compare": lambda a, b: a > 0,
}


def meta_pair(requires_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.empty(5, 3, device="meta", requires_grad=requires_grad)
    return a, torch.empty(5, 3, device="meta")


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", list(OPERATIONS))
def test_a_replay_matches_the_meta_kernel(name: str, requires_grad: bool) -> None:
    op = OPERATIONS[name]
    reference = op(*meta_pair(requires_grad))  # plain meta tensors: torch's own kernels, the reference
    for _ in range(3):  # the first call runs the kernel, the next ones replay it
        a, b = meta_pair(requires_grad)
        out = op(as_shadow(a), as_shadow(b))
        assert type(out) is Shadow
        assert out.device.type == "meta"
        assert (out.dtype, out.shape, out.stride()) == (reference.dtype, reference.shape, reference.stride())
        assert out.requires_grad == reference.requires_grad


def test_replays_are_in_the_autograd_graph_with_the_right_shapes() -> None:
    for round_ in range(3):
        x = empty_shadow((4, 6), requires_grad=True)
        e = empty_shadow((4, 6))
        loss = (e + (x - x.detach()) / 3).softmax(-1).sum() * 0
        (grad,) = torch.autograd.grad(loss, x)
        assert grad.shape == x.shape
        assert grad.dtype == x.dtype
        if round_:  # replayed: no meta kernel ran for these operators
            assert type(loss.grad_fn.next_functions[0][0]).__name__ == f"{_ShapeOnly.__name__}Backward"


def test_a_real_integer_index_is_replayed_and_a_mask_is_not() -> None:
    """`index_select`'s result has its index's length whatever the values; a boolean mask's depends on its values."""
    from lvfl.shadows import _SEEN

    table = torch.empty(10, 3, device="meta")
    for n in (4, 4, 7, 7):  # each length: the kernel once, then a replay
        index = torch.randperm(10)[:n]
        out = as_shadow(table).index_select(0, index)
        reference = table.index_select(0, index)
        assert type(out) is Shadow
        assert (out.shape, out.stride(), out.dtype) == (reference.shape, reference.stride(), reference.dtype)
    assert any(torch.Tensor.index_select in key for key in _SEEN)
    for keep in (2, 5):  # the same mask shape, another count of True: a replay would give the first call's shape
        mask = torch.zeros(10, dtype=torch.bool)
        mask[:keep] = True
        assert as_shadow(table)[mask].shape == (keep, 3)
    picked = torch.index_select(as_shadow(table), 0, torch.arange(3))
    for _ in range(2):  # a real float operand still raises, every time
        with pytest.raises(RuntimeError, match="not on the expected device"):
            picked + torch.ones(3, 3)


def test_mixing_a_shadow_with_a_real_tensor_raises_every_time() -> None:
    real = torch.ones(2, 3)
    for _ in range(3):  # a call that raised is never recorded, so its replay cannot hide the mistake
        with pytest.raises(RuntimeError, match="not on the expected device"):
            _ = real + empty_shadow((2, 3))


def test_in_place_operators_return_the_shadow_itself() -> None:
    x = empty_shadow((2, 3))
    assert x.mul_(2) is x
    assert x.requires_grad_(True) is x
    assert x.requires_grad


def test_the_wires_shadows_are_shadow_tensors() -> None:
    payload = {"e": torch.ones(2, 3, dtype=torch.float64), "ids": [torch.arange(4)]}
    out = shadow(payload)
    assert type(out["e"]) is Shadow
    assert out["e"].dtype == torch.float64
    assert out["e"].shape == (2, 3)
    assert type(out["ids"][0]) is Shadow
    assert is_shadow(out["ids"][0])


def test_a_checkpoint_holds_shadows_as_plain_meta_tensors(tmp_path) -> None:
    """Another party's parameters are shadows in a party's process; its checkpoint loads with weights_only."""
    model = torch.nn.Linear(3, 2).to("meta")
    model.weight = torch.nn.Parameter(shadow(model.weight), requires_grad=True)
    assert type(model.weight.detach()) is Shadow
    torch.save({"state_dict": model.state_dict(), "loose": empty_shadow((4,), requires_grad=True)}, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    weight = loaded["state_dict"]["weight"]
    assert type(weight) is torch.Tensor
    assert (weight.device.type, weight.shape, weight.dtype) == ("meta", (2, 3), torch.float32)
    assert loaded["loose"].requires_grad
