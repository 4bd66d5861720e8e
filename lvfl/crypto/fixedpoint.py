"""Fixed-point encoding of float tensors into the ring Z_2^64 or Z_2^32, and exact ring arithmetic.

Masking only hides a value perfectly, and masks only cancel exactly, in a finite ring: a float mask would either
leak (too small) or swamp the value in rounding error (too large). So values are encoded as
`round(x * 2**frac_bits)` and stored in int64 (Z_2^64) or int32 (Z_2^32) tensors whose bits are read as ring
elements (two's complement: the int64 `-1` is the ring element `2**64 - 1`). The ring is chosen by `ring_bits`
(64, the default here, or 32); the dtype of a tensor of ring elements says which ring it lives in.

Z_2^32 halves the bytes of a masked share (4 per element, as a float32) at the price of range: with `frac_bits=16`
and the sum of C encodings kept inside the signed range, |x| stays below about `2**15 / C`, against `2**47 / C` in
Z_2^64. `check_range` refuses anything beyond; nothing is ever clipped or wrapped silently.

Ring arithmetic is done on `numpy.uint64` / `numpy.uint32` views of the same memory. Unsigned overflow wraps
modulo 2**64 (2**32) by definition in C and NumPy, whereas signed overflow (which is what `torch.add` on int64 or
int32 tensors would do) is undefined behaviour in C++ even if it wraps in practice. The views are zero-copy for CPU
tensors; tensors on other devices make one round trip through host memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

#: the default number of fractional bits: resolution 2**-16 ~ 1.5e-5; the range it leaves is |x| < 2**47 / C in
#: Z_2^64 and about 2**15 / C (8,192 for C = 4 parties) in Z_2^32, ample for embeddings in [-1e3, 1e3]
DEFAULT_FRAC_BITS = 16
#: the most parties whose encoded values `check_range` can vouch for (see its proof of no overflow)
MAX_HEADROOM = 2**10

#: the rings a tensor of ring elements may live in, by bit width: Z_2^32 (int32) and Z_2^64 (int64)
RING_BITS = (32, 64)
#: the torch dtype holding elements of each ring, and the unsigned NumPy dtype its arithmetic is done in
RING_DTYPES = {32: torch.int32, 64: torch.int64}
_UNSIGNED = {torch.int32: np.dtype(np.uint32), torch.int64: np.dtype(np.uint64)}
_SIGNED = {torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64)}


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


def check_ring_bits(ring_bits: object, option: str = "ring_bits") -> int:
    """`ring_bits` if it names a supported ring (32 or 64); TypeError/ValueError naming `option` otherwise."""
    if isinstance(ring_bits, bool) or not isinstance(ring_bits, int):
        raise TypeError(f"{option} must be an int (32 or 64), got {type(ring_bits).__name__} {ring_bits!r}")
    if ring_bits not in RING_BITS:
        raise ValueError(f"{option} must be 32 (int32 shares, Z_2^32) or 64 (int64 shares, Z_2^64), got {ring_bits}")
    return ring_bits


def _max_code(headroom_parties: int, ring_bits: int) -> int:
    """Z_2^32: the largest |round(x * 2**frac_bits)| of which `headroom_parties` still sum inside [-2**31, 2**31)."""
    return (2 ** (ring_bits - 1) - 1) // headroom_parties


def max_abs_value(frac_bits: int = DEFAULT_FRAC_BITS, headroom_parties: int = 1, ring_bits: int = 64) -> float:
    """The bound B that every encoded |x| must stay strictly below.

    Z_2^64: `B * 2**frac_bits * headroom_parties == 2**63`. Z_2^32: `B * 2**frac_bits == M + 1/2` with
    `M = (2**31 - 1) // headroom_parties`, so that every accepted value rounds to an integer of magnitude at most M
    and `headroom_parties` of them sum inside [-2**31, 2**31) (no rounding headroom is needed beyond that).
    """
    check_frac_bits(frac_bits)
    if check_ring_bits(ring_bits) == 64:
        return math.ldexp(1.0, 63 - frac_bits) / headroom_parties
    return math.ldexp(_max_code(headroom_parties, ring_bits) + 0.5, -frac_bits)


def max_frac_bits(headroom_parties: int, ring_bits: int, min_bound: float = 1.0) -> int:
    """The most fractional bits (at most MAX_FRAC_BITS, at least 0) that still represent every |x| < `min_bound`."""
    for frac_bits in range(MAX_FRAC_BITS, 0, -1):
        if max_abs_value(frac_bits, headroom_parties, ring_bits) >= min_bound:
            return frac_bits
    return 0


def check_range(
    x: torch.Tensor,
    frac_bits: int,
    headroom_parties: int,
    who: str,
    *,
    ring_bits: int = 64,
    remedy: str | None = None,
) -> None:
    """Refuse values whose encodings could overflow when `headroom_parties` of them are summed in the ring.

    Z_2^64: the check is `max|x| * 2**frac_bits * headroom_parties < 2**63`, evaluated in float64, where
    multiplying by a power of two is exact and rounding is monotone, so no out-of-range value slips through. It also
    bounds the rounded encodings: below 2**52 an encoding is at most 2**52 and `2**52 * headroom_parties < 2**63`
    because `headroom_parties <= 2**10`; at or above 2**52, `x * 2**frac_bits` is already an integer and is not
    rounded. Hence the sum of `headroom_parties` encodings lies in [-2**63, 2**63) and decodes to the right value.

    Z_2^32: the check is `max|x| * 2**frac_bits < M + 1/2` with `M = (2**31 - 1) // headroom_parties`, exact in
    float64 as well. Rounding is monotone, so every accepted encoding has magnitude at most M and the sum of
    `headroom_parties` of them lies in [-(2**31 - 1), 2**31 - 1]: the rounding is accounted for in M itself (a
    float64 value just below 2**31 / C could otherwise round up past it).

    Args:
        x: a floating-point tensor.
        frac_bits: fractional bits of the encoding.
        headroom_parties: how many encoded values may be summed (the number of parties).
        who: the party (or value) to name in the error.
        ring_bits: 64 (Z_2^64) or 32 (Z_2^32).
        remedy: what the caller can change, for the error message (default: normalize the values or lower
            frac_bits).

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
    bound = max_abs_value(frac_bits, headroom_parties, ring_bits)
    if x.numel() == 0:
        return
    # One pass and no temporary (aminmax, not abs().amax()); both propagate NaN, and |inf| is inf, so a non-finite
    # peak means a bad input.
    lo, hi = torch.aminmax(x.detach())
    peak = max(-float(lo), float(hi))
    if not math.isfinite(peak):
        raise ValueError(f"{who}: tensor contains NaN or inf (max |value| = {peak}); it cannot be encoded")
    if ring_bits == 64:
        out_of_range = math.ldexp(peak, frac_bits) * headroom_parties >= 2.0**63
    else:
        out_of_range = math.ldexp(peak, frac_bits) >= _max_code(headroom_parties, ring_bits) + 0.5
    if out_of_range:
        raise ValueError(
            f"{who}: max |value| = {peak:.6g} is out of range for fixed point in Z_2^{ring_bits} with "
            f"frac_bits={frac_bits} summed over {headroom_parties} parties; values must satisfy |x| < {bound:.6g} "
            f"({remedy or 'normalize the embedding, or lower frac_bits'}; nothing is clipped or wrapped)"
        )


def encode(
    x: torch.Tensor,
    frac_bits: int = DEFAULT_FRAC_BITS,
    *,
    headroom_parties: int = 1,
    who: str = "value",
    ring_bits: int = 64,
    remedy: str | None = None,
) -> torch.Tensor:
    """Encode a float tensor as ring elements `round(x * 2**frac_bits)` (round half to even).

    The range is checked first (see `check_range`), because converting an out-of-range float to an integer is
    undefined. Scaling by a power of two is exact in binary floating point (no overflow: the range check bounds the
    product by 2**63, or 2**31 in Z_2^32, and float16/bfloat16 are first widened to float32), so the only error is
    the final rounding to an integer: |decode(encode(x)) - x| <= 2**-(frac_bits + 1) for float32/float64 `x`. The
    work stays in `x`'s own float32/float64 dtype because widening to float64 would cost a copy per call for no
    accuracy; in Z_2^32 the checked range lets the float cast straight to int32.

    Args:
        x: a floating-point tensor on any device.
        frac_bits: fractional bits; resolution is 2**-frac_bits.
        headroom_parties: how many such encodings will be summed; see `check_range`.
        who: the party (or value) to name in errors.
        ring_bits: 64 (an int64 tensor, Z_2^64) or 32 (an int32 tensor, Z_2^32).
        remedy: what the caller can change when a value is out of range (see `check_range`).

    Returns:
        An int64 (ring_bits=64) or int32 (ring_bits=32) tensor of `x`'s shape on `x`'s device.
    """
    check_frac_bits(frac_bits)
    check_ring_bits(ring_bits)
    check_range(x, frac_bits, headroom_parties, who, ring_bits=ring_bits, remedy=remedy)
    work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    scaled = x.detach().to(work).mul(2.0**frac_bits)  # a fresh tensor, so the next op may be in place
    return scaled.round_().to(RING_DTYPES[ring_bits])


def decode(q: torch.Tensor, frac_bits: int = DEFAULT_FRAC_BITS, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode ring elements (int64 or int32, two's complement) back to floats `q / 2**frac_bits` in `dtype`.

    The cast to `dtype` rounds to nearest once; the scaling by a power of two is then exact (no float64 detour,
    which would round twice and cost two extra passes).
    """
    check_frac_bits(frac_bits)
    _check_ring(q, "q")
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float64
    return q.to(work).mul_(2.0**-frac_bits).to(dtype)


def add_decoded(x: torch.Tensor, q: torch.Tensor, frac_bits: int = DEFAULT_FRAC_BITS) -> torch.Tensor:
    """`x + decode(q, frac_bits, x.dtype)` on `x`'s device, bit for bit, with gradients flowing to `x`.

    For float32/float64 `x` it is one fused pass, `x + 2**-frac_bits * q`: the cast of `q` rounds once, as in
    `decode`, the scaling by a power of two is exact, so the sum rounds once as `x + decode(...)` does (it saves a
    temporary and a pass, which the active party pays on every step). Other dtypes go through `decode`.
    """
    check_frac_bits(frac_bits)
    _check_ring(q, "q")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("add_decoded: x must be a floating-point tensor")
    if x.dtype not in (torch.float32, torch.float64):
        return x + decode(q, frac_bits, dtype=x.dtype).to(x.device)
    return torch.add(x, q.to(device=x.device, dtype=x.dtype), alpha=2.0**-frac_bits)


# -- ring arithmetic in Z_2^64 (int64 tensors) and Z_2^32 (int32 tensors) -----------------------------------------
def _check_ring(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in _UNSIGNED:
        what = f"a tensor of dtype {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{name}: ring elements are int64 (Z_2^64) or int32 (Z_2^32) tensors, got {what}")


def _unsigned(t: torch.Tensor) -> np.ndarray:
    """A uint64 (uint32) NumPy view of a contiguous CPU int64 (int32) tensor (zero-copy: writes go to the tensor)."""
    return t.numpy().view(_UNSIGNED[t.dtype])


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _binary(a: torch.Tensor, b: torch.Tensor, op: np.ufunc, out: torch.Tensor | None) -> torch.Tensor:
    _check_ring(a, "a")
    _check_ring(b, "b")
    if a.dtype != b.dtype:
        raise TypeError(f"ring operands must be in the same ring, got {a.dtype} and {b.dtype}")
    if a.shape != b.shape:
        raise ValueError(f"ring operands must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    host_a = _host(a)
    if out is None:
        res = torch.empty_like(host_a)
    else:
        _check_ring(out, "out")
        if out.dtype != a.dtype or out.device.type != "cpu" or not out.is_contiguous() or out.shape != a.shape:
            raise ValueError("out must be a contiguous CPU tensor of the operands' dtype and shape")
        res = out
    # one pass, straight into `res`; NumPy handles `res` aliasing either operand
    op(_unsigned(host_a), _unsigned(_host(b)), out=_unsigned(res))
    return res if out is not None else res.to(a.device)


def ring_add(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`a + b` in the ring of `a` (mod 2**64 or 2**32) elementwise; `out` (possibly `a`) avoids an allocation.

    `out` must be a contiguous CPU tensor of the operands' dtype and shape.
    """
    return _binary(a, b, np.add, out)


def ring_sub(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """`a - b` in the ring of `a` (mod 2**64 or 2**32) elementwise; `out` as in `ring_add`."""
    return _binary(a, b, np.subtract, out)


def ring_neg(a: torch.Tensor) -> torch.Tensor:
    """`-a` in the ring of `a` elementwise (the additive inverse; note -(-2**63) == -2**63 in Z_2^64)."""
    _check_ring(a, "a")
    res = _host(a).clone()
    np.negative(_unsigned(res), out=_unsigned(res))
    return res.to(a.device)


def ring_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The ring sum of equally shaped int64 (or int32) tensors, on the first tensor's device."""
    items = list(tensors)
    if not items:
        raise ValueError("ring_sum needs at least one tensor")
    for i, t in enumerate(items):  # check everything first, then add with no per-operand overhead
        _check_ring(t, f"tensors[{i}]")
        if t.dtype != items[0].dtype:
            raise TypeError(f"ring_sum: tensors[{i}] is {t.dtype}, tensors[0] {items[0].dtype}: not the same ring")
        if t.shape != items[0].shape:
            raise ValueError(
                f"ring operands must have the same shape, got {tuple(items[0].shape)} and {tuple(t.shape)} "
                f"(tensors[{i}])"
            )
    views = [_unsigned(_host(t)) for t in items]
    if len(views) == 1:
        acc = views[0].copy()
    else:
        acc = np.add(views[0], views[1])  # the first add writes the accumulator: no copy of the first tensor
        for v in views[2:]:
            np.add(acc, v, out=acc)
    return torch.from_numpy(acc.view(_SIGNED[items[0].dtype])).to(items[0].device)
