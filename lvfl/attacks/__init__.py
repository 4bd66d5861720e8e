"""Attacks a party mounts on what it holds (its inbox on the Wire, its own data and model, declared side knowledge).

Each is a callback chosen by `class_path` (``--trainer.callbacks+=...``), scored against the truth by its shell and
logged as ``attack/<name>/<metric>``; see `lvfl.attacks.base` for what an attack may read, and docs/privacy.md.
"""

from lvfl.attacks.backdoor import Backdoor, GradientReplacement, NoisySample
from lvfl.attacks.base import Attack, PartyView, Received, evaluate
from lvfl.attacks.batch_label import BatchLabelInference
from lvfl.attacks.completion import PassiveModelCompletion
from lvfl.attacks.features import EmbeddingInversion
from lvfl.attacks.label import DirectionScoring, DirectLabelInference, NormScoring

__all__ = [
    "Attack",
    "Backdoor",
    "BatchLabelInference",
    "DirectLabelInference",
    "DirectionScoring",
    "EmbeddingInversion",
    "GradientReplacement",
    "NoisySample",
    "NormScoring",
    "PartyView",
    "PassiveModelCompletion",
    "Received",
    "evaluate",
]
