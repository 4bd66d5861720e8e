"""Party-to-party messages over gRPC with mutual TLS: one server per party, one channel per peer.

Why this shape: a protocol step is "party A sends X to party B", so the transport is a mailbox per party. Each
party runs one gRPC server at its address from the federation file; sending is delivering an envelope to the
peer's server, receiving is taking the next message of a (sender, tag) from the local mailbox. A run's messages
travel on one long-lived stream per peer (``Stream(stream Envelope) -> Ack``: no call set-up and no answer per
message, which on a fast link are most of a message's cost); the first message the peer refuses ends the stream
with the reason, and the stream's one answer, when `flush` ends it, confirms every message on it. A greeting, an
abort or a send that waits for its answer is one ``Deliver(Envelope) -> Ack`` call.

Who sent a message is read from the TLS connection, never from the message: both ends present certificates from
the federation's CA (``require_client_auth``), the server matches the client's certificate against the one pinned
for each party in the federation file, and refuses an envelope whose ``src`` is not that party. It also refuses a
message of another run or configuration (``run_id``, ``fingerprint``), out of sequence (each (src, dst, tag) is
numbered from 0: a lost or replayed message shows), or that the codec refuses; and `receive` refuses a message for
another step than the one the protocol is at. A refused message is answered with the reason (the sender's `send`
raises it) and also fails the receiver's next `receive` from that party, so both ends stop with the same line.

Bytes are counted per (src, dst, tag) for both directions: `payload_bytes` as `lvfl.wire.payload_nbytes` counts
them (the Wire's ledger), `envelope_bytes` as they crossed the socket (protobuf framing, header and all).

Example:
    >>> with Transport("party1", "federation.yaml", run_id="run-7") as transport:  # doctest: +SKIP
    ...     transport.send("party0", "embeddings", step=0, payload=embeddings)
    ...     grad = transport.receive("party0", "gradients", step=0, expected=embeddings)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from lvfl.federation import FederationError
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.codec import RECORDS, Header, RecordRegistry, conform, decode_value, encode_envelope
from lvfl.federation.codec import parse_envelope as _parse_envelope
from lvfl.federation.federation_file import Federation, load_federation
from lvfl.federation.pki import certificate_fingerprint, check_ca, check_certificate, check_key
from lvfl.wire import payload_nbytes

__all__ = [
    "ABORT_TAG",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_TIMEOUT",
    "DELIVER",
    "HELLO_TAG",
    "Transport",
    "transports",
]

log = logging.getLogger(__name__)

#: seconds a receive waits for its message, and a send for its peer to come up and acknowledge
DEFAULT_TIMEOUT = 60.0
#: largest envelope a party accepts: room for a CKKS key exchange or a large batch, far below gRPC's 2 GiB cap
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
#: the RPCs' full method names (see the service in envelope.proto): one envelope per call, and a stream per peer
DELIVER = "/lvfl.federation.Federation/Deliver"
STREAM = "/lvfl.federation.Federation/Stream"
_SERVICE = "lvfl.federation.Federation"
#: reconnect quickly while a peer is starting (gRPC's default backoff starts at 1 s and grows to 2 min)
_BACKOFF_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

Key = tuple[str, str, str]  # (src, dst, tag)
#: seconds a receive whose sender is up waits past its deadline for an abort naming the party really missing
ABORT_GRACE = 5.0
#: the tag of the greeting every party sends every peer before set-up (`Transport.hello`)
HELLO_TAG = "hello"
#: the tag of a party's last message when it stops on an error (`Transport.abort`); it fails the peers' receives
ABORT_TAG = "abort"


class Transport:
    """Party `me`'s end of the federation: its server, its channels to the peers, its mailbox and its ledger.

    Args:
        me: this party's name in the federation file.
        federation: the federation file (path) or a loaded `Federation`.
        run_id: names the run; a message of any other run is refused.
        key_path: this party's private key; ``<me>.key`` beside the federation file by default.
        timeout: seconds a `receive` waits, and a `send` waits for its peer (coming up, then acknowledging).
        max_message_bytes: the largest envelope this party's server accepts; a larger one is refused (and `send`
            refuses to send one larger than this party's own limit).
        fingerprint: a digest of the run's configuration; when both ends set one, they must be equal.
        records: the record types this party sends and accepts (`lvfl.federation.codec.RECORDS` by default).
        listen: the address the server binds, when not the federation file's (e.g. ``0.0.0.0:50051`` behind NAT).

    Sends to one (peer, tag) must come from one thread at a time: their sequence numbers are their order.
    """

    def __init__(
        self,
        me: str,
        federation: Federation | str | os.PathLike[str],
        run_id: str,
        *,
        key_path: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        fingerprint: str = "",
        records: RecordRegistry = RECORDS,
        listen: str | None = None,
    ) -> None:
        self.federation = federation if isinstance(federation, Federation) else load_federation(federation)
        self.me = self.federation.party(me).name
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not 0 < max_message_bytes < 2**31:
            raise ValueError(f"max_message_bytes must be in [1, 2**31 - 1], got {max_message_bytes!r}")
        self.run_id, self.timeout, self.max_message_bytes = run_id, float(timeout), int(max_message_bytes)
        self.fingerprint, self.records = fingerprint, records
        self.key_path = Path(key_path) if key_path is not None else self.federation.key_path(me)
        self.listen = listen or self.federation.party(me).address
        self.peers = tuple(name for name in self.federation.parties if name != me)
        # the ledger, for both directions
        self.payload_bytes: Counter[Key] = Counter()
        self.envelope_bytes: Counter[Key] = Counter()
        self.messages: Counter[Key] = Counter()
        # the mailbox: messages by (src, tag) in arrival order, and the first refusal of each peer
        self._cond = threading.Condition()
        self._inbox: dict[tuple[str, str], deque[tuple[Header, Any]]] = {}
        self._next_in: Counter[tuple[str, str]] = Counter()
        self._next_out: Counter[tuple[str, str]] = Counter()
        self._refusals: dict[str, str] = {}
        self._aborted: str | None = None  # a peer's abort: every receive fails with it
        self._outbox: dict[str, queue.Queue] = {}  # per peer, messages queued by `send(wait=False)`
        self._pending = 0  # queued messages not yet delivered (or dropped after a failure)
        self._send_failure: str | None = None  # the first failure of a queued message
        self._pins: dict[str, str] = {}
        self._senders: dict[bytes, str] = {}  # a pinned peer's certificate (PEM) -> its name, once identified
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._channels: dict[str, grpc.Channel] = {}
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._streams: dict[str, grpc.StreamUnaryMultiCallable] = {}
        self._open_streams: dict[str, Any] = {}  # per peer, its open stream (a call future)
        self._closed = False
        self.identities: Any = None  # this party's TLS identity (`lvfl.federation.identity`), once started

    # -- life cycle ------------------------------------------------------------------------------------------------
    def start(self) -> Transport:
        """Check every certificate and this party's key, listen at this party's address, open a channel per peer."""
        if self._server is not None:
            raise RuntimeError(f"the transport of {self.me} is already started")
        check_ca(self.federation.ca)
        for party in self.federation.parties.values():
            self._pins[party.name] = certificate_fingerprint(
                check_certificate(party.certificate, self.federation.ca, party.name)
            )
        if len(set(self._pins.values())) != len(self._pins):
            raise FederationError(f"federation file {self.federation.path}: two parties have the same certificate")
        from lvfl.federation.identity import TLSIdentities

        self.identities = TLSIdentities(self.me, self.federation, self.key_path)
        ca_pem = self.federation.ca.read_bytes()
        cert_pem = self.federation.party(self.me).certificate.read_bytes()
        key_pem = check_key(self.key_path, self.federation.party(self.me).certificate)
        self._executor = ThreadPoolExecutor(
            # a worker per peer's stream for the whole run, and as many again for single calls (hello, abort)
            max_workers=2 * len(self.peers) + 2,
            thread_name_prefix=f"lvfl-{self.me}",
        )
        server = grpc.server(
            self._executor,
            options=[
                ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
                ("grpc.max_receive_message_length", self.max_message_bytes),
            ],
        )
        handlers = {  # bytes in, bytes out: parsed by the codec
            "Deliver": grpc.unary_unary_rpc_method_handler(self._deliver),
            "Stream": grpc.stream_unary_rpc_method_handler(self._stream),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        credentials = grpc.ssl_server_credentials(
            [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
        )
        cannot_listen = f"party {self.me} cannot listen on {self.listen}"
        _check_port_free(self.listen, cannot_listen)
        try:
            port = server.add_secure_port(self.listen, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            server.stop(None)
            raise FederationError(f"{cannot_listen}: the port is in use, or the host is not this machine")
        server.start()
        self._server = server
        client = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
        for peer in self.peers:
            channel = grpc.secure_channel(
                self.federation.party(peer).address,
                client,
                options=[("grpc.ssl_target_name_override", peer), *_BACKOFF_OPTIONS],
            )
            self._channels[peer] = channel
            self._calls[peer] = channel.unary_unary(DELIVER)
            self._streams[peer] = channel.stream_unary(STREAM)
        return self

    def close(self) -> None:
        """Deliver what is queued (within the timeout), stop the server, close the channels. Safe to call twice.

        A `receive` still waiting fails; the failure of a queued message is `flush`'s to raise, not this one's.
        """
        with contextlib.suppress(FederationError):
            self.flush()  # ends every stream
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for call in list(self._open_streams.values()):  # a stream to a peer that is gone does not end by itself
            call.cancel()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._calls.clear()
        self._streams.clear()

    def __enter__(self) -> Transport:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending ---------------------------------------------------------------------------------------------------
    def send(self, dst: str, tag: str, step: int, payload: Any, wait: bool = True) -> None:
        """Deliver `payload` to `dst` under `tag` at `step`; returns once `dst` has checked and stored it.

        With `wait=False` the encoded message is queued for `dst`'s stream (one long-lived call per peer, opened by
        the first such message: no call set-up, metadata or status per message), which carries that peer's messages
        in the order they were sent, and this returns at once (a party does not wait for each acknowledgement
        before it computes on); a failure is then raised by this transport's next `send`, `receive` or `flush`,
        with the same line. With `wait=True` (one call, answered when `dst` has checked and stored the message)
        the messages queued before it are delivered first.

        Raises:
            FederationError: `dst` refused the message (its reason), or did not come up and answer within the
                timeout (naming it and its address), or the envelope is over `max_message_bytes`.
            TypeError: `payload` holds something that cannot be sent or metered.
        """
        self._check_peer(dst)
        self._raise_failure()
        if dst in self._refusals:  # this party refused `dst`'s messages: that, not silence, is why they stop
            raise FederationError(self._refusals[dst])
        nbytes = payload_nbytes(payload)  # the Wire's count; refuses what the Wire would
        with self._cond:
            seq = self._next_out[(dst, tag)]
            self._next_out[(dst, tag)] += 1
        # the configuration's fingerprint rides on single calls (the greeting checks it); a stream's messages carry the
        # run ID only, from a peer whose greeting was checked and whose certificate identifies each connection
        header = Header(self.run_id, self.me, dst, tag, int(step), seq, self.fingerprint if wait else "")
        data = encode_envelope(header, payload, self.records)
        if len(data) > self.max_message_bytes:
            raise FederationError(
                f"{self.me} cannot send {tag!r} to {dst}: its envelope is {len(data)} bytes, over "
                f"max_message_bytes={self.max_message_bytes}"
            )
        if wait:
            if self._pending:  # in order: what was queued goes first
                self.flush()
            self._deliver_to(dst, tag, seq, data, nbytes)
        else:
            self._meter(dst, tag, len(data), nbytes)
            self._outbox_of(dst).put((tag, data))

    def _deliver_to(self, dst: str, tag: str, seq: int, data: bytes, nbytes: int) -> None:
        try:
            ack = self._post(dst, tag, data)
        except FederationError:
            if dst in self._refusals:  # this party refused `dst` meanwhile (and `dst` stopped): that is the cause
                raise FederationError(self._refusals[dst]) from None
            raise
        self._acknowledged(dst, tag, seq, ack, len(data), nbytes)

    def _acknowledged(self, dst: str, tag: str, seq: int, ack: pb.Ack, size: int, nbytes: int) -> None:
        """Check `dst`'s acknowledgement of message `seq` under `tag` and meter the message."""
        if ack.seq != seq:
            raise FederationError(f"{dst} acknowledged {tag!r} message #{ack.seq} from {self.me}; it was #{seq}")
        self._meter(dst, tag, size, nbytes)

    def _meter(self, dst: str, tag: str, size: int, nbytes: int) -> None:
        """Count a message to `dst`: `nbytes` of payload as the Wire counts it, `size` bytes of envelope."""
        key = (self.me, dst, tag)
        with self._cond:
            self.payload_bytes[key] += nbytes
            self.envelope_bytes[key] += size
            self.messages[key] += 1

    def _outbox_of(self, dst: str) -> queue.Queue:
        """`dst`'s queue for its stream, and the stream's thread (opened on first use); counts one pending."""
        with self._cond:
            if dst not in self._outbox:
                self._outbox[dst] = queue.Queue()
                thread = threading.Thread(
                    target=self._sender, args=(dst, self._outbox[dst]), name=f"lvfl-{self.me}-to-{dst}", daemon=True
                )
                thread.start()
            self._pending += 1
            return self._outbox[dst]

    def _sender(self, dst: str, outbox: queue.Queue) -> None:
        """Carry `dst`'s queued messages on one stream, in order, until `flush` or `close` ends it.

        gRPC's own thread takes the messages from `requests`; this thread waits for the stream's one answer, the
        count of messages `dst` checked and stored. A message `dst` refuses ends the stream at once with its
        reason, and a peer that stops breaks it: the failure is raised to the protocol by the next `send`,
        `receive` or `flush`, and the messages still queued are dropped.
        """
        carried, last = [0], ["its messages"]

        def requests() -> Iterator[bytes]:
            while (item := outbox.get()) is not None and self._send_failure is None:
                carried[0] += 1
                last[0] = item[0]
                yield item[1]

        try:
            call = self._streams[dst].future(requests(), wait_for_ready=True)
            self._open_streams[dst] = call
            ack = pb.Ack.FromString(call.result())
            if ack.seq != carried[0]:
                raise FederationError(
                    f"{dst} acknowledged {ack.seq} of the {carried[0]} messages {self.me} streamed to it"
                )
        except Exception as err:  # noqa: BLE001 (reported to the protocol's thread, which raises it)
            if isinstance(err, grpc.FutureCancelledError | grpc.RpcError) and self._closed:
                return  # cancelled by `close`
            if isinstance(err, grpc.RpcError):
                err = self._send_error(err, dst, last[0], 0, streaming=True)
            if dst in self._refusals:  # this party refused `dst` meanwhile (and `dst` stopped): that is the cause
                err = FederationError(self._refusals[dst])
            reason = str(err) if isinstance(err, FederationError) else f"{type(err).__name__}: {err}"
            with self._cond:
                self._send_failure = self._send_failure or reason
                self._cond.notify_all()
        finally:
            self._open_streams.pop(dst, None)
            settled = carried[0]
            while True:  # after a failure, what is still queued will not be delivered
                try:
                    settled += outbox.get_nowait() is not None
                except queue.Empty:
                    break
            with self._cond:
                self._pending -= settled
                self._cond.notify_all()

    def _raise_failure(self) -> None:
        """Raise a peer's abort, or the failure of a message queued earlier."""
        if self._aborted is not None:  # a peer stopped: sending on would only wait for it
            raise FederationError(self._aborted)
        if self._send_failure is not None:
            raise FederationError(self._send_failure)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is delivered (at most `timeout`, default the transport's); raise a failure.

        Raises:
            FederationError: a queued message failed, a peer aborted, or the queue did not empty in time.
        """
        wait = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + wait
        with self._cond:
            outboxes, self._outbox = list(self._outbox.values()), {}  # the next message opens a new stream
        for outbox in outboxes:
            outbox.put(None)  # each stream ends once its queued messages are on it; its answer confirms them all
        with self._cond:
            while self._pending and self._send_failure is None and self._aborted is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    stalled = ", ".join(f"{peer} ({self._why_silent(peer)})" for peer in self._open_streams)
                    raise FederationError(
                        f"{self.me} could not deliver its last {self._pending} messages in {wait:g} s"
                        + (f": no acknowledgement from {stalled}" if stalled else "")
                    )
                self._cond.wait(remaining)
        self._raise_failure()

    def _post(self, dst: str, tag: str, data: bytes) -> pb.Ack:
        """One Deliver call with `data` as the request, its failures in one line (tests post crafted bytes here)."""
        if not self._calls:
            raise RuntimeError(f"the transport of {self.me} is not started (or closed)")
        try:
            answer = self._calls[dst](data, timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            raise self._send_error(err, dst, tag, len(data)) from None
        return pb.Ack.FromString(answer)

    def _send_error(
        self, err: grpc.RpcError, dst: str, tag: str, size: int, streaming: bool = False
    ) -> FederationError:
        code, details = err.code(), (err.details() or "").strip()
        address = self.federation.party(dst).address
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
            return FederationError(f"{dst} refused {tag!r} from {self.me}: {details}")
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return FederationError(
                f"{dst} refused {tag!r} from {self.me}: the {size}-byte envelope is over its message size limit "
                f"({details})"
            )
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            if streaming:  # a stream has no deadline: it broke (the peer stopped, or its machine is out of reach)
                return FederationError(
                    f"{self.me} lost its connection to {dst} at {address} while delivering {tag!r}: "
                    f"{self._why_silent(dst)}"
                )
            return FederationError(
                f"{self.me} could not deliver {tag!r} to {dst} at {address} within {self.timeout:g} s: "
                f"{self._why_silent(dst)}"
            )
        return FederationError(f"{self.me} could not deliver {tag!r} to {dst} at {address}: {code.name} {details}")

    def _why_silent(self, dst: str) -> str:
        """Why `dst` does not acknowledge, in words: connected but silent, no TLS, or nothing there."""
        channel = self._channels.get(dst)
        if channel is not None and _connected(channel):
            return "it is connected but did not acknowledge the message"
        if _port_answers(self.federation.party(dst).address):
            return (
                "its port answers but no TLS connection could be made (a certificate from another CA, or not the "
                "name the federation file gives)"
            )
        return "nothing answers there (is it running?)"

    def hello(self, peers: Sequence[str] | None = None) -> None:
        """Greet `peers` (default: every peer) and wait for each one's greeting: up, on this run and configuration.

        The greeting is an empty message under tag ``hello`` (not on the Wire's ledger); its header carries the run
        ID and the configuration's fingerprint, which the peer checks (a refusal names the sections that differ).
        """
        peers = self.peers if peers is None else tuple(peers)
        for peer in peers:
            self.send(peer, HELLO_TAG, -1, b"")
        for peer in peers:
            self.receive(peer, HELLO_TAG, -1)

    def abort(self, reason: str) -> None:
        """Tell every peer this party stops, and why, so that they stop at once (best effort: a second each)."""
        for peer in self.peers:
            call = self._calls.get(peer)
            if call is None:
                continue
            header = Header(self.run_id, self.me, peer, ABORT_TAG, -1, 0, self.fingerprint)
            data = encode_envelope(header, reason.encode("utf-8")[:500], self.records)
            with contextlib.suppress(grpc.RpcError):  # the peer is gone too: its deadline or an abort stops it
                call(data, timeout=1.0)

    # -- receiving -------------------------------------------------------------------------------------------------
    def receive(self, src: str, tag: str, step: int, expected: Any = None, timeout: float | None = None) -> Any:
        """The next message from `src` under `tag`, which must be for `step` and of the form `expected`.

        Args:
            src: the sending party.
            tag: the message's tag.
            step: the step the protocol is at; a message for another step is refused.
            expected: a template the payload must match (`lvfl.federation.codec.conform`): a tensor of the
                dtype and shape expected (a `meta` tensor will do), a dict / list / tuple of them, or None.
            timeout: seconds to wait; the transport's `timeout` by default.

        Raises:
            FederationError: no message within the timeout (naming `src` and `tag`), a refused message from `src`,
                another step, or a payload not of the expected form.
        """
        self._check_peer(src)
        wait = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + wait
        grace_given = False
        with self._cond:
            while True:
                if self._aborted is not None or self._send_failure is not None:
                    self._raise_failure()
                if src in self._refusals:
                    raise FederationError(self._refusals[src])
                queue = self._inbox.get((src, tag))
                if queue:
                    header, payload = queue.popleft()
                    break
                if self._closed:
                    raise FederationError(f"{self.me} closed its transport while waiting for {tag!r} from {src}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    address = self.federation.party(src).address
                    self._cond.release()  # a probe takes up to a second: let the server file messages meanwhile
                    try:
                        answers = _port_answers(address)
                    finally:
                        self._cond.acquire()
                    if not answers:  # it died, or its machine is out of reach
                        raise FederationError(
                            f"{src} is unreachable (nothing answers at {address}): {self.me} waited {wait:g} s for "
                            f"{tag!r} (step {step})"
                        )
                    if grace_given:
                        raise FederationError(
                            f"{src} did not send {tag!r} (step {step}) to {self.me} within {wait:g} s"
                        )
                    # `src` is up, so it is waiting on someone else: that one's absence is being found by whoever
                    # waits on it, whose abort names it; give it a moment to arrive
                    grace_given = True
                    deadline = time.monotonic() + min(ABORT_GRACE, wait)
                    continue
                self._cond.wait(remaining)
        if header.step != step:
            raise FederationError(f"{src} sent {tag!r} for step {header.step}; {self.me} expected step {step}")
        conform(payload, expected, sender=src, tag=tag)
        return payload

    def _deliver(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """The server's handler of one envelope: identify the sender by its certificate, check the message, file it."""
        return self._accept(request, self._identify(context), context)

    def _stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The server's handler of a peer's stream: identified once, each envelope taken as `_deliver` takes one.

        Answered when the peer ends the stream, with the number of envelopes accepted (the first one refused aborts
        the stream with the reason instead).
        """
        sender, count = self._identify(context), 0
        for request in requests:
            self._accept(request, sender, context)
            count += 1
        return pb.Ack(seq=count).SerializeToString()

    def _accept(self, request: bytes, sender: str, context: grpc.ServicerContext) -> bytes:
        """Check one envelope from `sender` and file it; its acknowledgement, or the call aborted with the reason."""
        try:
            header, value = _parse_envelope(request, sender=sender)
            self._check_header(header, sender)
            payload = decode_value(value, sender=sender, tag=header.tag, records=self.records)
            if header.tag == ABORT_TAG:  # out of band: no sequence, fails every receive from now on
                reason = " ".join(bytes(payload).decode("utf-8", errors="replace").split())[:500]
                with self._cond:
                    if self._aborted is None:
                        self._aborted = f"{sender} stopped: {reason}"
                    self._cond.notify_all()
                return pb.Ack(seq=header.seq).SerializeToString()
            try:
                nbytes = payload_nbytes(payload)
            except TypeError as err:
                raise FederationError(f"{sender} sent {header.tag!r} with a payload lvfl cannot meter: {err}") from None
            with self._cond:
                expected_seq = self._next_in[(sender, header.tag)]
                if header.seq != expected_seq:
                    raise FederationError(
                        f"{sender} sent {header.tag!r} message #{header.seq}; {self.me} expected #{expected_seq} "
                        "(a message was lost or replayed)"
                    )
                self._next_in[(sender, header.tag)] += 1
                self._inbox.setdefault((sender, header.tag), deque()).append((header, payload))
                key = (sender, self.me, header.tag)
                self.payload_bytes[key] += nbytes
                self.envelope_bytes[key] += len(request)
                self.messages[key] += 1
                self._cond.notify_all()
        except Exception as err:  # noqa: BLE001 (a peer must not be able to leave this party waiting)
            if isinstance(err, FederationError):
                reason = str(err)
                log.warning("%s refused a message: %s", self.me, reason)
            else:  # a bug here or in a record type's from_fields; the peer is told, this party keeps the traceback
                reason = f"{self.me} could not decode a message from {sender}: {type(err).__name__}: {err}"
                log.exception("%s", reason)
            reason = " ".join(reason.split())
            with self._cond:
                self._refusals.setdefault(sender, reason)
                self._cond.notify_all()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return pb.Ack(seq=header.seq).SerializeToString()

    def _identify(self, context: grpc.ServicerContext) -> str:
        """The party whose pinned certificate the client presented; the call is refused if there is none."""
        certificates = context.auth_context().get("x509_pem_cert") or [b""]
        known = self._senders.get(certificates[0])  # a pinned peer's certificate, parsed once
        if known is not None:
            return known
        try:
            fingerprint = certificate_fingerprint(certificates[0])
        except ValueError:
            fingerprint = ""
        for name, pin in self._pins.items():
            if pin == fingerprint and name != self.me:
                self._senders[certificates[0]] = name
                return name
        claimed = b",".join(context.auth_context().get("x509_common_name") or [b"?"]).decode(errors="replace")
        message = (
            f"a peer presenting a certificate for CN={claimed} (sha256 {fingerprint[:16] or '?'}...) is not a party "
            f"of this federation: its certificate is not the one pinned for any party in {self.federation.path}"
        )
        log.warning("%s refused a connection: %s", self.me, message)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    def _check_header(self, header: Header, sender: str) -> None:
        tag = header.tag
        if header.src != sender:
            raise FederationError(
                f"{sender} (by its certificate) sent {tag!r} in an envelope claiming to be from {header.src!r}"
            )
        if header.dst != self.me:
            raise FederationError(f"{sender} sent {tag!r} addressed to {header.dst!r} to {self.me}")
        if header.run_id != self.run_id:
            raise FederationError(f"{sender} sent {tag!r} for run {header.run_id!r}; {self.me} runs {self.run_id!r}")
        if self.fingerprint and header.fingerprint and header.fingerprint != self.fingerprint:
            raise FederationError(
                f"{sender} runs another configuration than {self.me}: "
                + _differences(header.fingerprint, self.fingerprint)
            )
        if not tag:
            raise FederationError(f"{sender} sent a message without a tag")

    def _check_peer(self, name: str) -> None:
        if name == self.me:
            raise ValueError(f"party {self.me!r} cannot send to or receive from itself")
        if name not in self.peers:
            raise ValueError(f"there is no party {name!r} in {self.federation.path} (peers: {list(self.peers)})")

    # -- the ledger ------------------------------------------------------------------------------------------------
    def bytes_by_tag(self, envelope: bool = False) -> dict[str, int]:
        """Bytes per tag over both directions: payload bytes (as the Wire counts), or envelope bytes."""
        out: Counter[str] = Counter()
        for (_, _, tag), n in (self.envelope_bytes if envelope else self.payload_bytes).items():
            out[tag] += n
        return dict(out)


def _differences(theirs: str, ours: str) -> str:
    """Which sections of two fingerprints differ, in words (both whole, where they have no sections).

    A fingerprint is ``section=digest,...`` (`lvfl.federation.party.config_fingerprint`).
    """
    a, b = (dict(part.partition("=")[::2] for part in f.split(",")) for f in (theirs, ours))
    if "" in a or "" in b or set(a) != set(b):
        return f"fingerprint {theirs!r} vs {ours!r}"
    differ = [name for name in b if a[name] != b[name]]
    if len(differ) == 1:
        return f"the {differ[0]} section of the config differs"
    return f"the {', '.join(differ)} sections of the config differ"


def _check_port_free(address: str, cannot_listen: str) -> None:
    """Refuse an address any of whose resolved sockets is taken.

    gRPC binds every address a host name resolves to (``localhost``: 127.0.0.1 and ::1) and starts if *one* bind
    succeeds, so a port held by another process on 127.0.0.1 alone would go unnoticed while half the peers
    reached that process instead. Checked here first; another process may still take it in between (then gRPC's
    own refusal applies).
    """
    host, _, port_text = address.rpartition(":")
    host, port = host.strip("[]"), int(port_text) if port_text.isdigit() else 0
    if port == 0:  # an ephemeral port (``listen="localhost:0"``), or an address gRPC will refuse itself
        return
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise FederationError(f"{cannot_listen}: cannot resolve {host!r} ({err.strerror})") from None
    for family, kind, proto, _, where in resolved:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(where)
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise FederationError(f"{cannot_listen}: the port is in use (on {where[0]})") from None
                raise FederationError(f"{cannot_listen}: {err.strerror} ({where[0]})") from None


def _connected(channel: grpc.Channel, wait: float = 0.2) -> bool:
    """Whether `channel` has (or makes within `wait` s) a TLS connection; asked only to explain a failed send.

    Not tracked all along with `channel.subscribe`: a subscription polls, and makes `close` wait for the poller.
    """
    ready = grpc.channel_ready_future(channel)
    try:
        ready.result(timeout=wait)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        ready.cancel()


def _port_answers(address: str) -> bool:
    """Whether a TCP connection to `address` opens: tells a peer that is down from one that refuses our TLS."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False


@contextmanager
def transports(*parties: Transport) -> Iterator[tuple[Transport, ...]]:
    """Start several transports (one per party, in one process: tests, demos) and close them all after."""
    started: list[Transport] = []
    try:
        for transport in parties:
            started.append(transport.start())
        yield parties
    finally:
        for transport in reversed(started):
            transport.close()
