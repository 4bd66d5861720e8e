"""The hazmat layer: pure cryptographic primitives on tensors and bytes, with explicit keys and no global RNG.

Backends in `lvfl.privacy` (the recipes) hold keys and counters and call these; protocols never call them directly.

The names below are loaded from their modules on first use (`fixedpoint`, `keys`, `prg`), not when the package is
imported: a process that needs only the primitives without PyTorch, such as a PSI worker (`lvfl.crypto.psi_batches`),
imports this package and never PyTorch (about 500 MB resident per process).
"""

from __future__ import annotations

import importlib
from typing import Any

#: each name this package exports, and the module that defines it
_EXPORTS = {
    **dict.fromkeys(
        [
            "DEFAULT_FRAC_BITS",
            "RING_BITS",
            "add_decoded",
            "check_range",
            "check_ring_bits",
            "decode",
            "encode",
            "max_abs_value",
            "ring_add",
            "ring_neg",
            "ring_sub",
            "ring_sum",
        ],
        "fixedpoint",
    ),
    **dict.fromkeys(
        [
            "generate_keypair",
            "hkdf_sha256",
            "pair_info",
            "private_key_from_bytes",
            "public_key_bytes",
            "shared_pair_key",
            "x25519_shared_secret",
        ],
        "keys",
    ),
    **dict.fromkeys(["add_masks_", "counter_block", "mask_stream"], "prg"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module the first time it is asked for."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lvfl.crypto' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lvfl.crypto.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
