"""The hazmat layer: pure cryptographic primitives on tensors and bytes, with explicit keys and no global RNG.

Backends in `lvfl.privacy` (the recipes) hold keys and counters and call these; protocols never call them directly.
"""

from lvfl.crypto.fixedpoint import (
    DEFAULT_FRAC_BITS,
    RING_BITS,
    add_decoded,
    check_range,
    check_ring_bits,
    decode,
    encode,
    max_abs_value,
    ring_add,
    ring_neg,
    ring_sub,
    ring_sum,
)
from lvfl.crypto.keys import (
    generate_keypair,
    hkdf_sha256,
    pair_info,
    private_key_from_bytes,
    public_key_bytes,
    shared_pair_key,
    x25519_shared_secret,
)
from lvfl.crypto.prg import add_masks_, counter_block, mask_stream

__all__ = [
    "DEFAULT_FRAC_BITS",
    "RING_BITS",
    "add_decoded",
    "add_masks_",
    "check_range",
    "check_ring_bits",
    "counter_block",
    "decode",
    "encode",
    "generate_keypair",
    "hkdf_sha256",
    "mask_stream",
    "max_abs_value",
    "pair_info",
    "private_key_from_bytes",
    "public_key_bytes",
    "ring_add",
    "ring_neg",
    "ring_sub",
    "ring_sum",
    "shared_pair_key",
    "x25519_shared_secret",
]
