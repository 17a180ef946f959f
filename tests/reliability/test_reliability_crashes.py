"""Reliability: a crash at every step boundary of every handler, then a restart or redelivery.

The host retries what Azure retries: a change-feed batch whose function did not finish is
delivered again (the lease had not moved), a message whose function crashed comes back when
its lock expires, and a training tick that crashed runs again (the timer's past-due run after
the host restarts). Afterwards no episode may be lost, none learned from twice, and, because
the data and the math are the same, the final policy must equal a crash-free run's.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("azure.functions")
from adapters import only_on
from faults import (
    AGENT,
    Agent,
    Crash,
    FaultyStore,
    FunctionsHost,
    Injector,
    account,
    dead_lettered,
    reference,
    run_rounds,
    start_policy,
)
from reliability_report import Backend, record

from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import ManualClock
from agent_learning.documents import PolicyDocument, Score, TrainingRun, run_doc_id
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.admin import rollback, set_pinned
from agent_learning.pipeline import load_current
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction, with_feedback
from agent_learning.rewards.feedback import score_rows

ROUNDS, PER_ROUND = 3, 20

CRASH_POINTS = {
    # enqueue: the Cosmos DB change-feed trigger
    "enqueue: before sending the batch": "send:before",
    "enqueue: mid-batch, half of it sent": "send:mid",
    "enqueue: batch sent, lease not moved": "send:after",
    # score: the Service Bus trigger
    "score: before judging": "judge:before",
    "score: reading the episode's policy version": "get_policy_version:before",
    "score: judged, score not stored": "judge:after",
    "score: storing the score": "add_score:before",
    "score: score stored, message not acknowledged": "add_score:after",
    "score: function returned, completion lost": "complete:before",
    # train: the timer
    "train: reading the current policy": "get_current_policy:before",
    "train: checking the last version's records": "get_run:before",
    "train: scores read, nothing published": "read_scores:after",
    "train: before the compare-and-swap publish": "replace_current_policy:before",
    "train: published, version record not written": "replace_current_policy:after",
    "train: writing the version record": "create_policy_version:before",
    "train: version record written, run record not": "create_policy_version:after",
    "train: writing the run record": "put_run:before",
    "train: run record written": "put_run:after",
}


def run_with_crashes(backend: Backend, points: dict[str, int], scenario: str) -> None:
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    injector = Injector(points)
    host = FunctionsHost(backend.store, queue, clock, injector=injector)
    agent = Agent(backend.store, clock)
    run_rounds(host, agent, ROUNDS, PER_ROUND)

    books = account(backend.store, agent.written, dead_lettered(queue))
    record(scenario, backend.kind, faults=host.faults, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert injector.total >= 2, f"crash points {sorted(points)} were reached only {dict(injector.calls)} times"
    assert set(injector.injected) == set(points), f"no crash at {sorted(set(points) - set(injector.injected))}"
    assert books.lost == 0 and books.double == set()
    assert books.kept == set()  # nothing was bad: a crash never makes an episode look poisonous
    assert books.versions == ROUNDS + 1
    current = load_current(backend.store, AGENT)
    assert current is not None
    np.testing.assert_allclose(current.logits, reference(ROUNDS, PER_ROUND).logits, rtol=0, atol=1e-9)
    queue.close()


@only_on("durable_store", "sqlite")  # over the wire: every point crashes in the next test
@pytest.mark.parametrize("point", list(CRASH_POINTS.values()), ids=list(CRASH_POINTS))
def test_a_crash_at_each_step_boundary_loses_nothing_and_counts_nothing_twice(backend: Backend, point: str) -> None:
    run_with_crashes(backend, {point: 2}, "crashes")


def test_crashes_at_every_boundary_at_once(backend: Backend) -> None:
    """Each of the points crashes, on every store: the one-point-at-a-time runs over the wire."""
    run_with_crashes(backend, dict.fromkeys(CRASH_POINTS.values(), 3), "crashes (all points at once)")


def crash_after_publishing_v2(backend: Backend) -> tuple[ManualClock, SQLiteQueue, FunctionsHost, Agent]:
    """The trainer publishes v2 and dies before writing its records; the agent then logs a
    round of episodes under v2 (it reads the current document)."""
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    host = FunctionsHost(backend.store, queue, clock, injector=Injector({"replace_current_policy:after": 2}))
    agent = Agent(backend.store, clock)
    agent.run(PER_ROUND)
    host.pump()
    host.score()
    with pytest.raises(Crash):
        host.tick(retry=False)
    assert backend.store.get_policy_version(AGENT, 2) is None
    episodes = agent.run(PER_ROUND)
    assert {e.policy_version for e in episodes} == {2}
    return clock, queue, host, agent


def test_episodes_under_a_version_whose_record_a_crash_left_unwritten_are_scored(backend: Backend) -> None:
    """The trainer publishes the current document first and writes the version record after it.
    Agents read the current document, so they can log episodes under the new version before its
    record exists, for as long as a crash leaves it unwritten (until the next tick repairs it)."""
    _, queue, host, agent = crash_after_publishing_v2(backend)
    host.pump()
    host.score()
    host.tick()  # the next tick repairs version 2's records and trains on the new episodes

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("crashes", backend.kind, faults=host.injector.total, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    assert dead_lettered(queue) == set(), [(d.reason, d.description) for d in queue.dead_letters()]
    assert books.lost == 0 and books.double == set() and books.versions == 3


@pytest.mark.parametrize("intervention", ["rollback", "pin"])
def test_a_rollback_or_pin_after_a_crash_before_the_records_keeps_the_crashed_version(
    backend: Backend, intervention: str
) -> None:
    """The trainer dies after publishing v2, before writing its records; agents log episodes
    under v2; an operator rolls back (or pins) before the next tick. The intervention writes
    v2's records before it replaces v2, so those episodes score and are learned. Before the fix
    the rollback published v3 over v2, v2 was never written, and its episodes were
    dead-lettered ``UnknownPolicyVersion``. (A pin keeps the version, and wrote v2's records
    after its swap already; it is checked here as the other writer of the current document.)"""
    clock, queue, host, _ = crash_after_publishing_v2(backend)
    if intervention == "rollback":
        assert rollback(backend.store, AGENT, 1, clock=clock).policy.version == 3
    else:
        assert set_pinned(backend.store, AGENT, True, "investigating").policy.version == 2
    raw = backend.store.get_policy_version(AGENT, 2)
    assert raw is not None
    v2 = PolicyDocument.from_dict(raw)
    assert v2.run is not None and TrainingRun.from_dict(backend.store.get_run(run_doc_id(AGENT, 2))) == v2.run
    host.pump()
    host.score()
    assert dead_lettered(queue) == set(), [(d.reason, d.description) for d in queue.dead_letters()]
    if intervention == "pin":
        set_pinned(backend.store, AGENT, False)
    host.tick()
    current = load_current(backend.store, AGENT)
    assert current is not None and current.run is not None
    assert current.run.episodes == PER_ROUND and current.run.cursor_from == v2.cursor  # the v2 episodes, once


# A restarted runner receives again every message the dead one held locked (a batch of up to
# 100), one more delivery each, so crashing on every other score would exhaust MaxDeliveryCount
# for messages never even tried: the scoring crash points fire every 8th time.
EMBEDDED_CRASH_POINTS = {
    "pump: batch read, nothing sent": {"read_episodes:after": 2},
    "pump: batch sent, checkpoint not saved": {"set_checkpoint:before": 2},
    "score: score stored, message not settled": {"add_score:after": 8},
    "score: checking a redelivered message": {"add_score:after": 8, "get_score:before": 8},
    "train: published, records not written": {"replace_current_policy:after": 2},
    "train: writing the run record": {"put_run:before": 2},
}


@pytest.mark.parametrize("points", list(EMBEDDED_CRASH_POINTS.values()), ids=list(EMBEDDED_CRASH_POINTS))
def test_the_embedded_runner_restarted_after_a_crash_loses_nothing(backend: Backend, points: dict[str, int]) -> None:
    """The local runner (``agent-learn train``) crashes and is started again on the same files:
    its feed checkpoint, the queue's locks and the idempotent handlers carry it through."""
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    injector = Injector(points)
    agent = Agent(backend.store, clock)

    def start() -> LocalPipeline:
        return LocalPipeline(FaultyStore(backend.store, injector), queue, OfflineJudge(), RewardFunction(),
                             Reinforce(), clock=clock)

    pipeline = start()
    restarts = 0
    for _ in range(ROUNDS):
        agent.run(PER_ROUND)
        while True:
            try:
                pipeline.run_once()
                break
            except Crash:
                restarts += 1
                clock.advance(queue.lock_seconds + 1)  # what the dead process held is released
                pipeline = start()
    pipeline.train()

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("crashes (embedded runner)", backend.kind, faults=injector.total, episodes=len(agent.written),
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert restarts == injector.total >= 2
    assert books.lost == 0 and books.double == set() and books.kept == set() and books.versions == ROUNDS + 1
    current = load_current(backend.store, AGENT)
    assert current is not None
    np.testing.assert_allclose(current.logits, reference(ROUNDS, PER_ROUND).logits, rtol=0, atol=1e-9)


def test_feedback_whose_handler_died_after_storing_it_is_applied_once_by_the_next_tick(backend: Backend) -> None:
    """The feedback function stores the feedback, then dies before applying it (before the reward
    is reconciled, or the unscored episode's marker is left). The next training tick's sweep
    applies it, once, on an episode already learned from and on one not scored yet alike."""
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock)
    injector = Injector({"put_feedback:after": 2})  # the 1st and 3rd post die after storing
    host = FunctionsHost(backend.store, queue, clock, injector=injector)
    agent = Agent(backend.store, clock)
    agent.run(PER_ROUND)
    host.cycle()
    learned_from = agent.written[0]
    unscored, other = (e.id for e in agent.run(PER_ROUND)[:2])
    with pytest.raises(Crash):
        host.post_feedback(learned_from, {"thumb": "down"})
    assert host.post_feedback(other, {"thumb": "down"}, key="another-key") == 202  # a post that does not die
    with pytest.raises(Crash):
        host.post_feedback(unscored, {"thumb": "down"})
    assert injector.total == 2

    host.cycle()  # pump, score, then the tick: sweep, train
    for _ in range(2):
        host.tick()  # later sweeps find nothing left to do
    for episode_id in (learned_from, other, unscored):
        rows = score_rows(backend.store, episode_id, AGENT)
        assert [r["revision"] for r in rows] == [0, 1], episode_id
        expected = with_feedback(Score.from_dict(rows[0]).reward_function, [0.0])[0]
        assert rows[0]["reward"] + rows[1]["reward_delta"] == pytest.approx(expected)
    current = load_current(backend.store, AGENT)
    assert current is not None and current.run is not None
    assert (current.run.episodes, current.run.corrections) == (PER_ROUND, 3)

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("crashes: feedback stored, not applied", backend.kind, faults=injector.total,
           episodes=len(agent.written), lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert books.lost == 0 and books.double == set() and books.versions == 3
