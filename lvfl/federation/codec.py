"""Payloads to protobuf and back: a typed `Value` tree in an `Envelope`, checked field by field on the way in.

Why not pickle: a pickle runs code chosen by whoever wrote it, so a party that unpickled a peer's message would
hand that peer its process. Here a message is data only (schema in ``envelope.proto``): tensors as dtype + shape +
little-endian bytes, `bytes`, lists, tuples, str-keyed dicts, ints of any size (a 4096-bit Paillier ciphertext),
str, bool, float, None, and *records*: objects of a type registered on an explicit allow-list
(`register_record`), carried as their registered name and str-keyed fields.

Decoding trusts nothing, and spends nothing before it has checked. Its first steps walk the wire bytes themselves
(`lvfl.federation.wire_form`): the header is read with the payload left as bytes (`parse_envelope`), so a receiver
refuses a message for who sent it or what it is before parsing it; the payload's values are then counted
(`scan_payload`: at most `MAX_NODES` values, nested at most `MAX_DEPTH` deep) before protobuf builds any of them,
since a few bytes per value on the wire cost tens of bytes each once parsed. Here, then: dtype names come from a
fixed table (`lvfl.federation.envelope_schema`), a tensor's shape times its item size must equal its buffer's length
before anything is allocated, a bool tensor holds only bytes 0 and 1, a dict key or record field appears once, and
a record type that is not registered is refused. `conform` (`lvfl.federation.expectations`) then checks a payload
against what the receiver expects. Each refusal is one `FederationError` line naming the sender, the tag and the
fault: ``party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]``.

Decoded tensors are bit-identical to the sent ones, on the CPU, writable and detached (they own a copy of the
bytes, not a view into the protobuf message).

The names of the modules beside it that a sender or receiver uses (`Header`, `conform`, `parse_envelope`, ...) are
importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy
import torch
from google.protobuf.message import DecodeError

from lvfl.federation import FederationError
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.envelope_schema import (
    DTYPE_NAMES,
    DTYPES,
    ITEMSIZE,
    MAX_DEPTH,
    MAX_DIMS,
    MAX_INT_BYTES,
    MAX_NODES,
    NUMPY_VIEWS,
    SCHEMA,
    Header,
    dtype_from_name,
    dtype_name,
)
from lvfl.federation.expectations import conform, describe, printable
from lvfl.federation.wire_form import (
    TensorBytes,
    parse_envelope,
    remember_layout,
    remembered_tensor,
    scan_payload,
    tensor_fields,
    tensor_prefix,
)

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
    if array is not None:  # the common case, through numpy's buffer (see NUMPY_VIEWS)
        out.data = array.tobytes()
        return
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    out.data = _little_endian(flat.view(torch.uint8), flat.dtype).numpy().tobytes()


def _plain_array(tensor: torch.Tensor, name: str | None) -> numpy.ndarray | None:
    """`tensor` as a numpy array on its own memory, where its bytes are its values as they are, else None.

    As they are: a dtype in `NUMPY_VIEWS` (`name`, its wire name), dense, on the CPU, contiguous, with no lazy
    conjugate or negation.
    """
    if name not in NUMPY_VIEWS or tensor.layout is not torch.strided or not tensor.is_cpu:
        return None
    if not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg():
        return None
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


def _little_endian(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Element bytes in little-endian order (a no-op on little-endian hosts; a byte swap per scalar otherwise)."""
    width = ITEMSIZE[dtype_name(dtype)] // (2 if dtype.is_complex else 1)
    if sys.byteorder == "little" or width == 1:
        return raw
    return raw.reshape(-1, width).flip(-1).reshape(-1)  # pragma: no cover (big-endian hosts only)


# ------------------------------------------------------------------------------------------------- envelopes
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
    (`lvfl.federation.wire_form.parse_envelope`). The bytes up to the tensor's data are `tensor_prefix`'s.
    """
    name = DTYPE_NAMES.get(tensor.dtype)
    data = _plain_array(tensor, name)
    if data is None:
        return None
    return b"".join((tensor_prefix(name, tensor.shape), data, head))


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
    known = remembered_tensor(data)
    if known is not None:  # a tensor's form seen before: its data follows
        return known if deferred else known.tensor()
    fields = tensor_fields(memoryview(data))
    if fields is not None:  # most messages: one tensor, read off the bytes with one copy of its data
        tensor = _Decoder(sender, tag, records, max_depth).tensor_of(*fields, "")
        remember_layout(data, fields)
        return tensor
    try:
        value = pb.Value.FromString(data)
    except DecodeError as err:
        raise FederationError(f"{sender} sent {tag!r} with a payload that is not an lvfl value ({err})") from None
    return decode_value(value, sender=sender, tag=tag, records=records, max_depth=max_depth)


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
        if math.prod(max(size, 1) for size in shape) * ITEMSIZE[name] >= 2**62:  # torch's sizes are int64
            raise self.refuse(path, f"a {name} {list(shape)} tensor: a shape too large for any tensor")
        needed = math.prod(shape) * ITEMSIZE[name]
        if needed != len(data):
            raise self.refuse(
                path, f"a {name} {list(shape)} tensor in {len(data)} bytes of data; that shape needs {needed}"
            )
        dtype = DTYPES[name]
        if needed == 0:
            return torch.empty(shape, dtype=dtype)
        if name in NUMPY_VIEWS and dtype is not torch.bool:  # the common case (see NUMPY_VIEWS): writable, owned
            return torch.from_numpy(numpy.frombuffer(bytearray(data), dtype=NUMPY_VIEWS[name]).reshape(shape))
        raw = _little_endian(torch.frombuffer(bytearray(data), dtype=torch.uint8), dtype)  # writable, owned
        if dtype is torch.bool and int(raw.max()) > 1:
            raise self.refuse(path, "a bool tensor holding bytes other than 0 and 1")
        return raw.view(dtype).reshape(shape)
