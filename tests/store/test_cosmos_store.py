"""What only the Cosmos adapter does, over the wire: settle window, conditional reads, async writes."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.cosmos")
from azure.cosmos import PartitionKey
from azure.cosmos.exceptions import CosmosHttpResponseError
from cosmos_fixture import CLIENT_KWARGS, status_rewriting_store
from cosmos_requests import RequestCounter
from factories import make_episode, make_policy_doc, make_score, record_steps_at_the_caps

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import TransientError
from agent_learning.documents import (
    MAX_EPISODE_BYTES,
    MAX_TEXT_CHARS,
    Episode,
    ScoreCursor,
    TrainingRun,
    json_bytes,
)
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.recovery import migrate_scores
from agent_learning.pipeline import create_policy, set_pinned, train_agent
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.base import NOT_MODIFIED, Tagged
from agent_learning.store.cosmos import (
    BY_AGENT_SEQ_ID,
    CONTAINERS,
    LEGACY_SCORES,
    SCORES,
    CosmosStore,
    copy_legacy_scores,
)


@pytest.fixture
def clock() -> ManualClock:
    """Half a minute ahead of the server's clock, so the store's server-clock correction (which
    only moves a lagging clock forward) stays off and the test alone moves time."""
    return ManualClock(start=time.time() + 30)


@pytest.fixture
def store(cosmos_database: Any, clock: ManualClock) -> Iterator[CosmosStore]:
    s = CosmosStore(cosmos_database, settle_seconds=60, clock=clock)
    s.ensure_containers()
    yield s


def test_containers_have_the_documented_partition_keys(store: CosmosStore) -> None:
    for name, spec in CONTAINERS.items():
        props = store.database.get_container_client(name).read()
        assert props["partitionKey"]["paths"] == list(spec.partition_key)
        assert props["partitionKey"].get("kind", "Hash") == spec.partition_key_definition["kind"]
    leases = store.database.get_container_client("leases").read()
    assert leases["partitionKey"]["paths"] == ["/id"]
    assert {n: s.partition_key for n, s in CONTAINERS.items()} == {
        "episodes": ("/id",), "agent-scores": ("/agent_id", "/id"), "policies": ("/agent_id",),
        "runs": ("/agent_id",), "feedback": ("/episode_id",),
    }
    scores = store.database.get_container_client(SCORES).read()["partitionKey"]
    assert scores == {"paths": ["/agent_id", "/id"], "kind": "MultiHash", "version": 2}


# --------------------------------------------------------------------------- requests over the wire


@pytest.fixture
def counted(cosmos_server: Any, clock: ManualClock) -> Iterator[tuple[CosmosStore, RequestCounter]]:
    """A store whose client reports every request it sends, in a database of its own."""
    counter = RequestCounter()
    database = f"counted-{uuid.uuid4().hex[:8]}"
    s = CosmosStore.connect(cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True,
                            client_kwargs={**CLIENT_KWARGS, "raw_response_hook": counter}, settle_seconds=60,
                            clock=clock)
    try:
        yield s, counter
    finally:
        s._client.delete_database(database)  # type: ignore[union-attr]
        s.close()


def test_the_trainers_reads_are_one_request_each_scoped_to_the_agent(
    counted: tuple[CosmosStore, RequestCounter], clock: ManualClock
) -> None:
    store, counter = counted
    for agent in ("agent-a", "agent-b"):
        for i in range(5):
            store.add_score(make_score(f"{agent}-ep-{i}", agent_id=agent))
    store.mark_feedback_waiting("agent-a-ep-9", "agent-a")
    assert not store.has_new_scores("agent-a", None)  # written just now: not settled yet
    clock.advance(61)
    third = store.read_scores("agent-a", None, 3)[-1]
    middle = ScoreCursor(seq=third["seq"], id=third["id"])
    for call, expected in (
        (lambda: [r["id"] for r in store.read_scores("agent-a", None, 100)], [f"agent-a-ep-{i}" for i in range(5)]),
        (lambda: store.has_new_scores("agent-a", None), True),
        (lambda: store.has_new_scores("agent-a", middle), True),
    ):
        with counter.counting() as calls:
            assert call() == expected
        (query,) = [r for r in calls.requests if r.container is not None]
        assert query.operation == "query" and query.container == SCORES
        assert query.scope is not None and query.scope.startswith("epk ")  # the agent's prefix of the key
    last = store.read_scores("agent-a", None, 100)[-1]
    with counter.counting() as calls:
        assert not store.has_new_scores("agent-a", ScoreCursor(seq=last["seq"], id=last["id"]))
    assert calls.data == 1
    with counter.counting() as calls:
        assert store.get_score("agent-a-ep-1", "agent-a") is not None
    assert [(r.operation, json.loads(r.scope or "")) for r in calls.requests] == [("read", ["agent-a", "agent-a-ep-1"])]
    assert store.get_score("agent-a-ep-1", "agent-b") is None  # the key is the pair


def test_training_cursors_read_the_current_documents_in_pages(
    counted: tuple[CosmosStore, RequestCounter], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, counter = counted
    monkeypatch.setattr("agent_learning.store.cosmos.CURSOR_PAGE", 2)
    for i in range(5):
        create_policy(store, SoftmaxPolicy.from_actions(f"agent-{i}", ["x", "y"]).to_document(created_at=None))
    with counter.counting() as calls:
        cursors = store.training_cursors()
    assert [c.agent_id for c in cursors] == [f"agent-{i}" for i in range(5)]
    # Document requests only: the SDK may refresh its account metadata at any moment (every 5 minutes).
    documents = [(r.operation, r.container, r.scope) for r in calls.requests if r.container is not None]
    assert documents == [("query", "policies", None)] * 3


def test_a_training_run_costs_six_requests_with_new_scores_and_three_without(
    counted: tuple[CosmosStore, RequestCounter], clock: ManualClock
) -> None:
    """Read the current document, check its run record, query the new scores; then swap, and
    write the version and run records without reading them first."""
    from agent_learning.learning.reinforce import Reinforce
    from agent_learning.pipeline import train_agent

    store, counter = counted
    for agent in ("busy", "idle"):
        create_policy(store, SoftmaxPolicy.from_actions(agent, ["x", "y"]).to_document(created_at=None))
        store.add_score(make_score(f"{agent}-0", agent_id=agent, action_id="x"))
    clock.advance(61)
    assert [train_agent(a, store, Reinforce(), clock=clock).status for a in ("busy", "idle")] == ["published"] * 2
    store.add_score(make_score("busy-1", agent_id="busy", action_id="y"))
    clock.advance(61)
    with counter.counting() as busy:
        assert train_agent("busy", store, Reinforce(), clock=clock).status == "published"
    with counter.counting() as idle:
        assert train_agent("idle", store, Reinforce(), clock=clock).status == "no_new_scores"
    assert sorted(busy.by_operation()) == sorted([
        "read policies 200", "read runs 200", f"query {SCORES} 200",
        "replace policies 200", "create policies 201", "upsert runs 201",
    ])
    assert busy.data == 6
    assert sorted(idle.by_operation()) == sorted(["read policies 200", "read runs 200", f"query {SCORES} 200"])
    assert idle.data == 3


# --------------------------------------------------------------------------- migrating the scores container


def legacy_scores(database: Any) -> Any:
    """The scores container as deployments from before hierarchical keys have it."""
    return database.create_container_if_not_exists(
        LEGACY_SCORES, partition_key=PartitionKey(path="/id"), indexing_policy={"compositeIndexes": BY_AGENT_SEQ_ID}
    )


def test_copying_the_old_scores_container_keeps_seq_and_is_idempotent(store: CosmosStore, clock: ManualClock) -> None:
    old = legacy_scores(store.database)
    docs = [
        {**make_score("ep-2", agent_id="agent-a").to_dict(), "seq": 200},
        {**make_score("ep-1", agent_id="agent-a").to_dict(), "seq": 300},
        {**make_score("ep-1", id="ep-1~r1", revision=1, reward_delta=0.25).to_dict(), "seq": 400},
        {**make_score("ep-3", agent_id="agent-b").to_dict(), "seq": 100},
        {"id": "ep-4", "type": "feedback_marker", "episode_id": "ep-4", "agent_id": "agent-a"},
        {"id": "ep-1~ledger", "type": "correction_ledger", "episode_id": "ep-1", "agent_id": "agent-a",
         "revision": 1, "delta_sum": 0.25, "updated_at": "2026-01-01T00:00:00Z"},
        {"id": "foreign", "reward": 1},  # no agent: no place under the new key
    ]
    for doc in docs:
        old.create_item(doc)
    first = copy_legacy_scores(store, page_size=3)
    assert (first.read, first.copied, first.already, first.skipped, first.differing) == (7, 6, 0, ["foreign"], [])
    again = copy_legacy_scores(store)
    assert (again.copied, again.already, again.skipped) == (0, 6, ["foreign"])

    clock.advance(61)
    rows = store.read_scores("agent-a", None, 10)
    assert [(r["id"], r["seq"]) for r in rows] == [("ep-2", 200), ("ep-1", 300), ("ep-1~r1", 400)]
    assert [r["id"] for r in store.read_scores("agent-a", ScoreCursor(seq=300, id="ep-1"), 10)] == ["ep-1~r1"]
    assert store.get_correction_ledger("ep-1", "agent-a") is not None

    old.upsert_item({**docs[0], "reward": -0.5})  # the old container changed after its copy
    changed = copy_legacy_scores(store)
    assert changed.differing == ["ep-2"] and store.get_score("ep-2", "agent-a")["reward"] == 0.5  # type: ignore[index]
    forced = copy_legacy_scores(store, overwrite=True)
    assert forced.overwritten == 1 and store.get_score("ep-2", "agent-a")["reward"] == -0.5  # type: ignore[index]
    assert store.get_score("ep-2", "agent-a")["seq"] == 200  # type: ignore[index]

    assert store.add_score(make_score("ep-4")).feedback_pending  # the marker came along
    assert copy_legacy_scores(store).differing == ["ep-4"]  # the new container was written since: never undone


def test_a_migration_beside_a_running_trainer_loses_no_score(store: CosmosStore, clock: ManualClock) -> None:
    """Before the fix a trainer that ran while the copy was under way learned part of an agent's
    scores and moved its cursor past the rest, which then landed behind it for good (an operator
    lost 72 of 200 episodes so)."""
    agents = ["agent-a", "agent-b", "agent-c"]
    for agent in agents:
        create_policy(store, make_policy_doc(agent))
    set_pinned(store, "agent-c", True, "checking")  # an operator's pin stays
    old = legacy_scores(store.database)
    for i in range(120):
        old.create_item({**make_score(f"ep-{i:03d}", agent_id=agents[i % 3]).to_dict(), "seq": 1_000 + i})

    rounds, changed, stop = [0], threading.Condition(), threading.Event()

    def trainer() -> None:  # the app's trainer, running all along
        while not stop.is_set():
            for agent in agents:
                train_agent(agent, store, Reinforce(), clock=clock)
            with changed:
                rounds[0] += 1
                changed.notify_all()

    def after_page(_read: int) -> None:  # a whole training round between two pages of the copy
        with changed:
            due = rounds[0] + 2
            assert changed.wait_for(lambda: rounds[0] >= due, timeout=60)

    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        result = migrate_scores(store, page_size=10, progress=after_page)
    finally:
        stop.set()
        thread.join()
    assert (result.copied, sorted(result.paused)) == (120, ["agent-a", "agent-b"])
    set_pinned(store, "agent-c", False)
    for agent in agents:
        while train_agent(agent, store, Reinforce(), clock=clock).status == "published":
            pass
        runs = [TrainingRun.from_dict(raw) for raw in store.list_runs(agent, 1_000)]
        assert sum(run.episodes for run in runs if not run.held) == 40, agent  # every score learned, none lost


def test_the_migrate_scores_command_copies_and_names_what_it_left(
    cosmos_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from agent_learning.cli import main

    database = f"migrate-{uuid.uuid4().hex[:8]}"
    target = CosmosStore.connect(cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True,
                                 client_kwargs=CLIENT_KWARGS)
    try:
        for name, value in {"STORE": "cosmos", "COSMOS_KEY": cosmos_server.key, "COSMOS_DATABASE": database}.items():
            monkeypatch.setenv(f"AGENT_LEARNING_{name}", value)
        monkeypatch.setenv("CosmosDBConnection__accountEndpoint", cosmos_server.endpoint)
        missing = CliRunner().invoke(main, ["store", "migrate-scores"])
        assert missing.exit_code == 2 and "has no container 'scores'" in missing.output
        old = legacy_scores(target.database)
        old.create_item({**make_score("ep-1").to_dict(), "seq": 7})
        old.create_item({"id": "stray"})
        result = CliRunner().invoke(main, ["store", "migrate-scores", "--json"])
        assert result.exit_code == 1  # a document was left behind: the operator must look at it
        report = json.loads(result.stdout)
        assert (report["copied"], report["skipped"]) == (1, ["stray"])
        assert target.get_score("ep-1", "agent-a")["seq"] == 7  # type: ignore[index]
        again = CliRunner().invoke(main, ["store", "migrate-scores", "--json"])
        assert json.loads(again.stdout)["already"] == 1
    finally:
        target._client.delete_database(database)  # type: ignore[union-attr]
        target.close()


def test_scores_become_readable_only_after_the_settle_window(store: CosmosStore, clock: ManualClock) -> None:
    first = store.add_score(make_score("ep-1"))
    assert store.read_scores(first.agent_id, None, 10) == []  # written just now: not yet settled
    clock.advance(61)
    second = store.add_score(make_score("ep-2"))
    rows = store.read_scores(first.agent_id, None, 10)
    assert [r["id"] for r in rows] == ["ep-1"]
    clock.advance(61)
    rows = store.read_scores(first.agent_id, first.cursor, 10)
    assert [r["id"] for r in rows] == ["ep-2"] and rows[0]["seq"] == second.seq


def test_an_audit_reads_scores_however_recent(store: CosmosStore) -> None:
    first = store.add_score(make_score("ep-1"))
    assert store.read_scores(first.agent_id, None, 10) == []  # the trainer waits for the window
    assert [r["id"] for r in store.read_scores(first.agent_id, None, 10, settled=False)] == ["ep-1"]


def test_seq_is_strictly_increasing_even_within_one_microsecond(store: CosmosStore) -> None:
    seqs = [store.add_score(make_score(f"ep-{i}")).seq for i in range(20)]  # the manual clock does not move
    assert seqs == sorted(seqs) and len(set(seqs)) == 20


def test_conditional_read_of_an_unchanged_policy_is_not_modified(store: CosmosStore) -> None:
    doc = SoftmaxPolicy.from_actions("agent-a", ["x", "y"]).to_document(created_at=None)
    create_policy(store, doc)
    tagged = store.get_current_policy("agent-a")
    assert isinstance(tagged, Tagged)
    assert store.get_current_policy_if_changed("agent-a", tagged.etag) is NOT_MODIFIED
    changed = store.get_current_policy_if_changed("agent-a", '"some-older-etag"')
    assert isinstance(changed, Tagged) and changed.doc["id"] == "agent-a:current"
    assert store.get_current_policy_if_changed("nobody", tagged.etag) is None


def test_policy_client_transfers_the_document_only_when_it_changed(
    store: CosmosStore, clock: ManualClock, cosmos_server: Any
) -> None:
    create_policy(store, SoftmaxPolicy.from_actions("agent-a", ["x", "y"]).to_document(created_at=None))
    client = PolicyClient(store, "agent-a", refresh_seconds=30, rng=random.Random(1), clock=clock)
    first = client.policy()
    for _ in range(5):
        clock.advance(31)
        assert client.policy() is first  # unchanged: the same parsed object, no new document
    assert (client.reads_with_transfer, client.reads_not_modified) == (1, 5)

    tagged = store.get_current_policy("agent-a")
    assert tagged is not None
    from agent_learning.documents import PolicyDocument

    newer = PolicyDocument.from_dict(tagged.doc).model_copy(update={"version": 2, "logits": [1.0, -1.0]})
    store.replace_current_policy(newer, tagged.etag)
    clock.advance(31)
    assert client.policy().version == 2
    assert client.reads_with_transfer == 2


def test_async_episode_writes(cosmos_server: Any) -> None:
    database = f"async-{uuid.uuid4().hex[:8]}"
    store = CosmosStore.connect(
        cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True, client_kwargs=CLIENT_KWARGS
    )
    policy = SoftmaxPolicy.from_actions("agent-a", ["x", "y"], seed=2)

    async def agent() -> list[str]:
        ids = []
        for i in range(3):
            async with EpisodeCapture(store, policy.choose(), input=f"question {i}") as run:
                ids.append((await run.aend(f"answer {i}")).id)
        await store.add_episode_async(make_episode("same"))
        await store.add_episode_async(make_episode("same"))  # identical: a no-op
        await store.aclose()
        return ids

    try:
        ids = asyncio.run(agent())
        for eid in ids:
            assert store.get_episode(eid)["output"].startswith("answer")  # type: ignore[index]
        assert len(store.read_episodes(None, 100).items) == 4
    finally:
        store._client.delete_database(database)  # type: ignore[union-attr]
        store.close()


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_and_server_errors_are_transient_other_answers_pass_through(
    cosmos_server: Any, cosmos_database: Any, status: int
) -> None:
    """The server's answers, their status rewritten on arrival (the server did the work; only the
    answer is lost, as with a real timeout): a throttled or failing request
    raises the port's TransientError from a call, a lazily read iterator, a write, a coroutine
    and the score migration; a 403 is not transient and reaches the caller as the SDK's error."""
    store, answer = status_rewriting_store(cosmos_server, cosmos_database)
    create_policy(store, SoftmaxPolicy.from_actions("agent-a", ["x", "y"]).to_document(created_at=None))

    async def write_async() -> None:
        try:
            await store.add_episode_async(make_episode(f"ep-async-{status}"))
        finally:
            await store.aclose()  # the async client lives in one event loop

    calls: dict[str, Any] = {
        "call": store.list_agents,
        "iterator": lambda: list(store.episode_ids("agent-a")),
        "write": lambda: store.add_episode(make_episode(f"ep-{status}")),
        "coroutine": lambda: asyncio.run(write_async()),
        "migration": lambda: copy_legacy_scores(store, source=SCORES + "-none"),
    }
    for answer["status"], expected in ((status, TransientError), (403, CosmosHttpResponseError)):
        for name, call in calls.items():
            with pytest.raises(expected) as caught:
                call()
            assert expected is not TransientError or f"answered {status}" in str(caught.value), name
    answer["status"] = None  # the server did write: retrying the write is a no-op
    store.add_episode(make_episode(f"ep-{status}"))
    assert store.get_episode(f"ep-{status}") is not None and store.list_agents() == ["agent-a"]
    store.close()


def test_an_episode_cut_to_the_item_limit_round_trips_over_the_wire(cosmos_server: Any) -> None:
    """256 steps with every text at its cap, written sync and async: both fit and read back whole."""
    database = f"large-{uuid.uuid4().hex[:8]}"
    store = CosmosStore.connect(
        cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True, client_kwargs=CLIENT_KWARGS
    )
    decision = SoftmaxPolicy.from_actions("agent-a", ["x", "y"], seed=2).choose()

    def large_run(episode_id: str) -> EpisodeCapture:
        run = EpisodeCapture(store, decision, input="q" * MAX_TEXT_CHARS, episode_id=episode_id)
        record_steps_at_the_caps(run)
        return run

    async def agent() -> Episode:
        episode = await large_run("large-async").aend("a" * MAX_TEXT_CHARS)
        await store.aclose()
        return episode

    try:
        written = [large_run("large-sync").end("a" * MAX_TEXT_CHARS), asyncio.run(agent())]
        for episode in written:
            assert json_bytes(episode.to_dict()) <= MAX_EPISODE_BYTES and "steps.result" in episode.truncated
            stored = store.get_episode(episode.id)
            assert stored is not None and Episode.from_dict(stored) == episode
    finally:
        store._client.delete_database(database)  # type: ignore[union-attr]
        store.close()


def test_change_feed_is_incremental_and_resumable(store: CosmosStore) -> None:
    for i in range(5):
        store.add_episode(make_episode(f"ep-{i}"))
    page = store.read_episodes(None, 3)
    assert [d["id"] for d in page.items] == ["ep-0", "ep-1", "ep-2"]
    page2 = store.read_episodes(page.continuation, 3)
    assert [d["id"] for d in page2.items] == ["ep-3", "ep-4"]
    empty = store.read_episodes(page2.continuation, 3)
    assert empty.items == [] and empty.continuation is not None
    store.add_episode(make_episode("ep-5"))
    later = store.read_episodes(empty.continuation, 3)
    assert [d["id"] for d in later.items] == ["ep-5"]


def test_the_local_runner_runs_against_cosmos(cosmos_server: Any, tmp_path: Any) -> None:
    """`AGENT_LEARNING_STORE=cosmos`: the embedded runner's pump reads the Cosmos change feed."""
    from agent_learning.app.embedded import open_local
    from agent_learning.app.settings import load_settings
    from agent_learning.pipeline import load_current
    from agent_learning.sim.simulate import math_tutor

    database = f"runner-{uuid.uuid4().hex[:8]}"
    setup = CosmosStore.connect(cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True,
                                client_kwargs=CLIENT_KWARGS)
    settings = load_settings(store="cosmos", cosmos_endpoint=cosmos_server.endpoint, cosmos_key=cosmos_server.key,
                             cosmos_database=database, guardrail="warn")  # rounds of 15: too few to judge
    runner_clock = ManualClock(start=time.time() + 30)  # ahead of the server's: the test alone moves time
    pipeline = open_local(settings, path=tmp_path / "queue.db", clock=runner_clock)
    try:
        assert isinstance(pipeline.store, CosmosStore)
        scenario = math_tutor()
        create_policy(pipeline.store, SoftmaxPolicy.from_actions(scenario.agent_id, scenario.actions)
                      .to_document(created_at=None))
        clock, rng = ManualClock(), random.Random(4)
        for round_ in range(2):
            doc = load_current(pipeline.store, scenario.agent_id)
            assert doc is not None and doc.version == round_ + 1
            policy = SoftmaxPolicy.from_document(doc, rng=rng)
            for _ in range(15):
                scenario.run_episode(pipeline.store, policy.choose(), rng, clock)
            assert pipeline.pump() == 15 and pipeline.score_pending() == {"scored": 15}
            runner_clock.advance(settings.score_settle_seconds + 1)  # the scores settle
            assert [t.status for t in pipeline.train()] == ["published"]
        assert pipeline.pump() == 0  # the checkpoint (a Cosmos document) remembers the feed position
    finally:
        pipeline.queue.close()
        setup._client.delete_database(database)  # type: ignore[union-attr]
        setup.close()
        pipeline.store.close()


# --------------------------------------------------------------------------- the settle window


def test_a_settle_window_that_cannot_work_is_refused(cosmos_database: Any) -> None:
    """The window must exceed the write timeout plus the clock-skew allowance (10 s + 5 s by
    default). Before the fix a window of 0 was accepted and scores could be skipped silently."""
    for settle, timeout in [(0, 10.0), (15, 10.0), (30, 25.0)]:
        with pytest.raises(ValueError, match=r"AGENT_LEARNING_SCORE_SETTLE_SECONDS.* of \d+ s must exceed"):
            CosmosStore(cosmos_database, settle_seconds=settle, write_timeout=timeout)
    assert CosmosStore(cosmos_database, settle_seconds=15.5).settle_seconds == 15.5


class SettableClock(ManualClock):
    """A clock that can be set back, as an NTP step or a resumed virtual machine does."""

    def set(self, t: float) -> None:
        with self._lock:
            self._t = t


def test_a_score_that_completed_after_its_settle_window_is_logged_marked_and_counted(
    cosmos_database: Any, caplog: pytest.LogCaptureFixture, captured: Any
) -> None:
    """A write whose ``seq`` is older than the server's time of the write by more than the
    settle window may have landed behind a consumed cursor: it is never skipped silently. Here
    the instance's clock steps back 2 minutes after it learned the server's time (a write that
    stalled that long looks the same); its next score is flagged, and the one after it, taken
    from the clock corrected by that write's answer, is on time again."""
    clock = SettableClock(start=time.time())
    store = CosmosStore(cosmos_database, clock=clock)
    store.ensure_containers()
    create_policy(store, SoftmaxPolicy.from_actions("agent-a", ["x", "y"]).to_document(created_at=None))
    assert store.server_clock.observed  # the policy write's answer carried the server's time
    clock.set(clock.time() - 120)
    with caplog.at_level(logging.ERROR, logger="agent_learning.store.cosmos"):
        late = store.add_score(make_score("ep-late"))
    assert late.late_write and store.get_score("ep-late", "agent-a")["late_write"] is True  # type: ignore[index]
    assert any("ep-late" in r.getMessage() and "settle window" in r.getMessage() for r in caplog.records)
    assert captured.total("agent_learning.scores.late", agent_id="agent-a") == 1
    on_time = store.add_score(make_score("ep-next"))
    assert not on_time.late_write and on_time.seq > late.seq + 100e6  # type: ignore[operator]
    rescored = store.put_score(make_score("ep-late", reward=0.9))  # a re-score keeps the seq and its mark
    assert rescored.seq == late.seq and rescored.late_write
    assert store.get_score("ep-late", "agent-a")["late_write"] is True  # type: ignore[index]



def test_one_store_sends_one_query_at_a_time(
    counted: tuple[CosmosStore, RequestCounter], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """azure-cosmos 4.17 shares one response-header dict among a client's queries, which each
    query page clears and refills: the scale benchmark's 16 threads planning a tick through one
    store failed now and then with "OrderedDict mutated during iteration". The store serializes
    its queries; threads still get every answer."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    store, _ = counted
    agents = [f"agent-{i}" for i in range(8)]
    for agent in agents:
        store.add_score(make_score(f"{agent}-ep-1", agent_id=agent))
    clock.advance(61)
    container = store._c[SCORES]
    inside, most, lock = 0, 0, threading.Lock()
    query_items = container.query_items

    def watched(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.01)  # long enough for another thread to come in, if it may
            return list(query_items(*args, **kwargs))
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(container, "query_items", watched)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda a: store.has_new_scores(a, None), agents * 3))
    assert answers == [True] * 24 and most == 1


def test_listings_that_page_wait_for_the_other_queries_too(
    store: CosmosStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training tick's listing of every agent's cursor and the audit's stream of episode ids
    query through the same client as the trainers' reads (a timer and queue triggers share one
    worker): they too fetch one page at a time per store, and the stream is not held up while its
    caller works through a page."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    agents = [f"agent-{i}" for i in range(4)]
    for agent in agents:
        create_policy(store, SoftmaxPolicy.from_actions(agent, ["x", "y"]).to_document(created_at=None))
        store.add_episode(make_episode(f"{agent}-ep-1", agent_id=agent))
    inside, most, lock = 0, 0, threading.Lock()

    class Watched:
        """A query's pages, each fetched while counted as one request in flight."""

        def __init__(self, pages: Any) -> None:
            self.pages = pages

        def __iter__(self) -> Iterator[Any]:
            return (row for page in self.by_page() for row in page)

        def by_page(self, *args: Any) -> Iterator[list[Any]]:
            nonlocal inside, most
            pages = self.pages.by_page(*args)
            while True:
                with lock:
                    inside += 1
                    most = max(most, inside)
                try:
                    time.sleep(0.01)  # long enough for another thread to come in, if it may
                    page = next(pages, None)
                    rows = None if page is None else list(page)
                finally:
                    with lock:
                        inside -= 1
                if rows is None:
                    return
                yield rows

    for name in ("policies", "episodes"):
        container = store._c[name]
        monkeypatch.setattr(container, "query_items", lambda *a, _q=container.query_items, **k: Watched(_q(*a, **k)))
    calls = [store.training_cursors, lambda: list(store.episode_ids("agent-1")),
             lambda: store.list_policy_versions("agent-2")] * 4
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda call: call(), calls))
    assert [c.agent_id for c in answers[0]] == agents and answers[1] == ["agent-1-ep-1"] and len(answers[2]) == 1
    assert most == 1


def test_another_request_between_a_feed_page_and_its_token_does_not_corrupt_the_token(
    store: CosmosStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """azure-cosmos 4.17 reads a change-feed page's token from the client's last response headers:
    a scorer's point read completing in another thread just then used to hand the feedback sweep
    that document's ETag as its checkpoint, and every later read failed (UnicodeDecodeError)."""
    from azure.cosmos._change_feed.change_feed_iterable import ChangeFeedIterable

    for i in range(3):
        store.add_episode(make_episode(f"ep-{i}"))
    unpack = ChangeFeedIterable._unpack

    def another_thread_reads_first(self: Any, block: Any) -> Any:
        store.get_episode("ep-0")  # what another thread's request does to the client's last headers
        return unpack(self, block)

    monkeypatch.setattr(ChangeFeedIterable, "_unpack", another_thread_reads_first)
    page = store.read_episodes(None, 2)
    assert [d["id"] for d in page.items] == ["ep-0", "ep-1"]
    rest = store.read_episodes(page.continuation, 10)
    assert [d["id"] for d in rest.items] == ["ep-2"]
    store.get_episode("ep-1")
    empty = store.read_episodes(rest.continuation, 10)
    store.add_episode(make_episode("ep-3"))
    assert empty.items == [] and [d["id"] for d in store.read_episodes(empty.continuation, 10).items] == ["ep-3"]


def test_a_missing_database_or_container_is_a_configuration_error_not_a_missing_document(
    cosmos_database: Any, cosmos_client: Any
) -> None:
    """A mistyped AGENT_LEARNING_COSMOS_DATABASE used to read as "no such document": no policy for
    any agent, and the scorer dead-lettering every episode it had to read as EpisodeNotFound."""
    from agent_learning.core.errors import ConfigurationError

    for database in (cosmos_client.get_database_client("no-such-database"), cosmos_database):  # no containers
        store = CosmosStore(database)
        for call, container in ((lambda s=store: s.get_current_policy("agent-a"), "policies"),
                                (lambda s=store: s.get_current_policy_if_changed("agent-a", '"x"'), "policies"),
                                (lambda s=store: s.get_episode("ep-1"), "episodes"),
                                (lambda s=store: s.list_agents(), "policies")):
            with pytest.raises(ConfigurationError, match=f"no container '{container}' in the database '{database.id}'"):
                call()
    store.ensure_containers()  # once they exist, a missing document is None again
    assert store.get_current_policy("agent-a") is None and store.get_episode("ep-1") is None


def test_connecting_to_an_account_that_cannot_be_reached_is_a_transient_error(cosmos_server: Any) -> None:
    """The client reads the account when it is built: an outage then is the port's error too."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(TransientError, match="unreachable"):
        CosmosStore.connect(f"https://127.0.0.1:{port}/", "agent-learning", key=cosmos_server.key,
                            client_kwargs=CLIENT_KWARGS)
