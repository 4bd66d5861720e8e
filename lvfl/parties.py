"""What a protocol learns about the parties from the datamodule, and the batch they share.

The datamodule describes each party (`PartySpec`) and the learning task (`TaskInfo`); protocols build the party
models from these in `setup()`, so one config runs on any dataset and any number of parties. Party `i` of a
config is named `party_name(i)` everywhere: in batches, on the wire, in metrics and in a federation file.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

Role = Literal["active", "passive", "coordinator"]


def party_name(index: int) -> str:
    """The name of party `index`, the key of its slice in `VFLBatch.features`."""
    return f"party{index}"


@dataclass(frozen=True)
class PartySpec:
    """One party as seen by a protocol: its name, its role and the shape of one sample of its features.

    `categories` describes tabular columns: empty when every column is numeric, else one entry per column, 0 for
    a numeric column and c > 0 for a categorical one holding codes 0..c-1 (party models then get `categories=`).
    """

    name: str
    role: Role
    input_shape: tuple[int, ...]
    index: int = 0
    categories: tuple[int, ...] = ()

    @property
    def is_active(self) -> bool:
        """Whether this party holds the labels."""
        return self.role == "active"


@dataclass(frozen=True)
class TaskInfo:
    """The supervised task: binary or multiclass classification (AUROC is reported for binary), or regression.

    A regression task has `num_classes` 0 and one output. Its labels reach the protocol standardized with the mean
    and scale of the training targets (`target_mean`, `target_scale`, fitted by the active party on its own training
    rows), so that one learning rate fits every target's units; metrics and predictions are reported in the
    target's own units (`to_target`).
    """

    num_classes: int
    kind: Literal["binary", "multiclass", "regression"] = "multiclass"
    target_mean: float = 0.0
    target_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind == "regression":
            if self.num_classes != 0:
                raise ValueError(f"a regression task has no classes: num_classes must be 0, got {self.num_classes}")
            if not (math.isfinite(self.target_scale) and self.target_scale > 0 and math.isfinite(self.target_mean)):
                raise ValueError(
                    f"target_mean must be finite and target_scale finite and > 0, got {self.target_mean}, "
                    f"{self.target_scale}"
                )
            return
        if self.num_classes < 2:
            raise ValueError(f"a classification task needs at least 2 classes, got num_classes={self.num_classes}")
        expected = "binary" if self.num_classes == 2 else "multiclass"
        if self.kind != expected:
            raise ValueError(f"task kind {self.kind!r} does not fit num_classes={self.num_classes}")

    @property
    def is_regression(self) -> bool:
        """Whether the labels are real-valued targets (MSE loss, MAE/RMSE/R^2 metrics) rather than classes."""
        return self.kind == "regression"

    @property
    def num_outputs(self) -> int:
        """The width of a model's output: one logit per class, or the one predicted value of a regression."""
        return 1 if self.is_regression else self.num_classes

    def to_target(self, standardized: torch.Tensor) -> torch.Tensor:
        """Standardized regression values (labels or predictions) back in the target's units."""
        return standardized * self.target_scale + self.target_mean


@dataclass
class VFLBatch:
    """A mini-batch of aligned samples: `features[party]` is only ever read by that party's code.

    A (non-frozen) dataclass so that Lightning's `move_data_to_device` moves every tensor in it.
    """

    ids: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def rows(self, start: int, stop: int) -> VFLBatch:
        """Samples `start` to `stop` (a slice: another party's shadow features are sliced as they are)."""
        return VFLBatch(
            ids=self.ids[start:stop],
            features={k: v[start:stop] for k, v in self.features.items()},
            labels=None if self.labels is None else self.labels[start:stop],
        )

    def pin_memory(self) -> VFLBatch:
        """The batch in page-locked memory (DataLoader `pin_memory=True`), so the copy to a GPU can overlap compute."""
        return VFLBatch(
            ids=self.ids.pin_memory(),
            features={k: _moved(v, torch.Tensor.pin_memory) for k, v in self.features.items()},
            labels=None if self.labels is None else _moved(self.labels, torch.Tensor.pin_memory),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> VFLBatch:
        """The batch on `device` (cheaper than Lightning's generic walk over the dataclass)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return VFLBatch(
            ids=move(self.ids),
            features={k: _moved(v, move) for k, v in self.features.items()},
            labels=None if self.labels is None else _moved(self.labels, move),
        )


def _moved(tensor: torch.Tensor, move: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`move(tensor)`, except for a shadow (another party's value in a party's view), which stays on the meta device."""
    return tensor if tensor.device.type == "meta" else move(tensor)
