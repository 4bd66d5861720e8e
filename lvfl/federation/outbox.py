"""A party's dialing and sending side: a channel per peer, an outbox and a stream per peer, `flush`, send errors.

`send` encodes a message and either delivers it in one ``Deliver`` call (answered once the peer checked and
stored it) or queues it in the peer's outbox, which one thread per peer carries on one long-lived ``Stream`` call;
`flush` ends the streams and waits for their answers. A failure is put in one line naming the peer, its address and
why it is silent (connected, no TLS, or nothing there).

`Outbox` is the sending side of `lvfl.federation.transport.Transport`, one object with its receiving side: what the
two share (one lock, the ledger, the failures) is `lvfl.federation.endpoint.Endpoint`'s; what this side owns is set
by `_init_outbox` and `_dial`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc

from lvfl.federation import FederationError
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.addresses import connected, port_answers
from lvfl.federation.channels import pinned_channel
from lvfl.federation.codec import encode_envelope
from lvfl.federation.endpoint import Endpoint
from lvfl.federation.envelope_schema import Header
from lvfl.federation.expectations import printable

__all__ = ["DELIVER", "STREAM", "Outbox"]

#: the RPCs' full method names (see the service in envelope.proto): one envelope per call, and a stream per peer
DELIVER = "/lvfl.federation.Federation/Deliver"
STREAM = "/lvfl.federation.Federation/Stream"


class Outbox(Endpoint):
    """The sending side of `lvfl.federation.transport.Transport`: its channels, outboxes, streams and `flush`."""

    def _init_outbox(self) -> None:
        """No channel yet (`_dial` opens them), no message queued or numbered."""
        self._next_out: Counter[tuple[str, str]] = Counter()
        self._outbox: dict[str, queue.SimpleQueue] = {}  # per peer, messages queued by `send(wait=False)`
        self._pending = 0  # queued messages not yet delivered (or dropped after a failure)
        self._channels: dict[str, grpc.Channel] = {}
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._streams: dict[str, grpc.StreamUnaryMultiCallable] = {}
        self._open_streams: dict[str, Any] = {}  # per peer, its open stream (a call future)

    def _dial(self, key_pem: bytes, certificate_pem: bytes) -> None:
        """Open a channel to each peer at its address in the federation file, trusting that peer's pinned certificate.

        The channel's only trust anchor is the certificate the federation file pins for the peer (not the CA), and
        its TLS name is checked as the peer's: a server at the peer's address holding another party's certificate,
        or a certificate freshly minted with the CA's key, fails the handshake, so nothing is sent to it. This
        party presents its own certificate (`key_pem`, `certificate_pem`), which the peer checks against its pin.
        """
        for peer in self.peers:
            channel = pinned_channel(self.federation, peer, key_pem, certificate_pem)
            self._channels[peer] = channel
            self._calls[peer] = channel.unary_unary(DELIVER)
            self._streams[peer] = channel.stream_unary(STREAM)

    def _hang_up(self) -> None:
        """Close every channel `_dial` opened."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._calls.clear()
        self._streams.clear()

    # -- sending ---------------------------------------------------------------------------------------------------
    def send(self, dst: str, tag: str, step: int, payload: Any, wait: bool = True, patience: float = 0.0) -> None:
        """Deliver `payload` to `dst` under `tag` at `step`; returns once `dst` has checked and stored it.

        With `wait=False` the encoded message is queued for `dst`'s stream (one long-lived call per peer, opened by
        the first such message: no call set-up, metadata or status per message), which carries that peer's messages
        in the order they were sent, and this returns at once (a party does not wait for each acknowledgement
        before it computes on); a failure is then raised by this transport's next `send`, `receive` or `flush`,
        with the same line. With `wait=True` (one call, answered when `dst` has checked and stored the message)
        the messages queued before it are delivered first.

        `patience` (with `wait=True`): further seconds to wait for `dst` to come up, `timeout` at a time, while
        nothing answers at its address and no peer stopped (a greeting: a peer's process may start minutes later, on
        a loaded machine or in another organisation).

        Raises:
            FederationError: `dst` refused the message (its reason), or did not come up and answer within the
                timeout (naming it and its address), or the envelope is over `max_message_bytes`.
            TypeError: `payload` holds something the codec cannot send.
        """
        self._check_peer(dst)
        self._raise_failure()
        if dst in self._refusals:  # this party refused `dst`'s messages: that, not silence, is why they stop
            raise FederationError(self._refusals[dst])
        # no lock: the sends to one (peer, tag) come from one thread at a time (`Transport`'s contract), and a
        # dict's get and set are each atomic
        seq = self._next_out[(dst, tag)]
        self._next_out[(dst, tag)] = seq + 1
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
            give_up = time.monotonic() + max(float(patience), 0.0)
            while True:  # `timeout` at a time, so that an abort or a refusal meanwhile ends the wait
                try:
                    self._deliver_to(dst, tag, seq, data)
                    break
                except FederationError:
                    self._raise_failure()  # a peer stopped meanwhile: its reason, not this silence
                    if dst in self._refusals or time.monotonic() >= give_up:
                        raise  # this party refused `dst` (its reason), or it is out of patience
                    if port_answers(self.federation.party(dst).address):
                        raise  # `dst` is up and did not answer: nothing to wait for
        else:
            self._outbox_of(dst, tag, len(data)).put((tag, data))

    def _deliver_to(self, dst: str, tag: str, seq: int, data: bytes) -> None:
        try:
            ack = self._post(dst, tag, data)
        except FederationError:
            if dst in self._refusals:  # this party refused `dst` meanwhile (and `dst` stopped): that is the cause
                raise FederationError(self._refusals[dst]) from None
            raise
        self._acknowledged(dst, tag, seq, ack, len(data))

    def _acknowledged(self, dst: str, tag: str, seq: int, ack: pb.Ack, size: int) -> None:
        """Check `dst`'s acknowledgement of message `seq` under `tag` and meter the message."""
        if ack.seq != seq:
            raise FederationError(f"{dst} acknowledged {tag!r} message #{ack.seq} from {self.me}; it was #{seq}")
        with self._cond:
            self._count(dst, tag, size)

    def _count(self, dst: str, tag: str, size: int) -> None:
        """Count a message to `dst` of `size` envelope bytes, for a caller holding the lock."""
        key = (self.me, dst, tag)
        self.envelope_bytes[key] += size
        self.messages[key] += 1

    def _outbox_of(self, dst: str, tag: str, size: int) -> queue.SimpleQueue:
        """`dst`'s queue for its stream, and the stream's thread (opened on first use); meters one message for it.

        One lock for the ledger and the pending count (a party waits on each message: every lock costs).
        """
        with self._cond:
            self._count(dst, tag, size)
            if dst not in self._outbox:
                self._outbox[dst] = queue.SimpleQueue()  # C: a put and a get cost a fraction of Queue's
                thread = threading.Thread(
                    target=self._sender, args=(dst, self._outbox[dst]), name=f"lvfl-{self.me}-to-{dst}", daemon=True
                )
                thread.start()
            self._pending += 1
            return self._outbox[dst]

    def _sender(self, dst: str, outbox: queue.SimpleQueue) -> None:
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
        code, details = err.code(), printable((err.details() or "").strip())  # the peer's words: escaped
        address = self.federation.party(dst).address
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
            return FederationError(f"{dst} refused {tag!r} from {self.me}: {details}")
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:  # gRPC's own size check
            return FederationError(
                f"{dst} refused {tag!r} from {self.me}: the {size}-byte envelope is over its message size limit "
                f"({details})"
            )
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:  # the peer's bound on what it holds for this party
            return FederationError(f"{dst} refused {tag!r} from {self.me}: {details}")
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
        if channel is not None and connected(channel):
            return "it is connected but did not acknowledge the message"
        if port_answers(self.federation.party(dst).address):
            return (
                f"its port answers but no TLS connection could be made: the server there does not hold the "
                f"certificate pinned for {dst} in the federation file (another party's, or one from another CA or "
                f"freshly minted), or it does not accept {self.me}'s"
            )
        return "nothing answers there (is it running?)"
