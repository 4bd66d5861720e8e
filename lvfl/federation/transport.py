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
for each party in the federation file, and refuses an envelope whose ``src`` is not that party; the client trusts
only the certificate pinned for the peer it dials, so a server at that address with any other certificate, even one
the CA signed, gets nothing. It also refuses a
message of another run or configuration (``run_id``, ``fingerprint``), out of sequence (each (src, dst, tag) is
numbered from 0: a lost or replayed message shows), or that the codec refuses; and `receive` refuses a message for
another step than the one the protocol is at. A refused message is answered with the reason (the sender's `send`
raises it) and also fails the receiver's next `receive` from that party, so both ends stop with the same line.

Envelopes are counted per (src, dst, tag) for both directions (`envelope_bytes`, as they crossed the socket:
protobuf framing, header and all; `messages`); what their payloads hold is the Wire's ledger to count
(`lvfl.ledger`), once.

This module holds `Transport`'s life cycle (certificates checked, server and channels opened and closed), the
greeting and the abort. What both sides share (one lock, the ledger, the failures) is `lvfl.federation.endpoint`;
the receiving side (the server's checks, the mailbox, `receive`) is `lvfl.federation.inbox`, the sending side
(channels, outboxes and streams, `send`, `flush`) is `lvfl.federation.outbox`, and the socket probes are
`lvfl.federation.addresses`.

Example:
    >>> with Transport("party1", "federation.yaml", run_id="run-7") as transport:  # doctest: +SKIP
    ...     transport.send("party0", "embeddings", step=0, payload=embeddings)
    ...     grad = transport.receive("party0", "gradients", step=0, expected=embeddings)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc

from lvfl.federation import FederationError, PeerGone
from lvfl.federation.addresses import check_port_free, port_answers
from lvfl.federation.codec import RECORDS, RecordRegistry, encode_envelope
from lvfl.federation.envelope_schema import MAX_NODES, Header
from lvfl.federation.federation_file import Federation, load_federation
from lvfl.federation.identity import TLSIdentities
from lvfl.federation.inbox import ABORT_TAG, DONE_TAG, HELLO_TAG, MAX_CALLS, Inbox
from lvfl.federation.outbox import DELIVER, Outbox
from lvfl.federation.pki import check_key

__all__ = [
    "ABORT_TAG",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_TIMEOUT",
    "DELIVER",
    "DONE_TAG",
    "HELLO_TAG",
    "Transport",
    "transports",
]

#: seconds a receive waits for its message, and a send for its peer to come up and acknowledge
DEFAULT_TIMEOUT = 60.0
#: largest envelope a party accepts: room for a CKKS key exchange or a large batch, far below gRPC's 2 GiB cap
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2**20
#: most bytes of one peer's messages a party holds unread (beyond a single message of any accepted size)
DEFAULT_MAX_QUEUED_BYTES = 64 * 2**20


class Transport(Inbox, Outbox):
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
        greetings: whether a peer must be greeted (`hello`) before this party takes more than its greeting from it;
            off only for tests that exercise the message path alone.
        max_queued_bytes: the most bytes of one peer's messages this party holds unread; a message past it is
            refused, naming the peer (one message of up to `max_message_bytes` always fits an empty queue).
        max_nodes: the most values one payload may hold (`lvfl.federation.wire_form.scan_payload`).

    Sends to one (peer, tag) must come from one thread at a time: their sequence numbers are their order.
    `receive` and the server's checks are `lvfl.federation.inbox.Inbox`'s; `send` and `flush` are
    `lvfl.federation.outbox.Outbox`'s.
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
        greetings: bool = True,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        max_nodes: int = MAX_NODES,
    ) -> None:
        self.federation = federation if isinstance(federation, Federation) else load_federation(federation)
        self.me = self.federation.party(me).name
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not 0 < max_message_bytes < 2**31:
            raise ValueError(f"max_message_bytes must be in [1, 2**31 - 1], got {max_message_bytes!r}")
        if not max_queued_bytes > 0:
            raise ValueError(f"max_queued_bytes must be a positive number of bytes, got {max_queued_bytes!r}")
        if not max_nodes > 0:
            raise ValueError(f"max_nodes must be a positive number of values, got {max_nodes!r}")
        self.run_id, self.timeout, self.max_message_bytes = run_id, float(timeout), int(max_message_bytes)
        self.greetings, self.max_queued_bytes, self.max_nodes = bool(greetings), int(max_queued_bytes), int(max_nodes)
        self.fingerprint, self.records = fingerprint, records
        self.key_path = Path(key_path) if key_path is not None else self.federation.key_path(me)
        self.listen = listen or self.federation.party(me).address
        self.peers = tuple(name for name in self.federation.parties if name != me)
        self._init_endpoint()  # one lock for both sides, the ledger, no failure yet
        self._init_inbox()  # the mailbox
        self._init_outbox()  # the outboxes and their streams
        self._server: grpc.Server | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.identities: TLSIdentities | None = None  # this party's TLS identity, once started

    # -- life cycle ------------------------------------------------------------------------------------------------
    def start(self) -> Transport:
        """Check every certificate and this party's key, listen at this party's address, open a channel per peer."""
        if self._server is not None:
            raise RuntimeError(f"the transport of {self.me} is already started")
        self._pin_callers()
        self.identities = TLSIdentities(self.me, self.federation, self.key_path, run_id=self.run_id)
        ca_pem = self.federation.ca.read_bytes()
        cert_pem = self.federation.party(self.me).certificate.read_bytes()
        key_pem = check_key(self.key_path, self.federation.party(self.me).certificate)
        self._executor = ThreadPoolExecutor(
            # per peer, its stream for the whole run and its single calls (hello, abort, a send that waits), each
            # peer held to its own places (`Inbox._enter`), so none can take another's; and two to spare
            max_workers=(1 + MAX_CALLS) * len(self.peers) + 2,
            thread_name_prefix=f"lvfl-{self.me}",
        )
        server = grpc.server(
            self._executor,
            options=[
                ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
                ("grpc.max_receive_message_length", self.max_message_bytes),
            ],
        )
        server.add_generic_rpc_handlers((self._handler(),))
        credentials = grpc.ssl_server_credentials(
            [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
        )
        cannot_listen = f"party {self.me} cannot listen on {self.listen}"
        check_port_free(self.listen, cannot_listen)
        try:
            port = server.add_secure_port(self.listen, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            server.stop(None)
            raise FederationError(f"{cannot_listen}: the port is in use, or the host is not this machine")
        server.start()
        self._server = server
        self._dial(key_pem, cert_pem)
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
        self._hang_up()

    def __enter__(self) -> Transport:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- greeting and abort ----------------------------------------------------------------------------------------
    def hello(self, peers: Sequence[str] | None = None, patience: float = 0.0) -> None:
        """Greet `peers` (default: every peer) and wait for each one's greeting: up, on this run and configuration.

        The greeting is an empty message under tag ``hello`` (not on the Wire's ledger); its header carries the run
        ID and the configuration's fingerprint, which the peer checks (a refusal names the sections that differ).
        Greeting a peer is also what lets it send this party more than its greeting (`Inbox`'s bounds).

        `patience`: further seconds beyond the timeout to wait for a peer to come up, and for its greeting while it
        is up (it may be waiting for another peer to come up): party processes start when their organisations start
        them, and a loaded machine takes a minute to import PyTorch.
        """
        peers = self.peers if peers is None else tuple(peers)
        for peer in peers:
            self._check_peer(peer)
        with self._cond:  # before the greeting leaves: a peer's messages after its own greeting are then taken
            self._expected.update(peers)
        for peer in peers:
            self.send(peer, HELLO_TAG, -1, b"", patience=patience)
        for peer in peers:
            self.receive(peer, HELLO_TAG, -1, patience=patience)

    def expect(self, peers: Sequence[str]) -> None:
        """Take messages from `peers` without greeting them: the senders of a one-way edge.

        An HE backend's coordinator sends every party its public key, and the passive parties never write back (nor
        need to reach its port): they expect it instead of greeting it.
        """
        for peer in peers:
            self._check_peer(peer)
        with self._cond:
            self._expected.update(peers)

    def goodbye(self, to: Sequence[str], waits_for: Sequence[str], patience: float = 0.0) -> list[str]:
        """The orderly end of a run: say this party is done, wait for its peers' word, check every message was taken.

        First every queued message is delivered (`flush`). Then each peer in `to` (those this party sends to) is told,
        in one acknowledged call, that this party sends nothing more and how many messages of each tag it sent; and
        this party waits for the same word from each peer in `waits_for` (those that send to it), `timeout` at a time
        while the peer is up, for at most `timeout + patience` seconds: so no party stops its server while a peer may
        still deliver to it. A peer's count is then checked against what this party took: a message it sent that
        this party never read means the parties' code disagrees about the schedule, and fails the run in one line
        naming the tag, the sender and the receiver.

        Returns the peers that were gone (nothing answers at their address) before they said they were done: after
        this party's work is done that is no error, and the caller says so.

        Raises:
            FederationError: a queued message was not delivered, a peer stopped on an error (its abort), a peer's
                message was never taken, or a peer that is up did not say it was done in time.
        """
        self.flush()
        gone: list[str] = []
        for peer in to:
            self._check_peer(peer)
            sent = {
                tag: n
                for (src, dst, tag), n in sorted(self.messages.items())
                if src == self.me and dst == peer and tag not in (HELLO_TAG, DONE_TAG)
            }
            try:
                self.send(peer, DONE_TAG, -1, json.dumps(sent, sort_keys=True).encode(), wait=True)
            except FederationError:
                if port_answers(self.federation.party(peer).address):
                    raise
                gone.append(peer)  # it left after taking all this party delivered (`flush` confirmed it)
        for peer in waits_for:
            try:
                word = self.receive(peer, DONE_TAG, -1, patience=patience)
            except PeerGone:
                if peer not in gone:
                    gone.append(peer)
                continue
            self._check_taken(peer, word)
        return gone

    def _check_taken(self, peer: str, word: object) -> None:
        """Refuse, in one line, a `done` word whose counts are not what this party took from `peer`."""
        try:
            said = json.loads(bytes(word).decode("utf-8")) if isinstance(word, bytes | bytearray) else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            said = None
        if not isinstance(said, dict) or not all(isinstance(n, int) and n >= 0 for n in said.values()):
            raise FederationError(f"{peer} said it was done with a word that is not its message counts")
        taken = self.taken(peer)
        for tag in sorted(set(said) | set(taken)):
            sent, (filed, unread) = int(said.get(tag, 0)), taken.get(tag, (0, 0))
            if unread or filed != sent:
                raise FederationError(
                    f"{peer} sent {tag!r} to {self.me} {sent} times and {self.me} took {filed - unread}: "
                    f"{sent - filed + unread} never taken (the parties' code disagrees about the message schedule)"
                )

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

    # -- the ledger ------------------------------------------------------------------------------------------------
    def bytes_by_tag(self) -> dict[str, int]:
        """Envelope bytes per tag over both directions."""
        out: Counter[str] = Counter()
        for (_, _, tag), n in self.envelope_bytes.items():
            out[tag] += n
        return dict(out)


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
