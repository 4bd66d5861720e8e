"""Protocols: one LightningModule per protocol, all built on `VFLModule`."""

from lvfl.protocols.base import PartyConfig, VFLModule
from lvfl.protocols.easter import EASTER

__all__ = ["EASTER", "PartyConfig", "VFLModule"]
