"""What an lvfl envelope may carry: the schema's version, the header, the dtypes of a tensor, a payload's bounds.

The message layout itself is ``envelope.proto``; these are the terms the codec and the walk of an envelope's bytes
both read it under. A bound here is one a receiver enforces before it spends on what a peer sent
(`lvfl.federation.wire_form.scan_payload`) and again as it decodes (`lvfl.federation.codec.decode_value`), so both
read the same numbers.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "ITEMSIZE",
    "MAX_DEPTH",
    "MAX_DIMS",
    "MAX_INT_BYTES",
    "MAX_NODES",
    "NUMPY_VIEWS",
    "SCHEMA",
    "Header",
    "dtype_from_name",
    "dtype_name",
]

#: version of the envelope layout; a receiver refuses any other (0 is what a non-lvfl message parses to)
SCHEMA = 1
#: deepest nesting of lists, tuples, dicts and records accepted (lvfl payloads nest 3 deep at most; protobuf's own
#: parser stops at 100 message levels, about 3 per level here)
MAX_DEPTH = 16
#: largest int accepted, in bytes of two's complement (32768 bits: a Paillier ciphertext mod n^2 for a 16384-bit n)
MAX_INT_BYTES = 4096
#: most dimensions a tensor may have
MAX_DIMS = 32
#: most values one payload may hold (tensors, ints, list items, ...): lvfl's own payloads hold a few, or one per
#: Paillier ciphertext (16,000 for a million packed values); each costs ~60 bytes once protobuf has parsed it
MAX_NODES = 2**20

#: the dtypes that may cross the wire, by the name the envelope carries (torch's, without "torch.")
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
#: each dtype's item size in bytes, by wire name
ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
#: the dtypes whose tensors are encoded and decoded through numpy's buffer on a little-endian host, with the same
#: bytes as the general path: on a party that waits on each message, a torch call's dispatch and each copy of the
#: tensor's bytes cost several times what they cost in a loop (the TLS and gRPC work in between evicts the caches)
NUMPY_VIEWS = (
    {name: torch.empty((), dtype=dtype).numpy().dtype for name, dtype in DTYPES.items() if dtype is not torch.bfloat16}
    if sys.byteorder == "little"
    else {}
)
#: each dtype's wire name, by dtype
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of `dtype` ("float32"); a `TypeError` for one that cannot be sent (quantized, float8)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"tensors of dtype {name} cannot be sent; lvfl sends {', '.join(DTYPES)}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    """The dtype named `name` on the wire; a `KeyError` for a name not in `DTYPES` (for record decoders)."""
    if name not in DTYPES:
        raise KeyError(f"unknown dtype {name!r}")
    return DTYPES[name]


class Header(NamedTuple):
    """An envelope's addressing, as received: who sent what to whom, in which run, at which step.

    A named tuple, not a frozen dataclass: one is built on each side of every message, in a third of the time.
    """

    run_id: str
    src: str
    dst: str
    tag: str
    step: int
    seq: int
    fingerprint: str = ""
