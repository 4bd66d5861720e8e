"""Lossy compression of tensors for the wire: b-bit scalar quantization and top-k sparsification (C-VFL).

Pure functions with explicit arguments and no randomness (`quantize`, `dequantize`, `topk_sparsify`, `densify`),
and a small recipe on top: `Compressor(bits, topk).compress(x)` returns a `CompressedTensor` whose `wire_nbytes()`
is what the message would occupy when serialized, which is what `lvfl.wire.payload_nbytes` counts.

Choices (Castiglia et al., "Compressed-VFL", ICML 2023, Sec. 4.2 analyse both compressors):

- **Quantization is uniform, min-max, per tensor.** One offset (the minimum) and one step
  `(max - min) / (2^b - 1)` for the whole tensor, both float32 on the wire (8 bytes), and round-to-nearest codes
  in `[0, 2^b - 1]`. Each element is then off by at most half a step. Per tensor rather than per row keeps the
  overhead at 8 bytes per message; rounding is deterministic, so compression needs no generator.
  The step is rounded *up* to float32, so no code ever needs clamping and the half-step bound holds exactly.
- **Top-k is per tensor, by magnitude.** The `k = max(1, floor(topk * numel + 1/2))` largest |x| of the flattened
  tensor are kept (ties broken by `torch.topk`), sent in increasing index order.
- **Both together:** sparsify first, then quantize the kept values (the range is that of the kept values).
- **Bytes:** b-bit codes are bit-packed, `ceil(count * b / 8)`, plus 8 bytes of offset and step; unquantized
  values (`bits=32`) cost their dtype's size. Top-k indices are bit-packed at `ceil(log2(numel))` bits each,
  `ceil(k * ceil(log2(numel)) / 8)` bytes. The tensor's shape is not counted: both sides know it from the
  protocol (the batch size and the embedding width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from lvfl.checks import is_int, is_real
from lvfl.federation.codec import register_record
from lvfl.federation.envelope_schema import dtype_from_name, dtype_name

#: `bits` value meaning "no quantization": values travel at their own dtype (float32: 4 bytes)
NO_QUANTIZATION = 32
#: the most bits a quantized code may have
MAX_BITS = 16
#: bytes of the per-tensor offset and step (two float32) that travel with b-bit codes
QUANTIZATION_HEADER_BYTES = 8


def check_bits(bits: int) -> int:
    """Return `bits` if it is an int in [1, 16] or 32 (no quantization), else raise naming the option."""
    if not is_int(bits):
        raise TypeError(f"bits must be an int in [1, {MAX_BITS}] or {NO_QUANTIZATION} (no quantization), got {bits!r}")
    if not (1 <= bits <= MAX_BITS or bits == NO_QUANTIZATION):
        raise ValueError(f"bits must be in [1, {MAX_BITS}] or {NO_QUANTIZATION} (no quantization), got bits={bits}")
    return bits


def check_topk(topk: float) -> float:
    """Return `topk` as a float if it is a fraction in (0, 1], else raise naming the option."""
    if not is_real(topk):
        raise TypeError(f"topk must be a fraction in (0, 1], got {topk!r}")
    if not 0.0 < topk <= 1.0:  # also refuses NaN
        raise ValueError(f"topk must be a fraction in (0, 1] (1 keeps every element), got topk={topk}")
    return float(topk)


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes of `count` values of `bits` bits each, bit-packed: `ceil(count * bits / 8)`."""
    return -(-count * bits // 8)


def index_bits(numel: int) -> int:
    """Bits per index into a tensor of `numel` elements: `ceil(log2(numel))` (0 for a single element)."""
    return max(numel - 1, 0).bit_length()


def topk_count(numel: int, topk: float) -> int:
    """How many of `numel` elements top-k keeps: the nearest integer to `topk * numel` (halves up), at least 1."""
    check_topk(topk)
    if numel == 0:
        return 0
    return min(numel, max(1, math.floor(topk * numel + 0.5)))


def _code_dtype(bits: int) -> torch.dtype:
    return torch.uint8 if bits <= 8 else torch.int16 if bits <= 15 else torch.int32


class Quantized(NamedTuple):
    """b-bit codes with the offset and step that decode them: `x ~ offset + codes * step`."""

    codes: torch.Tensor
    offset: torch.Tensor
    step: torch.Tensor


def quantize(x: torch.Tensor, bits: int) -> Quantized:
    """Uniform min-max quantization of the whole tensor `x` to `bits` bits.

    Codes are `round((x - min) / step)` with `step = (max - min) / (2^b - 1)` rounded up to float32; each element
    decodes to within `step / 2` of its value. `bits=32` means no quantization: the codes are the float32 values
    themselves, with offset 0 and step 1.

    Args:
        x: a floating-point tensor with finite values.
        bits: 1..16, or 32 for none.

    Returns:
        `Quantized(codes, offset, step)`: codes of `x`'s shape (uint8 up to 8 bits, int16 up to 15, int32 for 16),
        offset and step as float32 scalars.

    Raises:
        TypeError, ValueError: for a non-float tensor, NaN or inf values, or `bits` out of range.
    """
    check_bits(bits)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"quantize needs a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    x = x.detach()
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    if bits == NO_QUANTIZATION:
        return Quantized(x.to(torch.float32), zero, torch.ones_like(zero))
    if x.numel() == 0:
        return Quantized(torch.zeros(x.shape, dtype=_code_dtype(bits), device=x.device), zero, zero)
    lo, hi = torch.aminmax(x)
    if not x.is_meta and not (torch.isfinite(lo) and torch.isfinite(hi)):  # a shadow (docs/federation.md) has no values
        raise ValueError("quantize: tensor contains NaN or inf; it cannot be quantized")
    offset = lo.to(torch.float32)
    span = hi.double() - offset.double()
    exact_step = span / (2**bits - 1)
    step = exact_step.to(torch.float32)
    step = torch.where(step.double() < exact_step, torch.nextafter(step, torch.full_like(step, math.inf)), step)
    scaled = (x.double() - offset.double()) / torch.where(step > 0, step, torch.ones_like(step)).double()
    codes = scaled.round().clamp_(0, 2**bits - 1).to(_code_dtype(bits))
    return Quantized(codes, offset, step)


def dequantize(
    codes: torch.Tensor, offset: torch.Tensor, step: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`offset + codes * step`, computed in float64 and returned as `dtype`: the inverse of `quantize`."""
    return (offset.double() + codes.double() * step.double()).to(dtype)


def topk_sparsify(x: torch.Tensor, topk: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The `topk_count(x.numel(), topk)` largest-magnitude elements of `x` and their flat indices.

    Returns:
        `(values, indices)`: 1-D tensors, indices (int64) in increasing order, values at those positions of
        `x.flatten()`.
    """
    check_topk(topk)
    flat = x.detach().reshape(-1)
    k = topk_count(flat.numel(), topk)
    indices = flat.abs().topk(k, sorted=False).indices.sort().values
    return flat[indices], indices


def densify(values: torch.Tensor, indices: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `shape`, zero except `values` at the flat `indices`: the inverse of `topk_sparsify` on the kept."""
    numel = math.prod(shape)
    out = torch.zeros(numel, dtype=values.dtype, device=values.device)
    return out.index_copy_(0, indices, values).reshape(shape)


@dataclass(frozen=True)
class CompressedTensor:
    """A tensor as it travels compressed: what the receiver needs to rebuild it, and its serialized size.

    Attributes:
        shape: the original shape (known to both sides; not counted on the wire).
        dtype: the original dtype, restored by `decompress`.
        bits: bits per value, 32 for unquantized values.
        payload: b-bit codes (`bits < 32`), or the values themselves.
        offset: quantization offset (float32 scalar), None when unquantized.
        step: quantization step (float32 scalar), None when unquantized.
        indices: flat indices of the kept elements (top-k), None when dense.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    bits: int
    payload: torch.Tensor
    offset: torch.Tensor | None = None
    step: torch.Tensor | None = None
    indices: torch.Tensor | None = None

    @property
    def numel(self) -> int:
        """Elements of the original tensor."""
        return math.prod(self.shape)

    def wire_nbytes(self) -> int:
        """Serialized size: packed codes + offset/step, or values at their dtype; plus packed top-k indices."""
        count = self.payload.numel()
        if self.bits < NO_QUANTIZATION:
            nbytes = packed_nbytes(count, self.bits) + QUANTIZATION_HEADER_BYTES
        else:
            nbytes = count * self.payload.element_size()
        if self.indices is not None:
            nbytes += packed_nbytes(count, index_bits(self.numel))
        return nbytes

    def decompress(self) -> torch.Tensor:
        """The receiver's reconstruction, in the original shape and dtype."""
        if self.bits < NO_QUANTIZATION:
            values = dequantize(self.payload, self.offset, self.step, self.dtype)
        else:
            values = self.payload.to(self.dtype)
        if self.indices is None:
            return values.reshape(self.shape)
        return densify(values.reshape(-1), self.indices, self.shape)


class Compressor:
    """What C-VFL applies to every embedding before it goes on the wire: top-k sparsification, then quantization.

    The default (`bits=32, topk=1.0`) compresses nothing: the message is the float32 tensor, 4 bytes per element.

    Args:
        bits: bits per value, 1..16, or 32 for no quantization.
        topk: fraction of elements kept by magnitude, in (0, 1]; 1 keeps all (no indices are sent).

    Example:
        >>> import torch
        >>> c = Compressor(bits=8).compress(torch.rand(4, 16))
        >>> c.wire_nbytes()  # 64 one-byte codes + offset and step
        72
        >>> c.decompress().shape
        torch.Size([4, 16])
    """

    def __init__(self, bits: int = NO_QUANTIZATION, topk: float = 1.0) -> None:
        self.bits = check_bits(bits)
        self.topk = check_topk(topk)

    def compress(self, x: torch.Tensor) -> CompressedTensor:
        """`x` as the sender puts it on the wire."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"Compressor.compress needs a floating-point tensor, got {type(x).__name__}")
        x = x.detach()
        shape, dtype = tuple(x.shape), x.dtype
        indices = None
        values = x.reshape(-1)
        if self.topk < 1.0:
            values, indices = topk_sparsify(x, self.topk)
        if self.bits == NO_QUANTIZATION:
            return CompressedTensor(shape, dtype, self.bits, values, indices=indices)
        codes, offset, step = quantize(values, self.bits)
        return CompressedTensor(shape, dtype, self.bits, codes, offset, step, indices)

    def decompress(self, compressed: CompressedTensor) -> torch.Tensor:
        """The receiver's reconstruction of `compressed`."""
        return compressed.decompress()

    def __repr__(self) -> str:
        return f"Compressor(bits={self.bits}, topk={self.topk})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Compressor):
            return NotImplemented
        return (self.bits, self.topk) == (other.bits, other.topk)

    def __hash__(self) -> int:
        return hash((self.bits, self.topk))


# ------------------------------------------------------------------------------------------------- on the wire
def _wire_fields(c: CompressedTensor) -> dict:
    return {
        "shape": list(c.shape),
        "dtype": dtype_name(c.dtype),
        "bits": c.bits,
        "payload": c.payload,
        "offset": c.offset,
        "step": c.step,
        "indices": c.indices,
    }


def _from_wire(fields: dict) -> CompressedTensor:
    """A `CompressedTensor` from a peer's fields, refused (ValueError/TypeError) unless it decompresses as sent."""
    shape = fields["shape"]
    if not isinstance(shape, list) or len(shape) > 8 or not all(is_int(n) and n >= 0 for n in shape):
        raise ValueError(f"shape must be a list of at most 8 sizes >= 0, got {shape!r}")
    dtype = dtype_from_name(fields["dtype"])
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {fields['dtype']!r}")
    bits = check_bits(fields["bits"])
    payload, offset, step, indices = fields["payload"], fields["offset"], fields["step"], fields["indices"]
    if not isinstance(payload, torch.Tensor) or payload.dim() != 1:
        raise TypeError("payload must be a 1-D tensor")
    numel = math.prod(shape)
    if bits < NO_QUANTIZATION:
        if payload.dtype != _code_dtype(bits) or (
            payload.numel() and not 0 <= int(payload.min()) <= int(payload.max()) < 2**bits
        ):
            raise ValueError(f"payload must hold {bits}-bit codes as {_code_dtype(bits)}")
        for name, scalar in (("offset", offset), ("step", step)):
            if not isinstance(scalar, torch.Tensor) or scalar.shape != () or scalar.dtype != torch.float32:
                raise TypeError(f"{name} must be a float32 scalar tensor")
    elif not payload.is_floating_point() or offset is not None or step is not None:
        raise ValueError("an unquantized payload is floating point, without offset and step")
    if indices is None:
        if payload.numel() != numel:
            raise ValueError(f"a dense payload holds {numel} values for shape {shape}, got {payload.numel()}")
    elif (
        not isinstance(indices, torch.Tensor)
        or indices.dtype != torch.int64
        or indices.shape != payload.shape
        or (indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= numel))
        or (indices.numel() > 1 and not bool((indices[1:] > indices[:-1]).all()))
    ):
        raise ValueError(f"indices must be increasing int64 positions in [0, {numel}), one per payload value")
    return CompressedTensor(tuple(shape), dtype, bits, payload, offset, step, indices)


register_record("lvfl.CompressedTensor", CompressedTensor, _wire_fields, _from_wire)
