"""An agent's history over a time window reads only that window's version documents."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from benchmark_modules import load_benchmark
from factories import BASE_TIME, CountingStore, make_policy_doc

from agent_learning.core.errors import InvalidDocument
from agent_learning.ops.history import history, versions_created
from agent_learning.store import SQLiteStore, Store


class DocumentsRead(CountingStore):
    """Counts the version documents the wrapped store returns."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.documents = 0

    def list_policy_versions(self, *args: Any, **kwargs: Any) -> Any:
        docs = self.inner.list_policy_versions(*args, **kwargs)
        self.documents += len(docs)
        return docs


@pytest.fixture
def store(tmp_path: Path) -> DocumentsRead:
    """Versions 1–40 of agent-a, version v created v minutes after BASE_TIME (and 7 of agent-b)."""
    inner = SQLiteStore(str(tmp_path / "h.db"))
    for v in range(1, 41):
        inner.create_policy_version(make_policy_doc(version=v, created_at=BASE_TIME + timedelta(minutes=v)))
    inner.create_policy_version(make_policy_doc("agent-b", version=7, created_at=BASE_TIME + timedelta(minutes=20)))
    inner.replace_current_policy(make_policy_doc(version=40, kind="current"), None)
    return DocumentsRead(inner)


def at(minutes: float) -> Any:
    return BASE_TIME + timedelta(minutes=minutes)


def test_a_window_reads_its_own_versions_and_no_others(store: DocumentsRead) -> None:
    h = history(store, "agent-a", since=at(10), until=at(14.5))
    assert h.versions == [10, 11, 12, 13, 14]
    assert store.documents == 5
    assert [d.created_at for d in h.documents] == [at(m) for m in range(10, 15)]


def test_the_newest_of_a_window_and_open_ended_windows(store: DocumentsRead) -> None:
    assert history(store, "agent-a", 3, since=at(10), until=at(20)).versions == [18, 19, 20]
    assert store.documents == 3
    assert history(store, "agent-a", since=at(38)).versions == [38, 39, 40]
    assert history(store, "agent-a", until=at(2)).versions == [1, 2]
    assert history(store, "agent-a", 0, since=at(1)).versions == []
    assert store.documents == 3 + 3 + 2


def test_a_version_made_under_a_clock_that_went_back_stays_out_of_a_window_it_sits_inside(tmp_path: Path) -> None:
    inner = SQLiteStore(str(tmp_path / "skew.db"))
    for v, minute in ((1, 1), (2, 2), (3, -60), (4, 4)):  # version 3's host clock was an hour behind
        inner.create_policy_version(make_policy_doc(version=v, created_at=at(minute)))
    inner.replace_current_policy(make_policy_doc(version=4, kind="current"), None)
    assert history(inner, "agent-a", since=at(2), until=at(4)).versions == [2, 4]
    assert history(inner, "agent-a", until=at(0)).versions == [3]


def test_an_empty_window_reads_no_document(store: DocumentsRead) -> None:
    assert history(store, "agent-a", since=at(100)).versions == []
    assert history(store, "agent-a", since=at(10.2), until=at(10.8)).versions == []
    assert store.documents == 0


def test_without_a_window_newest_still_reads_only_those(store: DocumentsRead) -> None:
    assert history(store, "agent-a", 4).versions == [37, 38, 39, 40]
    assert len(history(store, "agent-a").versions) == 40
    assert store.documents == 44


def test_a_version_whose_time_is_not_a_time_is_named() -> None:
    broken = SimpleNamespace(policy_version_times=lambda agent_id: [(1, BASE_TIME.isoformat()), (2, "yesterday")])
    with pytest.raises(InvalidDocument, match=r"created_at: of version 2 is not a date and time: 'yesterday'"):
        versions_created(broken, "agent-a", at(-1), None)
    naive = SimpleNamespace(policy_version_times=lambda agent_id: [(3, "2026-11-01T08:00:00")])
    with pytest.raises(InvalidDocument, match="of version 3"):
        versions_created(naive, "agent-a", None, at(0))


def test_a_window_bound_without_a_time_zone_is_named_not_a_type_error(store: DocumentsRead) -> None:
    """Before the fix a naive ``since`` raised "can't compare offset-naive and offset-aware datetimes"."""
    with pytest.raises(ValueError, match=r"^since: 2026-.* has no time zone; give one"):
        history(store, "agent-a", since=at(5).replace(tzinfo=None))
    with pytest.raises(ValueError, match=r"^until: .* has no time zone"):
        versions_created(store, "agent-a", None, at(5).replace(tzinfo=None))
    assert history(store, "agent-a", since=at(39)).versions == [39, 40]


def test_the_store_access_benchmark_reads_a_window_of_its_history() -> None:
    figures = load_benchmark("store_access").history_figures(30)  # asserts each read's length itself
    assert figures["versions"] == 30
    assert all(figures[key] > 0 for key in ("all_ms", "newest_5_ms", "window_5_ms"))


def test_a_pin_belongs_to_the_current_version_not_to_the_last_one_of_a_window(tmp_path: Path) -> None:
    """Pinning is state of the current document: a window that ends before the current version
    does not show its last version as pinned (the report would mark it "learning paused")."""
    inner = SQLiteStore(str(tmp_path / "pin.db"))
    for v in range(1, 6):
        inner.create_policy_version(make_policy_doc(version=v, created_at=at(v)))
    inner.replace_current_policy(make_policy_doc(version=5, kind="current", pinned=True), None)
    assert history(inner, "agent-a").pinned and history(inner, "agent-a", 2).pinned
    assert not history(inner, "agent-a", until=at(3)).pinned
    assert history(inner, "agent-a", since=at(4)).pinned
