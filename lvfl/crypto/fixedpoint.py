"""Fixed-point encoding of float tensors into the ring Z_2^64, and exact ring arithmetic.

Masking only hides a value perfectly, and masks only cancel exactly, in a finite ring: a float mask would either
leak (too small) or swamp the value in rounding error (too large). So values are encoded as
`round(x * 2**frac_bits)` and stored in int64 tensors whose bits are read as elements of Z_2^64 (two's
complement: the int64 `-1` is the ring element `2**64 - 1`).

Ring arithmetic is done on `numpy.uint64` views of the same memory. Unsigned overflow wraps modulo 2**64 by
definition in C and NumPy, whereas signed int64 overflow (which is what `torch.add` on int64 tensors would do) is
undefined behaviour in C++ even if it wraps in practice. The views are zero-copy for CPU tensors; tensors on other
devices make one round trip through host memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

#: the default number of fractional bits: resolution 2**-16 ~ 1.5e-5, ample for embeddings in [-1e3, 1e3]
DEFAULT_FRAC_BITS = 16
#: the most parties whose encoded values `check_range` can vouch for (see its proof of no overflow)
MAX_HEADROOM = 2**10

_U64 = np.dtype(np.uint64)


#: the most fractional bits any backend accepts. Beyond 40 too little integer range is left: |x| < 2**(63 - 40) / C
#: in the ring, and `int_bits + frac_bits + 1 <= 53` (float64-exact Paillier encodings) leaves |x| < 2**12
MAX_FRAC_BITS = 40


def check_frac_bits(frac_bits: object, option: str = "frac_bits") -> int:
    """The one fixed-point resolution rule every backend and channel applies: an int in [1, MAX_FRAC_BITS].

    One rule, so that a config's `frac_bits` means the same in DHMasking, Paillier and the soft-label channels;
    a backend with less capacity (Paillier's `int_bits`) adds its own check on top, naming its own option.
    """
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int):
        raise TypeError(f"{option} must be an int, got {type(frac_bits).__name__} {frac_bits!r}")
    if not 1 <= frac_bits <= MAX_FRAC_BITS:
        raise ValueError(f"{option} must be in [1, {MAX_FRAC_BITS}], got {frac_bits}")
    return frac_bits


def max_abs_value(frac_bits: int = DEFAULT_FRAC_BITS, headroom_parties: int = 1) -> float:
    """The bound B that every encoded |x| must stay strictly below: `B * 2**frac_bits * headroom_parties == 2**63`."""
    check_frac_bits(frac_bits)
    return math.ldexp(1.0, 63 - frac_bits) / headroom_parties


def check_range(x: torch.Tensor, frac_bits: int, headroom_parties: int, who: str) -> None:
    """Refuse values whose encodings could overflow when `headroom_parties` of them are summed in the ring.

    The check is `max|x| * 2**frac_bits * headroom_parties < 2**63`, evaluated in float64, where multiplying by a
    power of two is exact and rounding is monotone, so no out-of-range value slips through. It also bounds the
    rounded encodings: below 2**52 an encoding is at most 2**52 and `2**52 * headroom_parties < 2**63` because
    `headroom_parties <= 2**10`; at or above 2**52, `x * 2**frac_bits` is already an integer and is not rounded.
    Hence the sum of `headroom_parties` encodings lies in [-2**63, 2**63) and decodes to the right value.

    Args:
        x: a floating-point tensor.
        frac_bits: fractional bits of the encoding.
        headroom_parties: how many encoded values may be summed (the number of parties).
        who: the party (or value) to name in the error.

    Raises:
        TypeError: if `x` is not a floating-point tensor.
        ValueError: if `x` holds NaN or inf, or a value out of range; the message names `who`, the offending max
            |value| and the allowed bound.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        what = f"tensor of dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{who}: fixed-point encoding needs a floating-point tensor, got a {what}")
    if isinstance(headroom_parties, bool) or not isinstance(headroom_parties, int):
        raise TypeError(f"headroom_parties must be an int, got {type(headroom_parties).__name__}")
    if not 1 <= headroom_parties <= MAX_HEADROOM:
        raise ValueError(f"headroom_parties must be in [1, {MAX_HEADROOM}], got {headroom_parties}")
    bound = max_abs_value(frac_bits, headroom_parties)
    if x.numel() == 0:
        return
    # One pass and no temporary (aminmax, not abs().amax()); both propagate NaN, and |inf| is inf, so a non-finite
    # peak means a bad input.
    lo, hi = torch.aminmax(x.detach())
    peak = max(-float(lo), float(hi))
    if not math.isfinite(peak):
        raise ValueError(f"{who}: tensor contains NaN or inf (max |value| = {peak}); it cannot be encoded")
    if math.ldexp(peak, frac_bits) * headroom_parties >= 2.0**63:
        raise ValueError(
            f"{who}: max |value| = {peak:.6g} is out of range for fixed point with frac_bits={frac_bits} summed over "
            f"{headroom_parties} parties; values must satisfy |x| < {bound:.6g} "
            "(normalize or clip the embedding, or lower frac_bits)"
        )


def encode(
    x: torch.Tensor,
    frac_bits: int = DEFAULT_FRAC_BITS,
    *,
    headroom_parties: int = 1,
    who: str = "value",
) -> torch.Tensor:
    """Encode a float tensor as ring elements `round(x * 2**frac_bits)` (round half to even) in an int64 tensor.

    The range is checked first (see `check_range`), because converting an out-of-range float to int64 is undefined.
    Scaling by a power of two is exact in binary floating point (no overflow: the range check bounds the product
    by 2**63, and float16/bfloat16 are first widened to float32), so the only error is the final rounding to an
    integer: |decode(encode(x)) - x| <= 2**-(frac_bits + 1) for float32/float64 `x`. The work stays in `x`'s own
    float32/float64 dtype because widening to float64 would cost a copy per call for no accuracy.

    Args:
        x: a floating-point tensor on any device.
        frac_bits: fractional bits; resolution is 2**-frac_bits.
        headroom_parties: how many such encodings will be summed; see `check_range`.
        who: the party (or value) to name in errors.

    Returns:
        An int64 tensor of `x`'s shape on `x`'s device.
    """
    check_frac_bits(frac_bits)
    check_range(x, frac_bits, headroom_parties, who)
    work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    scaled = x.detach().to(work).mul(2.0**frac_bits)  # a fresh tensor, so the next op may be in place
    return scaled.round_().to(torch.int64)


def decode(q: torch.Tensor, frac_bits: int = DEFAULT_FRAC_BITS, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode ring elements (int64, two's complement) back to floats `q / 2**frac_bits` in `dtype`.

    The cast to `dtype` rounds to nearest once; the scaling by a power of two is then exact (no float64 detour,
    which would round twice and cost two extra passes).
    """
    check_frac_bits(frac_bits)
    _check_ring(q, "q")
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float64
    return q.to(work).mul_(2.0**-frac_bits).to(dtype)


# -- ring arithmetic in Z_2^64 ---------------------------------------------------------------------------------------
def _check_ring(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        what = f"a tensor of dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name}: ring elements are int64 tensors, got {what}")


def _u64(t: torch.Tensor) -> np.ndarray:
    """A uint64 NumPy view of a contiguous CPU int64 tensor (zero-copy: writes go to the tensor)."""
    return t.numpy().view(_U64)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _binary(a: torch.Tensor, b: torch.Tensor, op: np.ufunc, out: torch.Tensor | None) -> torch.Tensor:
    _check_ring(a, "a")
    _check_ring(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"ring operands must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if out is None:
        res = _host(a).clone() if a.device.type == "cpu" else _host(a)
    else:
        _check_ring(out, "out")
        if out.device.type != "cpu" or not out.is_contiguous() or out.shape != a.shape:
            raise ValueError("out must be a contiguous CPU int64 tensor of the operands' shape")
        res = out
        if res.data_ptr() != a.data_ptr():
            res.copy_(a)
    op(_u64(res), _u64(_host(b)), out=_u64(res))
    return res if out is not None else res.to(a.device)


def ring_add(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`a + b mod 2**64` elementwise; `out` (a contiguous CPU int64 tensor, possibly `a`) avoids an allocation."""
    return _binary(a, b, np.add, out)


def ring_sub(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`a - b mod 2**64` elementwise; `out` as in `ring_add`."""
    return _binary(a, b, np.subtract, out)


def ring_neg(a: torch.Tensor) -> torch.Tensor:
    """`-a mod 2**64` elementwise (the additive inverse; note -(-2**63) == -2**63 in the ring)."""
    _check_ring(a, "a")
    res = _host(a).clone()
    np.negative(_u64(res), out=_u64(res))
    return res.to(a.device)


def ring_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The ring sum of equally shaped int64 tensors, on the first tensor's device."""
    items = list(tensors)
    if not items:
        raise ValueError("ring_sum needs at least one tensor")
    _check_ring(items[0], "tensors[0]")
    acc = _host(items[0]).clone()
    for t in items[1:]:
        _binary(acc, t, np.add, acc)
    return acc.to(items[0].device)
