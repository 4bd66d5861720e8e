"""Aggregation backends: how passive embeddings are protected on the wire and combined at the active party."""

from lvfl.privacy.base import AggregationBackend
from lvfl.privacy.masking import DHMasking
from lvfl.privacy.plain import Plain

__all__ = ["AggregationBackend", "DHMasking", "Plain"]
