"""Inference for samples the passive parties do not hold: student distillation, the oblivious lookup, the router."""

from lvfl.inference.evaluation import evaluate_student, student_metrics
from lvfl.inference.oblivious import ObliviousInference, ObliviousTable
from lvfl.inference.router import RoutedPredictions, Router
from lvfl.inference.student import StudentFit, build_student, fit_student
from lvfl.inference.teacher import (
    StudentData,
    default_producer,
    student_data,
    teacher_soft_label_parts,
    teacher_soft_labels,
)
from lvfl.privacy.soft_labels import SoftLabelParts, check_lam, distillation_loss, student_loss

__all__ = [
    "ObliviousInference",
    "ObliviousTable",
    "RoutedPredictions",
    "Router",
    "SoftLabelParts",
    "StudentData",
    "StudentFit",
    "build_student",
    "check_lam",
    "default_producer",
    "distillation_loss",
    "evaluate_student",
    "fit_student",
    "student_data",
    "student_loss",
    "student_metrics",
    "teacher_soft_label_parts",
    "teacher_soft_labels",
]
