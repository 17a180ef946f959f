"""The store port's contract, written once and run against every adapter.

Each test asserts a documented semantic of :mod:`agent_learning.store.base` that an adapter
could get wrong. Tests at the end of the file are specific to the SQLite adapter (re-opening
the file, several store objects on one file as several processes would have).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from adapters import store_adapter
from factories import BASE_TIME, make_episode, make_policy_doc, make_run, make_score, make_unjudged
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_learning.core.errors import AlreadyExists, ConcurrencyConflict, InvalidDocument, LimitExceeded
from agent_learning.documents import (
    CorrectionLedger,
    Episode,
    Feedback,
    Score,
    ScoreCursor,
    correction_doc_id,
    correction_ledger_id,
    feedback_sources_id,
)
from agent_learning.pipeline import create_policy, materialise
from agent_learning.rewards.feedback import MAX_FEEDBACK_SOURCES
from agent_learning.store import SQLiteStore, Store
from agent_learning.store.base import NOT_MODIFIED, AgentCursor, RawDoc, Tagged

# --------------------------------------------------------------------------- adapters

# Each contract test takes the ``store`` fixture (tests/support/adapters.py): a fresh, empty store of
# every adapter in turn (memory, sqlite, and cosmos: the real azure-cosmos SDK against the patched
# local Cosmos server, in a new database per test).

# --------------------------------------------------------------------------- helpers


def user_fields(doc: RawDoc) -> RawDoc:
    """A stored document without the fields a store may add (``_rid``, ``_etag``, ``_ts``, ...)."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def ids(docs: list[RawDoc]) -> list[str]:
    return [d["id"] for d in docs]


def read_whole_feed(store: Store, continuation: str | None = None, page: int = 100) -> tuple[list[str], str | None]:
    """Every episode id after ``continuation``, page by page, and the last continuation."""
    out: list[str] = []
    while True:
        result = store.read_episodes(continuation, page)
        assert len(result.items) <= page
        continuation = result.continuation
        if not result.items:
            return out, continuation
        out.extend(ids(result.items))


def cursor_of(row: RawDoc) -> ScoreCursor:
    return ScoreCursor(seq=row["seq"], id=row["id"])


# Write order deliberately differs from id order, so ordering by id instead of by write
# order (or by seq) is caught.
SHUFFLED_IDS = [f"ep-{(i * 7) % 23:02d}" for i in range(23)]


# =========================================================================== episodes


def test_episode_round_trips_as_its_dict(store: Store) -> None:
    episode = make_episode(
        "ep-round-trip",
        tool_definitions=[{"name": "calculator", "parameters": {"type": "object"}}],
        instructions="Be brief.",
        metadata={"user": "u-1", "turn": 3, "premium": True, "cost": 0.25},
        ttl=3600,
    )
    store.add_episode(episode)
    stored = store.get_episode("ep-round-trip")
    assert stored is not None
    assert user_fields(stored) == episode.to_dict()


def test_timestamps_keep_their_utc_offset(store: Store) -> None:
    started = BASE_TIME.astimezone(timezone(timedelta(hours=2)))
    episode = make_episode("ep-tz", started_at=started)
    store.add_episode(episode)
    store.add_episode(make_episode("ep-tz", started_at=started))  # still identical after storage
    stored = store.get_episode("ep-tz")
    assert stored is not None and user_fields(stored) == episode.to_dict()
    assert stored["started_at"].endswith("+02:00")


def test_readding_an_identical_episode_is_a_no_op(store: Store) -> None:
    episode = make_episode("ep-1")
    store.add_episode(episode)
    store.add_episode(make_episode("ep-1"))  # an equal document, built again
    feed, _ = read_whole_feed(store)
    assert feed == ["ep-1"]
    assert ids(store.list_episodes()) == ["ep-1"]


def test_a_different_episode_with_an_existing_id_conflicts(store: Store) -> None:
    original = make_episode("ep-1", output="4")
    store.add_episode(original)
    with pytest.raises(ConcurrencyConflict):
        store.add_episode(make_episode("ep-1", output="five"))
    stored = store.get_episode("ep-1")
    assert stored is not None and user_fields(stored) == original.to_dict()
    assert read_whole_feed(store)[0] == ["ep-1"]


def test_a_boolean_is_not_the_number_it_equals_in_python_but_an_integral_float_is_its_integer(store: Store) -> None:
    """``True == 1`` in Python, not in JSON: the same id with 1 for true is another episode. A
    retry sending 1.0 where 1 is stored (Cosmos DB reads 1.0 back as 1) is the same episode."""
    fields: dict[str, Any] = {"context": {"premium": True}, "metadata": {"flag": False, "cost": 1.0}}
    store.add_episode(make_episode("ep-1", **fields))
    for changed in ({"context": {"premium": 1}}, {"metadata": {"flag": 0, "cost": 1.0}}):
        with pytest.raises(ConcurrencyConflict):
            store.add_episode(make_episode("ep-1", **(fields | changed)))
    store.add_episode(make_episode("ep-1", **(fields | {"metadata": {"flag": False, "cost": 1}})))
    assert read_whole_feed(store)[0] == ["ep-1"]


def test_get_of_a_missing_episode_is_none(store: Store) -> None:
    assert store.get_episode("nope") is None
    store.add_episode(make_episode("ep-1"))
    assert store.get_episode("ep-2") is None


def test_the_feed_pages_through_every_episode_once_in_write_order(store: Store) -> None:
    for eid in SHUFFLED_IDS:
        store.add_episode(make_episode(eid))
    pages: list[list[str]] = []
    continuation: str | None = None
    while True:
        page = store.read_episodes(continuation, 5)
        assert page.continuation is not None  # something was read, so there is a position
        continuation = page.continuation
        if not page.items:
            break
        pages.append(ids(page.items))
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [eid for p in pages for eid in p] == SHUFFLED_IDS
    # Items are the stored documents, not just ids.
    first = store.read_episodes(None, 1).items[0]
    assert user_fields(first) == make_episode(SHUFFLED_IDS[0]).to_dict()


def test_the_feed_resumes_from_a_continuation(store: Store) -> None:
    for eid in SHUFFLED_IDS[:10]:
        store.add_episode(make_episode(eid))
    page = store.read_episodes(None, 4)
    assert ids(page.items) == SHUFFLED_IDS[:4]
    for eid in SHUFFLED_IDS[10:]:
        store.add_episode(make_episode(eid))
    rest, _ = read_whole_feed(store, page.continuation, page=3)
    assert rest == SHUFFLED_IDS[4:]
    # The same continuation can be used again: reading is not consuming.
    again, _ = read_whole_feed(store, page.continuation, page=50)
    assert again == SHUFFLED_IDS[4:]


def test_an_empty_page_returns_a_continuation_that_can_be_passed_again(store: Store) -> None:
    empty = store.read_episodes(None, 10)
    assert empty.items == []
    still_empty = store.read_episodes(empty.continuation, 10)
    assert still_empty.items == []

    store.add_episode(make_episode("ep-a"))
    page = store.read_episodes(still_empty.continuation, 10)
    assert ids(page.items) == ["ep-a"]

    caught_up = store.read_episodes(page.continuation, 10)
    assert caught_up.items == []
    assert store.read_episodes(caught_up.continuation, 10).items == []
    store.add_episode(make_episode("ep-b"))
    assert ids(store.read_episodes(caught_up.continuation, 10).items) == ["ep-b"]


def test_list_episodes_is_newest_first_with_agent_filter_and_limit(
    store: Store, request: pytest.FixtureRequest
) -> None:
    if store_adapter(request) == "cosmos":
        pytest.skip("Cosmos orders by _ts (1 s resolution); see test_cosmos_lists_episodes_by_write_second")
    written = []
    for i, eid in enumerate(SHUFFLED_IDS[:9]):
        agent = "agent-a" if i % 3 else "agent-b"
        store.add_episode(make_episode(eid, agent_id=agent))
        written.append((eid, agent))
    newest_first = [eid for eid, _ in reversed(written)]
    assert ids(store.list_episodes()) == newest_first
    assert ids(store.list_episodes(limit=4)) == newest_first[:4]
    of_b = [eid for eid, agent in reversed(written) if agent == "agent-b"]
    assert ids(store.list_episodes("agent-b")) == of_b
    assert ids(store.list_episodes("agent-b", limit=2)) == of_b[:2]
    of_a = [eid for eid, agent in reversed(written) if agent == "agent-a"]
    assert ids(store.list_episodes(agent_id="agent-a", limit=100)) == of_a
    assert store.list_episodes("agent-unknown") == []


def test_cosmos_lists_episodes_by_write_second(store: Store, request: pytest.FixtureRequest) -> None:
    """Cosmos stamps writes with whole seconds (``_ts``): newest first, ties in any order."""
    if store_adapter(request) != "cosmos":
        pytest.skip("Cosmos only")
    for i, eid in enumerate(SHUFFLED_IDS[:6]):
        store.add_episode(make_episode(eid, agent_id="agent-a" if i % 2 else "agent-b"))
    listed = store.list_episodes()
    assert sorted(ids(listed)) == sorted(SHUFFLED_IDS[:6])
    stamps = [d["_ts"] for d in listed]
    assert stamps == sorted(stamps, reverse=True)
    assert {d["agent_id"] for d in store.list_episodes("agent-a")} == {"agent-a"}
    assert len(store.list_episodes("agent-a", limit=2)) == 2


def test_episode_ids_streams_every_episode_of_one_agent(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_learning.store.sqlite.ID_PAGE", 2)  # several pages on SQLite
    for i, eid in enumerate(SHUFFLED_IDS[:9]):
        store.add_episode(make_episode(eid, agent_id="agent-a" if i % 3 else "agent-b"))
    of_a = [eid for i, eid in enumerate(SHUFFLED_IDS[:9]) if i % 3]
    assert sorted(store.episode_ids("agent-a")) == sorted(of_a)
    assert sorted(store.episode_ids("agent-b")) == sorted(set(SHUFFLED_IDS[:9]) - set(of_a))
    assert list(store.episode_ids("agent-unknown")) == []


def test_list_episodes_with_limit_zero_returns_nothing(store: Store) -> None:
    store.add_episode(make_episode("ep-1"))
    store.add_episode(make_episode("ep-2"))
    assert store.list_episodes(limit=0) == []
    assert store.list_episodes("agent-a", limit=0) == []


def test_a_negative_limit_is_refused_by_every_listing(store: Store) -> None:
    """It read as "all but the last" in memory, "all" in SQLite and "none" in Cosmos DB."""
    store.add_episode(make_episode("ep-1"))
    listings = [
        lambda: store.list_episodes("agent-a", limit=-1),
        lambda: store.read_scores("agent-a", None, -1),
        lambda: store.list_unjudged("agent-a", limit=-1),
        lambda: store.list_runs("agent-a", limit=-1),
    ]
    for listing in listings:
        with pytest.raises(ValueError, match=r"limit: must be a whole number of at least 0, got -1"):
            listing()


# =========================================================================== scores


def test_put_score_assigns_a_seq_that_increases_with_write_order(store: Store) -> None:
    seqs = []
    for eid in SHUFFLED_IDS[:8]:
        stored = store.put_score(make_score(eid))
        assert isinstance(stored, Score)
        assert isinstance(stored.seq, int)
        assert stored.id == eid
        seqs.append(stored.seq)
        row = store.get_score(eid, "agent-a")
        assert row is not None and row["seq"] == stored.seq
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_add_score_creates_once_and_keeps_the_first(store: Store) -> None:
    first = store.add_score(make_score("ep-1", reward=0.4))
    other = store.add_score(make_score("ep-2", reward=0.1))
    assert first.seq is not None and other.seq is not None and other.seq > first.seq
    with pytest.raises(ConcurrencyConflict):
        store.add_score(make_score("ep-1", reward=-0.9))
    row = store.get_score("ep-1", "agent-a")
    assert row is not None and row["reward"] == 0.4 and row["seq"] == first.seq
    again = store.put_score(make_score("ep-1", reward=0.9))  # an explicit re-score overwrites
    assert again.seq == first.seq and store.get_score("ep-1", "agent-a")["reward"] == 0.9  # type: ignore[index]


def test_the_store_assigns_seq_even_if_the_score_carries_one(store: Store) -> None:
    first = store.put_score(make_score("ep-1"))
    second = store.put_score(make_score("ep-2", seq=0))  # a seq from elsewhere is not trusted
    assert first.seq is not None and second.seq is not None
    assert second.seq > first.seq


def test_overwriting_a_score_keeps_its_seq_and_replaces_its_content(store: Store) -> None:
    a = store.put_score(make_score("ep-a", reward=0.1, late_write=True))  # (Cosmos DB marks late writes itself)
    b = store.put_score(make_score("ep-b", reward=0.2))
    again = store.put_score(make_score("ep-a", reward=-0.7, action_id="calculator"))
    assert again.seq == a.seq
    # The mark says where the seq landed, which a re-score keeps: the audit needs it to tell which score was lost.
    assert again.late_write == a.late_write == store.get_score("ep-a", "agent-a")["late_write"]  # type: ignore[index]
    row = store.get_score("ep-a", "agent-a")
    assert row is not None
    assert row["seq"] == a.seq
    assert row["reward"] == -0.7
    assert row["action_id"] == "calculator"
    rows = store.read_scores("agent-a", None, 10)
    assert [(r["id"], r["seq"], r["reward"]) for r in rows] == [("ep-a", a.seq, -0.7), ("ep-b", b.seq, 0.2)]
    # The next new score still gets a fresh, larger seq.
    c = store.put_score(make_score("ep-c"))
    assert c.seq is not None and b.seq is not None and c.seq > b.seq


def test_read_scores_is_ordered_by_seq_filtered_by_agent_and_limited(store: Store) -> None:
    of_a = []
    for i, eid in enumerate(SHUFFLED_IDS[:12]):
        agent = "agent-a" if i % 4 else "agent-b"
        stored = store.put_score(make_score(eid, agent_id=agent))
        if agent == "agent-a":
            of_a.append(stored.id)
    rows = store.read_scores("agent-a", None, 100)
    assert ids(rows) == of_a  # write order, which is not id order here
    assert ids(rows) != sorted(of_a)
    assert all(r["agent_id"] == "agent-a" for r in rows)
    keys = [(r["seq"], r["id"]) for r in rows]
    assert keys == sorted(keys)
    assert ids(store.read_scores("agent-a", None, 3)) == of_a[:3]
    assert store.read_scores("agent-a", None, 0) == []
    assert store.read_scores("agent-unknown", None, 10) == []
    assert len(store.read_scores("agent-b", None, 100)) == 3


def test_read_scores_after_a_cursor_is_strictly_after_it(store: Store) -> None:
    stored = [store.put_score(make_score(eid)) for eid in SHUFFLED_IDS[:6]]
    third = stored[2].cursor
    assert ids(store.read_scores("agent-a", third, 100)) == [s.id for s in stored[3:]]
    assert ids(store.read_scores("agent-a", third, 2)) == [s.id for s in stored[3:5]]
    # The cursor is the pair (seq, id): same seq with a smaller id is before the row, a larger id after it.
    before = ScoreCursor(seq=third.seq, id="0")
    after = ScoreCursor(seq=third.seq, id="zzzz")
    assert ids(store.read_scores("agent-a", before, 100)) == [s.id for s in stored[2:]]
    assert ids(store.read_scores("agent-a", after, 100)) == [s.id for s in stored[3:]]
    assert store.read_scores("agent-a", stored[-1].cursor, 100) == []


def test_a_rescored_episode_does_not_reappear_after_a_cursor_past_it(store: Store) -> None:
    for eid in ("ep-x", "ep-y", "ep-z"):
        store.put_score(make_score(eid))
    rows = store.read_scores("agent-a", None, 100)
    cursor = cursor_of(rows[-1])
    store.put_score(make_score("ep-x", reward=1.0))
    store.put_score(make_score("ep-z", reward=-1.0))
    assert store.read_scores("agent-a", cursor, 100) == []
    store.put_score(make_score("ep-new"))
    assert ids(store.read_scores("agent-a", cursor, 100)) == ["ep-new"]


def test_every_score_row_has_an_int_seq_and_a_str_id(store: Store) -> None:
    for eid in SHUFFLED_IDS[:5]:
        store.put_score(make_score(eid))
    store.put_score(make_score(SHUFFLED_IDS[0], reward=0.9))
    rows = store.read_scores("agent-a", None, 100)
    assert len(rows) == 5
    for row in rows:
        assert type(row["seq"]) is int
        assert type(row["id"]) is str
        Score.from_dict(row)  # and the document is still a valid score


def test_a_score_slot_is_addressed_by_the_agent_and_the_id_together(store: Store) -> None:
    store.put_score(make_score("ep-1"))
    store.put_correction_ledger(make_ledger("ep-1"), None)
    assert store.get_score("ep-1", "agent-a") is not None and store.get_correction_ledger("ep-1", "agent-a")
    assert store.get_score("ep-1", "agent-b") is None
    assert store.get_correction_ledger("ep-1", "agent-b") is None


def test_has_new_scores_says_whether_read_scores_would_return_one(store: Store) -> None:
    assert not store.has_new_scores("agent-a", None)
    store.mark_feedback_waiting("ep-0", "agent-a")  # a marker in a score slot is no score
    store.put_correction_ledger(make_ledger("ep-0"), None)  # nor is a ledger
    store.put_score(make_score("ep-b", agent_id="agent-b"))
    assert not store.has_new_scores("agent-a", None)
    stored = [store.put_score(make_score(eid)) for eid in SHUFFLED_IDS[:3]]
    for after in [None, *(s.cursor for s in stored)]:
        assert store.has_new_scores("agent-a", after) == bool(store.read_scores("agent-a", after, 1)), after
    assert store.has_new_scores("agent-a", stored[1].cursor) and not store.has_new_scores("agent-a", stored[2].cursor)
    assert store.has_new_scores("agent-a", ScoreCursor(seq=stored[2].seq, id="0"))  # same seq, smaller id: before it
    store.put_score(make_score(SHUFFLED_IDS[0], reward=0.9))  # a re-score keeps its place behind the cursor
    assert not store.has_new_scores("agent-a", stored[2].cursor)


def test_get_of_a_missing_score_is_none(store: Store) -> None:
    assert store.get_score("nope", "agent-a") is None
    store.put_score(make_score("ep-1"))
    assert store.get_score("ep-2", "agent-a") is None


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 7)),
            st.tuples(st.just("read"), st.integers(1, 4)),
        ),
        max_size=40,
    )
)
def test_paging_scores_while_rescoring_reads_each_score_exactly_once(store: Store, ops: list[tuple[str, int]]) -> None:
    # One store serves every example: a fresh agent id keeps the examples apart.
    agent = f"agent-{uuid.uuid4().hex[:12]}"
    cursor: ScoreCursor | None = None
    seen: list[str] = []
    written: set[str] = set()

    def read(limit: int) -> list[RawDoc]:
        nonlocal cursor
        rows = store.read_scores(agent, cursor, limit)
        assert len(rows) <= limit
        for row in rows:
            assert cursor is None or (row["seq"], row["id"]) > (cursor.seq, cursor.id)
            cursor = cursor_of(row)
            seen.append(row["id"])
        return rows

    for op, arg in ops:
        if op == "put":
            eid = f"{agent}-ep{arg}"
            store.put_score(make_score(eid, agent_id=agent, reward=len(seen) / 100))
            written.add(eid)
        else:
            read(arg)
    while read(3):
        pass
    assert len(seen) == len(set(seen)), f"a score was read twice: {seen}"
    assert set(seen) == written


def test_concurrent_put_score_assigns_unique_seqs(store: Store) -> None:
    threads, per_thread = 4, 200
    barrier = threading.Barrier(threads)

    def writer(t: int) -> list[int]:
        barrier.wait(timeout=30)
        return [store.put_score(make_score(f"t{t}-ep{i}")).seq for i in range(per_thread)]  # type: ignore[misc]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(writer, range(threads)))
    seqs = [s for r in results for s in r]
    assert len(seqs) == threads * per_thread
    assert len(set(seqs)) == threads * per_thread
    for r in results:  # each writer saw its own writes in increasing order
        assert r == sorted(r)
    rows = store.read_scores("agent-a", None, 10_000)
    assert len(rows) == threads * per_thread
    assert sorted(r["seq"] for r in rows) == sorted(seqs)


# =========================================================================== policies


def test_replace_current_policy_with_no_etag_creates_it(store: Store) -> None:
    assert store.get_current_policy("agent-a") is None
    doc = make_policy_doc(kind="current")
    etag = store.replace_current_policy(doc, None)
    assert isinstance(etag, str) and etag
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None
    assert tagged.etag == etag
    assert user_fields(tagged.doc) == doc.to_dict()
    assert store.get_current_policy("agent-b") is None


def test_a_conditional_read_with_an_empty_or_unknown_etag_is_a_full_read(store: Store) -> None:
    assert store.get_current_policy_if_changed("agent-a", "") is None
    etag = store.replace_current_policy(make_policy_doc(kind="current"), None)
    for cached in ("", "not-an-etag", None):  # "" raised ValueError in azure-cosmos
        tagged = store.get_current_policy_if_changed("agent-a", cached)
        assert isinstance(tagged, Tagged) and tagged.etag == etag
    assert store.get_current_policy_if_changed("agent-a", etag) is NOT_MODIFIED


def test_a_second_create_with_no_etag_conflicts(store: Store) -> None:
    first = make_policy_doc(kind="current")
    etag = store.replace_current_policy(first, None)
    with pytest.raises(ConcurrencyConflict):
        store.replace_current_policy(make_policy_doc(kind="current", note="second"), None)
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None and tagged.etag == etag and user_fields(tagged.doc) == first.to_dict()


def test_replace_with_the_current_etag_succeeds_with_a_new_etag(store: Store) -> None:
    etag1 = store.replace_current_policy(make_policy_doc(kind="current"), None)
    v2 = make_policy_doc(kind="current", version=2, logits=[0.5, 0.0, -0.5], cursor=ScoreCursor(seq=3, id="ep-3"))
    etag2 = store.replace_current_policy(v2, etag1)
    assert etag2 != etag1
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None and tagged.etag == etag2 and user_fields(tagged.doc) == v2.to_dict()
    v3 = make_policy_doc(kind="current", version=3, logits=[1.0, 0.0, -1.0])
    etag3 = store.replace_current_policy(v3, etag2)
    assert etag3 not in (etag1, etag2)


def test_replace_with_a_stale_etag_conflicts_and_changes_nothing(store: Store) -> None:
    etag1 = store.replace_current_policy(make_policy_doc(kind="current"), None)
    v2 = make_policy_doc(kind="current", version=2, logits=[0.5, 0.0, -0.5])
    etag2 = store.replace_current_policy(v2, etag1)
    for stale in (etag1, "not-an-etag"):
        with pytest.raises(ConcurrencyConflict):
            store.replace_current_policy(make_policy_doc(kind="current", version=3, note="stale"), stale)
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None and tagged.etag == etag2 and user_fields(tagged.doc) == v2.to_dict()


def test_replace_with_an_etag_when_there_is_no_current_policy_conflicts(store: Store) -> None:
    with pytest.raises(ConcurrencyConflict):
        store.replace_current_policy(make_policy_doc(kind="current"), "some-etag")
    assert store.get_current_policy("agent-a") is None
    assert store.list_agents() == []


def test_racing_replacements_from_one_etag_have_exactly_one_winner(store: Store) -> None:
    rounds = 40
    etag = store.replace_current_policy(make_policy_doc(kind="current"), None)
    barrier = threading.Barrier(2)

    def attempt(doc: Any, expected: str) -> str | None:
        barrier.wait(timeout=30)
        try:
            return store.replace_current_policy(doc, expected)
        except ConcurrencyConflict:
            return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        for r in range(rounds):
            docs = [
                make_policy_doc(kind="current", version=r + 2, logits=[float(w), 0.0, 0.0], note=f"round {r}, {w}")
                for w in range(2)
            ]
            results = [f.result(timeout=60) for f in [pool.submit(attempt, d, etag) for d in docs]]
            winners = [w for w, res in enumerate(results) if res is not None]
            assert len(winners) == 1, f"round {r}: {len(winners)} writers won"
            tagged = store.get_current_policy("agent-a")
            assert tagged is not None
            assert tagged.etag == results[winners[0]]
            assert user_fields(tagged.doc) == docs[winners[0]].to_dict()
            etag = tagged.etag


def test_racing_creates_have_exactly_one_winner(store: Store) -> None:
    barrier = threading.Barrier(2)

    def attempt(doc: Any) -> str | None:
        barrier.wait(timeout=30)
        try:
            return store.replace_current_policy(doc, None)
        except ConcurrencyConflict:
            return None

    with ThreadPoolExecutor(max_workers=2) as pool:
        for r in range(20):
            agent = f"agent-{r}"
            docs = [make_policy_doc(agent, kind="current", note=f"writer {w}") for w in range(2)]
            results = [f.result(timeout=60) for f in [pool.submit(attempt, d) for d in docs]]
            winners = [w for w, res in enumerate(results) if res is not None]
            assert len(winners) == 1, f"round {r}: {len(winners)} creators won"
            tagged = store.get_current_policy(agent)
            assert tagged is not None and user_fields(tagged.doc) == docs[winners[0]].to_dict()


def test_create_policy_version_is_create_only(store: Store) -> None:
    v1 = make_policy_doc(version=1)
    store.create_policy_version(v1)
    store.create_policy_version(make_policy_doc(version=1))  # identical: a no-op
    assert ids(store.list_policy_versions("agent-a")) == ["agent-a:v1"]
    with pytest.raises(ConcurrencyConflict):
        store.create_policy_version(make_policy_doc(version=1, logits=[1.0, 0.0, 0.0]))
    stored = store.get_policy_version("agent-a", 1)
    assert stored is not None and user_fields(stored) == v1.to_dict()


def test_get_policy_version(store: Store) -> None:
    assert store.get_policy_version("agent-a", 1) is None
    v1 = make_policy_doc(version=1)
    v2 = make_policy_doc(version=2, logits=[0.1, 0.2, 0.3])
    store.create_policy_version(v1)
    store.create_policy_version(v2)
    got1, got2 = store.get_policy_version("agent-a", 1), store.get_policy_version("agent-a", 2)
    assert got1 is not None and user_fields(got1) == v1.to_dict()
    assert got2 is not None and user_fields(got2) == v2.to_dict()
    assert store.get_policy_version("agent-a", 3) is None
    assert store.get_policy_version("agent-b", 1) is None
    # A version is not the current document, and the current document is not a version.
    assert store.get_current_policy("agent-a") is None
    store.replace_current_policy(make_policy_doc("agent-c", version=5, kind="current"), None)
    assert store.get_policy_version("agent-c", 5) is None


def test_list_policy_versions_is_oldest_first_and_only_versions(store: Store) -> None:
    for version in (3, 1, 10, 2):  # out of order, and 10 sorts before 2 as text
        store.create_policy_version(make_policy_doc(version=version))
    store.create_policy_version(make_policy_doc("agent-b", version=4))
    store.replace_current_policy(make_policy_doc(version=10, kind="current"), None)
    docs = store.list_policy_versions("agent-a")
    assert [d["version"] for d in docs] == [1, 2, 3, 10]
    assert all(d["kind"] == "version" and d["agent_id"] == "agent-a" for d in docs)
    assert [d["version"] for d in store.list_policy_versions("agent-b")] == [4]
    assert store.list_policy_versions("agent-none") == []
    # The newest N, still oldest first, without reading the rest.
    assert [d["version"] for d in store.list_policy_versions("agent-a", newest=2)] == [3, 10]
    assert [d["version"] for d in store.list_policy_versions("agent-a", newest=9)] == [1, 2, 3, 10]
    assert store.list_policy_versions("agent-a", newest=0) == []
    assert [d["version"] for d in store.list_policy_versions("agent-b", newest=1)] == [4]
    # A stretch of versions, by number, with or without the newest N of it.
    assert [d["version"] for d in store.list_policy_versions("agent-a", between=(2, 3))] == [2, 3]
    assert [d["version"] for d in store.list_policy_versions("agent-a", between=(2, 99))] == [2, 3, 10]
    assert [d["version"] for d in store.list_policy_versions("agent-a", 1, between=(1, 3))] == [3]
    assert store.list_policy_versions("agent-a", between=(4, 9)) == []
    assert store.list_policy_versions("agent-b", between=(1, 3)) == []


def test_policy_version_times_are_every_versions_number_and_time_oldest_first(store: Store) -> None:
    for version in (3, 1, 10, 2):
        store.create_policy_version(
            make_policy_doc(version=version, created_at=BASE_TIME + timedelta(minutes=version, microseconds=version))
        )
    store.create_policy_version(make_policy_doc("agent-b", version=4))
    store.replace_current_policy(make_policy_doc(version=10, kind="current"), None)
    times = store.policy_version_times("agent-a")
    assert [v for v, _ in times] == [1, 2, 3, 10]
    assert [datetime.fromisoformat(t) for _, t in times] == [
        BASE_TIME + timedelta(minutes=v, microseconds=v) for v in (1, 2, 3, 10)
    ]
    assert [v for v, _ in store.policy_version_times("agent-b")] == [4]
    assert store.policy_version_times("agent-none") == []


def test_list_agents_is_sorted_and_only_agents_with_a_current_policy(store: Store) -> None:
    assert store.list_agents() == []
    for agent in ("zeta", "alpha", "Mid", "beta-2"):
        store.replace_current_policy(make_policy_doc(agent, kind="current"), None)
    store.create_policy_version(make_policy_doc("versions-only", version=1))
    store.add_episode(make_episode("ep-1", agent_id="episodes-only"))
    store.put_score(make_score("ep-1", agent_id="episodes-only"))
    assert store.list_agents() == sorted(["zeta", "alpha", "Mid", "beta-2"])
    # Replacing a current policy does not list its agent twice.
    tagged = store.get_current_policy("alpha")
    assert tagged is not None
    store.replace_current_policy(make_policy_doc("alpha", version=2, kind="current"), tagged.etag)
    assert store.list_agents() == sorted(["zeta", "alpha", "Mid", "beta-2"])


def test_training_cursors_give_every_agents_version_cursor_and_pin(store: Store) -> None:
    assert store.training_cursors() == []
    cursor = ScoreCursor(seq=41, id="ep-7")
    store.replace_current_policy(make_policy_doc("agent-b", version=3, kind="current", cursor=cursor), None)
    store.replace_current_policy(make_policy_doc("agent-a", kind="current", pinned=True, pin_reason="audit"), None)
    store.create_policy_version(make_policy_doc("agent-c", version=1))  # a version without a current document
    assert store.training_cursors() == [
        AgentCursor("agent-a", 1, None, True, "audit"),
        AgentCursor("agent-b", 3, cursor, False),
    ]


def test_a_document_of_the_wrong_kind_is_a_value_error(store: Store) -> None:
    with pytest.raises(ValueError, match="kind='current'"):
        store.replace_current_policy(make_policy_doc(kind="version"), None)
    with pytest.raises(ValueError, match="kind='version'"):
        store.create_policy_version(make_policy_doc(kind="current"))
    assert store.get_current_policy("agent-a") is None
    assert store.list_policy_versions("agent-a") == []
    assert store.list_agents() == []


def test_create_policy_and_materialise_write_current_and_version_once(store: Store) -> None:
    doc = make_policy_doc(version=1, kind="version")
    current = create_policy(store, doc)
    assert current.kind == "current"
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None and user_fields(tagged.doc) == current.to_dict()
    assert [user_fields(d) for d in store.list_policy_versions("agent-a")] == [doc.to_dict()]
    with pytest.raises(AlreadyExists, match="never overwritten") as refused:
        create_policy(store, make_policy_doc(version=1, logits=[1.0, 0.0, 0.0]))
    assert "'agent-a'" in str(refused.value) and "agent-learn policy revise --agent-id agent-a" in str(refused.value)
    materialise(store, current)  # idempotent: re-creating the same version is a no-op
    assert len(store.list_policy_versions("agent-a")) == 1
    again = store.get_current_policy("agent-a")
    assert again is not None and again.etag == tagged.etag


def test_create_policy_again_with_the_same_policy_is_a_no_op_returning_the_current(store: Store) -> None:
    """Re-running a script that creates an agent's policy: the same document made at another time
    changes nothing, also once the agent has learned (the current document is returned)."""
    create_policy(store, make_policy_doc(version=1))
    before = store.get_current_policy("agent-a")
    again = create_policy(store, make_policy_doc(version=1, created_at=BASE_TIME + timedelta(days=1)))
    assert again.version == 1 and again.created_at == BASE_TIME
    after = store.get_current_policy("agent-a")
    assert before is not None and after is not None and after.etag == before.etag
    assert len(store.list_policy_versions("agent-a")) == 1
    tagged = store.get_current_policy("agent-a")
    assert tagged is not None
    store.replace_current_policy(make_policy_doc(version=2, kind="current", logits=[2.0, 0.0, 0.0]), tagged.etag)
    assert create_policy(store, make_policy_doc(version=1)).version == 2
    with pytest.raises(AlreadyExists, match="'agent-a' already has a policy"):  # other actions: not the same
        create_policy(store, make_policy_doc(version=1, actions=["x", "y"]))


def test_materialise_writes_the_run_of_a_trained_version(store: Store) -> None:
    run = make_run(policy_version=2)
    current = make_policy_doc(version=2, kind="current", run=run, cursor=run.cursor_to)
    materialise(store, current)
    materialise(store, current)
    version = store.get_policy_version("agent-a", 2)
    assert version is not None and user_fields(version) == current.as_kind("version").to_dict()
    stored_run = store.get_run(run.id)
    assert stored_run is not None and user_fields(stored_run) == run.to_dict()
    assert ids(store.list_runs("agent-a")) == [run.id]


# =========================================================================== runs


def test_put_and_get_run(store: Store) -> None:
    assert store.get_run("agent-a:run:v2") is None
    run = make_run(policy_version=2, cursor_from=ScoreCursor(seq=1, id="ep-1"))
    store.put_run(run)
    stored = store.get_run(run.id)
    assert stored is not None and user_fields(stored) == run.to_dict()
    assert store.get_run("agent-a:run:v3") is None


def test_list_runs_is_newest_version_first_per_agent_with_limit(store: Store) -> None:
    for version in (3, 2, 11, 5):  # 11 sorts before 3 as text
        store.put_run(make_run(policy_version=version))
    store.put_run(make_run("agent-b", policy_version=7))
    assert [r["policy_version"] for r in store.list_runs("agent-a")] == [11, 5, 3, 2]
    assert [r["policy_version"] for r in store.list_runs("agent-a", limit=2)] == [11, 5]
    assert ids(store.list_runs("agent-b")) == ["agent-b:run:v7"]
    assert store.list_runs("agent-none") == []


def test_put_run_is_an_idempotent_overwrite(store: Store) -> None:
    run = make_run(policy_version=2)
    store.put_run(run)
    store.put_run(run)
    assert ids(store.list_runs("agent-a")) == [run.id]
    changed = make_run(policy_version=2, episodes=99, metrics={"loss": 0.01})
    store.put_run(changed)
    stored = store.get_run(run.id)
    assert stored is not None and user_fields(stored) == changed.to_dict()
    assert [r["episodes"] for r in store.list_runs("agent-a")] == [99]


# =========================================================================== checkpoints


def test_checkpoints(store: Store) -> None:
    assert store.get_checkpoint("feed") is None
    store.set_checkpoint("feed", "17")
    assert store.get_checkpoint("feed") == "17"
    store.set_checkpoint("feed", "42")
    assert store.get_checkpoint("feed") == "42"
    store.set_checkpoint("other", "")
    assert store.get_checkpoint("other") == ""
    assert store.get_checkpoint("feed") == "42"
    assert store.get_checkpoint("missing") is None


def test_checkpoints_are_listed_by_prefix_and_deleted(store: Store) -> None:
    store.set_checkpoint("pending:a:1", "x")
    store.set_checkpoint("pending:a:2", "y")
    store.set_checkpoint("pending:b:1", "z")
    store.set_checkpoint("pendingness", "w")
    store.set_checkpoint("Pending:a:3", "v")  # names are case-sensitive
    assert store.list_checkpoints("pending:a:") == {"pending:a:1": "x", "pending:a:2": "y"}
    assert set(store.list_checkpoints("pending:")) == {"pending:a:1", "pending:a:2", "pending:b:1"}
    assert store.list_checkpoints("none:") == {}
    store.delete_checkpoint("pending:a:1")
    store.delete_checkpoint("pending:a:1")  # gone already: nothing to do
    assert store.get_checkpoint("pending:a:1") is None
    assert store.list_checkpoints("pending:a:") == {"pending:a:2": "y"}


# =========================================================================== feedback


def make_feedback(episode_id: str = "ep-1", source: str = "user", **overrides: Any) -> Feedback:
    fields: dict[str, Any] = {"episode_id": episode_id, "agent_id": "agent-a", "source": source, "thumb": "up",
                              "received_at": BASE_TIME}
    fields.update(overrides)
    return Feedback.from_dict(fields)


def test_feedback_is_one_document_per_episode_and_source(store: Store) -> None:
    store.put_feedback(make_feedback("ep-1", "user"))
    store.put_feedback(make_feedback("ep-1", "reviewer", thumb=None, score=0.25))
    store.put_feedback(make_feedback("ep-2", "user"))
    store.put_feedback(make_feedback("ep-1", "user", thumb="down", comment="changed my mind"))  # overwrites
    rows = store.list_feedback("ep-1")
    assert [(r["source"], r["value"]) for r in rows] == [("reviewer", 0.25), ("user", 0.0)]
    assert user_fields(rows[1]) == make_feedback("ep-1", "user", thumb="down", comment="changed my mind").to_dict()
    assert store.list_feedback("ep-3") == []


def test_a_feedback_marker_is_invisible_and_the_first_score_replaces_it(store: Store) -> None:
    assert store.mark_feedback_waiting("ep-1", "agent-a") is True
    assert store.mark_feedback_waiting("ep-1", "agent-a") is True  # still waiting: idempotent
    assert store.get_score("ep-1", "agent-a") is None
    assert store.read_scores("agent-a", None, 10) == []
    stored = store.add_score(make_score("ep-1"))
    assert stored.feedback_pending is True and stored.seq is not None
    row = store.get_score("ep-1", "agent-a")
    assert row is not None and row["feedback_pending"] is True and row["reward"] == 0.5
    assert ids(store.read_scores("agent-a", None, 10)) == ["ep-1"]
    assert store.mark_feedback_waiting("ep-1", "agent-a") is False  # scored now
    with pytest.raises(ConcurrencyConflict):
        store.add_score(make_score("ep-1"))


def test_a_score_without_a_marker_is_not_pending_and_put_score_replaces_a_marker(store: Store) -> None:
    assert store.add_score(make_score("ep-1")).feedback_pending is False
    assert store.mark_feedback_waiting("ep-2", "agent-a") is True
    stored = store.put_score(make_score("ep-2"))
    assert stored.feedback_pending is True
    assert ids(store.read_scores("agent-a", None, 10)) == ["ep-1", "ep-2"]


def test_an_unjudged_record_is_no_score_and_the_first_score_replaces_it_with_a_new_seq(store: Store) -> None:
    first = store.add_score(make_score("ep-0"))
    record = make_unjudged("ep-1")
    assert store.mark_unjudged(record) == "recorded"
    assert store.mark_unjudged(make_unjudged("ep-1", reason="over_rate", rule="*=3/min")) == "kept"  # the first stays
    assert store.get_score("ep-1", "agent-a") is None
    assert ids(store.read_scores("agent-a", None, 10)) == ["ep-0"]
    stored = store.get_unjudged("ep-1", "agent-a")
    assert stored is not None and user_fields(stored) == record.to_dict()
    assert store.get_unjudged("ep-1", "agent-b") is None and store.get_unjudged("ep-2", "agent-a") is None
    assert ids(store.list_unjudged("agent-a")) == ["ep-1"]

    scored = store.add_score(make_score("ep-1", reward=0.75))
    assert scored.seq is not None and first.seq is not None and scored.seq > first.seq  # learned after ep-0
    assert scored.feedback_pending is False
    assert store.get_unjudged("ep-1", "agent-a") is None and store.list_unjudged("agent-a") == []
    assert [(r["id"], r["reward"]) for r in store.read_scores("agent-a", None, 10)] == [("ep-0", 0.5), ("ep-1", 0.75)]
    assert store.mark_unjudged(make_unjudged("ep-1")) == "scored"  # nothing changes
    assert store.list_unjudged("agent-a") == [] and store.get_score("ep-1", "agent-a") is not None
    with pytest.raises(ConcurrencyConflict):
        store.add_score(make_score("ep-1"))

    assert store.mark_unjudged(make_unjudged("ep-2")) == "recorded"
    rescored = store.put_score(make_score("ep-2"))  # put_score replaces a record as add_score does
    assert rescored.seq is not None and rescored.seq > scored.seq
    assert ids(store.read_scores("agent-a", None, 10)) == ["ep-0", "ep-1", "ep-2"]


def test_feedback_on_an_unjudged_episode_waits_for_its_score_in_either_order(store: Store) -> None:
    assert store.mark_unjudged(make_unjudged("ep-1")) == "recorded"
    assert store.mark_feedback_waiting("ep-1", "agent-a") is True  # not scored: its scorer applies it
    assert store.mark_feedback_waiting("ep-1", "agent-a") is True
    record = store.get_unjudged("ep-1", "agent-a")
    assert record is not None and record["feedback_pending"] is True and record["reason"] == "sampled_out"
    assert store.add_score(make_score("ep-1")).feedback_pending is True

    assert store.mark_feedback_waiting("ep-2", "agent-a") is True  # the marker first, then the record
    assert store.mark_unjudged(make_unjudged("ep-2", reason="over_rate")) == "recorded"  # over the marker
    record = store.get_unjudged("ep-2", "agent-a")
    assert record is not None and record["feedback_pending"] is True and record["reason"] == "over_rate"
    assert store.get_score("ep-2", "agent-a") is None and ids(store.list_unjudged("agent-a")) == ["ep-2"]
    assert store.put_score(make_score("ep-2")).feedback_pending is True

    assert store.mark_unjudged(make_unjudged("ep-3")) == "recorded"  # no feedback: not pending
    assert store.add_score(make_score("ep-3")).feedback_pending is False


def test_unjudged_records_are_listed_per_agent_in_id_order_page_by_page(store: Store) -> None:
    for eid in SHUFFLED_IDS:
        assert store.mark_unjudged(make_unjudged(eid)) == "recorded"
    store.mark_unjudged(make_unjudged("ep-05b", agent_id="agent-b"))
    store.add_score(make_score("ep-07"))
    assert store.mark_unjudged(make_unjudged("ep-07")) == "scored"  # not recorded
    pages: list[list[str]] = []
    after = None
    while page := store.list_unjudged("agent-a", after, 5):
        pages.append(ids(page))
        after = page[-1]["id"]
    expected = sorted(set(SHUFFLED_IDS) - {"ep-07"})
    assert [i for p in pages for i in p] == expected and [len(p) for p in pages] == [5, 5, 5, 5, 2]
    assert all(r["agent_id"] == "agent-a" and r["feedback_pending"] is False for r in store.list_unjudged("agent-a"))
    assert ids(store.list_unjudged("agent-b")) == ["ep-05b"] and store.list_unjudged("agent-c") == []
    assert ids(store.list_unjudged("agent-a", "ep-20", 10)) == ["ep-21", "ep-22"]


def test_the_feedback_feed_pages_through_every_write_once_and_an_overwrite_comes_again(store: Store) -> None:
    empty = store.read_feedback_changes(None, 10)
    assert empty.items == [] and store.read_feedback_changes(empty.continuation, 10).items == []
    written = [("ep-2", "user"), ("ep-1", "user"), ("ep-1", "reviewer"), ("ep-3", "user"), ("ep-2", "bot")]
    for episode_id, source in written:
        store.put_feedback(make_feedback(episode_id, source))
    pages: list[list[str]] = []
    continuation = empty.continuation
    while (page := store.read_feedback_changes(continuation, 2)).items:
        assert page.continuation is not None
        pages.append(ids(page.items))
        continuation = page.continuation
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [i for p in pages for i in p] == [make_feedback(e, s).id for e, s in written]
    first = store.read_feedback_changes(None, 1).items[0]
    assert user_fields(first) == make_feedback("ep-2", "user").to_dict()

    changed = make_feedback("ep-1", "user", thumb="down")
    store.put_feedback(changed)  # an overwrite comes again, after the continuation, as it is now
    (again,) = store.read_feedback_changes(continuation, 10).items
    assert user_fields(again) == changed.to_dict()
    everything = ids(store.read_feedback_changes(None, 100).items)
    assert sorted(everything) == sorted(make_feedback(e, s).id for e, s in written)  # each document once


def test_racing_new_sources_are_capped_exactly_and_a_listed_source_may_still_change(store: Store) -> None:
    cap, posters = MAX_FEEDBACK_SOURCES, 24
    store.put_feedback(make_feedback("ep-1", "first"), cap)
    barrier = threading.Barrier(posters)

    def post(i: int) -> bool:
        barrier.wait()
        try:
            store.put_feedback(make_feedback("ep-1", f"source-{i:02d}"), cap)
            return True
        except LimitExceeded:
            return False

    with ThreadPoolExecutor(max_workers=posters) as pool:
        accepted = sum(pool.map(post, range(posters)))
    assert accepted == cap - 1
    assert len(store.list_feedback("ep-1")) == cap
    store.put_feedback(make_feedback("ep-1", "first", thumb="down"), cap)  # a listed source changes its verdict
    assert [r["value"] for r in store.list_feedback("ep-1") if r["source"] == "first"] == [0.0]
    with pytest.raises(LimitExceeded, match=f"^source: episode 'ep-1' already has feedback from {cap} sources$"):
        store.put_feedback(make_feedback("ep-1", "late"), cap)
    store.put_feedback(make_feedback("ep-2", "late"), cap)  # each episode has its own cap
    assert store.get_score(feedback_sources_id("ep-1"), "agent-a") is None  # whatever keeps the count is no score
    assert store.read_scores("agent-a", None, 10) == []


def test_feedback_stored_without_a_cap_counts_toward_it(store: Store) -> None:
    for i in range(3):  # as an earlier release stored it
        store.put_feedback(make_feedback("ep-1", f"source-{i}"))
    with pytest.raises(LimitExceeded):
        store.put_feedback(make_feedback("ep-1", "new"), 3)
    store.put_feedback(make_feedback("ep-1", "source-0", thumb="down"), 3)
    store.put_feedback(make_feedback("ep-1", "new"), 4)
    assert [r["source"] for r in store.list_feedback("ep-1")] == ["new", "source-0", "source-1", "source-2"]


def make_ledger(episode_id: str = "ep-1", revision: int = 1, delta_sum: float = -0.25) -> CorrectionLedger:
    return CorrectionLedger(id=correction_ledger_id(episode_id), episode_id=episode_id, agent_id="agent-a",
                            revision=revision, delta_sum=delta_sum, updated_at=BASE_TIME)


def test_a_correction_ledger_is_created_once_and_replaced_by_etag(store: Store) -> None:
    assert store.get_correction_ledger("ep-1", "agent-a") is None
    etag = store.put_correction_ledger(make_ledger(revision=1), None)
    tagged = store.get_correction_ledger("ep-1", "agent-a")
    assert tagged is not None and tagged.etag == etag and user_fields(tagged.doc) == make_ledger(revision=1).to_dict()
    with pytest.raises(ConcurrencyConflict):
        store.put_correction_ledger(make_ledger(revision=2), None)  # create only
    with pytest.raises(ConcurrencyConflict):
        store.put_correction_ledger(make_ledger(revision=2), "stale")
    newer = store.put_correction_ledger(make_ledger(revision=2, delta_sum=0.5), etag)
    assert newer != etag
    with pytest.raises(ConcurrencyConflict):
        store.put_correction_ledger(make_ledger(revision=3), etag)  # the ETag read before the last write
    tagged = store.get_correction_ledger("ep-1", "agent-a")
    assert tagged is not None and (tagged.doc["revision"], tagged.doc["delta_sum"]) == (2, 0.5)
    assert store.get_correction_ledger("ep-2", "agent-a") is None
    with pytest.raises(ConcurrencyConflict):
        store.put_correction_ledger(make_ledger("ep-2"), "an etag of nothing")


def test_a_correction_ledger_is_no_score_and_no_feedback(store: Store) -> None:
    feed = store.read_feedback_changes(None, 10)
    store.put_correction_ledger(make_ledger("ep-1"), None)
    assert store.get_score("ep-1", "agent-a") is None
    assert store.get_score(correction_ledger_id("ep-1"), "agent-a") is None
    assert store.read_scores("agent-a", None, 10) == []
    assert store.list_feedback("ep-1") == [] and store.read_feedback_changes(feed.continuation, 10).items == []
    assert store.mark_feedback_waiting("ep-1", "agent-a") is True  # the episode is still unscored
    stored = store.add_score(make_score("ep-1"))
    assert stored.feedback_pending is True
    assert ids(store.read_scores("agent-a", None, 10)) == ["ep-1"]
    assert store.get_correction_ledger("ep-1", "agent-a") is not None


def test_correction_ids_are_scores_of_their_own_next_to_an_episode_with_the_old_form(store: Store) -> None:
    first = store.add_score(make_score("sess-42"))
    correction = make_score("sess-42", id=correction_doc_id("sess-42", 1), revision=1, reward_delta=0.25)
    assert correction.id == "sess-42~r1"
    store.add_score(correction)
    store.add_score(make_score("sess-42:r1"))  # an episode whose id is what correction 1 once was
    rows = store.read_scores("agent-a", None, 10)
    assert ids(rows) == ["sess-42", "sess-42~r1", "sess-42:r1"]
    last = cursor_of(rows[1])
    assert ids(store.read_scores("agent-a", last, 10)) == ["sess-42:r1"]
    assert store.get_score("sess-42", "agent-a")["seq"] == first.seq  # type: ignore[index]


# =========================================================================== SQLite only


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sqlite" / "store.db"  # the folder does not exist yet: the store creates it


def fill(store: Store) -> dict[str, Any]:
    """Write one document of every kind; return what was written."""
    episode = make_episode("ep-1")
    store.add_episode(episode)
    score = store.put_score(make_score("ep-1"))
    version = make_policy_doc(version=1)
    store.create_policy_version(version)
    current = make_policy_doc(kind="current")
    etag = store.replace_current_policy(current, None)
    run = make_run(policy_version=2)
    store.put_run(run)
    store.set_checkpoint("feed", "1")
    return {"episode": episode, "score": score, "version": version, "current": current, "etag": etag, "run": run}


def test_sqlite_a_file_another_process_keeps_locked_is_a_transient_error_naming_it(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Cosmos DB's throttling is: the caller (the scorer, the trainer, an agent's capture)
    tells "try again later" from a bug by the port's error, not by sqlite3's."""
    import sqlite3

    from agent_learning.core.errors import TransientError

    monkeypatch.setattr("agent_learning.core.sqlite.BUSY_TIMEOUT_MS", 50)
    with SQLiteStore(db_path) as store:
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")  # another process writing (a long transaction, a backup)
        for write in (lambda: store.add_episode(make_episode("ep-1")), lambda: store.put_score(make_score("ep-1"))):
            with pytest.raises(TransientError, match=r"store\.db.*locked") as caught:
                write()
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        other.execute("ROLLBACK")
        other.close()
        store.add_episode(make_episode("ep-1"))  # and it passes once the other writer is done
        assert store.get_episode("ep-1") is not None


def test_sqlite_data_survives_close_and_reopen(db_path: Path) -> None:
    with SQLiteStore(db_path) as first:
        written = fill(first)
    with SQLiteStore(db_path) as reopened:
        ep = reopened.get_episode("ep-1")
        assert ep is not None and user_fields(ep) == written["episode"].to_dict()
        sc = reopened.get_score("ep-1", "agent-a")
        assert sc is not None and user_fields(sc) == written["score"].to_dict()
        ver = reopened.get_policy_version("agent-a", 1)
        assert ver is not None and user_fields(ver) == written["version"].to_dict()
        tagged = reopened.get_current_policy("agent-a")
        assert tagged is not None and tagged.etag == written["etag"]
        assert user_fields(tagged.doc) == written["current"].to_dict()
        run = reopened.get_run(written["run"].id)
        assert run is not None and user_fields(run) == written["run"].to_dict()
        assert reopened.get_checkpoint("feed") == "1"
        assert reopened.list_agents() == ["agent-a"]
        # Counters continue where they were: the next score gets a larger seq.
        assert reopened.put_score(make_score("ep-2")).seq > written["score"].seq  # type: ignore[operator]
        # The ETag survived too: a compare-and-swap with it works.
        reopened.replace_current_policy(make_policy_doc(kind="current", version=2), written["etag"])


def test_sqlite_feed_resumes_after_reopening_the_file(db_path: Path) -> None:
    with SQLiteStore(db_path) as first:
        for eid in SHUFFLED_IDS[:10]:
            first.add_episode(make_episode(eid))
        page = first.read_episodes(None, 6)
        assert ids(page.items) == SHUFFLED_IDS[:6]
        first.set_checkpoint("feed", page.continuation or "")
    with SQLiteStore(db_path) as second:
        for eid in SHUFFLED_IDS[10:]:
            second.add_episode(make_episode(eid))
        continuation = second.get_checkpoint("feed")
        assert continuation == page.continuation
        rest, _ = read_whole_feed(second, continuation, page=4)
        assert rest == SHUFFLED_IDS[6:]


def test_two_sqlite_stores_on_one_file_see_each_others_writes(db_path: Path) -> None:
    with SQLiteStore(db_path) as one, SQLiteStore(db_path) as two:
        one.add_episode(make_episode("ep-1"))
        assert two.get_episode("ep-1") is not None
        two.add_episode(make_episode("ep-2"))
        assert read_whole_feed(one)[0] == ["ep-1", "ep-2"]
        with pytest.raises(ConcurrencyConflict):  # immutability holds across store objects
            two.add_episode(make_episode("ep-1", output="other"))

        s1 = one.put_score(make_score("ep-1"))
        s2 = two.put_score(make_score("ep-2"))
        assert s1.seq is not None and s2.seq is not None and s2.seq > s1.seq
        assert two.put_score(make_score("ep-1", reward=0.9)).seq == s1.seq
        assert [(r["id"], r["reward"]) for r in one.read_scores("agent-a", None, 10)] == [("ep-1", 0.9), ("ep-2", 0.5)]

        etag = one.replace_current_policy(make_policy_doc(kind="current"), None)
        with pytest.raises(ConcurrencyConflict):
            two.replace_current_policy(make_policy_doc(kind="current"), None)
        etag2 = two.replace_current_policy(make_policy_doc(kind="current", version=2), etag)
        with pytest.raises(ConcurrencyConflict):
            one.replace_current_policy(make_policy_doc(kind="current", version=2, note="stale"), etag)
        tagged = one.get_current_policy("agent-a")
        assert tagged is not None and tagged.etag == etag2 and tagged.doc["version"] == 2

        one.set_checkpoint("feed", "2")
        assert two.get_checkpoint("feed") == "2"
        two.put_run(make_run())
        assert ids(one.list_runs("agent-a")) == ["agent-a:run:v2"]


def test_sqlite_concurrent_put_score_from_two_store_objects_gives_unique_seqs(db_path: Path) -> None:
    stores = [SQLiteStore(db_path), SQLiteStore(db_path)]
    threads, per_thread = 4, 200
    barrier = threading.Barrier(threads)

    def writer(t: int) -> list[int]:
        s = stores[t % 2]
        barrier.wait(timeout=30)
        return [s.put_score(make_score(f"t{t}-ep{i}")).seq for i in range(per_thread)]  # type: ignore[misc]

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            seqs = [s for r in pool.map(writer, range(threads)) for s in r]
        assert len(set(seqs)) == threads * per_thread
        rows = stores[0].read_scores("agent-a", None, 10_000)
        assert [r["seq"] for r in rows] == sorted(seqs)
    finally:
        for s in stores:
            s.close()


def test_sqlite_a_corrupt_score_row_is_still_returned_with_seq_and_id(db_path: Path) -> None:
    with SQLiteStore(db_path) as store:
        good1 = store.put_score(make_score("ep-1"))
        store.put_raw_score({"id": "bad-1", "agent_id": "agent-a"})  # no reward, no metrics, ...
        store.put_raw_score({"id": "bad-2", "agent_id": "agent-a", "seq": "not-a-number", "reward": "high"})
        good2 = store.put_score(make_score("ep-2"))
        rows = store.read_scores("agent-a", None, 10)
        assert ids(rows) == ["ep-1", "bad-1", "bad-2", "ep-2"]
        for row in rows:
            assert type(row["seq"]) is int
            assert type(row["id"]) is str
        seqs = [r["seq"] for r in rows]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        assert seqs[0] == good1.seq and seqs[-1] == good2.seq
        with pytest.raises(InvalidDocument):
            Score.from_dict(rows[1])
        # The corrupt rows can be skipped by cursor like any other.
        assert ids(store.read_scores("agent-a", cursor_of(rows[2]), 10)) == ["ep-2"]


def test_sqlite_read_scores_seeks_the_index_to_the_cursor_in_new_and_existing_files(db_path: Path) -> None:
    """The trainer's query searches (agent_id, seq, id) from the cursor on; it never scans the
    agent's history. A file whose index went missing gets it back when it is opened."""
    import sqlite3

    from agent_learning.store.sqlite import READ_SCORES

    def plan(conn: sqlite3.Connection) -> list[str]:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {READ_SCORES}", ("agent-a", 5, "ep-1", 100))]

    with SQLiteStore(db_path) as store:
        for eid in SHUFFLED_IDS[:6]:
            store.put_score(make_score(eid))
    with sqlite3.connect(db_path, cached_statements=0) as conn:  # no cache: each plan is made anew
        conn.execute("ANALYZE")  # statistics must not turn the planner to another index
        assert plan(conn) == ["SEARCH scores USING INDEX scores_agent_seq (agent_id=? AND (seq,id)>(?,?))"]
        conn.execute("DROP INDEX scores_agent_seq")  # a file written without the index
        assert not any("scores_agent_seq" in step for step in plan(conn))
    with SQLiteStore(db_path) as store:
        rows = store.read_scores("agent-a", None, 100)
        assert ids(store.read_scores("agent-a", cursor_of(rows[2]), 100)) == ids(rows[3:])
    with sqlite3.connect(db_path, cached_statements=0) as conn:
        assert plan(conn) == ["SEARCH scores USING INDEX scores_agent_seq (agent_id=? AND (seq,id)>(?,?))"]


def test_sqlite_training_cursors_list_an_agent_whose_current_document_is_corrupt(db_path: Path) -> None:
    """Its fields are left unknown and its problem is said (the plan reports it as the trainer
    would); the other agents are listed as usual."""
    with SQLiteStore(db_path) as store:
        store.replace_current_policy(make_policy_doc("agent-a", kind="current"), None)
        store.put_raw_current_policy("agent-b", {"agent_id": "agent-b", "version": "two", "cursor": {"seq": -1}})
        store.put_raw_current_policy("agent-c", ["not", "a", "document"])  # type: ignore[arg-type]
        cursors = store.training_cursors()
        assert cursors[0].problem == "" and "version: Input should be a valid integer" in cursors[1].problem
        assert cursors[2].problem == "invalid policy document: (document): must be a JSON object, got list"
        assert [dataclasses.replace(c, problem="") for c in cursors] == [
            AgentCursor("agent-a", 1, None, False),
            AgentCursor("agent-b", 0, None, False),
            AgentCursor("agent-c", 0, None, False),
        ]


def test_sqlite_a_file_from_before_the_feedback_feed_puts_its_feedback_in_the_feed_once(db_path: Path) -> None:
    import sqlite3

    with SQLiteStore(db_path) as store:
        store.put_feedback(make_feedback("ep-2", "user"))
        store.put_feedback(make_feedback("ep-1", "user"))
    with sqlite3.connect(db_path) as conn:  # the file as a version without the feed left it
        conn.execute("DROP TABLE feedback_feed")
        conn.execute("DROP TABLE correction_ledgers")
    expected = [make_feedback("ep-2", "user").id, make_feedback("ep-1", "user").id]
    for _ in range(2):  # opened once more: nothing enters the feed twice
        with SQLiteStore(db_path) as store:
            assert ids(store.read_feedback_changes(None, 10).items) == expected
            assert store.get_correction_ledger("ep-1", "agent-a") is None


def two_agents_with_every_kind_of_document(store: Store) -> None:
    """agent-a and agent-b, each with a current policy, two versions, a run and two scored episodes
    with feedback; agent-a also a correction ledger, an episode waiting for feedback and an
    unjudged one (agent-b an unjudged record too)."""
    for agent in ("agent-a", "agent-b"):
        store.replace_current_policy(make_policy_doc(agent, version=2, kind="current"), None)
        store.create_policy_version(make_policy_doc(agent, version=1))
        store.create_policy_version(make_policy_doc(agent, version=2))
        store.put_run(make_run(agent, 2))
        for n in (1, 2):
            episode = make_episode(f"{agent}-ep-{n}", agent_id=agent)
            store.add_episode(episode)
            store.add_score(make_score(episode=episode))
            store.put_feedback(make_feedback(episode.id, "user", agent_id=agent))
    store.put_correction_ledger(make_ledger("agent-a-ep-1"), None)
    store.add_episode(make_episode("agent-a-ep-3", agent_id="agent-a"))
    store.mark_feedback_waiting("agent-a-ep-3", "agent-a")
    store.add_episode(make_episode("agent-a-ep-4", agent_id="agent-a"))
    store.mark_unjudged(make_unjudged("agent-a-ep-4", agent_id="agent-a"))
    store.mark_unjudged(make_unjudged("agent-b-ep-9", agent_id="agent-b"))


def test_deleting_an_agent_removes_all_of_its_documents_and_nothing_else(store: Store) -> None:
    two_agents_with_every_kind_of_document(store)
    deleted = store.delete_agent("agent-a")
    assert deleted["policies"] == 3 and deleted["runs"] == 1 and deleted["episodes"] == 4
    assert deleted["feedback"] == 2 and deleted["scores"] >= 4  # 2 scores, ledger, record (and marker on Cosmos)
    assert store.list_unjudged("agent-a") == [] and ids(store.list_unjudged("agent-b")) == ["agent-b-ep-9"]
    assert store.list_agents() == ["agent-b"]
    assert store.get_current_policy("agent-a") is None and store.list_policy_versions("agent-a") == []
    assert store.list_runs("agent-a") == [] and store.list_episodes("agent-a") == []
    assert store.get_score("agent-a-ep-1", "agent-a") is None and store.list_feedback("agent-a-ep-1") == []
    assert store.get_correction_ledger("agent-a-ep-1", "agent-a") is None
    assert [e["id"] for e in store.read_episodes(None, 100).items] == ["agent-b-ep-1", "agent-b-ep-2"]
    assert len(store.list_policy_versions("agent-b")) == 2 and store.get_score("agent-b-ep-2", "agent-b") is not None
    assert len(store.list_feedback("agent-b-ep-1")) == 1 and len(store.list_runs("agent-b")) == 1
    assert set(store.delete_agent("agent-a").values()) == {0}  # again: nothing left to delete
    # The same id can start afresh.
    store.replace_current_policy(make_policy_doc("agent-a", version=1, kind="current"), None)
    assert store.list_agents() == ["agent-a", "agent-b"]


def test_deleting_an_agents_logs_keeps_what_it_learned_and_every_other_agent(store: Store) -> None:
    two_agents_with_every_kind_of_document(store)
    deleted = store.delete_logs("agent-a")
    assert deleted["episodes"] == 4 and deleted["feedback"] == 2 and deleted["scores"] >= 4
    assert "policies" not in deleted and "runs" not in deleted
    assert store.list_episodes("agent-a") == [] and store.get_score("agent-a-ep-1", "agent-a") is None
    assert store.list_feedback("agent-a-ep-1") == [] and store.list_unjudged("agent-a") == []
    assert store.get_correction_ledger("agent-a-ep-1", "agent-a") is None
    assert store.list_agents() == ["agent-a", "agent-b"] and len(store.list_policy_versions("agent-a")) == 2
    assert len(store.list_runs("agent-a")) == 1 and store.get_current_policy("agent-a") is not None
    assert sorted(ids(store.list_episodes("agent-b"))) == ["agent-b-ep-1", "agent-b-ep-2"]
    assert store.get_score("agent-b-ep-1", "agent-b") and ids(store.list_unjudged("agent-b")) == ["agent-b-ep-9"]
    assert set(store.delete_logs("agent-a").values()) == {0}  # again: nothing left to delete


def test_the_other_agents_episodes_stay_listed_after_an_agent_is_deleted(store: Store) -> None:
    for n, agent in enumerate(("agent-a", "agent-b", "agent-a", "agent-b")):
        store.add_episode(make_episode(f"ep-{n}", agent_id=agent))
    store.delete_agent("agent-a")
    assert sorted(store.episode_ids("agent-b")) == ["ep-1", "ep-3"]
    assert list(store.episode_ids("agent-a")) == []
    assert sorted(ids(store.list_episodes())) == ["ep-1", "ep-3"]


def test_an_episode_keeps_its_context_and_one_without_stores_none(store: Store) -> None:
    context = {"task": "billing", "tokens": 812, "score": 0.25, "returning": True}
    store.add_episode(make_episode("ep-ctx", context=context))
    store.add_episode(make_episode("ep-plain"))
    with_context = store.get_episode("ep-ctx")
    plain = store.get_episode("ep-plain")
    assert with_context is not None and with_context["context"] == context
    assert plain is not None and "context" not in plain
    assert Episode.from_dict(with_context).context == context
    store.add_episode(make_episode("ep-ctx", context=context))  # the same again: a no-op
    with pytest.raises(ConcurrencyConflict):
        store.add_episode(make_episode("ep-ctx", context={**context, "task": "tech"}))


def test_a_score_keeps_its_context(store: Store) -> None:
    context = {"task": "billing", "tokens": 812}
    episode = make_episode("ep-ctx", context=context)
    store.add_episode(episode)
    store.add_score(make_score(episode=episode, context=context))
    store.add_score(make_score("ep-plain"))
    scored, plain = store.get_score("ep-ctx", "agent-a"), store.get_score("ep-plain", "agent-a")
    assert scored is not None and scored["context"] == context and Score.from_dict(scored).context == context
    assert plain is not None and "context" not in plain
    rows = {r["id"]: r for r in store.read_scores("agent-a", None, 10, settled=False)}  # what the trainer reads
    assert rows["ep-ctx"]["context"] == context and "context" not in rows["ep-plain"]
