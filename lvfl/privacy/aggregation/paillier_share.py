"""`PaillierShare`: the Paillier backend's message on the wire, and the check of one a peer sent.

A passive party's encrypted tensor and the active party's masked aggregate travel as this record (wire name
"lvfl.PaillierShare", registered with `lvfl.federation.codec` at import, so that any process that imports the
backend can receive one). Its own module keeps the record, which both ends of a link must agree on, apart from the
backend's protocol steps (`lvfl.privacy.aggregation.paillier`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lvfl.federation.codec import register_record

__all__ = ["PaillierShare"]


@dataclass(frozen=True, eq=False)
class PaillierShare:
    """A passive party's encrypted tensor (or the active party's masked aggregate): packed Paillier ciphertexts.

    On the wire it costs `len(ciphertexts) * ciphertext_nbytes`, each ciphertext serialized at the fixed width of
    an integer mod n**2. The metadata (shape, layout, step, index) costs nothing: both ends derive it from the
    protocol (the active party knows the batch shape and the key), so it is carried here only to be checked.
    """

    ciphertexts: tuple[int, ...]
    shape: tuple[int, ...]
    width: int
    slots: int
    step: int
    index: int
    ciphertext_nbytes: int

    def wire_nbytes(self) -> int:
        """Serialized size: fixed-width ciphertexts, no header."""
        return len(self.ciphertexts) * self.ciphertext_nbytes

    @property
    def numel(self) -> int:
        """Number of values encrypted."""
        return math.prod(self.shape)


def _share_from_wire(fields: dict[str, Any]) -> PaillierShare:
    """A `PaillierShare` from a peer's fields: ints where ints belong (the backend checks the values' ranges)."""
    ciphertexts, shape = fields["ciphertexts"], fields["shape"]
    if not isinstance(ciphertexts, tuple | list) or not all(type(c) is int and c > 0 for c in ciphertexts):
        raise ValueError("ciphertexts must be positive integers")
    if not isinstance(shape, tuple | list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError("shape must be non-negative integers")
    numbers = {k: fields[k] for k in ("width", "slots", "step", "index", "ciphertext_nbytes")}
    if not all(type(v) is int and v >= 0 for v in numbers.values()):
        raise ValueError(f"{', '.join(numbers)} must be non-negative integers")
    return PaillierShare(tuple(ciphertexts), tuple(shape), **numbers)


register_record("lvfl.PaillierShare", PaillierShare, from_fields=_share_from_wire)
