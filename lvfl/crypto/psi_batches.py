"""The batch work of ECDH-PSI that worker processes run: hash and blind IDs, re-blind points.

The blinding itself (`PSIKey`) is `lvfl.crypto.ecdh_blinding`. A module of its own, importing only `cryptography` and
the hash to the curve, because a worker process imports the module of the function it runs: from here that is a
Python of about 30 MB, where `lvfl.crypto.ecdh_blinding` (which draws its secret permutations as torch tensors,
`lvfl.crypto.prg`) would load PyTorch into every worker, about 500 MB each.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from lvfl.crypto.hash_to_curve import hash_to_u

__all__ = ["DST", "POINT_BYTES", "hash_and_blind", "reblind"]

DST = b"lvfl-psi-v1-curve25519_XMD:SHA-512_ELL2_RO_"  #: the hash's domain separation tag (RFC 9380 Sec. 3.1)
POINT_BYTES = 32  #: one blinded value: an X25519 u-coordinate


def hash_and_blind(secret: bytes, ids: Sequence[bytes]) -> bytes:
    """k·H(x) for every ID, as 32-byte u-coordinates back to back (k: the X25519 private key `secret`)."""
    key = X25519PrivateKey.from_private_bytes(secret)
    return b"".join(key.exchange(X25519PublicKey.from_public_bytes(hash_to_u(x, DST))) for x in ids)


def reblind(secret: bytes, points: bytes) -> bytes:
    """k·P for every 32-byte point P of `points`, back to back in the same order."""
    key = X25519PrivateKey.from_private_bytes(secret)
    return b"".join(
        key.exchange(X25519PublicKey.from_public_bytes(points[i : i + POINT_BYTES]))
        for i in range(0, len(points), POINT_BYTES)
    )
