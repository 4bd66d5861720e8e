"""Packing many small non-negative integers into the fixed-width slots of one big integer, and back.

Additively homomorphic encryption (Paillier) encrypts one integer below a ~2048-bit modulus at a time, and each
encryption costs a full modular exponentiation. Values of a few dozen bits waste almost all of that plaintext, so
`pack` lays `slots` values side by side, value `j` of a group in bits `[j * width, (j + 1) * width)` (slot 0 in the
least significant bits):

    m = sum_j u_j * 2**(j * width),   0 <= u_j < 2**width

Adding packed integers adds them slot by slot, *as long as no slot sum reaches 2**width* (a carry would spill into
the next slot). `slot_layout` picks `width = value_bits + headroom_bits(parties)` so that the sum of `parties`
values below `2**value_bits` each stays below `2**width`: `parties * (2**value_bits - 1) < 2**width`.

Slots are at most 64 bits wide, so NumPy `uint64` arrays hold them and the bit shuffling is vectorised
(`np.packbits` / `np.unpackbits`); only the final conversion to Python ints is a loop, one step per packed integer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: slots live in uint64 arrays
MAX_SLOT_BITS = 64

_LE_U64 = np.dtype("<u8")


def headroom_bits(parties: int) -> int:
    """`ceil(log2(parties))`: the extra bits a slot needs so that the sum of `parties` values cannot carry."""
    if isinstance(parties, bool) or not isinstance(parties, int) or parties < 1:
        raise ValueError(f"parties must be a positive int, got {parties!r}")
    return (parties - 1).bit_length()


def slot_layout(value_bits: int, parties: int, plaintext_bits: int, pack: bool = True) -> tuple[int, int]:
    """The slot `width` and the number of `slots` per packed integer.

    Args:
        value_bits: each value is below `2**value_bits`.
        parties: how many values may be summed in one slot.
        plaintext_bits: packed integers must stay below `2**plaintext_bits` (for Paillier: `n.bit_length() - 1`,
            since `n >= 2**(bits - 1)`).
        pack: False gives one value per integer (the naive layout), with the same slot width.

    Raises:
        ValueError: if a slot would be wider than 64 bits or no slot fits in the plaintext.
    """
    width = value_bits + headroom_bits(parties)
    if value_bits < 1 or width > MAX_SLOT_BITS:
        raise ValueError(
            f"a slot of {value_bits} value bits + {headroom_bits(parties)} headroom bits for {parties} parties is "
            f"{width} bits wide; at most {MAX_SLOT_BITS} fit (lower frac_bits or int_bits)"
        )
    slots = plaintext_bits // width
    if slots < 1:
        raise ValueError(f"a {width}-bit slot does not fit in a {plaintext_bits}-bit plaintext")
    return width, (slots if pack else 1)


def _check_layout(width: int, slots: int) -> None:
    if not 1 <= width <= MAX_SLOT_BITS or slots < 1:
        raise ValueError(f"need 1 <= width <= {MAX_SLOT_BITS} and slots >= 1, got width={width}, slots={slots}")


def pack(values: np.ndarray, width: int, slots: int) -> list[int]:
    """Pack a 1-d uint64 array into `ceil(len / slots)` integers of `slots` slots each (the last one zero-padded).

    Raises:
        ValueError: if a value does not fit in `width` bits.
    """
    _check_layout(width, slots)
    values = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    if width < MAX_SLOT_BITS and values.size and int(values.max()) >> width:
        raise ValueError(f"a value does not fit in a {width}-bit slot (max {int(values.max())})")
    count = values.size
    groups = -(-count // slots)
    padded = np.zeros(groups * slots, dtype=_LE_U64)
    padded[:count] = values
    # each value's `width` low bits, least significant first, then each group's slots * width bits as bytes
    bits = np.unpackbits(padded.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")[:, :width]
    rows = np.packbits(bits.reshape(groups, slots * width), axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in rows]


def unpack(packed: Sequence[int], width: int, slots: int) -> np.ndarray:
    """The `len(packed) * slots` slot values (uint64) of packed integers, padding slots included.

    Raises:
        ValueError: if an integer is negative or does not fit in `slots * width` bits (a carry out of the top slot).
    """
    _check_layout(width, slots)
    total_bits = slots * width
    nbytes = -(-total_bits // 8)
    chunks = []
    for i, m in enumerate(packed):
        m = int(m)
        if m < 0:
            raise ValueError(f"packed integer {i} is negative")
        if m.bit_length() > total_bits:
            raise ValueError(
                f"packed integer {i} has {m.bit_length()} bits, more than {slots} x {width}: a slot carried"
            )
        chunks.append(m.to_bytes(nbytes, "little"))
    if not chunks:
        return np.zeros(0, dtype=np.uint64)
    raw = np.frombuffer(b"".join(chunks), dtype=np.uint8).reshape(len(chunks), nbytes)
    bits = np.unpackbits(raw, axis=1, count=total_bits, bitorder="little").reshape(-1, width)
    if width < MAX_SLOT_BITS:
        bits = np.pad(bits, ((0, 0), (0, MAX_SLOT_BITS - width)))
    return np.packbits(bits, axis=1, bitorder="little").view(_LE_U64).reshape(-1).astype(np.uint64)
