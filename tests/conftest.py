"""Shared fixtures."""

from __future__ import annotations

import pytest

from agent_learning.clock import ManualClock

pytest_plugins = ["cosmos_fixture", "judge_server"]  # the AMQP broker is imported by the tests that use it


@pytest.fixture
def clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock()

