"""Synthetic agents: reproducible, valid episodes whose quality the offline judge sees."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from agent_learning.core.clock import ManualClock
from agent_learning.documents import Episode
from agent_learning.judges.offline import OfflineJudge
from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy, load_policy
from agent_learning.rewards import RewardFunction
from agent_learning.sim.simulate import SCENARIOS, Scenario, math_tutor, simulate_round, support_bot, triage_bot
from agent_learning.store.memory import MemoryStore


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_seed_same_episodes(name: str) -> None:
    def run() -> list[dict]:
        scenario = SCENARIOS[name]()
        store = MemoryStore()
        policy = first_policy(scenario, seed=5)
        episodes = simulate_round(scenario, policy, store, 30, random.Random(9), ManualClock())
        return [e.to_dict() for e in episodes]

    first, second = run(), run()
    assert first == second
    assert len({e["action_id"] for e in first}) > 1


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_episodes_are_stored_valid_and_carry_the_decision(name: str) -> None:
    scenario = SCENARIOS[name]()
    store = MemoryStore()
    policy = first_policy(scenario, seed=1)
    episodes = simulate_round(scenario, policy, store, 50, random.Random(2), ManualClock())
    for episode in episodes:
        assert Episode.from_dict(store.get_episode(episode.id)) == episode
        if policy.features:  # a contextual agent
            assert episode.context is not None and set(episode.context) == {"task"}
            assert episode.probability == pytest.approx(policy.probability(episode.action_id, episode.context))
        else:
            assert episode.probability == pytest.approx(policy.probability(episode.action_id))
        assert episode.instructions == scenario.instructions
        assert episode.latency_ms > 0


def first_policy(scenario: Scenario, seed: int) -> SoftmaxPolicy | StructuredPolicy:
    doc = scenario.first_policy(temperature=1.0, exploration_floor=0.0, created_at=None)
    return load_policy(doc, rng=random.Random(seed))


def test_the_triage_bots_best_prompt_depends_on_the_task_type() -> None:
    means = triage_bot().expected_by_segment(OfflineJudge(), RewardFunction(), n=150, seed=1)
    best = {segment: max(m, key=m.__getitem__) for segment, m in means.items()}
    assert best["task=billing"].startswith("prompt=concise:")
    assert best["task=technical"].startswith("prompt=step-by-step:")
    assert len(means["task=billing"]) == 9


def test_expected_rewards_rank_the_actions_as_designed() -> None:
    judge, reward = OfflineJudge(), RewardFunction()
    math = math_tutor().expected_rewards(judge, reward, n=600, seed=1)
    assert max(math, key=math.__getitem__) == "step-by-step"
    assert math["direct"] < 0.6 < math["few-shot"] < math["step-by-step"]
    support = support_bot().expected_rewards(judge, reward, n=600, seed=1)
    assert max(support, key=support.__getitem__) == "k=5"
    assert support["k=1"] < support["k=3"] < support["k=5"]


def test_tool_failures_are_recorded_as_failed_steps() -> None:
    scenario = math_tutor()
    policy = SoftmaxPolicy.from_actions(scenario.agent_id, scenario.actions)
    decision = policy.decision_for("calculator")
    store, rng, clock = MemoryStore(), random.Random(0), ManualClock()
    episodes = [scenario.run_episode(store, decision, rng, clock) for _ in range(200)]
    failures = [e for e in episodes if e.failed_steps]
    assert 0.2 < len(failures) / len(episodes) < 0.5  # p_tool_error = 0.35
    assert all(e.steps[0].name == "calculator" and e.steps[0].error for e in failures)


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(start=100.0)
    assert clock.time() == 100.0
    clock.advance(2.5)
    assert clock.time() == 102.5 and clock.now().timestamp() == 102.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_true_means_compare_actions_on_the_same_tasks_and_luck() -> None:
    """Common random numbers: an action that behaves exactly as another gets exactly its mean,
    where independent draws would differ by their noise; so the best action is decided by the
    actions' differences, not by which one drew the easier tasks."""
    base = math_tutor()
    step = next(b for b in base.behaviours if b.action.id == "step-by-step")
    twin = replace(step, action=step.action.model_copy(update={"id": "step-by-step-twin"}))
    scenario = replace(base, behaviours=[*base.behaviours, twin])
    means = scenario.expected_rewards(OfflineJudge(), RewardFunction(), n=200, seed=3)
    assert means["step-by-step-twin"] == means["step-by-step"]
    assert len(set(means.values())) == len(base.behaviours)  # the others differ

    structured = triage_bot()
    by_segment = structured.expected_by_segment(OfflineJudge(), RewardFunction(), n=60, seed=3)
    again = structured.expected_by_segment(OfflineJudge(), RewardFunction(), n=60, seed=3)
    assert by_segment == again
