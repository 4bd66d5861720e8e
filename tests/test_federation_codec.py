"""The federation codec: every payload type round-trips bit-identically, and every malformed message is refused."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import re
import struct
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lvfl.compression import CompressedTensor, Compressor
from lvfl.federation import FederationError, codec, wire_form
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.codec import (
    RecordRegistry,
    decode_envelope,
    decode_payload,
    decode_value,
    encode_envelope,
    encode_value,
    register_record,
)
from lvfl.federation.envelope_schema import (
    DTYPES,
    MAX_DEPTH,
    MAX_INT_BYTES,
    SCHEMA,
    Header,
    dtype_from_name,
    dtype_name,
)
from lvfl.federation.expectations import conform
from lvfl.federation.wire_form import parse_envelope, scan_payload
from lvfl.privacy.aggregation.ckks import CKKSShare
from lvfl.privacy.aggregation.paillier_share import PaillierShare
from lvfl.wire import payload_nbytes

ROOT = Path(__file__).resolve().parents[1]
HEADER = Header(run_id="run-1", src="party2", dst="party0", tag="embeddings", step=7, seq=0)


# ------------------------------------------------------------------------------------------------- helpers
def _compressed_fields(c: CompressedTensor) -> dict:
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)} | {"dtype": dtype_name(c.dtype)}


def _compressed(fields: dict) -> CompressedTensor:
    return CompressedTensor(**(fields | {"dtype": dtype_from_name(fields["dtype"]), "shape": tuple(fields["shape"])}))


def _ckks_fields(share: CKKSShare) -> dict:
    return {
        "vectors": [vec.serialize() for vec in share.vectors],
        "shape": tuple(share.shape),
        "key_id": share.key_id,
        "num_ciphertexts": share.num_ciphertexts,
    }


def _ckks(fields: dict) -> CKKSShare:
    import tenseal as ts

    # lazy: the receiver links its own public context before it computes (the wire never carries a context here)
    vectors = [ts.lazy_ckks_vector_from(data) for data in fields["vectors"]]
    return CKKSShare(vectors, torch.Size(fields["shape"]), fields["key_id"], fields["num_ciphertexts"])


@pytest.fixture
def records() -> RecordRegistry:
    """The three record types lvfl sends today, in a registry of the test's own (the global one is untouched)."""
    registry = RecordRegistry()
    register_record("lvfl.CompressedTensor", CompressedTensor, _compressed_fields, _compressed, registry=registry)
    register_record("lvfl.PaillierShare", PaillierShare, registry=registry)  # a dataclass: the default fields
    register_record("lvfl.CKKSShare", CKKSShare, _ckks_fields, _ckks, registry=registry)
    return registry


def roundtrip(payload, records: RecordRegistry | None = None, expected=None):
    registry = records or RecordRegistry()
    header, out = decode_envelope(
        encode_envelope(HEADER, payload, registry), sender="party2", expected=expected, records=registry
    )
    assert header == HEADER
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    )


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Random bits of `dtype` (NaN payloads, infinities and subnormals included); bools as 0/1."""
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    nbytes = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, nbytes), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def refusal(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("name", list(DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 4, 5)])
def test_tensor_round_trip_is_bit_identical(name: str, shape: tuple[int, ...]) -> None:
    sent = random_tensor(DTYPES[name], shape, torch.Generator().manual_seed(len(shape)))
    got = roundtrip(sent)
    assert same_bits(sent, got)
    assert got.device.type == "cpu"
    assert not got.requires_grad


@pytest.mark.parametrize("name", list(DTYPES))
def test_non_contiguous_and_views_arrive_as_their_values(name: str) -> None:
    base = random_tensor(DTYPES[name], (6, 8), torch.Generator().manual_seed(1))
    for view in (base.t(), base[::2, 1::3], base[:, 3], base.expand(2, 6, 8), base[2, 5]):
        got = roundtrip(view)
        assert same_bits(view.contiguous(), got)
        assert got.is_contiguous()


def test_conjugate_views_send_their_values() -> None:
    z = torch.randn(4, dtype=torch.complex64)
    assert same_bits(roundtrip(z.conj()), z.conj().resolve_conj())


def test_decoded_tensors_are_writable_copies() -> None:
    value = encode_value(torch.arange(6, dtype=torch.float32))
    first = decode_value(value, sender="party2", tag="t")
    first.mul_(10)  # writable: it owns its bytes
    second = decode_value(value, sender="party2", tag="t")
    assert torch.equal(second, torch.arange(6, dtype=torch.float32))  # the message was not changed through it


def test_gradients_do_not_cross() -> None:
    x = torch.randn(3, requires_grad=True)
    got = roundtrip(x * 2)
    assert not got.requires_grad
    assert got.grad_fn is None


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(DTYPES)),
    shape=st.lists(st.integers(0, 4), max_size=4).map(tuple),
    seed=st.integers(0, 2**31),
)
def test_any_dtype_and_shape_round_trips(name: str, shape: tuple[int, ...], seed: int) -> None:
    sent = random_tensor(DTYPES[name], shape, torch.Generator().manual_seed(seed))
    assert same_bits(sent, roundtrip(sent))


def test_containers_and_scalars_round_trip_with_their_types() -> None:
    tensor = torch.randn(2, 3)
    payload = {
        "z": b"\x00\xffbytes",
        "a": [tensor, (torch.tensor(True), b"")],
        "ints": [0, 1, -1, 255, -256, 2**63, -(2**63) - 1, 2**4096 - 1, -(2**4095)],
        "nested": {"deeper": {"x": ()}},
        "scalars": ("text", None, True, False, 1.5, float("inf")),
        "empty": {},
    }
    got = roundtrip(payload)
    assert list(got) == list(payload)  # dict order is kept
    assert got["z"] == payload["z"]
    assert type(got["z"]) is bytes
    assert isinstance(got["a"], list)
    assert isinstance(got["a"][1], tuple)
    assert torch.equal(got["a"][0], tensor)
    assert got["a"][1][1] == b""
    assert got["ints"] == payload["ints"]
    assert all(type(i) is int for i in got["ints"])
    assert got["nested"] == {"deeper": {"x": ()}}
    assert got["scalars"] == payload["scalars"]
    assert type(got["scalars"][2]) is bool
    assert got["empty"] == {}


def test_bytearray_memoryview_and_torch_size_arrive_as_bytes_and_tuple() -> None:
    assert roundtrip([bytearray(b"ab"), memoryview(b"cd"), torch.Size([2, 3])]) == [b"ab", b"cd", (2, 3)]


def test_paillier_share_with_4096_bit_ciphertexts(records: RecordRegistry) -> None:
    g = torch.Generator().manual_seed(0)
    ciphertexts = tuple(
        int.from_bytes(torch.randint(0, 256, (512,), generator=g, dtype=torch.uint8).numpy()) for _ in range(3)
    )
    share = PaillierShare(ciphertexts, (4, 2), width=64, slots=3, step=5, index=1, ciphertext_nbytes=512)
    got = roundtrip({"share": share}, records)["share"]
    assert type(got) is PaillierShare
    assert dataclasses.asdict(got) == dataclasses.asdict(share)
    assert got.wire_nbytes() == share.wire_nbytes()


def test_compressed_tensor(records: RecordRegistry) -> None:
    x = torch.randn(16, 8, dtype=torch.float64)
    for compressor in (Compressor(bits=4), Compressor(bits=4, topk=0.25), Compressor(bits=32, topk=0.5)):
        sent = compressor.compress(x)
        got = roundtrip(sent, records)
        assert type(got) is CompressedTensor
        assert got.dtype == torch.float64
        assert got.shape == (16, 8)
        assert same_bits(got.decompress(), sent.decompress())
        assert got.wire_nbytes() == sent.wire_nbytes()


def test_ckks_share(records: RecordRegistry) -> None:
    ts = pytest.importorskip("tenseal")
    context = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 60])
    context.global_scale = 2**40
    values = [0.5, -1.25, 3.0]
    share = CKKSShare([ts.ckks_vector(context, values)], torch.Size([3]), b"key-id", 1)
    got = roundtrip(share, records)
    assert type(got) is CKKSShare
    assert got.shape == torch.Size([3])
    assert got.key_id == b"key-id"
    vector = got.vectors[0]
    vector.link_context(context)
    assert vector.decrypt() == pytest.approx(values, abs=1e-4)
    assert got.wire_nbytes() == share.wire_nbytes()


def test_records_nest_and_carry_their_fields_in_order() -> None:
    @dataclasses.dataclass(frozen=True)
    class Pair:
        left: object
        right: object

    registry = RecordRegistry()
    register_record("test.Pair", Pair, registry=registry)
    sent = Pair(Pair(1, torch.ones(2)), [b"x"])
    got = roundtrip(sent, registry)
    assert got.left.left == 1
    assert torch.equal(got.left.right, torch.ones(2))
    assert got.right == [b"x"]


# ------------------------------------------------------------------------------------------------- refusals
def test_a_pickle_is_not_an_envelope() -> None:
    for data in (pickle.dumps({"x": torch.ones(2)}), pickle.dumps(b"\x80"), b"", b"\xff" * 10):
        with pytest.raises(FederationError) as excinfo:
            decode_envelope(data, sender="party2")
        assert re.fullmatch(r"party2 sent \d+ bytes that are not an lvfl envelope \(.+\)", refusal(excinfo))


def test_another_schema_is_refused() -> None:
    envelope = pb.Envelope(schema=SCHEMA + 1, tag="t")
    envelope.payload.none.SetInParent()
    with pytest.raises(FederationError, match=f"schema {SCHEMA + 1}; this lvfl reads {SCHEMA}"):
        decode_envelope(envelope.SerializeToString(), sender="party2")


def test_wrong_dtype_against_expected() -> None:
    data = encode_envelope(HEADER, torch.zeros(128, 16, dtype=torch.float64))
    with pytest.raises(FederationError) as excinfo:
        decode_envelope(data, sender="party2", expected=torch.empty(128, 16, device="meta"))
    assert refusal(excinfo) == "party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]"


def test_wrong_shape_against_expected_inside_a_structure() -> None:
    payload = {"grad": [torch.zeros(128, 16), torch.zeros(4)], "ids": b"x"}
    expected = {"grad": [torch.empty(128, 16, device="meta"), torch.empty(5, device="meta")], "ids": bytes}
    with pytest.raises(FederationError) as excinfo:
        roundtrip(payload, expected=expected)
    assert refusal(excinfo) == "party2 sent 'embeddings' at ['grad'][1] as float32 [4]; expected float32 [5]"
    roundtrip(payload, expected={"grad": [None, torch.empty(4)], "ids": None})  # None: anything there


@pytest.mark.parametrize(
    ("payload", "expected", "message"),
    [
        (b"x", torch.empty(2), "as bytes; expected float32 [2]"),
        (torch.zeros(2), bytes, "as float32 [2]; expected bytes"),
        ({"a": b""}, {"a": None, "b": None}, "with keys ['a']; expected ['a', 'b'] (missing ['b'])"),
        ([b"", b""], [None], "as a list of 2; expected a list of 1"),
        ((b"",), [None], "as a tuple of 1; expected a list of 1"),
        (b"x", {"a": None}, "as bytes; expected a dict"),
    ],
)
def test_structure_against_expected(payload, expected, message: str) -> None:
    with pytest.raises(FederationError) as excinfo:
        roundtrip(payload, expected=expected)
    assert refusal(excinfo).endswith(message)


def test_a_bad_template_is_the_receivers_bug() -> None:
    with pytest.raises(TypeError, match="expected must be"):
        conform(b"x", 5, sender="party2", tag="t")


def _tensor_value(dtype: str, shape: list[int], data: bytes) -> pb.Value:
    value = pb.Value()
    value.tensor.dtype, value.tensor.data = dtype, data
    value.tensor.shape.extend(shape)
    return value


def _envelope(value: pb.Value) -> bytes:
    envelope = pb.Envelope(schema=SCHEMA, run_id="r", src="party2", dst="party0", tag="embeddings")
    envelope.payload.CopyFrom(value)
    return envelope.SerializeToString()


def _deep(levels: int) -> pb.Value:
    value = pb.Value()
    value.none.SetInParent()
    for _ in range(levels):
        outer = pb.Value()
        outer.list.items.add().CopyFrom(value)
        value = outer
    return value


def _map_with_duplicate_key() -> pb.Value:
    value = pb.Value()
    for _ in range(2):
        value.map.entries.add(key="a").value.raw = b""
    return value


def _record(type_name: str, **fields: bytes) -> pb.Value:
    value = pb.Value()
    value.record.type = type_name
    for key, raw in fields.items():
        value.record.fields.add(key=key).value.raw = raw
    return value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            _tensor_value("float32", [128, 16], b"\0" * 100),
            "party2 sent 'embeddings' with a float32 [128, 16] tensor in 100 bytes of data; that shape needs 8192",
        ),
        (_tensor_value("float32", [], b""), "a float32 [] tensor in 0 bytes of data; that shape needs 4"),
        (_tensor_value("object", [1], b"\0" * 8), "a tensor of unknown dtype 'object'"),
        (_tensor_value("torch.float32", [1], b"\0" * 4), "a tensor of unknown dtype 'torch.float32'"),
        (_tensor_value("bool", [2], b"\x01\x02"), "a bool tensor holding bytes other than 0 and 1"),
        (_tensor_value("uint8", [1] * 33, b"\0"), "a tensor of 33 dimensions"),
        (_tensor_value("float64", [2**62, 2**62], b""), "a float64 [4611686018427387904, 4611686018427387904]"),
        (_tensor_value("float32", [0, 2**64 - 1], b""), "a shape too large for any tensor"),
        (_tensor_value("uint8", [2**40, 2**40, 0], b""), "a shape too large for any tensor"),
        (_deep(MAX_DEPTH + 1), f"values nested deeper than {MAX_DEPTH} levels"),
        (_map_with_duplicate_key(), "with the key 'a' twice"),
        (pb.Value(), "with an empty value (no kind set)"),
        (pb.Value(integer=b""), "an int of 0 bytes"),
        (pb.Value(integer=b"\1" * (MAX_INT_BYTES + 1)), f"an int of {MAX_INT_BYTES + 1} bytes"),
        (_record("os.system", command=b"rm"), "a record of unknown type 'os.system' (allowed: 'lvfl.CompressedTensor'"),
        (_record("lvfl.PaillierShare", shape=b""), "a malformed lvfl.PaillierShare record: "),
    ],
)
def test_malformed_payloads_are_refused(value: pb.Value, message: str, records: RecordRegistry) -> None:
    with pytest.raises(FederationError) as excinfo:
        decode_envelope(_envelope(value), sender="party2", records=records)
    text = refusal(excinfo)
    assert text.startswith("party2 sent 'embeddings'")
    assert message in text


def test_a_record_type_not_registered_here_is_refused_even_if_the_sender_knows_it(records: RecordRegistry) -> None:
    data = encode_envelope(HEADER, PaillierShare((1,), (1,), 1, 1, 0, 0, 1), records)
    with pytest.raises(FederationError, match=r"a record of unknown type 'lvfl.PaillierShare' \(allowed: none\)"):
        decode_envelope(data, sender="party2", records=RecordRegistry())


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (object(), "cannot send a object: lvfl sends tensors"),
        ({1: b""}, "has a key that is not a str: 1"),
        ([{"a": [namedtuple("P", "x")(1)]}], r"cannot send a P at \[0\]\['a'\]\[0\]"),
        (torch.empty(2, device="meta"), "meta"),
        (torch.zeros(2).to_sparse(), "only dense tensors"),
        pytest.param(2**40000, "an int of 40001 bits", id="huge-int"),
        (PaillierShare((1,), (1,), 1, 1, 0, 0, 1), "cannot send a PaillierShare"),  # not registered in this test
    ],
)
def test_what_cannot_be_sent_is_refused_at_the_sender(payload, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        encode_value(payload, RecordRegistry())


def test_sending_nests_no_deeper_than_receiving() -> None:
    payload: list = []
    for _ in range(MAX_DEPTH + 1):
        payload = [payload]
    with pytest.raises(ValueError, match="nests deeper"):
        encode_value(payload)


def test_registry_refuses_clashes_and_non_dataclasses() -> None:
    @dataclasses.dataclass
    class A:
        x: int

    registry = RecordRegistry()
    register_record("a", A, registry=registry)
    register_record("a", A, registry=registry)  # the same pairing again: fine
    with pytest.raises(ValueError, match="clashes"):
        register_record("b", A, registry=registry)
    with pytest.raises(ValueError, match="clashes"):
        register_record("a", int, to_fields=lambda i: {}, from_fields=lambda f: 0, registry=registry)
    with pytest.raises(TypeError, match="not a dataclass"):
        register_record("c", int, registry=registry)


# ------------------------------------------------------------------------------------------------- the schema
def test_generated_code_matches_the_proto_file() -> None:
    """envelope_pb2.py was generated from envelope.proto as it is: every message has the same fields."""
    text = (ROOT / "lvfl" / "federation" / "envelope.proto").read_text()
    text = re.sub(r"//.*", "", text)
    messages = {part.split()[0]: part for part in re.split(r"^message ", text, flags=re.M)[1:]}
    assert set(messages) == set(pb.DESCRIPTOR.message_types_by_name)
    for name, body in messages.items():
        declared = {(f, int(n)) for f, n in re.findall(r"(\w+) = (\d+);", body)}
        generated = {(f.name, f.number) for f in pb.DESCRIPTOR.message_types_by_name[name].fields}
        assert declared == generated, name


def _module_imports(path: Path) -> set[str]:
    """The modules `path` imports when it is imported (module level, not inside functions)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


#: the codec and the modules it stands on, which a module registering a record type imports with it
CODEC_MODULES = ("codec", "wire_form", "expectations", "envelope_schema", "envelope_pb2")


def test_import_layering() -> None:
    """codec imports no privacy code, `import lvfl.federation` needs no gRPC, lvfl.crypto never imports federation."""
    package = ROOT / "lvfl" / "federation"
    assert _module_imports(package / "__init__.py") == {"__future__"}
    allowed = {"lvfl.federation"} | {f"lvfl.federation.{module}" for module in CODEC_MODULES}
    for name in (f"{module}.py" for module in CODEC_MODULES):
        imported = _module_imports(package / name)
        assert not [m for m in imported if m.startswith(("lvfl.privacy", "lvfl.protocols", "grpc"))], name
        assert {m for m in imported if m.startswith("lvfl")} <= allowed, name
    for path in (ROOT / "lvfl" / "crypto").rglob("*.py"):
        assert "federation" not in path.read_text(), path


def test_the_codec_names_what_a_sender_and_receiver_use() -> None:
    """Every name in the codec's `__all__` is importable from it, those of the modules beside it included."""
    assert {name for name in codec.__all__ if not hasattr(codec, name)} == set()
    assert codec.conform is conform
    assert codec.parse_envelope is parse_envelope
    assert codec.scan_payload is scan_payload
    assert codec.TensorBytes is wire_form.TensorBytes
    assert codec.Header is Header
    for path in (ROOT / "lvfl" / "crypto").rglob("*.py"):
        assert "federation" not in path.read_text(), path


# ------------------------------------------------------------------------------------------------- lvfl's own records
@pytest.mark.parametrize("compressor", [Compressor(), Compressor(bits=8), Compressor(bits=12, topk=0.3)])
def test_cvfls_compressed_embeddings_cross_the_process_wide_allow_list_as_sent(compressor) -> None:
    sent = compressor.compress(torch.randn(6, 5))
    got = decode_envelope(encode_envelope(HEADER, sent), sender="party2")[1]
    assert type(got) is CompressedTensor
    assert torch.equal(got.decompress(), sent.decompress())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shape": (6, 4)}, "a dense payload holds 24 values for shape"),
        ({"bits": 4}, "payload must hold 4-bit codes"),
        ({"payload": torch.full((30,), 300, dtype=torch.int16), "bits": 8}, "payload must hold 8-bit codes"),
        ({"step": torch.ones(2)}, "step must be a float32 scalar tensor"),
        ({"dtype": torch.int64}, "dtype must be a floating-point dtype"),
    ],
)
def test_a_crafted_compressed_tensor_is_refused_in_one_line(change, message) -> None:
    crafted = dataclasses.replace(Compressor(bits=8).compress(torch.randn(6, 5)), **change)
    with pytest.raises(FederationError, match=re.escape(message)):
        decode_envelope(encode_envelope(HEADER, crafted), sender="party2")


def test_top_k_indices_out_of_range_or_out_of_order_are_refused() -> None:
    sent = Compressor(bits=8, topk=0.5).compress(torch.randn(4, 4))
    for indices in (sent.indices.flip(0), sent.indices + 16):
        crafted = dataclasses.replace(sent, indices=indices)
        with pytest.raises(FederationError, match=r"indices must be increasing int64 positions in \[0, 16\)"):
            decode_envelope(encode_envelope(HEADER, crafted), sender="party2")


# -------------------------------------------------------------------------------------------- the bounds before parsing
def _values(obj) -> int:
    """An independent count of the values `scan_payload` counts: every value, and each size of a tensor's shape."""
    if isinstance(obj, torch.Tensor):
        return 1 + obj.dim()
    if isinstance(obj, dict):
        return 1 + sum(_values(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return 1 + sum(_values(v) for v in obj)
    if dataclasses.is_dataclass(obj):
        return 1 + sum(_values(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 1


@pytest.mark.parametrize(
    "payload",
    [
        None,
        b"raw",
        torch.zeros(3, 4, 5),
        [1, 2.5, "text", None, True, b"x"],
        {"a": [torch.ones(2), (3, 4)], "b": {"c": None}},
        Compressor(bits=8, topk=0.5).compress(torch.randn(4, 6)),
        [[[[torch.zeros(())]]]],
    ],
)
def test_scan_counts_exactly_the_values_the_payload_holds(payload) -> None:
    _, data = parse_envelope(encode_envelope(HEADER, payload), sender="party2")
    assert scan_payload(data, sender="party2", tag="t") == _values(payload)


def test_scan_refuses_past_each_bound_before_protobuf_parses_anything() -> None:
    _, data = parse_envelope(encode_envelope(HEADER, [None] * 1000), sender="party2")
    assert scan_payload(data, sender="party2", tag="t", max_nodes=1001) == 1001
    with pytest.raises(FederationError, match=r"^party2 sent 't' with more than 1000 values \(max_nodes\)"):
        scan_payload(data, sender="party2", tag="t", max_nodes=1000)
    nested = pb.Value(none=pb.Null())
    for _ in range(MAX_DEPTH + 1):
        nested = pb.Value(list=pb.Items(items=[nested]))
    with pytest.raises(FederationError, match=f"nested deeper than {MAX_DEPTH} levels"):
        scan_payload(nested.SerializeToString(), sender="party2", tag="t")
    wide = pb.Value(tensor=pb.Tensor(dtype="float32", shape=[1] * 40, data=b"\0\0\0\0"))
    with pytest.raises(FederationError, match=r"a tensor of 40 dimensions \(at most 32\)"):
        scan_payload(wide.SerializeToString(), sender="party2", tag="t")
    for junk in (b"\xff", b"\x1a\x05ab", b"\x0b"):  # an overlong varint, a field past the end, a group
        with pytest.raises(FederationError, match="not an lvfl value"):
            scan_payload(junk, sender="party2", tag="t")


def test_an_envelope_is_split_without_copying_or_parsing_its_payload() -> None:
    data = encode_envelope(HEADER, torch.arange(1000.0))
    header, payload = parse_envelope(data, sender="party2")
    assert header == HEADER
    assert isinstance(payload, memoryview)
    assert payload.obj is data  # a view of the envelope's own bytes
    twice = data + pb.EnvelopeHead(payload=b"\x12\x00").SerializeToString()  # a second payload field
    with pytest.raises(FederationError, match="not an lvfl envelope \\(two payloads\\)"):
        parse_envelope(twice, sender="party2")


def test_an_envelope_that_does_not_walk_is_refused_by_name() -> None:
    """Each fault the split finds on the bytes, before protobuf parses anything, in its own words."""
    data = encode_envelope(HEADER, torch.arange(4.0))
    long_head = pb.EnvelopeHead(run_id="r" * (64 * 1024)).SerializeToString() + data
    cases = {
        "a header of more than 65536 bytes": long_head,
        "a truncated or overlong varint": data + b"\x50",  # a varint field's key (field 10), then nothing
        "a field runs past the end": data + b"\x12\x05ab",  # a 5-byte run_id with 2 bytes
        "wire type 3": data + b"\x0b",
    }
    for why, bad in cases.items():
        with pytest.raises(FederationError, match=re.escape(f"not an lvfl envelope ({why})")):
            parse_envelope(bad, sender="party2")
    assert parse_envelope(data + b"\x50\x81\x01", sender="party2")[0] == HEADER  # an unknown field 10: kept aside


def _walked(data: bytes) -> tuple[Header, bytes] | str:
    """What the walk of every field reads in `data` (the reference for the payload-first fast path), or its refusal."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire_form, "_payload_first", lambda data: None)
        try:
            header, payload = parse_envelope(data, sender="party2")
        except FederationError as err:
            return str(err)
    return header, bytes(payload)


def test_an_envelope_written_payload_first_reads_as_the_walk_reads_it() -> None:
    """The fast path (payload first, the header behind it parsed in one call) finds what walking every field finds.

    Each variant is one the fast path must hand to the walk, which accepts or refuses it in its own words.
    """
    tensor = torch.randn(3, 4)
    data = encode_envelope(HEADER, tensor)
    payload_field = pb.Envelope(payload=encode_value(tensor)).SerializeToString()
    head = data[len(payload_field) :]
    assert data == payload_field + head  # lvfl writes a tensor's envelope payload first
    assert wire_form._payload_first(data) is not None
    variants = {
        "as written": data,
        "an unknown field behind": data + b"\x50\x81\x01",
        "a header field twice": data + pb.EnvelopeHead(tag="other").SerializeToString(),
        "a default written out": data + b"\x38\x00",  # seq = 0, which protobuf leaves out
        "a second payload": data + pb.EnvelopeHead(payload=b"\x12\x00").SerializeToString(),
        "a known field of another wire type": data + b"\x28\x01",  # tag (a string) as a varint
        "a truncated header": data[:-1],
        "a group behind": data + b"\x0b",
        "an overlong payload length": b"\x4a" + b"\x80" * 6 + b"\x00" + head,
        "a payload past the end": payload_field[:1] + b"\xff\xff\x03" + payload_field[4:] + head,
        "a header of 64 kB": data + pb.EnvelopeHead(fingerprint="f" * 65536).SerializeToString(),
    }
    for name, variant in variants.items():
        want = _walked(variant)
        try:
            header, payload = parse_envelope(variant, sender="party2")
            got: tuple[Header, bytes] | str = (header, bytes(payload))
        except FederationError as err:
            got = str(err)
        assert got == want, name
    assert _walked(variants["a header field twice"])[0].tag == "other"  # protobuf's rule: the last one
    assert "two payloads" in _walked(variants["a second payload"])
    for fallen in ("an unknown field behind", "a header field twice", "a default written out", "a second payload"):
        assert wire_form._payload_first(variants[fallen]) is None, fallen


def test_a_tensor_of_a_form_read_before_is_read_alike_and_a_near_miss_is_checked() -> None:
    """A payload with the length and leading bytes of one read before skips the walk; any other is walked again."""
    wire_form._LAYOUTS.clear()
    first = torch.randn(6, 4)
    _, payload = parse_envelope(encode_envelope(HEADER, first), sender="party2")
    assert decode_payload(payload, sender="party2", tag="t").equal(first)
    assert len(wire_form._LAYOUTS) == 1
    again = torch.randn(6, 4)  # the same form: read off the remembered layout, an owned and writable tensor
    data = encode_envelope(HEADER, again)
    _, payload = parse_envelope(data, sender="party2")
    got = decode_payload(payload, sender="party2", tag="t")
    assert got.equal(again)
    assert got.shape == (6, 4)
    got.add_(1)
    assert decode_payload(payload, sender="party2", tag="t").equal(again)
    deferred = decode_payload(payload, sender="party2", tag="t", deferred=True)
    assert isinstance(deferred, wire_form.TensorBytes)
    assert payload_nbytes(deferred) == payload_nbytes(again) == 96
    assert deferred.tensor().equal(again)
    transposed = torch.randn(4, 6)  # the same length, another shape
    _, payload = parse_envelope(encode_envelope(HEADER, transposed), sender="party2")
    assert decode_payload(payload, sender="party2", tag="t", deferred=True).shape == (4, 6)
    as_int = torch.arange(24, dtype=torch.int32).reshape(6, 4)
    body = bytes(parse_envelope(encode_envelope(HEADER, as_int), sender="party2")[1])
    assert decode_payload(body, sender="party2", tag="t", deferred=True).equal(as_int)  # a new form: walked, a tensor
    forged = body.replace(b"int32", b"intXX")  # the remembered length, another dtype name: walked and refused
    with pytest.raises(FederationError, match="a tensor of unknown dtype 'intXX'"):
        decode_payload(forged, sender="party2", tag="t")
    assert len(wire_form._LAYOUTS) <= wire_form._MAX_LAYOUTS


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(128, 64),
        torch.tensor(3.0),
        torch.zeros(0, 5),
        torch.arange(300, dtype=torch.int64).reshape(3, 100),
        torch.ones(3, requires_grad=True),
        torch.tensor([True, False]),
        torch.randn(2, 3, dtype=torch.complex64),
        torch.randn(4).to(torch.bfloat16),  # no numpy dtype: protobuf's way
        torch.randn(5, 4).t(),  # not contiguous: protobuf's way
        torch.randn(3).conj(),
    ],
    ids=lambda t: f"{str(t.dtype)[6:]}{list(t.shape)}",
)
def test_a_tensor_envelope_is_protobufs_own_bytes(tensor: torch.Tensor) -> None:
    """The hand-joined envelope of one tensor is what protobuf serializes, payload first, and decodes to the tensor.

    Payload first: protobuf's own parser reads it as the same envelope, of the same size; field by field it holds
    protobuf's own bytes, the payload's, then the header's.
    """
    fields = HEADER._asdict()
    reference = pb.Envelope(schema=SCHEMA, **fields)
    reference.payload.tensor.dtype = str(tensor.dtype).removeprefix("torch.")
    reference.payload.tensor.shape.extend(tensor.shape)
    flat = tensor.detach().resolve_conj().contiguous().reshape(-1)
    reference.payload.tensor.data = flat.view(torch.uint8).numpy().tobytes()
    data = encode_envelope(HEADER, tensor)
    assert pb.Envelope.FromString(data) == reference
    assert len(data) == reference.ByteSize()
    payload_field = pb.Envelope(payload=reference.payload).SerializeToString()
    head = pb.EnvelopeHead(schema=SCHEMA, **fields).SerializeToString()
    assert data in (payload_field + head, reference.SerializeToString())  # by hand, or protobuf's way off the fast path
    _, got = decode_envelope(data, sender="party2")
    assert got.dtype == tensor.dtype
    assert got.shape == tensor.shape
    assert torch.equal(got, tensor.detach().resolve_conj())
    got.add_(1) if got.dtype is not torch.bool else got.logical_not_()  # writable, and the envelope's bytes untouched
    assert decode_envelope(data, sender="party2")[1].equal(tensor.detach().resolve_conj())


def test_a_tensor_in_another_form_is_read_by_protobuf_alike() -> None:
    """A one-tensor payload with fields out of order, repeated or unknown: read by protobuf, not by hand."""
    tensor = pb.Tensor(dtype="float32", shape=[2], data=struct.pack("<2f", 1.5, -2.0))
    reordered = b"".join(
        pb.Tensor(**{name: getattr(tensor, name)}).SerializeToString() for name in ("data", "shape", "dtype")
    )
    repeated = tensor.SerializeToString() + pb.Tensor(data=struct.pack("<2f", 3.0, 4.0)).SerializeToString()
    unknown = tensor.SerializeToString() + b"\x20\x01"  # field 4, a varint: protobuf keeps it aside
    for body, want in ((reordered, [1.5, -2.0]), (repeated, [3.0, 4.0]), (unknown, [1.5, -2.0])):
        payload = b"\x0a" + bytes([len(body)]) + body
        assert pb.Value.FromString(payload).tensor.data  # what protobuf reads
        got = decode_payload(payload, sender="party2", tag="t")
        assert got.tolist() == want
    body = pb.Tensor(dtype="float32", shape=[3], data=b"\0" * 8).SerializeToString()  # read by hand, and refused
    with pytest.raises(FederationError, match="a float32 \\[3\\] tensor in 8 bytes of data; that shape needs 12"):
        decode_payload(b"\x0a" + bytes([len(body)]) + body, sender="party2", tag="t")
