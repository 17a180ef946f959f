"""Reliability: the judge fails for a while (500s, 429s, hangs, garbage), then recovers.

The scoring queue has Service Bus semantics: a transient failure is redelivered until
MaxDeliveryCount and then dead-lettered; invalid judge output after every attempt is
dead-lettered at once by the embedded runner (the Functions app fails it fast on every
delivery, so Service Bus dead-letters it after MaxDeliveryCount). After the outage the dead
letters are replayed (``agent_learning.ops.recovery``): every episode is scored in the end, except
the poison ones, which stay in the dead-letter queue with their reason. No failure ever
becomes a score, and no judge call outlives its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.functions")
from faults import AGENT, Agent, FaultyJudge, FunctionsHost, OutageJudge, account, dead_lettered, start_policy
from reliability_report import Backend, record

from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import SYSTEM_CLOCK, ManualClock
from agent_learning.judges.evaluators import EvaluatorJudge, JudgeLimits, JudgeModel
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.recovery import replay_dead_letters
from agent_learning.queue.base import MAX_DELIVERY_COUNT_EXCEEDED
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(120)

LIMITS = JudgeLimits(attempt_timeout=1.0, evaluator_deadline=1.5, episode_deadline=2.0, max_attempts=2,
                     backoff_base=0.02, backoff_max=0.05, retry_after_cap=0.1)
SLACK = 1.0  # scheduling and client start-up on top of the deadline
MAX_DELIVERIES = 3
# (mode of the judge server, deliveries it lasts). Messages are delivered oldest first and an
# abandoned one comes straight back, so the first message takes the 500s until it is
# dead-lettered, the second the 429s and a hang, the third the garbage.
OUTAGE = [("http_500", MAX_DELIVERIES), ("rate_limit:0.05", MAX_DELIVERIES - 1), ("hang", 1), ("non_json", 1)]
POISON = {
    "poison-filtered": "4 [judge:fault=content_filter@task_completion]",
    "poison-garbage": "4 [judge:fault=non_json@intent_resolution]",
}


def evaluator_judge(server: Any, limits: JudgeLimits = LIMITS) -> EvaluatorJudge:
    return EvaluatorJudge(JudgeModel(base_url=server.base_url, model=server.model, api_key="test-key"), limits)


@pytest.fixture
def sqlite_store(tmp_path: Any) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "store.db")
    yield store
    store.close()


def test_a_judge_outage_then_recovery_scores_every_episode_once(
    sqlite_store: SQLiteStore, judge_server: Any, tmp_path: Any
) -> None:
    """The real evaluators; the failure modes do not depend on the store, so this runs on SQLite."""
    clock = ManualClock()
    store = sqlite_store
    start_policy(store, clock)
    queue = SQLiteQueue(tmp_path / "queue.db", clock=clock, max_deliveries=MAX_DELIVERIES)
    judge = FaultyJudge(evaluator_judge(judge_server))
    pipeline = LocalPipeline(store, queue, judge, RewardFunction(), Reinforce(), clock=clock)
    agent = Agent(store, clock)
    agent.run(6)
    for episode_id, output in POISON.items():
        agent.answer(output, episode_id)
    pipeline.pump()

    for mode, deliveries in OUTAGE:
        judge_server.set_mode(mode)
        pipeline.score_pending(max_messages=deliveries, receive_batch=1)
    failed = dead_lettered(queue)
    assert [d.reason for d in queue.dead_letters()] == [MAX_DELIVERY_COUNT_EXCEEDED] * 2 + ["JudgeFailed"]
    assert all(store.get_score(i, AGENT) is None for i in failed)  # a failed judgement never becomes a score

    judge_server.reset()
    pipeline.score_pending()  # the judge is back: the rest is scored, the poison is dead-lettered
    pipeline.train()
    replayed = replay_dead_letters(queue, reasons=[MAX_DELIVERY_COUNT_EXCEEDED, "JudgeFailed"])
    assert set(replayed.replayed) == failed | set(POISON)
    pipeline.score_pending()
    pipeline.train()

    faults = sum(1 for r in judge_server.requests if r.behaviour.kind != "normal")
    books = account(store, agent.written, dead_lettered(queue))
    record("judge outages", "sqlite", faults=faults, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set()
    assert books.kept == set(POISON)
    letters = {d.message_id: d for d in queue.dead_letters()}
    assert {d.reason for d in letters.values()} == {"JudgeFailed"}
    assert "content filter" in letters["poison-filtered"].description
    assert "IntentResolution" in letters["poison-garbage"].description
    assert max(judge.durations) < LIMITS.episode_deadline + SLACK
    # Every metric of every score came from a normal answer of the judge, none from a failure.
    for row in store.read_scores(AGENT, None, 1000):
        assert all(m["reason"].endswith("from hash of the response.") for m in row["metrics"].values()), row


def test_an_outage_on_the_functions_path_dead_letters_then_replays(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """The Functions app fails a message on every delivery while the judge is down; the queue
    dead-letters it after MaxDeliveryCount. Replayed once the judge is back, it is scored; a
    poison episode fails fast again, its reason logged at every delivery."""
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock, max_deliveries=MAX_DELIVERIES)
    judge = OutageJudge()
    host = FunctionsHost(backend.store, queue, clock, judge=judge)
    agent = Agent(backend.store, clock)
    agent.run(10)
    poison = agent.answer("4", "poison-action")
    backend.put_raw("episodes", {**poison.to_dict(), "id": "poison-unknown-action", "action_id": "teleport"})
    host.pump()

    judge.mode = "unavailable"
    with caplog.at_level(logging.WARNING, logger="agent_learning.app.handlers"):
        host.score()
    assert dead_lettered(queue) == {*agent.written, "poison-unknown-action"}
    assert {d.reason for d in queue.dead_letters()} == {MAX_DELIVERY_COUNT_EXCEEDED}
    poisoned = [r for r in caplog.records if "poison-unknown-action" in r.getMessage()]
    assert len(poisoned) == MAX_DELIVERIES and all("UnknownAction" in r.getMessage() for r in poisoned)

    judge.mode = "up"
    assert len(replay_dead_letters(queue).replayed) == len(agent.written) + 1
    host.score()
    host.tick()

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("judge outages", backend.kind, faults=judge.failures, episodes=len(agent.written) + 1,
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set() and books.kept == {"poison-unknown-action"}


def test_a_judge_slower_than_the_message_lock_does_not_stop_the_embedded_runner(
    sqlite_store: SQLiteStore, judge_server: Any, tmp_path: Any
) -> None:
    """A judgement that outlasts its message's lock: the completion finds the lock lost. The
    runner must carry on (the message comes back, and the stored score makes it a duplicate)."""
    clock = ManualClock()
    start_policy(sqlite_store, clock)
    queue = SQLiteQueue(tmp_path / "queue.db", lock_seconds=0.3, clock=SYSTEM_CLOCK)
    slow = JudgeLimits(attempt_timeout=5, evaluator_deadline=5, episode_deadline=5, max_attempts=1)
    pipeline = LocalPipeline(sqlite_store, queue, evaluator_judge(judge_server, slow), RewardFunction(), Reinforce())
    agent = Agent(sqlite_store, clock)
    agent.run(3)
    pipeline.pump()
    judge_server.set_mode("hang:0.5")  # every answer takes 0.5 s, longer than the 0.3 s lock
    for _ in range(10):
        pipeline.score_pending()
        if queue.counts().active == 0:
            break
    pipeline.train()

    books = account(sqlite_store, agent.written, dead_lettered(queue))
    record("judge outages", "sqlite", faults=3, episodes=3, lost=books.lost, double=len(books.double))
    assert books.lost == 0 and books.double == set() and books.kept == set()
