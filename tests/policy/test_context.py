"""A decision's context: the request's features, checked at choose time and logged with the episode."""

from __future__ import annotations

import json
import math
import random
from types import MappingProxyType

import pytest

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import MAX_CONTEXT_FEATURES, Episode
from agent_learning.pipeline import create_policy
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.memory import MemoryStore

CONTEXT = {"task": "billing", "language": "de", "tier": "gold", "tokens": 812, "score": 0.25, "returning": True}


@pytest.fixture
def client() -> PolicyClient:
    store = MemoryStore()
    clock = ManualClock()
    create_policy(store, SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=clock.now()))
    return PolicyClient(store, "bot", rng=random.Random(1), clock=clock)


def test_the_context_is_logged_with_the_episode_and_changes_no_probability(client: PolicyClient) -> None:
    plain = client.choose()
    decision = client.choose(context=CONTEXT)
    assert decision.context == CONTEXT and plain.context is None
    assert decision.probability == client.policy().probability(decision.action_id)
    with EpisodeCapture(client.store, decision, input="q", episode_id="ep-1") as run:
        episode = run.end("answer")
    assert episode.context == CONTEXT
    stored = client.store.get_episode("ep-1")
    assert stored is not None and stored["context"] == CONTEXT and Episode.from_dict(stored) == episode


def test_an_episode_without_context_is_stored_exactly_as_before(client: PolicyClient) -> None:
    with EpisodeCapture(client.store, client.choose(), input="q", episode_id="ep-2") as run:
        episode = run.end("answer")
    assert "context" not in episode.to_dict() and "context" not in json.loads(episode.to_json())
    assert "context" not in client.store.get_episode("ep-2")


def test_an_empty_context_is_no_context_in_the_decision_as_in_its_episode(client: PolicyClient) -> None:
    """One spelling: ``choose(context={})`` decides as ``choose()`` and says ``None``, which is how
    its episode stores it; a flat and a structured policy alike."""
    from agent_learning.policy.softmax import StructuredPolicy

    structured = StructuredPolicy.create("bot-s", {"prompt": ["a", "b"]}, context={"task": "category"})
    for policy in (client.policy(), structured):
        for empty in ({}, MappingProxyType({})):
            decision = policy.choose(context=empty)
            assert decision.context is None, type(policy).__name__
            with EpisodeCapture(client.store, decision, input="q") as run:
                assert run.end("answer").context is None
        with pytest.raises(InvalidDocument):  # still checked: an empty list is no context object
            policy.choose(context=[])  # type: ignore[arg-type]


@pytest.mark.parametrize("context, problem", [
    ({f"f{i}": i for i in range(MAX_CONTEXT_FEATURES + 1)}, "has 21 features; the limit is 20"),
    ({"task type": "x"}, "'task type' is not a feature name"),
    ({"9lives": "x"}, "'9lives' is not a feature name"),
    ({"tokens": math.nan}, "tokens: must be a category"),
    ({"tokens": math.inf}, "tokens: must be a category"),
    ({"tokens": 2**53}, "tokens: must be a category (a non-empty string of at most 128 characters, or a boolean) "
                        "or a finite number (an integer must be below 2**53 in magnitude, so that a float holds it"),
    ({"task": ""}, "task: must be a category"),
    ({"task": "x" * 129}, "task: must be a category (a non-empty string of at most 128 characters"),
    ({"task": {"nested": 1}}, "task: must be a category"),
    ({"task": ["a"]}, "task: must be a category"),
    ({"task": "a\ud800"}, "task: 'a\\ud800' is not valid Unicode (a lone surrogate"),
    (["task"], "must be an object of feature names to values"),
    ({1: "a"}, "feature names must be strings, got int 1"),
])
def test_bad_context_is_refused_naming_the_feature(client: PolicyClient, context: object, problem: str) -> None:
    with pytest.raises(InvalidDocument) as info:
        client.choose(context=context)  # type: ignore[arg-type]
    assert problem.removeprefix("tokens: ").removeprefix("task: ") in str(info.value)
    named = next((k for k in ("tokens", "task") if problem.startswith(f"{k}:")), None)
    assert f"context.{named}: " in str(info.value) if named else "context: " in str(info.value)


def test_any_mapping_is_a_context(client: PolicyClient) -> None:
    decision = client.choose(context=MappingProxyType({"task": "billing"}))
    assert decision.context == {"task": "billing"}
    with EpisodeCapture(client.store, decision, input="q") as run:
        assert run.end("answer").context == {"task": "billing"}


def test_a_bad_feature_of_any_mapping_is_named(client: PolicyClient) -> None:
    """A mapping that is not a dict (a Decision's config is one) was named only as ``context``."""
    with pytest.raises(InvalidDocument, match=r"^invalid context: context\.task: must be a category") as info:
        client.choose(context=MappingProxyType({"task": None}))
    assert info.value.fields == ["context.task"]


def test_a_stored_episode_with_bad_context_is_invalid_naming_the_field(client: PolicyClient) -> None:
    with EpisodeCapture(client.store, client.choose(context={"task": "x"}), input="q", episode_id="ep-3") as run:
        good = run.end("answer").to_dict()
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be a category"):
        Episode.from_dict({**good, "context": {"tokens": "x" * 500}})


def test_the_score_carries_the_episodes_context_for_the_trainer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent_learning.app.embedded import open_local
    from agent_learning.app.settings import load_settings

    clock = ManualClock()
    # Two episodes: too few for the guardrail to judge (it would hold them); it warns.
    with open_local(load_settings(guardrail="warn"), path=tmp_path / "ctx.db", clock=clock) as pipeline:
        create_policy(pipeline.store, SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=clock.now()))
        client = PolicyClient(pipeline.store, "bot", rng=random.Random(2), clock=clock)
        for episode_id, context in (("with", CONTEXT), ("without", None)):
            with EpisodeCapture(pipeline.store, client.choose(context=context), input="What is 2 + 2?",
                                episode_id=episode_id, clock=clock) as run:
                run.end("4")
        clock.advance(120)
        assert pipeline.run_once().published == {"bot": 2}
        scored = pipeline.store.get_score("with", "bot")
        plain = pipeline.store.get_score("without", "bot")
    assert scored is not None and scored["context"] == CONTEXT
    assert plain is not None and "context" not in plain
