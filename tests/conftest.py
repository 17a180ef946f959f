"""Shared fixtures."""

from __future__ import annotations

import pytest

from agent_learning.clock import ManualClock

# The AMQP broker is imported by the tests that use it.
pytest_plugins = ["cosmos_fixture", "judge_server", "reliability_report"]


@pytest.fixture
def clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock()

