"""Signed relayed keys (`lvfl.crypto.signing`, `lvfl.federation.identity`): what DHMasking's key exchange relies on
to catch an active party that swaps the keys it relays."""

from __future__ import annotations

import copy

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from lvfl.crypto.signing import SIGNATURE_BYTES, SimulatedIdentities, sign, signed_message, verify
from lvfl.federation import FederationError
from lvfl.federation.federation_file import write_federation
from lvfl.federation.identity import TLSIdentities
from lvfl.federation.pki import write_test_pki

CONTEXT = b"test/v1"


def test_a_signature_is_64_bytes_and_binds_the_context_the_party_and_the_value():
    key = ec.generate_private_key(ec.SECP256R1())
    message = signed_message(CONTEXT, "party1", b"k" * 32)
    signature = sign(key, message)
    assert len(signature) == SIGNATURE_BYTES == 64
    assert verify(key.public_key(), message, signature)
    for other in (
        signed_message(CONTEXT, "party2", b"k" * 32),  # another party's name
        signed_message(CONTEXT, "party1", b"j" * 32),  # another value
        signed_message(b"other/v1", "party1", b"k" * 32),  # another context
    ):
        assert not verify(key.public_key(), other, signature)
    assert not verify(ec.generate_private_key(ec.SECP256R1()).public_key(), message, signature)  # another key
    assert not verify(key.public_key(), message, signature[:-1])  # truncated
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert not verify(key.public_key(), message, flipped)


def test_length_prefixes_keep_two_different_messages_apart():
    assert signed_message(CONTEXT, "party1", b"2key") != signed_message(CONTEXT, "party12", b"key")


def test_simulated_identities_are_per_party_and_never_copied():
    ids = SimulatedIdentities()
    message = signed_message(CONTEXT, "a", b"x")
    signature = ids.sign("a", message)
    assert ids.verify("a", message, signature)
    assert not ids.verify("b", message, signature)
    copied = copy.deepcopy(ids)
    assert not copied.verify("a", message, signature)  # a copy draws fresh keys: no key material travels


def test_tls_identities_sign_as_their_own_party_and_verify_by_the_pinned_certificate(tmp_path):
    write_test_pki(tmp_path, ["party0", "party1"])
    federation = write_federation(tmp_path / "federation.yaml", ["party0", "party1"])
    one = TLSIdentities("party1", federation, tmp_path / "party1.key")
    zero = TLSIdentities("party0", federation, tmp_path / "party0.key")
    message = signed_message(CONTEXT, "party1", b"k" * 32)
    signature = one.sign("party1", message)
    assert zero.verify("party1", message, signature)
    assert not zero.verify("party0", message, signature)  # not party0's signature
    with pytest.raises(ValueError, match="party1 cannot sign as party0"):
        one.sign("party0", message)
    with pytest.raises(FederationError, match="does not belong to certificate"):
        TLSIdentities("party0", federation, tmp_path / "party1.key")
