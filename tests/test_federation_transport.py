"""Transports over real mutual-TLS sockets on localhost: parties in threads of one process exchange tensors, and
every impostor, stray or malformed message is refused with one line naming the party."""

from __future__ import annotations

import pickle
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from lvfl.alignment import intersection, kkrt, parts
from lvfl.crypto.ecdh_blinding import POINT_BYTES
from lvfl.federation import FederationError
from lvfl.federation.codec import encode_envelope
from lvfl.federation.envelope_schema import Header
from lvfl.federation.federation_file import Federation, write_federation
from lvfl.federation.link import SocketLink
from lvfl.federation.pki import PKIFiles, issue_certificate, write_test_pki
from lvfl.federation.transport import DELIVER, Transport, transports
from lvfl.wire import Wire, payload_nbytes

NAMES = ["party0", "party1", "party2"]
TIMEOUT = 30.0  # generous for a busy machine; every test that waits for a failure sets its own short timeout


@pytest.fixture
def pki(tmp_path: Path) -> PKIFiles:
    return write_test_pki(tmp_path, NAMES)


@pytest.fixture
def federation(pki: PKIFiles) -> Federation:
    return write_federation(pki.directory / "federation.yaml", NAMES)


@pytest.fixture
def make(federation: Federation) -> Iterator[Callable[..., Transport]]:
    """Build transports (started, unless start=False) that are all closed after the test."""
    made: list[Transport] = []

    def factory(name: str, start: bool = True, **kwargs) -> Transport:
        kwargs.setdefault("run_id", "run-1")
        kwargs.setdefault("timeout", TIMEOUT)
        kwargs.setdefault("greetings", False)  # these tests send without greeting: the message path alone
        transport = Transport(name, kwargs.pop("federation", federation), **kwargs)
        made.append(transport)
        return transport.start() if start else transport

    yield factory
    for transport in made:
        transport.close()


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def run_parties(*bodies: Callable[[], None]) -> None:
    """Run one body per party in threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as err:  # noqa: BLE001 (handed to the main thread)
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]


# ------------------------------------------------------------------------------------------------- exchanges
def test_three_parties_exchange_tensors_both_ways(make) -> None:
    parties = {name: make(name) for name in NAMES}
    generator = torch.Generator().manual_seed(0)
    sent = {
        (src, dst, step): torch.randn(8, 4, generator=generator, dtype=torch.float64)[:, ::2]  # non-contiguous
        for src in NAMES
        for dst in NAMES
        if src != dst
        for step in range(3)
    }
    received: dict = {}

    def party(me: str) -> Callable[[], None]:
        def body() -> None:
            transport = parties[me]
            for step in range(3):
                for peer in transport.peers:
                    transport.send(peer, "embeddings", step, sent[(me, peer, step)])
                for peer in transport.peers:
                    expected = torch.empty(8, 2, dtype=torch.float64, device="meta")
                    received[(peer, me, step)] = transport.receive(peer, "embeddings", step, expected=expected)

        return body

    run_parties(*(party(name) for name in NAMES))
    assert received.keys() == sent.keys()
    for key, tensor in sent.items():
        assert torch.equal(received[key], tensor)
    # the ledger: each link's messages, and its envelopes' bytes: the payload's (the Wire's count) and some framing
    payload = 3 * payload_nbytes(torch.zeros(8, 2, dtype=torch.float64))
    for me, transport in parties.items():
        for peer in transport.peers:
            for key in ((me, peer, "embeddings"), (peer, me, "embeddings")):
                assert transport.messages[key] == 3
                assert payload < transport.envelope_bytes[key] < 2 * payload
    links = 2 * len(parties["party0"].peers)  # to and from each peer
    assert 4 * 3 * 128 == links * payload < parties["party0"].bytes_by_tag()["embeddings"] < 2 * links * payload


def test_structured_payloads_and_the_context_manager(federation: Federation) -> None:
    payload = {"ids": b"\x01\x02", "grads": [torch.ones(3, dtype=torch.int64), torch.tensor(True)], "n": ()}
    with (
        Transport("party0", federation, "run-1", timeout=TIMEOUT, greetings=False) as a,
        Transport("party1", federation, "run-1", greetings=False) as b,
    ):
        a.send("party1", "mixed", 4, payload)
        got = b.receive(
            "party0", "mixed", 4, expected={"ids": bytes, "grads": [torch.empty(3, dtype=torch.int64), None], "n": None}
        )
    assert got["ids"] == payload["ids"]
    assert torch.equal(got["grads"][0], payload["grads"][0])
    assert got["n"] == ()
    with pytest.raises(FederationError, match="closed its transport"):
        b.receive("party0", "mixed", 5)


def test_send_waits_for_a_peer_that_starts_later(make) -> None:
    sender = make("party1")
    late = make("party0", start=False)
    timer = threading.Timer(0.3, late.start)
    timer.start()
    sender.send("party0", "embeddings", 0, torch.arange(4))
    timer.join()
    assert torch.equal(late.receive("party1", "embeddings", 0), torch.arange(4))


def test_messages_of_one_tag_arrive_in_order_and_tags_are_separate(make) -> None:
    a, b = make("party0"), make("party1")
    for i in range(3):
        a.send("party1", "x", i, torch.tensor(i))
    a.send("party1", "y", 0, b"y")
    assert b.receive("party0", "y", 0) == b"y"
    assert [int(b.receive("party0", "x", i)) for i in range(3)] == [0, 1, 2]


def test_streamed_messages_arrive_in_order_and_flush_confirms_them(make) -> None:
    """`send(wait=False)`: one stream per peer; `flush` ends it and its answer confirms every message."""
    a, b = make("party1"), make("party0")
    for i in range(5):
        a.send("party0", "x", i, torch.full((3,), float(i)), wait=False)
    assert [int(b.receive("party1", "x", i)[0]) for i in range(5)] == list(range(5))
    a.flush()
    assert a.messages[("party1", "party0", "x")] == 5
    a.send("party0", "x", 5, torch.zeros(3), wait=False)  # a new stream after the flush, in sequence
    assert torch.equal(b.receive("party1", "x", 5), torch.zeros(3))
    a.flush()


def test_a_refused_streamed_message_fails_the_senders_next_call(make) -> None:
    a, b = make("party1", run_id="run-A"), make("party0", run_id="run-B")
    a.send("party0", "embeddings", 0, torch.zeros(2), wait=False)  # queued: the refusal comes back on the stream
    message = "party1 sent 'embeddings' for run 'run-A'; party0 runs 'run-B'"
    with pytest.raises(FederationError) as excinfo:
        a.flush()
    assert one_line(excinfo) == f"party0 refused 'embeddings' from party1: {message}"
    with pytest.raises(FederationError) as excinfo:
        b.receive("party1", "embeddings", 0)
    assert one_line(excinfo) == message


@pytest.mark.slow
def test_a_stream_to_a_peer_that_stops_fails_in_one_line(make, federation: Federation) -> None:
    a, b = make("party1"), make("party0")
    a.send("party0", "x", 0, torch.zeros(2), wait=False)
    assert torch.equal(b.receive("party1", "x", 0), torch.zeros(2))
    b.close()

    def keep_sending() -> None:  # the broken stream is noticed by the next send, or by the flush
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            a.send("party0", "x", 1, torch.zeros(2), wait=False)
            time.sleep(0.05)
        a.flush(timeout=1.0)

    with pytest.raises(FederationError) as excinfo:
        keep_sending()
    address = federation.party("party0").address
    assert one_line(excinfo).startswith(f"party1 lost its connection to party0 at {address} while delivering 'x': ")


# ------------------------------------------------------------------------------------------------- deadlines
def test_receive_timeout_names_the_party_and_tag(make) -> None:
    b = make("party1")
    make("party0")
    start = time.monotonic()
    with pytest.raises(FederationError) as excinfo:
        b.receive("party0", "gradients", 3, timeout=0.2)
    assert one_line(excinfo) == "party0 did not send 'gradients' (step 3) to party1 within 0.2 s"
    assert time.monotonic() - start < 2


@pytest.mark.slow
def test_a_set_up_message_waits_past_the_timeout_while_its_sender_is_up_and_no_longer(make) -> None:
    """Set-up work grows with the tables (a PSI of a million IDs takes minutes): `patience` keeps a receive waiting,
    round by round of its timeout, while the sender answers; a sender that is down is still found within a round."""
    b, a = make("party1"), make("party0")
    late = threading.Timer(0.6, lambda: a.send("party1", "psi/blinded", -1, torch.ones(2), wait=False))
    late.start()
    start = time.monotonic()
    assert torch.equal(b.receive("party0", "psi/blinded", -1, timeout=0.2, patience=5.0), torch.ones(2))
    assert 0.5 < time.monotonic() - start < 3  # past its 0.2 s rounds, as long as the sender took
    late.join()
    with pytest.raises(FederationError) as excinfo:  # up, but never sends: the patience runs out
        b.receive("party0", "psi/peer", -1, timeout=0.2, patience=0.4)
    assert one_line(excinfo) == "party0 did not send 'psi/peer' (step -1) to party1 within 0.6 s"
    a.close()
    start = time.monotonic()
    with pytest.raises(FederationError, match="party0 is unreachable"):  # down: found in the first round
        b.receive("party0", "psi/peer", -1, timeout=0.2, patience=60.0)
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_send_to_a_party_that_is_not_up_names_it_and_its_address(make, federation: Federation) -> None:
    a = make("party1", timeout=0.5)
    with pytest.raises(FederationError) as excinfo:
        a.send("party0", "embeddings", 0, torch.zeros(2))
    address = federation.party("party0").address
    assert one_line(excinfo) == (
        f"party1 could not deliver 'embeddings' to party0 at {address} within 0.5 s: nothing answers there "
        "(is it running?)"
    )


def test_port_in_use_names_the_party_and_address(make, federation: Federation) -> None:
    party = federation.party("party0")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", party.port))
        blocker.listen()
        with pytest.raises(FederationError) as excinfo:
            make("party0")
    assert one_line(excinfo) == (f"party party0 cannot listen on {party.address}: the port is in use (on 127.0.0.1)")


def test_two_transports_cannot_share_a_port(make, federation: Federation) -> None:
    make("party0")
    with pytest.raises(FederationError, match="cannot listen on"):
        make("party0")


# ------------------------------------------------------------------------------------------------- refusals
def test_wrong_run_id_is_refused_at_both_ends(make) -> None:
    a, b = make("party1", run_id="run-A"), make("party0", run_id="run-B")
    with pytest.raises(FederationError) as excinfo:
        a.send("party0", "embeddings", 0, torch.zeros(2))
    message = "party1 sent 'embeddings' for run 'run-A'; party0 runs 'run-B'"
    assert one_line(excinfo) == f"party0 refused 'embeddings' from party1: {message}"
    with pytest.raises(FederationError) as excinfo:
        b.receive("party1", "embeddings", 0)
    assert one_line(excinfo) == message


def test_wrong_step_is_refused(make) -> None:
    a, b = make("party1"), make("party0")
    a.send("party0", "embeddings", 3, torch.zeros(2))
    with pytest.raises(FederationError) as excinfo:
        b.receive("party1", "embeddings", 4)
    assert one_line(excinfo) == "party1 sent 'embeddings' for step 3; party0 expected step 4"


def test_wrong_dtype_against_expected(make) -> None:
    a, b = make("party2"), make("party0")
    a.send("party0", "embeddings", 0, torch.zeros(128, 16, dtype=torch.float64))
    with pytest.raises(FederationError) as excinfo:
        b.receive("party2", "embeddings", 0, expected=torch.empty(128, 16, device="meta"))
    assert one_line(excinfo) == "party2 sent 'embeddings' as float64 [128, 16]; expected float32 [128, 16]"


def test_configuration_fingerprints_must_agree(make) -> None:
    a, _ = make("party1", fingerprint="abc"), make("party0", fingerprint="def")
    with pytest.raises(
        FederationError, match="party1 runs another configuration than party0: fingerprint 'abc' vs 'def'"
    ):
        a.send("party0", "embeddings", 0, torch.zeros(2))


def test_a_configuration_that_differs_is_named_by_section(make) -> None:
    """`lvfl party`'s fingerprints have sections (lvfl.commands.party.config_fingerprint): the refusal names them."""
    a = make("party1", fingerprint="model=1,data=2,seed=3")
    make("party0", fingerprint="model=9,data=2,seed=4")
    with pytest.raises(FederationError, match="the model, seed sections of the config differ"):
        a.send("party0", "embeddings", 0, torch.zeros(2))


def test_a_peers_abort_fails_every_receive_with_its_reason(make) -> None:
    a, b = make("party1"), make("party0")
    a.abort("party2 is unreachable")
    with pytest.raises(FederationError, match="party1 stopped: party2 is unreachable"):
        b.receive("party1", "embeddings", 0)


def test_a_sender_claiming_another_partys_name_is_refused(make) -> None:
    impostor, victim = make("party1"), make("party0")
    forged = encode_envelope(Header("run-1", "party2", "party0", "labels", 0, 0), torch.ones(2))
    with pytest.raises(FederationError) as excinfo:
        impostor._post("party0", "labels", forged)
    message = "party1 (by its certificate) sent 'labels' in an envelope claiming to be from 'party2'"
    assert one_line(excinfo) == f"party0 refused 'labels' from party1: {message}"
    with pytest.raises(FederationError, match=re.escape(message)):
        victim.receive("party1", "labels", 0)
    with pytest.raises(FederationError, match="party2 is unreachable"):  # nothing was filed under party2 (not up)
        victim.receive("party2", "labels", 0, timeout=0.1)


def test_a_pickle_sent_as_an_envelope_is_refused(make) -> None:
    sender, receiver = make("party1"), make("party0")
    with pytest.raises(FederationError) as excinfo:
        sender._post("party0", "embeddings", pickle.dumps({"x": torch.ones(2)}))
    assert "party0 refused 'embeddings' from party1: party1 sent" in one_line(excinfo)
    assert "bytes that are not an lvfl envelope" in one_line(excinfo)
    with pytest.raises(FederationError, match="not an lvfl envelope"):
        receiver.receive("party1", "embeddings", 0)


def test_a_replayed_message_is_refused(make) -> None:
    sender, receiver = make("party1"), make("party0")
    data = encode_envelope(Header("run-1", "party1", "party0", "embeddings", 0, 0), torch.ones(2))
    sender._post("party0", "embeddings", data)
    with pytest.raises(FederationError, match=r"message #0; party0 expected #1 \(a message was lost or replayed\)"):
        sender._post("party0", "embeddings", data)
    with pytest.raises(FederationError, match="lost or replayed"):  # the link is broken for the receiver too
        receiver.receive("party1", "embeddings", 0)


def test_a_message_addressed_to_another_party_is_refused(make) -> None:
    sender, _ = make("party1"), make("party0")
    data = encode_envelope(Header("run-1", "party1", "party2", "embeddings", 0, 0), torch.ones(2))
    with pytest.raises(FederationError, match="party1 sent 'embeddings' addressed to 'party2' to party0"):
        sender._post("party0", "embeddings", data)


def test_oversized_messages_are_refused(make) -> None:
    small, big = make("party0", max_message_bytes=4096), make("party1")
    with pytest.raises(FederationError) as excinfo:
        big.send("party0", "embeddings", 0, torch.zeros(2048))
    assert re.fullmatch(
        r"party0 refused 'embeddings' from party1: the 82\d\d-byte envelope is over its message size limit \(.*\)",
        one_line(excinfo),
    )
    with pytest.raises(FederationError) as excinfo:
        small.send("party1", "embeddings", 0, torch.zeros(2048))
    assert re.fullmatch(
        r"party0 cannot send 'embeddings' to party1: its envelope is 82\d\d bytes, over max_message_bytes=4096",
        one_line(excinfo),
    )
    assert small.messages == big.messages == {}  # nothing was delivered, nothing counted


def test_a_payload_that_cannot_be_sent_fails_at_the_sender(make) -> None:
    a = make("party1")
    with pytest.raises(TypeError, match="cannot meter a payload of type str"):  # the Wire's meter, before any send
        Wire(here="party1", carrier=SocketLink(a)).send("party1", "party0", "text", tag="x")
    assert not a.messages
    with pytest.raises(ValueError, match="no party 'party9'"):
        a.send("party9", "x", 0, b"")
    with pytest.raises(ValueError, match="cannot send to or receive from itself"):
        a.receive("party1", "x", 0)


# ------------------------------------------------------------------------------------------------- certificates
def _raw_channel(target: str, ca: Path, key: Path, cert: Path, name: str) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes(), cert.read_bytes())
    return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", name)])


def test_a_party_with_a_certificate_from_another_ca_is_refused(make, federation: Federation, tmp_path: Path) -> None:
    receiver = make("party0")
    other = write_test_pki(tmp_path / "other", ["party1"])
    envelope = encode_envelope(Header("run-1", "party1", "party0", "embeddings", 0, 0), torch.ones(2))
    # it trusts our CA, so only the server's client-certificate check can stop it
    with (
        _raw_channel(
            federation.party("party0").address,
            federation.ca,
            other.keys["party1"],
            other.certificates["party1"],
            "party0",
        ) as channel,
        pytest.raises(grpc.RpcError) as excinfo,
    ):
        channel.unary_unary(DELIVER)(envelope, timeout=1.0)
    assert excinfo.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    with pytest.raises(FederationError, match="party1 is unreachable"):
        receiver.receive("party1", "embeddings", 0, timeout=0.1)


@pytest.mark.slow
def test_a_transport_whose_peer_has_another_ca_says_tls_failed(make, federation: Federation, tmp_path: Path) -> None:
    make("party0")  # listening, with our CA
    other = write_test_pki(tmp_path / "other", ["party0", "party1"])
    # party0's real address, but another CA: the port answers and no handshake succeeds
    fed = write_federation(
        other.directory / "federation.yaml",
        ["party0", "party1"],
        addresses={"party0": federation.party("party0").address, "party1": "localhost:1"},
    )
    stranger = make("party1", federation=fed, timeout=0.5, start=False)
    stranger.listen = "localhost:0"
    stranger.start()
    with pytest.raises(FederationError) as excinfo:
        stranger.send("party0", "embeddings", 0, torch.zeros(2))
    assert one_line(excinfo).endswith(
        "within 0.5 s: its port answers but no TLS connection could be made: the server there does not hold the "
        "certificate pinned for party0 in the federation file (another party's, or one from another CA or freshly "
        "minted), or it does not accept party1's"
    )


def test_a_certificate_not_pinned_in_the_federation_file_is_refused(
    make, pki: PKIFiles, federation: Federation, tmp_path: Path
) -> None:
    receiver = make("party0")
    # signed by the right CA and named party1, but not the certificate the federation file pins for party1
    cert, key = issue_certificate(pki.ca_certificate, pki.ca_key, "party1", tmp_path / "reissued")
    envelope = encode_envelope(Header("run-1", "party1", "party0", "embeddings", 0, 0), torch.ones(2))
    channel = _raw_channel(federation.party("party0").address, federation.ca, key, cert, "party0")
    with channel, pytest.raises(grpc.RpcError) as excinfo:
        channel.unary_unary(DELIVER)(envelope, timeout=TIMEOUT)
    assert excinfo.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "certificate for CN=party1" in excinfo.value.details()
    assert "is not the one pinned for any party" in excinfo.value.details()
    with pytest.raises(FederationError, match="party1 is unreachable"):
        receiver.receive("party1", "embeddings", 0, timeout=0.1)


def test_expired_certificate_is_detected_at_start(make, pki: PKIFiles) -> None:
    issue_certificate(pki.ca_certificate, pki.ca_key, "party1", pki.directory, days=-1)  # replaces party1.pem
    for name in ("party0", "party1"):  # every party checks every certificate, its own and its peers'
        with pytest.raises(FederationError) as excinfo:
            make(name)
        assert one_line(excinfo).startswith(f"certificate {pki.certificates['party1']} expired on ")


def test_own_certificate_from_another_ca_or_wrong_key_is_refused_at_start(make, pki: PKIFiles, tmp_path: Path) -> None:
    with pytest.raises(FederationError, match=r"private key .*party2.key does not belong to certificate .*party0.pem"):
        make("party0", key_path=pki.keys["party2"])
    other = write_test_pki(tmp_path / "other", ["party1"])
    (pki.directory / "party1.pem").write_bytes(other.certificates["party1"].read_bytes())
    with pytest.raises(FederationError, match=r"certificate .*party1.pem is not signed by the CA in .*ca.pem"):
        make("party1")


def test_start_twice_and_send_before_start(make) -> None:
    a = make("party0")
    with pytest.raises(RuntimeError, match="already started"):
        a.start()
    b = make("party1", start=False)
    with pytest.raises(RuntimeError, match="not started"):
        b.send("party0", "x", 0, b"")


def test_transports_helper_starts_and_closes_all(federation: Federation) -> None:
    made = (Transport(name, federation, "run-1", timeout=TIMEOUT, greetings=False) for name in NAMES[:2])
    with transports(*made) as (a, b):
        b.send("party0", "x", 0, b"hello")
        assert a.receive("party1", "x", 0) == b"hello"
    with pytest.raises(FederationError, match="closed its transport"):
        a.receive("party1", "x", 1)


def test_the_link_gives_set_up_messages_its_patience_and_training_steps_none() -> None:
    """The step is the protocol's (the Wire passes it); the link turns a set-up step (-1) into patience."""
    waits = []

    class Recorder:  # the transport's side of `take`: what each receive was allowed
        me, identities = "party1", None

        def receive(self, src: str, tag: str, step: int, expected: object = None, patience: float = 0.0) -> None:
            waits.append((tag, step, patience))

    link = SocketLink(Recorder(), setup_patience=3540.0)
    link.take("party0", "party1", "psi/blinded", -1, None)
    link.take("party0", "party1", "gradients", 0, None)
    assert waits == [("psi/blinded", -1, 3540.0), ("gradients", 0, 0.0)]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
def test_a_psi_longer_than_one_envelope_goes_in_parts_over_real_sockets(make, monkeypatch, protocol) -> None:
    """Parts of 40 points between parties whose transports take small envelopes and hold two parts unread, not
    three: the PSI's long messages (ECDH's 28.8 kB of points, KKRT's 73 kB matrix) would be refused whole; in parts
    they align the rows as the simulation does. KKRT's base-OT messages (17 and 33 kB) always go whole."""
    ids = {"party0": [f"c{i:05d}" for i in range(900)], "party1": [f"c{i:05d}" for i in range(300, 1250)][::-1]}
    expected = intersection.private_intersection(ids, active="party0", wire=Wire(), protocol=protocol)
    monkeypatch.setattr(parts, "PART_BYTES", 40 * POINT_BYTES)
    part = 40 * POINT_BYTES  # 1,280 bytes: an envelope of about 1,325 (header, run, tag)
    whole = kkrt.SEEDS_BYTES + 512 if protocol == "kkrt" else 0  # the largest message sent whole, and its envelope
    limits = {"max_message_bytes": 2048 + whole, "max_queued_bytes": 2 * part + 512 + whole, "timeout": 20}
    ends = {name: make(name, **limits) for name in ids}
    results, wires = {}, {}

    def body(name: str) -> Callable[[], None]:
        def run() -> None:
            wire = wires[name] = Wire(here=name, carrier=SocketLink(ends[name]))
            results[name] = intersection.private_intersection(
                {name: ids[name]}, parties=list(ids), active="party0", wire=wire, protocol=protocol
            )

        return run

    run_parties(*(body(name) for name in ids))
    for name in ids:
        assert results[name].ids == expected.ids
        assert np.array_equal(results[name].rows[name], expected.rows[name]), name
    sent = wires["party0"].bytes
    long = ("psi/blinded", 900 * POINT_BYTES) if protocol == "ecdh" else ("psi/matrix", 1143 * 64)
    assert sent["party0", "party1", long[0]] == long[1]
