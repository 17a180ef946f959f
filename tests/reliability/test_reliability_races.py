"""Reliability: trainers racing each other and the scorer; scorer instances whose clocks disagree.

Azure runs the timer on one instance at a time through a storage lock, which is not
exactly-once, so two trainers can run at once (on two instances, each with its own store
client). The current document's ETag compare-and-swap must let exactly one of them publish
each version.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("azure.functions")
from faults import AGENT, Agent, FunctionsHost, account, dead_lettered, start_policy
from reliability_report import Backend, record

from agent_learning.app import handlers
from agent_learning.core.clock import ManualClock
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import Scorer, TrainOutcome, score_episode, train_agent
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.store.base import Store

TICKS, PER_TICK = 100, 2


def second_instance(backend: Backend) -> Store:
    """Another instance's own client on the same store (another connection, another seq source)."""
    if backend.kind == "cosmos":
        from agent_learning.store.cosmos import CosmosStore

        return CosmosStore(backend.store.database, clock=backend.store.clock)  # one (stepping) time for both
    from agent_learning.store.sqlite import SQLiteStore

    return SQLiteStore(backend.store.path)


def test_two_trainers_racing_for_100_ticks_publish_each_version_once(backend: Backend) -> None:
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    host = FunctionsHost(backend.store, queue, clock)
    agent = Agent(backend.store, clock)
    settings = host.runtime.settings  # the host's: a guardrail that warns on these small batches
    trainers = [
        handlers.Runtime(settings, store, queue.send, learner=Reinforce(settings.learner_config()),
                         send_train=lambda messages: len(messages))
        for store in (backend.store, second_instance(backend))
    ]
    outcomes: list[TrainOutcome] = []
    lock = threading.Lock()

    def train(rt: handlers.Runtime, start: threading.Barrier) -> None:
        start.wait()
        plan = handlers.train(rt)  # both instances plan the tick, and each trains what it planned
        result = [handlers.train_agent(r.to_message().body, 1, r.message_id, rt) for r in plan.requests]
        with lock:
            outcomes.extend(result)

    for _ in range(TICKS):
        agent.run(PER_TICK)
        host.pump()
        # The scorer works while both trainers run, so scores land in the middle of training runs.
        start = threading.Barrier(3)
        threads = [threading.Thread(target=train, args=(rt, start)) for rt in trainers]
        threads.append(threading.Thread(target=lambda s=start: (s.wait(), host.score())))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    host.score()
    host.tick()  # whatever the last race left behind

    books = account(backend.store, agent.written, dead_lettered(queue))
    published = Counter(o.version for o in outcomes if o.status == "published")
    statuses = Counter(o.status for o in outcomes)
    record("races", backend.kind, faults=TICKS, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert set(statuses) <= {"published", "lost_race", "no_new_scores"}, statuses
    assert published and max(published.values()) == 1, "a version was published twice"
    assert sorted(published) == list(range(2, len(published) + 2))
    assert books.versions >= len(published) + 1
    assert books.lost == 0 and books.double == set() and books.kept == set()


# --------------------------------------------------------------------------- Cosmos DB: the settle window


def _cosmos(database: Any, clock: ManualClock) -> Store:
    from agent_learning.store.cosmos import CosmosStore

    return CosmosStore(database, settle_seconds=60, clock=clock)


def test_a_score_from_a_scorer_whose_clock_lags_lands_after_the_cursor(cosmos_database: Any) -> None:
    """On Cosmos DB a score's ``seq`` is its writer's clock, and the trainer reads only scores
    older than the settle window (60 s). A scorer whose clock is 2 minutes behind would stamp
    its score behind a cursor the trainer has already passed, and it would never be learned
    (before the fix: lost 1). Every instance moves its clock forward to the server's, learned
    from the answers to its writes (one small write before its first score), so the score lands
    after the cursor and is learned."""
    now = time.time()
    trainer_clock = ManualClock(now)
    trainer = _cosmos(cosmos_database, trainer_clock)
    trainer.ensure_containers()  # type: ignore[attr-defined]
    start_policy(trainer, trainer_clock)
    agent = Agent(trainer, trainer_clock)
    early, late = agent.run(2)

    def scorer(clock: ManualClock) -> Scorer:
        return Scorer(_cosmos(cosmos_database, clock), OfflineJudge(), RewardFunction(), clock)

    assert score_episode(early.id, scorer(ManualClock(now))).status == "scored"  # a scorer on time
    trainer_clock.advance(90)  # past the settle window of everything written so far
    first = train_agent(AGENT, trainer, Reinforce(), clock=trainer_clock)
    assert first.status == "published" and first.run is not None and first.run.episodes == 1
    # The server stamps whole seconds; in a real deployment the cursor passed the first score
    # 60 s (the settle window) after it was written, here after a moment: wait past its second.
    time.sleep(1.5)
    assert score_episode(late.id, scorer(ManualClock(now - 120))).status == "scored"  # 2 minutes behind
    trainer_clock.advance(90)
    second = train_agent(AGENT, trainer, Reinforce(), clock=trainer_clock)

    books = account(trainer, agent.written)
    record("races", "cosmos", faults=1, episodes=2, lost=books.lost, double=len(books.double))
    assert second.status == "published" and second.run is not None and second.run.episodes == 1
    assert books.lost == 0 and books.double == set()
