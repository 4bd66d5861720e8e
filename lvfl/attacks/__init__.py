"""Attacks a party mounts on what it holds (its inbox on the Wire, its own data and model, declared side knowledge).

Each is a callback chosen by `class_path` (``--trainer.callbacks+=...``), scored against the truth by its shell and
logged as ``attack/<name>/<metric>``; see `lvfl.attacks.base` and `lvfl.attacks.view` for what an attack may read, and
docs/privacy.md.
"""

from lvfl.attacks.backdoor import Backdoor, GradientReplacement, NoisySample
from lvfl.attacks.base import Attack, AttackRecord
from lvfl.attacks.batch_label import BatchLabelInference
from lvfl.attacks.completion import PassiveModelCompletion
from lvfl.attacks.features import EmbeddingInversion
from lvfl.attacks.label import DirectionScoring, DirectLabelInference, NormScoring
from lvfl.attacks.reconstruction import GenerativeRegression
from lvfl.attacks.scoring import evaluate
from lvfl.attacks.view import PartyView, Received

__all__ = [
    "Attack",
    "AttackRecord",
    "Backdoor",
    "BatchLabelInference",
    "DirectLabelInference",
    "DirectionScoring",
    "EmbeddingInversion",
    "GenerativeRegression",
    "GradientReplacement",
    "NoisySample",
    "NormScoring",
    "PartyView",
    "PassiveModelCompletion",
    "Received",
    "evaluate",
]
