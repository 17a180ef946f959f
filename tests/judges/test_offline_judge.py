"""The offline rules judge's rules and the validation of evaluator outputs (what the judge port
promises of it is in ``test_judge_contract.py``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_learning.core.errors import PermanentError
from agent_learning.documents import MAX_STEP_TEXT_CHARS, Episode
from agent_learning.judges import InvalidJudgeOutput, Judgement, OfflineJudge, metric_from_output
from agent_learning.judges.metrics import INTENT_RESOLUTION, METRICS, TASK_ADHERENCE, TASK_COMPLETION
from agent_learning.judges.offline import expected_answer

START = datetime(2026, 1, 1, tzinfo=UTC)
LONG = " ".join(["word"] * 61)


def episode(query: str, output: str, instructions: str | None = None) -> Episode:
    return Episode(
        id="ep-1",
        agent_id="agent",
        policy_version=1,
        action_id="a",
        probability=1.0,
        logprob=0.0,
        input=query,
        output=output,
        instructions=instructions,
        started_at=START,
        ended_at=START,
    )


def raw(judgement: Judgement) -> tuple[float, float, float]:
    m = judgement.metrics
    return m[INTENT_RESOLUTION].raw, m[TASK_ADHERENCE].raw, m[TASK_COMPLETION].raw


def judge(query: str, output: str, instructions: str | None = None) -> tuple[float, float, float]:
    return raw(OfflineJudge().judge(episode(query, output, instructions)))


# --------------------------------------------------------------------------- rules


def test_correct_arithmetic_with_explanation() -> None:
    assert judge("What is 17 + 25?", "Adding 17 and 25 gives 42 as the final answer.") == (5.0, 1.0, 1.0)


def test_bare_correct_arithmetic() -> None:
    assert judge("What is 17 + 25?", "42") == (4.0, 1.0, 1.0)
    assert judge("Compute 6 * 7", "The answer: 42") == (4.0, 1.0, 1.0)


def test_wrong_arithmetic() -> None:
    intent, adherence, completion = judge("What is 17 + 25?", "41")
    assert (intent, completion) == (2.0, 0.0)
    assert adherence == 1.0
    reason = OfflineJudge().judge(episode("What is 17 + 25?", "41")).metrics[INTENT_RESOLUTION].reason
    assert "41" in reason and "42" in reason


def test_last_number_is_the_answer() -> None:
    assert judge("What is 17 + 25?", "42, no wait, 43")[2] == 0.0
    assert judge("What is 17 + 25?", "43, no wait, 42")[2] == 1.0


def test_numbers_with_thousands_separators_are_read_whole() -> None:
    assert judge("What is 999 * 999?", "998,001") == (4.0, 1.0, 1.0)  # was read as 1, a wrong answer
    assert judge("What is 1,500 + 2,250?", "That makes 3,750.")[2] == 1.0
    assert judge("What is 999 * 999?", "998,002")[2] == 0.0
    assert expected_answer("Compute 1,000.5 - 0.5") == 1000.0


def test_arithmetic_without_a_number() -> None:
    assert judge("What is 17 + 25?", "I am not sure") == (3.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("query", "answer"),
    [("What is 17 + 25?", 42.0), ("Compute 6 * 7", 42.0), ("10 - 15", -5.0), ("7 x 3", 21.0), ("9 / 4", 2.25)],
)
def test_expected_answer(query: str, answer: float) -> None:
    assert expected_answer(query) == answer


@pytest.mark.parametrize("query", ["What is the capital of France?", "What is 1 / 0?", ""])
def test_no_expected_answer(query: str) -> None:
    assert expected_answer(query) is None


def test_explain_instruction_with_short_answer_fails_adherence() -> None:
    assert judge("What is 17 + 25?", "42", "Explain your reasoning.")[1] == 0.0
    assert judge("What is 17 + 25?", "It is 42", "Think step by step.")[1] == 0.0
    assert judge("What is 17 + 25?", "Adding 17 and 25 gives 42 as the final answer.", "Explain.")[1] == 1.0


def test_brevity_instruction_with_long_answer_fails_adherence() -> None:
    assert len(LONG.split()) == 61
    assert judge("What is the capital of France?", LONG, "Be concise.")[1] == 0.0
    assert judge("What is the capital of France?", LONG, "Reply with the number only.")[1] == 0.0
    sixty = " ".join(["word"] * 60)
    assert judge("What is the capital of France?", sixty, "Be brief.")[1] == 1.0
    assert judge("What is the capital of France?", LONG, "")[1] == 1.0


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Paris is the capital of France.", (5.0, 1.0, 1.0)),
        ("The capital is Paris.", (3.0, 1.0, 0.0)),  # covers 1 of 2 key terms
        ("Paris.", (1.0, 1.0, 0.0)),
    ],
)
def test_non_arithmetic_coverage(output: str, expected: tuple[float, float, float]) -> None:
    assert judge("What is the capital of France?", output) == expected


def test_coverage_threshold_for_completion() -> None:
    query = "Name the largest planet, its moons and rings"  # key terms: name largest planet its moons rings
    assert judge(query, "Jupiter: largest planet, many moons")[2] == 0.0  # 3 of 6
    assert judge(query, "Jupiter is the largest planet; its moons and rings")[2] == 1.0  # 5 of 6


# --------------------------------------------------------------------------- output shape


def test_evaluate_output_shape() -> None:
    out = OfflineJudge.evaluate("What is 17 + 25?", "41", "Be brief.")
    assert set(out) == set(METRICS)
    for name in METRICS:
        assert set(out[name]) == {name, f"{name}_result", f"{name}_reason", f"{name}_threshold"}
        score, threshold = out[name][name], out[name][f"{name}_threshold"]
        assert out[name][f"{name}_result"] == ("pass" if score >= threshold else "fail")
        assert isinstance(out[name][f"{name}_reason"], str) and out[name][f"{name}_reason"]
    assert out[INTENT_RESOLUTION][f"{INTENT_RESOLUTION}_threshold"] == 3.0
    assert out[INTENT_RESOLUTION][f"{INTENT_RESOLUTION}_result"] == "fail"
    assert out[TASK_ADHERENCE][f"{TASK_ADHERENCE}_result"] == "pass"


# --------------------------------------------------------------------------- metric_from_output


def good(metric: str = INTENT_RESOLUTION, score: Any = 4, **extra: Any) -> dict[str, Any]:
    return {
        metric: score,
        f"{metric}_result": "pass",
        f"{metric}_reason": "fine",
        f"{metric}_threshold": 3,
    } | extra


def test_metric_from_output_valid() -> None:
    m = metric_from_output(INTENT_RESOLUTION, good(), "azure:intent", "1.0")
    assert (m.raw, m.normalised, m.result, m.threshold, m.reason) == (4.0, 0.75, "pass", 3.0, "fine")
    assert (m.evaluator, m.evaluator_version) == ("azure:intent", "1.0")
    assert isinstance(m.raw, float)


def test_metric_from_output_optional_fields() -> None:
    m = metric_from_output(TASK_COMPLETION, {TASK_COMPLETION: 1}, "e", "1")
    assert (m.normalised, m.result, m.threshold, m.reason) == (1.0, None, None, "")
    bad_threshold = good(**{f"{INTENT_RESOLUTION}_threshold": "3", f"{INTENT_RESOLUTION}_reason": None})
    m = metric_from_output(INTENT_RESOLUTION, bad_threshold, "e", "1")
    assert (m.threshold, m.reason) == (None, "")
    long_reason = good(**{f"{INTENT_RESOLUTION}_reason": "r" * (MAX_STEP_TEXT_CHARS + 10)})
    assert len(metric_from_output(INTENT_RESOLUTION, long_reason, "e", "1").reason) == MAX_STEP_TEXT_CHARS


@pytest.mark.parametrize(
    ("metric", "output", "message"),
    [
        (INTENT_RESOLUTION, {"intent_resolution_result": "pass"}, "no 'intent_resolution' field"),
        (INTENT_RESOLUTION, good(score=None), "must be a number"),
        (INTENT_RESOLUTION, good(score="4"), "must be a number"),
        (INTENT_RESOLUTION, good(score=True), "must be a number"),
        (INTENT_RESOLUTION, good(score=[4]), "must be a number"),
        (INTENT_RESOLUTION, good(score=math.nan), "finite"),
        (INTENT_RESOLUTION, good(score=-math.inf), "finite"),
        (INTENT_RESOLUTION, good(score=7), "outside its scale"),
        (INTENT_RESOLUTION, good(score=0), "outside its scale"),
        (TASK_COMPLETION, good(TASK_COMPLETION, 2), "outside its scale"),
        (TASK_ADHERENCE, good(TASK_ADHERENCE, -1), "outside its scale"),
        (
            TASK_ADHERENCE,
            good(TASK_ADHERENCE, None, task_adherence_result="not_applicable", task_adherence_reason="N/A: x"),
            r"only 'not applicable' \(N/A: x",
        ),
        (TASK_ADHERENCE, good(TASK_ADHERENCE, 0, task_adherence_result="not_applicable"), "only 'not applicable'"),
        (INTENT_RESOLUTION, good(**{"intent_resolution_result": "passed"}), "pass/fail/not_applicable"),
        (INTENT_RESOLUTION, good(**{"intent_resolution_result": True}), "pass/fail/not_applicable"),
        ("fluency", {"fluency": 3}, "unknown metric"),
    ],
)
def test_metric_from_output_rejects(metric: str, output: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJudgeOutput, match=message) as info:
        metric_from_output(metric, output, "azure:eval", "1.0")
    assert isinstance(info.value, PermanentError)
    assert str(info.value).startswith("azure:eval: ")
