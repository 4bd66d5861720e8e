"""Vertically partitioned datasets: `VerticalDataModule`, partitioners and the bundled datasets."""

from lvfl.datamodules.adult import Adult
from lvfl.datamodules.augment import CropFlip, SampleAugmentation
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.clickthrough import ClickThrough
from lvfl.datamodules.criteo import Criteo
from lvfl.datamodules.datasets import VerticalTensorDataset
from lvfl.datamodules.embedded import BreastCancer, Diabetes, Digits, Synthetic, Wine
from lvfl.datamodules.partition import (
    ContiguousColumns,
    ExplicitColumns,
    ImageStrips,
    Partitioner,
    ShuffledColumns,
    check_columns,
)
from lvfl.datamodules.r_frames import RDataset
from lvfl.datamodules.samplers import IndexTensorBatchSampler
from lvfl.datamodules.scaling import PixelNormalizer
from lvfl.datamodules.stand_ins import FileBacked
from lvfl.datamodules.tables import PartyTable, PartyTables
from lvfl.datamodules.vision import CIFAR10, CIFAR100, CINIC10, MNIST, FashionMNIST, TorchvisionImages
from lvfl.parties import party_name  # the name of party i, lvfl.parties': here too since configs' users find it here

__all__ = [
    "Adult",
    "CIFAR10",
    "CIFAR100",
    "CINIC10",
    "FashionMNIST",
    "MNIST",
    "TorchvisionImages",
    "BreastCancer",
    "ClickThrough",
    "ContiguousColumns",
    "Criteo",
    "CropFlip",
    "Diabetes",
    "Digits",
    "ExplicitColumns",
    "FileBacked",
    "PartyTable",
    "PartyTables",
    "RDataset",
    "ImageStrips",
    "IndexTensorBatchSampler",
    "Partitioner",
    "PixelNormalizer",
    "SampleAugmentation",
    "ShuffledColumns",
    "Synthetic",
    "VerticalDataModule",
    "VerticalTensorDataset",
    "Wine",
    "check_columns",
    "party_name",
]
