"""Time as a dependency: the system clock in production, a manual clock in tests."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """Anything that tells the current time."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""

    def time(self) -> float:
        """The current time in seconds since the epoch."""


class SystemClock:
    """The real wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def time(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to; thread-safe. For tests and simulations."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), tz=UTC)

    def time(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        with self._lock:
            self._t += seconds


SYSTEM_CLOCK = SystemClock()
