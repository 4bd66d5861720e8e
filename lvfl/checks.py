"""Argument checks shared by every constructor: one spelling of "an int in [low, high]" and "a finite number".

Why one helper: the same `isinstance(v, bool) or not isinstance(v, int) or ...` idiom was written thirty times,
each with its own wording and its own choice of exception. Here `bool` is never a number (``True`` is an `int`
to Python, never a party count to a user), NumPy integers and floats are accepted, and every refusal names the
option and the value it got. The error is an `OptionError`, which is both a `ValueError` and a `TypeError`, so a
caller may catch the one it means (a wrong type and a wrong range are both a bad option value).

`lvfl.crypto` keeps its own few checks: the crypto layer imports nothing else from lvfl.
"""

from __future__ import annotations

import math
import numbers


class OptionError(ValueError, TypeError):
    """A refused option value: a wrong type or out of range. The message names the option and the value."""


def is_int(value: object) -> bool:
    """Whether `value` is an integer that is not a bool (Python and NumPy integers)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """Whether `value` is a real number that is not a bool (ints and floats, Python or NumPy)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _range(low: float | None, high: float | None, open_low: bool, open_high: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    if low is not None:
        return f" {'>' if open_low else '>='} {low:g}"
    if high is not None:
        return f" {'<' if open_high else '<='} {high:g}"
    return ""


def _because(why: str) -> str:
    return f" ({why})" if why else ""


def check_int(value: object, option: str, low: int | None = None, high: int | None = None, *, why: str = "") -> int:
    """`value` as an `int`, refused unless it is an integer (not a bool) in [low, high] (either end optional).

    `why` says what the option means, for the message: "model.local_epochs must be an int >= 1 (T_k, ...)".
    """
    if not is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        raise OptionError(f"{option} must be an int{_range(low, high, False, False)}{_because(why)}, got {value!r}")
    return int(value)


def check_real(
    value: object,
    option: str,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    why: str = "",
) -> float:
    """`value` as a finite `float`, refused unless it lies in the given interval (ends closed unless `open_*`).

    NaN and infinities are always refused: no option of lvfl means anything at either.
    """
    ok = is_real(value) and math.isfinite(float(value))
    if ok and low is not None:
        ok = float(value) > low if open_low else float(value) >= low
    if ok and high is not None:
        ok = float(value) < high if open_high else float(value) <= high
    if not ok:
        bounds = _range(low, high, open_low, open_high)
        raise OptionError(f"{option} must be a finite number{bounds}{_because(why)}, got {value!r}")
    return float(value)


def check_positive(value: object, option: str, *, why: str = "") -> float:
    """A finite number > 0 (learning rates, bounds, scales)."""
    return check_real(value, option, 0.0, open_low=True, why=why)
