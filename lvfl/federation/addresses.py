"""What a party's or a peer's address answers at the socket level: free to listen on, connected, or silent.

`lvfl.federation.transport` asks these before it listens (`check_port_free`) and when a peer is silent, to say
why in the error (`connected`, `port_answers`). They know sockets and a gRPC channel only, nothing of the
federation's messages, so the receiving side and the sending side both use them without importing each other.
"""

from __future__ import annotations

import errno
import socket

import grpc

from lvfl.federation import FederationError

__all__ = ["check_port_free", "connected", "port_answers"]


def check_port_free(address: str, cannot_listen: str) -> None:
    """Refuse an address any of whose resolved sockets is taken.

    gRPC binds every address a host name resolves to (``localhost``: 127.0.0.1 and ::1) and starts if *one* bind
    succeeds, so a port held by another process on 127.0.0.1 alone would go unnoticed while half the peers
    reached that process instead. Checked here first; another process may still take it in between (then gRPC's
    own refusal applies).

    Args:
        address: the ``host:port`` the server is to bind.
        cannot_listen: the start of every refusal's line (which party cannot listen where).

    Raises:
        FederationError: the host does not resolve, or one of its addresses cannot be bound (the port in use).
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


def connected(channel: grpc.Channel, wait: float = 0.2) -> bool:
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


def port_answers(address: str) -> bool:
    """Whether a TCP connection to `address` opens: tells a peer that is down from one that refuses our TLS."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False
