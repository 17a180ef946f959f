"""An embedded work queue in one SQLite file, with Azure Service Bus peek-lock semantics.

Tables (prefixed ``queue_`` so the file can hold other tables too; every row is keyed by the
queue name, so several queues can share a file):

* ``queue_messages`` — active messages. ``seq`` (the rowid) is the enqueue sequence; a locked
  message has a ``lock_token`` and ``locked_until``; an available one has both NULL. A message
  whose lock expired keeps its stale token until it is received again or dead-lettered, so
  settlement with that token is refused by the ``locked_until > now`` check. The only index is
  ``(queue, seq)``: a lock token is ``"{seq}:{random hex}"``, so settlement finds its row by
  rowid, and a receive or settle commit touches as few pages as possible.
* ``queue_dead_letters`` — the dead-letter sub-queue.
* ``queue_duplicate_detection`` — message ids sent within the duplicate-detection window.

Concurrency: WAL journal, a busy timeout, and every write in one ``BEGIN IMMEDIATE`` transaction,
so receivers in several threads or processes never get the same message under the same lock. A
file another connection keeps locked beyond the busy timeout raises
:class:`~agent_learning.core.errors.TransientError`, as the store does.
Within a process one connection is shared under a lock (which also makes ``":memory:"`` work);
a process forked after the queue was opened opens its own connection on first use.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import ConcurrencyConflict
from agent_learning.core.sqlite import BUSY_TIMEOUT_MS, busy_is_transient, not_a_database
from agent_learning.queue.base import (
    LOCK_SECONDS,
    MAX_DELIVERIES,
    MAX_DELIVERY_COUNT_EXCEEDED,
    DeadLetter,
    OutgoingMessage,
    QueueCounts,
    ReceivedMessage,
    WorkQueue,
    dead_letter_text,
)

_TOKEN_BYTES = 12  # random part of a lock token

_ID_CHUNK = 500  # ids per IN (...) list, well below SQLite's variable limit

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue_messages (
    seq            INTEGER PRIMARY KEY,
    queue          TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    body           BLOB    NOT NULL,
    properties     TEXT    NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    enqueued_at    REAL    NOT NULL,
    lock_token     TEXT,
    locked_until   REAL
);
CREATE INDEX IF NOT EXISTS queue_messages_fifo ON queue_messages (queue, seq);

CREATE TABLE IF NOT EXISTS queue_dead_letters (
    seq              INTEGER PRIMARY KEY,
    queue            TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    body             BLOB    NOT NULL,
    properties       TEXT    NOT NULL,
    delivery_count   INTEGER NOT NULL,
    enqueued_at      REAL    NOT NULL,
    reason           TEXT    NOT NULL,
    description      TEXT    NOT NULL,
    dead_lettered_at REAL    NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_dead_letters_fifo ON queue_dead_letters (queue, seq);
CREATE INDEX IF NOT EXISTS queue_dead_letters_message_id ON queue_dead_letters (queue, message_id);

CREATE TABLE IF NOT EXISTS queue_duplicate_detection (
    queue      TEXT NOT NULL,
    message_id TEXT NOT NULL,
    sent_at    REAL NOT NULL,
    PRIMARY KEY (queue, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS queue_duplicate_detection_sent_at
    ON queue_duplicate_detection (queue, sent_at);
"""

# The row a lock token still holds: parameters (seq, lock_token, queue, message_id).
_BY_TOKEN = "queue_messages WHERE seq = ? AND lock_token = ? AND queue = ? AND message_id = ?"

# Messages whose lock expired after their last allowed delivery: (queue, now, max_deliveries).
_EXHAUSTED = "queue = ? AND lock_token IS NOT NULL AND locked_until <= ? AND delivery_count >= ?"

_EXHAUSTED_DESCRIPTION = "'Message could not be consumed after ' || delivery_count || ' delivery attempts.'"

_DEAD_LETTER_COLUMNS = (
    "queue, message_id, body, properties, delivery_count, enqueued_at, reason, description, dead_lettered_at"
)


def _positive(name: str, value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class SQLiteQueue(WorkQueue):
    """A :class:`WorkQueue` stored in one SQLite file (or ``":memory:"``); see the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str = "score-episodes",
        lock_seconds: float = LOCK_SECONDS,
        max_deliveries: int = MAX_DELIVERIES,
        duplicate_window_seconds: float = 600.0,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise ValueError(f"path must be a non-empty str or os.PathLike, got {path!r}")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int) or max_deliveries < 1:
            raise ValueError(f"max_deliveries must be an integer >= 1, got {max_deliveries!r}")
        self.path = os.fspath(path)
        self.name = name
        self.lock_seconds = _positive("lock_seconds", lock_seconds)
        self.max_deliveries = max_deliveries
        self.duplicate_window_seconds = _positive("duplicate_window_seconds", duplicate_window_seconds)
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._closed = False
        self._inherited: list[sqlite3.Connection] = []
        if self.path != ":memory:":  # as the store does: a new file's folder is made
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with not_a_database(self.path), self._write() as (conn, _):
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

    def __repr__(self) -> str:
        return f"SQLiteQueue({self.path!r}, name={self.name!r})"

    # -- connection and transactions ---------------------------------------------------------

    def _check_fork(self) -> None:
        """After a fork, leave the parent's connection and lock alone and make new ones."""
        if self._pid != os.getpid():
            if self._conn is not None:
                self._inherited.append(self._conn)  # closing it here could disturb the parent
            self._conn = None
            self._lock = threading.RLock()
            self._pid = os.getpid()

    def _connection(self) -> sqlite3.Connection:
        """The process's connection; call with ``self._lock`` held."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if self.path != ":memory:":
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                # In WAL mode NORMAL survives application crashes; only an OS crash or power
                # loss can drop the last commits.
                conn.execute("PRAGMA synchronous = NORMAL")
            self._conn = conn
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, float]]:
        """One ``BEGIN IMMEDIATE`` transaction; yields the connection and the time inside it."""
        self._check_fork()
        with self._lock, busy_is_transient(self.path):
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn, self._clock.time()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        self._check_fork()
        with self._lock, busy_is_transient(self.path):
            yield self._connection()

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._check_fork()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._closed = True

    # -- sending -------------------------------------------------------------------------------

    def send(self, messages: Iterable[OutgoingMessage]) -> int:
        rows: list[tuple[str, bytes, str]] = []
        for message in messages:
            if not isinstance(message, OutgoingMessage):
                raise TypeError(f"send() takes OutgoingMessage objects, got {type(message).__name__}")
            rows.append((message.message_id, message.body.encode("utf-8"), _dump(message.properties)))
        if not rows:
            return 0
        queue = self.name
        with self._write() as (conn, now):
            cutoff = now - self.duplicate_window_seconds
            conn.execute(
                "DELETE FROM queue_duplicate_detection WHERE queue = ? AND sent_at <= ?", (queue, cutoff)
            )
            accepted: list[tuple[str, str, bytes, str, float]] = []
            record = (
                "INSERT INTO queue_duplicate_detection (queue, message_id, sent_at) VALUES (?, ?, ?)"
                " ON CONFLICT (queue, message_id) DO UPDATE SET sent_at = excluded.sent_at"
                " WHERE queue_duplicate_detection.sent_at <= ?"
            )
            for message_id, body, properties in rows:
                if conn.execute(record, (queue, message_id, now, cutoff)).rowcount == 1:
                    accepted.append((queue, message_id, body, properties, now))
            conn.executemany(
                "INSERT INTO queue_messages (queue, message_id, body, properties, enqueued_at)"
                " VALUES (?, ?, ?, ?, ?)",
                accepted,
            )
        return len(accepted)

    # -- receiving -----------------------------------------------------------------------------

    def receive(self, max_messages: int = 1) -> list[ReceivedMessage]:
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be an integer >= 1, got {max_messages!r}")
        received: list[ReceivedMessage] = []
        with self._write() as (conn, now):
            locked_until = now + self.lock_seconds
            while len(received) < max_messages:
                wanted = max_messages - len(received)
                rows = conn.execute(
                    "SELECT seq, message_id, body, properties, delivery_count, enqueued_at"
                    " FROM queue_messages WHERE queue = ? AND (lock_token IS NULL OR locked_until <= ?)"
                    " ORDER BY seq LIMIT ?",
                    (self.name, now, wanted),
                ).fetchall()
                # A message whose lock expired after its last allowed delivery is dead-lettered, not
                # delivered again; then look further down the queue.
                exhausted = [(row[0],) for row in rows if row[4] >= self.max_deliveries]
                if exhausted:
                    self._dead_letter_exhausted(conn, now, exhausted)
                rows = [row for row in rows if row[4] < self.max_deliveries]
                random = os.urandom(_TOKEN_BYTES * len(rows)).hex()
                step = 2 * _TOKEN_BYTES
                tokens = [f"{row[0]}:{random[i * step : (i + 1) * step]}" for i, row in enumerate(rows)]
                conn.executemany(
                    "UPDATE queue_messages SET delivery_count = delivery_count + 1, lock_token = ?,"
                    " locked_until = ? WHERE seq = ?",
                    [(token, locked_until, row[0]) for token, row in zip(tokens, rows, strict=True)],
                )
                received.extend(
                    ReceivedMessage(
                        message_id=message_id,
                        body=bytes(body),
                        properties=json.loads(properties),
                        delivery_count=delivery_count + 1,
                        lock_token=token,
                        enqueued_at=enqueued_at,
                        locked_until=locked_until,
                    )
                    for token, (_, message_id, body, properties, delivery_count, enqueued_at) in zip(
                        tokens, rows, strict=True
                    )
                )
                if not exhausted or len(rows) + len(exhausted) < wanted:
                    break
        return received

    def _dead_letter_exhausted(
        self, conn: sqlite3.Connection, now: float, seqs: list[tuple[int]] | None = None
    ) -> None:
        """Dead-letter exhausted messages: the given ``seqs``, or every expired one of this queue."""
        if seqs is None:
            seqs = conn.execute(
                f"SELECT seq FROM queue_messages WHERE {_EXHAUSTED} ORDER BY seq",
                (self.name, now, self.max_deliveries),
            ).fetchall()
        conn.executemany(
            f"INSERT INTO queue_dead_letters ({_DEAD_LETTER_COLUMNS})"
            " SELECT queue, message_id, body, properties, delivery_count, enqueued_at, ?,"
            f" {_EXHAUSTED_DESCRIPTION}, ? FROM queue_messages WHERE seq = ?",
            [(MAX_DELIVERY_COUNT_EXCEEDED, now, seq) for (seq,) in seqs],
        )
        conn.executemany("DELETE FROM queue_messages WHERE seq = ?", seqs)

    # -- settlement ----------------------------------------------------------------------------

    def complete(self, message: ReceivedMessage) -> None:
        with self._read() as conn:  # one statement, atomic on its own: no transaction around it
            now = self._clock.time()
            deleted = conn.execute(
                f"DELETE FROM {_BY_TOKEN} AND locked_until > ?",
                (*self._token_key(message), now),
            ).rowcount
            if deleted != 1:
                raise self._lock_lost(conn, message, now)

    def complete_all(self, messages: Sequence[ReceivedMessage]) -> list[ReceivedMessage]:
        if not messages:
            return []
        with self._write() as (conn, now):  # one commit for them all
            return [
                message
                for message in messages
                if conn.execute(f"DELETE FROM {_BY_TOKEN} AND locked_until > ?", (*self._token_key(message), now))
                .rowcount != 1
            ]

    def abandon(self, message: ReceivedMessage) -> None:
        with self._write() as (conn, now):
            seq, delivery_count = self._locked(conn, message, now)
            if delivery_count >= self.max_deliveries:
                description = f"Message could not be consumed after {delivery_count} delivery attempts."
                self._move_to_dead_letters(conn, seq, MAX_DELIVERY_COUNT_EXCEEDED, description, now)
            else:
                conn.execute(
                    "UPDATE queue_messages SET lock_token = NULL, locked_until = NULL WHERE seq = ?", (seq,)
                )

    def dead_letter(self, message: ReceivedMessage, reason: str, description: str = "") -> None:
        if not isinstance(reason, str) or not isinstance(description, str):
            raise TypeError("reason and description must be strings")
        with self._write() as (conn, now):
            seq, _ = self._locked(conn, message, now)
            self._move_to_dead_letters(conn, seq, dead_letter_text(reason), dead_letter_text(description), now)

    def _locked(self, conn: sqlite3.Connection, message: ReceivedMessage, now: float) -> tuple[int, int]:
        """``(seq, delivery_count)`` of a message whose lock ``message`` still holds, else raise."""
        key = self._token_key(message)
        row = conn.execute(
            f"SELECT delivery_count FROM {_BY_TOKEN} AND locked_until > ?", (*key, now)
        ).fetchone()
        if row is None:
            raise self._lock_lost(conn, message, now)
        return key[0], row[0]

    def _lock_lost(
        self, conn: sqlite3.Connection, message: ReceivedMessage, now: float
    ) -> ConcurrencyConflict:
        row = conn.execute(f"SELECT locked_until FROM {_BY_TOKEN}", self._token_key(message)).fetchone()
        if row is not None:
            why = f"the lock expired {now - row[0]:.3f} s ago"
        else:
            why = "it was already settled or received again under a new lock"
        return ConcurrencyConflict(
            f"lock lost for message {message.message_id!r} in queue {self.name!r}: {why}"
        )

    def _token_key(self, message: ReceivedMessage) -> tuple[int, str, str, str]:
        """Parameters for ``_BY_TOKEN``; a token this queue cannot have issued matches no row."""
        seq, _, _ = str(message.lock_token).partition(":")
        return (int(seq) if seq.isdecimal() else -1, message.lock_token, self.name, message.message_id)

    @staticmethod
    def _move_to_dead_letters(
        conn: sqlite3.Connection, seq: int, reason: str, description: str, now: float
    ) -> None:
        conn.execute(
            f"INSERT INTO queue_dead_letters ({_DEAD_LETTER_COLUMNS})"
            " SELECT queue, message_id, body, properties, delivery_count, enqueued_at, ?, ?, ?"
            " FROM queue_messages WHERE seq = ?",
            (reason, description, now, seq),
        )
        conn.execute("DELETE FROM queue_messages WHERE seq = ?", (seq,))

    # -- dead letters and counts ---------------------------------------------------------------

    def _sweep(self) -> None:
        """Apply expired locks of exhausted messages before reading, as Service Bus would have."""
        with self._read() as conn:
            pending = conn.execute(
                f"SELECT 1 FROM queue_messages WHERE {_EXHAUSTED} LIMIT 1",
                (self.name, self._clock.time(), self.max_deliveries),
            ).fetchone()
        if pending is not None:
            with self._write() as (conn, now):
                self._dead_letter_exhausted(conn, now)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        self._sweep()
        with self._read() as conn:
            rows = conn.execute(
                "SELECT message_id, body, properties, delivery_count, reason, description, dead_lettered_at"
                " FROM queue_dead_letters WHERE queue = ? ORDER BY seq LIMIT ?",
                (self.name, limit),
            ).fetchall()
        return [
            DeadLetter(
                message_id=message_id,
                body=bytes(body),
                properties=json.loads(properties),
                delivery_count=delivery_count,
                reason=reason,
                description=description,
                dead_lettered_at=dead_lettered_at,
            )
            for message_id, body, properties, delivery_count, reason, description, dead_lettered_at in rows
        ]

    def replay_dead_letters(self, message_ids: Iterable[str] | None = None) -> int:
        ids: list[str] | None = None
        if message_ids is not None:
            if isinstance(message_ids, str):
                raise TypeError("message_ids must be an iterable of ids, not a single string")
            ids = list(dict.fromkeys(message_ids))
            if not ids:
                return 0
        self._sweep()
        with self._write() as (conn, now):
            if ids is None:
                seqs = [
                    row[0]
                    for row in conn.execute(
                        "SELECT seq FROM queue_dead_letters WHERE queue = ? ORDER BY seq", (self.name,)
                    )
                ]
            else:
                seqs = []
                for start in range(0, len(ids), _ID_CHUNK):
                    chunk = ids[start : start + _ID_CHUNK]
                    marks = ", ".join("?" * len(chunk))
                    seqs.extend(
                        row[0]
                        for row in conn.execute(
                            f"SELECT seq FROM queue_dead_letters WHERE queue = ? AND message_id IN ({marks})",
                            (self.name, *chunk),
                        )
                    )
                seqs.sort()
            # Resubmitted like a new send: at the back of the queue, enqueued now, never delivered.
            conn.executemany(
                "INSERT INTO queue_messages (queue, message_id, body, properties, enqueued_at)"
                " SELECT queue, message_id, body, properties, ? FROM queue_dead_letters WHERE seq = ?",
                [(now, seq) for seq in seqs],
            )
            conn.executemany("DELETE FROM queue_dead_letters WHERE seq = ?", [(seq,) for seq in seqs])
        return len(seqs)

    def counts(self) -> QueueCounts:
        self._sweep()
        with self._read() as conn:
            active, locked, dead = conn.execute(
                "SELECT count(*), coalesce(sum(lock_token IS NOT NULL AND locked_until > ?2), 0),"
                " (SELECT count(*) FROM queue_dead_letters WHERE queue = ?1)"
                " FROM queue_messages WHERE queue = ?1",
                (self.name, self._clock.time()),
            ).fetchone()
        return QueueCounts(active=active, locked=locked, dead_letter=dead)

    def oldest_enqueued_at(self) -> float | None:
        self._sweep()
        with self._read() as conn:
            (oldest,) = conn.execute(
                "SELECT min(enqueued_at) FROM queue_messages WHERE queue = ?", (self.name,)
            ).fetchone()
        return oldest


def _dump(properties: Any) -> str:
    return json.dumps(properties, separators=(",", ":"), ensure_ascii=False)
