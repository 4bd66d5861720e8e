"""Layered AES-GCM of the oblivious lookup (Algorithm 3 of the non-overlap paper): one entry under B keys in turn.

Entry (bucket, offset) of a bucket of N = 2**B entries is encrypted under the B keys its offset's bits select, one
AES-GCM layer per key, with the nonce (bucket, offset): a receiver holding the key of each bit of one offset opens
exactly that entry, every other fails authentication at some layer. Pure functions: the keys are the caller's.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ENTRY_KEY_BYTES", "LAYER_TAG_BYTES", "decrypt_entry", "encrypt_entry", "entry_nonce"]

#: AES-GCM tag added by each encryption layer
LAYER_TAG_BYTES = 16
#: size of one key(i, j, k): AES-128
ENTRY_KEY_BYTES = 16


def entry_nonce(bucket: int, offset: int) -> bytes:
    """The 12-byte GCM nonce of entry (bucket, offset): key(i, j, k) encrypts each (bucket, offset) at most once."""
    return bucket.to_bytes(8, "big") + offset.to_bytes(4, "big")


def encrypt_entry(layer_ciphers: list[AESGCM], nonce: bytes, plaintext: bytes) -> bytes:
    """Algorithm 3 for one entry and one key set: encrypt with layer 0's key first, layer B-1's last."""
    ct = plaintext
    for cipher in layer_ciphers:
        ct = cipher.encrypt(nonce, ct, None)
    return ct


def decrypt_entry(layer_ciphers: list[AESGCM], nonce: bytes, ciphertext: bytes) -> bytes:
    """Peel the layers of `encrypt_entry` (B-1 first); raises `InvalidTag` if any layer's key is not the one used."""
    pt = ciphertext
    for cipher in reversed(layer_ciphers):
        pt = cipher.decrypt(nonce, pt, None)
    return pt
