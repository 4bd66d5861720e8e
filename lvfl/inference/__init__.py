"""Inference for samples the passive parties do not hold: student distillation (and, elsewhere, oblivious lookup)."""

from lvfl.inference.student import (
    LogisticRegression,
    PaillierDistillation,
    StudentData,
    StudentFit,
    check_lam,
    distillation_loss,
    evaluate_student,
    fit_student,
    student_data,
    student_loss,
    teacher_soft_labels,
)

__all__ = [
    "LogisticRegression",
    "PaillierDistillation",
    "StudentData",
    "StudentFit",
    "check_lam",
    "distillation_loss",
    "evaluate_student",
    "fit_student",
    "student_data",
    "student_loss",
    "teacher_soft_labels",
]
