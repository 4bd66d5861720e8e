"""Soft-label channels: how a distilled student's soft labels reach the active party, and the objective they train.

`channels`: the channel contract (`SoftLabelChannel`, `SoftLabelParts`), the student objective (`student_loss`,
`regression_student_loss`) and the clear channel `PlainSoftLabels`; `paillier`: `PaillierSoftLabels`, the soft
labels under a coordinator's Paillier key.

The package's path is also the old path of the module `channels` (`lvfl.moved_modules`), so it re-exports every
name of `channels`: a config, checkpoint or pickle naming `lvfl.privacy.soft_labels.<name>` loads.
"""

from lvfl.privacy.soft_labels.channels import (
    LOG_EPS,
    PlainSoftLabels,
    SoftLabelChannel,
    SoftLabelParts,
    check_lam,
    distillation_loss,
    last_linear,
    regression_student_loss,
    student_loss,
)
from lvfl.privacy.soft_labels.paillier import PaillierSoftLabels

__all__ = [
    "LOG_EPS",
    "PaillierSoftLabels",
    "PlainSoftLabels",
    "SoftLabelChannel",
    "SoftLabelParts",
    "check_lam",
    "distillation_loss",
    "last_linear",
    "regression_student_loss",
    "student_loss",
]
