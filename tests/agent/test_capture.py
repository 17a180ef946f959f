"""Agent side: EpisodeCapture writes episodes, PolicyClient serves the current policy."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from factories import record_steps_at_the_caps

from agent_learning.agent.capture import _MARK, EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, NotFound
from agent_learning.documents import (
    MAX_EPISODE_BYTES,
    MAX_JSON_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_STEP_TEXT_CHARS,
    MAX_STEPS,
    MAX_TEXT_CHARS,
    MAX_TOOL_DEFINITIONS_CHARS,
    Action,
    Episode,
    json_bytes,
)
from agent_learning.pipeline import create_policy, score_request_message
from agent_learning.policy.softmax import Decision, SoftmaxPolicy
from agent_learning.store.memory import MemoryStore
from agent_learning.store.sqlite import SQLiteStore

AGENT = "helper"


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def decision() -> Decision:
    actions = [Action(id="fast"), Action(id="careful", config={"model": "big"})]
    policy = SoftmaxPolicy(AGENT, actions, [0.0, 1.0], version=4, rng=random.Random(3))
    return policy.decision_for("careful")


def capture(store: MemoryStore, decision: Decision, clock: ManualClock, **kw: object) -> EpisodeCapture:
    options: dict[str, object] = {"input": "What is 2 + 2?", "episode_id": "ep-1", "clock": clock} | kw
    return EpisodeCapture(store, decision, **options)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- sync flow


def test_the_agents_own_reward_is_stored_and_a_bad_one_names_the_field(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    run = capture(store, decision, clock)
    for bad in (1.5, -0.1, math.nan, True, "0.8"):
        with pytest.raises(InvalidDocument, match=r"reward: must be a number from 0 to 1"):
            run.end("4", reward=bad)  # type: ignore[arg-type]
    assert run.end("4", reward=1).reward == 1.0 and store.get_episode("ep-1")["reward"] == 1.0
    plain = capture(store, decision, clock, episode_id="ep-2").end("4")
    assert plain.reward is None and "reward" not in store.get_episode("ep-2")  # absent, as before


def test_a_reward_set_before_a_crash_is_carried_by_the_crash_episode(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(RuntimeError), capture(store, decision, clock) as run:
        run.reward = 0.0
        raise RuntimeError("the tests did not even run")
    assert store.get_episode("ep-1")["reward"] == 0.0


class _Counting:
    """A pydantic validator or serializer that counts its calls by method."""

    def __init__(self, inner: object, calls: Counter[str]) -> None:
        self._inner, self._calls = inner, calls

    def __getattr__(self, name: str) -> object:
        self._calls[name] += 1
        return getattr(self._inner, name)


def test_an_episode_is_validated_and_serialised_once_on_its_way_to_the_store(
    decision: Decision, clock: ManualClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "e.db")
    run = capture(store, decision, clock)  # type: ignore[arg-type]
    run.step("search", latency_ms=5, arguments={"q": "2 + 2"}, result="4")
    calls: Counter[str] = Counter()
    for attr in ("__pydantic_validator__", "__pydantic_serializer__"):
        monkeypatch.setattr(Episode, attr, _Counting(getattr(Episode, attr), calls))
    episode = run.end("4")
    assert calls == {"validate_python": 1, "to_json": 1}
    assert store.get_episode("ep-1") == json.loads(episode.to_json())
    store.close()


def test_full_flow_stores_the_episode(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock, instructions="Explain.", metadata={"user": "u1", "n": 2})
    run.step("retrieve", latency_ms=12.5, kind="retrieval", result=["doc-1"])
    with run.tool("search", arguments={"q": "2 + 2"}, call_id="c1") as call:
        call.result = {"hits": 3}
    with pytest.raises(TimeoutError, match="slow"), run.tool("calculator", arguments={"expr": "2+2"}):
        raise TimeoutError("slow")
    run.step("answer", latency_ms=0, kind="llm")
    clock.advance(2.5)
    episode = run.end("2 + 2 = 4")

    assert isinstance(episode, Episode)
    assert store.get_episode("ep-1") == episode.to_dict()
    assert Episode.from_dict(store.get_episode("ep-1")) == episode
    assert (episode.agent_id, episode.action_id, episode.policy_version) == (AGENT, "careful", 4)
    assert (episode.probability, episode.logprob) == (decision.probability, decision.logprob)
    assert episode.input == "What is 2 + 2?" and episode.output == "2 + 2 = 4"
    assert episode.instructions == "Explain."
    assert episode.metadata == {"user": "u1", "n": 2}
    assert episode.latency_ms == 2500.0
    assert episode.truncated == []

    names = [(s.name, s.kind, s.status) for s in episode.steps]
    assert names == [
        ("retrieve", "retrieval", "ok"),
        ("search", "tool", "ok"),
        ("calculator", "tool", "error"),
        ("answer", "llm", "ok"),
    ]
    retrieve, search, calc, answer = episode.steps
    assert retrieve.latency_ms == 12.5 and retrieve.result == '["doc-1"]'
    assert search.result == '{"hits": 3}' and search.arguments == {"q": "2 + 2"} and search.call_id == "c1"
    assert search.latency_ms >= 0 and search.error is None
    assert calc.error == "TimeoutError: slow" and calc.result is None and calc.arguments == {"expr": "2+2"}
    assert answer.latency_ms == 0.0
    assert episode.failed_steps == 1


def test_latency_comes_from_the_clock(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    start = clock.now()
    run = capture(store, decision, clock)
    clock.advance(0.125)
    episode = run.end("4")
    assert episode.started_at == start
    assert episode.ended_at == clock.now()
    assert episode.latency_ms == 125.0


def test_episode_id_defaults_to_a_fresh_hex_id(store: MemoryStore, decision: Decision) -> None:
    a = EpisodeCapture(store, decision, input="q").end("a")
    b = EpisodeCapture(store, decision, input="q").end("b")
    assert a.id != b.id
    assert len(a.id) == 32 and set(a.id) <= set("0123456789abcdef")
    assert {e["id"] for e in store.list_episodes(AGENT)} == {a.id, b.id}


def test_step_with_error_status_gets_an_error_text(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    run.step("lookup", latency_ms=1.0, status="error")
    episode = run.end("x")
    assert episode.steps[0].status == "error"
    assert episode.steps[0].error == "error"


def test_redaction_hook_applies_to_input(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    seen: list[str] = []

    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("hunter2", "[redacted]")

    run = capture(store, decision, clock, input="my password is hunter2", redact=redact)
    episode = run.end("ok")
    assert seen == ["my password is hunter2"]
    assert episode.input == "my password is [redacted]"
    assert "hunter2" not in str(store.get_episode("ep-1"))


def test_oversized_output_is_truncated_and_still_valid(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    episode = capture(store, decision, clock).end("y" * (MAX_TEXT_CHARS + 100))
    assert episode.truncated == ["output"]
    assert len(episode.output) == MAX_TEXT_CHARS
    assert episode.output.startswith("y" * 100) and episode.output.endswith("[truncated]")
    assert Episode.from_dict(store.get_episode("ep-1")) == episode


def test_output_at_the_limit_is_kept(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    episode = capture(store, decision, clock).end("y" * MAX_TEXT_CHARS)
    assert episode.truncated == []
    assert episode.output == "y" * MAX_TEXT_CHARS


def test_oversized_input_instructions_and_step_text_truncated(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    big = "z" * (MAX_TEXT_CHARS + 1)
    run = capture(store, decision, clock, input=big, instructions=big)
    run.step("tool", latency_ms=1, result="r" * (MAX_STEP_TEXT_CHARS + 1))
    episode = run.end("ok")
    assert episode.truncated == ["input", "instructions", "steps"]
    assert len(episode.input) == len(episode.instructions or "") == MAX_TEXT_CHARS
    assert len(episode.steps[0].result or "") == MAX_STEP_TEXT_CHARS
    assert Episode.from_json(episode.to_json()) == episode


def test_tool_definitions_over_their_cap_keep_the_leading_ones_that_fit(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """An agent with many tools (50 schemas of ~1 KB) failed at EpisodeCapture(...), every run."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 1_000, "parameters": {}}}
        for i in range(50)
    ]
    episode = capture(store, decision, clock, tool_definitions=tools).end("ok")
    kept = episode.tool_definitions or []
    assert episode.truncated == ["tool_definitions"] and 0 < len(kept) < len(tools) and kept == tools[: len(kept)]
    assert len(json.dumps(kept, separators=(",", ":"))) <= MAX_TOOL_DEFINITIONS_CHARS
    assert len(json.dumps(tools[: len(kept) + 1], separators=(",", ":"))) > MAX_TOOL_DEFINITIONS_CHARS
    fitting = tools[: len(kept)]
    assert capture(store, decision, clock, tool_definitions=fitting, episode_id="ep-2").end("ok").truncated == []


def test_a_step_name_over_its_cap_is_cut_and_said(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    run.step("n" * (MAX_NAME_CHARS + 1), latency_ms=1)
    run.step("n" * MAX_NAME_CHARS, latency_ms=1)
    episode = run.end("ok")
    assert [len(s.name) for s in episode.steps] == [MAX_NAME_CHARS] * 2 and episode.truncated == ["steps"]


def test_a_tool_result_is_stored_as_json_when_it_is_data(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    run = capture(store, decision, clock)
    results = [{"passages": ["Settings → Security"], "k": 3}, ["a", "b"], 4, "plain text", {(1, 2): "x"}, None]
    for i, result in enumerate(results):
        with run.tool(f"t{i}") as call:
            call.result = result
    episode = run.end("ok")
    assert [s.result for s in episode.steps] == [
        '{"passages": ["Settings → Security"], "k": 3}', '["a", "b"]', "4", "plain text", "{(1, 2): 'x'}", None,
    ]  # JSON for data (a tuple key has none: str), not Python's repr


def test_an_empty_episode_id_is_refused(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    with pytest.raises(InvalidDocument, match="episode_id: '' does not fit"):
        capture(store, decision, clock, episode_id="")


def test_steps_beyond_the_cap_are_dropped(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    for i in range(MAX_STEPS + 3):
        run.step(f"s{i}", latency_ms=1)
    episode = run.end("ok")
    assert len(episode.steps) == MAX_STEPS
    assert episode.steps[-1].name == f"s{MAX_STEPS - 1}"
    assert episode.truncated == ["steps"]


def test_a_crash_after_the_step_cap_keeps_its_agent_step(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """A runaway loop fills the steps and then raises: its crash step was dropped with the rest,
    and the episode did not say that the run crashed, nor why."""
    with pytest.raises(RecursionError), capture(store, decision, clock) as run:
        for i in range(MAX_STEPS + 3):
            run.step(f"s{i}", latency_ms=1)
        raise RecursionError("too many tool calls")
    episode = Episode.from_dict(store.get_episode("ep-1"))
    assert len(episode.steps) == MAX_STEPS and episode.truncated == ["steps"]
    assert episode.steps[-2].name == f"s{MAX_STEPS - 2}"
    crash = episode.steps[-1]
    assert (crash.name, crash.status, crash.error) == ("agent", "error", "RecursionError: too many tool calls")


def assert_fits(episode: Episode) -> None:
    doc = episode.to_dict()
    assert json_bytes(doc) <= MAX_EPISODE_BYTES
    assert len(json.dumps(doc, ensure_ascii=False).encode()) <= MAX_EPISODE_BYTES  # UTF-8, unescaped


@pytest.mark.parametrize("ending", ["end", "aend"])
def test_an_episode_over_the_cosmos_item_limit_is_cut_to_fit(
    store: MemoryStore, decision: Decision, clock: ManualClock, ending: str
) -> None:
    """256 steps, half of them with every text at its cap, come to 7.2 MB as the SDK sends them
    (2.5 MB in UTF-8): Cosmos DB refuses such an item (413). The longest step texts are cut to one size."""
    question = "q" * MAX_TEXT_CHARS
    run = capture(store, decision, clock, input=question)
    recorded = record_steps_at_the_caps(run)
    assert sum(json_bytes(s.model_dump()) for s in run.steps) > 3.5 * MAX_EPISODE_BYTES
    episode = run.end("a" * MAX_TEXT_CHARS) if ending == "end" else asyncio.run(run.aend("a" * MAX_TEXT_CHARS))

    assert_fits(episode)
    assert episode.truncated == ["steps.result", "steps.arguments", "steps.error"]
    assert episode.input == question and episode.output == "a" * MAX_TEXT_CHARS  # kept whole
    assert [(s.name, s.status, s.latency_ms) for s in episode.steps] == recorded  # what the reward needs
    short, long = episode.steps[0], episode.steps[1]
    assert short.result == "short result 0" and short.error == "short error 0" and short.arguments == {"n": 0}
    assert long.result and long.result.endswith(_MARK) and long.result.startswith("é" * 100)
    assert long.error and long.error.endswith(_MARK)
    assert long.arguments is not None and set(long.arguments) == {"truncated"}
    assert long.arguments["truncated"].startswith('{"query":"éé') and long.arguments["truncated"].endswith(_MARK)
    assert Episode.from_dict(store.get_episode("ep-1")) == episode
    # Too large to travel in the scoring message: the scorer reads it from the store.
    message = json.loads(score_request_message(episode.to_dict()).body)
    assert "episode" not in message and message["episode_id"] == "ep-1"


def test_the_cut_always_fits_even_with_every_field_at_its_cap_in_4_byte_characters(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """Everything but the step texts stays below the limit by the caps alone, so no step is dropped."""
    wide = "😀"  # 4 bytes in UTF-8, 12 as the SDK escapes it
    text = wide * MAX_TEXT_CHARS
    run = capture(
        store, decision, clock, input=text, instructions=text,
        metadata={f"{wide * 60}{i:04d}": wide * MAX_METADATA_VALUE_CHARS for i in range(MAX_METADATA_KEYS)},
        tool_definitions=[{"name": "x" * (4 * MAX_JSON_CHARS - 20)}],
    )
    record_steps_at_the_caps(run, char=wide, short_every=0)
    run.steps = [s.model_copy(update={"name": wide * 128, "call_id": wide * 128}) for s in run.steps]
    episode = run.end(text)
    assert_fits(episode)
    assert len(episode.steps) == MAX_STEPS and episode.input == episode.output == episode.instructions == text


def test_build_does_not_change_what_end_stores(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    preview = run.build("y" * (MAX_TEXT_CHARS + 1))
    assert preview.truncated == ["output"]
    stored = run.end("y" * (MAX_TEXT_CHARS + 1))
    assert stored.truncated == ["output"]
    assert stored == preview


def test_build_validates_without_writing(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    preview = run.build("4")
    assert preview.output == "4"
    assert store.get_episode("ep-1") is None
    assert run.end("4") == preview


# --------------------------------------------------------------------------- crashes and repeated ends


def test_exception_inside_with_writes_a_crash_episode(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(KeyError, match="missing"), capture(store, decision, clock) as run:
        run.step("search", latency_ms=3)
        clock.advance(1.5)
        raise KeyError("missing")
    stored = store.get_episode("ep-1")
    assert stored is not None
    episode = Episode.from_dict(stored)
    assert episode.output == ""
    assert [s.name for s in episode.steps] == ["search", "agent"]
    crash = episode.steps[-1]
    assert (crash.kind, crash.status) == ("step", "error")
    assert crash.error == "KeyError: 'missing'"
    assert crash.latency_ms == 1500.0
    assert run.episode == episode


def test_exception_after_end_keeps_the_ended_episode(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(ValueError, match="later"), capture(store, decision, clock) as run:
        run.end("the answer")
        raise ValueError("later")
    episode = Episode.from_dict(store.get_episode("ep-1"))
    assert episode.output == "the answer"
    assert episode.steps == []
    assert len(store.list_episodes()) == 1


def test_clean_with_block_without_end_writes_nothing(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with capture(store, decision, clock) as run:
        run.step("search", latency_ms=1)
    assert store.get_episode("ep-1") is None
    assert run.episode is None


def test_end_twice_raises(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    first = run.end("one")
    with pytest.raises(RuntimeError, match="already ended"):
        run.end("two")
    with pytest.raises(RuntimeError, match="already ended"):
        asyncio.run(run.aend("two"))
    assert Episode.from_dict(store.get_episode("ep-1")) == first


def test_recording_after_end_raises_instead_of_being_lost(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """A step, a tool call or usage recorded after end() was kept in the capture and never stored."""
    run = capture(store, decision, clock)
    first = run.end("one")
    with pytest.raises(RuntimeError, match=r"already ended; the step 'late' is not recorded"):
        run.step("late", latency_ms=1)
    ran = []
    with (
        pytest.raises(RuntimeError, match=r"already ended; the tool call 'search' is not recorded"),
        run.tool("search") as call,
    ):
        ran.append(call)
    with pytest.raises(RuntimeError, match=r"already ended; the usage is not recorded"):
        run.add_usage(prompt_tokens=5)
    assert ran == [] and run.steps == [] and run.usage is None
    assert Episode.from_dict(store.get_episode("ep-1")) == first


# --------------------------------------------------------------------------- async


def test_aend_writes_the_episode(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    async def agent() -> Episode:
        async with capture(store, decision, clock) as run:
            run.step("search", latency_ms=2)
            clock.advance(0.5)
            return await run.aend("async answer")

    episode = asyncio.run(agent())
    assert episode.output == "async answer"
    assert episode.latency_ms == 500.0
    assert Episode.from_dict(store.get_episode("ep-1")) == episode


def test_async_with_exception_writes_a_crash_episode(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    async def agent() -> None:
        async with capture(store, decision, clock):
            clock.advance(0.25)
            raise ConnectionError("down")

    with pytest.raises(ConnectionError, match="down"):
        asyncio.run(agent())
    episode = Episode.from_dict(store.get_episode("ep-1"))
    assert episode.output == ""
    assert episode.steps[-1].name == "agent"
    assert episode.steps[-1].error == "ConnectionError: down"
    assert episode.steps[-1].latency_ms == 250.0


class AsyncMemoryStore(MemoryStore):
    """A store with a native async write, like the Cosmos adapter."""

    def __init__(self) -> None:
        super().__init__()
        self.async_writes: list[str] = []

    async def add_episode_async(self, episode: Episode) -> None:
        self.async_writes.append(episode.id)
        self.add_episode(episode)


def test_aend_prefers_the_store_async_write(decision: Decision, clock: ManualClock) -> None:
    store = AsyncMemoryStore()
    episode = asyncio.run(EpisodeCapture(store, decision, input="q", episode_id="ep-9", clock=clock).aend("a"))
    assert store.async_writes == ["ep-9"]
    assert store.get_episode("ep-9") == episode.to_dict()


# --------------------------------------------------------------------------- idempotency


def test_same_episode_twice_is_a_no_op(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    episode = capture(store, decision, clock).end("4")
    store.add_episode(episode)
    store.add_episode(Episode.from_dict(episode.to_dict()))
    assert len(store.list_episodes()) == 1
    assert len(store.read_episodes(None).items) == 1


def test_different_episode_with_same_id_conflicts(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    first = capture(store, decision, clock).end("4")
    second = capture(store, decision, clock)
    with pytest.raises(ConcurrencyConflict, match="ep-1"):
        second.end("5")
    assert second.episode is None
    assert Episode.from_dict(store.get_episode("ep-1")) == first


# --------------------------------------------------------------------------- PolicyClient


def publish(store: MemoryStore | SQLiteStore, version: int, logits: list[float], clock: ManualClock) -> None:
    """Replace the current policy with a new version (as a trainer would)."""
    actions = [Action(id="fast"), Action(id="careful")]
    policy = SoftmaxPolicy(AGENT, actions, logits, version=version)
    tagged = store.get_current_policy(AGENT)
    assert tagged is not None
    doc = policy.to_document(kind="current", source="train", parent_version=version - 1, created_at=clock.now())
    store.replace_current_policy(doc, tagged.etag)


def init(store: MemoryStore | SQLiteStore, clock: ManualClock) -> None:
    policy = SoftmaxPolicy.from_actions(AGENT, ["fast", "careful"])
    create_policy(store, policy.to_document(created_at=clock.now()))


def test_text_that_is_not_a_string_is_named_and_nothing_is_written(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(InvalidDocument, match=r"input: must be a string, got int"):
        EpisodeCapture(store, decision, input=12345, clock=clock)  # type: ignore[arg-type]
    run = capture(store, decision, clock)
    with pytest.raises(InvalidDocument, match=r"output: must be a string, got dict"):
        run.end({"answer": 4})  # type: ignore[arg-type]
    with pytest.raises(InvalidDocument, match=r"^invalid episode: output: must be a string, got NoneType"):
        run.end(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidDocument, match=r"^invalid episode: output: must be a string, got NoneType"):
        asyncio.run(run.aend(None))  # type: ignore[arg-type]
    assert store.list_episodes(AGENT) == []
    run.end("4")  # the run is still open: the agent can end it properly
    assert [e["output"] for e in store.list_episodes(AGENT)] == ["4"]


@pytest.mark.parametrize("agent_id", ["bad id!", "", "-lead", "x" * 129])
def test_client_names_an_agent_id_the_store_could_never_hold(store: MemoryStore, agent_id: str) -> None:
    with pytest.raises(InvalidDocument, match=r"agent_id: .*agent id"):
        PolicyClient(store, agent_id)


def test_client_raises_not_found_without_a_policy(store: MemoryStore, clock: ManualClock) -> None:
    client = PolicyClient(store, AGENT, clock=clock)
    with pytest.raises(NotFound, match=AGENT):
        client.choose()
    assert client.last_error is not None and AGENT in client.last_error


def test_client_keeps_raising_not_found(store: MemoryStore, clock: ManualClock) -> None:
    client = PolicyClient(store, AGENT, clock=clock)
    with pytest.raises(NotFound):
        client.policy()
    with pytest.raises(NotFound):
        client.policy()


def test_client_caches_until_refresh_seconds(store: MemoryStore, clock: ManualClock) -> None:
    init(store, clock)
    client = PolicyClient(store, AGENT, refresh_seconds=30, clock=clock, rng=random.Random(5))
    first = client.policy()
    assert first.version == 1
    assert first.probabilities == {"fast": 0.5, "careful": 0.5}

    publish(store, 2, [0.0, 2.0], clock)
    clock.advance(29.9)
    assert client.policy() is first
    assert client.choose().version == 1

    clock.advance(0.1)
    second = client.policy()
    assert second.version == 2
    floor = second.exploration_floor
    assert second.probabilities["careful"] == pytest.approx(floor + (1 - 2 * floor) / (1 + math.exp(-2)))
    assert client.choose().policy_id == f"{AGENT}:v2"
    assert client.last_error is None


def test_client_does_not_rebuild_an_unchanged_policy(store: MemoryStore, clock: ManualClock) -> None:
    init(store, clock)
    client = PolicyClient(store, AGENT, refresh_seconds=0, clock=clock)
    first = client.policy()
    assert client.policy() is first
    assert client.refresh() is first
    publish(store, 2, [1.0, 0.0], clock)
    assert client.policy() is not first
    assert client.policy().version == 2


def test_client_draws_with_its_rng(store: MemoryStore, clock: ManualClock) -> None:
    init(store, clock)
    a = PolicyClient(store, AGENT, clock=clock, rng=random.Random(11))
    b = PolicyClient(store, AGENT, clock=clock, rng=random.Random(11))
    assert [a.choose().action_id for _ in range(40)] == [b.choose().action_id for _ in range(40)]


def test_client_keeps_last_good_policy_when_current_is_corrupt(tmp_path: Path, clock: ManualClock) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    try:
        init(store, clock)
        client = PolicyClient(store, AGENT, refresh_seconds=10, clock=clock)
        good = client.policy()
        assert good.version == 1 and client.last_error is None

        store.put_raw_current_policy(AGENT, {"id": f"{AGENT}:current", "kind": "current", "logits": "garbage"})
        clock.advance(10)
        assert client.policy() is good
        assert client.choose().version == 1
        assert client.last_error is not None and "invalid policy" in client.last_error
        assert "logits" in client.last_error

        # A valid document again: the client recovers and clears the error.
        publish(store, 2, [0.0, 1.0], clock)
        clock.advance(10)
        assert client.policy().version == 2
        assert client.last_error is None
    finally:
        store.close()


def test_client_keeps_last_good_policy_when_current_is_not_an_object(tmp_path: Path, clock: ManualClock) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    try:
        init(store, clock)
        client = PolicyClient(store, AGENT, refresh_seconds=1, clock=clock)
        good = client.policy()
        store.put_raw_current_policy(AGENT, [1, 2, 3])  # type: ignore[arg-type]
        clock.advance(1)
        assert client.policy() is good
        assert "must be a JSON object" in (client.last_error or "")
    finally:
        store.close()


def test_an_exception_in_a_tool_call_is_recorded_and_aborts_the_run(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(TimeoutError), capture(store, decision, clock) as run, run.tool("search", arguments={"q": "x"}):
        raise TimeoutError("search took too long")
    episode = Episode.from_dict(store.get_episode("ep-1"))
    assert [(s.name, s.status, s.error) for s in episode.steps] == [
        ("search", "error", "TimeoutError: search took too long"),
        ("agent", "error", "TimeoutError: search took too long"),
    ]
    assert episode.output == "" and episode.failed_steps == 2


def test_a_failed_tool_call_can_be_recorded_without_aborting_the_run(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with capture(store, decision, clock) as run:
        with run.tool("search") as call:
            call.fail("timeout after 10 s")
        with run.tool("lookup", reraise=False) as call:
            raise ConnectionError("refused")
        assert call.result is None and call.error == "ConnectionError: refused"
        with run.tool("fallback") as call:
            call.result = "found"
        run.end("answered from the fallback")
    episode = Episode.from_dict(store.get_episode("ep-1"))
    assert [(s.name, s.status, s.error, s.result) for s in episode.steps] == [
        ("search", "error", "timeout after 10 s", None),
        ("lookup", "error", "ConnectionError: refused", None),
        ("fallback", "ok", None, "found"),
    ]
    assert episode.output == "answered from the fallback" and episode.failed_steps == 2


def test_reraise_false_never_swallows_an_interrupt(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    with pytest.raises(KeyboardInterrupt), capture(store, decision, clock) as run, run.tool("x", reraise=False):
        raise KeyboardInterrupt
    # Stopped from outside: nothing is charged to the configuration drawn.
    assert store.get_episode("ep-1") is None and run.discarded == "interrupted: KeyboardInterrupt"
    with pytest.raises(RuntimeError, match="discarded"):
        run.end("late")


def test_a_cancelled_run_is_discarded_and_a_timeout_inside_the_block_is_a_crash(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """A restart cancels every run in flight, whatever its configuration: not the configuration's
    failure. A timeout the agent sets inside the block is (TimeoutError, an Exception)."""

    async def cancelled() -> None:
        async with EpisodeCapture(store, decision, input="q", episode_id="ep-cancelled", clock=clock):
            await asyncio.sleep(10)

    async def timed_out() -> None:
        async with EpisodeCapture(store, decision, input="q", episode_id="ep-slow", clock=clock):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TimeoutError):
            await timed_out()

    asyncio.run(main())
    assert store.get_episode("ep-cancelled") is None
    slow = Episode.from_dict(store.get_episode("ep-slow"))
    assert slow.output == "" and slow.steps[-1].name == "agent" and "TimeoutError" in (slow.steps[-1].error or "")


def test_a_discarded_run_writes_nothing_even_when_it_raises(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(ConnectionError), capture(store, decision, clock) as run:
        run.discard("model provider down")
        raise ConnectionError("provider down")
    assert store.get_episode("ep-1") is None and run.discarded == "model provider down"
    with pytest.raises(RuntimeError, match="discarded"):
        run.end("late")
    assert store.list_episodes() == []


def test_model_usage_adds_up_from_responses_and_numbers(clock: ManualClock) -> None:
    class CompletionUsage:  # the shape of an OpenAI client's response.usage
        prompt_tokens, completion_tokens = 1_200, 300

    store = MemoryStore()
    policy = SoftmaxPolicy.from_actions(AGENT, ["a", "b"], seed=1)
    run = EpisodeCapture(store, policy.choose(), input="hi", clock=clock)
    run.add_usage(CompletionUsage())
    run.add_usage({"prompt_tokens": 800, "completion_tokens": 200})
    run.add_usage(prompt_tokens=10, completion_tokens=5)
    episode = run.end("hello")
    assert episode.usage is not None and (episode.usage.prompt_tokens, episode.usage.completion_tokens) == (2_010, 505)
    assert episode.usage.total == 2_515
    with pytest.raises(InvalidDocument, match=r"^invalid episode: usage\.prompt_tokens: must be a whole number"):
        EpisodeCapture(store, policy.choose(), input="hi", clock=clock).add_usage(prompt_tokens=-1)
    plain = EpisodeCapture(store, policy.choose(), input="hi", clock=clock).end("hello")
    assert plain.usage is None and "usage" not in plain.to_dict()


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("latency", "problem"),
    [
        ("5", "must be a number of milliseconds, got str"),
        (None, "must be a number of milliseconds, got NoneType"),
        (True, "must be a number of milliseconds, got bool"),
        (float("nan"), "must be a finite number, got nan"),
        (float("inf"), "must be a finite number, got inf"),
        pytest.param(10**400, "must be a finite number", id="10**400"),
        (-5, "must not be negative, got -5"),
    ],
)
def test_a_latency_that_is_not_a_finite_non_negative_number_is_named(
    store: MemoryStore, decision: Decision, clock: ManualClock, latency: object, problem: str
) -> None:
    run = capture(store, decision, clock)
    run.step("first", latency_ms=1)
    with pytest.raises(InvalidDocument, match=rf"^invalid episode: steps\[1\]\.latency_ms: {re.escape(problem)}"):
        run.step("second", latency_ms=latency)  # type: ignore[arg-type]
    assert [s.name for s in run.steps] == ["first"]
    assert run.end("ok").steps[0].latency_ms == 1.0


@pytest.mark.parametrize(
    ("kwargs", "field", "problem"),
    [
        ({"name": None}, "name", "must be a string, got NoneType"),
        ({"name": ""}, "name", "at least 1 character"),
        ({"status": "failed"}, "status", "'ok' or 'error'"),
        ({"kind": "agent"}, "kind", "'tool', 'llm', 'retrieval' or 'step'"),
        ({"error": 404, "status": "error"}, "error", "must be a string, got int"),
        ({"call_id": 7}, "call_id", "valid string"),
        ({"arguments": ["q"]}, "arguments", "must be an object (a dict), got list"),
        ({"arguments": {1: "q"}}, "arguments", "must have string keys"),
        ({"arguments": {"x": float("nan")}}, "arguments", "must be JSON with finite numbers"),
        ({"arguments": {"x": float("nan"), "pad": "p" * MAX_JSON_CHARS}}, "arguments", "finite numbers"),
        ({"arguments": {"when": datetime.date(2026, 1, 1)}}, "arguments", "must be JSON with finite numbers"),
    ],
)
def test_a_bad_step_value_is_named_with_the_step_index(
    store: MemoryStore, decision: Decision, clock: ManualClock, kwargs: dict[str, object], field: str, problem: str
) -> None:
    run = capture(store, decision, clock)
    with pytest.raises(InvalidDocument, match=r"^invalid episode: steps\[0\]\." + field + ": .*" + re.escape(problem)):
        run.step(**({"name": "search", "latency_ms": 1.0} | kwargs))  # type: ignore[arg-type]
    assert run.steps == [] and run._truncated == []


def test_every_bad_step_value_is_named_at_once(store: MemoryStore, decision: Decision, clock: ManualClock) -> None:
    run = capture(store, decision, clock)
    with pytest.raises(InvalidDocument) as raised:
        run.step(None, latency_ms="5", kind="agent")  # type: ignore[arg-type]
    assert raised.value.fields == ["steps[0].name", "steps[0].latency_ms", "steps[0].kind"]


def test_a_tool_call_with_arguments_that_are_not_json_is_refused_before_it_runs(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    ran = []
    run = capture(store, decision, clock)
    with pytest.raises(InvalidDocument, match=r"^invalid episode: steps\[0\]\.arguments: must be JSON"), run.tool(
        "search", arguments={"when": datetime.date(2026, 1, 1)}
    ):
        ran.append(True)
        raise ConnectionError("down")
    with pytest.raises(InvalidDocument, match=r"steps\[0\]\.name: must be a string"), run.tool(None):  # type: ignore[arg-type]
        ran.append(True)
    assert ran == [] and run.steps == []


@pytest.mark.parametrize(
    ("kwargs", "field", "problem"),
    [
        ({"input": None}, "input", "must be a string, got NoneType"),
        ({"redact": lambda text: None}, "input", "redact must return a string, got NoneType"),
        ({"instructions": 0}, "instructions", "must be a string, got int"),
        ({"episode_id": "a~b"}, "episode_id", "'a~b' does not fit: use letters"),
        ({"episode_id": 7}, "episode_id", "valid string"),
        ({"metadata": {"user": {"id": 7}}}, "metadata.user", "must be a string of at most"),
        ({"metadata": [("user", "u1")]}, "metadata", "must be a mapping of names to values, got list"),
        ({"tool_definitions": [{"limit": math.nan}]}, "tool_definitions", "must be JSON with finite numbers"),
        ({"tool_definitions": "search"}, "tool_definitions", "valid list"),
        ({"ttl": "60"}, "ttl", "valid integer"),
        ({"ttl": 0}, "ttl", "must be -1 (never expires) or 1 to 2,147,483,647 seconds, as Cosmos DB accepts, got 0"),
        ({"ttl": 2**31}, "ttl", "or 1 to 2,147,483,647 seconds, as Cosmos DB accepts, got 2147483648"),
        ({"ttl": -2}, "ttl", "must be -1 (never expires) or 1 to"),
    ],
)
def test_a_bad_episode_value_is_named_where_it_is_passed(
    store: MemoryStore, decision: Decision, clock: ManualClock, kwargs: dict[str, object], field: str, problem: str
) -> None:
    ran = []
    match = rf"^invalid episode: {re.escape(field)}: .*{re.escape(problem)}"
    with pytest.raises(InvalidDocument, match=match), capture(store, decision, clock, **kwargs):
        ran.append(True)
        raise TimeoutError
    assert ran == [] and store.list_episodes() == []


def test_something_other_than_a_decision_is_named(store: MemoryStore, decision: Decision) -> None:
    """The policy instead of policy.choose(), or the choose route's JSON: an AttributeError before."""
    policy = SoftmaxPolicy.from_actions(AGENT, ["a", "b"], seed=1)
    answer = {"agent_id": AGENT, "action_id": "a", "probability": 0.5, "logprob": math.log(0.5), "policy_version": 1}
    for wrong, name in ((policy, "SoftmaxPolicy"), (answer, "dict"), (None, "NoneType")):
        match = rf"^invalid episode: decision: must be the Decision that policy\.choose\(\) returned, got {name}$"
        with pytest.raises(InvalidDocument, match=match):
            EpisodeCapture(store, wrong, input="q")  # type: ignore[arg-type]
    assert store.list_episodes() == []


def test_a_value_changed_after_the_run_began_is_named_when_it_ends(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    run = capture(store, decision, clock, metadata={"user": "u1"})
    run.metadata["when"] = datetime.date(2026, 1, 1)
    with pytest.raises(InvalidDocument, match=r"^invalid episode: metadata\.when: must be a string"):
        run.end("4")
    assert store.list_episodes() == []


# --------------------------------------------------------------------------- failures to record


@pytest.mark.parametrize("reraise", [True, False])
def test_a_failed_call_that_cannot_be_recorded_still_raises_its_own_exception(
    store: MemoryStore, decision: Decision, clock: ManualClock, reraise: bool, caplog: pytest.LogCaptureFixture
) -> None:
    arguments: dict[str, object] = {"q": "x"}
    run = capture(store, decision, clock)
    call = run.tool("search", arguments=arguments, reraise=reraise)
    with pytest.raises(ConnectionError, match="down") as raised, call:
        arguments["when"] = datetime.date(2026, 1, 1)  # changed after the call was checked
        raise ConnectionError("down")
    assert raised.value.__notes__ == [
        "agent_learning: the failed call 'search' was not recorded: InvalidDocument: invalid episode: "
        "steps[0].arguments: must be JSON with finite numbers (Object of type date is not JSON serializable)"
    ]
    assert run.steps == []
    assert "the failed call 'search' was not recorded" in caplog.text


class FailingStore(MemoryStore):
    """Refuses its first ``failures`` writes (an unreachable store; all of them by default), then works."""

    def __init__(self, failures: float = math.inf) -> None:
        super().__init__()
        self.failures = failures

    def add_episode(self, episode: Episode) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionRefusedError("store unreachable")
        super().add_episode(episode)

    async def add_episode_async(self, episode: Episode) -> None:
        self.add_episode(episode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_crash_episode_that_cannot_be_written_leaves_the_agent_exception_in_place(
    decision: Decision, clock: ManualClock, mode: str
) -> None:
    async def agent() -> None:
        async with capture(FailingStore(), decision, clock):
            raise TimeoutError("model")

    with pytest.raises(TimeoutError, match="model") as raised:
        if mode == "async":
            asyncio.run(agent())
        else:
            with capture(FailingStore(), decision, clock):
                raise TimeoutError("model")
    assert raised.value.__notes__ == [
        "agent_learning: episode ep-1 was not written: ConnectionRefusedError: store unreachable"
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_write_in_end_is_not_recorded_as_a_crash_of_the_run(
    decision: Decision, clock: ManualClock, mode: str
) -> None:
    """end()'s write failed, its error left the block, and the block's exit wrote a crash episode
    (empty output, penalised) in place of the agent's good answer: the configuration was charged
    for the store's outage."""
    store = FailingStore(failures=1)

    async def agent() -> None:
        async with capture(store, decision, clock) as run:
            await run.aend("a good answer")

    with pytest.raises(ConnectionRefusedError, match="store unreachable") as raised:
        if mode == "async":
            asyncio.run(agent())
        else:
            with capture(store, decision, clock) as run:
                run.end("a good answer")
    assert store.list_episodes() == [] and not getattr(raised.value, "__notes__", None)
    retried = capture(store, decision, clock).end("a good answer")  # the agent may write it again
    assert Episode.from_dict(store.get_episode("ep-1")) == retried and retried.steps == []


def test_a_crash_episode_that_fails_validation_leaves_the_agent_exception_in_place(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    with pytest.raises(TimeoutError) as raised, capture(store, decision, clock) as run:
        run.metadata["user"] = {"id": 7}
        raise TimeoutError
    assert len(raised.value.__notes__) == 1
    assert raised.value.__notes__[0].startswith(
        "agent_learning: episode ep-1 was not written: InvalidDocument: invalid episode: metadata.user: must be"
    )
    assert store.list_episodes() == [] and run.episode is None


@pytest.mark.parametrize(
    ("usage", "kwargs", "fields"),
    [
        ({"prompt_tokens": "abc"}, {}, ["usage.prompt_tokens"]),
        ({"prompt_tokens": "12", "completion_tokens": 3.0}, {}, ["usage.prompt_tokens", "usage.completion_tokens"]),
        ({"completion_tokens": True}, {}, ["usage.completion_tokens"]),
        (None, {"completion_tokens": -3}, ["usage.completion_tokens"]),
        (None, {"prompt_tokens": 1.5}, ["usage.prompt_tokens"]),
    ],
)
def test_a_token_count_that_is_not_a_whole_number_is_named_and_nothing_is_added(
    store: MemoryStore, decision: Decision, clock: ManualClock, usage: object, kwargs: dict[str, object],
    fields: list[str],
) -> None:
    run = capture(store, decision, clock)
    run.add_usage({"prompt_tokens": 10, "completion_tokens": None})  # a count a client leaves out is 0
    with pytest.raises(InvalidDocument, match=r"^invalid episode: usage\.\w+: must be a whole number") as raised:
        run.add_usage(usage, **kwargs)  # type: ignore[arg-type]
    assert raised.value.fields == fields
    assert run.usage is not None and (run.usage.prompt_tokens, run.usage.completion_tokens) == (10, 0)


def test_a_usage_without_either_count_is_named_rather_than_counted_as_zero(
    store: MemoryStore, decision: Decision, clock: ManualClock
) -> None:
    """A whole response, or a usage that names its counts input_tokens/output_tokens (OpenAI's
    Responses API, other providers), was recorded as 0 tokens: cost and budgets silently saw none."""

    class ResponseUsage:  # the shape of the Responses API's response.usage
        input_tokens, output_tokens = 1_200, 300

    class ChatCompletion:  # a whole response instead of its usage
        usage = None

    run = capture(store, decision, clock)
    run.add_usage({"prompt_tokens": 10})  # an embeddings usage has no completion_tokens: 0
    for usage in (ResponseUsage(), ChatCompletion(), {"input_tokens": 5, "output_tokens": 1}):
        with pytest.raises(InvalidDocument, match=r"^invalid episode: usage: has neither prompt_tokens nor") as raised:
            run.add_usage(usage)
        assert raised.value.fields == ["usage"]
    assert run.end("done").usage is not None and (run.usage.prompt_tokens, run.usage.completion_tokens) == (10, 0)


@pytest.mark.parametrize(
    "seconds", ["30", float("nan"), float("inf"), -1, True, None, pytest.param(10**400, id="10**400")]
)
def test_client_names_a_refresh_interval_that_is_not_a_finite_number_of_seconds(
    store: MemoryStore, seconds: object
) -> None:
    with pytest.raises(InvalidDocument, match=r"^invalid policy client: refresh_seconds: must be a finite number"):
        PolicyClient(store, AGENT, refresh_seconds=seconds)  # type: ignore[arg-type]
