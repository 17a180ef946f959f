"""The store and queues the settings choose, opened for a command, and an agent's current policy."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager, nullcontext, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.text import Text

from agent_learning.cli.output import _iso, _with_notes, err
from agent_learning.core.errors import NotFound, StoredDocumentInvalid, TransientError


def _settings(db: str | None) -> Any:
    from agent_learning.app.settings import load_settings
    return load_settings(**({"sqlite_path": db} if db else {}))


def _existing(settings: Any) -> Any:
    """``settings`` if their embedded store exists; commands other than ``init-policy`` (and the
    demo, which writes its own) never create one at a mistyped path, nor in another program's file."""
    if settings.store != "sqlite":
        return settings
    if not Path(settings.sqlite_path).exists():
        from agent_learning.app.wiring import describe_store

        raise NotFound(
            f"--db: there is no store at {describe_store(settings)}; "
            "agent-learn init-policy creates one, and the demo writes .agent-learning/demo.db"
        )
    if not _agent_learning_file(settings.sqlite_path):
        raise ValueError(f"--db: {settings.sqlite_path} is not an agent-learning store (AGENT_LEARNING_SQLITE_PATH)")
    return settings


@contextmanager
def _usable(option: str, path: str | Path) -> Iterator[None]:
    """Report a path the filesystem refuses (a file where a folder should be, no permission, a
    read-only database) as bad input naming ``option``; a locked database is a transient failure."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise TransientError(f"{option}: {path} is locked by another process ({exc})") from None
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        if Path(path).is_dir():  # SQLite says "disk I/O error" or "unable to open database file"
            reason = "a folder, not a file"
        elif isinstance(exc, FileExistsError | NotADirectoryError):  # a file where a folder of the path should be
            reason = f"{exc.filename} is a file, not a folder"
        elif isinstance(exc, OSError) and exc.filename and str(exc.filename) != str(path):
            reason += f": {exc.filename}"
        raise ValueError(f"{option}: cannot use {path}: {reason}") from None


MARK_TABLES = ("policies", "queue_messages")
"""Tables the embedded store and the embedded queue always create: a file with neither is not theirs."""


def _agent_learning_file(path: str | Path) -> bool:
    """Whether the SQLite file at ``path`` holds the embedded store or queue; read only, so a file
    that is not theirs is left as it is."""
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    with _usable("--db", path), closing(sqlite3.connect(uri, uri=True)) as conn:
        try:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                                 MARK_TABLES).fetchone()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise
            return False  # not SQLite at all
    return found is not None


def _embedded(settings: Any, kind: str) -> Any:
    """Path errors of the embedded SQLite file as ``--db`` errors, if ``kind`` (a setting such as
    ``store`` or ``queue``) chooses the embedded one; otherwise nothing."""
    return _usable("--db", settings.sqlite_path) if getattr(settings, kind) == "sqlite" else nullcontext()


def _writable(option: str, path: str) -> None:
    """Check before any work that ``path`` can be written (its folders are made for the check if
    missing); a file or folder that was not there is not left behind (the writer makes them again)."""
    target = Path(path)
    existed = target.exists()
    made = [folder for folder in target.parents if not folder.exists()]  # deepest first
    try:
        with _usable(option, path):
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab"):
                pass
            if not existed:
                target.unlink()
    finally:
        for folder in made:
            with suppress(OSError):
                folder.rmdir()


@contextmanager
def _store(db: str | None, *, create: bool = False) -> Iterator[tuple[Any, Any]]:
    """The store the settings choose, and the settings; an embedded one must exist unless ``create``."""
    from agent_learning.app import wiring
    settings = _settings(db) if create else _existing(_settings(db))
    with _embedded(settings, "store"):
        store = wiring.open_store(settings)
    try:
        yield store, settings
    finally:
        store.close()


def _where(settings: Any, how: bool = False) -> str:
    """The store the settings choose; with ``how``, for messages about what it lacks, an embedded
    file's absolute path and how it is chosen (a relative one depends on the working directory)."""
    if settings.store == "sqlite" and not how:
        return str(settings.sqlite_path)
    from agent_learning.app.wiring import describe_store

    return describe_store(settings)


def _current(store: Any, settings: Any, agent_id: str) -> Any:
    """The agent's current policy document; :class:`NotFound` (bad input) when it has none, and an
    invalid one raises :class:`StoredDocumentInvalid` with the rollback that repairs it as a note."""
    from agent_learning.pipeline import load_current
    from agent_learning.pipeline.publish import repair_hint
    try:
        doc = load_current(store, agent_id)
    except StoredDocumentInvalid as exc:
        exc.add_note(repair_hint(agent_id))
        raise
    if doc is None:
        agents = store.list_agents()
        known = f"agents: {', '.join(agents)}" if agents else "no agent has a policy yet (agent-learn init-policy)"
        raise NotFound(f"--agent-id: {agent_id!r} has no policy in {_where(settings, how=True)}; {known}")
    return doc


def _current_or_said(store: Any, settings: Any, agent_id: str) -> Any:
    """:func:`_current`, or ``None`` when the current document is invalid, said on stderr with the
    rollback that repairs it: for commands that read the agent's other documents all the same
    (and then exit with 1)."""
    try:
        return _current(store, settings, agent_id)
    except StoredDocumentInvalid as exc:
        err.print(Text.assemble(("error:", "bold red"), f" {_with_notes(exc)}"), highlight=False, soft_wrap=True)
        return None


@contextmanager
def _queues(db: str | None, name: str | None = None, *, scoring: bool = False) -> Iterator[tuple[dict[str, Any], Any]]:
    """The deployment's queues by name, the scoring queue first, then the training queue (``name``:
    only that one; ``scoring``: only the scoring queue), and the settings; closed afterwards."""
    from agent_learning.app import wiring
    settings = _settings(db)
    kinds = {settings.queue_name: wiring.open_queue, settings.train_queue_name: wiring.open_train_queue}
    if name is not None and name not in kinds:
        raise ValueError(f"--queue: {name!r} is not a queue of this deployment: {' or '.join(kinds)} "
                         "(AGENT_LEARNING_QUEUE_NAME, AGENT_LEARNING_TRAIN_QUEUE_NAME)")
    if scoring:
        name = settings.queue_name
    if settings.queue == "sqlite":
        _existing(settings.model_copy(update={"store": "sqlite"}))  # the embedded queues live in that file
    queues: dict[str, Any] = {}
    try:
        for queue_name, open_queue in kinds.items():
            if name in (None, queue_name):
                with _embedded(settings, "queue"):
                    queues[queue_name] = open_queue(settings)
        yield queues, settings
    finally:
        for queue in queues.values():
            queue.close()


def _dead_letter_row(d: Any) -> dict[str, Any]:
    """A dead letter as ``dlq list --json`` shows it."""
    return {
        "message_id": d.message_id,
        "reason": d.reason,
        "description": d.description,
        "delivery_count": d.delivery_count,
        "dead_lettered_at": _iso(datetime.fromtimestamp(d.dead_lettered_at, UTC)) if d.dead_lettered_at else None,
        "properties": dict(d.properties),
        "body": d.body.decode("utf-8", errors="replace"),
    }


def _dead_letters(db: str | None) -> dict[str, Any] | None:
    """The queue's dead letters by message id (an episode's is ``message_id_of`` its id), or None
    when the queue cannot list them: episodes are shown all the same."""
    from agent_learning.ops.audit import DEAD_LETTER_LIMIT
    try:
        with _queues(db, scoring=True) as (queues, settings):
            return {d.message_id: d for d in queues[settings.queue_name].dead_letters(DEAD_LETTER_LIMIT)}
    except Exception:  # Service Bus unreachable, no rights to peek: the store's view stands
        return None
