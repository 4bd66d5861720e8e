"""`PartyView`: everything the attacking party holds at the end of one training step, all an attack may read.

The `Attack` shell (`lvfl.attacks.base`) builds it each step from the party's inbox on the Wire (`Received`
messages), its own slice of the batch, its own model and training rows, and the side knowledge the attack declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["PartyView", "Received"]


@dataclass(frozen=True)
class Received:
    """One message the attacking party received: who sent it, under which tag, the payload as it arrived."""

    src: str
    tag: str
    payload: Any


@dataclass(frozen=True)
class PartyView:
    """Everything party `party` holds at the end of one training step: all an attack may read.

    Attributes:
        party: the attacking party.
        ids: the batch's sample IDs, in the batch's order (the rows this party served).
        features: this party's own slice of the batch (model input).
        inbox: the messages this party received during the step, in order.
        setup_inbox: the messages it received outside any training step so far (set-up, a release sent once).
        model: its own party model (an `encoder` and a `head`), as it is after the step.
        train_ids: the IDs of the training rows it holds, ascending.
        train_features: its own slice of those rows (model input), in the same order.
        known_labels: the declared side knowledge: sample ID -> label, for the auxiliary samples it was given.
        kinds: the protocol's public declaration: tag -> what a message under it is (`lvfl.messages`).
        num_classes: the task's number of classes.
        epoch: the training epoch.
        batch_idx: the step's index in the epoch.
        num_parties: C, the run's number of parties (public: the config).
        own_encoding: its own encoder's output on its slice of the batch, as the step computed it (for an attack
            that declares `needs_own_encoding`).
        known_features: the declared side knowledge of a feature attack: sample ID -> the active party's features,
            for the `known_features` auxiliary samples it was given.
    """

    party: str
    ids: torch.Tensor
    features: torch.Tensor
    inbox: tuple[Received, ...]
    setup_inbox: tuple[Received, ...]
    model: nn.Module | None
    train_ids: torch.Tensor
    train_features: torch.Tensor
    known_labels: Mapping[int, int]
    kinds: Mapping[str, str]
    num_classes: int
    epoch: int
    batch_idx: int
    num_parties: int = 0
    own_encoding: torch.Tensor | None = None
    known_features: Mapping[int, torch.Tensor] = field(default_factory=dict)

    def received(self, kind: str, setup: bool = False) -> list[Any]:
        """The payloads of this step's messages (or the set-up ones) whose tag the protocol declares as `kind`."""
        messages = self.setup_inbox if setup else self.inbox
        return [m.payload for m in messages if self.kinds.get(m.tag) == kind]

    def known_in_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions in the batch of the samples whose labels this party was given, and those labels."""
        if not self.known_labels:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        ids = self.ids.tolist()
        positions = [i for i, sample in enumerate(ids) if sample in self.known_labels]
        labels = [self.known_labels[ids[i]] for i in positions]
        return torch.tensor(positions, dtype=torch.long), torch.tensor(labels, dtype=torch.long)
