"""Shared test setup: offline hub, slow-test opt-in, deterministic single-threaded torch."""

from __future__ import annotations

import logging
import os

import pytest

pytest_plugins = ["order"]  # longest test files first (tests/order.py)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seedflood_logger_left_as_found():
    """A test that changes the library logger's level for good hides the logs later tests read
    (the clip benchmark's main once left it at ERROR, and two files failed only after it ran)."""
    logger = logging.getLogger("seedflood")
    level = logger.level
    yield
    assert logger.level == level, f"this test left the seedflood logger at level {logger.level}, not {level}"
