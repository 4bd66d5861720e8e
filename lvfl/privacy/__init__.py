"""Privacy recipes, each chosen by `class_path`: aggregation backends, label mechanisms, soft-label channels.

Aggregation backends protect passive embeddings on the wire and combine them at the active party (Plain, DHMasking;
Paillier and CKKS with a key-holding coordinator); label mechanisms protect labels when anything derived from them
leaves the active party; soft-label channels carry a distilled student's soft labels and gradients between the
active party and the passive parties' producer (PlainSoftLabels, PaillierSoftLabels); gradient defenses change what
the active party sends down as gradients (GaussianNoise, LaplaceNoise, GradientSparsification).
"""

from lvfl.privacy.base import AggregationBackend
from lvfl.privacy.ckks import CKKS
from lvfl.privacy.embedding_defenses import MID, DistanceCorrelation, ReceivedEmbeddingDefense
from lvfl.privacy.gradient_defenses import GaussianNoise, GradientDefense, GradientSparsification, LaplaceNoise
from lvfl.privacy.label_dp import LabelMechanism, LaplaceLabels, PrivacyLedger, RandomizedResponse
from lvfl.privacy.label_release import LabelRelease
from lvfl.privacy.masking import DHMasking
from lvfl.privacy.paillier import Paillier
from lvfl.privacy.paillier_soft_labels import PaillierSoftLabels
from lvfl.privacy.plain import Plain
from lvfl.privacy.soft_labels import PlainSoftLabels, SoftLabelChannel, SoftLabelParts

__all__ = [
    "AggregationBackend",
    "CKKS",
    "DHMasking",
    "DistanceCorrelation",
    "GaussianNoise",
    "GradientDefense",
    "GradientSparsification",
    "LabelMechanism",
    "LabelRelease",
    "LaplaceNoise",
    "LaplaceLabels",
    "MID",
    "Paillier",
    "PaillierSoftLabels",
    "Plain",
    "PlainSoftLabels",
    "PrivacyLedger",
    "RandomizedResponse",
    "ReceivedEmbeddingDefense",
    "SoftLabelChannel",
    "SoftLabelParts",
]
