"""Shared fixtures (the helpers tests import live in `helpers.py`)."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import stress
import tiers
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


_LOOPS = pytest.StashKey[list]()
_JITTER_BEFORE = pytest.StashKey[str | None]()
_STARTED = pytest.StashKey[list[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """In stress mode, every core busy and every launch's links jittering, for the whole session."""
    config = session.config
    if not stress.stress_requested(config.getoption("--stress")):
        return
    config.stash[_JITTER_BEFORE] = os.environ.get("LVFL_LAUNCH_JITTER_MS")
    os.environ["LVFL_LAUNCH_JITTER_MS"] = f"{stress.JITTER_MS:g}"
    config.stash[_LOOPS] = stress.start_busy_loops()


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if _LOOPS not in config.stash:
        return
    stress.stop(config.stash[_LOOPS])
    before = config.stash[_JITTER_BEFORE]
    if before is None:
        os.environ.pop("LVFL_LAUNCH_JITTER_MS", None)
    else:
        os.environ["LVFL_LAUNCH_JITTER_MS"] = before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Record the processes a test's fixtures start (tests/tiers.py)."""
    with tiers.processes_started() as started:
        try:
            return (yield)
        finally:
            item.stash[_STARTED] = list(started)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test that starts a process (its fixtures or its body) is marked slow, or it fails (tests/tiers.py)."""
    with tiers.processes_started() as started:
        result = yield
    tiers.check_tier(item, item.stash.get(_STARTED, []) + started)
    return result


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
