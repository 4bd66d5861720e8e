"""Payloads to protobuf and back: a typed `Value` tree in an `Envelope`, checked field by field on the way in.

Why not pickle: a pickle runs code chosen by whoever wrote it, so a party that unpickled a peer's message would
hand that peer its process. Here a message is data only (schema in ``envelope.proto``): tensors as dtype + shape +
little-endian bytes, `bytes`, lists, tuples, str-keyed dicts, ints of any size (a 4096-bit Paillier ciphertext),
str, bool, float, None, and *records*: objects of a type registered on an explicit allow-list
(`register_record`), carried as their registered name and str-keyed fields.

Decoding trusts nothing, and spends nothing before it has checked: the header is read first with the payload left
as bytes (`parse_envelope`), so a receiver refuses a message for who sent it or what it is before parsing it; the
payload's values are then counted on the wire bytes themselves (`scan_payload`: at most `MAX_NODES` values, nested at
most `MAX_DEPTH` deep) before protobuf builds any of them, since a few bytes per value on the wire cost tens of
bytes each once parsed; dtype names come from a fixed table, a tensor's shape times its item size must equal its
buffer's length before anything is allocated, a bool tensor holds only bytes 0 and 1, a dict key or record field
appears once, and a record type that is not registered is refused. `conform` then checks a payload against what the
receiver expects (`expected`: a tensor of the dtype and shape it expects, a `meta` tensor will do, or a dict /
list / tuple of them). Each refusal is one `FederationError` line naming the sender, the tag and the fault:
``party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]``.

Decoded tensors are bit-identical to the sent ones, on the CPU, writable and detached (they own a copy of the
bytes, not a view into the protobuf message).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy
import torch
from google.protobuf.message import DecodeError

from lvfl.federation import FederationError
from lvfl.federation import envelope_pb2 as pb

__all__ = [
    "DTYPES",
    "MAX_DEPTH",
    "MAX_INT_BYTES",
    "RECORDS",
    "SCHEMA",
    "Header",
    "RecordRegistry",
    "TensorBytes",
    "RecordType",
    "conform",
    "decode_envelope",
    "decode_payload",
    "decode_value",
    "describe",
    "dtype_from_name",
    "dtype_name",
    "encode_envelope",
    "encode_value",
    "parse_envelope",
    "printable",
    "register_record",
    "scan_payload",
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
_ITEMSIZE = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in DTYPES.items()}
#: the dtypes whose tensors are encoded and decoded through numpy's buffer on a little-endian host, with the same
#: bytes as the general path: on a party that waits on each message, a torch call's dispatch and each copy of the
#: tensor's bytes cost several times what they cost in a loop (the TLS and gRPC work in between evicts the caches)
_NUMPY_VIEWS = (
    {name: torch.empty((), dtype=dtype).numpy().dtype for name, dtype in DTYPES.items() if dtype is not torch.bfloat16}
    if sys.byteorder == "little"
    else {}
)
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


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


# ------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class RecordType:
    """An allow-listed type: its wire name, and how it becomes str-keyed fields and back."""

    name: str
    cls: type
    to_fields: Callable[[Any], Mapping[str, Any]]
    from_fields: Callable[[dict[str, Any]], Any]


class RecordRegistry:
    """The record types a party accepts, by wire name and by class; a type not in it is refused on both ends.

    The process-wide allow-list is `RECORDS`; a test may build its own so that it does not change what every
    other test accepts.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, RecordType] = {}
        self._by_class: dict[type, RecordType] = {}

    def register(
        self,
        name: str,
        cls: type,
        to_fields: Callable[[Any], Mapping[str, Any]] | None = None,
        from_fields: Callable[[dict[str, Any]], Any] | None = None,
    ) -> type:
        """Allow `cls` on the wire as `name`; see `register_record`."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a record type needs a non-empty name, got {name!r}")
        if not isinstance(cls, type):
            raise TypeError(f"record type {name!r}: cls must be a class, got {cls!r}")
        if to_fields is None or from_fields is None:
            if not dataclasses.is_dataclass(cls):
                raise TypeError(
                    f"record type {name!r}: {cls.__qualname__} is not a dataclass; give to_fields and from_fields"
                )
            to_fields = to_fields or _dataclass_fields
            from_fields = from_fields or (lambda fields: cls(**fields))
        for known in (self._by_name.get(name), self._by_class.get(cls)):
            if known is not None and (known.name, known.cls) != (name, cls):
                raise ValueError(
                    f"record type {name!r} ({cls.__qualname__}) clashes with {known.name!r} ({known.cls.__qualname__}),"
                    " registered before"
                )
        entry = RecordType(name, cls, to_fields, from_fields)
        self._by_name[name] = self._by_class[cls] = entry
        return cls

    def by_name(self, name: str) -> RecordType | None:
        """The record type registered as `name`, if any."""
        return self._by_name.get(name)

    def by_class(self, cls: type) -> RecordType | None:
        """The record type registered for exactly `cls` (not a subclass), if any."""
        return self._by_class.get(cls)

    def names(self) -> tuple[str, ...]:
        """The registered wire names, in registration order."""
        return tuple(self._by_name)


def _dataclass_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, shallow (nested values are encoded by the codec, not by `asdict`)."""
    return {field.name: getattr(obj, field.name) for field in dataclasses.fields(obj)}


#: the process-wide allow-list that `encode_value` and `decode_value` use unless given another
RECORDS = RecordRegistry()


def register_record(
    name: str,
    cls: type,
    to_fields: Callable[[Any], Mapping[str, Any]] | None = None,
    from_fields: Callable[[dict[str, Any]], Any] | None = None,
    registry: RecordRegistry = RECORDS,
) -> type:
    """Allow objects of exactly `cls` on the wire, under the name `name`; returns `cls`.

    A module that defines a type it sends calls this at import time (it imports only this module, which imports
    no protocol or privacy code, so no cycle arises). Registering the same name and class again replaces the
    functions; a name or class already taken by another pairing is refused.

    Args:
        name: the wire name, stable across versions (e.g. "lvfl.PaillierShare").
        cls: the class; subclasses are not covered.
        to_fields: object -> str-keyed fields, each itself a sendable value. Default for a dataclass: its fields.
        from_fields: fields -> object. It must validate what it is given (they come from a peer) and raise
            `TypeError`, `ValueError` or `KeyError` on bad input: the codec turns that into a one-line refusal.
            Default for a dataclass: ``cls(**fields)``, which checks the field names but not their types.
        registry: the allow-list to add to; the process-wide `RECORDS` unless a test keeps its own.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Point:
        ...     x: int
        ...     y: int
        >>> _ = register_record("example.Point", Point, registry=(registry := RecordRegistry()))
        >>> decode_value(encode_value(Point(1, 2), registry), sender="party1", tag="p", records=registry)
        Point(x=1, y=2)
    """
    return registry.register(name, cls, to_fields, from_fields)


# ------------------------------------------------------------------------------------------------- encoding
def encode_value(payload: Any, records: RecordRegistry = RECORDS) -> pb.Value:
    """`payload` as a protobuf `Value`; a `TypeError` naming the place of anything that cannot be sent."""
    out = pb.Value()
    _encode(payload, out, records, "", 0)
    return out


def _encode(obj: Any, out: pb.Value, records: RecordRegistry, path: str, depth: int) -> None:
    at = f" at {path}" if path else ""
    if depth > MAX_DEPTH:
        raise ValueError(f"payload nests deeper than {MAX_DEPTH} levels{at}")
    record = records.by_class(type(obj))
    if record is not None:
        out.record.type = record.name
        out.record.SetInParent()
        for key, value in _str_keyed(record.to_fields(obj), f"record {record.name!r}{at}").items():
            entry = out.record.fields.add(key=key)
            _encode(value, entry.value, records, _field_path(path, key), depth + 1)
    elif isinstance(obj, torch.Tensor):
        _encode_tensor(obj, out.tensor, at)
    elif isinstance(obj, bool):
        out.boolean = obj
    elif isinstance(obj, int):
        size = (obj.bit_length() + 8) // 8  # room for the sign bit
        if size > MAX_INT_BYTES:
            raise ValueError(f"an int of {obj.bit_length()} bits{at} is over the {8 * MAX_INT_BYTES}-bit limit")
        out.integer = obj.to_bytes(size, "big", signed=True)
    elif isinstance(obj, float):
        out.real = obj
    elif isinstance(obj, str):
        out.text = obj
    elif isinstance(obj, bytes | bytearray | memoryview):
        out.raw = bytes(obj)
    elif obj is None:
        out.none.SetInParent()
    elif isinstance(obj, dict):
        out.map.SetInParent()
        for key, value in _str_keyed(obj, f"dict{at}").items():
            _encode(value, out.map.entries.add(key=key).value, records, f"{path}[{key!r}]", depth + 1)
    elif isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):  # a namedtuple would lose its names
        items = out.tuple if isinstance(obj, tuple) else out.list
        items.SetInParent()
        for i, value in enumerate(obj):
            _encode(value, items.items.add(), records, f"{path}[{i}]", depth + 1)
    else:
        raise TypeError(
            f"cannot send a {type(obj).__qualname__}{at}: lvfl sends tensors, bytes, int, float, str, bool, None, "
            "lists, tuples, str-keyed dicts and registered records (lvfl.federation.codec.register_record)"
        )


def _field_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _str_keyed(mapping: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    bad = [key for key in mapping if not isinstance(key, str)]
    if bad:
        raise TypeError(f"{what} has a key that is not a str: {bad[0]!r}")
    return mapping


def _encode_tensor(tensor: torch.Tensor, out: pb.Tensor, at: str) -> None:
    if tensor.layout is not torch.strided or tensor.is_meta or tensor.is_quantized:
        raise TypeError(f"cannot send a {tensor.layout} / meta / quantized tensor{at}: only dense tensors with data")
    try:
        name = dtype_name(tensor.dtype)
    except TypeError as err:
        raise TypeError(f"{err}{at}") from None
    out.dtype = name
    out.shape.extend(tensor.shape)
    array = _plain_array(tensor, name)
    if array is not None:  # the common case, through numpy's buffer (see _NUMPY_VIEWS)
        out.data = array.tobytes()
        return
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    out.data = _little_endian(flat.view(torch.uint8), flat.dtype).numpy().tobytes()


def _plain_array(tensor: torch.Tensor, name: str | None) -> numpy.ndarray | None:
    """`tensor` as a numpy array on its own memory, where its bytes are its values as they are, else None.

    As they are: a dtype in `_NUMPY_VIEWS` (`name`, its wire name), dense, on the CPU, contiguous, with no lazy
    conjugate or negation.
    """
    if name not in _NUMPY_VIEWS or tensor.layout is not torch.strided or not tensor.is_cpu:
        return None
    if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
        return None
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


def _little_endian(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Element bytes in little-endian order (a no-op on little-endian hosts; a byte swap per scalar otherwise)."""
    width = _ITEMSIZE[dtype_name(dtype)] // (2 if dtype.is_complex else 1)
    if sys.byteorder == "little" or width == 1:
        return raw
    return raw.reshape(-1, width).flip(-1).reshape(-1)  # pragma: no cover (big-endian hosts only)


# ------------------------------------------------------------------------------------------------- envelopes
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


def encode_envelope(header: Header, payload: Any, records: RecordRegistry = RECORDS) -> bytes:
    """The serialized envelope carrying `payload` under `header`."""
    if type(payload) is torch.Tensor:  # most messages: one tensor, joined by hand where it can be (`_tensor_envelope`)
        data = _tensor_envelope(_head(pb.EnvelopeHead, header).SerializeToString(), payload)
        if data is not None:
            return data
    envelope = _head(pb.Envelope, header)  # Header's fields are Envelope's
    _encode(payload, envelope.payload, records, "", 0)
    return envelope.SerializeToString()


def _head(message: type, header: Header) -> Any:
    """An `Envelope` or `EnvelopeHead` holding `header`'s fields (named one by one: `asdict` deep-copies)."""
    return message(
        schema=SCHEMA,
        run_id=header.run_id,
        src=header.src,
        dst=header.dst,
        tag=header.tag,
        step=header.step,
        seq=header.seq,
        fingerprint=header.fingerprint,
    )


def _tensor_envelope(head: bytes, tensor: torch.Tensor) -> bytes | None:
    """The envelope of `head`'s fields and `tensor`, payload first, or None off the common case.

    The common case: a tensor `_plain_array` reads in place; the bytes are tested to parse as protobuf's own
    envelope, of its size. Why by hand: a launched step is a chain of messages each party waits on, and protobuf's
    way copies the tensor's bytes into a message and out again; this copies them once, with two torch calls, behind
    the fields before them (the same for every message of a dtype and shape, so built once). Why payload first
    (protobuf reads fields in any order): the receiver finds the header behind one length, without walking it
    (`_payload_first`).
    """
    name = _DTYPE_NAMES.get(tensor.dtype)
    data = _plain_array(tensor, name)
    if data is None:
        return None
    return b"".join((_tensor_prefix(name, tensor.shape), data, head))


@functools.lru_cache(maxsize=256)
def _tensor_prefix(name: str, shape: tuple[int, ...]) -> bytes:
    """The bytes of an envelope's payload field holding a tensor of dtype `name` and `shape`, up to its data."""
    size = math.prod(shape) * _ITEMSIZE[name]
    fields = _field_key(1, _LEN) + _varint_bytes(len(name)) + name.encode()  # Tensor.dtype
    if shape:  # proto3 leaves out an empty repeated field, and empty bytes
        packed = b"".join(_varint_bytes(n) for n in shape)
        fields += _field_key(2, _LEN) + _varint_bytes(len(packed)) + packed  # Tensor.shape, packed
    if size:
        fields += _field_key(3, _LEN) + _varint_bytes(size)  # Tensor.data, then its bytes
    tensor_size = len(fields) + size
    value = _field_key(1, _LEN) + _varint_bytes(tensor_size)  # Value.tensor
    return _field_key(9, _LEN) + _varint_bytes(len(value) + tensor_size) + value + fields  # Envelope.payload


def _field_key(number: int, wire_type: int) -> bytes:
    return _varint_bytes(number << 3 | wire_type)


def _varint_bytes(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def parse_envelope(data: bytes, *, sender: str) -> tuple[Header, memoryview]:
    """The header of `data`, which `sender` sent, and its payload still encoded; refuses what is not an envelope.

    The payload is neither parsed nor copied: the envelope's top-level fields are walked on the bytes, the header's
    (a few short strings and numbers) parsed by protobuf (`EnvelopeHead`), and the payload returned as a view of
    `data`. A receiver can so refuse a message for its header (wrong run, wrong sender, a peer it holds too much
    of) having spent nothing on its payload; `decode_payload` then bounds and decodes it.
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


def _varint(view: memoryview, pos: int, refusal: Callable[[], FederationError]) -> tuple[int, int]:
    """The protobuf varint at `pos` of `view`, and the position after it.

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


#: the envelope's payload field (envelope.proto), and the most bytes its other fields may take together
_PAYLOAD_FIELD, _MAX_HEAD_BYTES = 9, 64 * 1024
_PAYLOAD_KEY = _PAYLOAD_FIELD << 3 | 2  # its key (wire type LEN), where an envelope written payload first starts


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
    length = shift = 0
    pos = 1
    while True:
        if pos >= size or pos > 5:
            return None
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
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
    speed (a party waits on every message): a one-byte varint (every key and header length here) is read inline.
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
            key, pos = _varint(view, pos, truncated)
        wire_type = key & 7
        if wire_type == _LEN:
            if pos >= size:
                raise truncated()
            length = data[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _varint(view, pos, truncated)
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
                _, pos = _varint(view, pos, truncated)
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


def decode_envelope(
    data: bytes, *, sender: str, expected: Any = None, records: RecordRegistry = RECORDS
) -> tuple[Header, Any]:
    """`parse_envelope`, `decode_payload` and `conform` in one: the header and the checked payload."""
    header, payload = parse_envelope(data, sender=sender)
    value = decode_payload(payload, sender=sender, tag=header.tag, records=records)
    conform(value, expected, sender=sender, tag=header.tag)
    return header, value


def decode_payload(
    data: bytes | memoryview,
    *,
    sender: str,
    tag: str,
    records: RecordRegistry = RECORDS,
    max_nodes: int = MAX_NODES,
    max_depth: int = MAX_DEPTH,
    deferred: bool = False,
) -> Any:
    """The payload an envelope's payload bytes encode: counted (`scan_payload`), parsed, then decoded and checked.

    A payload of fewer bytes than `max_nodes` is not counted: every value takes at least a byte on the wire (each
    size of a shape one, any other value two), so it cannot hold more; the decoding checks its depth and shapes.
    With `deferred`, a tensor of a form read before comes as its `TensorBytes`, checked, its bytes not yet copied.
    """
    size = len(data)
    if size >= max_nodes:
        scan_payload(data, sender=sender, tag=tag, max_nodes=max_nodes, max_depth=max_depth)
    layout = _LAYOUTS.get(size)
    if layout is not None and data[: len(layout[0])] == layout[0]:  # a tensor's form seen before: its data follows
        prefix, array_dtype, shape = layout
        known = TensorBytes(data[len(prefix) :], array_dtype, shape)
        return known if deferred else known.tensor()
    fields = _tensor_fields(memoryview(data))
    if fields is not None:  # most messages: one tensor, read off the bytes with one copy of its data
        tensor = _Decoder(sender, tag, records, max_depth).tensor_of(*fields, "")
        _remember_layout(data, fields)
        return tensor
    try:
        value = pb.Value.FromString(data)
    except DecodeError as err:
        raise FederationError(f"{sender} sent {tag!r} with a payload that is not an lvfl value ({err})") from None
    return decode_value(value, sender=sender, tag=tag, records=records, max_depth=max_depth)


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


#: the one-tensor payloads `decode_payload` read and accepted, by their length: the bytes before the tensor's data,
#: its numpy dtype and shape. Equal leading bytes and length walk to the same fields, so the next such payload is
#: read without the walk or the checks (a party reads a tensor of the same form every step).
_LAYOUTS: dict[int, tuple[bytes, numpy.dtype, tuple[int, ...]]] = {}
_MAX_LAYOUTS = 1024


def _remember_layout(data: bytes | memoryview, fields: tuple[str, tuple[int, ...], memoryview]) -> None:
    """Keep the form of a one-tensor payload `decode_payload` accepted, where its fast path can read it."""
    name, shape, values = fields
    if name not in _NUMPY_VIEWS or name == "bool" or not len(values):
        return
    if len(_LAYOUTS) >= _MAX_LAYOUTS:  # a run uses a few forms; a peer sending ever new ones only churns this
        _LAYOUTS.clear()
    _LAYOUTS[len(data)] = (bytes(data[: len(data) - len(values)]), _NUMPY_VIEWS[name], shape)


def _tensor_fields(view: memoryview) -> tuple[str, tuple[int, ...], memoryview] | None:
    """A payload of one tensor in the form lvfl and protobuf write it: its dtype name, shape and data (a view).

    None for anything else (another value, a field out of order, given twice or unknown, bytes that do not walk),
    which protobuf's parser then reads, and refuses in its own words. Written for speed, as `_split_envelope` is.
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
                    dim, pos = _varint(view, pos, ValueError)
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
        length, start = _varint(view, pos + 1, ValueError)
    if start + length > end:
        raise ValueError
    return start, start + length


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
        value, pos = _varint(view, pos, lambda: refuse("a payload that is not an lvfl value (a truncated varint)"))
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


# ------------------------------------------------------------------------------------------------- decoding
def decode_value(
    value: pb.Value, *, sender: str, tag: str, records: RecordRegistry = RECORDS, max_depth: int = MAX_DEPTH
) -> Any:
    """The payload `value` encodes, checked throughout; a one-line `FederationError` naming `sender` and `tag`."""
    return _Decoder(sender, tag, records, max_depth).decode(value, "", 0)


class _Decoder:
    """One payload's decoding: carries who sent it, for the refusals."""

    def __init__(self, sender: str, tag: str, records: RecordRegistry, max_depth: int) -> None:
        self.sender, self.tag, self.records, self.max_depth = sender, tag, records, max_depth

    def refuse(self, path: str, what: str) -> FederationError:
        at = f" at {path}" if path else ""
        return FederationError(f"{self.sender} sent {self.tag!r}{at} with {what}")

    def decode(self, value: pb.Value, path: str, depth: int) -> Any:
        if depth > self.max_depth:
            raise self.refuse("", f"values nested deeper than {self.max_depth} levels")
        kind = value.WhichOneof("kind")
        if kind == "tensor":
            return self.tensor(value.tensor, path)
        if kind == "raw":
            return value.raw
        if kind in ("list", "tuple"):
            items = [self.decode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(getattr(value, kind).items)]
            return items if kind == "list" else tuple(items)
        if kind == "map":
            return self.entries(value.map.entries, path, depth, lambda key: f"{path}[{key!r}]", "key")
        if kind == "integer":
            return self.integer(value.integer, path)
        if kind == "text":
            return value.text
        if kind == "record":
            return self.record(value.record, path, depth)
        if kind == "boolean":
            return value.boolean
        if kind == "none":
            return None
        if kind == "real":
            return value.real
        raise self.refuse(path, "an empty value (no kind set)")

    def entries(self, entries: Any, path: str, depth: int, where: Callable[[str], str], what: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for entry in entries:
            if entry.key in out:
                raise self.refuse(path, f"the {what} {entry.key!r} twice")
            if not entry.HasField("value"):
                raise self.refuse(where(entry.key), "an empty value (no kind set)")
            out[entry.key] = self.decode(entry.value, where(entry.key), depth + 1)
        return out

    def integer(self, data: bytes, path: str) -> int:
        if not 0 < len(data) <= MAX_INT_BYTES:
            raise self.refuse(path, f"an int of {len(data)} bytes (1 to {MAX_INT_BYTES} accepted)")
        return int.from_bytes(data, "big", signed=True)

    def record(self, record: pb.Record, path: str, depth: int) -> Any:
        known = self.records.by_name(record.type)
        if known is None:
            allowed = ", ".join(repr(n) for n in self.records.names()) or "none"
            raise self.refuse(path, f"a record of unknown type {record.type!r} (allowed: {allowed})")
        fields = self.entries(record.fields, path, depth, lambda key: _field_path(path, key), f"{record.type} field")
        try:
            return known.from_fields(fields)
        except (TypeError, ValueError, KeyError) as err:
            message = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise self.refuse(path, f"a malformed {record.type} record: {message}") from None

    def tensor(self, tensor: pb.Tensor, path: str) -> torch.Tensor:
        return self.tensor_of(tensor.dtype, tuple(tensor.shape), tensor.data, path)

    def tensor_of(self, name: str, shape: tuple[int, ...], data: bytes | memoryview, path: str) -> torch.Tensor:
        """The tensor of dtype `name` and `shape` whose bytes are `data`, copied once (writable, owned)."""
        if name not in DTYPES:
            raise self.refuse(path, f"a tensor of unknown dtype {name!r}")
        if len(shape) > MAX_DIMS:
            raise self.refuse(path, f"a tensor of {len(shape)} dimensions (at most {MAX_DIMS})")
        if math.prod(max(size, 1) for size in shape) * _ITEMSIZE[name] >= 2**62:  # torch's sizes are int64
            raise self.refuse(path, f"a {name} {list(shape)} tensor: a shape too large for any tensor")
        needed = math.prod(shape) * _ITEMSIZE[name]
        if needed != len(data):
            raise self.refuse(
                path, f"a {name} {list(shape)} tensor in {len(data)} bytes of data; that shape needs {needed}"
            )
        dtype = DTYPES[name]
        if needed == 0:
            return torch.empty(shape, dtype=dtype)
        if name in _NUMPY_VIEWS and dtype is not torch.bool:  # the common case (see _NUMPY_VIEWS): writable, owned
            return torch.from_numpy(numpy.frombuffer(bytearray(data), dtype=_NUMPY_VIEWS[name]).reshape(shape))
        raw = _little_endian(torch.frombuffer(bytearray(data), dtype=torch.uint8), dtype)  # writable, owned
        if dtype is torch.bool and int(raw.max()) > 1:
            raise self.refuse(path, "a bool tensor holding bytes other than 0 and 1")
        return raw.view(dtype).reshape(shape)


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


# ------------------------------------------------------------------------------------------------- expectations
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
