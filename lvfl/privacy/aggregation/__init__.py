"""Aggregation backends: how passive embeddings are protected on the wire and combined at the active party.

`AggregationBackend` (`base`) is the contract every protocol calls (`setup`, `protect`, `combine`) and the
capabilities a backend declares. The backends: `Plain` (the clear sum), `DHMasking` (pairwise masks from
Diffie-Hellman keys), `Paillier` and `CKKS` (homomorphic encryption under a key-holding coordinator's key; the
Paillier share's wire record is `paillier_share`).
"""

from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.aggregation.ckks import CKKS
from lvfl.privacy.aggregation.masking import DHMasking
from lvfl.privacy.aggregation.paillier import Paillier
from lvfl.privacy.aggregation.plain import Plain

__all__ = ["CKKS", "AggregationBackend", "DHMasking", "Paillier", "Plain"]
