"""The loop in-process: ``open_local()`` as a user's script uses it, and a ``PolicyClient`` in the
same process that picks up what it publishes at its next choice."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.app import wiring
from agent_learning.app.embedded import FEED_CHECKPOINT, open_local
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConfigurationError
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.sqlite import SQLiteStore


def write_episodes(client: PolicyClient, store: SQLiteStore, clock: ManualClock, n: int) -> None:
    for i in range(n):
        decision = client.choose()
        with EpisodeCapture(store, decision, input=f"question {i}", clock=clock) as run:
            clock.advance(0.2)
            run.end("an answer" if decision.action_id == "good" else "")


def test_run_once_publishes_and_a_client_in_the_process_chooses_from_it_at_once(tmp_path: Path) -> None:
    clock = ManualClock()
    db = tmp_path / "local.db"
    store = SQLiteStore(db)
    create_policy(store, SoftmaxPolicy.from_actions("bot", ["good", "bad"]).to_document(created_at=clock.now()))
    client = PolicyClient(store, "bot", refresh_seconds=30, rng=random.Random(1), clock=clock)
    assert client.choose().version == 1
    write_episodes(client, store, clock, 40)

    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        report = pipeline.run_once()
    assert report.published == {"bot": 2}
    assert client.choose().version == 2  # no clock advance: the notice made it re-read
    assert client.reads_with_transfer == 2

    # A version published elsewhere (another process: no notice here) waits for refresh_seconds.
    current = load_current(store, "bot")
    assert current is not None
    elsewhere = current.model_copy(update={"version": 3, "note": "published by another process"})
    store.replace_current_policy(elsewhere, store.get_current_policy("bot").etag)
    assert client.choose().version == 2
    clock.advance(30)
    assert client.choose().version == 3
    store.close()


def test_open_local_closes_what_it_opened_when_a_later_part_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    open_store = wiring.open_store

    def tracked_store(*args: Any, **kwargs: Any) -> Any:
        store = open_store(*args, **kwargs)
        close = store.close
        store.close = lambda: (closed.append("store"), close())[1]
        return store

    def unreachable_queue(*args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError("AGENT_LEARNING_QUEUE: the queue cannot be reached")

    monkeypatch.setattr(wiring, "open_store", tracked_store)
    monkeypatch.setattr(wiring, "open_queue", unreachable_queue)
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_QUEUE"):
        open_local(path=tmp_path / "local.db")
    assert closed == ["store"]


def test_open_local_on_a_folder_names_the_path_and_the_problem(tmp_path: Path) -> None:
    from agent_learning.queue.sqlite import SQLiteQueue

    folder = tmp_path / "data"
    folder.mkdir()
    expected = f"AGENT_LEARNING_SQLITE_PATH (--db): {folder} is a folder, not a file; name the SQLite file"
    for opening in (lambda: open_local(load_settings(), path=folder), lambda: SQLiteStore(folder),
                    lambda: SQLiteQueue(folder)):
        with pytest.raises(ConfigurationError) as raised:
            opening()
        assert str(raised.value) == expected
    assert list(folder.iterdir()) == []


def test_the_memory_store_feed_goes_on_past_a_page_of_deleted_episodes() -> None:
    """``AGENT_LEARNING_STORE=memory``: a deleted agent's episodes that filled a whole page at the
    head of the feed read as its end, and run_once never enqueued another agent's new ones."""
    clock = ManualClock()
    # 20 episodes: too few for the guardrail to judge (it would hold them); it warns.
    with open_local(load_settings(store="memory", guardrail="warn"), clock=clock) as pipeline:
        for agent in ("gone", "bot"):
            doc = SoftmaxPolicy.from_actions(agent, ["good", "bad"]).to_document(created_at=clock.now())
            create_policy(pipeline.store, doc)
        gone = PolicyClient(pipeline.store, "gone", rng=random.Random(1), clock=clock)
        write_episodes(gone, pipeline.store, clock, pipeline.page_size)
        pipeline.store.delete_agent("gone")
        bot = PolicyClient(pipeline.store, "bot", rng=random.Random(2), clock=clock)
        write_episodes(bot, pipeline.store, clock, 20)
        report = pipeline.run_once()
    assert report.enqueued == 20 and report.published == {"bot": 2}


def test_run_once_refuses_one_agent_id_given_as_a_string(tmp_path: Path) -> None:
    """A string is an iterable of its characters: ``run_once("bot")`` trained no agent, silently."""
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "local.db")
    create_policy(store, SoftmaxPolicy.from_actions("bot", ["good", "bad"]).to_document(created_at=clock.now()))
    write_episodes(PolicyClient(store, "bot", rng=random.Random(1), clock=clock), store, clock, 10)
    # 10 episodes: too few for the guardrail to judge (it would hold them); it warns.
    with open_local(load_settings(guardrail="warn"), path=tmp_path / "local.db", clock=clock) as pipeline:
        with pytest.raises(TypeError, match=r"agent_ids: 'bot' is one string; pass a list of agent ids, \['bot'\]"):
            pipeline.run_once("bot")  # type: ignore[arg-type]
        assert pipeline.store.get_checkpoint(FEED_CHECKPOINT) is None  # refused before any work
        assert pipeline.run_once(["bot"]).published == {"bot": 2}
    store.close()


def test_an_agent_learns_from_its_own_reward_with_no_episode_judged(tmp_path: Path) -> None:
    """500 episodes that carry the agent's own reward (a test passed or not), judging off for every
    agent: each is scored from its reward, no judge is asked, and training moves the policy to
    the configuration whose tests pass more often."""
    clock = ManualClock()
    db = tmp_path / "local.db"
    store = SQLiteStore(db)
    create_policy(store, SoftmaxPolicy.from_actions("coder", ["fast", "careful"]).to_document(created_at=clock.now()))
    client = PolicyClient(store, "coder", refresh_seconds=30, rng=random.Random(2), clock=clock)
    tests_pass = {"fast": 0.4, "careful": 0.8}
    rng = random.Random(3)
    published = []
    with open_local(load_settings(judging="*=0"), path=db, clock=clock) as pipeline:
        for i in range(500):
            decision = client.choose()
            with EpisodeCapture(store, decision, input=f"fix issue {i}", clock=clock) as run:
                clock.advance(0.2)
                run.end("a patch", reward=1.0 if rng.random() < tests_pass[decision.action_id] else 0.0)
            if i % 100 == 99:
                report = pipeline.run_once()
                assert report.outcomes == {"scored": 100}, report.outcomes  # none recorded unjudged
                published.append(report.published.get("coder"))
    assert published == [2, 3, 4, 5, 6]
    scores = store.read_scores("coder", None, 1_000)
    assert len(scores) == 500 and {(s["judge"]["name"], s["reward_function"]["version"]) for s in scores} == {
        ("agent", "agent-reward/1")}
    assert {s["reward"] for s in scores} == {0.0, 1.0}
    assert client.policy().probabilities["careful"] > 0.9


def test_scoring_an_episode_takes_a_bounded_number_of_sql_statements(tmp_path: Path) -> None:
    """Receiving, the duplicate check, the score's write and the completion: at most 9 statements an
    episode on the embedded store and queue, counted as SQLite runs them."""
    clock = ManualClock()
    db = tmp_path / "local.db"
    store = SQLiteStore(db)
    create_policy(store, SoftmaxPolicy.from_actions("bot", ["good", "bad"]).to_document(created_at=clock.now()))
    write_episodes(PolicyClient(store, "bot", rng=random.Random(2), clock=clock), store, clock, 40)
    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        assert pipeline.pump() == 40
        statements: list[str] = []
        for connection in [pipeline.store._conn(), pipeline.queue._connection()]:  # type: ignore[attr-defined]
            connection.set_trace_callback(statements.append)
        assert pipeline.score_pending() == {"scored": 40}
    assert len(statements) / 40 <= 9
    store.close()
