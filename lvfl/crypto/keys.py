"""Pairwise key agreement: X25519 (RFC 7748) followed by HKDF-SHA256 (RFC 5869).

Every pair of passive parties derives a 32-byte pair key that only the two of them know; the active party relays
the public keys and so learns nothing about pair keys. The raw X25519 output is not uniformly random (it is a curve
coordinate), so it goes through HKDF with an `info` string binding the two party names: each pair key is then
specific to that pair and context, and both ends derive the same key because the names are sorted first
(see `pair_info`).
"""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PUBLIC_KEY_BYTES = 32
PRIVATE_KEY_BYTES = 32
PAIR_KEY_BYTES = 32
#: domain separation for the pair keys of `lvfl.privacy.DHMasking`
MASKING_CONTEXT = b"lvfl/dh-masking/v1"


def generate_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the operating system's CSPRNG."""
    return X25519PrivateKey.generate()


def private_key_from_bytes(raw: bytes) -> X25519PrivateKey:
    """Load a 32-byte raw X25519 private key (for known-answer tests and explicit key material)."""
    if not isinstance(raw, bytes | bytearray) or len(raw) != PRIVATE_KEY_BYTES:
        raise ValueError(f"an X25519 private key is {PRIVATE_KEY_BYTES} raw bytes")
    return X25519PrivateKey.from_private_bytes(bytes(raw))


def public_key_bytes(private: X25519PrivateKey) -> bytes:
    """The 32-byte raw encoding of `private`'s public key: what goes on the wire."""
    if not isinstance(private, X25519PrivateKey):
        raise TypeError(f"private must be an X25519PrivateKey, got {type(private).__name__}")
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh private key and its 32-byte public key."""
    private = generate_private_key()
    return private, public_key_bytes(private)


def x25519_shared_secret(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The raw 32-byte X25519 output `X25519(private, peer_public)`; use `shared_pair_key`, not this, as a key.

    Raises:
        ValueError: if `peer_public` is not 32 bytes, or is a low-order point (all-zero shared secret).
    """
    if not isinstance(private, X25519PrivateKey):
        raise TypeError(f"private must be an X25519PrivateKey, got {type(private).__name__}")
    if not isinstance(peer_public, bytes | bytearray) or len(peer_public) != PUBLIC_KEY_BYTES:
        got = len(peer_public) if isinstance(peer_public, bytes | bytearray) else type(peer_public).__name__
        raise ValueError(f"peer public key must be {PUBLIC_KEY_BYTES} raw bytes, got {got}")
    try:
        secret = private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
    except ValueError as err:  # cryptography refuses low-order points
        raise ValueError(f"X25519 key agreement failed: peer public key is invalid ({err})") from None
    if secret == bytes(PAIR_KEY_BYTES):
        raise ValueError("X25519 key agreement failed: peer public key is a low-order point")
    return secret


def pair_info(party_a: str, party_b: str, context: bytes = MASKING_CONTEXT) -> bytes:
    """HKDF `info` binding `context` and both party names, in sorted order so both ends derive the same key.

    Names are length-prefixed so that no two different pairs encode to the same bytes ("a"+"bc" vs "ab"+"c").
    """
    if party_a == party_b:
        raise ValueError(f"a pair key needs two different parties, got {party_a!r} twice")
    first, second = sorted((party_a, party_b))
    parts = [context, first.encode(), second.encode()]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def hkdf_sha256(secret: bytes, info: bytes, length: int = PAIR_KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869) with no salt (the IKM is already a Diffie-Hellman secret), expanding to `length`."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def shared_pair_key(private: X25519PrivateKey, peer_public: bytes, info: bytes) -> bytes:
    """A 32-byte symmetric key shared with the owner of `peer_public`: HKDF-SHA256(X25519(private, peer), info).

    Args:
        private: this party's X25519 private key.
        peer_public: the peer's 32-byte raw public key, as received on the wire.
        info: context binding both parties, e.g. `pair_info(me, peer)`; both ends must pass the same bytes.
    """
    if not isinstance(info, bytes | bytearray):
        raise TypeError(f"info must be bytes, got {type(info).__name__}")
    return hkdf_sha256(x25519_shared_secret(private, peer_public), bytes(info))
