"""Shared fixtures. The helpers live in `helpers.py`; the names below are re-exported for tests still importing them
from here (test_privacy_backends, test_paillier, test_ckks, test_backend_contract)."""

from __future__ import annotations

import logging
import warnings

import pytest
from helpers import (  # noqa: F401 (re-exported)
    REPO,
    bad_labels_datamodule,
    dh_key_ledger,
    easter,
    make_trainer,
    mlp_parties,
    recording,
    relabelled,
    run_ddp,
)


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
