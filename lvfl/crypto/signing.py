"""Signatures that bind a value to the party that made it: ECDSA over P-256 with SHA-256, 64 bytes on the wire.

Why: DHMasking's X25519 public keys travel through the active party, which relays each passive party's key to the
others. Unsigned, an active party could swap them for its own (a man in the middle) and share a pair key with every
passive party. Each passive party therefore signs its public key with its identity key, and a receiver checks the
signature against the sender's identity before deriving a pair key.

Identities (`Identities`): when every party runs its own process, a party's identity is its TLS key and the
certificate pinned for it (the transport's `TLSIdentities`); in simulation, `SimulatedIdentities` draws a
throw-away P-256 key per party from the OS, so that the signatures, their checks and their bytes on the wire are
the same in both. Each identity also names its `session`, the run its signatures are made in (the transport's run
ID; a random value per simulation): what a party signs includes it, so a signature recorded in one run does not
verify in another. A signature is encoded as r || s, 32 bytes each (not DER, whose length varies), so the ledger
counts the same bytes in every run.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

__all__ = ["SIGNATURE_BYTES", "Identities", "SimulatedIdentities", "sign", "signed_message", "verify"]

#: r || s of an ECDSA P-256 signature
SIGNATURE_BYTES = 64
_HALF = SIGNATURE_BYTES // 2


def signed_message(context: bytes, party: str, value: bytes, *bound: bytes) -> bytes:
    """What is signed: `context`, the party's name, `value` and what it is `bound` to, each length-prefixed.

    `bound` holds what the signature is valid for besides its value (the run's session, the round of a key set-up);
    the length prefixes make every tuple encode differently.
    """
    parts = [context, party.encode(), bytes(value), *(bytes(b) for b in bound)]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def sign(private_key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    """ECDSA-SHA256 signature of `message` by a P-256 key, as 64 bytes r || s."""
    if not isinstance(private_key, ec.EllipticCurvePrivateKey) or private_key.curve.name != "secp256r1":
        raise TypeError("identity keys are ECDSA P-256 (secp256r1) keys")
    r, s = decode_dss_signature(private_key.sign(message, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(_HALF, "big") + s.to_bytes(_HALF, "big")


def verify(public_key: ec.EllipticCurvePublicKey, message: bytes, signature: bytes) -> bool:
    """Whether `signature` (64 bytes r || s) is `public_key`'s ECDSA-SHA256 signature of `message`."""
    if not isinstance(signature, bytes | bytearray) or len(signature) != SIGNATURE_BYTES:
        return False
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp256r1":
        return False
    der = encode_dss_signature(int.from_bytes(signature[:_HALF], "big"), int.from_bytes(signature[_HALF:], "big"))
    try:
        public_key.verify(der, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


class Identities(Protocol):
    """Who each party is: signs for the parties held here, checks any party's signature, in one session (a run)."""

    #: the run this identity signs in; a signed message binds it (`signed_message(..., identities.session)`)
    session: bytes

    def sign(self, party: str, message: bytes) -> bytes:
        """`party`'s signature of `message` (only for a party whose identity key is held here)."""

    def verify(self, party: str, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is `party`'s signature of `message`."""


class SimulatedIdentities:
    """A throw-away P-256 identity key per party, drawn from the OS on first use (the simulation's TLS identities).

    Every party lives in one process in simulation, so one object holds every key; it is never saved, copied into
    a checkpoint or pickled (a copy starts with no keys and draws fresh ones, and a session of its own).
    """

    def __init__(self) -> None:
        self.session = os.urandom(16)  # this simulation's run: fresh in every process and copy
        self._keys: dict[str, ec.EllipticCurvePrivateKey] = {}
        self._lock = threading.Lock()  # the one-process rehearsal signs from several threads

    def _key(self, party: str) -> ec.EllipticCurvePrivateKey:
        with self._lock:
            if party not in self._keys:
                self._keys[party] = ec.generate_private_key(ec.SECP256R1())
            return self._keys[party]

    def sign(self, party: str, message: bytes) -> bytes:
        """`party`'s signature of `message`."""
        return sign(self._key(party), message)

    def verify(self, party: str, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is `party`'s signature of `message`."""
        return verify(self._key(party).public_key(), message, signature)

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __deepcopy__(self, memo: dict) -> SimulatedIdentities:
        return SimulatedIdentities()
