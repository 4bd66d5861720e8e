"""What a party accepts from a peer: the checks of a decoded payload against what the receiver expects.

A decoded payload is well formed (`lvfl.federation.codec` saw to that) but not yet what this party asked for. The
receiver names what it expects as a template (`conform`): a tensor of the dtype and shape it expects (a `meta`
tensor will do), a class, a record with its fields, or a dict / list / tuple of them; anything else is refused in one
line naming the sender, the tag, the place and the fault, with the value described (`describe`) and a peer's words
escaped (`printable`) so that nothing a peer chose can rewrite this party's terminal or log:
``party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lvfl.federation import FederationError

__all__ = ["check_step", "conform", "describe", "printable"]


def check_step(src: str, dst: str, tag: str, sent_at: int, step: int) -> None:
    """Refuse a message sent at another step than the one its receiver is at (every carrier says it the same way)."""
    if sent_at != step:
        raise FederationError(f"{src} sent {tag!r} for step {sent_at}; {dst} expected step {step}")


def printable(text: str) -> str:
    r"""`text` with every character that is not printable escaped (``\x1b`` for ESC): a peer's words, safe to print.

    A reason a peer gives (its abort, its refusal) or a name its certificate claims ends up on this party's terminal
    and in its log; raw, an escape sequence in it could rewrite what the operator sees.
    """
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _same(got: Any, want: Any) -> bool:
    """Whether a record field a peer sent equals the one expected (a tensor is compared as a template instead)."""
    if isinstance(got, torch.Tensor):
        return False
    try:
        return bool(got == want)
    except (TypeError, ValueError, RuntimeError):
        return False


def _shown(value: Any) -> str:
    """A field's value in a refusal: short, printable."""
    return printable(repr(value))[:80]


def describe(obj: Any) -> str:
    """How a refusal names a value: "float32 [128, 16]" for a tensor, else its type ("bytes", "dict")."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).removeprefix('torch.')} {list(obj.shape)}"
    return type(obj).__qualname__


def conform(payload: Any, expected: Any, *, sender: str, tag: str, path: str = "") -> None:
    """Refuse `payload` unless it has the form `expected` gives; `expected=None` accepts anything.

    `expected` is a template: a tensor (any device, `meta` included) requires a tensor of exactly its dtype and
    shape; a dict the same keys, a list or tuple the same type and length, each item checked against its own
    template; a class requires an instance of it (`bytes`, a record's class); a dataclass instance (a record, its
    tensors `meta` tensors) requires an instance of exactly its class whose every field matches: a tensor field as
    a tensor template, `None` as `None`, any other field equal; `None` accepts anything there.

    Raises:
        FederationError: ``party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]``.
        TypeError: `expected` is not a template (a bug on the receiving side).
    """
    if expected is None:
        return
    at = f" at {path}" if path else ""

    def refuse(wanted: str) -> FederationError:
        return FederationError(f"{sender} sent {tag!r}{at} as {describe(payload)}; expected {wanted}")

    if isinstance(expected, torch.Tensor):
        if not isinstance(payload, torch.Tensor) or payload.dtype != expected.dtype or payload.shape != expected.shape:
            raise refuse(describe(expected))
    elif isinstance(expected, type):
        if not isinstance(payload, expected):
            raise refuse(expected.__qualname__)
    elif dataclasses.is_dataclass(expected):
        if type(payload) is not type(expected):
            raise refuse(type(expected).__qualname__)
        for field in dataclasses.fields(expected):
            want, got, where = getattr(expected, field.name), getattr(payload, field.name), f"{path}.{field.name}"
            if isinstance(want, torch.Tensor):
                conform(got, want, sender=sender, tag=tag, path=where)
            elif want is None and got is not None or want is not None and not _same(got, want):
                raise FederationError(f"{sender} sent {tag!r} at {where} as {_shown(got)}; expected {_shown(want)}")
    elif isinstance(expected, dict):
        if not isinstance(payload, dict):
            raise refuse("a dict")
        missing, extra = [k for k in expected if k not in payload], [k for k in payload if k not in expected]
        if missing or extra:
            raise FederationError(
                f"{sender} sent {tag!r}{at} with keys {list(payload)}; expected {list(expected)}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unexpected {extra})" if extra else "")
            )
        for key, template in expected.items():
            conform(payload[key], template, sender=sender, tag=tag, path=f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        kind = type(expected).__qualname__
        if type(payload) is not type(expected) or len(payload) != len(expected):
            got = f"a {type(payload).__qualname__} of {len(payload)}" if isinstance(payload, list | tuple) else None
            raise FederationError(
                f"{sender} sent {tag!r}{at} as {got or describe(payload)}; expected a {kind} of {len(expected)}"
            )
        for i, (item, template) in enumerate(zip(payload, expected, strict=True)):
            conform(item, template, sender=sender, tag=tag, path=f"{path}[{i}]")
    else:
        raise TypeError(f"expected must be a tensor, a class, None, or a dict/list/tuple of them; got {expected!r}")
