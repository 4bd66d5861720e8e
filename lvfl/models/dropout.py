"""Each party's dropout draws from its own generator, so that no party's masks depend on another party's model.

`nn.Dropout` draws its masks from the process's global generator. In simulation every party's model runs in one
process, in party order, so party k's masks would depend on how many numbers the parties before it drew (their
widths, their batch); in a party's own process (`lvfl party`) only its own model draws, so the masks would differ
from the simulation's. The protocol therefore gives every party a `PartyGenerator` and replaces each `nn.Dropout`,
`nn.Dropout1d`, `nn.Dropout2d` and `nn.Dropout3d` of its model by a `PartyDropout` drawing from it
(`use_party_generator`): the same masks in simulation, in a party's process, and in a resumed run (the generator is
reseeded at every epoch from the run's seed, the party and the epoch). Dropout written as a function call
(`F.dropout` inside a model's `forward`) still draws from the global generator and is not covered.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PartyDropout", "PartyGenerator", "use_party_generator"]


class PartyGenerator:
    """One party's random stream for dropout, one `torch.Generator` per device type, reseeded by `reseed`."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._generators: dict[str, torch.Generator] = {}

    def reseed(self, seed: int) -> None:
        """Start the stream again from `seed` on every device (the protocol does so at every training epoch)."""
        self.seed = int(seed)
        for generator in self._generators.values():
            generator.manual_seed(self.seed)

    def __getstate__(self) -> dict:  # copied or pickled with its module (a party's view, a spawned process)
        return {"seed": self.seed, "states": {key: g.get_state() for key, g in self._generators.items()}}

    def __setstate__(self, state: dict) -> None:
        self.seed, self._generators = state["seed"], {}
        for key, saved in state["states"].items():
            self.on(torch.device(key)).set_state(saved)

    def on(self, device: torch.device) -> torch.Generator:
        """The generator for tensors on `device` (created, seeded, on first use)."""
        key = device.type if device.index is None else f"{device.type}:{device.index}"
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]


class PartyDropout(nn.Module):
    """`nn.Dropout` (or its channel-wise 1d/2d/3d form) with masks from a `PartyGenerator`.

    Zeroes each element (or, channel-wise, each channel of each sample) with probability `p` in training and scales
    the rest by 1 / (1 - p); the identity in eval mode and on a shadow (meta) input, whose shape is all that is known.
    """

    def __init__(self, p: float, source: PartyGenerator, channel_dims: int = 0, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)
        self.source = source
        self.channel_dims = channel_dims  # 0: element-wise; 1, 2, 3: one mask per channel of Dropout{1,2,3}d
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` with its dropped elements (or channels) zeroed and the rest scaled, in training only."""
        if not self.training or self.p == 0.0 or x.device.type == "meta":
            return x
        if self.p == 1.0:
            return x.mul_(0.0) if self.inplace else x * 0.0
        if self.channel_dims:  # (N, C, *spatial) or (C, *spatial): one draw per channel
            spatial = x.dim() - self.channel_dims
            shape = (*x.shape[:spatial], *([1] * self.channel_dims))
        else:
            shape = x.shape
        keep = 1.0 - self.p
        mask = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(keep, generator=self.source.on(x.device))
        mask.div_(keep)
        return x.mul_(mask) if self.inplace else x * mask

    def extra_repr(self) -> str:
        """What the printed module shows."""
        kind = f", channel-wise over {self.channel_dims}d" if self.channel_dims else ""
        return f"p={self.p}{kind}, inplace={self.inplace}, own generator"


_CHANNEL_DIMS = {nn.Dropout: 0, nn.Dropout1d: 1, nn.Dropout2d: 2, nn.Dropout3d: 3}


def use_party_generator(model: nn.Module, source: PartyGenerator) -> int:
    """Replace every `nn.Dropout` / `Dropout1d` / `2d` / `3d` inside `model` by a `PartyDropout` on `source`.

    Returns how many were replaced. Other dropout kinds (`AlphaDropout`) keep drawing from the global generator.
    """
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            dims = _CHANNEL_DIMS.get(type(child))
            if dims is not None:
                setattr(parent, name, PartyDropout(child.p, source, dims, child.inplace))
                replaced += 1
    return replaced
