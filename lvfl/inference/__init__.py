"""Inference for samples the passive parties do not hold: student distillation, the oblivious lookup, the router."""

from lvfl.inference.oblivious import ObliviousInference, ObliviousTable
from lvfl.inference.router import RoutedPredictions, Router
from lvfl.inference.student import (
    PaillierDistillation,
    StudentFit,
    check_lam,
    distillation_loss,
    evaluate_student,
    fit_student,
    student_loss,
)
from lvfl.inference.teacher import (
    SoftLabelParts,
    StudentData,
    default_producer,
    plain_soft_labels,
    student_data,
    teacher_soft_label_parts,
    teacher_soft_labels,
)

__all__ = [
    "ObliviousInference",
    "ObliviousTable",
    "PaillierDistillation",
    "RoutedPredictions",
    "Router",
    "SoftLabelParts",
    "StudentData",
    "StudentFit",
    "check_lam",
    "default_producer",
    "distillation_loss",
    "evaluate_student",
    "fit_student",
    "plain_soft_labels",
    "student_data",
    "student_loss",
    "teacher_soft_label_parts",
    "teacher_soft_labels",
]
