"""Builders of valid documents for tests.

Every builder returns a fully validated document with sensible defaults; pass keyword
arguments to override any field. Derived fields follow their sources unless overridden
(an episode's ``logprob`` is ``math.log(probability)``, a policy's ``id`` follows its
``agent_id``/``kind``/``version``, a run's ``id`` follows its ``agent_id``/``policy_version``).
All datetimes are timezone-aware. :class:`CountingStore` wraps a store and counts the calls
that reach it, for tests of what an operation costs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_learning.documents import (
    Action,
    Episode,
    JudgeInfo,
    MetricScore,
    PolicyDocument,
    RewardInfo,
    Score,
    ScoreCursor,
    Step,
    TrainingRun,
    UnjudgedRecord,
    policy_doc_id,
    run_doc_id,
)
from agent_learning.store.base import Store

BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)
"""The default timestamp of every factory-built document (2026-01-01T00:00:00Z)."""

DEFAULT_AGENT = "agent-a"
"""The default ``agent_id`` of every factory-built document."""

DEFAULT_ACTIONS = ("direct", "step-by-step", "calculator")

INCARNATION = "0123456789abcdef0123456789abcdef"
"""The incarnation of the policies, episodes and scores these factories make (``incarnation=None``:
a document of a release from before incarnations)."""
"""The default action ids of :func:`make_policy_doc`; episodes and scores default to the first."""


def make_episode(id: str = "ep-1", **overrides: Any) -> Episode:
    """A valid :class:`Episode` with one tool step; ``overrides`` replace any field.

    ``logprob`` defaults to ``math.log(probability)`` (after overriding ``probability``),
    and ``ended_at`` to 1.5 s after ``started_at``.
    """
    probability = overrides.pop("probability", 0.5)
    started_at = overrides.pop("started_at", BASE_TIME)
    fields: dict[str, Any] = {
        "id": id,
        "agent_id": DEFAULT_AGENT,
        "policy_version": 1,
        "action_id": DEFAULT_ACTIONS[0],
        "probability": probability,
        "logprob": math.log(probability),
        "input": "What is 2 + 2?",
        "output": "4",
        "steps": [Step(name="calculator", kind="tool", status="ok", latency_ms=12.5, arguments={"expr": "2+2"})],
        "started_at": started_at,
        "ended_at": started_at + timedelta(seconds=1.5),
        "metadata": {"user": "u-1", "turn": 1},
        "incarnation": INCARNATION,
    }
    fields.update(overrides)
    return Episode(**fields)


def make_policy_doc(
    agent_id: str = DEFAULT_AGENT,
    version: int = 1,
    kind: str = "version",
    actions: Sequence[str] = DEFAULT_ACTIONS,
    **overrides: Any,
) -> PolicyDocument:
    """A valid :class:`PolicyDocument` over ``actions`` with uniform (zero) logits.

    ``kind`` is ``"version"`` (id ``{agent}:v{version}``) or ``"current"`` (id
    ``{agent}:current``). ``source`` defaults to ``"init"`` for version 1 and ``"train"``
    (with ``parent_version = version - 1``) otherwise. ``overrides`` replace any field.
    """
    fields: dict[str, Any] = {
        "id": policy_doc_id(agent_id, version if kind == "version" else None),
        "kind": kind,
        "agent_id": agent_id,
        "version": version,
        "actions": [Action(id=a, description=f"action {a}", config={"prompt": a}) for a in actions],
        "logits": [0.0] * len(actions),
        "source": "init" if version == 1 else "train",
        "parent_version": None if version == 1 else version - 1,
        "created_at": BASE_TIME,
        "incarnation": INCARNATION,
    }
    fields.update(overrides)
    return PolicyDocument(**fields)


def make_score(episode_id: str = "ep-1", episode: Episode | None = None, **overrides: Any) -> Score:
    """A valid :class:`Score` of ``episode_id`` (its ``id`` is the episode id), without ``seq``.

    Given ``episode``, the id, agent, action, policy version and probability are taken from
    it. ``overrides`` replace any field (e.g. ``reward=0.9`` or ``agent_id="agent-b"``).
    """
    if episode is not None:
        episode_id = episode.id
    metric = MetricScore(
        raw=4.0,
        normalised=0.75,
        result="pass",
        threshold=3.0,
        reason="good",
        evaluator="relevance",
        evaluator_version="1",
    )
    fields: dict[str, Any] = {
        "id": episode_id,
        "episode_id": episode_id,
        "agent_id": episode.agent_id if episode else DEFAULT_AGENT,
        "action_id": episode.action_id if episode else DEFAULT_ACTIONS[0],
        "policy_version": episode.policy_version if episode else 1,
        "probability": episode.probability if episode else 0.5,
        "metrics": {"relevance": metric},
        "judge": JudgeInfo(name="offline", model="test-model"),
        "reward": 0.5,
        "reward_function": RewardInfo(
            version="test-reward", weights={"relevance": 1.0}, penalties={}, components={"weighted": 0.75}
        ),
        "scored_at": BASE_TIME + timedelta(seconds=5),
        "incarnation": episode.incarnation if episode else INCARNATION,
    }
    fields.update(overrides)
    return Score(**fields)


def make_unjudged(episode_id: str = "ep-1", episode: Episode | None = None, **overrides: Any) -> UnjudgedRecord:
    """A valid :class:`UnjudgedRecord` of ``episode_id`` (sampled out by ``*=0.2``); given
    ``episode``, its id, agent, action and policy version are taken from it."""
    if episode is not None:
        episode_id = episode.id
    fields: dict[str, Any] = {
        "id": episode_id,
        "episode_id": episode_id,
        "agent_id": episode.agent_id if episode else DEFAULT_AGENT,
        "action_id": episode.action_id if episode else DEFAULT_ACTIONS[0],
        "policy_version": episode.policy_version if episode else 1,
        "reason": "sampled_out",
        "rule": "*=0.2",
        "recorded_at": BASE_TIME + timedelta(seconds=5),
    }
    fields.update(overrides)
    return UnjudgedRecord(**fields)


def make_run(agent_id: str = DEFAULT_AGENT, policy_version: int = 2, **overrides: Any) -> TrainingRun:
    """A valid :class:`TrainingRun` that published ``policy_version`` from ``policy_version - 1``.

    Its id is ``run_doc_id(agent_id, policy_version)``; ``overrides`` replace any field.
    """
    fields: dict[str, Any] = {
        "id": run_doc_id(agent_id, policy_version),
        "agent_id": agent_id,
        "base_version": max(1, policy_version - 1),
        "policy_version": policy_version,
        "cursor_from": None,
        "cursor_to": ScoreCursor(seq=10, id="ep-10"),
        "episodes": 10,
        "metrics": {"loss": 0.25, "entropy": 1.05},
        "learner": {"name": "reinforce", "learning_rate": 0.1},
        "started_at": BASE_TIME,
        "finished_at": BASE_TIME + timedelta(seconds=2),
    }
    fields.update(overrides)
    return TrainingRun(**fields)


def record_steps_at_the_caps(run: Any, char: str = "é", short_every: int = 2) -> list[tuple[str, str, float]]:
    """Record ``MAX_STEPS`` steps on an ``EpisodeCapture`` whose result, error and arguments are
    at their caps in ``char`` (every ``short_every``-th step has short texts instead, which a
    longest-first cut keeps whole). Returns each step's (name, status, latency_ms)."""
    from agent_learning.documents import MAX_JSON_CHARS, MAX_STEP_TEXT_CHARS, MAX_STEPS, json_bytes

    arguments = {"query": char * MAX_JSON_CHARS}
    while json_bytes(arguments) > MAX_JSON_CHARS:  # the cap counts JSON bytes, non-ASCII escaped
        arguments["query"] = arguments["query"][: -max(1, (json_bytes(arguments) - MAX_JSON_CHARS) // 12)]
    recorded = []
    for i in range(MAX_STEPS):
        short = short_every and i % short_every == 0
        status = "error" if i % 3 == 0 else "ok"
        run.step(
            f"tool-{i}",
            latency_ms=float(i),
            status=status,
            error=f"short error {i}" if short else char * MAX_STEP_TEXT_CHARS,
            arguments={"n": i} if short else arguments,
            result=f"short result {i}" if short else char * MAX_STEP_TEXT_CHARS,
        )
        recorded.append((f"tool-{i}", status, float(i)))
    return recorded


class CountingStore(Store):
    """Every call of the wrapped store, counted by method name."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.calls = inner, Counter[str]()

    @property
    def reads(self) -> int:
        """Calls that read (``get_*``, ``list_*`` and ``read_*``)."""
        return sum(n for name, n in self.calls.items() if name.startswith(("get_", "list_", "read_")))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _counted(name: str) -> Any:
    def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        return getattr(self.inner, name)(*args, **kwargs)

    call.__name__ = name
    return call


for _name in Store.__abstractmethods__:
    setattr(CountingStore, _name, _counted(_name))
CountingStore.__abstractmethods__ = frozenset()
