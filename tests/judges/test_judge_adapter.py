"""The azure-ai-evaluation judge adapter's own logic: failure classes, backoff, configuration."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("httpx")
pytest.importorskip("aiohttp")
pytest.importorskip("rich")

import httpx
import openai

from agent_learning.core.errors import ConfigurationError, PermanentError, TransientError
from agent_learning.documents import Episode, Step
from agent_learning.judges.base import InvalidJudgeOutput
from agent_learning.judges.evaluators import (
    JudgeLimits,
    JudgeMisconfigured,
    JudgeModel,
    _backoff,
    classify,
    evaluator_inputs,
)


def status_error(status: int, body: dict | None = None, headers: dict | None = None) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://judge/chat/completions")
    response = httpx.Response(status, request=request, headers=headers or {}, json=body or {"error": {}})
    cls = {
        429: openai.RateLimitError,
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        404: openai.NotFoundError,
    }.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return cls("failed", response=response, body=body)


def wrapped(error: BaseException) -> Exception:
    """As the evaluators raise it: their own exception with the OpenAI error as the cause."""
    try:
        raise RuntimeError("evaluator failed") from error
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 408])
def test_throttling_and_server_errors_are_transient(status: int) -> None:
    failure, _ = classify(wrapped(status_error(status)), "IntentResolutionEvaluator")
    assert isinstance(failure, TransientError) and str(status) in str(failure)


def test_retry_after_is_read_from_the_response() -> None:
    _, delay = classify(wrapped(status_error(429, headers={"Retry-After": "7"})), "x")
    assert delay == 7.0
    _, delay_ms = classify(wrapped(status_error(429, headers={"retry-after-ms": "1500", "Retry-After": "9"})), "x")
    assert delay_ms == 1.5


def test_timeouts_and_connection_errors_are_transient() -> None:
    request = httpx.Request("POST", "http://judge/chat/completions")
    for error in (openai.APITimeoutError(request=request), openai.APIConnectionError(request=request)):
        failure, _ = classify(wrapped(error), "x")
        assert isinstance(failure, TransientError)


def test_content_filter_is_permanent() -> None:
    body = {"error": {"code": "content_filter", "message": "The response was filtered"}}
    failure, _ = classify(wrapped(status_error(400, body=body)), "TaskAdherenceEvaluator")
    assert isinstance(failure, PermanentError) and "content filter" in str(failure)


def test_configuration_errors_are_transient_so_fixing_them_lets_messages_through() -> None:
    for status in (401, 403, 404):
        failure, _ = classify(wrapped(status_error(status)), "x")
        assert isinstance(failure, TransientError) and "configuration" in str(failure)


def test_an_account_out_of_quota_is_a_configuration_error_not_throttling() -> None:
    body = {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}
    failure, delay = classify(wrapped(status_error(429, body=body, headers={"Retry-After": "7"})), "x")
    assert isinstance(failure, JudgeMisconfigured) and "insufficient_quota" in str(failure), failure
    assert "configuration" in str(failure) and delay is None
    throttled, _ = classify(wrapped(status_error(429, body={"code": "429", "message": "rate limit"})), "x")
    assert isinstance(throttled, TransientError) and not isinstance(throttled, JudgeMisconfigured)


def test_other_client_errors_are_permanent() -> None:
    failure, _ = classify(wrapped(status_error(400, body={"error": {"code": "invalid_request"}})), "x")
    assert isinstance(failure, PermanentError)


@pytest.mark.parametrize(
    "error", [json.JSONDecodeError("Expecting value", "oops", 0), TypeError("'<' not supported"), KeyError("score")]
)
def test_malformed_replies_are_invalid_output(error: Exception) -> None:
    failure, _ = classify(error, "TaskCompletionEvaluator")
    assert isinstance(failure, InvalidJudgeOutput) and isinstance(failure, PermanentError)


def test_backoff_honours_retry_after_up_to_the_cap_and_grows_otherwise() -> None:
    limits = JudgeLimits(backoff_base=1.0, backoff_max=8.0, retry_after_cap=5.0)
    assert _backoff(1, limits, 3.0) == 3.0
    assert _backoff(1, limits, 60.0) == 5.0
    for attempt, top in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)):
        delay = _backoff(attempt, limits, None)
        assert top / 2 <= delay <= top


def test_judge_model_needs_one_complete_endpoint() -> None:
    with pytest.raises(ConfigurationError, match="either"):
        JudgeModel()
    with pytest.raises(ConfigurationError, match="either"):
        JudgeModel(azure_endpoint="https://x.openai.azure.com", base_url="http://localhost:11434/v1")
    with pytest.raises(ConfigurationError, match="JUDGE_DEPLOYMENT"):
        JudgeModel(azure_endpoint="https://x.openai.azure.com")
    with pytest.raises(ConfigurationError, match="JUDGE_MODEL"):
        JudgeModel(base_url="http://localhost:11434/v1")
    azure = JudgeModel(azure_endpoint="https://x.openai.azure.com", deployment="gpt-4o-mini")
    assert azure.model_config() == {
        "type": "azure_openai",
        "azure_endpoint": "https://x.openai.azure.com",
        "azure_deployment": "gpt-4o-mini",
        "api_version": "2024-10-21",
    }
    local = JudgeModel(base_url="http://localhost:11434/v1", model="qwen3")
    assert local.model_config()["type"] == "openai" and local.name == "qwen3"


@pytest.mark.parametrize(
    ("fields", "setting"),
    [
        ({"azure_endpoint": "myres.openai.azure.com", "deployment": "gpt"}, "AGENT_LEARNING_JUDGE_AZURE_ENDPOINT"),
        ({"azure_endpoint": " https://myres.openai.azure.com", "deployment": "gpt"}, "JUDGE_AZURE_ENDPOINT"),
        ({"azure_endpoint": "https://", "deployment": "gpt"}, "JUDGE_AZURE_ENDPOINT"),
        ({"base_url": "localhost:11434/v1", "model": "qwen3"}, "AGENT_LEARNING_JUDGE_BASE_URL"),
        ({"base_url": "ftp://127.0.0.1/v1", "model": "qwen3"}, "AGENT_LEARNING_JUDGE_BASE_URL"),
        ({"base_url": "http://[::1/v1", "model": "qwen3"}, "AGENT_LEARNING_JUDGE_BASE_URL"),
    ],
)
def test_a_judge_url_the_client_cannot_use_is_refused_naming_its_setting(fields: dict, setting: str) -> None:
    from agent_learning.app.settings import load_settings

    with pytest.raises(ConfigurationError, match=f"{setting} must be an http:// or https:// URL"):
        JudgeModel(**fields)
    with pytest.raises(ConfigurationError, match=setting):
        load_settings(judge="evaluators", **{f"judge_{k}": v for k, v in fields.items()})
    assert JudgeModel(azure_endpoint="https://gw.azure-api.net/openai-prefix/", deployment="gpt").name == "gpt"


def test_without_azure_ai_evaluation_the_judge_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_learning.judges.evaluators import EvaluatorJudge

    monkeypatch.setitem(sys.modules, "azure.ai.evaluation", None)  # as if not installed: its import fails
    with pytest.raises(ConfigurationError, match=r"pip install 'agent-learning\[judges\]'"):
        EvaluatorJudge(JudgeModel(base_url="http://127.0.0.1:9/v1", model="qwen3"))


def test_the_judge_api_key_is_in_no_repr(tmp_path: Any) -> None:
    from agent_learning.app.settings import load_settings
    from agent_learning.judges.evaluators import EvaluatorJudge
    from agent_learning.pipeline import Scorer
    from agent_learning.rewards import RewardConfig, RewardFunction
    from agent_learning.store import MemoryStore

    secret = "sk-do-not-print-0123456789"
    model = JudgeModel(base_url="http://127.0.0.1:9/v1", model="qwen3", api_key=secret)
    judge = EvaluatorJudge(model)
    scorer = Scorer(MemoryStore(), judge, RewardFunction(RewardConfig()))
    settings = load_settings(
        judge="evaluators",
        judge_base_url="http://127.0.0.1:9/v1",
        judge_model="qwen3",
        judge_api_key=secret,
        sqlite_path=str(tmp_path / "x.db"),
    )
    for holder in (model, judge, scorer, [model], {"model": model}, settings, settings.judge_model_config()):
        assert secret not in repr(holder) and secret not in str(holder), type(holder).__name__
    assert model.model_config()["api_key"] == secret  # still handed to the evaluators


def test_judge_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="episode_deadline"):
        JudgeLimits(episode_deadline=0)
    with pytest.raises(ValueError, match="max_attempts"):
        JudgeLimits(max_attempts=0)
    for name in ("attempt_timeout", "evaluator_deadline", "episode_deadline"):
        for value in (float("inf"), float("nan")):  # inf made every judge() call raise OverflowError
            with pytest.raises(ValueError, match=f"{name} must be a finite number"):
                JudgeLimits(**{name: value})


def test_settings_build_the_judge_and_name_missing_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_learning.app.settings import load_settings

    for name in ("AGENT_LEARNING_JUDGE_AZURE_ENDPOINT", "AGENT_LEARNING_JUDGE_DEPLOYMENT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_JUDGE_AZURE_ENDPOINT"):
        load_settings(judge="evaluators")
    settings = load_settings(
        judge="evaluators",
        judge_base_url="http://127.0.0.1:9/v1",
        judge_model="m",
        judge_attempt_timeout=5,
        judge_max_attempts=2,
    )
    assert settings.judge_model_config().name == "m"
    assert settings.judge_limits().attempt_timeout == 5 and settings.judge_limits().max_attempts == 2


def test_inside_azure_the_offline_judge_is_refused(tmp_path) -> None:
    from agent_learning.app.handlers import build_runtime
    from agent_learning.app.settings import load_settings

    settings = load_settings(sqlite_path=str(tmp_path / "x.db"))
    with pytest.raises(ConfigurationError, match="no judge model is configured"):
        build_runtime(settings, environ={"WEBSITE_INSTANCE_ID": "abc"})
    allowed = load_settings(sqlite_path=str(tmp_path / "x.db"), allow_offline_judge=True)
    assert build_runtime(allowed, environ={"WEBSITE_INSTANCE_ID": "abc"}).store is not None
    assert build_runtime(settings, environ={}).store is not None  # locally the offline judge is the default


def test_evaluator_inputs_describe_the_conversation_with_tool_calls() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    episode = Episode(
        id="e1",
        agent_id="a",
        policy_version=1,
        action_id="x",
        probability=0.5,
        logprob=-0.6931471805599453,
        input="What is 6 x 7?",
        output="6 times 7 is 42.",
        instructions="Explain briefly.",
        steps=[
            Step(name="calculator", status="ok", latency_ms=3, arguments={"expr": "6*7"}, result="42", call_id="c1"),
            Step(name="search", status="error", latency_ms=9, error="timeout"),
            Step(name="think", kind="llm", status="ok", latency_ms=100),
        ],
        started_at=now,
        ended_at=now + timedelta(seconds=2),
    )
    inputs = evaluator_inputs(episode)
    assert set(inputs) == {"intent_resolution", "task_adherence", "task_completion"}
    kw = inputs["task_adherence"]
    assert kw["query"][0] == {"role": "system", "content": "Explain briefly."}
    assert kw["query"][-1]["role"] == "user" and "6 x 7" in json.dumps(kw["query"][-1])
    roles = [m["role"] for m in kw["response"]]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]  # two tool calls, then the answer
    call = kw["response"][0]["content"][0]
    assert call == {"type": "tool_call", "tool_call_id": "c1", "name": "calculator", "arguments": {"expr": "6*7"}}
    assert kw["response"][1]["tool_call_id"] == "c1"
    assert "timeout" in json.dumps(kw["response"][3])  # a failed call shows its error to the judge
    assert kw["response"][-1]["content"][0]["text"] == "6 times 7 is 42."
    assert "tool_definitions" not in kw  # validated by the evaluators, never sent to the model
