"""A party's identity in a federation: its TLS key signs, and every party's pinned certificate verifies.

The same identity that authenticates a party's connections (`lvfl.federation.transport`) signs what it must vouch
for in a message relayed by another party: DHMasking's X25519 public keys (`lvfl.crypto.signing`). A party that
relays such a message (the active party) cannot change it without the receiver noticing, nor replay one signed in
another run: the identity's `session` is the transport's run ID, and what is signed binds it.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lvfl.crypto.signing import sign, verify
from lvfl.federation import FederationError
from lvfl.federation.federation_file import Federation
from lvfl.federation.pki import check_key, load_certificate

__all__ = ["TLSIdentities"]


class TLSIdentities:
    """Signs as party `me` with its TLS private key; verifies any party against its certificate in the federation.

    Identity keys are ECDSA P-256, as `lvfl pki` writes them (a certificate with another key type is refused by
    name when first used).
    """

    def __init__(self, me: str, federation: Federation, key_path: str | os.PathLike[str], run_id: str = "") -> None:
        certificate = federation.party(me).certificate
        key = serialization.load_pem_private_key(check_key(key_path, certificate), password=None)
        self.me = me
        self.session = run_id.encode("utf-8")  # the run every party of it signs in
        self._key, self._key_path = key, Path(key_path)
        self._federation = federation
        self._public: dict[str, ec.EllipticCurvePublicKey] = {}

    @staticmethod
    def _p256(key: object, path: Path, what: str) -> object:
        curve = getattr(getattr(key, "curve", None), "name", None)
        if curve != "secp256r1":
            raise FederationError(
                f"{what} {path} is not an ECDSA P-256 key: lvfl signs relayed keys with the party's TLS key, and "
                "needs P-256 (as lvfl pki writes)"
            )
        return key

    def sign(self, party: str, message: bytes) -> bytes:
        """`party`'s signature of `message`; only this party's own."""
        if party != self.me:
            raise ValueError(f"party {self.me} cannot sign as {party}")
        return sign(self._p256(self._key, self._key_path, "private key"), message)

    def verify(self, party: str, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is `party`'s, by the certificate pinned for it in the federation file."""
        if party not in self._public:
            path = self._federation.party(party).certificate
            self._public[party] = self._p256(load_certificate(path).public_key(), path, "the certificate in")
        return verify(self._public[party], message, signature)
