"""Privacy recipes, each chosen by `class_path`, in one sub-package per kind.

- `aggregation`: aggregation backends protect passive embeddings on the wire and combine them at the active party
  (`Plain`, `DHMasking`; `Paillier` and `CKKS` with a key-holding coordinator), all on `AggregationBackend`.
- `labels`: label mechanisms protect labels when anything derived from them leaves the active party
  (`LaplaceLabels`, `RandomizedResponse`, their `PrivacyLedger`), and `LabelRelease` is a run's one draw of them.
- `soft_labels`: soft-label channels carry a distilled student's soft labels and gradients between the active party
  and the passive parties' producer (`PlainSoftLabels`, `PaillierSoftLabels`).
- `defenses`: gradient defenses change what the active party sends down as gradients (`GaussianNoise`,
  `LaplaceNoise`, `GradientSparsification`); embedding defenses shape the gradient at the embeddings the active
  party receives (`MID`, `DistanceCorrelation`).

Every recipe is importable from here (`lvfl.privacy.DHMasking`), the path configs use. The old module paths
(`lvfl.privacy.masking`, `lvfl.privacy.label_dp`, ...), which configs, checkpoints and pickles may name, load:
`lvfl.moved_modules` maps each to its module in a sub-package, importing this package installs the hook that
answers them, and `__getattr__` below answers them as attributes of this package.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lvfl import moved_modules
from lvfl.privacy.aggregation import CKKS, AggregationBackend, DHMasking, Paillier, Plain
from lvfl.privacy.defenses import (
    MID,
    DistanceCorrelation,
    GaussianNoise,
    GradientDefense,
    GradientSparsification,
    LaplaceNoise,
    ReceivedEmbeddingDefense,
)
from lvfl.privacy.labels import LabelMechanism, LabelRelease, LaplaceLabels, PrivacyLedger, RandomizedResponse
from lvfl.privacy.soft_labels import PaillierSoftLabels, PlainSoftLabels, SoftLabelChannel, SoftLabelParts

moved_modules.install()

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


def __getattr__(name: str) -> ModuleType:
    """An old module path read as an attribute (`lvfl.privacy.masking` after `import lvfl.privacy`): its module."""
    if f"{__name__}.{name}" in moved_modules.MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
