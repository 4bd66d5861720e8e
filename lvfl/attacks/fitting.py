"""The attacker's own small models (a head, an inverse map), fitted on its side knowledge apart from the run."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["fit_full_batch"]


def fit_full_batch(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    steps: int,
    lr: float,
    weight_decay: float,
) -> nn.Module:
    """Fit an attacker's own small model (a head, an inverse map) on its side knowledge: full-batch Adam steps.

    Gradients are on even inside a hook that runs under no_grad; the protocol's models are never touched.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss(model(inputs), targets).backward()
            optimizer.step()
    return model
