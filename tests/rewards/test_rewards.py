"""Reward shaping: normalisation, weighted sum, penalties, clipping and versioning."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agent_learning.core.errors import PermanentError
from agent_learning.documents import Episode, MetricScore, Step
from agent_learning.judges.metrics import normalise
from agent_learning.rewards import (
    INTENT_RESOLUTION,
    TASK_ADHERENCE,
    TASK_COMPLETION,
    MissingMetric,
    RewardConfig,
    RewardFunction,
)

START = datetime(2026, 1, 1, tzinfo=UTC)


def metric(name: str, raw: float) -> MetricScore:
    return MetricScore(raw=raw, normalised=normalise(name, raw), evaluator=f"test:{name}", evaluator_version="1")


def metrics(intent: float = 5, adherence: float = 1, completion: float = 1) -> dict[str, MetricScore]:
    return {
        INTENT_RESOLUTION: metric(INTENT_RESOLUTION, intent),
        TASK_ADHERENCE: metric(TASK_ADHERENCE, adherence),
        TASK_COMPLETION: metric(TASK_COMPLETION, completion),
    }


def episode(output: str = "an answer", latency_ms: float = 1_000.0, steps: list[Step] | None = None) -> Episode:
    return Episode(
        id="ep-1",
        agent_id="agent",
        policy_version=1,
        action_id="a",
        probability=0.5,
        logprob=math.log(0.5),
        input="question",
        output=output,
        steps=steps or [],
        started_at=START,
        ended_at=START + timedelta(milliseconds=latency_ms),
    )


def failed_tools(n: int, kind: Any = "tool") -> list[Step]:
    return [Step(name=f"t{i}", kind=kind, status="error", latency_ms=1.0, error="boom") for i in range(n)]


# --------------------------------------------------------------------------- normalise


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        (INTENT_RESOLUTION, 1, 0.0),
        (INTENT_RESOLUTION, 2, 0.25),
        (INTENT_RESOLUTION, 3, 0.5),
        (INTENT_RESOLUTION, 4.0, 0.75),
        (INTENT_RESOLUTION, 5, 1.0),
        (TASK_ADHERENCE, 0, 0.0),
        (TASK_ADHERENCE, 1.0, 1.0),
        (TASK_COMPLETION, 0.0, 0.0),
        (TASK_COMPLETION, 1, 1.0),
    ],
)
def test_normalise_scales(name: str, raw: float, expected: float) -> None:
    assert normalise(name, raw) == expected


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (INTENT_RESOLUTION, 0, "outside its scale"),
        (INTENT_RESOLUTION, 5.5, "outside its scale"),
        (INTENT_RESOLUTION, 7, "outside its scale"),
        (TASK_ADHERENCE, -0.1, "outside its scale"),
        (TASK_COMPLETION, 2, "outside its scale"),
        (TASK_COMPLETION, 0.5, "not a whole number"),
        (TASK_ADHERENCE, 0.999, "not a whole number"),
        (INTENT_RESOLUTION, 4.5, "not a whole number"),
        (INTENT_RESOLUTION, math.nan, "finite number"),
        (TASK_ADHERENCE, math.inf, "finite number"),
        (TASK_COMPLETION, True, "finite number"),
        (TASK_COMPLETION, "1", "finite number"),
        (TASK_COMPLETION, None, "finite number"),
        ("fluency", 3, "unknown metric"),
    ],
)
def test_normalise_rejects(name: str, raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        normalise(name, raw)
    assert name in str(info.value)


# --------------------------------------------------------------------------- weighted sum


@pytest.mark.parametrize(
    ("intent", "adherence", "completion", "expected"),
    [
        (5, 1, 1, 1.0),
        (1, 0, 0, 0.0),
        (3, 0, 1, 0.4 * 0.5 + 0.3),  # 0.5
        (1, 1, 0, 0.3),
        (4, 1, 0, 0.4 * 0.75 + 0.3),  # 0.6
        (2, 1, 1, 0.4 * 0.25 + 0.6),  # 0.7
    ],
)
def test_default_weights(intent: float, adherence: float, completion: float, expected: float) -> None:
    reward, info = RewardFunction()(metrics(intent, adherence, completion), episode())
    assert reward == pytest.approx(expected)
    assert info.components["weighted"] == pytest.approx(expected)
    assert info.weights == {INTENT_RESOLUTION: 0.4, TASK_ADHERENCE: 0.3, TASK_COMPLETION: 0.3, "feedback": 0.5}


def test_weights_not_summing_to_one_are_normalised() -> None:
    fn = RewardFunction(RewardConfig(w_intent=2, w_adherence=1, w_completion=1))
    reward, _ = fn(metrics(5, 0, 1), episode())
    assert reward == pytest.approx((2 * 1.0 + 1 * 0.0 + 1 * 1.0) / 4)  # 0.75
    scaled = RewardFunction(RewardConfig(w_intent=4.0, w_adherence=3.0, w_completion=3.0))
    for case in [(3, 0, 1), (4, 1, 0), (2, 1, 1)]:
        assert scaled(metrics(*case), episode())[0] == pytest.approx(RewardFunction()(metrics(*case), episode())[0])


def test_missing_weighted_metric_raises() -> None:
    partial = metrics()
    del partial[TASK_COMPLETION]
    with pytest.raises(MissingMetric, match=TASK_COMPLETION) as info:
        RewardFunction()(partial, episode())
    assert isinstance(info.value, PermanentError)
    with pytest.raises(MissingMetric, match=INTENT_RESOLUTION):
        RewardFunction()({}, episode())


def test_metric_with_zero_weight_may_be_missing() -> None:
    fn = RewardFunction(RewardConfig(w_completion=0.0))
    partial = metrics(intent=3, adherence=1)
    del partial[TASK_COMPLETION]
    reward, _ = fn(partial, episode())
    assert reward == pytest.approx((0.4 * 0.5 + 0.3 * 1.0) / 0.7)


def test_zero_weight_metric_is_ignored_when_present() -> None:
    fn = RewardFunction(RewardConfig(w_intent=1.0, w_adherence=0.0, w_completion=0.0))
    assert fn(metrics(4, 0, 0), episode())[0] == pytest.approx(0.75)
    assert fn(metrics(4, 1, 1), episode())[0] == pytest.approx(0.75)


# --------------------------------------------------------------------------- penalties


@pytest.mark.parametrize(("failures", "penalty"), [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (5, 0.3)])
def test_failed_tool_calls_penalty_is_capped(failures: int, penalty: float) -> None:
    reward, info = RewardFunction()(metrics(), episode(steps=failed_tools(failures)))
    assert reward == pytest.approx(1.0 - penalty)
    assert info.components["tool_failures"] == pytest.approx(-penalty)


def test_only_failed_tool_steps_are_penalised() -> None:
    ok = [Step(name="t", kind="tool", status="ok", latency_ms=1.0)]
    steps = failed_tools(2, kind="llm") + failed_tools(1, kind="retrieval") + failed_tools(1, kind="step") + ok
    assert RewardFunction()(metrics(), episode(steps=steps))[0] == 1.0


def test_custom_tool_penalty_and_cap() -> None:
    fn = RewardFunction(RewardConfig(tool_failure_penalty=0.25, max_tool_failure_penalty=0.6))
    assert fn(metrics(), episode(steps=failed_tools(2)))[0] == pytest.approx(0.5)
    assert fn(metrics(), episode(steps=failed_tools(4)))[0] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("latency_ms", "penalty"),
    [(0.0, 0.0), (30_000.0, 0.0), (45_000.0, 0.05), (60_000.0, 0.1), (120_000.0, 0.1), (33_000.0, 0.01)],
)
def test_latency_over_budget_is_linear_and_capped(latency_ms: float, penalty: float) -> None:
    reward, info = RewardFunction()(metrics(), episode(latency_ms=latency_ms))
    assert reward == pytest.approx(1.0 - penalty)
    assert info.components["latency"] == pytest.approx(-penalty)


def test_custom_latency_budget() -> None:
    fn = RewardFunction(RewardConfig(latency_budget_ms=1_000.0, latency_penalty=0.4))
    assert fn(metrics(), episode(latency_ms=1_500.0))[0] == pytest.approx(1.0 - 0.4 * 0.5)
    assert fn(metrics(), episode(latency_ms=10_000.0))[0] == pytest.approx(0.6)


@pytest.mark.parametrize("output", ["", "   ", "\n\t "])
def test_empty_output_penalty(output: str) -> None:
    reward, info = RewardFunction()(metrics(3, 1, 1), episode(output=output))
    assert reward == pytest.approx(0.8 - 0.5)
    assert info.components["empty_output"] == -0.5


def test_all_penalties_add_up() -> None:
    ep = episode(output="", latency_ms=120_000.0, steps=failed_tools(5))
    reward, info = RewardFunction()(metrics(1, 0, 0), ep)
    assert reward == pytest.approx(0.0 - 0.3 - 0.1 - 0.5)
    assert info.components == pytest.approx(
        {"weighted": 0.0, "tool_failures": -0.3, "latency": -0.1, "empty_output": -0.5, "judged": -0.9}
    )


def test_reward_is_clipped_to_minus_one() -> None:
    fn = RewardFunction(RewardConfig(empty_output_penalty=2.0))
    reward, info = fn(metrics(1, 0, 0), episode(output=""))
    assert reward == -1.0
    assert info.components["empty_output"] == -2.0  # the component shows the unclipped penalty


def test_reward_stays_within_bounds_for_extremes() -> None:
    fn = RewardFunction(RewardConfig(tool_failure_penalty=5, max_tool_failure_penalty=5, latency_penalty=5))
    worst = fn(metrics(1, 0, 0), episode(output="", latency_ms=1e9, steps=failed_tools(10)))[0]
    best = fn(metrics(5, 1, 1), episode())[0]
    assert (worst, best) == (-1.0, 1.0)


def test_reward_info_describes_the_function() -> None:
    fn = RewardFunction()
    _, info = fn(metrics(), episode())
    assert info.version == fn.version
    assert info.penalties == {
        "tool_failure_penalty": 0.1,
        "max_tool_failure_penalty": 0.3,
        "latency_budget_ms": 30_000.0,
        "latency_penalty": 0.1,
        "empty_output_penalty": 0.5,
    }
    assert set(info.components) == {"weighted", "tool_failures", "latency", "empty_output", "judged"}


# --------------------------------------------------------------------------- versions


def test_version_is_stable_for_equal_settings() -> None:
    a, b = RewardFunction(), RewardFunction(RewardConfig())
    assert a.version == b.version
    assert a.version.startswith("judges-feedback/2+")
    assert RewardFunction(RewardConfig(w_intent=0.5)).version == RewardFunction(RewardConfig(w_intent=0.5)).version


def test_version_changes_when_any_setting_changes() -> None:
    base = RewardConfig()
    versions = {RewardFunction(base).version}
    for f in dataclasses.fields(RewardConfig):
        changed = dataclasses.replace(base, **{f.name: getattr(base, f.name) + 0.05})
        versions.add(RewardFunction(changed).version)
    assert len(versions) == 1 + len(dataclasses.fields(RewardConfig))


def test_version_does_not_depend_on_int_or_float() -> None:
    as_int = RewardConfig(w_intent=1, w_adherence=0, w_completion=0, latency_budget_ms=30_000)
    as_float = RewardConfig(w_intent=1.0, w_adherence=0.0, w_completion=0.0, latency_budget_ms=30_000.0)
    assert as_int == as_float
    assert RewardFunction(as_int).version == RewardFunction(as_float).version


# --------------------------------------------------------------------------- config validation


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RewardConfig)])
@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_reward_config_rejects_negative_and_non_finite(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        RewardConfig(**{name: value})


def test_reward_config_rejects_all_zero_weights_and_zero_budget() -> None:
    with pytest.raises(ValueError, match="cannot all be 0"):
        RewardConfig(w_intent=0, w_adherence=0, w_completion=0)
    with pytest.raises(ValueError, match="latency_budget_ms"):
        RewardConfig(latency_budget_ms=0)
    with pytest.raises(ValueError, match="w_intent, w_adherence and w_completion must add up to a finite number"):
        RewardConfig(w_intent=1e308, w_adherence=1e308)  # each finite; the reward overflowed dividing by the sum
    assert RewardConfig(w_intent=0, w_adherence=0, w_completion=1).weights[TASK_COMPLETION] == 1


# --------------------------------------------------------------------------- token cost


def test_a_token_cost_lowers_the_reward_and_without_one_the_version_is_the_previous_releases() -> None:
    from agent_learning.documents import Usage

    assert RewardFunction().version == "judges-feedback/2+8fa8f2cac4"  # as scored before the cost existed
    spent = episode().model_copy(update={"usage": Usage(prompt_tokens=4_000, completion_tokens=1_000)})
    free, free_info = RewardFunction()(metrics(), spent)
    priced = RewardFunction(RewardConfig(cost_per_thousand_tokens=0.01))
    reward, info = priced(metrics(), spent)
    assert reward == pytest.approx(free - 0.05)
    assert info.components["tokens"] == pytest.approx(-0.05) and "tokens" not in free_info.components
    assert info.penalties["cost_per_thousand_tokens"] == 0.01 and "cost_per_thousand_tokens" not in free_info.penalties
    assert priced.version != RewardFunction().version
    assert priced(metrics(), episode())[0] == free  # no usage recorded: no cost
