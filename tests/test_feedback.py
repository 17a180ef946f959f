"""User feedback merged into rewards exactly once, on every store (Cosmos over the wire included).

An episode's learned reward is the sum of its score rows (the judges' score plus every
correction's delta); every test checks it against the reward rule, and checks what the trainer
actually consumed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cosmos_fixture import new_cosmos_store
from factories import make_episode, make_policy_doc

from agent_learning.clock import ManualClock
from agent_learning.documents import Score, correction_doc_id
from agent_learning.errors import InvalidDocument, NotFound
from agent_learning.feedback import reconcile, record_feedback, score_rows
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learner import Batch, LearnerConfig, Reinforce
from agent_learning.pipeline import Scorer, create_policy, load_current, score_episode, train_agent
from agent_learning.rewards import RewardConfig, RewardFunction, judged_reward, with_feedback
from agent_learning.store import MemoryStore, SQLiteStore, Store

AGENT = "agent-a"


@pytest.fixture(params=["memory", "sqlite", "cosmos"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "cosmos":
        s: Store = new_cosmos_store(request)
    else:
        s = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    create_policy(s, make_policy_doc(AGENT))
    yield s
    s.close()


@pytest.fixture
def scorer(store: Store, clock: ManualClock) -> Scorer:
    return Scorer(store, OfflineJudge(), RewardFunction(RewardConfig(feedback_weight=0.5)), clock)


def add_episodes(store: Store, n: int, start: int = 0) -> list[str]:
    ids = [f"ep-{i}" for i in range(start, start + n)]
    for i, eid in zip(range(start, start + n), ids, strict=True):
        store.add_episode(make_episode(eid, action_id=["direct", "step-by-step", "calculator"][i % 3],
                                       probability=1 / 3, output="4" if i % 2 else "The answer is 4."))
    return ids


def learned(store: Store, episode_id: str) -> float:
    rows = score_rows(store, episode_id)
    return rows[0]["reward"] + math.fsum(r["reward_delta"] for r in rows[1:])


def expected(store: Store, episode_id: str, values: list[float]) -> float:
    base = Score.from_dict(store.get_score(episode_id))  # type: ignore[arg-type]
    return with_feedback(base.reward_function, values)[0]


def train(store: Store, clock: ManualClock) -> Any:
    return train_agent(AGENT, store, Reinforce(), clock=clock)


def test_the_rule_blends_feedback_with_the_judged_reward_using_the_stored_weight() -> None:
    fn = RewardFunction(RewardConfig(feedback_weight=0.25))
    reward, info = fn(make_score_metrics(), make_episode())
    assert info.weights["feedback"] == 0.25 and judged_reward(info) == reward
    blended, blended_info = with_feedback(info, [1.0, 0.0])  # two sources: mean 0.5
    assert blended == pytest.approx(0.75 * reward + 0.25 * 0.5)
    assert blended_info.components["feedback"] == 0.5 and blended_info.components["feedback_count"] == 2
    assert with_feedback(info, []) == (reward, info)
    with pytest.raises(ValueError, match="feedback values"):
        with_feedback(info, [1.5])


def make_score_metrics() -> dict[str, Any]:
    judgement = OfflineJudge().judge(make_episode())
    return judgement.metrics


def test_feedback_before_scoring_waits_for_the_scorer_which_applies_it(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    result = record_feedback(store, eid, thumb="down", clock=clock)
    assert result.reconciled.status == "waiting"
    assert store.get_score(eid) is None and store.read_scores(AGENT, None, 10) == []
    outcome = score_episode(eid, scorer, check_existing=False)
    assert outcome.status == "scored" and outcome.score is not None and outcome.score.feedback_pending
    rows = score_rows(store, eid)
    assert [r["revision"] for r in rows] == [0, 1]
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))
    assert rows[1]["reward_delta"] == pytest.approx(-0.5 * rows[0]["reward"])  # 0.5·judged + 0.5·0 − judged
    run = train(store, clock).run
    assert run is not None and (run.episodes, run.metrics["corrections"]) == (1, 1)


def test_feedback_after_scoring_before_training_is_learned_in_the_same_run(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    ids = add_episodes(store, 4)
    for eid in ids:
        score_episode(eid, scorer, check_existing=False)
    result = record_feedback(store, ids[0], score=1.0, clock=clock)
    assert result.reconciled.status == "corrected" and result.reconciled.correction is not None
    assert result.reconciled.correction.id == correction_doc_id(ids[0], 1)
    outcome = train(store, clock)
    assert outcome.status == "published" and outcome.run is not None
    assert (outcome.run.episodes, outcome.run.metrics["corrections"]) == (4, 1)
    assert train(store, clock).status == "no_new_scores"  # nothing is read twice


def test_late_feedback_is_learned_once_with_the_next_episodes(store: Store, scorer: Scorer, clock: ManualClock) -> None:
    first = add_episodes(store, 3)
    for eid in first:
        score_episode(eid, scorer, check_existing=False)
    assert train(store, clock).status == "published"  # the episode's judged reward is learned
    before = load_current(store, AGENT)

    record_feedback(store, first[1], thumb="down", clock=clock)
    waiting = train(store, clock)
    assert waiting.status == "too_few_scores" and "1 feedback corrections" in waiting.reason
    assert load_current(store, AGENT) == before  # a correction alone does not move the policy

    for eid in add_episodes(store, 2, start=3):
        score_episode(eid, scorer, check_existing=False)
    outcome = train(store, clock)
    assert outcome.status == "published" and outcome.run is not None
    assert (outcome.run.episodes, outcome.run.metrics["corrections"]) == (2, 1)
    assert train(store, clock).status == "no_new_scores"
    assert learned(store, first[1]) == pytest.approx(expected(store, first[1], [0.0]))


def test_repeated_and_changed_feedback_never_double_counts(store: Store, scorer: Scorer, clock: ManualClock) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    judged = store.get_score(eid)["reward"]  # type: ignore[index]
    assert record_feedback(store, eid, thumb="up", clock=clock).reconciled.status == "corrected"
    assert record_feedback(store, eid, thumb="up", clock=clock).reconciled.status == "unchanged"
    assert len(score_rows(store, eid)) == 2
    assert learned(store, eid) == pytest.approx(0.5 * judged + 0.5)

    record_feedback(store, eid, thumb="down", clock=clock)  # the same source changes its mind
    record_feedback(store, eid, score=0.5, source="reviewer", clock=clock)  # a second source
    assert [r["revision"] for r in score_rows(store, eid)] == [0, 1, 2, 3]
    assert learned(store, eid) == pytest.approx(0.5 * judged + 0.5 * 0.25)
    assert reconcile(store, eid, clock=clock).status == "unchanged"


def test_racing_reconcilers_write_one_correction(store: Store, scorer: Scorer, clock: ManualClock) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    from agent_learning.documents import Feedback

    store.put_feedback(Feedback.from_dict({"episode_id": eid, "agent_id": AGENT, "source": "user", "thumb": "down",
                                           "received_at": clock.now()}))
    barrier = threading.Barrier(4)
    results: list[str] = []

    def run() -> None:
        barrier.wait(timeout=30)
        results.append(reconcile(store, eid, clock=clock).status)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results).count("corrected") == 1 and len(results) == 4
    assert len(score_rows(store, eid)) == 2
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))


def test_a_redelivery_after_a_crash_before_reconciling_still_applies_the_feedback(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    record_feedback(store, eid, thumb="down", clock=clock)
    store.add_score(score_episode_without_reconcile(eid, scorer))  # the scorer crashed after writing
    assert len(score_rows(store, eid)) == 1
    outcome = score_episode(eid, scorer, check_existing=True)  # the redelivered message
    assert outcome.status == "duplicate"
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))


def score_episode_without_reconcile(eid: str, scorer: Scorer) -> Score:
    from agent_learning.documents import Episode

    episode = Episode.from_dict(scorer.store.get_episode(eid))
    judgement = scorer.judge.judge(episode)
    reward, info = scorer.reward(judgement.metrics, episode)
    return Score(id=eid, episode_id=eid, agent_id=AGENT, action_id=episode.action_id, policy_version=1,
                 probability=episode.probability, metrics=judgement.metrics, judge=judgement.judge, reward=reward,
                 reward_function=info, scored_at=scorer.clock.now())


def test_bad_feedback_names_the_field_and_unknown_episodes_are_not_found(store: Store, clock: ManualClock) -> None:
    (eid,) = add_episodes(store, 1)
    cases = [({"thumb": "sideways"}, "thumb"), ({"score": 1.5}, "score"), ({}, "thumb"),
             ({"thumb": "up", "score": 0.5}, "thumb"), ({"thumb": "up", "source": "bad source!"}, "source")]
    for kwargs, field in cases:
        with pytest.raises(InvalidDocument) as info:
            record_feedback(store, eid, clock=clock, **kwargs)
        assert field in info.value.fields, (kwargs, info.value)
    with pytest.raises(NotFound, match="episode_id"):
        record_feedback(store, "no-such-episode", thumb="up", clock=clock)
    assert store.list_feedback(eid) == []


def test_a_correction_moves_the_gradient_by_its_delta_alone() -> None:
    """g·N for a batch with a correction = g·N without it + w·δ·(e_a − s)/T (no baseline)."""
    rng = np.random.default_rng(3)
    theta = np.array([0.3, -0.2, 0.1])
    actions = rng.integers(0, 3, 40)
    rewards = rng.random(40)
    logged = np.full(40, 1 / 3)
    learner = Reinforce(LearnerConfig(entropy_coef=0.0, normalize_advantages=False))
    g_reg, _ = learner.gradient(theta, Batch.from_arrays(actions, rewards, logged, 3))
    both = Batch.from_arrays([*actions, 1], [*rewards, -0.4], [*logged, 0.25], 3, [False] * 40 + [True])
    g_both, stats = learner.gradient(theta, both)
    s = np.exp(theta) / np.exp(theta).sum()
    w = min(s[1] / 0.25, 5.0)
    np.testing.assert_allclose(g_both * 41, g_reg * 40 + w * -0.4 * (np.eye(3)[1] - s), atol=1e-12)
    assert stats["baseline"] == pytest.approx(learner.weights_and_advantages(theta, Batch.from_arrays(
        actions, rewards, logged, 3))[2]["baseline"])
    update = Reinforce().update(theta, both)
    assert update.metrics["episodes"] == 40 and update.metrics["corrections"] == 1
    assert update.metrics["mean_reward"] == pytest.approx(rewards.mean())
