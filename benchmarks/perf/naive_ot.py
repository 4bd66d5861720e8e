"""The naive 1-out-of-N oblivious transfer the OT benchmark compares the oblivious lookup against.

1-out-of-N OT (N = 2**B) from B 1-out-of-2 OTs (Naor-Pinkas style): the sender draws B pairs of 16-byte keys
(K_j^0, K_j^1) and sends every message m_u encrypted under SHA-256(K_0^{u_0}, ..., K_{B-1}^{u_{B-1}}, u) where u_j
is bit j of u; the receiver obtains K_j^{c_j} for the bits of its choice c by B 1-out-of-2 OTs and can open exactly
m_c. Cost: B OTs and N ciphertexts, the "(N over 1)-OT" row of Table 4 in the student-model oblivious inference
paper. Only `benchmarks/perf/ot.py` (and its tests) use it: lvfl's own lookup is `lvfl.inference.oblivious`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from lvfl.crypto.ot import KEY_BYTES, OTReceiver, OTSender, bits_of, decrypt_message, encrypt_message, log2_exact
from lvfl.wire import Wire

ONE_OF_N_CONTEXT = b"lvfl/1-of-n-ot/v1"


def one_of_n_key(bit_keys: Sequence[bytes], index: int) -> bytes:
    """SHA-256(context, index, K_0, ..., K_{B-1}): the AES-GCM key of message `index` of a 1-out-of-N OT."""
    h = hashlib.sha256(ONE_OF_N_CONTEXT + index.to_bytes(8, "big"))
    for key in bit_keys:
        h.update(key)
    return h.digest()


def one_of_n_encrypt(messages: Sequence[bytes], key_pairs: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
    """Encrypt message u under the keys K_j^{u_j} picked by the bits of u (the sender's side of 1-out-of-N OT)."""
    nbits = len(key_pairs)
    return [
        encrypt_message(one_of_n_key([key_pairs[j][bit] for j, bit in enumerate(bits_of(u, nbits))], u), m)
        for u, m in enumerate(messages)
    ]


def ot_1_of_n(
    messages: Sequence[bytes],
    choice: int,
    *,
    wire: Wire,
    sender: str = "sender",
    receiver: str = "receiver",
    tag: str = "ot",
    session: bytes = b"",
) -> bytes:
    """1-out-of-N OT (N a power of two) from log2 N 1-out-of-2 OTs on per-bit keys; returns `messages[choice]`.

    Three messages: A; the receiver's log2 N points; the OT ciphertext pairs together with the N encrypted messages.

    Raises:
        ValueError: if N is not a power of two >= 2, the messages differ in length, or `choice` is out of range.
    """
    nbits = log2_exact(len(messages), "the number of messages")
    if len({len(m) for m in messages}) != 1:
        raise ValueError("all messages of a 1-out-of-N OT must have the same length (sizes would leak)")
    if isinstance(choice, bool) or not 0 <= choice < len(messages):
        raise ValueError(f"choice must be in [0, {len(messages)}), got {choice!r}")
    key_pairs = [(secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES)) for _ in range(nbits)]
    ot_sender = OTSender(session)
    ot_receiver = OTReceiver(wire.send(sender, receiver, ot_sender.public_point(), tag), session)
    points = wire.send(receiver, sender, ot_receiver.choose(bits_of(choice, nbits)), tag)
    reply = [ot_sender.respond(points, key_pairs), one_of_n_encrypt(messages, key_pairs)]
    key_cts, message_cts = wire.send(sender, receiver, reply, tag)
    bit_keys = ot_receiver.receive(key_cts)
    return decrypt_message(one_of_n_key(bit_keys, choice), message_cts[choice])
