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
#: the exact types of `_PLAIN` (an exact-type lookup is the fast path of `_signature`)
_PLAIN_TYPES = frozenset(_PLAIN)
#: operators whose result's shape follows from an index argument's shape, never its values
_SHAPE_FROM_INDEX = frozenset({torch.Tensor.index_select, torch.index_select})
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
            if signature is not None and _recordable(func, out, tensors):
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
    """The call's cache key and its tensor arguments; None when the call is not to be cached.

    Called for every operator on a shadow, so it reads each argument once, by exact type first (the common case: a
    flat tuple of tensors and numbers), and walks nested lists and tuples only when there are any.
    """
    name = getattr(func, "__name__", "")
    if name == "__get__" or name.endswith("_") or (name.startswith("__i") and name != "__index__"):
        return None  # a property, or an in-place operator (its result is an argument)
    parts: list[Any] = [func, torch.is_grad_enabled()]
    tensors: list[torch.Tensor] = []
    stack: list[Any] = list(args)
    if kwargs:
        stack.append(tuple(sorted(kwargs.items())))
    stack.reverse()  # popped in argument order (any order would do; this one reads best when debugging)
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_TYPES:
            parts.append((kind, item))
        elif isinstance(item, torch.Tensor):
            parts.append((item.device.type, item.dtype, item.shape, item.stride(), item.requires_grad))
            tensors.append(item)
        elif kind is tuple or kind is list:
            parts.append((kind, len(item)))
            stack.extend(reversed(item))
        elif isinstance(item, _PLAIN):
            parts.append((kind, item))
        elif isinstance(item, tuple | list):
            parts.append((kind, len(item)))
            stack.extend(reversed(item))
        else:
            return None
    return tuple(parts), tensors


def _recordable(func: Any, out: Any, tensors: list[torch.Tensor]) -> bool:
    """Whether `out` can be replayed from its shape: one fresh meta tensor, from arguments all on meta.

    The one exception: an index whose *shape* alone fixes the result's (`index_select`) may be a real integer
    tensor; a real tensor anywhere else (a boolean mask, whose values fix the shape; a float operand, which raises)
    keeps the call uncached.
    """
    if not isinstance(out, torch.Tensor) or out.device.type != "meta" or any(out is t for t in tensors):
        return False
    real = [t for t in tensors if t.device.type != "meta"]
    if not real:
        return True
    integer = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    return func in _SHAPE_FROM_INDEX and all(t.dtype in integer for t in real)


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
