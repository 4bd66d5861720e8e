"""Lightning callbacks shipped with lvfl."""

from lvfl.callbacks.checkpoint import ExperimentCheckpoint
from lvfl.callbacks.communication import CommunicationMeter
from lvfl.callbacks.label_audit import LabelLeakageAudit
from lvfl.callbacks.student import StudentDistillation

__all__ = ["CommunicationMeter", "ExperimentCheckpoint", "LabelLeakageAudit", "StudentDistillation"]
