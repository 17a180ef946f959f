"""The model, the policy configuration and the logs of an agent's Personalizer resource.

**The model is the agent's current policy document.** ``GET …/model`` answers it as JSON in an
octet stream (Personalizer's model was a VW file; this one is readable and diffable).
``PUT …/model`` imports such a document, exported from this agent or another, as the agent's
next version (``source: import``, :func:`agent_learning.pipeline.import_policy`): its actions,
logits, temperature, exploration floor, dimensions and features; the agent's training cursor
and its learner's evidence stay, as after a rollback. ``DELETE …/model`` rolls the agent back to
its version 1 as a new version. ``GET …/model/properties``: when version 1 and the current
version were made. Every change is a version in the agent's history (``agent-learn policy history``).

**The policy configuration** (``name``, ``arguments``) named VW's command line there. Here the
learner is the project's REINFORCE with the settings' learning rate, the same for every agent, so
a ``PUT`` is stored and answered back as it was put, and changes nothing in how the agent learns;
``DELETE`` forgets it, and ``GET`` describes the policy again.

**Logs** are the agent's episodes. ``GET …/logs/properties`` answers the date range of the
newest :data:`LOG_SCAN` episodes' start times. ``DELETE …/logs`` deletes the agent's episodes with
their scores and feedback, and its events still waiting for a reward, and keeps what it learned
from them: its policy, versions and runs (:meth:`agent_learning.store.base.Store.delete_logs`). As in Personalizer, the
model stays; events not yet learned are not learned.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from agent_learning.app.handlers import HttpAnswer, Runtime
from agent_learning.app.personalizer import events
from agent_learning.app.personalizer.config import Problem
from agent_learning.core.errors import InvalidDocument, NotFound
from agent_learning.documents import PolicyDocument, parse_json, policy_doc_id
from agent_learning.pipeline import import_policy, load_current, rollback

log = logging.getLogger("agent_learning.app.personalizer")

MAX_MODEL_BYTES = 8 * 1024 * 1024
"""The largest model a ``PUT …/model`` takes."""
LOG_SCAN = 10_000
"""The newest episodes ``GET …/logs/properties`` reads for the date range."""
POLICY_CHECKPOINT = "personalizer-policy:{agent_id}"
IMPORTED = ("actions", "logits", "temperature", "exploration_floor", "dimensions", "excluded", "features",
            "action_features", "schema_version", "learner_state")
"""The fields of an imported document that make the new version; the rest are the agent's own."""


def current_document(store: Any, agent_id: str) -> PolicyDocument:
    events.check_agent(agent_id)
    current = load_current(store, agent_id)
    if current is None:
        raise Problem(404, "ResourceNotFound", f"agent {agent_id!r} has no policy")
    return current


# --------------------------------------------------------------------------- model


def export_model(rt: Runtime, agent_id: str, signed: str | None) -> HttpAnswer:
    """``GET …/model``: the current policy document, as an octet stream."""
    if signed not in (None, "false", "False"):
        raise Problem(400, "BadRequest", "signed: signed model archives are not made here; export with signed=false")
    body = json.dumps(current_document(rt.store, agent_id).to_dict(), indent=1)
    return HttpAnswer(200, body, {"Content-Type": "application/octet-stream"})


def import_model(rt: Runtime, agent_id: str, body: bytes) -> None:
    """``PUT …/model``: ``body`` (an exported policy document) as the agent's next version."""
    current = current_document(rt.store, agent_id)
    if len(body) > MAX_MODEL_BYTES:
        raise Problem(413, "PayloadSizeExceeded", f"model: {len(body):,} bytes; the limit is {MAX_MODEL_BYTES:,}")
    try:
        data = parse_json(body, unique_names=True)
    except ValueError as exc:
        raise Problem(400, "BadRequest", f"model: not a policy document exported by GET …/model: {exc}") from None
    if not isinstance(data, dict) or "actions" not in data or "logits" not in data:
        raise Problem(400, "BadRequest", "model: must be a policy document exported by GET …/model "
                                         "(a JSON object with actions and logits)")
    fields = {k: data[k] for k in IMPORTED if k in data}
    try:
        target = PolicyDocument.from_dict({
            **current.as_kind("version").to_dict(), "dimensions": None, "excluded": None, "features": None,
            "action_features": None, **fields, "id": policy_doc_id(agent_id, current.version),
        })
    except InvalidDocument as exc:
        raise Problem(400, "BadRequest", f"model: {str(exc).removeprefix('invalid policy: ')}") from None
    if (target.dimensions is None) != (current.dimensions is None):
        model, agent = ("multi", "single") if target.dimensions is not None else ("single", "multi")
        raise Problem(400, "BadRequest", f"model: is a {model}-slot model and {agent_id!r} a {agent}-slot agent; "
                                         "import a model of its kind, or create a new agent")
    import_policy(rt.store, agent_id, target, clock=events.clock_of(rt), note="personalizer model import")


def reset_model(rt: Runtime, agent_id: str) -> None:
    """``DELETE …/model``: version 1's policy as the next version (nothing to do at version 1)."""
    current = current_document(rt.store, agent_id)
    if current.version == 1 or (current.source == "rollback" and current.parent_version == 1):
        return
    try:
        rollback(rt.store, agent_id, 1, clock=events.clock_of(rt), note="personalizer model reset")
    except NotFound as exc:
        raise Problem(404, "ResourceNotFound", str(exc)) from None


def model_properties(rt: Runtime, agent_id: str) -> dict[str, Any]:
    """``GET …/model/properties``: when the agent's first and current versions were made."""
    current = current_document(rt.store, agent_id)
    times = rt.store.policy_version_times(agent_id)
    first = datetime.fromisoformat(str(times[0][1])) if times and times[0][0] == 1 else current.created_at
    return {"creationTime": first.isoformat(), "lastModifiedTime": current.created_at.isoformat()}


# --------------------------------------------------------------------------- policy configuration


def policy_configuration(rt: Runtime, agent_id: str) -> dict[str, Any]:
    """``GET …/configurations/policy``: the configuration put, else the policy described."""
    events.check_agent(agent_id)
    stored = rt.store.get_checkpoint(POLICY_CHECKPOINT.format(agent_id=agent_id))
    return json.loads(stored) if stored else events.policy_configuration(rt.store, agent_id)


def put_policy_configuration(rt: Runtime, agent_id: str, body: bytes) -> dict[str, Any]:
    """``PUT …/configurations/policy``: stored and answered back (module docstring)."""
    events.check_agent(agent_id)
    data = events.read_body(body)
    if unknown := sorted(set(data) - {"name", "arguments"}):
        raise Problem(400, "InvalidPolicyConfiguration", f"{unknown[0]}: unknown field (known: name, arguments)")
    for name in ("name", "arguments"):
        value = data.get(name)
        if not isinstance(value, str) or not value.strip() or len(value) > 4096:
            raise Problem(400, "InvalidPolicyConfiguration",
                          f"{name}: must be a non-empty string of at most 4096 characters, got {value!r:.80}")
    policy = {"name": data["name"], "arguments": data["arguments"]}
    rt.store.set_checkpoint(POLICY_CHECKPOINT.format(agent_id=agent_id), json.dumps(policy))
    return policy


def reset_policy_configuration(rt: Runtime, agent_id: str) -> dict[str, Any]:
    """``DELETE …/configurations/policy``: forget the configuration put; the policy described."""
    events.check_agent(agent_id)
    rt.store.set_checkpoint(POLICY_CHECKPOINT.format(agent_id=agent_id), "")
    return events.policy_configuration(rt.store, agent_id)


# --------------------------------------------------------------------------- logs


def log_properties(rt: Runtime, agent_id: str) -> dict[str, Any]:
    """``GET …/logs/properties``: the start times of the agent's earliest and latest episodes
    (of the newest :data:`LOG_SCAN`); no range without episodes."""
    events.check_agent(agent_id)
    started = [str(e["started_at"]) for e in rt.store.list_episodes(agent_id, limit=LOG_SCAN) if e.get("started_at")]
    return {"dateRange": {"from": min(started), "to": max(started)} if started else {}}


def delete_logs(rt: Runtime, agent_id: str) -> None:
    """``DELETE …/logs``: the agent's episodes, scores, feedback and waiting events deleted (module docstring)."""
    current_document(rt.store, agent_id)
    deleted = rt.store.delete_logs(agent_id)
    for prefix in (events.EVENT_CHECKPOINT, events.PENDING_CHECKPOINT):
        for name in rt.store.list_checkpoints(prefix.format(episode_id=f"{agent_id}:")):
            rt.store.delete_checkpoint(name)
    log.warning("personalizer: deleted the logs of agent %s: %s", agent_id, deleted)
