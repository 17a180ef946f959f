"""Time as a dependency: the system clock in production, a manual clock in tests; a server's
clock learned from its answers; and the settle window that a clock-stamped score order needs."""

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


# --------------------------------------------------------------------------- the settle window

SCORE_SETTLE_SECONDS = 60.0
"""The default settle window on Cosmos DB: the trainer reads only scores older than this."""

SCORE_WRITE_TIMEOUT_SECONDS = 10.0
"""How long a score write to Cosmos DB may take before the store gives up on it (its
``write_timeout``); a score's ``seq`` is taken just before the write."""

CLOCK_SKEW_ALLOWANCE_SECONDS = 5.0
"""How far two instances' clocks may still disagree once each is corrected by the server's
(:class:`ServerClock`): the server stamps writes in whole seconds, the correction comes with
the round trip of the write that carried it, and clocks drift between corrections."""


def check_settle_window(settle_seconds: float, write_timeout: float = SCORE_WRITE_TIMEOUT_SECONDS) -> None:
    """Refuse a settle window that cannot work: the trainer reads only scores older than it, so
    it must exceed the longest a write may take plus the clock skew, or a score can land
    behind the training cursor and never be learned."""
    minimum = write_timeout + CLOCK_SKEW_ALLOWANCE_SECONDS
    if not settle_seconds > minimum:
        raise ValueError(
            f"the settle window (AGENT_LEARNING_SCORE_SETTLE_SECONDS) of {settle_seconds:g} s must exceed the "
            f"score write timeout ({write_timeout:g} s) plus the clock-skew allowance "
            f"({CLOCK_SKEW_ALLOWANCE_SECONDS:g} s), i.e. {minimum:g} s; a shorter window lets a score land behind "
            "the training cursor, never to be learned"
        )


class ServerClock:
    """A local clock moved forward to a server's where the server's is known to be ahead.

    A write the server stamped ``ts`` (whole seconds; Cosmos DB's ``_ts``) happened at server
    time ``ts`` or later, and before its answer arrived at local time ``t``: so the server's
    clock is at least ``ts − t`` ahead of the local one. This clock reads the local time plus
    that lower bound, taken from the latest answer (so it follows the local clock when it is
    stepped), and never less than the local time: a local clock that lags (a scorer 2 minutes
    behind) reads within about a second of the server's, while one that runs ahead is left as
    it is (a scorer ahead only delays its scores; a trainer ahead is what the settle window's
    clock-skew allowance must cover). Thread-safe.
    """

    def __init__(self, local: Clock) -> None:
        self.local = local
        self._ahead: float | None = None
        self._lock = threading.Lock()

    @property
    def observed(self) -> bool:
        """Whether any server time has been seen yet."""
        return self._ahead is not None

    def observe(self, server_seconds: object) -> None:
        """Learn from the server time of a write whose answer just arrived (ignored if not a number)."""
        if isinstance(server_seconds, int | float) and not isinstance(server_seconds, bool):
            ahead = float(server_seconds) - self.local.time()
            with self._lock:
                self._ahead = ahead

    def time(self) -> float:
        return self.local.time() + max(self._ahead or 0.0, 0.0)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), tz=UTC)
