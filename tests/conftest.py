"""Shared fixtures (the helpers tests import live in `helpers.py`)."""

from __future__ import annotations

import logging
import warnings

import pytest
from served_runs import served  # noqa: F401 - the fitted runs the serving tests share


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
