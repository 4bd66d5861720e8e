"""Vertically partitioned datasets: `VerticalDataModule`, partitioners and the bundled datasets."""

from lvfl.datamodules.base import IndexTensorBatchSampler, VerticalDataModule, VerticalTensorDataset, party_name
from lvfl.datamodules.clickthrough import ClickThrough
from lvfl.datamodules.embedded import BreastCancer, Diabetes, Digits, Synthetic, Wine
from lvfl.datamodules.partition import (
    ContiguousColumns,
    ExplicitColumns,
    ImageStrips,
    Partitioner,
    ShuffledColumns,
    check_columns,
)

__all__ = [
    "BreastCancer",
    "ClickThrough",
    "ContiguousColumns",
    "Diabetes",
    "Digits",
    "ExplicitColumns",
    "ImageStrips",
    "IndexTensorBatchSampler",
    "Partitioner",
    "ShuffledColumns",
    "Synthetic",
    "VerticalDataModule",
    "VerticalTensorDataset",
    "Wine",
    "check_columns",
    "party_name",
]
