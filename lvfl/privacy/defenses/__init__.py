"""Defenses of the labels against what the gradients sent to passive parties reveal.

`gradients`: what the active party does to a gradient before it goes down (`GaussianNoise`, `LaplaceNoise`,
`GradientSparsification`, on `GradientDefense`); `embeddings`: layers and loss terms on the embeddings the active
party receives, which shape that gradient at its source (`MID`, `DistanceCorrelation`, on
`ReceivedEmbeddingDefense`).
"""

from lvfl.privacy.defenses.embeddings import MID, DistanceCorrelation, ReceivedEmbeddingDefense
from lvfl.privacy.defenses.gradients import GaussianNoise, GradientDefense, GradientSparsification, LaplaceNoise

__all__ = [
    "MID",
    "DistanceCorrelation",
    "GaussianNoise",
    "GradientDefense",
    "GradientSparsification",
    "LaplaceNoise",
    "ReceivedEmbeddingDefense",
]
