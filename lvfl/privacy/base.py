"""The aggregation-backend interface: how passive embeddings are protected on the wire and combined.

A backend is a recipe (see STYLE.md): it holds keys and counters and calls the pure primitives in `lvfl.crypto`.
Protocols call exactly three methods, in this order:

1. `setup(parties, active, wire, rank)` once before training: key agreement / key distribution, every byte on `wire`.
2. `protect(party, tensor, step, index)` at a passive party: the share that party puts on the wire.
3. `combine(active_tensor, shares)` at the active party: `active_tensor + sum_k unprotect(shares[k])`
   (the *sum*, not the mean; the protocol divides by C).

`step` is the protocol's mask step counter (restored from checkpoints) and `index` numbers the tensors protected
within one step, so that no mask stream is ever used twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lvfl.parties import PartySpec
from lvfl.wire import Wire


class AggregationBackend(ABC):
    """Protects passive parties' tensors on the wire and combines them at the active party."""

    #: name of the party that holds secret keys for decryption (HE backends); None when no such party exists
    coordinator: str | None = None

    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Agree on keys among `parties` (passive ones protect, `active` combines); bytes go on `wire`."""
        self.parties = list(parties)
        self.active = active
        self.wire = wire
        self.rank = rank

    @abstractmethod
    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> Any:
        """The share passive `party` sends for `tensor` at mask step `step` (tensor number `index` in the step)."""

    @abstractmethod
    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor` plus the sum of the tensors behind `shares` (one share per passive party)."""

    def state_dict(self) -> dict[str, Any]:
        """Non-secret state to checkpoint. Private keys are never included."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook, no state by default
        """Restore what `state_dict` returned."""
