"""Privacy recipes: aggregation backends and label mechanisms.

Aggregation backends protect passive embeddings on the wire and combine them at the active party (Plain, DHMasking;
Paillier and CKKS with a key-holding coordinator); label mechanisms protect labels when anything derived from them
leaves the active party.
"""

from lvfl.privacy.base import AggregationBackend
from lvfl.privacy.ckks import CKKS
from lvfl.privacy.label_dp import LabelMechanism, LaplaceLabels, PrivacyLedger, RandomizedResponse
from lvfl.privacy.label_release import LabelRelease
from lvfl.privacy.masking import DHMasking
from lvfl.privacy.paillier import Paillier
from lvfl.privacy.plain import Plain

__all__ = [
    "AggregationBackend",
    "CKKS",
    "DHMasking",
    "LabelMechanism",
    "LabelRelease",
    "LaplaceLabels",
    "Paillier",
    "Plain",
    "PrivacyLedger",
    "RandomizedResponse",
]
