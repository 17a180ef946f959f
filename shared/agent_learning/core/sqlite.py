"""SQLite connections as the embedded store and queue open them: WAL, a busy timeout, and the
errors a busy or foreign file raises, named for the user."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent_learning.core.errors import ConfigurationError, TransientError

BUSY_TIMEOUT_MS = 30_000
"""How long a connection waits for another connection's write transaction before it gives up
(then :class:`~agent_learning.core.errors.TransientError`, see :func:`busy_is_transient`)."""


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A connection tuned for this workload (WAL, busy timeout, autocommit mode)."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    if str(path) != ":memory:":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


@contextmanager
def not_a_database(path: str) -> Iterator[None]:
    """Report a file that is not an SQLite database, or a folder, as a configuration error naming
    it (a locked or busy database is an ``OperationalError`` and passes through unchanged)."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError):
            if path != ":memory:" and Path(path).is_dir():
                raise ConfigurationError(
                    f"AGENT_LEARNING_SQLITE_PATH (--db): {path} is a folder, not a file; name the SQLite file"
                ) from None
            raise
        raise ConfigurationError(
            f"AGENT_LEARNING_SQLITE_PATH (--db): {path} is not an SQLite database this library can use ({exc})"
        ) from None


@contextmanager
def busy_is_transient(path: str) -> Iterator[None]:
    """Report a database another connection kept locked for longer than :data:`BUSY_TIMEOUT_MS`
    as a :class:`~agent_learning.core.errors.TransientError` naming the file, as Cosmos DB's throttling
    is one: trying again later may pass. Any other error passes through unchanged."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if getattr(exc, "sqlite_errorcode", None) not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise
        raise TransientError(
            f"{path}: the SQLite database stayed locked by another connection for {BUSY_TIMEOUT_MS / 1000:g} s ({exc})"
        ) from exc
