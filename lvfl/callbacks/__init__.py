"""Lightning callbacks shipped with lvfl."""

from lvfl.callbacks.checkpoint import ExactResume, ExperimentCheckpoint
from lvfl.callbacks.communication import CommunicationMeter
from lvfl.callbacks.label_audit import LabelLeakageAudit
from lvfl.callbacks.network import NetworkSimulator
from lvfl.callbacks.predictions import PredictionWriter
from lvfl.callbacks.student import StudentDistillation

__all__ = [
    "CommunicationMeter",
    "ExactResume",
    "ExperimentCheckpoint",
    "LabelLeakageAudit",
    "NetworkSimulator",
    "PredictionWriter",
    "StudentDistillation",
]
