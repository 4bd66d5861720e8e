"""Batched 1-out-of-2 oblivious transfer with both roles in one process and every message on a `Wire`.

The roles and their cryptography are `lvfl.crypto.ot` (`OTSender`, `OTReceiver`: Chou-Orlandi simplest OT over
secp256k1, semi-honest parties); this driver only moves their three messages between two named parties on the wire
(sender -> receiver the point A, receiver -> sender the choice points, sender -> receiver the ciphertext pairs), so
bytes and messages are metered like any other traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lvfl.crypto.ot import OTReceiver, OTSender
from lvfl.wire import Wire

__all__ = ["batch_ot", "ot_1_of_2"]


def batch_ot(
    messages: Sequence[tuple[bytes, bytes]],
    choices: Sequence[int],
    *,
    wire: Wire,
    sender: str = "sender",
    receiver: str = "receiver",
    tag: str = "ot",
    session: bytes = b"",
) -> list[bytes]:
    """Run len(messages) 1-out-of-2 OTs in one batch (3 messages in all); returns what the receiver learns.

    Args:
        messages: the sender's pairs (m0, m1), the two of a pair of equal length.
        choices: the receiver's choice bits, one per pair.
        wire: every message is sent on it (sender -> receiver A, receiver -> sender the points, sender -> receiver
            the ciphertext pairs).
        sender: the sender's party name on the wire.
        receiver: the receiver's party name on the wire.
        tag: the wire tag of all three messages.
        session: transcript tag hashed into the keys.
    """
    if len(messages) != len(choices):
        raise ValueError(f"got {len(messages)} message pairs for {len(choices)} choices")
    ot_sender = OTSender(session)
    ot_receiver = OTReceiver(wire.send(sender, receiver, ot_sender.public_point(), tag), session)
    points = wire.send(receiver, sender, ot_receiver.choose(choices), tag)
    return ot_receiver.receive(wire.send(sender, receiver, ot_sender.respond(points, messages), tag))


def ot_1_of_2(m0: bytes, m1: bytes, choice: int, **kwargs: Any) -> bytes:
    """One 1-out-of-2 OT: the receiver learns `(m0, m1)[choice]` and nothing about the other; see `batch_ot`."""
    return batch_ot([(m0, m1)], [choice], **kwargs)[0]
