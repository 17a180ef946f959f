"""The judge test server (tests/fakes/judge_server.py), with the real azure-ai-evaluation judges and a
plain OpenAI client.

The evaluator tests pin what a judge adapter relies on in azure-ai-evaluation 1.18.10: the scores
and ``<metric>_result`` each marker produces, the request each configuration style sends, the agent
message format, and how each failure reaches the caller. The failure-mode tests use the ``openai``
client directly (no retries, short timeouts) to check what the server puts on the wire.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import logging
import threading
import time
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")

import openai
from judge_server import (
    CONTENT_FILTER_MESSAGE,
    EVALUATORS,
    INTENT_RESOLUTION,
    TASK_ADHERENCE,
    TASK_COMPLETION,
    Behaviour,
    JudgeServer,
    expected_scores,
    hash_scores,
    sample_messages,
)

pytestmark = pytest.mark.timeout(60)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _evaluator_classes() -> dict[str, type]:
    """The three judges, imported lazily (``import azure.ai.evaluation`` takes seconds)."""
    try:
        from azure.ai.evaluation import IntentResolutionEvaluator, TaskAdherenceEvaluator
    except ImportError as error:  # pragma: no cover - depends on the installed SDK
        pytest.fail(f"azure-ai-evaluation does not export the intent/adherence judges any more: {error}")
    try:
        from azure.ai.evaluation._evaluators._task_completion import _TaskCompletionEvaluator
    except ImportError as error:  # pragma: no cover - depends on the installed SDK
        pytest.fail(
            "azure-ai-evaluation moved the private task completion judge "
            f"(azure.ai.evaluation._evaluators._task_completion._TaskCompletionEvaluator): {error}"
        )
    return {
        INTENT_RESOLUTION: IntentResolutionEvaluator,
        TASK_ADHERENCE: TaskAdherenceEvaluator,
        TASK_COMPLETION: _TaskCompletionEvaluator,
    }


@pytest.fixture(autouse=True)
def _quiet_sdk_warnings():
    """The SDK logs a warning for every string query/response it cannot parse as messages."""
    logger = logging.getLogger("azure.ai.evaluation")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _config(server: JudgeServer, style: str) -> dict[str, str]:
    return server.openai_model_config() if style == "openai" else server.azure_model_config()


def _judges(server: JudgeServer, style: str) -> dict[str, Any]:
    return {name: cls(_config(server, style)) for name, cls in _evaluator_classes().items()}


def _client(server: JudgeServer, style: str = "openai", timeout: float = 2.0) -> openai.OpenAI:
    if style == "azure":
        return openai.AzureOpenAI(
            azure_endpoint=server.azure_endpoint,
            azure_deployment=server.deployment,
            api_version=server.api_version,
            api_key="test-key",
            max_retries=0,
            timeout=timeout,
        )
    return openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0, timeout=timeout)


def _ask(client: openai.OpenAI, evaluator: str = INTENT_RESOLUTION, response: str = "The answer. [judge:good]"):
    return client.chat.completions.create(
        model="judge-model",
        messages=sample_messages(evaluator, response),
        response_format={"type": "json_object"},
    )


def _reply(completion) -> dict[str, Any]:
    return json.loads(completion.choices[0].message.content)


QUERY = [
    {"role": "system", "content": "You are a weather agent. Always use the tools."},
    {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
]


def _agent_response(final_text: str) -> list[dict[str, Any]]:
    """An agent run in the format the judges validate: a tool call, its result, then the answer."""
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_call", "tool_call_id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [{"type": "tool_result", "tool_result": {"temp_c": 18, "sky": "cloudy"}}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": final_text}]},
    ]


TOOL_DEFINITIONS = [
    {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]

# marker -> (intent_resolution, task_adherence, task_completion)
MARKER_SCORES = {
    "[judge:good]": (5, 1, 1),
    "[judge:mid]": (3, 1, 0),
    "[judge:bad]": (1, 0, 0),
}


# --------------------------------------------------------------------------------------------------
# The real evaluators against the server
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["openai", "azure"])
def test_real_judges_score_the_markers(judge_server: JudgeServer, style: str) -> None:
    judges = _judges(judge_server, style)
    plain = "Paris is 18 C and cloudy right now."
    cases = [
        (f"{plain} {marker}", dict(zip(EVALUATORS, scores, strict=True))) for marker, scores in MARKER_SCORES.items()
    ]
    cases.append((plain, expected_scores(plain)))
    for response, expected in cases:
        for name, judge in judges.items():
            result = judge(query="What is the weather in Paris?", response=response)
            score = expected[name]
            passed = score >= 3 if name == INTENT_RESOLUTION else score >= 1
            assert result[name] == float(score), (name, response)
            assert result[f"{name}_score"] == float(score)
            assert result[f"{name}_result"] == ("pass" if passed else "fail")
            assert result[f"{name}_passed"] is passed
            assert result[f"{name}_status"] == "completed"
            assert result[f"{name}_reason"].startswith(f"judge-server {name}: score {score} from ")
            # The binary judges report the base class default threshold, not the one they apply (>= 1).
            assert result[f"{name}_threshold"] == 3
            properties = result[f"{name}_properties"]
            assert properties["model"] == judge_server.model
            assert properties["finish_reason"] == "stop"
            assert properties["total_tokens"] > 0
            if name == TASK_COMPLETION:
                assert set(properties) >= {"task_requirements", "delivered_outcome", "completion_gaps"}

    requests = judge_server.requests
    assert judge_server.counts == {name: len(cases) for name in EVALUATORS}
    assert {r.status for r in requests} == {200} and {r.outcome for r in requests} == {"answered"}
    for request in requests:
        assert request.body["response_format"] == {"type": "json_object"}
        assert [m["role"] for m in request.messages] == ["system", "user"]
        assert request.api_key == "test-key"
        assert request.headers["connection"] == "close"  # the SDK opens a new connection per call
        if style == "openai":
            assert request.path == "/v1/chat/completions" and request.query == {}
            assert request.headers["authorization"] == "Bearer test-key"
            assert request.body["model"] == judge_server.model
        else:
            assert request.path == f"/openai/deployments/{judge_server.deployment}/chat/completions"
            assert request.query == {"api-version": "2024-10-21"}
            assert request.headers["api-key"] == "test-key"
            assert request.body["model"] == judge_server.deployment
    # The default scores vary with the response text.
    assert len({tuple(hash_scores(f"answer {i}").values()) for i in range(20)}) > 5


def test_model_configs_are_fresh_dicts_that_the_sdk_completes(judge_server: JudgeServer) -> None:
    classes = _evaluator_classes()
    azure = judge_server.azure_model_config()
    assert "type" not in azure and azure["azure_endpoint"].startswith("http://127.0.0.1:")
    classes[INTENT_RESOLUTION](azure)
    assert azure["type"] == "azure_openai"  # the SDK infers the type and writes it into the caller's dict
    assert judge_server.azure_model_config() != azure

    untyped = judge_server.openai_model_config()
    del untyped["type"]
    judge = classes[INTENT_RESOLUTION](untyped)  # construction succeeds ...
    with pytest.raises(Exception, match="is not a supported connection type"):  # ... the first call does not
        judge(query="q", response="r")
    assert judge_server.count() == 0


def test_agent_messages_with_tool_calls(judge_server: JudgeServer) -> None:
    judges = _judges(judge_server, "openai")
    final = "It is 18 C and cloudy in Paris. [judge:mid] [judge:intent_resolution=4]"
    query, response = copy.deepcopy(QUERY), _agent_response(final)
    for name, judge in judges.items():
        result = judge(query=query, response=response, tool_definitions=TOOL_DEFINITIONS)
        assert result[name] == {INTENT_RESOLUTION: 4.0, TASK_ADHERENCE: 1.0, TASK_COMPLETION: 0.0}[name]
    assert query == QUERY and response == _agent_response(final)  # not modified in place

    sections = {r.evaluator: r.response_text for r in judge_server.requests}
    assert sections[INTENT_RESOLUTION] == final  # text only
    tool_lines = '[TOOL_CALL] get_weather(city="Paris")\n[TOOL_RESULT] {"temp_c": 18, "sky": "cloudy"}\n'
    assert sections[TASK_COMPLETION] == tool_lines + final
    # Task adherence gets the tool lines inside its response; its TOOL_CALLS and SYSTEM_MESSAGE stay empty.
    assert sections[TASK_ADHERENCE] == tool_lines + final
    prompt = next(r for r in judge_server.requests if r.evaluator == TASK_ADHERENCE).messages[1]["content"]
    assert "- SYSTEM_MESSAGE (developer instructions): \n" in prompt
    assert "SYSTEM_PROMPT:\n  You are a weather agent." in prompt
    # Tool definitions are validated but never sent to the model.
    assert all("Current weather for a city" not in json.dumps(r.body) for r in judge_server.requests)


def test_agent_message_formats_the_judges_refuse(judge_server: JudgeServer) -> None:
    judges = _judges(judge_server, "openai")
    nested = copy.deepcopy(_agent_response("18 C."))  # the nested format shown in the SDK docstrings
    nested[0]["content"] = [
        {
            "type": "tool_call",
            "tool_call": {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
        }
    ]
    for judge in judges.values():
        with pytest.raises(Exception, match="must contain a 'name' field"):
            judge(query=QUERY, response=nested)
        with pytest.raises(Exception, match="must be provided as a list of dictionaries"):
            judge(query=QUERY, response=_agent_response("x"), tool_definitions=TOOL_DEFINITIONS[0])
        with pytest.raises(Exception, match="must contain a 'parameters' field"):
            judge(query=QUERY, response=_agent_response("x"), tool_definitions=[{"name": "get_weather"}])
    # A response ending in a function_call is "intermediate": not_applicable without any model call.
    pending = [
        {
            "role": "assistant",
            "content": [{"type": "function_call", "tool_call_id": "c", "name": "get_weather", "arguments": {}}],
        }
    ]
    for name, judge in judges.items():
        result = judge(query=QUERY, response=pending)
        assert result[f"{name}_result"] == "not_applicable" and result[name] is None
    assert judge_server.count() == 0


def test_real_judges_surface_bad_replies(judge_server: JudgeServer) -> None:
    from azure.ai.evaluation._exceptions import EvaluationException

    judges = _judges(judge_server, "azure")

    def call(name: str, mode: str) -> Any:
        judge_server.script(mode, evaluator=name)
        return judges[name](query="q", response="r [judge:good]")

    for name in EVALUATORS:
        with pytest.raises(json.JSONDecodeError):
            call(name, "non_json")
        with pytest.raises(TypeError, match="JSON object must be str"):
            call(name, "filtered_output")
        skipped = call(name, "skipped")
        assert skipped[f"{name}_result"] == "not_applicable" and skipped[name] is None
        assert skipped[f"{name}_reason"].startswith("Not applicable: judge-server")

    for mode in ("out_of_range", "null_score", "missing_score"):
        with pytest.raises(EvaluationException, match="Invalid score value"):
            call(INTENT_RESOLUTION, mode)
    for name in (TASK_ADHERENCE, TASK_COMPLETION):
        assert call(name, "out_of_range")[f"{name}_result"] == "pass"  # 2 is accepted as a pass
        with pytest.raises(TypeError):
            call(name, "null_score")
        assert call(name, "missing_score")[name] == 0.0  # a missing score is a silent fail
    assert call(INTENT_RESOLUTION, 'score:"4"')[INTENT_RESOLUTION] == 4.0
    assert judge_server.count() == 3 * 3 + 3 + 2 * 3 + 1


def test_real_judges_surface_http_errors(judge_server: JudgeServer) -> None:
    from azure.ai.evaluation._legacy.prompty._exceptions import WrappedOpenAIError

    judge = _judges(judge_server, "azure")[TASK_ADHERENCE]

    judge_server.script("content_filter")
    with pytest.raises(WrappedOpenAIError) as caught:  # not retried
        judge(query="q", response="r")
    assert isinstance(caught.value.__cause__, openai.BadRequestError)
    assert caught.value.__cause__.code == "content_filter"
    assert judge_server.count() == 1

    judge_server.script("insufficient_quota")  # a 429 the SDK does not retry
    with pytest.raises(WrappedOpenAIError, match="RateLimitError"):
        judge(query="q", response="r")
    assert judge_server.count() == 2

    # Retryable errors: the SDK waits for Retry-After when the server sends it (else 3 s, 4 s, 6 s ... 60 s).
    judge_server.clear_requests()
    judge_server.script(Behaviour.http_error(500, retry_after=0.01), Behaviour.rate_limit(0.01))
    assert judge(query="q", response="r [judge:good]")[TASK_ADHERENCE] == 1.0
    assert [r.status for r in judge_server.requests] == [500, 429, 200]

    judge_server.clear_requests()
    judge_server.set_mode(Behaviour.http_error(503, retry_after=0.01))
    with pytest.raises(WrappedOpenAIError) as caught:
        judge(query="q", response="r")
    assert isinstance(caught.value.__cause__, openai.InternalServerError)
    assert judge_server.count() == 11  # one attempt and ten retries


def test_a_deadline_around_the_async_judge_cancels_the_request(judge_server: JudgeServer) -> None:
    judge = _judges(judge_server, "openai")[INTENT_RESOLUTION]
    judge_server.set_mode("hang")

    async def scored() -> Any:
        return await asyncio.wait_for(judge._to_async()(query="q", response="r"), timeout=0.5)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(scored())
    assert time.monotonic() - started < 2
    (request,) = judge_server.requests
    assert judge_server.wait_for_outcome(request) == "client_gone"
    assert request.headers["x-stainless-read-timeout"] == "600.0"  # the SDK's own per-attempt timeout


# --------------------------------------------------------------------------------------------------
# Failure modes on the wire (plain OpenAI clients, no retries)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["openai", "azure"])
def test_error_modes_reach_the_client(judge_server: JudgeServer, style: str) -> None:
    client = _client(judge_server, style)

    judge_server.script("http_500")
    with pytest.raises(openai.InternalServerError) as caught:
        _ask(client)
    assert caught.value.status_code == 500
    assert "had an error while processing" in caught.value.message

    judge_server.script(Behaviour.http_error(502, retry_after=0.25))
    with pytest.raises(openai.InternalServerError) as caught:
        _ask(client)
    assert caught.value.status_code == 502 and caught.value.response.headers["retry-after"] == "0.25"

    judge_server.script("rate_limit:2")
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(client)
    headers = caught.value.response.headers
    assert caught.value.status_code == 429
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"

    judge_server.script("insufficient_quota")
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(client)
    assert caught.value.code == "insufficient_quota" and caught.value.type == "insufficient_quota"

    judge_server.script("content_filter")
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client)
    error = caught.value
    assert error.status_code == 400 and error.code == "content_filter" and error.param == "prompt"
    assert error.body["message"] == CONTENT_FILTER_MESSAGE
    assert error.body["innererror"]["code"] == "ResponsibleAIPolicyViolation"
    assert error.body["innererror"]["content_filter_result"]["violence"] == {"filtered": True, "severity": "medium"}

    judge_server.script("disconnect")
    with pytest.raises(openai.APIConnectionError):
        _ask(client)

    assert _reply(_ask(client))["score"] == 5  # back to normal
    assert [r.status for r in judge_server.requests] == [500, 502, 429, 429, 400, None, 200]
    assert judge_server.requests[-2].outcome == "disconnected"


@pytest.mark.parametrize("style", ["openai", "azure"])
def test_content_modes_reach_the_client(judge_server: JudgeServer, style: str) -> None:
    client = _client(judge_server, style)
    judge_server.script("non_json", "out_of_range", "null_score", "missing_score", "skipped", "filtered_output")

    completion = _ask(client)
    assert completion.choices[0].finish_reason == "stop"
    with pytest.raises(json.JSONDecodeError):
        _reply(completion)
    assert _reply(_ask(client))["score"] == 7
    assert _reply(_ask(client)) == {
        "reason": "judge-server intent_resolution: score null from scripted null_score.",
        "score": None,
        "status": "completed",
    }
    assert "score" not in _reply(_ask(client))
    assert _reply(_ask(client))["status"] == "skipped"
    filtered = _ask(client)
    assert filtered.choices[0].finish_reason == "content_filter" and filtered.choices[0].message.content is None

    normal = _ask(client)
    assert _reply(normal)["score"] == 5
    assert normal.object == "chat.completion" and normal.model == judge_server.model
    assert normal.id.startswith("chatcmpl-judge-") and normal.usage.total_tokens > 0
    if style == "azure":
        assert normal.model_extra["prompt_filter_results"][0]["prompt_index"] == 0

    for name, out_of_range in ((TASK_ADHERENCE, 2), (TASK_COMPLETION, 2)):
        judge_server.script("out_of_range")
        assert _reply(_ask(client, name))["score"] == out_of_range


def test_hangs(judge_server: JudgeServer) -> None:
    client = _client(judge_server, timeout=0.3)
    judge_server.script("hang")
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        _ask(client)
    assert 0.25 < time.monotonic() - started < 1.5
    assert judge_server.wait_for_outcome(judge_server.requests[0]) == "client_gone"

    judge_server.script("hang:0.2")
    started = time.monotonic()
    assert _reply(_ask(_client(judge_server, timeout=2)))["score"] == 5
    assert time.monotonic() - started >= 0.2


def test_stop_does_not_wait_for_a_hanging_request() -> None:
    server = JudgeServer().start()
    server.set_mode("hang")
    errors: list[BaseException] = []

    def call() -> None:
        try:
            _ask(_client(server, timeout=30))
        except BaseException as error:
            errors.append(error)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    (request,) = server.wait_for_requests(1)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 1
    caller.join(5)
    assert not caller.is_alive() and isinstance(errors[0], openai.APIConnectionError)
    assert server.wait_for_outcome(request) == "server_stopped"


# --------------------------------------------------------------------------------------------------
# Control, recording and protocol
# --------------------------------------------------------------------------------------------------


def test_scripts_modes_and_precedence(judge_server: JudgeServer) -> None:
    client = _client(judge_server)

    def statuses(evaluator: str, n: int) -> list[int]:
        result = []
        for _ in range(n):
            try:
                _ask(client, evaluator)
                result.append(200)
            except openai.APIStatusError as error:
                result.append(error.status_code)
        return result

    judge_server.script("http_500", "http_503", evaluator=TASK_COMPLETION)
    assert statuses(INTENT_RESOLUTION, 1) == [200]
    assert statuses(TASK_COMPLETION, 3) == [500, 503, 200]

    judge_server.set_mode("http_502", times=2)
    judge_server.set_mode("rate_limit:0.1", evaluator=TASK_ADHERENCE)
    judge_server.script("http_504")
    assert statuses(TASK_ADHERENCE, 3) == [504, 429, 429]  # script first; own mode over the global one
    assert statuses(INTENT_RESOLUTION, 3) == [502, 502, 200]  # the global mode ran out
    judge_server.reset(evaluator=TASK_ADHERENCE)
    assert statuses(TASK_ADHERENCE, 1) == [200]

    judge_server.set_mode("http_500")
    judge_server.reset()
    assert statuses(INTENT_RESOLUTION, 1) == [200]

    # Fault markers in the text pick requests out regardless of order or concurrency.
    judge_server.script("http_503")
    assert _reply(_ask(client, TASK_ADHERENCE, "answer [judge:fault=score:0.5@task_adherence]"))["score"] == 0.5
    assert statuses(INTENT_RESOLUTION, 1) == [503]  # the script was not consumed by the marked request
    assert (
        _reply(_ask(client, INTENT_RESOLUTION, "ok [judge:bad] [judge:fault=http_500@task_completion]"))["score"] == 1
    )
    with pytest.raises(openai.RateLimitError):
        _ask(client, TASK_COMPLETION, "x [judge:fault=rate_limit:0.5]")

    with pytest.raises(ValueError, match="unknown judge behaviour"):
        judge_server.set_mode("explode")
    with pytest.raises(ValueError, match="unknown evaluator"):
        judge_server.script("http_500", evaluator="groundedness")
    assert judge_server.counts[TASK_COMPLETION] == 4 and judge_server.counts[TASK_ADHERENCE] == 5


def test_records_concurrent_requests(judge_server: JudgeServer) -> None:
    clients = [_client(judge_server) for _ in range(4)]
    evaluators = [EVALUATORS[i % 3] for i in range(24)]
    judge_server.set_mode("http_500", evaluator=TASK_ADHERENCE)

    def call(i: int) -> None:
        with pytest.raises(openai.InternalServerError) if evaluators[i] == TASK_ADHERENCE else _no_error():
            _ask(clients[i % 4], evaluators[i], f"answer {i}")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    requests = judge_server.requests
    assert len(requests) == 24 and judge_server.counts == {name: 8 for name in EVALUATORS}
    assert sorted(r.response_text for r in requests) == sorted(f"answer {i}" for i in range(24))
    assert all(r.status == (500 if r.evaluator == TASK_ADHERENCE else 200) for r in requests)
    assert all(r.timestamp > 0 and r.headers["authorization"] == "Bearer test-key" for r in requests)
    judge_server.clear_requests()
    assert judge_server.requests == [] and judge_server.count() == 0


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_rejects_requests_like_the_real_services(judge_server: JudgeServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=judge_server.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    wrong_deployment = openai.AzureOpenAI(
        azure_endpoint=judge_server.azure_endpoint,
        azure_deployment="other",
        api_version="2024-10-21",
        api_key="test-key",
        max_retries=0,
    )
    with pytest.raises(openai.NotFoundError) as caught:
        wrong_deployment.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "DeploymentNotFound"

    judge_server.script("http_500")  # rejected requests do not consume scripted behaviours
    connection = http.client.HTTPConnection(judge_server.host, judge_server.port, timeout=2)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    answers = []
    for path, headers in (
        (f"/openai/deployments/{judge_server.deployment}/chat/completions", {"api-key": "test-key"}),
        ("/v1/embeddings", {"api-key": "test-key"}),
        ("/v1/chat/completions", {"api-key": "test-key"}),
        ("/chat/completions", {"Authorization": "Bearer test-key"}),
    ):
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        answer = connection.getresponse()
        answers.append((answer.status, json.loads(answer.read())))
    connection.close()
    assert answers[0][0] == 400 and answers[0][1]["error"]["code"] == "MissingApiVersionParameter"
    assert answers[1][0] == 404
    assert answers[2][0] == 500  # the scripted one, on the same keep-alive connection
    assert answers[3][0] == 200 and answers[3][1]["choices"][0]["message"]["role"] == "assistant"
    assert [r.evaluator for r in judge_server.requests][-1] == "unknown"

    open_server = JudgeServer(api_key=None).start()
    try:
        assert _reply(_ask(openai.OpenAI(base_url=open_server.base_url, api_key="any", max_retries=0)))["score"] == 5
    finally:
        open_server.stop()


def test_behaviour_strings() -> None:
    assert Behaviour.parse("http_503") == Behaviour.http_error(503)
    assert Behaviour.parse("http_429") == Behaviour.rate_limit(1.0)
    assert Behaviour.parse("rate_limit:0.5") == Behaviour.rate_limit(0.5)
    assert Behaviour.parse("hang") == Behaviour.hang(None)
    assert Behaviour.parse("hang:2") == Behaviour.hang(2.0)
    assert Behaviour.parse("score:null") == Behaviour.with_score(None)
    assert Behaviour.parse(Behaviour.skipped()) is not None
    assert expected_scores("x [judge:mid]") == {INTENT_RESOLUTION: 3, TASK_ADHERENCE: 1, TASK_COMPLETION: 0}
    assert expected_scores("x [judge:task_completion=null] [judge:good]")[TASK_COMPLETION] is None


@pytest.mark.parametrize("style", ["openai", "azure"])
def test_replies_stop_at_the_completion_limit(judge_server: JudgeServer, style: str) -> None:
    client = _client(judge_server, style)
    whole = _ask(client)
    assert whole.choices[0].finish_reason == "stop"
    content = whole.choices[0].message.content
    for key in ("max_tokens", "max_completion_tokens"):
        cut = client.chat.completions.create(
            model="judge-model",
            messages=sample_messages(INTENT_RESOLUTION, "The answer. [judge:good]"),
            response_format={"type": "json_object"},
            **{key: 5},
        )
        assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content == content[:20]
        assert cut.usage.completion_tokens == 5
        assert judge_server.requests[-1].body[key] == 5  # the limit is recorded as sent
    roomy = client.chat.completions.create(
        model="judge-model", messages=sample_messages(INTENT_RESOLUTION, "The answer. [judge:good]"), max_tokens=500
    )
    assert roomy.choices[0].finish_reason == "stop"
    judge_server.script("length")
    padded = client.chat.completions.create(
        model="judge-model", messages=sample_messages(INTENT_RESOLUTION, "The answer. [judge:good]"), max_tokens=100
    )
    assert padded.choices[0].finish_reason == "length" and len(padded.choices[0].message.content) == 400
    assert json.loads(padded.choices[0].message.content) == json.loads(content)  # complete JSON, then whitespace
