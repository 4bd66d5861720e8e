"""Lightning callbacks shipped with lvfl."""

from lvfl.callbacks.checkpoint import ExperimentCheckpoint
from lvfl.callbacks.communication import CommunicationMeter

__all__ = ["CommunicationMeter", "ExperimentCheckpoint"]
