"""Shared fixtures."""

from __future__ import annotations

import pytest

from agent_learning.clock import ManualClock

pytest_plugins = ["cosmos_fixture", "amqp_broker", "judge_server"]


@pytest.fixture
def clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock()


def pytest_configure(config: pytest.Config) -> None:
    """The Functions app lives at the repository root: make it importable as ``function_app``."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
