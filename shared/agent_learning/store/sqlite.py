"""The embedded store: one SQLite file, safe for several threads and processes.

Documents are stored as JSON text next to the few columns queries need. WAL journaling lets
readers run while one writer commits; writes that must be atomic (assigning a score's
``seq``, the current-policy compare-and-swap) run in ``BEGIN IMMEDIATE`` transactions, so
SQLite serialises them; a writer waits up to :data:`BUSY_TIMEOUT_MS` for another's, then raises
:class:`~agent_learning.core.errors.TransientError`. The episode change feed is the table's
autoincrement ``lsn``; the feedback change feed is the ``feedback_feed`` table, whose row for a
feedback document is replaced (with a new ``lsn``) in the transaction that writes the document.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from agent_learning.core.errors import ConcurrencyConflict
from agent_learning.core.sqlite import busy_is_transient, connect, not_a_database
from agent_learning.documents import (
    CorrectionLedger,
    Episode,
    Feedback,
    PolicyDocument,
    Score,
    ScoreCursor,
    TrainingRun,
    UnjudgedRecord,
    policy_doc_id,
)
from agent_learning.store.base import (
    AgentCursor,
    FeedPage,
    RawDoc,
    Store,
    Tagged,
    UnjudgedMark,
    agent_cursor,
    check_limit,
    same_document,
    sources_full,
)

ID_PAGE = 1_000
"""Rows per query when ids are streamed."""

AFTER_CURSOR = "agent_id = ? AND (seq, id) > (?, ?)"
"""An agent's scores strictly after a cursor. The row-value comparison lets SQLite seek the
``scores_agent_seq`` index (agent_id, seq, id) to the cursor; the equivalent ``seq > ? OR
(seq = ? AND id > ?)`` uses only its agent_id column and walks the agent's whole history."""
READ_SCORES = f"SELECT seq, id, doc FROM scores WHERE {AFTER_CURSOR} ORDER BY seq, id LIMIT ?"

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    lsn INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    agent_id TEXT,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_agent ON episodes (agent_id, lsn);
CREATE TABLE IF NOT EXISTS scores (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    seq INTEGER NOT NULL UNIQUE,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS scores_agent_seq ON scores (agent_id, seq, id);
CREATE TABLE IF NOT EXISTS policies (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,
    etag TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS policies_agent ON policies (agent_id, kind, version);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_agent ON runs (agent_id, policy_version);
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY,
    episode_id TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_episode ON feedback (episode_id, id);
CREATE TABLE IF NOT EXISTS feedback_markers (
    id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS unjudged (
    id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS unjudged_agent ON unjudged (agent_id, id);
CREATE TABLE IF NOT EXISTS feedback_feed (
    lsn INTEGER PRIMARY KEY AUTOINCREMENT,
    feedback_id TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS correction_ledgers (
    episode_id TEXT PRIMARY KEY,
    etag TEXT NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


DEFAULT_PATH = ".agent-learning/local.db"
"""The local store's file when ``AGENT_LEARNING_SQLITE_PATH`` (:data:`PATH_SETTING`) is not set."""
PATH_SETTING = "AGENT_LEARNING_SQLITE_PATH"


def described(path: str) -> str:
    """The store's file at ``path`` for messages: its absolute path, and how the path is chosen
    (a relative one depends on the working directory)."""
    if path == ":memory:":
        return "an in-memory SQLite database"
    return f"{os.path.abspath(path)} ({PATH_SETTING} or --db; else {DEFAULT_PATH} in the working directory)"


class SQLiteStore(Store):
    """The local default store. ``path`` is created (with its folder) if missing; without one, the
    file the settings name (:data:`PATH_SETTING`, else :data:`DEFAULT_PATH`), where ``agent-learn``
    and :func:`agent_learning.app.embedded.open_local` keep it, without loading the settings (an agent
    opens its store without the pipeline's dependencies)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path if path is not None else os.environ.get(PATH_SETTING) or DEFAULT_PATH)
        self.created = self.path != ":memory:" and not Path(self.path).exists()
        """Whether opening the store created its file (empty)."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._shared: sqlite3.Connection | None = None
        self._shared_lock = threading.RLock()
        if self.path == ":memory:":  # one database: share one connection behind a lock
            self._shared = connect(self.path)
        with self._lock(), not_a_database(self.path), busy_is_transient(self.path):
            conn = self._conn()
            new_feed = not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'feedback_feed'").fetchone()
            conn.executescript(SCHEMA)
            if new_feed:  # a file from before the feedback feed existed: its feedback enters the feed once
                conn.execute("INSERT OR IGNORE INTO feedback_feed (feedback_id) SELECT id FROM feedback ORDER BY rowid")

    @property
    def location(self) -> str:
        new = ", created empty when this store opened it" if self.created else ""
        return f"the SQLite file {described(self.path)}{new}"

    # ------------------------------------------------------------------ plumbing

    def _conn(self) -> sqlite3.Connection:
        if self._shared is not None:
            return self._shared
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _lock(self) -> AbstractContextManager[object]:
        """Serialises use of the shared in-memory connection; per-thread files need none."""
        return self._shared_lock if self._shared is not None else nullcontext()

    @contextmanager
    def _tx(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        with self._lock(), busy_is_transient(self.path):
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock(), busy_is_transient(self.path):
            return self._conn().execute(sql, params).fetchall()

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        if self._shared is not None:
            self._shared.close()
        self._local = threading.local()

    # ------------------------------------------------------------------ episodes

    def add_episode(self, episode: Episode) -> None:
        # One statement, atomic on its own: the episode's JSON as validation made it, unless its id is taken.
        with self._lock(), busy_is_transient(self.path):
            inserted = self._conn().execute(
                "INSERT INTO episodes (id, agent_id, doc) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (episode.id, episode.agent_id, episode.to_json()),
            ).rowcount
        if inserted:
            return
        rows = self._query("SELECT doc FROM episodes WHERE id = ?", (episode.id,))
        if not rows:  # deleted since (its agent was): write it again
            return self.add_episode(episode)
        if not same_document(json.loads(rows[0][0]), episode.to_dict()):  # type: ignore[arg-type]
            raise ConcurrencyConflict(f"episode {episode.id!r} already exists with different content")

    def add_raw_episode(self, doc: RawDoc) -> None:
        """Store an unvalidated episode document, as a non-Python agent writing to Cosmos
        could. For tests of the pipeline's handling of bad input."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO episodes (id, agent_id, doc) VALUES (?, ?, ?)",
                (str(doc.get("id", uuid.uuid4().hex)), str(doc.get("agent_id")), json.dumps(doc)),
            )

    def get_episode(self, episode_id: str) -> RawDoc | None:
        rows = self._query("SELECT doc FROM episodes WHERE id = ?", (episode_id,))
        return json.loads(rows[0][0]) if rows else None  # type: ignore[arg-type]

    def read_episodes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        after = int(continuation) if continuation else 0
        rows = self._query("SELECT lsn, doc FROM episodes WHERE lsn > ? ORDER BY lsn LIMIT ?", (after, max_items))
        last = rows[-1][0] if rows else after
        return FeedPage([json.loads(r[1]) for r in rows], str(last))  # type: ignore[arg-type]

    def list_episodes(self, agent_id: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        if agent_id is None:
            rows = self._query("SELECT doc FROM episodes ORDER BY lsn DESC LIMIT ?", (limit,))
        else:
            rows = self._query(
                "SELECT doc FROM episodes WHERE agent_id = ? ORDER BY lsn DESC LIMIT ?", (agent_id, limit)
            )
        return [json.loads(r[0]) for r in rows]  # type: ignore[arg-type]

    def episode_ids(self, agent_id: str) -> Iterator[str]:
        after = 0
        while True:
            rows = self._query(
                "SELECT lsn, id FROM episodes WHERE agent_id = ? AND lsn > ? ORDER BY lsn LIMIT ?",
                (agent_id, after, ID_PAGE),
            )
            for _, episode_id in rows:
                yield str(episode_id)
            if len(rows) < ID_PAGE:
                return
            after = int(rows[-1][0])  # type: ignore[call-overload]

    # ------------------------------------------------------------------ scores

    def add_score(self, score: Score) -> Score:
        return self._write_score(score, overwrite=False)

    def put_score(self, score: Score) -> Score:
        return self._write_score(score, overwrite=True)

    _SLOT = (
        "SELECT s.seq, json_extract(s.doc, '$.late_write'), (SELECT COALESCE(MAX(seq), 0) FROM scores),"
        " EXISTS (SELECT 1 FROM unjudged WHERE id = ?1), EXISTS (SELECT 1 FROM feedback_markers WHERE id = ?1)"
        " FROM (SELECT 1) LEFT JOIN scores s ON s.id = ?1"
    )
    """What writing a score to slot ``?1`` must know, in one read: the seq and ``late_write`` of a score
    there (NULL for none), the highest seq, whether an unjudged record and a feedback marker are there."""

    def _write_score(self, score: Score, overwrite: bool) -> Score:
        with self._tx() as conn:
            seq, late_write, top, unjudged, marked = conn.execute(self._SLOT, (score.id,)).fetchone()
            if seq is not None and not overwrite:
                raise ConcurrencyConflict(f"episode {score.id!r} already has a score")
            if unjudged:
                conn.execute("DELETE FROM unjudged WHERE id = ?", (score.id,))
            if marked:
                conn.execute("DELETE FROM feedback_markers WHERE id = ?", (score.id,))
                score = score.model_copy(update={"feedback_pending": True})
            if seq is not None:
                stored = score.model_copy(update={"seq": seq, "late_write": late_write == 1})
                conn.execute(
                    "UPDATE scores SET agent_id = ?, doc = ? WHERE id = ?",
                    (stored.agent_id, stored.to_json(), stored.id),
                )
            else:
                stored = score.model_copy(update={"seq": top + 1})
                conn.execute(
                    "INSERT INTO scores (id, agent_id, seq, doc) VALUES (?, ?, ?, ?)",
                    (stored.id, stored.agent_id, stored.seq, stored.to_json()),
                )
        return stored

    def get_score(self, episode_id: str, agent_id: str) -> RawDoc | None:
        rows = self._query("SELECT doc FROM scores WHERE id = ? AND agent_id = ?", (episode_id, agent_id))
        return json.loads(rows[0][0]) if rows else None  # type: ignore[arg-type]

    def read_scores(
        self, agent_id: str, after: ScoreCursor | None, limit: int, *, settled: bool = True
    ) -> list[RawDoc]:
        check_limit(limit)
        seq, sid = (after.seq, after.id) if after else (-1, "")
        rows = self._query(READ_SCORES, (agent_id, seq, sid, limit))
        out = []
        for s, i, text in rows:
            try:
                doc = json.loads(text)  # type: ignore[arg-type]
            except ValueError:
                doc = {"corrupt": text}
            if not isinstance(doc, dict):
                doc = {"corrupt": doc}
            doc["seq"], doc["id"] = s, i  # the columns are the truth for the cursor
            out.append(doc)
        return out

    def has_new_scores(self, agent_id: str, after: ScoreCursor | None) -> bool:
        seq, sid = (after.seq, after.id) if after else (-1, "")
        return bool(self._query(f"SELECT 1 FROM scores WHERE {AFTER_CURSOR} LIMIT 1", (agent_id, seq, sid)))

    def put_raw_score(self, doc: RawDoc) -> None:
        """Store an unvalidated score document (for tests of corrupt-data handling)."""
        with self._tx() as conn:
            (top,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM scores").fetchone()
            conn.execute(
                "INSERT OR REPLACE INTO scores (id, agent_id, seq, doc) VALUES (?, ?, ?, ?)",
                (str(doc["id"]), str(doc["agent_id"]), top + 1, json.dumps(doc)),
            )

    # ------------------------------------------------------------------ unjudged episodes

    def mark_unjudged(self, record: UnjudgedRecord) -> UnjudgedMark:
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM scores WHERE id = ?", (record.id,)).fetchone():
                return "scored"
            inserted = conn.execute(
                "INSERT OR IGNORE INTO unjudged (id, agent_id, doc) VALUES (?, ?, ?)",
                (record.id, record.agent_id, record.to_json()),
            ).rowcount
            return "recorded" if inserted else "kept"

    _UNJUDGED = (
        "SELECT u.doc, EXISTS (SELECT 1 FROM feedback_markers m WHERE m.id = u.id) FROM unjudged u "
        "WHERE u.agent_id = ? AND "
    )

    def get_unjudged(self, episode_id: str, agent_id: str) -> RawDoc | None:
        rows = self._query(self._UNJUDGED + "u.id = ?", (agent_id, episode_id))
        return _pending(rows[0]) if rows else None

    def list_unjudged(self, agent_id: str, after: str | None = None, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        rows = self._query(self._UNJUDGED + "u.id > ? ORDER BY u.id LIMIT ?", (agent_id, after or "", limit))
        return [_pending(row) for row in rows]

    # ------------------------------------------------------------------ feedback

    def put_feedback(self, feedback: Feedback, max_sources: int | None = None) -> None:
        with self._tx() as conn:  # BEGIN IMMEDIATE: no other writer between the count and the write
            if max_sources is not None:
                given, known = conn.execute(
                    "SELECT COUNT(*), COALESCE(SUM(id = ?), 0) FROM feedback WHERE episode_id = ?",
                    (feedback.id, feedback.episode_id),
                ).fetchone()
                if not known and given >= max_sources:
                    raise sources_full(feedback.episode_id, given)
            conn.execute(
                "INSERT OR REPLACE INTO feedback (id, episode_id, doc) VALUES (?, ?, ?)",
                (feedback.id, feedback.episode_id, feedback.to_json()),
            )
            conn.execute("INSERT OR REPLACE INTO feedback_feed (feedback_id) VALUES (?)", (feedback.id,))

    def list_feedback(self, episode_id: str) -> list[RawDoc]:
        rows = self._query("SELECT doc FROM feedback WHERE episode_id = ? ORDER BY id", (episode_id,))
        return [json.loads(r[0]) for r in rows]  # type: ignore[arg-type]

    def mark_feedback_waiting(self, episode_id: str, agent_id: str) -> bool:
        with self._tx() as conn:
            if conn.execute("SELECT 1 FROM scores WHERE id = ?", (episode_id,)).fetchone():
                return False
            conn.execute("INSERT OR IGNORE INTO feedback_markers (id) VALUES (?)", (episode_id,))
            return True

    def read_feedback_changes(self, continuation: str | None, max_items: int = 100) -> FeedPage:
        after = int(continuation) if continuation else 0
        rows = self._query(
            "SELECT f.lsn, d.doc FROM feedback_feed f JOIN feedback d ON d.id = f.feedback_id "
            "WHERE f.lsn > ? ORDER BY f.lsn LIMIT ?",
            (after, max_items),
        )
        last = rows[-1][0] if rows else after
        return FeedPage([json.loads(r[1]) for r in rows], str(last))  # type: ignore[arg-type]

    def get_correction_ledger(self, episode_id: str, agent_id: str) -> Tagged | None:
        rows = self._query("SELECT doc, etag FROM correction_ledgers WHERE episode_id = ?", (episode_id,))
        if not rows:
            return None
        doc = json.loads(rows[0][0])  # type: ignore[arg-type]
        return Tagged(doc, str(rows[0][1])) if isinstance(doc, dict) and doc.get("agent_id") == agent_id else None

    def put_correction_ledger(self, ledger: CorrectionLedger, etag: str | None) -> str:
        new_etag = uuid.uuid4().hex
        with self._tx() as conn:
            row = conn.execute(
                "SELECT etag FROM correction_ledgers WHERE episode_id = ?", (ledger.episode_id,)
            ).fetchone()
            if (row[0] if row else None) != etag:
                raise ConcurrencyConflict(f"the correction ledger of {ledger.episode_id!r} changed (stale ETag)")
            conn.execute(
                "INSERT OR REPLACE INTO correction_ledgers (episode_id, etag, doc) VALUES (?, ?, ?)",
                (ledger.episode_id, new_etag, ledger.to_json()),
            )
        return new_etag

    # ------------------------------------------------------------------ policies

    def get_current_policy(self, agent_id: str) -> Tagged | None:
        rows = self._query("SELECT doc, etag FROM policies WHERE id = ?", (policy_doc_id(agent_id, None),))
        return Tagged(json.loads(rows[0][0]), str(rows[0][1])) if rows else None  # type: ignore[arg-type]

    def get_policy_version(self, agent_id: str, version: int) -> RawDoc | None:
        rows = self._query("SELECT doc FROM policies WHERE id = ?", (policy_doc_id(agent_id, version),))
        return json.loads(rows[0][0]) if rows else None  # type: ignore[arg-type]

    def replace_current_policy(self, doc: PolicyDocument, etag: str | None) -> str:
        if doc.kind != "current":
            raise ValueError("replace_current_policy needs a kind='current' document")
        new_etag = uuid.uuid4().hex
        with self._tx() as conn:
            row = conn.execute("SELECT etag FROM policies WHERE id = ?", (doc.id,)).fetchone()
            if etag is None and row is not None:
                raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} already exists")
            if etag is not None and (row is None or row[0] != etag):
                raise ConcurrencyConflict(f"current policy of {doc.agent_id!r} changed (stale ETag)")
            conn.execute(
                "INSERT OR REPLACE INTO policies (id, agent_id, kind, version, etag, doc) "
                "VALUES (?, ?, 'current', ?, ?, ?)",
                (doc.id, doc.agent_id, doc.version, new_etag, doc.to_json()),
            )
        return new_etag

    def put_raw_current_policy(self, agent_id: str, doc: RawDoc) -> None:
        """Overwrite the current document with anything (for tests of corrupt-policy handling)."""
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO policies (id, agent_id, kind, version, etag, doc) "
                "VALUES (?, ?, 'current', 0, ?, ?)",
                (policy_doc_id(agent_id, None), agent_id, uuid.uuid4().hex, json.dumps(doc)),
            )

    def create_policy_version(self, doc: PolicyDocument) -> None:
        if doc.kind != "version":
            raise ValueError("create_policy_version needs a kind='version' document")
        data = doc.to_dict()
        with self._tx() as conn:
            row = conn.execute("SELECT doc FROM policies WHERE id = ?", (doc.id,)).fetchone()
            if row is not None:
                if same_document(json.loads(row[0]), data):
                    return
                raise ConcurrencyConflict(f"policy version {doc.id!r} already exists with different content")
            conn.execute(
                "INSERT INTO policies (id, agent_id, kind, version, etag, doc) VALUES (?, ?, 'version', ?, ?, ?)",
                (doc.id, doc.agent_id, doc.version, uuid.uuid4().hex, json.dumps(data)),
            )

    def list_policy_versions(
        self, agent_id: str, newest: int | None = None, *, between: tuple[int, int] | None = None
    ) -> list[RawDoc]:
        low, high = between if between is not None else (-1, 2**62)  # versions start at 1
        where = "agent_id = ? AND kind = 'version' AND version BETWEEN ? AND ?"
        if newest is None:
            rows = self._query(f"SELECT doc FROM policies WHERE {where} ORDER BY version", (agent_id, low, high))
        else:
            rows = self._query(
                f"SELECT doc FROM (SELECT doc, version FROM policies WHERE {where}"
                " ORDER BY version DESC LIMIT ?) ORDER BY version",
                (agent_id, low, high, max(newest, 0)),
            )
        return [json.loads(r[0]) for r in rows]  # type: ignore[arg-type]

    def policy_version_times(self, agent_id: str) -> list[tuple[int, Any]]:
        rows = self._query(
            "SELECT version, json_extract(doc, '$.created_at') FROM policies"
            " WHERE agent_id = ? AND kind = 'version' ORDER BY version",
            (agent_id,),
        )
        return [(int(r[0]), r[1]) for r in rows]  # type: ignore[arg-type]

    def list_agents(self) -> list[str]:
        rows = self._query("SELECT agent_id FROM policies WHERE kind = 'current' ORDER BY agent_id")
        return [str(r[0]) for r in rows]

    def training_cursors(self) -> list[AgentCursor]:
        rows = self._query("SELECT agent_id, doc FROM policies WHERE kind = 'current' ORDER BY agent_id")
        out = []
        for agent_id, text in rows:
            try:
                doc = json.loads(text)  # type: ignore[arg-type]
            except ValueError:
                doc = None
            out.append(agent_cursor(doc, agent_id))
        return out

    # ------------------------------------------------------------------ runs

    def delete_agent(self, agent_id: str) -> dict[str, int]:
        with self._tx() as conn:  # one transaction
            policies = conn.execute("DELETE FROM policies WHERE agent_id = ?", (agent_id,)).rowcount
            runs = conn.execute("DELETE FROM runs WHERE agent_id = ?", (agent_id,)).rowcount
            return {"policies": policies, "runs": runs, **self._delete_logs(conn, agent_id)}

    def delete_logs(self, agent_id: str) -> dict[str, int]:
        with self._tx() as conn:
            return self._delete_logs(conn, agent_id)

    @staticmethod
    def _delete_logs(conn: sqlite3.Connection, agent_id: str) -> dict[str, int]:
        episodes = "SELECT id FROM episodes WHERE agent_id = ?"
        run = conn.execute
        scores = run("DELETE FROM scores WHERE agent_id = ?", (agent_id,)).rowcount
        scores += run(f"DELETE FROM correction_ledgers WHERE episode_id IN ({episodes})", (agent_id,)).rowcount
        scores += run("DELETE FROM unjudged WHERE agent_id = ?", (agent_id,)).rowcount
        run(f"DELETE FROM feedback_markers WHERE id IN ({episodes})", (agent_id,))
        run(f"DELETE FROM feedback_feed WHERE feedback_id IN "
            f"(SELECT id FROM feedback WHERE episode_id IN ({episodes}))", (agent_id,))
        feedback = run(f"DELETE FROM feedback WHERE episode_id IN ({episodes})", (agent_id,)).rowcount
        removed = run("DELETE FROM episodes WHERE agent_id = ?", (agent_id,)).rowcount
        return {"scores": scores, "feedback": feedback, "episodes": removed}

    def put_run(self, run: TrainingRun) -> None:
        with self._tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO runs (id, agent_id, policy_version, doc) VALUES (?, ?, ?, ?)",
                (run.id, run.agent_id, run.policy_version, run.to_json()),
            )

    def get_run(self, run_id: str) -> RawDoc | None:
        rows = self._query("SELECT doc FROM runs WHERE id = ?", (run_id,))
        return json.loads(rows[0][0]) if rows else None  # type: ignore[arg-type]

    def list_runs(self, agent_id: str, limit: int = 100) -> list[RawDoc]:
        check_limit(limit)
        rows = self._query(
            "SELECT doc FROM runs WHERE agent_id = ? ORDER BY policy_version DESC LIMIT ?", (agent_id, limit)
        )
        return [json.loads(r[0]) for r in rows]  # type: ignore[arg-type]

    # ------------------------------------------------------------------ checkpoints

    def get_checkpoint(self, name: str) -> str | None:
        rows = self._query("SELECT value FROM checkpoints WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    def set_checkpoint(self, name: str, value: str) -> None:
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO checkpoints (name, value) VALUES (?, ?)", (name, value))

    def list_checkpoints(self, prefix: str) -> dict[str, str]:
        rows = self._query("SELECT name, value FROM checkpoints WHERE substr(name, 1, ?) = ?", (len(prefix), prefix))
        return {str(name): str(value) for name, value in rows}

    def delete_checkpoint(self, name: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM checkpoints WHERE name = ?", (name,))


def _pending(row: tuple[object, ...]) -> RawDoc:
    """An unjudged record's row (its document, whether a feedback marker waits) as its document."""
    doc: RawDoc = json.loads(row[0])  # type: ignore[arg-type]
    doc["feedback_pending"] = bool(row[1])
    return doc
