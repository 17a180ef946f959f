"""The data contract: JSON round trips and strict validation with field paths."""

from __future__ import annotations

import ast
import copy
import importlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_learning.core.errors import DocumentTooLarge, InvalidDocument
from agent_learning.documents import (
    MAX_EPISODE_BYTES,
    MAX_STEP_TEXT_CHARS,
    MAX_STEPS,
    MAX_TEXT_CHARS,
    SCHEMA_VERSION,
    Episode,
    PolicyDocument,
    Score,
    TrainingRun,
    json_bytes,
)

# --------------------------------------------------------------------------- valid documents


def episode_dict() -> dict[str, Any]:
    return {
        "id": "ep-1",
        "agent_id": "agent",
        "policy_version": 2,
        "action_id": "gpt-small",
        "probability": 0.25,
        "logprob": math.log(0.25),
        "input": "What is 2 + 2?",
        "output": "4",
        "instructions": "Answer briefly.",
        "tool_definitions": [{"name": "calc", "parameters": {"type": "object"}}],
        "steps": [
            {"name": "calc", "kind": "tool", "status": "ok", "latency_ms": 12.5, "arguments": {"x": 2}, "result": "4"},
            {"name": "llm", "kind": "llm", "status": "error", "latency_ms": 3.0, "error": "TimeoutError: slow"},
        ],
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:00:02.500000Z",
        "metadata": {"user": "u1", "retry": False, "n": 3, "temperature": 0.2},
        "truncated": [],
        "ttl": 3600,
    }


def policy_dict(kind: str = "version") -> dict[str, Any]:
    return {
        "id": "agent:v3" if kind == "version" else "agent:current",
        "kind": kind,
        "agent_id": "agent",
        "version": 3,
        "actions": [
            {"id": "gpt-small"},
            {"id": "gpt-large", "description": "the big one", "config": {"model": "large", "max_tokens": 512}},
        ],
        "logits": [0.5, -0.5],
        "temperature": 0.8,
        "exploration_floor": 0.05,
        "pinned": False,
        "source": "train",
        "parent_version": 2,
        "cursor": {"seq": 41, "id": "ep-41"},
        "run": run_dict(),
        "created_at": "2026-01-02T03:04:05Z",
        "note": "trained",
        "learner_state": {"baseline": 0.4},
    }


def score_dict() -> dict[str, Any]:
    metric = {
        "raw": 4.0,
        "normalised": 0.75,
        "result": "pass",
        "threshold": 3.0,
        "reason": "correct",
        "evaluator": "offline:intent_resolution",
        "evaluator_version": "offline-rules/1",
    }
    return {
        "id": "ep-1",
        "episode_id": "ep-1",
        "agent_id": "agent",
        "action_id": "gpt-small",
        "policy_version": 2,
        "probability": 0.25,
        "metrics": {"intent_resolution": metric},
        "judge": {"name": "offline", "model": "offline-rules/1"},
        "reward": 0.6,
        "reward_function": {
            "version": "weighted-penalties/1+abc",
            "weights": {"intent_resolution": 1.0},
            "penalties": {"empty_output_penalty": 0.5},
            "components": {"weighted": 0.75, "latency": -0.15},
        },
        "scored_at": "2026-01-01T00:01:00Z",
        "seq": 7,
    }


def run_dict() -> dict[str, Any]:
    return {
        "id": "agent:run:v3",
        "agent_id": "agent",
        "base_version": 2,
        "policy_version": 3,
        "cursor_from": {"seq": 10, "id": "ep-10"},
        "cursor_to": {"seq": 41, "id": "ep-41"},
        "episodes": 31,
        "rejected": 1,
        "rejected_samples": [{"id": "ep-13", "error": "bad"}],
        "metrics": {"kl": 0.01, "mean_reward": 0.5},
        "learner": {"name": "reinforce", "learning_rate": 1.0},
        "started_at": "2026-01-02T03:04:00Z",
        "finished_at": "2026-01-02T03:04:05Z",
    }


DOCS: list[tuple[type[Any], Callable[[], dict[str, Any]]]] = [
    (Episode, episode_dict),
    (PolicyDocument, policy_dict),
    (Score, score_dict),
    (TrainingRun, run_dict),
]
DOC_IDS = ["episode", "policy", "score", "run"]


def invalid(cls: type[Any], data: Any) -> InvalidDocument:
    with pytest.raises(InvalidDocument) as info:
        cls.from_dict(data)
    return info.value


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(("cls", "make"), DOCS, ids=DOC_IDS)
def test_dict_and_json_round_trip(cls: type[Any], make: Callable[[], dict[str, Any]]) -> None:
    doc = cls.from_dict(make())
    as_dict = doc.to_dict()
    assert as_dict["schema_version"] == 1  # the oldest schema that holds it (SCHEMA_VERSION is the newest read)
    assert cls.from_dict(as_dict) == doc
    assert cls.from_json(doc.to_json()) == doc
    assert cls.from_json(doc.to_json().encode()) == doc
    assert json.loads(doc.to_json()) == as_dict
    # to_dict is plain JSON: it survives json.dumps unchanged.
    assert json.loads(json.dumps(as_dict)) == as_dict


def test_round_trip_keeps_values() -> None:
    ep = Episode.from_json(json.dumps(episode_dict()))
    assert ep.probability == 0.25
    assert ep.steps[0].arguments == {"x": 2}
    assert ep.steps[1].error == "TimeoutError: slow"
    assert ep.metadata == {"user": "u1", "retry": False, "n": 3, "temperature": 0.2}
    assert ep.latency_ms == 2500.0
    assert ep.failed_steps == 1
    assert ep.to_dict()["started_at"] == "2026-01-01T00:00:00Z"


def test_non_utc_offsets_survive_round_trip() -> None:
    data = episode_dict() | {"started_at": "2026-01-01T01:00:00+01:00", "ended_at": "2026-01-01T00:00:01Z"}
    ep = Episode.from_dict(data)
    assert ep.latency_ms == 1000.0
    assert Episode.from_json(ep.to_json()) == ep


def test_policy_version_and_current_via_as_kind() -> None:
    version = PolicyDocument.from_dict(policy_dict("version"))
    current = version.as_kind("current")
    assert (current.kind, current.id) == ("current", "agent:current")
    assert current.logits == version.logits and current.run == version.run and current.cursor == version.cursor
    assert PolicyDocument.from_json(current.to_json()) == current
    back = PolicyDocument.from_dict(current.to_dict()).as_kind("version")
    assert back == version
    assert back.id == "agent:v3"


def test_only_the_current_document_is_pinned() -> None:
    current = PolicyDocument.from_dict(policy_dict("current") | {"pinned": True})
    assert current.pinned is True
    version = current.as_kind("version")
    assert (version.kind, version.pinned) == ("version", False)
    assert PolicyDocument.from_dict(version.to_dict()) == version


def test_policy_embedded_run_round_trips_as_training_run() -> None:
    doc = PolicyDocument.from_json(json.dumps(policy_dict()))
    assert isinstance(doc.run, TrainingRun)
    assert doc.run == TrainingRun.from_dict(run_dict())
    assert doc.action_ids == ["gpt-small", "gpt-large"]


def test_score_cursor_is_seq_and_id() -> None:
    score = Score.from_dict(score_dict())
    assert (score.cursor.seq, score.cursor.id) == (7, "ep-1")
    with pytest.raises(ValueError, match="seq"):
        _ = Score.from_dict(score_dict() | {"seq": None}).cursor


# --------------------------------------------------------------------------- field paths


INTENT = "intent_resolution"


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        target: Any = d
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return mutate


INVALID_CASES = [
    # (class, make, mutation, expected field path)
    (Episode, episode_dict, _set(["steps", 0, "latency_ms"], float("nan")), "steps[0].latency_ms"),
    (Episode, episode_dict, _set(["steps", 0, "latency_ms"], float("inf")), "steps[0].latency_ms"),
    (Episode, episode_dict, _set(["steps", 1, "latency_ms"], -1.0), "steps[1].latency_ms"),
    (Episode, episode_dict, _set(["steps", 0, "latency_ms"], "12.5"), "steps[0].latency_ms"),
    (Episode, episode_dict, _set(["steps", 0, "result"], "r" * (MAX_STEP_TEXT_CHARS + 1)), "steps[0].result"),
    (Episode, episode_dict, _set(["steps", 0, "status"], "maybe"), "steps[0].status"),
    (Episode, episode_dict, _set(["probability"], 0.0), "probability"),
    (Episode, episode_dict, _set(["probability"], 1.5), "probability"),
    (Episode, episode_dict, _set(["probability"], float("nan")), "probability"),
    (Episode, episode_dict, _set(["probability"], "0.25"), "probability"),
    (Episode, episode_dict, _set(["probability"], True), "probability"),
    (Episode, episode_dict, _set(["logprob"], -0.1), "logprob"),
    (Episode, episode_dict, _set(["logprob"], float("-inf")), "logprob"),
    (Episode, episode_dict, _set(["output"], "x" * (MAX_TEXT_CHARS + 1)), "output"),
    (Episode, episode_dict, _set(["input"], "x" * (MAX_TEXT_CHARS + 1)), "input"),
    (Episode, episode_dict, _set(["ended_at"], "2025-12-31T23:59:59Z"), "ended_at"),
    (Episode, episode_dict, _set(["started_at"], "2026-01-01T00:00:00"), "started_at"),
    (Episode, episode_dict, _set(["policy_version"], "2"), "policy_version"),
    (Episode, episode_dict, _set(["policy_version"], 0), "policy_version"),
    (Episode, episode_dict, _set(["id"], "a/b"), "id"),
    (Episode, episode_dict, _set(["agent_id"], ""), "agent_id"),
    (Episode, episode_dict, _set(["steps", 0, "arguments"], {"x": float("nan")}), "steps[0].arguments"),
    (Episode, episode_dict, _set(["metadata"], {f"k{i}": i for i in range(33)}), "metadata"),
    (Episode, episode_dict, _set(["schema_version"], SCHEMA_VERSION + 1), "schema_version"),
    (Episode, episode_dict, _set(["schema_version"], "1"), "schema_version"),
    (Episode, episode_dict, _set(["colour"], "blue"), "colour"),
    (Episode, episode_dict, _set(["type"], "score"), "type"),
    (PolicyDocument, policy_dict, _set(["logits"], [0.5]), "logits"),
    (PolicyDocument, policy_dict, _set(["logits", 1], float("nan")), "logits[1]"),
    (PolicyDocument, policy_dict, _set(["logits", 0], 1e9), "logits[0]"),
    (PolicyDocument, policy_dict, _set(["logits", 0], "0.5"), "logits[0]"),
    (PolicyDocument, policy_dict, _set(["id"], "agent:v2"), "id"),
    (PolicyDocument, policy_dict, _set(["id"], "other:v3"), "id"),
    (PolicyDocument, policy_dict, _set(["kind"], "current"), "id"),
    (PolicyDocument, policy_dict, _set(["exploration_floor"], 0.5), "exploration_floor"),
    (PolicyDocument, policy_dict, _set(["exploration_floor"], float("inf")), "exploration_floor"),
    (PolicyDocument, policy_dict, _set(["actions", 1, "id"], "gpt-small"), "actions"),
    (PolicyDocument, policy_dict, _set(["actions", 1, "id"], "has space"), "actions[1].id"),
    (PolicyDocument, policy_dict, _set(["actions", 1, "extra"], 1), "actions[1].extra"),
    (PolicyDocument, policy_dict, _set(["actions"], []), "actions"),
    (PolicyDocument, policy_dict, _set(["temperature"], 0.0), "temperature"),
    (PolicyDocument, policy_dict, _set(["temperature"], 1e-310), "temperature"),  # below MIN_TEMPERATURE
    (PolicyDocument, policy_dict, _set(["pinned"], True), "pinned"),
    (PolicyDocument, policy_dict, _set(["pinned"], "yes"), "pinned"),
    (PolicyDocument, policy_dict, _set(["cursor", "seq"], -1), "cursor.seq"),
    (PolicyDocument, policy_dict, _set(["run", "episodes"], "31"), "run.episodes"),
    (PolicyDocument, policy_dict, _set(["schema_version"], SCHEMA_VERSION + 1), "schema_version"),
    (Score, score_dict, _set(["id"], "ep-2"), "id"),
    (Score, score_dict, _set(["reward"], 1.5), "reward"),
    (Score, score_dict, _set(["reward"], float("nan")), "reward"),
    (Score, score_dict, _set(["metrics", INTENT, "normalised"], 1.2), "metrics.intent_resolution.normalised"),
    (Score, score_dict, _set(["metrics", INTENT, "raw"], float("inf")), "metrics.intent_resolution.raw"),
    (Score, score_dict, _set(["reward_function", "components", "x"], -math.inf), "reward_function.components.x"),
    (Score, score_dict, _set(["schema_version"], SCHEMA_VERSION + 1), "schema_version"),
    (TrainingRun, run_dict, _set(["episodes"], -1), "episodes"),
    (TrainingRun, run_dict, _set(["metrics", "kl"], float("nan")), "metrics.kl"),
    (TrainingRun, run_dict, _set(["cursor_to", "id"], "a/b"), "cursor_to.id"),
    (TrainingRun, run_dict, _set(["schema_version"], SCHEMA_VERSION + 1), "schema_version"),
]


@pytest.mark.parametrize(("cls", "make", "mutate", "field"), INVALID_CASES, ids=[c[3] for c in INVALID_CASES])
def test_validation_error_names_the_field(cls: type[Any], make: Any, mutate: Any, field: str) -> None:
    data = make()
    mutate(data)
    err = invalid(cls, data)
    assert field in err.fields
    assert f"{field}:" in str(err)
    assert str(err).startswith(f"invalid {cls._doc_kind()}: ")
    # from_json reports the same problems.
    with pytest.raises(InvalidDocument) as from_text:
        cls.from_json(json.dumps(data))
    assert from_text.value.fields == err.fields


def test_every_problem_is_reported() -> None:
    data = episode_dict() | {"probability": "x", "output": 5, "unknown": 1}
    assert set(invalid(Episode, data).fields) >= {"probability", "output", "unknown"}


def test_missing_required_fields_are_named() -> None:
    data = episode_dict()
    del data["input"], data["started_at"]
    assert set(invalid(Episode, data).fields) == {"input", "started_at"}


def test_newer_schema_message_says_upgrade() -> None:
    err = invalid(Episode, episode_dict() | {"schema_version": SCHEMA_VERSION + 1})
    assert f"{SCHEMA_VERSION + 1} is newer" in str(err)


def test_duplicate_actions_are_listed() -> None:
    data = policy_dict()
    data["actions"][1]["id"] = "gpt-small"
    err = invalid(PolicyDocument, data)
    assert "duplicate" in str(err) and "gpt-small" in str(err)


def test_policy_id_must_match_agent_version_and_kind() -> None:
    current = policy_dict("current")
    assert PolicyDocument.from_dict(current).id == "agent:current"
    assert "id" in invalid(PolicyDocument, current | {"id": "agent:v3"}).fields
    assert "agent:current" in str(invalid(PolicyDocument, current | {"id": "agent:v3"}))
    assert "id" in invalid(PolicyDocument, policy_dict() | {"version": 4}).fields


def test_score_id_must_equal_episode_id() -> None:
    err = invalid(Score, score_dict() | {"episode_id": "ep-2"})
    assert err.fields == ["id"]
    assert "ep-2" in str(err)


def test_step_in_error_needs_error_text() -> None:
    data = episode_dict()
    del data["steps"][1]["error"]
    err = invalid(Episode, data)
    assert any(f.startswith("steps[1]") for f in err.fields)
    assert "error text" in str(err)
    data["steps"][1]["error"] = ""
    assert "error text" in str(invalid(Episode, data))


def test_step_error_text_path_names_the_error_field() -> None:
    data = episode_dict()
    del data["steps"][1]["error"]
    assert "steps[1].error" in invalid(Episode, data).fields


def test_bad_metadata_value_path_is_the_key() -> None:
    err = invalid(Episode, episode_dict() | {"metadata": {"k": float("nan")}})
    assert err.fields == ["metadata.k"]


def test_an_integer_a_float_cannot_hold_exactly_is_refused_saying_so() -> None:
    assert Episode.from_dict(episode_dict() | {"metadata": {"k": 2**53 - 1}}).metadata == {"k": 2**53 - 1}
    err = invalid(Episode, episode_dict() | {"metadata": {"k": -(2**53)}})
    assert err.fields == ["metadata.k"] and "an integer must be below 2**53 in magnitude" in str(err)


@pytest.mark.parametrize("field, change", [
    ("context.task", {"context": {"task": "\ud800"}}),
    ("metadata.user", {"metadata": {"user": "x\udfff"}}),
    ("steps[0].arguments", {"steps": [{"name": "s", "status": "ok", "latency_ms": 1.0, "arguments": {"q": "\ud83d"}}]}),
    ("tool_definitions", {"tool_definitions": [{"name": "\udbff"}]}),
    ("input", {"input": "q\udc00"}),
    ("output", {"output": "\udc00"}),
])
def test_text_that_is_not_unicode_is_refused_naming_the_field(field: str, change: dict[str, Any]) -> None:
    err = invalid(Episode, episode_dict() | change)
    assert err.fields == [field] and "lone surrogate" in str(err)


def test_characters_beyond_the_basic_plane_are_unicode_and_kept() -> None:
    text = "caf\u00e9 \U0001f600"  # escaped in JSON as a surrogate pair, which is not a lone surrogate
    change = {"context": {"task": text}, "metadata": {"user": text}, "tool_definitions": [{"name": text}]}
    episode = Episode.from_dict(episode_dict() | change | {"input": text})
    assert episode.context == {"task": text} and episode.tool_definitions == [{"name": text}]
    assert Episode.from_json(episode.to_json()) == episode


def test_unknown_field_with_bracket_is_named() -> None:
    assert "x[0]" in invalid(Episode, episode_dict() | {"x[0]": 1}).fields


# --------------------------------------------------------------------------- strictness


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_rejected_everywhere(value: float) -> None:
    assert "steps[0].latency_ms" in invalid(Episode, _with(episode_dict(), ["steps", 0, "latency_ms"], value)).fields
    assert "reward" in invalid(Score, score_dict() | {"reward": value}).fields
    assert "temperature" in invalid(PolicyDocument, policy_dict() | {"temperature": value}).fields
    assert "metrics.kl" in invalid(TrainingRun, _with(run_dict(), ["metrics", "kl"], value)).fields


def test_non_finite_numbers_rejected_in_json_text() -> None:
    text = json.dumps(episode_dict()).replace('"latency_ms": 12.5', '"latency_ms": NaN')
    assert "NaN" in text
    with pytest.raises(InvalidDocument) as info:
        Episode.from_json(text)
    assert "steps[0].latency_ms" in info.value.fields


def test_strings_are_not_coerced_to_numbers() -> None:
    assert "probability" in invalid(Episode, episode_dict() | {"probability": "0.25"}).fields
    assert "reward" in invalid(Score, score_dict() | {"reward": "0.6"}).fields
    assert "seq" in invalid(Score, score_dict() | {"seq": "7"}).fields
    assert "version" in invalid(PolicyDocument, policy_dict() | {"version": "3"}).fields


def test_integers_are_accepted_for_float_fields() -> None:
    data = episode_dict() | {"probability": 1, "logprob": 0}
    data["steps"][0]["latency_ms"] = 12
    ep = Episode.from_dict(data)
    assert ep.probability == 1.0 and ep.steps[0].latency_ms == 12.0


def test_cosmos_system_fields_are_ignored() -> None:
    system = {"_rid": "abc==", "_etag": '"0000-1111"', "_ts": 1767225600, "_self": "dbs/x", "_attachments": "a/"}
    for cls, make in DOCS:
        plain = cls.from_dict(make())
        assert cls.from_dict(make() | system) == plain
        assert cls.from_json(json.dumps(make() | system)) == plain
        assert not any(k.startswith("_") for k in plain.to_dict())


def test_oversize_text_rejected_but_limit_accepted() -> None:
    assert Episode.from_dict(episode_dict() | {"output": "x" * MAX_TEXT_CHARS}).output == "x" * MAX_TEXT_CHARS
    err = invalid(Episode, episode_dict() | {"output": "x" * (MAX_TEXT_CHARS + 1)})
    assert err.fields == ["output"] and not isinstance(err, DocumentTooLarge)
    assert str(MAX_TEXT_CHARS) in str(err)


def test_an_episode_over_the_document_limit_is_rejected_naming_its_size_and_the_limit() -> None:
    """Each field within its cap, the whole over what a Cosmos DB item may hold (accepted before)."""
    step = {"name": "search", "status": "ok", "latency_ms": 1.0, "result": "é" * MAX_STEP_TEXT_CHARS}
    data = episode_dict() | {"steps": [step] * MAX_STEPS}
    assert len(json.dumps(data, ensure_ascii=False)) < MAX_EPISODE_BYTES  # in characters it would fit
    err = invalid(Episode, data)
    assert err.fields == ["(document)"] and isinstance(err, DocumentTooLarge)  # told apart by its class
    size = re.search(rf"is ([\d,]+) bytes as JSON; the limit is {MAX_EPISODE_BYTES:,} \(MAX_EPISODE_BYTES", str(err))
    assert size and int(size.group(1).replace(",", "")) > json_bytes(data) > MAX_EPISODE_BYTES, str(err)
    fitting = data | {"steps": [step] * (MAX_EPISODE_BYTES // json_bytes(step) - 1)}
    assert len(Episode.from_dict(fitting).steps) == len(fitting["steps"])


@pytest.mark.parametrize("text", ["{not json", "", '{"id": ', b"\xff\xfe\x00", "[1, 2"])
def test_malformed_json_is_invalid_document(text: str | bytes) -> None:
    for cls, _ in DOCS:
        with pytest.raises(InvalidDocument) as info:
            cls.from_json(text)
        assert info.value.fields == ["(document)"]
        assert "not valid JSON" in str(info.value)


@pytest.mark.parametrize("data", [[], [episode_dict()], "episode", 3, None])
def test_non_object_is_invalid_document(data: Any) -> None:
    err = invalid(Episode, data)
    assert err.fields == ["(document)"]
    assert "must be a JSON object" in str(err)
    with pytest.raises(InvalidDocument, match="must be a JSON object"):
        Episode.from_json(json.dumps(data))


def test_documents_are_immutable() -> None:
    ep = Episode.from_dict(episode_dict())
    with pytest.raises(ValueError, match="frozen"):
        ep.output = "changed"  # type: ignore[misc]


# --------------------------------------------------------------------------- properties


def _with(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    _set(path, value)(data)
    return data


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["2026-01-01T00:00:00Z", "ok", "error", "tool", "episode", "0.5", ""])
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_keys = st.sampled_from([*Episode.model_fields, "_rid", "_ts", "extra"]) | st.text(max_size=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=st.dictionaries(_keys, _json, max_size=5), start_valid=st.booleans(), step=_json)
def test_arbitrary_json_only_ever_raises_invalid_document(
    overrides: dict[str, Any], start_valid: bool, step: Any
) -> None:
    data = episode_dict() if start_valid else {}
    data.update(overrides)
    if start_valid and isinstance(step, dict):
        data["steps"] = [{**episode_dict()["steps"][0], **step}]
    try:
        ep = Episode.from_dict(data)
    except InvalidDocument as err:
        assert err.problems and all(isinstance(f, str) and f for f in err.fields)
    else:
        assert Episode.from_json(ep.to_json()) == ep


@pytest.mark.parametrize("probability", [5e-324, 2.2e-308, 9e-301])
def test_an_episode_logged_at_a_probability_below_1e_300_is_refused(probability: float) -> None:
    """Its importance weight would overflow (1/5e-324 is inf) and every training run of the agent
    failed on the run's metrics; 1e-300 itself is accepted (the round trip below draws it)."""
    data = episode_dict() | {"probability": probability, "logprob": math.log(probability)}
    with pytest.raises(InvalidDocument) as err:
        Episode.from_dict(data)
    assert err.value.fields == ["probability"] and "below 1e-300" in str(err.value)


def test_an_episode_ttl_is_one_cosmos_db_accepts() -> None:
    """Cosmos DB takes an item's ttl of -1 or 1 to 2^31 - 1 seconds and refuses 0 and anything
    larger: such an episode is refused on every store, naming ttl and the range."""
    for ttl in (-1, 1, 86_400, 2**31 - 1):
        assert Episode.from_dict(episode_dict() | {"ttl": ttl}).ttl == ttl
    for ttl in (0, -2, 2**31, 10**20):
        with pytest.raises(InvalidDocument) as err:
            Episode.from_dict(episode_dict() | {"ttl": ttl})
        assert err.value.fields == ["ttl"]
        assert f"must be -1 (never expires) or 1 to 2,147,483,647 seconds, as Cosmos DB accepts, got {ttl}" in str(
            err.value
        )


@settings(max_examples=100, deadline=None)
@given(
    probability=st.floats(min_value=1e-300, max_value=1.0, exclude_min=False),
    latency=st.floats(min_value=0, max_value=1e12),
    text=st.text(max_size=50).filter(lambda s: all(not 0xD800 <= ord(c) <= 0xDFFF for c in s)),
)
def test_valid_episodes_round_trip(probability: float, latency: float, text: str) -> None:
    data = episode_dict() | {"probability": probability, "logprob": math.log(probability), "output": text}
    data["steps"][0]["latency_ms"] = latency
    ep = Episode.from_dict(data)
    again = Episode.from_json(ep.to_json())
    assert again == ep
    assert again.steps[0].latency_ms == latency
    assert again.output == text


def test_the_published_policy_schema_is_the_documents_own() -> None:
    """docs/policy.schema.json is what other languages validate a policy document against: it
    must be the schema of :class:`PolicyDocument` as it is now."""
    import json
    from pathlib import Path

    from agent_learning.documents import PolicyDocument

    published = json.loads((Path(__file__).resolve().parents[2] / "docs" / "policy.schema.json").read_text())
    current = PolicyDocument.model_json_schema(mode="serialization")
    assert {k: v for k, v in published.items() if k != "$schema"} == current, (
        "regenerate docs/policy.schema.json from PolicyDocument.model_json_schema(mode='serialization')"
    )


def test_fields_added_later_are_written_only_when_set() -> None:
    """A document that does not use ``context`` (episodes, scores) or ``skipped`` (runs, also
    inside a policy version) is written exactly as before, so that older readers still read it."""
    from factories import make_episode, make_policy_doc, make_run, make_score

    from agent_learning.documents import TrainingRun

    assert "context" not in make_episode().to_dict() and '"context"' not in make_episode().to_json()
    assert "context" not in make_score().to_dict()
    run = make_run()
    assert "skipped" not in run.to_dict() and '"skipped"' not in run.to_json()
    with_run = make_policy_doc(version=2, run=run)
    assert "skipped" not in with_run.to_dict()["run"] and '"skipped"' not in with_run.to_json()
    skipped = TrainingRun.from_dict({**run.to_dict(), "skipped": 3})
    assert skipped.to_dict()["skipped"] == 3 and TrainingRun.from_dict(skipped.to_dict()).skipped == 3


def test_an_empty_context_is_stored_as_no_context() -> None:
    """``choose(context={})`` logs no feature: its episode and score are written without the
    field, exactly as one without context, so that older readers still read them."""
    from factories import make_episode, make_score

    from agent_learning.documents import Episode, Score

    for document in (make_episode(context={}), make_score(context={})):
        assert document.context is None and "context" not in document.to_dict()
    assert Episode.from_dict({**make_episode().to_dict(), "context": {}}).to_dict() == make_episode().to_dict()
    assert Score.from_dict({**make_score().to_dict(), "context": {}}).to_dict() == make_score().to_dict()


def test_scores_of_equal_contexts_of_strings_share_one_checked_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer reads a context shared by many scores once: scores read from equal contexts of
    category strings hold one dict; a boolean or a number is never taken for an equal value of
    another kind (1 == True), a bad value is refused by name, and the shared contexts are forgotten
    when they reach their limit."""
    from factories import make_score

    from agent_learning.documents import Score
    from agent_learning.documents import context as contexts

    stored = make_score().to_dict()

    def read(context: dict[str, Any]) -> dict[str, Any] | None:
        return Score.from_dict({**stored, "context": json.loads(json.dumps(context))}).context

    first, second = read({"task": "refund", "lang": "en"}), read({"task": "refund", "lang": "en"})
    assert first == {"task": "refund", "lang": "en"} and first is second
    assert read({"lang": "en", "task": "refund"}) == first and read({"task": "refund", "lang": "de"}) is not first
    for context in ({"task": "refund", "vip": True}, {"task": "refund", "vip": 1}, {"task": "refund", "vip": 1.0}):
        assert read(context) is not read(context)
        assert [type(v) for v in read(context).values()] == [type(v) for v in context.values()]  # type: ignore[union-attr]
    with pytest.raises(InvalidDocument, match="task"):
        read({"task": ["refund"]})
    with pytest.raises(InvalidDocument, match="task"):
        read({"task": ""})
    monkeypatch.setattr(contexts, "MAX_SHARED_CONTEXTS", 2)
    contexts._SHARED.clear()
    kept = read({"task": "a"})
    assert read({"task": "a"}) is kept and read({"task": "b"}) is not kept
    assert read({"task": "c"}) is not kept and read({"task": "a"}) is not kept  # forgotten when full
    assert len(contexts._SHARED) <= 2


def test_documents_that_use_nothing_new_stay_readable_by_a_schema_1_library() -> None:
    """tests/fixtures/policy.schema.v1.json is the policy schema the last schema-1 release
    published (extra fields forbidden). A flat policy trained now, with its run and learner
    state, still fits it; a structured policy says it is schema 2, which such a library refuses
    by its schema check ("newer than this library understands")."""
    import json
    from pathlib import Path

    from factories import make_policy_doc, make_run

    from agent_learning.policy.softmax import StructuredPolicy

    old = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "policy.schema.v1.json").read_text())
    flat = make_policy_doc(version=2, run=make_run(), learner_state={"count": [1.0, 2.0, 3.0]},
                           incarnation=None).to_dict()  # an agent created before incarnations
    assert flat["schema_version"] == 1
    assert set(flat) <= set(old["properties"])
    assert set(flat["run"]) <= set(old["$defs"]["TrainingRun"]["properties"])
    assert all(set(a) <= set(old["$defs"]["Action"]["properties"]) for a in flat["actions"])
    structured = StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"task": "category"}).document
    assert structured.to_dict()["schema_version"] == 2


def test_tool_arguments_nested_too_deep_are_refused_naming_the_step() -> None:
    """Nested hundreds of levels, arguments failed the episode as "(document): Maximum
    serialization depth exceeded", and Cosmos DB refuses a document nested beyond 128 levels."""
    from factories import make_episode

    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(300):
        inner["a"] = {}
        inner = inner["a"]
    doc = make_episode().to_dict()
    doc["steps"] = [{"name": "search", "latency_ms": 1.0, "status": "ok", "arguments": deep}]
    with pytest.raises(InvalidDocument, match=r"steps\[0\]\.arguments: .*is nested 301 levels deep; the limit is 64"):
        Episode.from_dict(doc)
    shallow = {"q": [[["nested", {"a": 1}]]]}
    doc["steps"][0]["arguments"] = shallow
    assert Episode.from_dict(doc).steps[0].arguments == shallow


def _public_names(source: str) -> set[str]:
    """The public names a module's source defines at its top level or re-exports (``import x as x``)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.name for a in node.names if a.asname == a.name)
    return {name for name in names if not name.startswith("_")}


def test_every_name_of_the_documents_modules_is_importable_from_the_package() -> None:
    """``agent_learning.documents`` is a package with a module per document kind; its ``__all__`` is
    every public name the single module had, and ``from agent_learning.documents import X`` keeps
    working for each. A public name a module of the package defines is exported too, so a name
    added to or moved between those modules stays importable from the package."""
    import agent_learning.documents as package

    exported = set(package.__all__)
    assert len(exported) == len(package.__all__), "a name is listed twice in __all__"
    star: dict[str, Any] = {}
    exec("from agent_learning.documents import *", star)
    assert exported <= star.keys()
    modules = sorted(Path(package.__file__).parent.glob("*.py"))
    assert [p.stem for p in modules if p.stem != "__init__"], "the package has no modules"
    for path in modules:
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"agent_learning.documents.{path.stem}")
        defined = _public_names(path.read_text())
        assert defined - exported == set(), f"{path.name} defines names the package does not export"
        assert all(getattr(package, name) is getattr(module, name) for name in defined)
