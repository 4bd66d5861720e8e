"""The transport between party processes: the typed wire format, mutual-TLS gRPC, test PKI and federation file.

In simulation every party runs in one process and `lvfl.wire.Wire` hands payloads over in memory. In a party's
own process the same protocol code runs on what that party holds (docs/federation.md), and its Wire (`Wire(here=
party, carrier=...)`) sends and receives through this package, kept apart from the protocols so a protocol
never knows how it was launched:

- `codec`: payload <-> protobuf `Value` tree and `Envelope` (schema in ``envelope.proto``), and the allow-list of
  record types. Nothing a peer sends is ever unpickled; every field is checked and every refusal is one line naming
  the sender and the tag.
- `wire_form`: the first steps of decoding, on the envelope's bytes before protobuf parses them: the header read with
  the payload left as bytes, the payload's values counted and bounded, one tensor read off the bytes.
- `expectations`: what a party accepts: a decoded payload checked against the receiver's template (`conform`).
- `envelope_schema`: the schema's version, the header, the dtypes a tensor may have and a payload's bounds.
- `transport`: one gRPC server per party and a channel per peer, mutual TLS, sender identity from its certificate.
- `inbox`: a transport's receiving side: the checks a peer's message must pass before it is queued, the mailbox.
- `outbox`: a transport's sending side: a channel, an outbox and a stream per peer, `flush`, the send errors.
- `addresses`: socket probes of an address: free to listen on, connected, or silent (to word a failure).
- `pki`: a throw-away CA and party certificates for tests and local runs, and the certificate checks.
- `federation_file`: the public YAML file, identical at every party, naming each party's address and certificate.
- `link`: the Wire's carrier over a party's `Transport` (each message stamped with the protocol's step).
- `rehearsal`: every party's view of a run in one process, on an in-memory carrier, for tests.
- `identity`: a party's TLS key as the signer of what it must vouch for (DHMasking's keys), checked by its peers.

The commands that run a party's process (`lvfl party`, `lvfl launch`, `lvfl pki`) are `lvfl.commands`'; this package
knows no command. Submodules are imported on demand: `import lvfl.federation` pulls in neither gRPC nor protobuf, so a
module that registers a record type (`lvfl.federation.codec.register_record`) costs nothing to one that never sends.
"""

from __future__ import annotations

__all__ = ["FederationError", "PeerGone"]


class FederationError(ValueError):
    """A refused message, certificate, federation file or peer, in one line naming the party and what was wrong.

    A `ValueError`, so the command line's error boundary (`lvfl.commands.errors.reported_errors`) prints it as one line:
    a refusal is a property of the input (a peer's message, a file), not a bug in lvfl.
    """


class PeerGone(FederationError):
    """A peer that nothing answers for any more: it stopped, died, or its machine is out of reach.

    Raised where a party waits on that peer; after this party's work is done (`Transport.goodbye`) it is no error.
    """
