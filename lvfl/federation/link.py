"""The Wire's `Carrier` over a party's gRPC `Transport`: the seam between protocol code and the sockets.

A party's view of the wire (`lvfl.wire.Wire(here=..., carrier=...)`) calls `post` when its party sends and
`take` when it receives, with the protocol's step and the receiver's shadow of the message as what it expects.
`SocketLink` adds what the network needs and the protocol does not know: the templates the codec checks a received
payload against, and the patience a set-up message (step -1) gets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from lvfl.federation.transport import Transport
from lvfl.wire import Absent

__all__ = ["SocketLink", "template"]


def template(expected: Any) -> Any:
    """The codec's template (`lvfl.federation.expectations.conform`) for a receiver's shadow of a message.

    A shadow tensor fixes the dtype and shape; a record whose data is in tensors (a `CompressedTensor`, shadowed as
    the same record with meta tensors, `lvfl.wire.shadow`) fixes every field: its tensors' dtypes and shapes and its
    other fields' values (the shape it rebuilds to, its bits), so a peer cannot choose what the receiver rebuilds;
    an `Absent` (a key, a ciphertext: its size is known only to its sender) accepts any value, which the code that
    uses it then checks (a backend's `combine`).
    """
    if isinstance(expected, torch.Tensor):
        return expected
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type | Absent):
        return expected
    if isinstance(expected, dict):
        return {k: template(v) for k, v in expected.items()}
    if isinstance(expected, list | tuple):
        return type(expected)(template(v) for v in expected)
    return None


class SocketLink:
    """Carries a party view's messages on `transport` (a `lvfl.wire.Carrier`), each stamped with its step.

    `setup_patience`: seconds a set-up message (step -1: key agreement, PSI, split) may take beyond the transport's
    timeout while its sender is up, since set-up work grows with the tables (`Inbox.receive`'s `patience`).
    """

    def __init__(self, transport: Transport, setup_patience: float = 0.0) -> None:
        self.transport = transport
        self.setup_patience = float(setup_patience)
        self.identities = transport.identities  # this party's TLS identity, and its peers' pinned certificates

    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        """Send `payload` to `dst`; `src` is this party (a view sends only its own messages)."""
        if src != self.transport.me:
            raise ValueError(f"party {self.transport.me!r} cannot send a message as {src!r}")
        self.transport.send(dst, tag, step, payload, wait=False)  # in order per peer; failures raise later

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        """The next message from `src` under `tag`, sent at `step`, of the form of `expected`."""
        if dst != self.transport.me:
            raise ValueError(f"party {self.transport.me!r} cannot receive a message for {dst!r}")
        patience = self.setup_patience if step < 0 else 0.0
        return self.transport.receive(src, tag, step, expected=template(expected), patience=patience)
