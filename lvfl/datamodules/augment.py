"""Per-sample augmentation that is the same at every party: a function of (seed, sample ID, epoch), run on batches.

In VFL every party holds a strip of the same image. A random crop or flip drawn independently per party would give
the parties strips of *different* images of one sample, and the models would learn from inconsistent views. lvfl
therefore draws every random choice of a sample from a counter-based hash of (seed, sample ID, epoch, draw): the
same at every party, in every process (DDP ranks, a resumed run), on any device, with no per-sample Python and no
generator state to checkpoint. A deployment needs exactly this to agree: the seed (a shared secret, agreed once like
the masking keys), the sample IDs (already aligned) and the epoch counter; then each party can draw the same
parameters for its own strip without any message.

`scope` says where the transform runs:

- `"sample"` (the default): on the whole sample, reassembled from the parties' strips, before it is cut into strips
  again, exactly as a central torchvision pipeline (`RandomCrop(32, padding=4)`, `RandomHorizontalFlip()`) would
  augment the image. This is a simulation shortcut: a horizontal shift moves pixel columns across strip borders and
  a flip sends party k's columns to party C-1-k, which real parties could only do by exchanging pixels. Use it to
  compare with centrally augmented results (the papers' setting).
- `"party"`: each party transforms its own strip with the shared parameters (the same vertical offset, horizontal
  offset and flip bit; zero padding at its own strip borders, a flip mirrors its own strip). Nothing crosses
  between parties, so this is what a deployment can run.

Augmentation runs on raw (uint8) pixels before normalization, like torchvision's transforms before `Normalize`, and
only on training batches (`VerticalDataModule.on_after_batch_transfer`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812

from lvfl.checks import check_int

__all__ = ["CropFlip", "SampleAugmentation", "hash_uniform32"]

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for int64 tensors `a` in [0, 2**32) and a constant c < 2**32, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return ((a * lo) + (((a * hi) & 0xFFFF) << 16)) & _MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer (an avalanche bijection of [0, 2**32)) on int64 tensors."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def hash_uniform32(seed: int, ids: torch.Tensor, epoch: int, draws: int) -> torch.Tensor:
    """`draws` pseudo-random 32-bit words per sample: a pure function of (seed, id, epoch, draw index).

    Counter-based (every word is a hash of its coordinates), so a batch's words do not depend on the batch's
    composition, the device, the process or what was drawn before. Not cryptographic; it only has to be the same at
    every party and well mixed.

    Args:
        seed: the shared augmentation seed (any int; folded to 64 bits).
        ids: (B,) int64 sample IDs (>= 0), on any device.
        epoch: the training epoch (>= 0).
        draws: words per sample.

    Returns:
        (B, draws) int64 tensor with values in [0, 2**32), on `ids`' device.
    """
    ids = ids.to(torch.int64)
    seed &= (1 << 64) - 1
    state = _fmix32(torch.full_like(ids, (seed & _MASK32) ^ _GOLDEN))
    state = _fmix32(state ^ ((seed >> 32) & _MASK32))
    state = _fmix32(state ^ (ids & _MASK32))
    state = _fmix32(state ^ ((ids >> 32) & _MASK32))
    state = _fmix32(state ^ (int(epoch) & _MASK32))
    counters = torch.arange(draws, device=ids.device, dtype=torch.int64)
    return _fmix32(state[:, None] ^ _mul32(counters + 1, _GOLDEN)[None, :])


class SampleAugmentation(ABC):
    """A random transform of image batches whose parameters depend only on (seed, sample ID, epoch).

    Subclasses implement `parameters` (the per-sample random choices) and `apply` (the transform of a batch of
    images, vectorized). `VerticalDataModule` calls `__call__` on the whole reassembled sample (`scope="sample"`) or
    on each party's strip with the same parameters (`scope="party"`).

    Args:
        scope: "sample" (whole image, a simulation shortcut across strip borders) or "party" (each strip on its own;
            deployable); see the module docstring.
    """

    def __init__(self, scope: Literal["sample", "party"] = "sample") -> None:
        if scope not in ("sample", "party"):
            raise ValueError(f"augmentation scope must be 'sample' or 'party', got scope={scope!r}")
        self.scope = scope

    @abstractmethod
    def parameters(self, seed: int, ids: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
        """Each sample's random choices, as (B,) tensors on `ids`' device."""

    @abstractmethod
    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Transform a (B, C, H, W) batch (any dtype) with per-sample `params`; returns the same shape and dtype."""

    def __call__(self, images: torch.Tensor, ids: torch.Tensor, epoch: int, seed: int) -> torch.Tensor:
        """Augment one batch of images (B, C, H, W) with the samples' own parameters."""
        return self.apply(images, self.parameters(seed, ids, epoch))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class CropFlip(SampleAugmentation):
    """The CIFAR standard: a random crop of the zero-padded image back to its size, then a horizontal flip.

    Equal to torchvision's `RandomCrop(size, padding=padding)` (fill 0) followed by `RandomHorizontalFlip(0.5)` with
    the offsets and the flip bit drawn from `hash_uniform32`: offsets uniform in 0..2*padding per axis, flip with
    probability 1/2.

    Args:
        padding: pixels of zero padding on every side (4 for CIFAR); 0 turns the crop off.
        flip: whether to flip horizontally with probability 1/2.
        scope: "sample" or "party" (see `SampleAugmentation`).
    """

    def __init__(self, padding: int = 4, flip: bool = True, scope: Literal["sample", "party"] = "sample") -> None:
        super().__init__(scope)
        self.padding = check_int(padding, "padding", 0)
        if not isinstance(flip, bool):
            raise ValueError(f"flip must be true or false, got flip={flip!r}")
        self.flip = flip

    def parameters(self, seed: int, ids: torch.Tensor, epoch: int) -> dict[str, torch.Tensor]:
        """`top`, `left` in 0..2*padding and `flip` in {0, 1} per sample."""
        words = hash_uniform32(seed, ids, epoch, 3)
        span = 2 * self.padding + 1
        flip = (words[:, 2] >> 31) if self.flip else torch.zeros_like(words[:, 2])
        return {"top": words[:, 0] % span, "left": words[:, 1] % span, "flip": flip}

    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pad, crop at each sample's offsets and flip where drawn: one gather for the whole batch."""
        batch, channels, height, width = images.shape
        p = self.padding
        padded = F.pad(images, (p, p, p, p)) if p else images
        rows = params["top"][:, None] + torch.arange(height, device=images.device)  # (B, H) rows of the padded image
        cols = torch.arange(width, device=images.device).expand(batch, width)
        cols = torch.where(params["flip"][:, None].bool(), width - 1 - cols, cols) + params["left"][:, None]
        index = torch.arange(batch, device=images.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[index, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
        return out.permute(0, 3, 1, 2).contiguous()


def reassemble(strips: Sequence[torch.Tensor], columns: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """The whole image (B, C, H, width) from party strips and their column indices; columns nobody sent are 0."""
    first = strips[0]
    canvas = first.new_zeros((*first.shape[:-1], width))
    for strip, cols in zip(strips, columns, strict=True):
        canvas[..., torch.as_tensor(cols, device=strip.device)] = strip
    return canvas


def augment_slices(
    aug: SampleAugmentation,
    features: dict[str, torch.Tensor],
    columns: Mapping[str, Sequence[int]],
    width: int,
    ids: torch.Tensor,
    epoch: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    """The parties' stored slices of a batch (by party name), augmented by `aug` as its `scope` says.

    `columns` holds each party's column indices of the whole image, whose width is `width`: a "sample" scope
    reassembles the image from the slices and cuts the augmented image back into the same strips.
    """
    names = list(features)
    if aug.scope == "party":
        params = aug.parameters(seed, ids, epoch)
        return {k: aug.apply(features[k], params) for k in names}
    strips = [columns[k] for k in names]
    whole = reassemble([features[k] for k in names], strips, width)
    whole = aug(whole, ids, epoch, seed)
    return {k: whole[..., torch.as_tensor(cols, device=whole.device)] for k, cols in zip(names, strips, strict=True)}
