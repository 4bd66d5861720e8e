"""Mutual TLS between parties, for any gRPC service: the pins, the server's credentials, a pinned channel, the caller.

The training transport (`lvfl.federation.transport`) and the serving processes (`lvfl.serving`) authenticate the
same way: every party's certificate is checked against the CA and pinned by its SHA-256 fingerprint, a party dials
a peer trusting only the certificate the federation file pins for it, and a server knows who called by the pinned
certificate the caller presented (a certificate the CA signed but no party is pinned to is refused).
"""

from __future__ import annotations

import os

import grpc

from lvfl.federation import FederationError
from lvfl.federation.expectations import printable
from lvfl.federation.federation_file import Federation
from lvfl.federation.pki import certificate_fingerprint, check_ca, check_certificate, check_key

__all__ = ["BACKOFF_OPTIONS", "PinnedCaller", "pinned_channel", "pinned_fingerprints", "server_credentials"]

#: reconnect quickly while a peer is starting or back after a restart (gRPC's default backoff starts at 1 s and
#: grows to 2 min)
BACKOFF_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def pinned_fingerprints(federation: Federation) -> dict[str, str]:
    """Each party's certificate fingerprint, every certificate checked against the CA and its party's name first.

    Raises:
        FederationError: a certificate that is not valid, not the CA's or not its party's; two parties' alike.
    """
    check_ca(federation.ca)
    pins = {
        party.name: certificate_fingerprint(check_certificate(party.certificate, federation.ca, party.name))
        for party in federation.parties.values()
    }
    if len(set(pins.values())) != len(pins):
        raise FederationError(f"federation file {federation.path}: two parties have the same certificate")
    return pins


def server_credentials(federation: Federation, me: str, key_path: str | os.PathLike[str]) -> grpc.ServerCredentials:
    """A server's TLS credentials as party `me` (its checked key), requiring a client certificate of the CA."""
    certificate = federation.party(me).certificate
    key_pem = check_key(key_path, certificate)
    return grpc.ssl_server_credentials(
        [(key_pem, certificate.read_bytes())], root_certificates=federation.ca.read_bytes(), require_client_auth=True
    )


def pinned_channel(
    federation: Federation,
    peer: str,
    key_pem: bytes,
    certificate_pem: bytes,
    options: list[tuple[str, object]] | None = None,
) -> grpc.Channel:
    """A channel to `peer` at its address whose only trust anchor is the certificate pinned for it.

    Its TLS name is checked as the peer's: a server at the peer's address holding another party's certificate, or
    a certificate freshly minted with the CA's key, fails the handshake, so nothing is sent to it. This party
    presents its own certificate (`key_pem`, `certificate_pem`), which the peer checks against its pin.
    """
    pinned = federation.party(peer).certificate.read_bytes()
    return grpc.secure_channel(
        federation.party(peer).address,
        grpc.ssl_channel_credentials(pinned, key_pem, certificate_pem),
        options=[("grpc.ssl_target_name_override", peer), *BACKOFF_OPTIONS, *(options or [])],
    )


class PinnedCaller:
    """Who called a server: the party whose pinned certificate the client presented, or None."""

    def __init__(self, pins: dict[str, str], me: str) -> None:
        self._pins = {pin: name for name, pin in pins.items() if name != me}
        self._known: dict[bytes, str] = {}  # a pinned peer's certificate (PEM) -> its name, parsed once

    def __call__(self, context: grpc.ServicerContext) -> tuple[str | None, str]:
        """(the calling party, or None; the presented certificate's fingerprint, for a refusal's message)."""
        certificates = context.auth_context().get("x509_pem_cert") or [b""]
        known = self._known.get(certificates[0])
        if known is not None:
            return known, ""
        try:
            fingerprint = certificate_fingerprint(certificates[0])
        except ValueError:
            fingerprint = ""
        name = self._pins.get(fingerprint) if fingerprint else None
        if name is not None:
            self._known[certificates[0]] = name
        return name, fingerprint

    @staticmethod
    def refusal(context: grpc.ServicerContext, fingerprint: str, federation: Federation) -> str:
        """Why a caller with no pinned certificate is refused, its claimed name escaped."""
        names = b",".join(context.auth_context().get("x509_common_name") or [b"?"])
        claimed = printable(names.decode(errors="replace"))
        return (
            f"a peer presenting a certificate for CN={claimed} (sha256 {fingerprint[:16] or '?'}...) is not a party "
            f"of this federation: its certificate is not the one pinned for any party in {federation.path}"
        )
