"""Reliability: trainers racing each other and the scorer; scorer instances whose clocks disagree.

Azure runs the timer on one instance at a time through a storage lock, which is not
exactly-once, so two trainers can run at once (on two instances, each with its own store
client). The current document's ETag compare-and-swap must let exactly one of them publish
each version.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("azure.functions")
from faults import AGENT, Agent, FunctionsHost, account, dead_lettered, start_policy
from reliability_report import Backend, record

from agent_learning import functions as handlers
from agent_learning.clock import ManualClock
from agent_learning.config import load_settings
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learner import Reinforce
from agent_learning.pipeline import Scorer, TrainOutcome, score_episode, train_agent
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.store.base import Store

TICKS, PER_TICK = 100, 2


def second_instance(backend: Backend) -> Store:
    """Another instance's own client on the same store (another connection, another seq source)."""
    if backend.kind == "cosmos":
        from agent_learning.store.cosmos import CosmosStore

        return CosmosStore(backend.store.database, settle_seconds=0)
    from agent_learning.store.sqlite import SQLiteStore

    return SQLiteStore(backend.store.path)


def test_two_trainers_racing_for_100_ticks_publish_each_version_once(backend: Backend) -> None:
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    host = FunctionsHost(backend.store, queue, clock)
    agent = Agent(backend.store, clock)
    settings = load_settings(store="memory", queue="sqlite")
    trainers = [
        handlers.Runtime(settings, store, queue.send, learner=Reinforce(settings.learner_config()))
        for store in (backend.store, second_instance(backend))
    ]
    outcomes: list[TrainOutcome] = []
    lock = threading.Lock()

    def train(rt: handlers.Runtime, start: threading.Barrier) -> None:
        start.wait()
        result = handlers.train(rt)
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


def _cosmos(database: Any, clock: ManualClock, settle_seconds: float) -> Store:
    from agent_learning.store.cosmos import CosmosStore

    return CosmosStore(database, settle_seconds=settle_seconds, clock=clock)


@pytest.mark.parametrize("settle_seconds", [60.0, 0.0])
def test_a_late_score_from_a_lagging_scorer_is_not_skipped_within_the_settle_window(
    cosmos_database: Any, settle_seconds: float
) -> None:
    """On Cosmos DB a score's ``seq`` is its scorer's clock, so a score from an instance whose
    clock lags (or whose write was slow) can carry a smaller ``seq`` than one written before it.
    The trainer reads only scores older than the settle window, which the late one joins in time.
    With no window (the control case) the trainer's cursor passes it and it is never learned."""
    trainer_clock = ManualClock()
    trainer = _cosmos(cosmos_database, trainer_clock, settle_seconds)
    trainer.ensure_containers()  # type: ignore[attr-defined]
    start_policy(trainer, trainer_clock)
    agent = Agent(trainer, trainer_clock)
    early, late = agent.run(2)
    now = trainer_clock.time()

    def scorer(clock: ManualClock) -> Scorer:
        return Scorer(_cosmos(cosmos_database, clock, settle_seconds), OfflineJudge(), RewardFunction(), clock)

    trainer_clock.advance(5)
    assert score_episode(late.id, scorer(ManualClock(now + 5))).status == "scored"  # seq: now + 5 s
    first = train_agent(AGENT, trainer, Reinforce(), clock=trainer_clock)
    # An instance whose clock is 5 s behind (or whose write took 5 s) stores the other score now,
    # with seq: now.
    assert score_episode(early.id, scorer(ManualClock(now))).status == "scored"
    trainer_clock.advance(61)
    train_agent(AGENT, trainer, Reinforce(), clock=trainer_clock)

    books = account(trainer, agent.written)
    if settle_seconds:
        record("races", "cosmos", faults=1, episodes=2, lost=books.lost, double=len(books.double))
        assert first.status == "no_new_scores"  # nothing had settled yet
        assert books.lost == 0 and books.double == set()
    else:
        assert first.status == "published"
        # The control: without the window the late score lands behind the cursor, never learned.
        assert books.lost == 1 and books.late == 1
