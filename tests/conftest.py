"""Shared fixtures (the helpers tests import live in `helpers.py`)."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import stress
from served_runs import served  # noqa: F401 - the fitted runs the serving tests share


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        default=False,
        help="stress mode (tests/stress.py): a busy loop per core and 0-50 ms of jitter on every lvfl launch; "
        "also LVFL_STRESS=1",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    if stress.stress_requested(config.getoption("--stress")):
        return f"stress mode: {os.cpu_count()} busy loops, 0-{stress.JITTER_MS:g} ms of jitter on every lvfl launch"
    return None


@pytest.fixture(scope="session", autouse=True)
def _stress_mode(request: pytest.FixtureRequest):
    """In stress mode, every core busy and every launch's links jittering, for the whole session."""
    if not stress.stress_requested(request.config.getoption("--stress")):
        yield
        return
    before = os.environ.get("LVFL_LAUNCH_JITTER_MS")
    os.environ["LVFL_LAUNCH_JITTER_MS"] = f"{stress.JITTER_MS:g}"
    loops = stress.start_busy_loops()
    try:
        yield
    finally:
        stress.stop(loops)
        if before is None:
            os.environ.pop("LVFL_LAUNCH_JITTER_MS", None)
        else:
            os.environ["LVFL_LAUNCH_JITTER_MS"] = before


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
