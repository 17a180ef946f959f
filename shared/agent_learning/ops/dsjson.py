"""An agent's episodes as Vowpal Wabbit's DSJSON (``vw --dsjson --cb_explore_adf``), the format
Azure AI Personalizer's logs used, and such logs as episodes of an agent.

One JSON object a line, one line an episode:

=======================  ==============================================================
DSJSON field             here
=======================  ==============================================================
``_label_cost``          −reward: the episode's own reward, else its score's reward
                         (after corrections); Personalizer logged cost = −reward
``_label_probability``   the probability the action was served with
``_label_Action``        the action taken: its 1-based position in ``c._multi``
``_labelIndex``          the same, 0-based
``o``                    the outcome: ``[{"v": reward, "EventId": …, "ActionTaken": false}]``
``Timestamp``            when the action was chosen (``started_at``), UTC
``Version``              ``"1"``, the format's version
``EventId``              the Personalizer event id (``{agent_id}:`` left out of the episode id)
``a``                    the ranking served: 1-based positions in ``c._multi``, the action
                         taken first
``c``                    the context: the request's ``contextFeatures`` merged into one
                         object (an episode of another kind: its flat context), and
                         ``_multi``, the actions offered, ``{"id": action id, …its features}``
``p``                    the probabilities of ``a``, in its order
``VWState``              ``{"m": model}``: ``{agent_id}/v{policy version}`` (an imported
                         event keeps the log's)
=======================  ==============================================================

A Personalizer event (an episode with a ``personalizer_event_id``) is exported with the actions
its rank offered, their features and the whole ranking; another episode offers the actions of the
policy version it was drawn from and knows only its own action's probability (``a`` and ``p``
list that action alone). Episodes with neither reward nor score are left out and counted.

Imported lines become the episodes ``{agent_id}:{EventId}`` of the agent's current policy
version with the logged probability (training weighs them off-policy) and reward = −cost, which
must be in [0, 1], an episode's own reward; an agent without a policy gets version 1 over the
logged actions, each as likely as the log took it (add-one smoothed: the log's policy, roughly, so
that the publish guardrail can judge steps from it on these episodes; uniform, it could not when
the log was sure of one action), learning from the logged context's features. Every line is checked before
anything is written (a bad line is reported by number and field); importing again adds only the
events not imported yet. Lines marked ``_skipLearn`` (never activated) are counted, not imported.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import AlreadyExists, InvalidDocument, NotFound
from agent_learning.documents import (
    MAX_CONTEXT_FEATURES,
    Episode,
    PolicyDocument,
    check_context,
    feature_kinds,
    policy_doc_id,
)
from agent_learning.documents.fields import ACTION_ID, ACTION_ID_RULE, MAX_TEXT_CHARS, STRUCTURED_SCHEMA
from agent_learning.pipeline import create_policy
from agent_learning.rewards.feedback import score_rows
from agent_learning.store.base import Store

FORMAT_VERSION = "1"
"""DSJSON's ``Version``."""
EVENT_KEY = "personalizer_event_id"
"""The episode metadata naming its Personalizer event (:mod:`agent_learning.app.personalizer.events`)."""
MODEL_KEY = "dsjson_model"
"""The episode metadata keeping an imported line's ``VWState.m``."""
REQUIRED = ("EventId", "_label_cost", "_label_probability", "_label_Action", "c")


class BadLog(ValueError):
    """A DSJSON line that cannot be imported: its number (1-based) and the field at fault."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass
class Imported:
    """What :func:`import_lines` did."""

    added: int = 0
    already: int = 0
    skipped_learn: int = 0
    created_policy: bool = False
    actions: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- features


def flatten_features(items: list[dict[str, Any]], name: str, limit: int) -> dict[str, Any]:
    """Personalizer's feature objects as this project's context: one feature per leaf, named by its
    path (``user.profileType``; a list's items by their index). ``ValueError`` naming the path."""
    flat: dict[str, Any] = {}

    def walk(path: str, item: Any) -> None:
        if isinstance(item, dict | list):
            for key, inner in item.items() if isinstance(item, dict) else enumerate(item):
                walk(f"{path}.{key}" if path else str(key), inner)
        elif len(flat) > limit:
            raise ValueError(f"{name}: more than {limit} features (one per value); the limit is {limit}")
        elif path in flat:
            raise ValueError(f"{name}.{path}: given twice")
        else:
            flat[path] = item

    for i, feature in enumerate(items):
        try:
            walk("", feature)
        except RecursionError:
            raise ValueError(f"{name}[{i}]: nested too deeply") from None
    return flat


def merged(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Feature objects merged into one (objects under the same key merged in turn)."""
    out: dict[str, Any] = {}
    for item in items:
        for key, value in item.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged([out[key], value])
            elif key in out:
                raise ValueError(f"{key}: given twice")
            else:
                out[key] = value
    return out


# --------------------------------------------------------------------------- export


def export_lines(store: Store, agent_id: str, progress: Callable[[int], None] | None = None,
                 skipped: list[str] | None = None) -> Iterator[str]:
    """The agent's episodes as DSJSON lines, oldest first; the ids of episodes with neither reward
    nor score are appended to ``skipped``. ``progress(n)`` after each episode read."""
    docs = []
    for n, episode_id in enumerate(store.episode_ids(agent_id), 1):
        raw = store.get_episode(episode_id)
        if raw is not None:
            docs.append(Episode.from_dict({k: v for k, v in raw.items() if not k.startswith("_")}))
        if progress:
            progress(n)
    docs.sort(key=lambda e: (e.started_at, e.id))
    versions: dict[int, list[str]] = {}
    for episode in docs:
        reward = episode_reward(store, episode)
        if reward is None:
            if skipped is not None:
                skipped.append(episode.id)
            continue
        yield json.dumps(line_of(store, episode, reward, versions), separators=(",", ":"))


def offered_action(action_id: str, features: dict[str, Any]) -> dict[str, Any]:
    """An action of ``c._multi``: its id and its features."""
    if "id" in features:
        raise ValueError(f"actions: {action_id!r} has a feature named id, which DSJSON's action id takes")
    return {"id": action_id, **features}


def episode_reward(store: Store, episode: Episode) -> float | None:
    """The episode's own reward, else its score's (after corrections), else None."""
    if episode.reward is not None:
        return episode.reward
    rows = score_rows(store, episode.id, episode.agent_id)
    return float(rows[-1]["reward"]) if rows else None


def line_of(store: Store, episode: Episode, reward: float, versions: dict[int, list[str]]) -> dict[str, Any]:
    """One episode as a DSJSON object (module docstring)."""
    event = episode.metadata.get(EVENT_KEY)
    request = answer = None
    if event is not None and "input" not in episode.truncated:
        with contextlib.suppress(ValueError):
            request, answer = json.loads(episode.input), json.loads(episode.output)
    if isinstance(request, dict) and isinstance(answer, dict) and "ranking" in answer:
        offered = [offered_action(a["id"], merged(a.get("features") or [])) for a in request["actions"]]
        context = merged(request.get("contextFeatures") or [])
        position = {a["id"]: i + 1 for i, a in enumerate(offered)}
        ranking = [(position[r["id"]], r["probability"]) for r in answer["ranking"]]
    else:
        if episode.policy_version not in versions:
            stored = store.get_policy_version(episode.agent_id, episode.policy_version)
            versions[episode.policy_version] = [a["id"] for a in (stored or {}).get("actions", [])]
        ids = versions[episode.policy_version] or [episode.action_id]
        if episode.action_id not in ids:
            ids = [*ids, episode.action_id]
        offered = [{"id": a} for a in ids]
        context = dict(episode.context or {})
        ranking = [(ids.index(episode.action_id) + 1, episode.probability)]
    taken = ranking[0][0]
    event_id = event if isinstance(event, str) else episode.id.removeprefix(f"{episode.agent_id}:")
    return {
        "_label_cost": 0.0 - reward, "_label_probability": episode.probability, "_label_Action": taken,
        "_labelIndex": taken - 1, "o": [{"v": reward, "EventId": event_id, "ActionTaken": False}],
        "Timestamp": episode.started_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "Version": FORMAT_VERSION, "EventId": event_id,
        "a": [i for i, _ in ranking], "c": {**context, "_multi": offered}, "p": [p for _, p in ranking],
        "VWState": {"m": episode.metadata.get(MODEL_KEY, f"{episode.agent_id}/v{episode.policy_version}")},
    }


# --------------------------------------------------------------------------- import


@dataclass(frozen=True)
class Event:
    """One imported line, checked."""

    line: int
    event_id: str
    timestamp: datetime
    actions: list[dict[str, Any]]
    context_features: list[dict[str, Any]]
    context: dict[str, Any] | None
    ranking: list[tuple[str, float]]
    probability: float
    reward: float
    model: str | None


def read_line(number: int, text: str, clock: Clock) -> Event | None:
    """The event a DSJSON line logs (None for a ``_skipLearn`` line); :class:`BadLog` naming the field."""
    def bad(name: str, rule: str, value: Any) -> BadLog:
        return BadLog(number, f"{name}: {rule}, got {value!r:.80}")

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadLog(number, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadLog(number, "must be a JSON object")
    if data.get("_skipLearn") is True:
        return None
    if missing := [k for k in REQUIRED if k not in data]:
        raise BadLog(number, f"{missing[0]}: missing (a DSJSON line needs {', '.join(REQUIRED)})")
    event_id = data["EventId"]
    if not isinstance(event_id, str) or not event_id:
        raise bad("EventId", "must be a non-empty string", event_id)
    c = data["c"]
    if not isinstance(c, dict) or not isinstance(c.get("_multi"), list) or not c["_multi"]:
        raise bad("c._multi", "must be a non-empty list of the actions offered", c.get("_multi") if isinstance(c, dict)
                  else c)
    actions = []
    for i, item in enumerate(c["_multi"]):
        if not isinstance(item, dict):
            raise bad(f"c._multi[{i}]", "must be an object", item)
        action_id = item.get("id", str(i + 1))
        if not isinstance(action_id, str) or not ACTION_ID.fullmatch(action_id):
            raise bad(f"c._multi[{i}].id", f"must be an action id ({ACTION_ID_RULE})", action_id)
        if any(a["id"] == action_id for a in actions):
            raise bad(f"c._multi[{i}].id", "is offered twice", action_id)
        rest = {k: v for k, v in item.items() if k != "id"}
        actions.append({"id": action_id, "features": [rest] if rest else []})
    k = len(actions)
    taken = data["_label_Action"]
    if isinstance(taken, bool) or not isinstance(taken, int) or not 1 <= taken <= k:
        raise bad("_label_Action", f"must be a position in c._multi, 1 to {k}", taken)
    if "_labelIndex" in data and data["_labelIndex"] != taken - 1:
        raise bad("_labelIndex", f"must be _label_Action − 1 = {taken - 1}", data["_labelIndex"])
    probability = number_in(data["_label_probability"], "_label_probability", 0.0, 1.0, bad)
    if probability == 0:
        raise bad("_label_probability", "must be above 0 (the action was served)", probability)
    reward = -number_in(data["_label_cost"], "_label_cost", -1.0, 0.0, bad) + 0.0
    positions = data.get("a", [taken])
    probabilities = data.get("p", [probability])
    whole = isinstance(positions, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in positions)
    if not whole or not positions or positions[0] != taken or len(set(positions)) < len(positions) \
            or not all(1 <= x <= k for x in positions):
        raise bad("a", f"must list distinct positions in c._multi (1 to {k}), the action taken first", positions)
    if not isinstance(probabilities, list) or len(probabilities) != len(positions):
        raise bad("p", f"must list one probability for each of a's {len(positions)} actions", probabilities)
    for i, p in enumerate(probabilities):
        number_in(p, f"p[{i}]", 0.0, 1.0, bad)
    if not math.isclose(probabilities[0], probability, rel_tol=1e-6, abs_tol=1e-9):
        raise bad("p[0]", f"must be _label_probability ({probability:g}), the action taken's", probabilities[0])
    stamp = data.get("Timestamp")
    try:
        when = clock.now() if stamp is None else datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        raise bad("Timestamp", "must be an ISO 8601 time such as 2026-01-31T12:00:00.000000Z", stamp) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    features = [{key: value} for key, value in c.items() if key != "_multi"]
    try:
        flat = flatten_features(features, "c", MAX_CONTEXT_FEATURES)
    except ValueError as exc:
        raise BadLog(number, str(exc)) from None
    try:
        context = check_context(flat) or None
    except ValueError as exc:
        raise BadLog(number, f"c: {exc}") from None
    state = data.get("VWState")
    model = state.get("m") if isinstance(state, dict) and isinstance(state.get("m"), str) else None
    ids = [a["id"] for a in actions]
    return Event(number, event_id, when, actions, features, context,
                 [(ids[x - 1], float(p)) for x, p in zip(positions, probabilities, strict=True)],
                 probability, reward, model)


def number_in(value: Any, name: str, low: float, high: float, bad: Callable[[str, str, Any], BadLog]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        rule = f"must be a number from {low:g} to {high:g}"
        if name == "_label_cost":
            rule += " (cost = −reward, and a reward is 0 to 1)"
        raise bad(name, rule, value)
    return float(value)


def import_lines(store: Store, agent_id: str, lines: Iterable[str], *, clock: Clock = SYSTEM_CLOCK,
                 progress: Callable[[int], None] | None = None) -> Imported:
    """Import DSJSON ``lines`` as episodes of ``agent_id`` (module docstring): all lines are checked
    first; :class:`BadLog` for the first bad one, and nothing is written."""
    result = Imported()
    events: list[Event] = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        event = read_line(number, text, clock)
        if event is None:
            result.skipped_learn += 1
        else:
            events.append(event)
    seen: dict[str, int] = {}
    for e in events:
        if e.event_id in seen:
            raise BadLog(e.line, f"EventId: {e.event_id!r:.80} is line {seen[e.event_id]}'s too")
        seen[e.event_id] = e.line
    logged = list(dict.fromkeys(a["id"] for e in events for a in e.actions))
    policy = current_policy(store, agent_id)
    if policy is None and events:
        taken = Counter(e.ranking[0][0] for e in events)
        policy = first_policy(store, agent_id, logged, events[0].context, clock,
                              [math.log((taken[a] + 1) / (len(events) + len(logged))) for a in logged])
        result.created_policy = True
    if policy is None:
        return result
    known = {a.id for a in policy.actions}
    for e in events:
        if unknown := [a["id"] for a in e.actions if a["id"] not in known]:
            raise BadLog(e.line, f"c._multi: {unknown[0]!r} is not an action of {agent_id!r} "
                                 f"(its actions: {sorted(known)[:10]})")
    episodes = []
    for e in events:
        try:
            episodes.append(episode_of(agent_id, policy, e))
        except InvalidDocument as exc:
            raise BadLog(e.line, f"EventId {e.event_id!r:.80}: {exc}") from None
    for n, episode in enumerate(episodes, 1):
        if store.get_episode(episode.id) is not None:  # imported before (another episode of that id: refused)
            result.already += 1
        else:
            store.add_episode(episode)
            result.added += 1
        if progress:
            progress(n)
    result.actions = logged
    return result


def current_policy(store: Store, agent_id: str) -> PolicyDocument | None:
    tagged = store.get_current_policy(agent_id)
    return None if tagged is None else PolicyDocument.from_dict(tagged.doc)


def first_policy(store: Store, agent_id: str, actions: list[str], context: dict[str, Any] | None,
                 clock: Clock, logits: list[float] | None = None) -> PolicyDocument:
    """Version 1 of a new agent over the logged actions, learning from the context's features:
    ``logits`` (an import's: the log's own shares of each action taken, so that the guardrail
    judges the first steps on a log drawn much as version 1 draws), else uniform."""
    fields: dict[str, Any] = {"actions": [{"id": a} for a in actions],
                              "logits": logits if logits is not None else [0.0] * len(actions)}
    if context:
        fields |= {"schema_version": STRUCTURED_SCHEMA, "features": [
            {"name": n, "kind": k} for n, k in feature_kinds(context).items()]}
    doc = PolicyDocument.from_dict({"id": policy_doc_id(agent_id, 1), "kind": "version", "agent_id": agent_id,
                                    "version": 1, "source": "init", "created_at": clock.now().isoformat(), **fields})
    try:
        return create_policy(store, doc)
    except (AlreadyExists, NotFound, InvalidDocument):
        found = current_policy(store, agent_id)
        if found is None:
            raise
        return found


def episode_of(agent_id: str, policy: PolicyDocument, e: Event) -> Episode:
    """The episode an imported event is learned as, shaped as a Personalizer event's."""
    request = {"contextFeatures": e.context_features, "actions": e.actions}
    answer = {"eventId": e.event_id, "rewardActionId": e.ranking[0][0],
              "ranking": [{"id": a, "probability": p} for a, p in e.ranking]}
    text = json.dumps(request, separators=(",", ":"))
    if len(text) > MAX_TEXT_CHARS:
        raise BadLog(e.line, f"c: the event is {len(text):,} characters as a request; the limit is {MAX_TEXT_CHARS:,}")
    return Episode.from_dict({
        "id": f"{agent_id}:{e.event_id}", "agent_id": agent_id, "policy_version": policy.version,
        "action_id": e.ranking[0][0], "probability": e.probability, "logprob": math.log(e.probability),
        "input": text, "output": json.dumps(answer, separators=(",", ":")),
        "started_at": e.timestamp.isoformat(), "ended_at": e.timestamp.isoformat(),
        "metadata": {EVENT_KEY: e.event_id[:256], **({MODEL_KEY: e.model[:256]} if e.model else {})},
        "context": e.context, "reward": e.reward,
        **({"incarnation": policy.incarnation} if policy.incarnation else {}),
    })
