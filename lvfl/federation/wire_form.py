"""Protobuf's wire form of an envelope, walked and written by hand: the security-critical first steps of decoding.

Everything here reads bytes a peer chose, before protobuf or the codec has checked any of them, so it is the part of
the decode path to review first. What it guarantees:

- Bounds before cost: the header is read with the payload left as bytes (`parse_envelope`, the header's fields at
  most `_MAX_HEAD_BYTES` together), so a receiver refuses a message for who sent it or what it is before it spends
  anything on the payload; the payload's values are counted on the wire bytes (`scan_payload`: at most `MAX_NODES`
  values, nested at most `MAX_DEPTH` deep, at most `MAX_DIMS` sizes in a shape) before protobuf builds any of them.
  Each walk stops at the first value past a bound, so what refusing costs is bounded too.
- No read out of bounds: every length is checked against the end of the message it lies in before it is stepped
  over, and every varint is read by one function (`_read_varint`), which refuses one cut short by the end of its
  bytes or longer than 64 bits. A one-byte varint (`byte < 0x80`) is read inline where speed counts: that is the
  reader's own first step, nothing else.
- No copy of bulk bytes: the payload comes back as a view of the envelope and a tensor's data as a view of the
  payload; `scan_payload` steps over bytes fields (tensor data, raw bytes, ints, text) without reading them.
- The same answer as protobuf: the fast paths (`_payload_first`, `tensor_fields`, the layout cache) take only the
  forms protobuf would read to the same fields, and hand anything else to the full walk or to protobuf's parser,
  which accept or refuse it in their own words.
- One-line refusals: each is a `FederationError` naming the sender (and the tag, once it is known) and the fault.

The one hand-written form is a one-tensor envelope's (`tensor_prefix`): the bytes protobuf itself writes, the form
`tensor_fields` and the layout cache read back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy
import torch
from google.protobuf.message import DecodeError

from lvfl.federation import FederationError
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.envelope_schema import ITEMSIZE, MAX_DEPTH, MAX_DIMS, MAX_NODES, NUMPY_VIEWS, SCHEMA, Header

__all__ = [
    "TensorBytes",
    "parse_envelope",
    "remember_layout",
    "remembered_tensor",
    "scan_payload",
    "tensor_fields",
    "tensor_prefix",
]

# the payload's wire form, as `scan_payload` walks it (envelope.proto): what each message's fields hold
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_VALUE, _ITEMS, _ENTRIES, _ENTRY, _RECORD, _TENSOR = range(6)
#: (the message being read, a field of it) -> the message that field holds, for the fields that hold values
_HOLDS = {
    (_VALUE, 1): _TENSOR,  # tensor: its shape's sizes are counted
    (_VALUE, 3): _ITEMS,  # list
    (_VALUE, 4): _ITEMS,  # tuple
    (_VALUE, 5): _ENTRIES,  # map
    (_VALUE, 8): _RECORD,  # record
    (_ITEMS, 1): _VALUE,
    (_ENTRIES, 1): _ENTRY,
    (_RECORD, 2): _ENTRY,
    (_ENTRY, 2): _VALUE,
}

#: the envelope's payload field (envelope.proto), and the most bytes its other fields may take together
_PAYLOAD_FIELD, _MAX_HEAD_BYTES = 9, 64 * 1024
_PAYLOAD_KEY = _PAYLOAD_FIELD << 3 | _LEN  # its key, where an envelope written payload first starts


# ------------------------------------------------------------------------------------------------- varints
def _read_varint(view: bytes | memoryview, pos: int, refusal: Callable[[], Exception]) -> tuple[int, int]:
    """The protobuf varint at `pos` of `view`, and the position after it: the one reader of a varint.

    `refusal()` is raised for a varint cut short by the end of `view`, or one longer than 64 bits.
    """
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise refusal()
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint_bytes(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_key(number: int, wire_type: int) -> bytes:
    return _varint_bytes(number << 3 | wire_type)


# ------------------------------------------------------------------------------------------------- writing
@functools.lru_cache(maxsize=256)
def tensor_prefix(name: str, shape: tuple[int, ...]) -> bytes:
    """The bytes of an envelope's payload field holding a tensor of dtype `name` and `shape`, up to its data."""
    size = math.prod(shape) * ITEMSIZE[name]
    fields = _field_key(1, _LEN) + _varint_bytes(len(name)) + name.encode()  # Tensor.dtype
    if shape:  # proto3 leaves out an empty repeated field, and empty bytes
        packed = b"".join(_varint_bytes(n) for n in shape)
        fields += _field_key(2, _LEN) + _varint_bytes(len(packed)) + packed  # Tensor.shape, packed
    if size:
        fields += _field_key(3, _LEN) + _varint_bytes(size)  # Tensor.data, then its bytes
    tensor_size = len(fields) + size
    value = _field_key(1, _LEN) + _varint_bytes(tensor_size)  # Value.tensor
    return _field_key(9, _LEN) + _varint_bytes(len(value) + tensor_size) + value + fields  # Envelope.payload


# ------------------------------------------------------------------------------------------------- the envelope
def parse_envelope(data: bytes, *, sender: str) -> tuple[Header, memoryview]:
    """The header of `data`, which `sender` sent, and its payload still encoded; refuses what is not an envelope.

    The payload is neither parsed nor copied: the envelope's top-level fields are walked on the bytes, the header's
    (a few short strings and numbers) parsed by protobuf (`EnvelopeHead`), and the payload returned as a view of
    `data`. A receiver can so refuse a message for its header (wrong run, wrong sender, a peer it holds too much
    of) having spent nothing on its payload; `lvfl.federation.codec.decode_payload` then bounds and decodes it.
    """
    fast = _payload_first(data)
    if fast is not None:
        envelope, start, end = fast
    else:
        head, start, end = _split_envelope(data, sender)
        try:
            envelope = pb.EnvelopeHead.FromString(head)
        except DecodeError as err:
            raise FederationError(f"{sender} sent {len(data)} bytes that are not an lvfl envelope ({err})") from None
    if envelope.schema != SCHEMA:
        what = "no schema number" if envelope.schema == 0 else f"schema {envelope.schema}; this lvfl reads {SCHEMA}"
        raise FederationError(f"{sender} sent {len(data)} bytes that are not an lvfl envelope ({what})")
    if start is None:
        raise FederationError(f"{sender} sent {envelope.tag!r} without a payload")
    e = envelope
    header = Header(e.run_id, e.src, e.dst, e.tag, e.step, e.seq, e.fingerprint)
    return header, memoryview(data)[start:end]


def _payload_first(data: bytes) -> tuple[Any, int, int] | None:
    """The header of an envelope written payload first (as lvfl writes a tensor's), and the payload's span; else None.

    The header is every byte behind the payload, parsed by protobuf in one call. Taken only where the walk of
    `_split_envelope` would find the same: the payload field's length is a varint of at most 5 bytes that ends
    within `data`; behind it at most `_MAX_HEAD_BYTES`, which protobuf parses into the header's own fields, each
    once, in their canonical form (its size as protobuf would write them is theirs) with no payload and no unknown
    field among them. Anything else, refusals included, is `_split_envelope`'s, in its words.
    """
    size = len(data)
    if size < 2 or data[0] != _PAYLOAD_KEY:
        return None
    try:
        length, pos = _read_varint(data, 1, ValueError)
    except ValueError:
        return None
    if pos > 1 + 5:  # a length of more than 5 bytes
        return None
    end = pos + length
    if end > size or size - end > _MAX_HEAD_BYTES:
        return None
    tail = data[end:]
    try:
        head = pb.EnvelopeHead.FromString(tail)
    except DecodeError:
        return None
    if head.HasField("payload"):
        return None
    head.DiscardUnknownFields()
    if head.ByteSize() != len(tail):  # an unknown field, a field given twice or not canonically: the walk's
        return None
    return head, pos, end


def _split_envelope(data: bytes, sender: str) -> tuple[bytes, int | None, int | None]:
    """The envelope's fields other than the payload, as bytes, and where the payload's bytes start and end.

    Refuses bytes that do not walk as a protobuf message, a payload given twice (protobuf would merge the two), and
    header fields longer than `_MAX_HEAD_BYTES` together (names, a run ID and a fingerprint are short). Written for
    speed (a party waits on every message): a one-byte varint (every key and header length here) is read inline,
    as `_read_varint`'s first step; a longer one by `_read_varint`.
    """
    size = len(data)
    start = end = key_at = None
    pos = 0

    def refuse(why: str) -> FederationError:
        return FederationError(f"{sender} sent {size} bytes that are not an lvfl envelope ({why})")

    def truncated() -> FederationError:
        return refuse("a truncated or overlong varint")

    view = memoryview(data)
    while pos < size:
        field_start = pos
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(view, pos, truncated)
        wire_type = key & 7
        if wire_type == _LEN:
            if pos >= size:
                raise truncated()
            length = data[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _read_varint(view, pos, truncated)
            if pos + length > size:
                raise refuse("a field runs past the end")
            if key >> 3 == _PAYLOAD_FIELD:
                if start is not None:
                    raise refuse("two payloads")
                key_at, start, end = field_start, pos, pos + length
            pos += length
        elif wire_type == _VARINT:
            if pos < size and data[pos] < 0x80:
                pos += 1
            else:
                _, pos = _read_varint(view, pos, truncated)
        elif wire_type in (_I64, _I32):
            pos += 8 if wire_type == _I64 else 4
            if pos > size:
                raise refuse("a field runs past the end")
        else:
            raise refuse(f"wire type {wire_type}")
    if size - (0 if start is None else end - key_at) > _MAX_HEAD_BYTES:
        raise refuse(f"a header of more than {_MAX_HEAD_BYTES} bytes")
    head = bytes(data) if start is None else b"".join((view[:key_at], view[end:]))
    return head, start, end


# ------------------------------------------------------------------------------------------------- the payload
def scan_payload(data: bytes, *, sender: str, tag: str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> int:
    """The number of values an encoded payload holds, counted on its wire bytes; refused past the bounds.

    The bounds: at most `max_nodes` values (each size of a tensor's shape counted as one), nested at most
    `max_depth` deep, and at most `MAX_DIMS` sizes in a tensor's shape.

    Why on the bytes: protobuf's parser builds an object for every value, tens of bytes each for a value that takes
    two or four bytes on the wire (a list of ten million `None`s is 40 MB to receive and half a gigabyte parsed), and
    a receiver cannot bound what it has not counted. The walk stops at the first value past the bound, so what it
    costs is bounded too; bytes fields (tensor data, raw bytes, ints, text) are stepped over, never copied.

    Raises:
        FederationError: more than `max_nodes` values, nesting deeper than `max_depth`, or bytes that are not a
            well-formed payload, naming `sender` and `tag`.
    """
    view, end_of_data = memoryview(data), len(data)
    stack = [(end_of_data, _VALUE, 0)]  # (where the message ends, which message, its depth in values)
    pos, nodes, dims = 0, 1, 0  # dims: sizes in the shape of the tensor being read

    def refuse(what: str) -> FederationError:
        return FederationError(f"{sender} sent {tag!r} with {what}")

    def varint() -> int:
        nonlocal pos
        value, pos = _read_varint(view, pos, lambda: refuse("a payload that is not an lvfl value (a truncated varint)"))
        return value

    def count_sizes(dims: int, nodes: int, added: int) -> int:
        """A tensor's sizes count as values (protobuf keeps each): refused past MAX_DIMS, or past max_nodes."""
        if dims > MAX_DIMS:
            raise refuse(f"a tensor of {dims} dimensions (at most {MAX_DIMS})")
        if nodes + added > max_nodes:
            raise refuse(f"more than {max_nodes} values (max_nodes); lvfl sends bulk data as tensors")
        return nodes + added

    while stack:
        end, kind, depth = stack[-1]
        if pos >= end:
            if pos > end:
                raise refuse("a payload that is not an lvfl value (a field runs past its message)")
            stack.pop()
            continue
        key = varint()
        field, wire_type = key >> 3, key & 7
        shape = kind == _TENSOR and field == 2  # a size of a tensor's shape (a varint), or all of them packed
        if wire_type == _LEN:
            length = varint()
            child_end = pos + length
            if child_end > end:
                raise refuse("a payload that is not an lvfl value (a field runs past its message)")
            if shape:  # packed varints: one ends at each byte below 0x80, ten bytes at most each
                if length > 10 * MAX_DIMS:
                    raise refuse(f"a tensor whose shape takes {length} bytes (at most {MAX_DIMS} sizes)")
                added = sum(byte < 0x80 for byte in view[pos:child_end])
                dims += added
                nodes = count_sizes(dims, nodes, added)
            child = _HOLDS.get((kind, field))
            if child is None:  # bytes: a tensor's data, raw bytes, an int, a text, a name; or a message of no value
                pos = child_end
                continue
            child_depth = depth + (child == _VALUE)
            if child == _TENSOR:
                dims = 0
            if child == _VALUE:
                nodes += 1
                if nodes > max_nodes:
                    raise refuse(f"more than {max_nodes} values (max_nodes); lvfl sends bulk data as tensors")
                if child_depth > max_depth:
                    raise refuse(f"values nested deeper than {max_depth} levels")
            stack.append((child_end, child, child_depth))
        elif wire_type == _VARINT:
            varint()
            if shape:
                dims += 1
                nodes = count_sizes(dims, nodes, 1)
        elif wire_type in (_I64, _I32):
            pos += 8 if wire_type == _I64 else 4
        else:
            raise refuse(f"a payload that is not an lvfl value (wire type {wire_type})")
    return nodes


def tensor_fields(view: memoryview) -> tuple[str, tuple[int, ...], memoryview] | None:
    """A payload of one tensor in the form lvfl and protobuf write it: its dtype name, shape and data (a view).

    None for anything else (another value, a field out of order, given twice or unknown, bytes that do not walk),
    which protobuf's parser then reads, and refuses in its own words. Written for speed, as `_split_envelope` is.
    The name, shape and size are not checked here: the codec checks them before it copies the data.
    """
    size = len(view)
    try:
        pos, end = _expect_field(view, 0, size, 1)  # Value.tensor
        if end != size:
            return None
        pos, name_end = _expect_field(view, pos, end, 1)  # Tensor.dtype
        name = bytes(view[pos:name_end]).decode("ascii")
        pos, shape, data = name_end, [], view[0:0]
        if pos < end and view[pos] == 2 << 3 | _LEN:  # Tensor.shape, packed
            pos, shape_end = _expect_field(view, pos, end, 2)
            if shape_end - pos > 10 * MAX_DIMS:
                return None
            while pos < shape_end:
                dim = view[pos]
                if dim < 0x80:
                    pos += 1
                else:
                    dim, pos = _read_varint(view, pos, ValueError)
                shape.append(dim)
            if pos != shape_end:
                return None
        if pos < end:  # Tensor.data
            pos, data_end = _expect_field(view, pos, end, 3)
            data, pos = view[pos:data_end], data_end
    except (ValueError, UnicodeDecodeError):
        return None
    return (name, tuple(shape), data) if pos == end else None


def _expect_field(view: memoryview, pos: int, end: int, number: int) -> tuple[int, int]:
    """Where the LEN field `number` at `pos` starts and ends; ValueError unless it is there and within `end`."""
    if pos + 1 >= end or view[pos] != number << 3 | _LEN:
        raise ValueError
    length, start = view[pos + 1], pos + 2
    if length >= 0x80:
        length, start = _read_varint(view, pos + 1, ValueError)
    if start + length > end:
        raise ValueError
    return start, start + length


# ------------------------------------------------------------------------------------------------- the layout cache
class TensorBytes:
    """A tensor's checked bytes, copied into the tensor by whoever takes it (`tensor`), not by who checked them.

    Why: a party's server thread checks a message and the protocol's thread uses it. The copy, made where the tensor
    is used next, leaves its bytes in that thread's core's cache, not in the other's (they cross the machine's
    caches once, not twice, on a party that waits on each message).
    """

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, data: memoryview, dtype: numpy.dtype, shape: tuple[int, ...]) -> None:
        self.data, self.dtype, self.shape = data, dtype, shape

    def wire_nbytes(self) -> int:
        """The tensor's bytes, as `lvfl.wire.payload_nbytes` counts a tensor's."""
        return len(self.data)

    def tensor(self) -> torch.Tensor:
        """The tensor, writable and owning its bytes (one copy)."""
        return torch.from_numpy(numpy.frombuffer(bytearray(self.data), dtype=self.dtype).reshape(self.shape))


#: the one-tensor payloads the codec read and accepted, by their length: the bytes before the tensor's data, its
#: numpy dtype and shape. Equal leading bytes and length walk to the same fields, so the next such payload is read
#: without the walk or the checks (a party reads a tensor of the same form every step).
_LAYOUTS: dict[int, tuple[bytes, numpy.dtype, tuple[int, ...]]] = {}
_MAX_LAYOUTS = 1024


def remembered_tensor(data: bytes | memoryview) -> TensorBytes | None:
    """The tensor of a payload of a form `remember_layout` kept (its length and the bytes before its data); else None.

    Its bytes are not copied: they follow the remembered bytes, of the remembered dtype and shape.
    """
    layout = _LAYOUTS.get(len(data))
    if layout is None or data[: len(layout[0])] != layout[0]:
        return None
    prefix, array_dtype, shape = layout
    return TensorBytes(data[len(prefix) :], array_dtype, shape)


def remember_layout(data: bytes | memoryview, fields: tuple[str, tuple[int, ...], memoryview]) -> None:
    """Keep the form of a one-tensor payload the codec accepted, where `remembered_tensor` finds it.

    Only a form the codec checked may be kept: `fields` are the payload's `tensor_fields`, accepted as a tensor.
    """
    name, shape, values = fields
    if name not in NUMPY_VIEWS or name == "bool" or not len(values):
        return
    if len(_LAYOUTS) >= _MAX_LAYOUTS:  # a run uses a few forms; a peer sending ever new ones only churns this
        _LAYOUTS.clear()
    _LAYOUTS[len(data)] = (bytes(data[: len(data) - len(values)]), NUMPY_VIEWS[name], shape)
