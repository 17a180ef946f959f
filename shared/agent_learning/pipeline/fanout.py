"""Fan-out: which agents a training tick must train, and one message per agent to train it.

A tick used to train every agent one after the other inside the timer, a singleton that cannot
scale out. Now the timer only plans (:func:`plan_training`) and sends one
:class:`TrainRequest` per agent with new scores to the training queue; a queue trigger trains
one agent per message (:func:`train_requested`), so agents train in parallel on as many
instances as the platform gives the trigger. The embedded runner does the same through its
SQLite queue.

Cost of a tick. :meth:`~agent_learning.store.base.Store.training_cursors` lists every agent's
cursor in one paged query (about one request per thousand agents on Cosmos DB), reading each
current document whole so that an invalid one is reported (``invalid_policy``) whether or not
its agent has new scores (validating one takes 50-80 µs); then each unpinned agent with a
valid document costs one single-partition query
(:meth:`~agent_learning.store.base.Store.has_new_scores`), so an agent with nothing new costs
one cheap read per tick and nothing else. The checks run one after another (a store serializes
its queries anyway: see ``CosmosStore._query``): about 10 ms each on Cosmos DB, so 10,000 agents
take under two minutes of a five-minute tick.

Exactly once. A message only asks "train this agent now": :func:`train_requested` runs
:func:`~agent_learning.pipeline.train.train_agent`, which reads the current document and the
scores after *its* cursor and publishes with a compare-and-swap. A duplicate message, a stale
one (the agent trained since), or two trainers on one agent therefore publish each score once,
as before. The message id is derived from the agent and its cursor, so Service Bus duplicate
detection drops a second send of the same tick's request (a re-run timer); a later tick at
the same cursor (the agent is still waiting for ``min_batch`` scores, or its candidate was held)
must send again, which is why the queue's duplicate-detection window is shorter than the
timer's interval (``infra/modules/servicebus.bicep``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import AgentId
from agent_learning.pipeline.train import (
    TrainOutcome,
    agent_list,
    failure_outcome,
    invalid_policy,
    paused,
    train_safely,
)
from agent_learning.queue.base import OutgoingMessage
from agent_learning.store.base import AgentCursor, Store

log = logging.getLogger(__name__)

TRAIN_REQUEST = "train_request"
"""The ``type`` of a training message's body."""


@dataclass(frozen=True)
class TrainRequest:
    """The body of a training message: train ``agent_id``, last seen at ``version`` with
    ``cursor`` (both informative: the trainer reads the current document itself; version 0: the
    document had none)."""

    agent_id: str
    version: int
    cursor: dict[str, Any] | None = None

    @property
    def message_id(self) -> str:
        """Derived from the agent and its cursor: the same tick's request twice is one message."""
        cursor = self.cursor or {}
        key = f"{self.agent_id}\n{cursor.get('seq', '')}\n{cursor.get('id', '')}"
        return "train-" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()

    def to_message(self) -> OutgoingMessage:
        body = {"type": TRAIN_REQUEST, "agent_id": self.agent_id, "version": self.version, "cursor": self.cursor}
        return OutgoingMessage(self.message_id, json.dumps(body), {"agent_id": self.agent_id})

    @classmethod
    def from_json(cls, body: bytes | str) -> TrainRequest:
        """Parse a message body; :class:`~agent_learning.core.errors.InvalidDocument` names the bad field."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise InvalidDocument("train_request", [("body", "is not JSON")]) from None
        if not isinstance(data, dict):
            raise InvalidDocument("train_request", [("body", "must be a JSON object")])
        problems: list[tuple[str, str]] = []
        if data.get("type") != TRAIN_REQUEST:
            problems.append(("type", f"must be {TRAIN_REQUEST!r}, got {data.get('type')!r}"))
        agent_id = data.get("agent_id")
        try:
            TypeAdapter(AgentId).validate_python(agent_id)
        except ValidationError:
            problems.append(("agent_id", f"{agent_id!r} is not a valid agent id"))
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            problems.append(("version", f"must be an integer >= 0, got {version!r}"))
        cursor = data.get("cursor")
        if cursor is not None and not isinstance(cursor, dict):
            problems.append(("cursor", "must be an object or null"))
        if problems:
            raise InvalidDocument("train_request", problems)
        return cls(str(agent_id), int(version), cursor)


@dataclass
class TrainingPlan:
    """What one tick found: the agents to train, and those that need nothing."""

    requests: list[TrainRequest] = field(default_factory=list)
    idle: list[AgentCursor] = field(default_factory=list)
    """Agents with no new settled score after their cursor."""
    pinned: list[AgentCursor] = field(default_factory=list)
    """Agents whose learning is paused (not checked)."""
    failed: list[TrainOutcome] = field(default_factory=list)
    """Agents whose current document is invalid (``invalid_policy``) or whose check failed
    (``unavailable`` or ``failed``), as a training run would say; the next tick checks them again."""

    @property
    def agents(self) -> int:
        """Agents with a current policy."""
        return len(self.requests) + len(self.idle) + len(self.pinned) + len(self.failed)

    def untrained(self) -> list[TrainOutcome]:
        """The outcome of every agent the plan does not train, as :func:`train_agent` would report it."""
        out = [TrainOutcome("no_new_scores", a.agent_id, a.version) for a in self.idle]
        out += [TrainOutcome("pinned", a.agent_id, a.version, reason=paused(a.pin_reason)) for a in self.pinned]
        return out + self.failed


def plan_training(store: Store, *, agent_ids: Iterable[str] | None = None) -> TrainingPlan:
    """The agents with new settled scores after their cursor (pinned agents are not checked; an
    invalid current document is reported as the trainer would, pinned or not); ``agent_ids``
    restricts the plan to those agents."""
    agent_ids = agent_list(agent_ids)  # before any read
    cursors = store.training_cursors()
    if agent_ids is not None:
        wanted = set(agent_ids)
        cursors = [c for c in cursors if c.agent_id in wanted]
    plan = TrainingPlan(failed=[invalid_policy(c.agent_id, c.problem) for c in cursors if c.problem])
    valid = [c for c in cursors if not c.problem]
    plan.pinned = [c for c in valid if c.pinned]
    due = [c for c in valid if not c.pinned]

    def check(agent: AgentCursor) -> bool | TrainOutcome:
        try:
            return store.has_new_scores(agent.agent_id, agent.cursor)
        except Exception as exc:  # one agent's failure must not stop the tick
            return failure_outcome(agent.agent_id, exc)

    for agent in due:
        new = check(agent)
        if isinstance(new, TrainOutcome):
            plan.failed.append(new)
        elif new:
            cursor = agent.cursor.model_dump() if agent.cursor is not None else None
            plan.requests.append(TrainRequest(agent.agent_id, agent.version, cursor))
        else:
            plan.idle.append(agent)
    return plan


def send_plan(plan: TrainingPlan, send: Any) -> int:
    """Send the plan's requests (``send`` takes an iterable of messages, as the queue's does)."""
    if not plan.requests:
        return 0
    return int(send([r.to_message() for r in plan.requests]) or 0)


def train_requested(body: bytes | str, store: Store, learner: Any, **train_kwargs: Any) -> TrainOutcome:
    """Train the agent a training message names (:func:`~agent_learning.pipeline.train.train_safely`
    with ``train_kwargs``: it never raises). Raises :class:`~agent_learning.core.errors.InvalidDocument`
    for a body that is not a training request."""
    request = TrainRequest.from_json(body)
    return train_safely(request.agent_id, store, learner, **train_kwargs)
