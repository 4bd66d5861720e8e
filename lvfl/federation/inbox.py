"""A party's receiving side: what a peer's message must pass before it is queued, and the mailbox `receive` reads.

The server's handlers (`Deliver`, `Stream`) identify the sender by its TLS certificate (never by the message),
check the envelope (sender, addressee, run, configuration, tag, sequence, what the codec accepts) and file it under
(sender, tag); a refused message is answered with the reason and fails this party's next `receive` from that
sender, and nothing more from that sender is read. `receive` takes the next message of a (sender, tag) and checks
its step and form.

What a peer can make this party hold is bounded, and checked on the envelope's header before its payload is parsed:

- Before this party greeted a peer (`Transport.hello`), the peer's greeting and its abort are all it accepts from it:
  a party talks only to the peers it greets (the active party to every other, the others to the active party) or
  expects (`Transport.expect`: an HE coordinator, which sends every party its public key), so a pinned party that
  never talks to this one cannot fill it, nor hold a stream open to it.
- What a peer has queued here and this party has not read yet is at most `max_queued_bytes` (one message of any
  size up to `max_message_bytes` when nothing of that peer is queued) and `MAX_QUEUED_MESSAGES` messages;
  a message past either is refused, naming the peer, whatever its tag.
- A peer holds at most one stream and `MAX_CALLS` single calls open here at once, so it cannot use up the server's
  threads, which are counted per peer.
- A payload holds at most `max_nodes` values, counted on its bytes before protobuf parses it
  (`lvfl.federation.wire_form.scan_payload`).

`Inbox` is the receiving side of `lvfl.federation.transport.Transport`, one object with its sending side: what the
two share (one lock, the ledger, the failures) is `lvfl.federation.endpoint.Endpoint`'s; what this side owns is set
by `_init_inbox` and `_pin_callers`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import grpc

from lvfl.federation import FederationError, PeerGone
from lvfl.federation import envelope_pb2 as pb
from lvfl.federation.addresses import port_answers
from lvfl.federation.channels import PinnedCaller, pinned_fingerprints
from lvfl.federation.codec import decode_payload
from lvfl.federation.endpoint import Endpoint
from lvfl.federation.envelope_schema import Header
from lvfl.federation.expectations import check_step, conform, printable
from lvfl.federation.wire_form import TensorBytes, parse_envelope
from lvfl.ledger import payload_nbytes

__all__ = ["ABORT_GRACE", "ABORT_TAG", "DONE_TAG", "HELLO_TAG", "Inbox"]

# the transport's logger, as before the receiving side had a module of its own (operators filter on its name)
log = logging.getLogger("lvfl.federation.transport")

#: the gRPC service the server answers (see envelope.proto): one envelope per call, and a stream per peer
_SERVICE = "lvfl.federation.Federation"
#: seconds a receive whose sender is up waits past its deadline for an abort naming the party really missing
ABORT_GRACE = 5.0
#: the tag of a party's last message when it stops on an error (`Transport.abort`); it fails the peers' receives
ABORT_TAG = "abort"
#: the tag of the greeting every party sends every peer before set-up (`Transport.hello`)
HELLO_TAG = "hello"
#: the tag of a party's word at the end of a run (`Transport.goodbye`): it sent all it will, and how many of each tag
DONE_TAG = "done"
#: the most messages a peer may have queued here, unread (each costs Python objects beyond its bytes)
MAX_QUEUED_MESSAGES = 65536
#: the most single calls (a greeting, an abort, a send that waits) a peer may have open here at once, besides a stream
MAX_CALLS = 2
#: the longest abort payload accepted, in bytes (the reason printed is cut at 500 characters)
MAX_REASON_BYTES = 4096


class Inbox(Endpoint):
    """The receiving side of `lvfl.federation.transport.Transport`: its server's handlers, checks and mailbox."""

    # -- set by `Transport.__init__` from its arguments ----------------------------------------------------------------
    greetings: bool  # whether a peer must be greeted before it may send more than its greeting
    max_queued_bytes: int
    max_nodes: int

    def _init_inbox(self) -> None:
        """The empty mailbox: messages by (src, tag) in arrival order, and the first refusal of each peer."""
        self._inbox: dict[tuple[str, str], deque[tuple[Header, Any, int]]] = {}
        self._next_in: Counter[tuple[str, str]] = Counter()
        self._caller: PinnedCaller | None = None  # who calls, by the pinned certificates (`_pin_callers`)
        # the peers this party talks to: those it greeted (`Transport.hello`) and those it expects without a greeting
        # (`Transport.expect`); they may send it more than a greeting
        self._expected: set[str] = set()
        self._hello_from: set[str] = set()  # the peers whose greeting this party took
        self._queued_bytes: Counter[str] = Counter()  # per peer, bytes of its messages filed here and not yet read
        self._queued_messages: Counter[str] = Counter()
        self._open_streams_in: Counter[str] = Counter()  # per peer, its streams and single calls open here now
        self._open_calls_in: Counter[str] = Counter()

    def _handler(self) -> grpc.GenericRpcHandler:
        """The server's handlers of the service: bytes in, bytes out (parsed by the codec)."""
        handlers = {
            # one envelope per call, but read through an iterator: a call from a peer already refused is refused
            # before its envelope is read off the connection (a unary handler would receive all of it first)
            "Deliver": grpc.stream_unary_rpc_method_handler(self._deliver),
            "Stream": grpc.stream_unary_rpc_method_handler(self._stream),
        }
        return grpc.method_handlers_generic_handler(_SERVICE, handlers)

    # -- receiving -------------------------------------------------------------------------------------------------
    def receive(
        self, src: str, tag: str, step: int, expected: Any = None, timeout: float | None = None, patience: float = 0.0
    ) -> Any:
        """The next message from `src` under `tag`, which must be for `step` and of the form `expected`.

        Args:
            src: the sending party.
            tag: the message's tag.
            step: the step the protocol is at; a message for another step is refused.
            expected: a template the payload must match (`lvfl.federation.expectations.conform`): a tensor of the
                dtype and shape expected (a `meta` tensor will do), a dict / list / tuple of them, or None.
            timeout: seconds to wait; the transport's `timeout` by default.
            patience: further seconds to wait while `src` is up, checked every `timeout` (set-up work, such as a
                PSI over millions of IDs, takes as long as the data makes it); a peer that is down is still found
                within `timeout`.

        Raises:
            FederationError: no message within the timeout (naming `src` and `tag`), a refused message from `src`,
                another step, or a payload not of the expected form.
        """
        self._check_peer(src)
        wait = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + wait
        grace_given = False
        patience, waited = float(patience), wait + float(patience)
        with self._cond:
            while True:
                self._raise_failure()  # a peer's abort, or a queued send's failure
                if src in self._refusals:
                    raise FederationError(self._refusals[src])
                queue = self._inbox.get((src, tag))
                if queue:
                    header, payload, size = queue.popleft()
                    self._queued_bytes[src] -= size
                    self._queued_messages[src] -= 1
                    break
                if self._closed:
                    raise FederationError(f"{self.me} closed its transport while waiting for {tag!r} from {src}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    address = self.federation.party(src).address
                    self._cond.release()  # a probe takes up to a second: let the server file messages meanwhile
                    try:
                        answers = port_answers(address)
                    finally:
                        self._cond.acquire()
                    if not answers:  # it died, or its machine is out of reach
                        raise PeerGone(
                            f"{src} is unreachable (nothing answers at {address}): {self.me} waited {wait:g} s for "
                            f"{tag!r} (step {step})"
                        )
                    if patience > 0:  # up and, in set-up, still working: wait another round
                        more = min(wait, patience)
                        patience -= more
                        deadline = time.monotonic() + more
                        continue
                    if grace_given:
                        raise FederationError(
                            f"{src} did not send {tag!r} (step {step}) to {self.me} within {waited:g} s"
                        )
                    # `src` is up, so it is waiting on someone else: that one's absence is being found by whoever
                    # waits on it, whose abort names it; give it a moment to arrive
                    grace_given = True
                    deadline = time.monotonic() + min(ABORT_GRACE, wait)
                    continue
                self._cond.wait(remaining)
        check_step(src, self.me, tag, header.step, step)
        if type(payload) is TensorBytes:  # checked by the server's thread, copied in this one (see TensorBytes)
            payload = payload.tensor()
        conform(payload, expected, sender=src, tag=tag)
        return payload

    def taken(self, src: str) -> dict[str, tuple[int, int]]:
        """Per tag, (messages `src` had filed here, of which still unread): what this party took from `src`."""
        with self._cond:
            return {
                tag: (count, len(self._inbox.get((peer, tag)) or ()))
                for (peer, tag), count in self._next_in.items()
                if peer == src and tag not in (HELLO_TAG, DONE_TAG)
            }

    def _deliver(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The server's handler of one envelope: identify the sender by its certificate, check the message, file it.

        A sender refused before is refused before its envelope is read (the client's call is unary; on the wire
        it is the same as a stream of one, which the server reads only on demand).
        """
        sender = self._identify(context)
        self._enter(sender, context, stream=False)
        try:
            self._refuse_again(sender, context)
            request = next(requests, None)
            if request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{sender} called {self.me} without an envelope")
            return pb.Ack(seq=self._accept(request, sender, context)).SerializeToString()
        finally:
            self._leave(sender, stream=False)

    def _stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """The server's handler of a peer's stream: identified once, each envelope taken as `_deliver` takes one.

        Answered when the peer ends the stream, with the number of envelopes accepted (the first one refused aborts
        the stream with the reason instead). Only a peer this party greeted may open one, and one at a time.
        """
        sender, count = self._identify(context), 0
        self._enter(sender, context, stream=True)
        try:
            self._refuse_again(sender, context)
            for request in requests:
                self._accept(request, sender, context)
                count += 1
        finally:
            self._leave(sender, stream=True)
        return pb.Ack(seq=count).SerializeToString()

    def _enter(self, sender: str, context: grpc.ServicerContext, stream: bool) -> None:
        """Take one of `sender`'s places here (its stream, or one of its `MAX_CALLS` calls), or refuse the call."""
        with self._cond:
            if stream and self.greetings and sender not in self._expected:
                why = f"{sender} opened a stream to {self.me}, which has not greeted it (it talks only to its peers)"
            elif stream and self._open_streams_in[sender]:
                why = f"{sender} opened a second stream to {self.me}; a peer streams to it on one at a time"
            elif not stream and self._open_calls_in[sender] >= MAX_CALLS:
                why = f"{sender} has {MAX_CALLS} calls open to {self.me} already, the most one peer may have at once"
            else:
                (self._open_streams_in if stream else self._open_calls_in)[sender] += 1
                return
        log.warning("%s refused a call: %s", self.me, why)
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def _refuse_again(self, sender: str, context: grpc.ServicerContext) -> None:
        """Refuse a call and read nothing of it, from a sender refused before or one that may send nothing more.

        The first keeps its reason; the second is a peer this party has not greeted that has sent its greeting
        already (a greeting is all such a peer may send).
        """
        if sender not in self._refusals and (not self.greetings or sender in self._expected):
            return  # the common case, read without the lock (each message of a run passes here)
        with self._cond:
            earlier = self._refusals.get(sender)
            if earlier is None and self.greetings and sender not in self._expected and sender in self._hello_from:
                earlier = self._refusals.setdefault(
                    sender,
                    f"{sender} sent {self.me} more than its greeting, and {self.me} has not greeted it: a party takes "
                    "nothing but a greeting from a peer it does not talk to",
                )
                self._cond.notify_all()
        if earlier is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, earlier)

    def _leave(self, sender: str, stream: bool) -> None:
        with self._cond:
            (self._open_streams_in if stream else self._open_calls_in)[sender] -= 1

    def _accept(self, request: bytes, sender: str, context: grpc.ServicerContext) -> int:
        """Check one envelope from `sender` and file it; its sequence number, or the call aborted with the reason.

        In order, each before anything costs more: `sender` was not refused before; the header (who, for whom,
        which configuration and run, `_check_header`); whether this party will hold it (`_reserve`: the greeting,
        what `sender` has queued here); the payload's size in values, then the payload itself; its sequence.
        """
        size, reserved = len(request), False
        self._refuse_again(sender, context)  # refused once: nothing more from it is read
        try:
            header, data = parse_envelope(request, sender=sender)
            self._check_header(header, sender)
            reserved = self._reserve(header, sender, size)
            tag = header.tag
            payload = decode_payload(
                data, sender=sender, tag=tag, records=self.records, max_nodes=self.max_nodes, deferred=True
            )
            if tag == ABORT_TAG:  # out of band: no sequence, fails every receive from now on
                if not isinstance(payload, bytes) or len(payload) > MAX_REASON_BYTES:
                    raise FederationError(f"{sender} sent an abort that is not bytes of at most {MAX_REASON_BYTES}")
                text = " ".join(payload.decode("utf-8", errors="replace").split())[:500]
                reason = printable(text)  # a peer's words reach this party's terminal and log: no escape sequence
                with self._cond:
                    if self._aborted is None:
                        self._aborted = f"{sender} stopped: {reason}"
                    self._cond.notify_all()
                return header.seq
            if header.tag == HELLO_TAG:
                if payload != b"":
                    raise FederationError(f"{sender} sent a greeting that is not empty")
                with self._cond:
                    self._hello_from.add(sender)
            try:  # the receiving Wire meters every message it takes (`lvfl.ledger`): one it could not is refused here
                payload_nbytes(payload)
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
                filed = self._inbox.get((sender, header.tag))
                if filed is None:
                    filed = self._inbox[(sender, header.tag)] = deque()
                filed.append((header, payload, size))
                reserved = False  # filed: `receive` releases it
                key = (sender, self.me, header.tag)
                self.envelope_bytes[key] += size
                self.messages[key] += 1
                self._cond.notify_all()
        except Exception as err:  # noqa: BLE001 (a peer must not be able to leave this party waiting)
            if reserved:
                with self._cond:
                    self._queued_bytes[sender] -= size
                    self._queued_messages[sender] -= 1
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
        return header.seq

    def _reserve(self, header: Header, sender: str, size: int) -> bool:
        """Hold room for a `size`-byte message from `sender`, or refuse it; whether room was held (an abort's is not).

        Before this party greeted `sender`, nothing but its greeting and its abort is taken, each of a few kB at most
        (an abort is not filed: it stops the run). What `sender` has queued here unread stays within
        `max_queued_bytes` (a first message of any size passes) and `MAX_QUEUED_MESSAGES`.
        """
        tag = header.tag
        if tag in (HELLO_TAG, ABORT_TAG) and size > MAX_REASON_BYTES + 1024:
            raise FederationError(f"{sender} sent a {size}-byte {tag!r}; {self.me} takes one of at most a few kB")
        if tag == ABORT_TAG:  # not filed: it stops the run
            return False
        with self._cond:
            if tag != HELLO_TAG and self.greetings and sender not in self._expected:
                raise FederationError(
                    f"{sender} sent {tag!r} to {self.me}, which has not greeted it: a party takes nothing but a "
                    "greeting from a peer it does not talk to"
                )
            queued, count = self._queued_bytes[sender], self._queued_messages[sender]
            if queued and queued + size > self.max_queued_bytes or count >= MAX_QUEUED_MESSAGES:
                raise FederationError(
                    f"{sender} has {count} messages ({queued} bytes) queued at {self.me} that it has not read yet, "
                    f"and sent a {size}-byte {tag!r}: over what {self.me} holds for one peer "
                    f"({self.max_queued_bytes} bytes, max_queued_bytes, or {MAX_QUEUED_MESSAGES} messages)"
                )
            self._queued_bytes[sender] += size
            self._queued_messages[sender] += 1
            return True

    def _pin_callers(self) -> None:
        """Know each caller by the certificate the federation file pins for it (when the server starts)."""
        self._caller = PinnedCaller(pinned_fingerprints(self.federation), self.me)

    def _identify(self, context: grpc.ServicerContext) -> str:
        """The party whose pinned certificate the client presented; the call is refused if there is none."""
        name, fingerprint = self._caller(context)
        if name is not None:
            return name
        message = PinnedCaller.refusal(context, fingerprint, self.federation)
        log.warning("%s refused a connection: %s", self.me, message)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

    def _check_header(self, header: Header, sender: str) -> None:
        """Refuse an envelope `sender` sent for another party, configuration or run, or without a tag.

        The configuration is checked before the run: a run ID derived from the configuration (`lvfl party` without
        `--run_id`) differs whenever the configuration does, and the sections that differ say more than the IDs. A
        greeting must carry the configuration's fingerprint when this party has one: without it, nothing would
        check that the two parties run the same configuration.
        """
        tag = header.tag
        if header.src != sender:
            raise FederationError(
                f"{sender} (by its certificate) sent {tag!r} in an envelope claiming to be from {header.src!r}"
            )
        if header.dst != self.me:
            raise FederationError(f"{sender} sent {tag!r} addressed to {header.dst!r} to {self.me}")
        if tag == HELLO_TAG and self.fingerprint and not header.fingerprint:
            raise FederationError(
                f"{sender} greeted {self.me} without the configuration's fingerprint, which {self.me} checks every "
                "greeting against"
            )
        if self.fingerprint and header.fingerprint and header.fingerprint != self.fingerprint:
            raise FederationError(
                f"{sender} runs another configuration than {self.me}: "
                + _differences(header.fingerprint, self.fingerprint)
            )
        if header.run_id != self.run_id:
            raise FederationError(f"{sender} sent {tag!r} for run {header.run_id!r}; {self.me} runs {self.run_id!r}")
        if not tag:
            raise FederationError(f"{sender} sent a message without a tag")


def _differences(theirs: str, ours: str) -> str:
    """Which sections of two fingerprints differ, in words (both whole, where they have no sections).

    A fingerprint is ``section=digest,...`` (as `lvfl party` digests its config, section by section).
    """
    a, b = (dict(part.partition("=")[::2] for part in f.split(",")) for f in (theirs, ours))
    if "" in a or "" in b or set(a) != set(b):
        return f"fingerprint {theirs!r} vs {ours!r}"
    differ = [name for name in b if a[name] != b[name]]
    # a section that is no digest (a process group's rank, ``rank=1of2``) is named with both values
    shown = "".join(f" ({name} {a[name]} vs {b[name]})" for name in differ if not _is_digest(a[name] + b[name]))
    if len(differ) == 1:
        return f"the {differ[0]} section of the config differs{shown}"
    return f"the {', '.join(differ)} sections of the config differ{shown}"


def _is_digest(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
