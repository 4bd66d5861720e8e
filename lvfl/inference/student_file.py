"""The student model `StudentDistillation` saves beside a run's checkpoints, and how `lvfl predict` loads it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["STUDENT_FILE", "load_student", "save_student"]

STUDENT_FILE = "student.pt"  #: the saved student, in the run's checkpoint folder


def save_student(model: nn.Module, folder: str | Path) -> Path:
    """Save `model` as the run's student in `folder`; returns the file written."""
    path = Path(folder) / STUDENT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model, path)
    return path


def load_student(folder: str | Path) -> nn.Module | None:
    """The student saved in `folder`, or None where there is none."""
    path = Path(folder) / STUDENT_FILE
    return torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None
