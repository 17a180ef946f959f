"""Reliability: every delivery happens three times.

Each change-feed batch reaches ``enqueue`` three times (with duplicate detection out of the
way, so three copies of every message reach the queue), each copy reaches ``score`` three
times (the completion is lost twice; copies run concurrently on three workers) and each
timer tick fires three times. Scores must be exactly a single clean run's, and each episode
must feed exactly one policy update.
"""

from __future__ import annotations

import pytest

pytest.importorskip("azure.functions")

import numpy as np
from faults import (
    AGENT,
    Agent,
    Deliveries,
    FunctionsHost,
    account,
    dead_lettered,
    differences,
    judged_content,
    reference,
    run_rounds,
    start_policy,
)
from reliability_report import Backend, record

from agent_learning.core.clock import ManualClock
from agent_learning.pipeline import load_current
from agent_learning.queue.sqlite import SQLiteQueue

ROUNDS, PER_ROUND = 3, 20


def test_triple_deliveries_give_identical_scores_and_one_update_per_episode(backend: Backend) -> None:
    clock = ManualClock()
    start_policy(backend.store, clock)
    # A duplicate-detection window shorter than the gap between redeliveries: every copy gets in.
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock, duplicate_window_seconds=0.5)
    host = FunctionsHost(backend.store, queue, clock, deliveries=Deliveries(feed=3, message=3, timer=3), workers=3)
    agent = Agent(backend.store, clock)
    run_rounds(host, agent, ROUNDS, PER_ROUND)

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("duplicates", backend.kind, faults=host.faults, episodes=len(agent.written), lost=books.lost,
           double=len(books.double), kept=len(books.kept))
    episodes = len(agent.written)
    assert host.events["redelivered batch"] >= 2 * ROUNDS
    assert host.events["ack lost"] == 2 * 3 * episodes  # three copies, each delivered three times
    assert host.events["repeated tick"] == 2 * (ROUNDS + 1)
    assert books.lost == 0 and books.double == set() and books.kept == set()
    assert books.versions == ROUNDS + 1  # the repeated ticks published nothing

    clean = reference(ROUNDS, PER_ROUND)
    scores = {s["id"]: judged_content(s) for s in backend.store.read_scores(AGENT, None, 10_000)}
    assert differences(scores, {i: judged_content(s) for i, s in clean.scores.items()}) == []
    current = load_current(backend.store, AGENT)
    assert current is not None
    np.testing.assert_allclose(current.logits, clean.logits, rtol=0, atol=1e-9)
    # Copies judged concurrently may each call the judge; redeliveries find the stored score.
    assert episodes <= host.judge.calls <= 3 * episodes


def test_a_replay_storm_judges_each_episode_once(backend: Backend) -> None:
    """Every message reaches the queue twice, each copy as a first delivery (the duplicate-detection
    window had passed, as after a dead-letter replay or a change-feed rewind): the copy finds the
    stored score before any judge is called."""
    clock = ManualClock()
    start_policy(backend.store, clock)
    queue = SQLiteQueue(backend.path / "queue.db", clock=clock, duplicate_window_seconds=0.5)
    host = FunctionsHost(backend.store, queue, clock, deliveries=Deliveries(feed=2))
    agent = Agent(backend.store, clock)
    run_rounds(host, agent, ROUNDS, PER_ROUND)

    books = account(backend.store, agent.written, dead_lettered(queue))
    record("duplicates: replay storm", backend.kind, faults=host.faults, episodes=len(agent.written),
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert host.events["redelivered batch"] >= ROUNDS and host.events["ack lost"] == 0
    assert host.judge.calls == len(agent.written)
    assert books.lost == 0 and books.double == set() and books.versions == ROUNDS + 1
