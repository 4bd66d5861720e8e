"""`Plain`: no protection at all, the reference every other backend is compared with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.wire import Wire


class Plain(AggregationBackend):
    """Passive parties send their float embeddings as they are; the active party adds them up.

    Reveals every passive embedding to the active party (`reveals_shares`), which is what lets protocols that need
    each embedding (concatenation, per-party weights or scores) use it. It sends no keys, so `setup` puts nothing on
    the wire. It checks nothing either: NaN/inf pass through to the sum, as in the plain reference it is.

    Example:
        >>> import torch
        >>> backend = Plain()
        >>> backend.combine(torch.ones(2), {"p1": backend.protect("p1", torch.ones(2), step=0)})
        tensor([2., 2.])
    """

    reveals_shares = True
    refuses_nonfinite = False
    refuses_reused_step = False

    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Remember the passive parties, so that `combine` can refuse a missing or unknown share."""
        super().setup(parties, active, wire, rank)
        self._passive = tuple(p.name for p in self.parties if p.role == "passive")

    def error_bound(self, num_parties: int | None = None) -> float:
        """0: the float sum itself (in the passive parties' order; another order differs by float rounding only)."""
        return 0.0

    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> torch.Tensor:
        """The tensor itself: no protection."""
        return tensor

    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor + sum(shares)`, summed in the passive parties' order."""
        passive = getattr(self, "_passive", None)
        if passive is not None:
            self.check_one_per_party(shares, passive)
        order = passive if passive is not None else tuple(shares)
        out = active_tensor
        for name in order:
            out = out + shares[name]
        return out
