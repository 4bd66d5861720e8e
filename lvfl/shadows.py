"""Shadow tensors: another party's values in a party's own process, with arithmetic that costs microseconds.

In a party's process (docs/federation.md) the protocol's step runs as it does in simulation, but every value another
party holds is a *shadow*: a `meta`-device tensor with the value's dtype and shape and no data. The step's code
still computes with them (a passive party works out the shape of the active party's sum, the active party the
shape of a passive party's head input), because that code is shared with simulation.

Why a subclass: torch's meta kernels for most operators are written in Python (torch._refs / torch._prims) and
cost 30-200 us each, which made shadow arithmetic a large part of a party's step. A `Shadow` runs each operator
on the meta device once per *signature* (the operator, every argument's device, dtype, shape, strides and
`requires_grad`, the other arguments' values, grad mode) and afterwards replays the recorded result: an empty
tensor of the recorded shape, strides and dtype. Where the result requires a gradient the replay is a node of the
autograd graph (`_ShapeOnly`), so `torch.autograd.grad` through shadows still gives gradients of the right shapes;
nothing ever differentiates a shadow for its values (a party's own terms hold no shadows).

What does not change: mixing a shadow with a real tensor raises, as on plain meta tensors (a signature is recorded
only after the operator ran; one that raised is never recorded, so it raises every time). In-place operators and
those whose result is not one meta tensor run uncached.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Shadow", "as_shadow", "empty_shadow"]

#: argument types whose value enters a signature (anything else makes the call uncached)
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
#: the recorded result of each signature seen: (shape, strides, dtype, requires_grad)
_SEEN: dict[tuple, tuple[tuple[int, ...], tuple[int, ...], torch.dtype, bool]] = {}
#: signatures recorded before the cache is cleared (a long run with ever-new shapes stays bounded)
_MAX_SEEN = 4096


class Shadow(torch.Tensor):
    """A meta tensor standing for a value another party holds; operators on it are shape-only and cached."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            signature = _signature(func, args, kwargs)
            if signature is not None:
                key, tensors = signature
                seen = _SEEN.get(key)
                if seen is not None:
                    return _replay(seen, tensors)
            out = func(*args, **kwargs)
            if signature is not None and _recordable(out, tensors):
                if len(_SEEN) >= _MAX_SEEN:
                    _SEEN.clear()
                _SEEN[key] = (tuple(out.shape), out.stride(), out.dtype, out.requires_grad)
            return _wrap(out)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Saved as a plain meta tensor: a checkpoint holds another party's tensors as shapes, loadable anywhere."""
        with torch._C.DisableTorchFunctionSubclass():
            plain = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
            if self.requires_grad and self.grad_fn is None:
                plain.requires_grad_(True)
            return plain.__reduce_ex__(protocol)


def as_shadow(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (on the meta device) as a `Shadow`, sharing its autograd history."""
    if type(tensor) is Shadow or tensor.device.type != "meta":
        return tensor
    return tensor.as_subclass(Shadow)


def empty_shadow(
    shape: tuple[int, ...] | torch.Size, dtype: torch.dtype = torch.float32, requires_grad: bool = False
) -> torch.Tensor:
    """A fresh `Shadow` leaf of `shape` and `dtype`."""
    out = torch.empty(shape, dtype=dtype, device="meta").as_subclass(Shadow)
    return out.requires_grad_(True) if requires_grad else out


class _ShapeOnly(torch.autograd.Function):
    """A replayed operator in the autograd graph: gradients of its inputs' shapes, values never computed."""

    @staticmethod
    def forward(ctx: Any, shape: tuple, stride: tuple, dtype: torch.dtype, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.inputs = [(tuple(t.shape), t.stride(), t.dtype) for t in inputs]
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        empties = (torch.empty_strided(s, st, dtype=d, device="meta") for s, st, d in ctx.inputs)
        return (None, None, None, *empties)


def _signature(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, list[torch.Tensor]] | None:
    """The call's cache key and its tensor arguments; None when the call is not to be cached."""
    name = getattr(func, "__name__", "")
    if name == "__get__" or name.endswith("_") or (name.startswith("__i") and name != "__index__"):
        return None  # a property, or an in-place operator (its result is an argument)
    parts: list[Any] = [func, torch.is_grad_enabled()]
    tensors: list[torch.Tensor] = []
    stack: list[Any] = [args, tuple(sorted(kwargs.items()))]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            parts.append((item.device.type, item.dtype, tuple(item.shape), item.stride(), item.requires_grad))
            tensors.append(item)
        elif isinstance(item, tuple | list):
            parts.append((type(item), len(item)))
            stack.extend(item)
        elif isinstance(item, _PLAIN):
            parts.append((type(item), item))
        else:
            return None
    return tuple(parts), tensors


def _recordable(out: Any, tensors: list[torch.Tensor]) -> bool:
    """Whether `out` can be replayed from its shape: one fresh meta tensor, from arguments all on meta."""
    return (
        isinstance(out, torch.Tensor)
        and out.device.type == "meta"
        and all(t.device.type == "meta" for t in tensors)
        and not any(out is t for t in tensors)
    )


def _replay(seen: tuple, tensors: list[torch.Tensor]) -> torch.Tensor:
    shape, stride, dtype, requires_grad = seen
    if not requires_grad:
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta").as_subclass(Shadow)
    inputs = [t for t in tensors if t.requires_grad]
    if not inputs:  # a factory asked for requires_grad=True: a leaf
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta").as_subclass(Shadow).requires_grad_(True)
    return _ShapeOnly.apply(shape, stride, dtype, *inputs).as_subclass(Shadow)


def _wrap(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return as_shadow(out)
    if isinstance(out, tuple | list):
        return type(out)([_wrap(v) for v in out])  # a tuple, a list, or torch.return_types' named tuples
    return out
