"""Protocols: one LightningModule per protocol, all built on `VFLModule`."""

from lvfl.protocols.aggvfl import AggVFL
from lvfl.protocols.base import VFLModule
from lvfl.protocols.cvfl import CVFL
from lvfl.protocols.easter import EASTER
from lvfl.protocols.party_config import PartyConfig
from lvfl.protocols.pravfed import PraVFed
from lvfl.protocols.splitnn import SplitNN
from lvfl.protocols.standalone import Central, Local
from lvfl.protocols.top_model import TopModelProtocol

__all__ = [
    "CVFL",
    "EASTER",
    "AggVFL",
    "Central",
    "Local",
    "PartyConfig",
    "PraVFed",
    "SplitNN",
    "TopModelProtocol",
    "VFLModule",
]
