"""Inference for samples the passive parties do not hold: student distillation, the oblivious lookup, the router."""

from lvfl.inference.oblivious import ObliviousInference, ObliviousTable
from lvfl.inference.router import RoutedPredictions, Router
from lvfl.inference.student import (
    LogisticRegression,
    PaillierDistillation,
    SoftLabelParts,
    StudentData,
    StudentFit,
    check_lam,
    default_producer,
    distillation_loss,
    evaluate_student,
    fit_student,
    plain_soft_labels,
    student_data,
    student_loss,
    teacher_soft_label_parts,
    teacher_soft_labels,
)

__all__ = [
    "LogisticRegression",
    "ObliviousInference",
    "ObliviousTable",
    "RoutedPredictions",
    "Router",
    "PaillierDistillation",
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
