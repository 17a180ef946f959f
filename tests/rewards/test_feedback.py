"""User feedback merged into rewards exactly once, on every store (Cosmos over the wire included).

An episode's learned reward is the sum of its score rows (the judges' score plus every
correction's delta); every test checks it against the reward rule, and checks what the trainer
actually consumed.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import numpy as np
import pytest
from factories import CountingStore, make_episode, make_policy_doc

from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import InvalidDocument, NotFound
from agent_learning.documents import (
    Episode,
    Feedback,
    JudgeInfo,
    MetricScore,
    Score,
    correction_doc_id,
    legacy_correction_doc_id,
)
from agent_learning.judges.base import Judge, Judgement
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Batch, LearnerConfig, Reinforce, flat_inputs, gradient
from agent_learning.ops.recovery import rescore
from agent_learning.pipeline import Scorer, create_policy, load_current, score_episode, score_message, train_agent
from agent_learning.rewards import (
    INTENT_RESOLUTION,
    TASK_ADHERENCE,
    TASK_COMPLETION,
    RewardConfig,
    RewardFunction,
    judged_reward,
    with_feedback,
)
from agent_learning.rewards.feedback import reconcile, record_feedback, score_rows, sweep
from agent_learning.store import Store

AGENT = "agent-a"


@pytest.fixture
def store(store: Store) -> Store:
    """Every store adapter in turn (tests/support/adapters.py), holding the agent's policy."""
    create_policy(store, make_policy_doc(AGENT))
    return store


@pytest.fixture
def scorer(store: Store, clock: ManualClock) -> Scorer:
    return Scorer(store, OfflineJudge(), RewardFunction(RewardConfig(feedback_weight=0.5)), clock)


def add_episodes(store: Store, n: int, start: int = 0, ids: list[str] | None = None) -> list[str]:
    ids = ids or [f"ep-{i}" for i in range(start, start + n)]
    for i, eid in zip(range(start, start + n), ids, strict=True):
        store.add_episode(make_episode(eid, action_id=["direct", "step-by-step", "calculator"][i % 3],
                                       probability=1 / 3, output="4" if i % 2 else "The answer is 4."))
    return ids


def learned(store: Store, episode_id: str) -> float:
    rows = score_rows(store, episode_id, AGENT)
    return rows[0]["reward"] + math.fsum(r["reward_delta"] for r in rows[1:])


def expected(store: Store, episode_id: str, values: list[float]) -> float:
    base = Score.from_dict(store.get_score(episode_id, AGENT))  # type: ignore[arg-type]
    return with_feedback(base.reward_function, values)[0]


def train(store: Store, clock: ManualClock) -> Any:
    return train_agent(AGENT, store, Reinforce(), clock=clock)


def consumed(store: Store) -> dict[str, float]:
    """Per episode, what the trainer learns from its score rows: the judges' reward plus the deltas."""
    totals: dict[str, float] = {}
    for row in store.read_scores(AGENT, None, 100_000):
        value = row["reward_delta"] if row["revision"] else row["reward"]
        totals[row["episode_id"]] = totals.get(row["episode_id"], 0.0) + value
    return totals


class ConstantJudge(Judge):
    """Every metric normalised to ``value``: without penalties, the judged reward is exactly that."""

    def __init__(self, value: float) -> None:
        self.value = value

    def judge(self, episode: Episode) -> Judgement:
        metric = MetricScore(raw=3.0, normalised=self.value, evaluator="constant", evaluator_version="1")
        return Judgement(dict.fromkeys((INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION), metric),
                         JudgeInfo(name="constant", model="none"))


def constant_scorer(store: Store, clock: ManualClock, judged: float, feedback_weight: float) -> Scorer:
    """A scorer whose judged reward is ``judged`` and whose rule blends feedback in with ``feedback_weight``."""
    return Scorer(store, ConstantJudge(judged), RewardFunction(RewardConfig(feedback_weight=feedback_weight)), clock)


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
    assert store.get_score(eid, AGENT) is None and store.read_scores(AGENT, None, 10) == []
    outcome = score_episode(eid, scorer, check_existing=False)
    assert outcome.status == "scored" and outcome.score is not None and outcome.score.feedback_pending
    rows = score_rows(store, eid, AGENT)
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


def test_a_run_reports_the_mean_reward_it_learned_feedback_included(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    """Feedback carrying the agent's real reward is part of what the run reports (policy show's
    "last run ... mean reward"), not only the judges' score."""
    ids = add_episodes(store, 4)
    for eid, value in zip(ids[:3], (0.0, 0.25, 1.0), strict=True):
        record_feedback(store, eid, score=value, clock=clock)
    for eid in ids:
        score_episode(eid, scorer, check_existing=False)
    run = train(store, clock).run
    assert run is not None and (run.episodes, run.corrections) == (4, 3)
    rewards = [learned(store, eid) for eid in ids]
    assert run.metrics["mean_reward"] == pytest.approx(np.mean(rewards))
    assert run.metrics["episode_reward_std"] == pytest.approx(np.std(rewards))
    judged = [Score.from_dict(store.get_score(eid, AGENT)).reward for eid in ids]  # type: ignore[arg-type]
    assert abs(np.mean(judged) - np.mean(rewards)) > 0.05  # what the run said before


def test_late_feedback_is_learned_by_the_next_run_or_with_the_episodes_it_waits_beside(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    first = add_episodes(store, 3)
    for eid in first:
        score_episode(eid, scorer, check_existing=False)
    assert train(store, clock).status == "published"  # the episode's judged reward is learned

    record_feedback(store, first[1], thumb="down", clock=clock)  # no new episode comes after it
    alone = train(store, clock)
    assert alone.status == "published" and alone.run is not None
    assert (alone.run.episodes, alone.run.metrics["corrections"]) == (0, 1)
    assert train(store, clock).status == "no_new_scores"
    assert learned(store, first[1]) == pytest.approx(expected(store, first[1], [0.0]))

    record_feedback(store, first[1], thumb="up", clock=clock)  # beside too few new episodes: it waits with them
    for eid in add_episodes(store, 2, start=3):
        score_episode(eid, scorer, check_existing=False)
    before = load_current(store, AGENT)
    waiting = train_agent(AGENT, store, Reinforce(), clock=clock, min_batch=3)
    assert waiting.status == "too_few_scores" and "1 feedback corrections" in waiting.reason
    assert load_current(store, AGENT) == before
    for eid in add_episodes(store, 1, start=5):
        score_episode(eid, scorer, check_existing=False)
    outcome = train_agent(AGENT, store, Reinforce(), clock=clock, min_batch=3)
    assert outcome.status == "published" and outcome.run is not None
    assert (outcome.run.episodes, outcome.run.metrics["corrections"]) == (3, 1)
    assert learned(store, first[1]) == pytest.approx(expected(store, first[1], [1.0]))


def test_repeated_and_changed_feedback_never_double_counts(store: Store, scorer: Scorer, clock: ManualClock) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    judged = store.get_score(eid, AGENT)["reward"]  # type: ignore[index]
    assert record_feedback(store, eid, thumb="up", clock=clock).reconciled.status == "corrected"
    assert record_feedback(store, eid, thumb="up", clock=clock).reconciled.status == "unchanged"
    assert len(score_rows(store, eid, AGENT)) == 2
    assert learned(store, eid) == pytest.approx(0.5 * judged + 0.5)

    record_feedback(store, eid, thumb="down", clock=clock)  # the same source changes its mind
    record_feedback(store, eid, score=0.5, source="reviewer", clock=clock)  # a second source
    assert [r["revision"] for r in score_rows(store, eid, AGENT)] == [0, 1, 2, 3]
    assert learned(store, eid) == pytest.approx(0.5 * judged + 0.5 * 0.25)
    assert reconcile(store, eid, AGENT, clock=clock).status == "unchanged"


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
        results.append(reconcile(store, eid, AGENT, clock=clock).status)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results).count("corrected") == 1 and len(results) == 4
    assert len(score_rows(store, eid, AGENT)) == 2
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))


def test_a_redelivery_after_a_crash_before_reconciling_still_applies_the_feedback(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    record_feedback(store, eid, thumb="down", clock=clock)
    store.add_score(score_episode_without_reconcile(eid, scorer))  # the scorer crashed after writing
    assert len(score_rows(store, eid, AGENT)) == 1
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


@pytest.mark.parametrize(("episode_id", "kwargs", "field"), [
    ("EP", {"score": 2}, "score"),
    ("EP", {"score": float("nan")}, "score"),
    ("EP", {"thumb": "up", "source": "bad source"}, "source"),
    ("", {"thumb": "up"}, "episode_id"),
])
def test_bad_feedback_names_the_field_given_once_not_the_fields_derived_from_it(
    store: Store, clock: ManualClock, episode_id: str, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidDocument) as info:
        record_feedback(store, episode_id, clock=clock, **kwargs)
    assert info.value.fields == [field], info.value
    assert "pattern" not in str(info.value)


def test_a_correction_moves_the_gradient_by_its_delta_alone() -> None:
    """g·N for a batch with a correction = g·N without it + w·δ·(e_a − s)/T (no baseline)."""
    rng = np.random.default_rng(3)
    theta = np.array([0.3, -0.2, 0.1])
    actions = rng.integers(0, 3, 40)
    rewards = rng.random(40)
    logged = np.full(40, 1 / 3)
    learner = Reinforce(LearnerConfig(entropy_coef=0.0, normalize_advantages=False))

    def flat_gradient(batch: Batch) -> tuple[np.ndarray, dict[str, float]]:
        model, params, rows = flat_inputs(theta, batch)
        w, adv, stats = learner.weights_and_advantages(params, model, rows)
        return gradient(params, model, rows, w, adv, 0.0).theta, stats

    g_reg, regular = flat_gradient(Batch.from_arrays(actions, rewards, logged, 3))
    both = Batch.from_arrays([*actions, 1], [*rewards, -0.4], [*logged, 0.25], 3, [False] * 40 + [True])
    g_both, stats = flat_gradient(both)
    s = np.exp(theta) / np.exp(theta).sum()
    w = min(s[1] / 0.25, 5.0)
    np.testing.assert_allclose(g_both * 41, g_reg * 40 + w * -0.4 * (np.eye(3)[1] - s), atol=1e-12)
    assert stats["baseline"] == pytest.approx(regular["baseline"])
    update = Reinforce().update(theta, both)
    assert update.metrics["episodes"] == 40 and update.metrics["corrections"] == 1
    assert update.metrics["mean_reward"] == pytest.approx(rewards.mean())


# --------------------------------------------------------------------------- issue 13


def test_an_episode_named_like_a_correction_of_another_is_scored_and_rescoring_it_keeps_the_correction(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    """Correction ids have a form no episode id can have: an episode named ``sess-42:r1`` (what
    correction 1 of ``sess-42`` used to be called) is its own episode."""
    (first,) = add_episodes(store, 1, ids=["sess-42"])
    score_episode(first, scorer, check_existing=False)
    result = record_feedback(store, first, thumb="down", clock=clock)
    assert result.reconciled.correction is not None
    correction = store.get_score(result.reconciled.correction.id, AGENT)

    (second,) = add_episodes(store, 1, start=1, ids=["sess-42:r1"])
    outcome = score_message(json.dumps({"type": "score_request", "episode_id": second}), scorer)
    assert outcome.status == "scored" and outcome.score is not None and outcome.score.episode_id == second

    assert rescore(store, scorer, AGENT, episode_ids=[second]).pending == [second]
    everything = rescore(store, scorer, AGENT)
    assert store.get_score(result.reconciled.correction.id, AGENT) == correction  # no re-score touched the correction
    assert everything.failed == [] and sorted(everything.pending) == sorted([first, second])
    assert result.reconciled.correction.id == "sess-42~r1"
    assert learned(store, first) == pytest.approx(expected(store, first, [0.0]))
    run = train(store, clock).run
    assert run is not None and (run.episodes, run.corrections) == (2, 1)


def test_corrections_stored_under_their_old_ids_still_count(store: Store, scorer: Scorer, clock: ManualClock) -> None:
    """Corrections written before correction ids had their own form (``{episode_id}:r{k}``) are
    read and counted; new ones take the next revision in the new form; an episode written under
    such an id is dead-lettered with the reason, never completed as a duplicate."""
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    base = Score.from_dict(store.get_score(eid, AGENT))  # type: ignore[arg-type]
    up, down = with_feedback(base.reward_function, [1.0])[0], with_feedback(base.reward_function, [0.0])[0]
    previous = base.reward
    for revision, reward in ((1, up), (2, down)):  # a thumb up, then down, under the old ids
        store.add_score(base.model_copy(update={"id": legacy_correction_doc_id(eid, revision), "revision": revision,
                                                "reward": reward, "reward_delta": reward - previous, "seq": None}))
        previous = reward
    store.put_feedback(Feedback.from_dict({"episode_id": eid, "agent_id": AGENT, "source": "user", "thumb": "down",
                                           "received_at": clock.now()}))
    assert reconcile(store, eid, AGENT, clock=clock).status == "unchanged"
    assert [r["id"] for r in score_rows(store, eid, AGENT)] == [eid, f"{eid}:r1", f"{eid}:r2"]

    result = record_feedback(store, eid, score=0.5, source="reviewer", clock=clock)
    assert result.reconciled.correction is not None and result.reconciled.correction.id == f"{eid}~r3"
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0, 0.5]))
    assert record_feedback(store, eid, score=0.5, source="reviewer", clock=clock).reconciled.status == "unchanged"

    (clash,) = add_episodes(store, 1, start=1, ids=[f"{eid}:r1"])
    outcome = score_message(json.dumps({"type": "score_request", "episode_id": clash}), scorer)
    assert outcome.status == "dead_letter" and outcome.reason == "ScoreIdTaken"
    assert eid in outcome.description and "~r" in outcome.description
    assert store.get_score(clash, AGENT)["episode_id"] == eid  # type: ignore[index]


def test_a_post_costs_the_same_reads_however_many_corrections_came_before(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    counting = CountingStore(store)
    reads, writes = [], []
    for i in range(40):
        before = counting.calls.copy()
        result = record_feedback(counting, eid, thumb="up" if i % 2 == 0 else "down", clock=clock)
        assert result.reconciled.status == "corrected"
        spent = counting.calls - before
        reads.append(sum(n for m, n in spent.items() if m.startswith(("get_", "list_", "read_"))))
        writes.append(sum(spent.values()) - reads[-1])
    assert len(score_rows(store, eid, AGENT)) == 41
    assert set(reads[1:]) == {reads[1]} and reads[0] <= reads[1] + 1  # the first post finds no ledger yet
    assert set(writes) == {writes[0]}
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))
    assert sum(consumed(store).values()) == pytest.approx(learned(store, eid))


def test_a_ledger_left_behind_by_a_crash_is_read_past_and_repaired(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, scorer, check_existing=False)
    record_feedback(store, eid, thumb="up", clock=clock)
    ledger = store.get_correction_ledger(eid, AGENT)
    assert ledger is not None and ledger.doc["revision"] == 1

    class NoLedgerWrites(CountingStore):
        def put_correction_ledger(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError("crash after the correction, before the ledger")

    with pytest.raises(RuntimeError, match="before the ledger"):
        record_feedback(NoLedgerWrites(store), eid, thumb="down", clock=clock)
    assert store.get_correction_ledger(eid, AGENT) == ledger and len(score_rows(store, eid, AGENT)) == 3
    assert reconcile(store, eid, AGENT, clock=clock).status == "unchanged"  # correction 2 is counted
    repaired = store.get_correction_ledger(eid, AGENT)
    assert repaired is not None and repaired.doc["revision"] == 2
    assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))
    assert repaired.doc["delta_sum"] == pytest.approx(learned(store, eid) - store.get_score(eid, AGENT)["reward"])  # type: ignore[index]


def test_rescoring_an_untrained_episode_reconciles_its_feedback_with_the_new_reward(
    store: Store, clock: ManualClock
) -> None:
    """Judged 0.5 and a thumb up at feedback weight 0.5: 0.75 is learned. Re-scored under a rule
    that gives 0.5 for the same judgement and feedback, 0.5 is learned, not 0.75."""
    (eid,) = add_episodes(store, 1)
    score_episode(eid, constant_scorer(store, clock, 0.5, feedback_weight=0.5), check_existing=False)
    record_feedback(store, eid, thumb="up", clock=clock)
    assert learned(store, eid) == pytest.approx(0.75)

    result = rescore(store, constant_scorer(store, clock, 0.5, feedback_weight=0.0), AGENT)
    assert expected(store, eid, [1.0]) == pytest.approx(0.5)
    assert learned(store, eid) == pytest.approx(0.5)
    assert result.pending == [eid] and result.failed == []
    run = train(store, clock).run
    assert run is not None and run.episodes == 1
    assert consumed(store) == {eid: pytest.approx(0.5)}


def test_rescoring_a_trained_episode_writes_no_correction_and_its_feedback_stays_on_the_learned_score(
    store: Store, clock: ManualClock
) -> None:
    (eid,) = add_episodes(store, 1)
    score_episode(eid, constant_scorer(store, clock, 0.5, feedback_weight=0.5), check_existing=False)
    record_feedback(store, eid, thumb="up", clock=clock)
    assert train(store, clock).status == "published"  # 0.5 + 0.25 learned
    rows = score_rows(store, eid, AGENT)

    result = rescore(store, constant_scorer(store, clock, 0.9, feedback_weight=0.5), AGENT, rejudge=True)
    assert result.already_trained == [eid]
    assert store.get_score(eid, AGENT)["reward"] == pytest.approx(0.9)  # type: ignore[index]  # recorded for inspection
    # Nothing applies the re-score to the learned reward: not a redelivery, not the sweep, not the next post.
    assert reconcile(store, eid, AGENT, clock=clock).status == "unchanged"
    assert [r["id"] for r in score_rows(store, eid, AGENT)] == [r["id"] for r in rows]
    changed = record_feedback(store, eid, thumb="down", clock=clock)  # the user changes their mind
    assert changed.reconciled.delta == pytest.approx(0.25 - 0.75)  # what the rule gives for the learned score
    rescore(store, constant_scorer(store, clock, 0.1, feedback_weight=0.5), AGENT, rejudge=True)  # once more
    assert reconcile(store, eid, AGENT, clock=clock).status == "unchanged"
    learned_deltas = sum(r["reward_delta"] for r in score_rows(store, eid, AGENT)[1:])
    assert 0.5 + learned_deltas == pytest.approx(0.25)


def test_the_sweep_applies_stored_feedback_once_and_leaves_unscored_episodes_their_marker(
    store: Store, scorer: Scorer, clock: ManualClock
) -> None:
    from agent_learning.app.embedded import LocalPipeline
    from agent_learning.queue.sqlite import SQLiteQueue

    scored, unscored = add_episodes(store, 2)
    score_episode(scored, scorer, check_existing=False)
    for eid in (scored, unscored):  # stored by a feedback call that died right after
        store.put_feedback(Feedback.from_dict({"episode_id": eid, "agent_id": AGENT, "source": "user",
                                               "thumb": "down", "received_at": clock.now()}))
    result = sweep(store, clock=clock)
    assert result.read == 2 and result.outcomes == {"corrected": 1, "waiting": 1}
    assert sweep(store, clock=clock).read == 0  # nothing new: one read of the feed
    outcome = score_episode(unscored, scorer, check_existing=False)
    assert outcome.score is not None and outcome.score.feedback_pending  # the marker the sweep left
    for eid in (scored, unscored):
        assert len(score_rows(store, eid, AGENT)) == 2
        assert learned(store, eid) == pytest.approx(expected(store, eid, [0.0]))

    record_feedback(store, scored, thumb="up", clock=clock)  # applied by its own call
    pipeline = LocalPipeline(store, SQLiteQueue(":memory:", clock=clock), OfflineJudge(), RewardFunction(),
                             Reinforce(), clock=clock)
    report = pipeline.run_once()  # the embedded runner sweeps before training, too
    assert report.feedback is not None and report.feedback.outcomes == {"unchanged": 1}
    assert len(score_rows(store, scored, AGENT)) == 3
