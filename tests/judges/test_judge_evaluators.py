"""The real azure-ai-evaluation evaluators through the judge adapter, against the local
OpenAI-compatible judge server: scores, configuration styles, and every failure mode within
its time bound. What the judge port promises of every judge (scales and names, the same judgement
for the same episode, an empty output, invalid output, a transient failure, the deadline) is
tested once per adapter in ``test_judge_contract.py``."""

from __future__ import annotations

import json
import math
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.ai.evaluation")

from support.judge_limits import fast_limits

from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import PermanentError, TransientError
from agent_learning.documents import Episode, Step
from agent_learning.judges.evaluators import DEADLINE_GRACE, EvaluatorJudge, JudgeLimits, JudgeModel
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import create_policy
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(120)

FAST = fast_limits(max_attempts=3)
SLACK = 1.0  # scheduling and client start-up on top of the configured bound


def episode(output: str, *, episode_id: str = "ep-1", tools: bool = True) -> Episode:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    steps = (
        [
            Step(
                name="search",
                status="ok",
                latency_ms=12,
                arguments={"q": "reset password"},
                result="Settings > Security > Reset password",
                call_id="call_1",
            )
        ]
        if tools
        else []
    )
    return Episode(
        id=episode_id,
        agent_id="support-bot",
        policy_version=1,
        action_id="k=3",
        probability=0.25,
        logprob=math.log(0.25),
        input="How do I reset my password?",
        output=output,
        instructions="Answer concisely from the knowledge base.",
        steps=steps,
        started_at=now,
        ended_at=now + timedelta(seconds=2),
    )


def openai_model(server: Any) -> JudgeModel:
    return JudgeModel(base_url=server.base_url, model=server.model, api_key="test-key")


def azure_model(server: Any) -> JudgeModel:
    return JudgeModel(
        azure_endpoint=server.azure_endpoint,
        deployment=server.deployment,
        api_version=server.api_version,
        api_key="test-key",
    )


@pytest.fixture
def judge(judge_server: Any) -> EvaluatorJudge:
    return EvaluatorJudge(openai_model(judge_server), FAST)


# --------------------------------------------------------------------------- scores


@pytest.mark.parametrize("style", ["openai", "azure"])
@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("[judge:good]", {"intent_resolution": 5.0, "task_adherence": 1.0, "task_completion": 1.0}),
        ("[judge:mid]", {"intent_resolution": 3.0, "task_adherence": 1.0, "task_completion": 0.0}),
        ("[judge:bad]", {"intent_resolution": 1.0, "task_adherence": 0.0, "task_completion": 0.0}),
    ],
)
def test_real_evaluators_score_episodes(judge_server: Any, style: str, marker: str, expected: dict) -> None:
    model = openai_model(judge_server) if style == "openai" else azure_model(judge_server)
    judge = EvaluatorJudge(model, FAST)
    judgement = judge.judge(episode(f"Open Settings, choose Security, select Reset password. {marker}"))
    assert {m: s.raw for m, s in judgement.metrics.items()} == expected  # scales, names: test_judge_contract.py
    assert judgement.metrics["intent_resolution"].result == ("pass" if expected["intent_resolution"] >= 3 else "fail")
    assert all(s.prompt_tokens and s.completion_tokens for s in judgement.metrics.values())  # the judge's usage
    # Azure names the deployment; the reply names the model that answered (its version may change).
    served = model.name if style == "openai" else f"{judge_server.deployment} ({judge_server.model})"
    assert judgement.judge.model == served
    requests = judge_server.requests
    assert len(requests) == 3 and {r.evaluator for r in requests} == set(expected)
    if style == "azure":
        assert all(f"/openai/deployments/{judge_server.deployment}/" in r.path for r in requests)
        assert all(r.query.get("api-version") for r in requests)


def test_the_conversation_reaches_the_judge_with_tool_calls(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge.judge(episode("Open Settings, choose Security, select Reset password. [judge:good]"))
    (completion,) = [r for r in judge_server.requests if r.evaluator == "task_completion"]
    prompt = json.dumps(completion.body["messages"])
    assert "How do I reset my password?" in prompt and "search" in prompt and "Reset password" in prompt


def test_evaluators_are_built_once_and_reused(judge_server: Any, judge: EvaluatorJudge) -> None:
    evaluators = dict(judge.evaluators)
    for i in range(3):
        judge.judge(episode(f"answer {i} [judge:good]", episode_id=f"ep-{i}"))
    assert judge.evaluators == evaluators and all(judge.retry_loop_disabled.values())
    assert judge.attempts == {"intent_resolution": 3, "task_adherence": 3, "task_completion": 3}


# --------------------------------------------------------------------------- failure modes


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    try:
        return fn(), time.perf_counter() - t0
    except Exception as exc:
        return exc, time.perf_counter() - t0


def test_a_brief_server_error_is_retried_and_recovers(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.script("http_500", "http_503", evaluator="task_adherence")
    result, seconds = timed(lambda: judge.judge(episode("fine [judge:good]")))
    assert result.metrics["task_adherence"].raw == 1.0
    assert judge_server.count("task_adherence") == 3 and seconds < FAST.episode_deadline + SLACK


def test_429_honours_retry_after(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.script("rate_limit:0.4", evaluator="intent_resolution")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert result.metrics["intent_resolution"].raw == 5.0
    assert 0.4 <= seconds < FAST.episode_deadline + SLACK
    times = [r.timestamp for r in judge_server.requests if r.evaluator == "intent_resolution"]
    assert len(times) == 2 and times[1] - times[0] >= 0.39


def test_a_long_retry_after_is_capped(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.set_mode("rate_limit:120")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, TransientError) and "429" in str(result)
    assert "Please try again in 120" in str(result)  # the server's own words, for the operator
    assert seconds < FAST.episode_deadline + SLACK  # not 120 s


@pytest.mark.parametrize("mode", ["insufficient_quota", "http_401", "http_404"])
def test_a_judge_only_its_configuration_can_fix_is_not_retried(
    judge_server: Any, judge: EvaluatorJudge, mode: str
) -> None:
    judge_server.set_mode(mode)
    result, _ = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, TransientError) and "check the judge configuration" in str(result), result
    counts = [judge_server.count(m) for m in ("intent_resolution", "task_adherence", "task_completion")]
    assert max(counts) == 1  # not max_attempts calls each: the message comes again, once it is fixed
    if mode == "insufficient_quota":
        assert "out of quota" in str(result)


def test_the_deadline_that_cut_a_judge_off_is_the_one_named(judge_server: Any) -> None:
    shorter = JudgeLimits(attempt_timeout=2.0, evaluator_deadline=3.0, episode_deadline=1.5, max_attempts=2)
    judge = EvaluatorJudge(openai_model(judge_server), shorter)
    judge_server.set_mode("hang")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, TransientError) and "within AGENT_LEARNING_JUDGE_EPISODE_DEADLINE (1.5 s)" in str(
        result
    ), result  # it said "within the deadline (3 s)", the evaluator deadline that never came
    assert seconds < shorter.episode_deadline + SLACK
    judge.close()


def test_a_blocked_event_loop_cannot_hold_the_caller_past_the_deadline(
    judge_server: Any, judge: EvaluatorJudge
) -> None:
    judge.judge(episode("warm up [judge:good]"))
    # Something synchronous on the judge's loop (an Entra ID token fetched with a synchronous
    # credential, say) stops it from enforcing its own deadlines.
    blocked = FAST.episode_deadline + DEADLINE_GRACE + 1.0
    judge._runner.loop.call_soon_threadsafe(time.sleep, blocked)
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, TransientError) and "AGENT_LEARNING_JUDGE_EPISODE_DEADLINE" in str(result), result
    assert seconds < FAST.episode_deadline + DEADLINE_GRACE + SLACK
    time.sleep(blocked - seconds)
    assert judge.judge(episode("after [judge:bad]")).metrics["intent_resolution"].raw == 1.0
    assert judge_server.count() == 6  # the abandoned judgement was cancelled, never sent


def test_a_reply_that_is_not_json_is_permanent_after_retries(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.set_mode("non_json", evaluator="task_adherence")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, PermanentError), result
    assert "task_adherence" in str(result) or "TaskAdherence" in str(result)
    assert judge_server.count("task_adherence") == FAST.max_attempts
    assert seconds < FAST.episode_deadline + SLACK


def test_the_attempts_an_invalid_reply_got_are_counted_truly(judge_server: Any) -> None:
    no_room = JudgeLimits(attempt_timeout=1.0, evaluator_deadline=1.5, episode_deadline=2.0, max_attempts=4,
                          backoff_base=4.0, backoff_max=4.0)  # the first backoff (2-4 s) passes the deadline
    judge = EvaluatorJudge(openai_model(judge_server), no_room)
    judge_server.set_mode("non_json", evaluator="task_adherence")
    result, _ = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, PermanentError) and judge_server.count("task_adherence") == 1
    assert "still invalid after 1 of 4 attempts" in str(result)


def test_content_filter_is_permanent_at_once(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.set_mode("content_filter", evaluator="task_completion")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, PermanentError) and "content filter" in str(result)
    assert judge_server.count("task_completion") == 1 and seconds < FAST.attempt_timeout + SLACK


def test_one_evaluator_failing_for_good_stops_the_others_retries(judge_server: Any, judge: EvaluatorJudge) -> None:
    judge_server.set_mode("hang", evaluator="intent_resolution")  # would time out 3 times, for 3 s
    judge_server.set_mode("content_filter", evaluator="task_completion")
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, PermanentError) and "content filter" in str(result)
    # Not retried: at most its first call, which a busy machine may not even have sent when the
    # permanent failure stopped the episode.
    assert judge_server.count("intent_resolution") <= 1 and seconds < FAST.attempt_timeout + SLACK


@pytest.mark.parametrize(
    ("evaluator", "said", "expected"),
    [("intent_resolution", '"4"', 4.0), ("task_adherence", '"0"', 0.0), ("task_completion", '"1"', 1.0)],
)
def test_a_quoted_score_counts_as_the_number_the_evaluator_reads(
    judge_server: Any, judge: EvaluatorJudge, evaluator: str, said: str, expected: float
) -> None:
    judge_server.set_mode(f"score:{said}", evaluator=evaluator)
    judgement = judge.judge(episode("x [judge:good]"))
    assert judgement.metrics[evaluator].raw == expected and judge_server.count(evaluator) == 1


@pytest.mark.parametrize("shared", [True, False])
def test_a_reply_withheld_by_the_content_filter_is_permanent_at_once(
    judge_server: Any, judge: EvaluatorJudge, shared: bool
) -> None:
    import asyncio

    judge_server.set_mode("filtered_output", evaluator="task_adherence")  # HTTP 200, null content
    ep = episode("x [judge:good]")
    # On another loop the evaluators' own flow sends: it was retried and reported as a TypeError.
    result, _ = timed((lambda: judge.judge(ep)) if shared else (lambda: asyncio.run(judge.judge_async(ep))))
    assert isinstance(result, PermanentError) and "content filter withheld its reply" in str(result), result
    assert judge_server.count("task_adherence") == 1


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],  # OpenAI's tools
        [{"name": "search"}],  # no parameters
    ],
)
def test_tool_definitions_in_any_form_are_judged(judge_server: Any, judge: EvaluatorJudge, tools: list) -> None:
    with_tools = episode("Open Settings. [judge:good]").model_copy(update={"tool_definitions": tools})
    judgement = judge.judge(with_tools)
    assert judgement.metrics["task_completion"].raw == 1.0 and judge_server.count() == 3


def test_judging_from_inside_an_event_loop_works(judge_server: Any, judge: EvaluatorJudge) -> None:
    import asyncio

    async def agent() -> Any:
        return judge.judge(episode("x [judge:good]"))

    assert asyncio.run(agent()).metrics["intent_resolution"].raw == 5.0


# --------------------------------------------------------------------------- the score handler end to end


def test_the_embedded_pipeline_scores_with_the_real_evaluators(judge_server: Any, tmp_path: Path) -> None:
    clock = ManualClock()
    store, queue = SQLiteStore(tmp_path / "p.db"), SQLiteQueue(tmp_path / "p.db", clock=clock, max_deliveries=3)
    pipeline = LocalPipeline(
        store, queue, EvaluatorJudge(openai_model(judge_server), FAST), RewardFunction(), Reinforce(), clock=clock
    )
    first = SoftmaxPolicy.from_actions("support-bot", ["k=1", "k=3"]).to_document(created_at=clock.now())
    policy = SoftmaxPolicy.from_document(create_policy(store, first), seed=1)
    rng = random.Random(0)
    from agent_learning.agent.capture import EpisodeCapture

    for i in range(6):
        decision = policy.choose()
        marker = "[judge:good]" if decision.action_id == "k=3" else "[judge:bad]"
        if i == 5:
            marker = "[judge:fault=non_json@task_completion]"  # a poison episode
        with EpisodeCapture(
            store, decision, input="How do I reset my password?", episode_id=f"ep-{i}", clock=clock
        ) as run:
            run.end(f"Open Settings and reset it ({rng.random():.3f}). {marker}")
    judge_server.script(
        "http_503", "http_503", "http_503", "http_503", "http_503", "http_503", "http_503", "http_503", "http_503"
    )  # an outage: the first delivery of the first episode fails
    report = pipeline.run_once()
    assert report.outcomes["scored"] + report.outcomes.get("retry", 0) >= 5
    clock.advance(61)
    while extra := pipeline.score_pending():
        report.outcomes.update(extra)
        clock.advance(61)
    scores = {r["id"]: r for r in store.read_scores("support-bot", None, 100)}
    assert set(scores) == {f"ep-{i}" for i in range(5)}
    for eid, row in scores.items():
        good = "good" in store.get_episode(eid)["output"]  # type: ignore[index]
        assert row["metrics"]["intent_resolution"]["raw"] == (5.0 if good else 1.0)
        assert row["judge"]["name"].startswith("azure-ai-evaluation")
        assert row["reward"] > 0.9 if good else row["reward"] < 0.1
        judged = sum(m["prompt_tokens"] + m["completion_tokens"] for m in row["metrics"].values())
        assert row["measures"]["judge_tokens"] == judged > 0 and row["measures"]["tool_calls"] == 0
    (dead,) = queue.dead_letters()
    assert dead.message_id == "ep-5" and dead.reason == "JudgeFailed" and "TaskCompletion" in dead.description
    assert store.get_score("ep-5", "support-bot") is None


def test_every_evaluator_call_has_a_span_inside_the_judge_span(judge_server: Any, judge: EvaluatorJudge) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_learning.core import telemetry
    from agent_learning.pipeline import run_judge

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install(provider)
    try:
        judge_server.script("http_500", evaluator="task_adherence")
        run_judge(judge, episode("fine [judge:good]"))
    finally:
        telemetry.install()
    spans = exporter.get_finished_spans()
    (outer,) = [s for s in spans if s.name == telemetry.SPAN_JUDGE]
    inner = {s.attributes["metric"]: s for s in spans if s.name == telemetry.SPAN_EVALUATOR}
    assert set(inner) == {"intent_resolution", "task_adherence", "task_completion"}
    assert all(s.parent is not None and s.parent.span_id == outer.context.span_id for s in inner.values())
    assert inner["task_adherence"].attributes["attempts"] == 2
    assert inner["intent_resolution"].attributes["attempts"] == 1
    assert outer.attributes["judge"] == judge.info.name


# --------------------------------------------------------------------------- client reuse


def test_the_evaluators_share_long_lived_clients_and_keep_connections_alive(
    judge_server: Any, judge: EvaluatorJudge
) -> None:
    assert all(judge.shared_clients.values())
    for i in range(3):
        judge.judge(episode(f"answer {i} [judge:good]", episode_id=f"ep-{i}"))
    requests = judge_server.requests
    assert len(requests) == 9
    # The stock flow sends "Connection: close" and builds a client per call; the shared clients do neither.
    assert not any(r.headers.get("connection", "").lower() == "close" for r in requests)
    assert all(r.headers.get("user-agent", "").startswith("azure-ai-evaluation/") for r in requests)
    clients = judge._clients._clients
    assert len(clients) == 3 and len({id(c._client) for c in clients.values()}) == 1  # one connection pool
    judge.close()
    judgement = judge.judge(episode("after close [judge:bad]"))  # a closed judge starts again on use
    assert judgement.metrics["intent_resolution"].raw == 1.0
    judge.close()


@pytest.mark.parametrize("style", ["openai", "azure"])
def test_the_shared_client_sends_what_the_stock_flow_sends(judge_server: Any, style: str) -> None:
    model = openai_model(judge_server) if style == "openai" else azure_model(judge_server)
    shared = EvaluatorJudge(model, FAST)
    shared.judge(episode("same request [judge:mid]"))
    stock = EvaluatorJudge(model, FAST)
    import asyncio

    asyncio.run(stock.judge_async(episode("same request [judge:mid]")))  # another loop: the stock flow
    first, second = judge_server.requests[:3], judge_server.requests[3:]
    assert [r.headers.get("connection") for r in second] == ["close"] * 3
    assert {r.evaluator: (r.path, r.query, r.body) for r in first} == {
        r.evaluator: (r.path, r.query, r.body) for r in second
    }
    headers = ("user-agent", "x-ms-useragent", "api-key", "authorization", "content-type")
    assert {r.evaluator: [r.headers.get(h) for h in headers] for r in first} == {
        r.evaluator: [r.headers.get(h) for h in headers] for r in second
    }
    shared.close()


def test_without_the_hook_the_stock_flow_runs_and_says_so_once(
    judge_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from agent_learning.judges import prompty

    class Moved:
        """A flow whose private parts moved in some other version."""

    monkeypatch.setattr(prompty, "_warned", set())
    original = prompty.SharedClientFlow.messages
    monkeypatch.setattr(prompty.SharedClientFlow, "messages", lambda self, inputs: [Moved()])
    with caplog.at_level("WARNING", logger="agent_learning.judges.prompty"):
        judge = EvaluatorJudge(openai_model(judge_server), FAST)
        EvaluatorJudge(openai_model(judge_server), FAST)
    monkeypatch.setattr(prompty.SharedClientFlow, "messages", original)
    assert not any(judge.shared_clients.values())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3 and all("cannot reuse a judge client" in w for w in warnings)  # once per evaluator
    judgement = judge.judge(episode("fine [judge:good]"))
    assert judgement.metrics["task_completion"].raw == 1.0
    assert all(r.headers.get("connection") == "close" for r in judge_server.requests)


# --------------------------------------------------------------------------- completion limits


def test_each_evaluator_sends_its_completion_limit(judge_server: Any) -> None:
    from agent_learning.judges.evaluators import JudgeTokens

    defaults = JudgeTokens()
    judge = EvaluatorJudge(azure_model(judge_server), FAST)
    judge.judge(episode("x [judge:good]"))
    sent = {r.evaluator: r.body for r in judge_server.requests}
    # The key is the one each prompty file uses; the value is ours, not the evaluator's 800 / 3,000 / 1,500.
    assert sent["intent_resolution"]["max_tokens"] == defaults.max_tokens_intent_resolution == 200
    assert sent["task_adherence"]["max_completion_tokens"] == defaults.max_tokens_task_adherence == 400
    assert sent["task_completion"]["max_tokens"] == defaults.max_tokens_task_completion == 700
    assert "max_tokens" not in sent["task_adherence"] and "max_completion_tokens" not in sent["intent_resolution"]
    assert judge.max_tokens == {"intent_resolution": 200, "task_adherence": 400, "task_completion": 700}
    judge.close()
    custom = JudgeTokens(
        max_tokens_intent_resolution=150, max_tokens_task_adherence=250, max_tokens_task_completion=350
    )
    judge = EvaluatorJudge(openai_model(judge_server), FAST, tokens=custom)
    judge_server.clear_requests()
    judge.judge(episode("x [judge:good]"))
    sent = {r.evaluator: r.body for r in judge_server.requests}
    assert (
        sent["intent_resolution"]["max_tokens"],
        sent["task_adherence"]["max_completion_tokens"],
        sent["task_completion"]["max_tokens"],
    ) == (150, 250, 350)
    judge.close()


def test_a_reply_cut_off_at_the_limit_is_invalid_never_a_score(judge_server: Any) -> None:
    from agent_learning.judges.evaluators import JudgeTokens

    tight = JudgeTokens(max_tokens_task_completion=10)  # the server cuts its reply there: broken JSON
    judge = EvaluatorJudge(openai_model(judge_server), FAST, tokens=tight)
    result, seconds = timed(lambda: judge.judge(episode("x [judge:good]")))
    assert isinstance(result, PermanentError), result
    assert "cut off" in str(result) and "AGENT_LEARNING_JUDGE_MAX_TOKENS_TASK_COMPLETION" in str(result)
    completion = [r for r in judge_server.requests if r.evaluator == "task_completion"]
    assert len(completion) == FAST.max_attempts and all(r.body["max_tokens"] == 10 for r in completion)
    assert seconds < FAST.episode_deadline + SLACK
    judge.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_complete_reply_padded_to_the_limit_is_invalid_too(judge_server: Any, shared: bool) -> None:
    import asyncio

    judge = EvaluatorJudge(openai_model(judge_server), FAST)
    judge_server.set_mode("length", evaluator="intent_resolution")
    ep = episode("x [judge:good]")
    # The shared client checks the finish reason itself; the stock flow (on another loop) leaves it to the output.
    run = (lambda: judge.judge(ep)) if shared else (lambda: asyncio.run(judge.judge_async(ep)))
    result, _ = timed(run)
    assert isinstance(result, PermanentError) and "cut off" in str(result), result
    assert judge_server.count("intent_resolution") == FAST.max_attempts
    judge.close()
