"""Rank, reward and activate: a Personalizer event on the agent's policy, learned as an episode.

**An event is an episode.** ``rank`` draws the action from the agent's current policy for the
request's context and keeps the event (its policy version, incarnation, the action drawn, the
probability it was served with, the context and the request) until it can be learned from. The
event becomes the episode ``{agent_id}:{eventId}`` (the same one however often the calls are
retried) once it is both *activated* (at rank, unless ``deferActivation``; else by ``activate``)
and *rewarded*: an event never activated is never learned from, as Personalizer ignores its
rewards.

**The reward is the episode's own reward** (``Episode.reward``, rule ``agent-reward/1``), not
feedback. Feedback is blended into a judged reward and waits for the episode to be judged, and a
Personalizer event has no transcript for a judge to read; an own reward is scored as it is,
without judges or penalties, so the scorer turns the caller's value into the score the trainer
learns from, with the probability the event was served with as the importance weight's
denominator. Rewards are 0 to 1 (the range of an episode's own reward) and count within
``rewardWaitTime`` from the rank: with ``rewardAggregation: earliest`` the first one is the
event's reward at once; with ``average``, the mean of those received, taken when the wait is over
(by a reward arriving later, or by the timer's :mod:`.sweep`). An activated event with no reward
when its wait is over takes ``defaultReward``. A multi-slot event's reward is the mean of its
slots' rewards (each slot's earliest or mean; a slot without one counts ``defaultReward``).

Events wait in the store's checkpoints (``personalizer-event:{episode id}``), and those not learned
from yet are marked pending (``personalizer-pending:{episode id}``) for the sweep to find.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent_learning.agent.client import PolicyClient
from agent_learning.app.personalizer.config import Problem, ServiceConfiguration, configuration_from
from agent_learning.app.personalizer.modes import follow_mode
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import AlreadyExists, ConcurrencyConflict, InvalidDocument, NotFound
from agent_learning.documents import (
    MAX_CONTEXT_FEATURES,
    Action,
    Episode,
    PolicyDocument,
    agent_id_problem,
    check_context,
    episode_id_problem,
    feature_kinds,
    parse_json,
    policy_doc_id,
)
from agent_learning.documents.actions import MAX_ACTION_FEATURES, check_action_features
from agent_learning.documents.fields import ACTION_ID, ACTION_ID_RULE, MAX_TEXT_CHARS, STRUCTURED_SCHEMA
from agent_learning.ops.dsjson import flatten_features
from agent_learning.pipeline import create_policy, revise
from agent_learning.policy.softmax import SoftmaxPolicy, structure_fields
from agent_learning.store.base import Store

if TYPE_CHECKING:
    from agent_learning.app.handlers import Runtime

MAX_RANK_ACTIONS = 50
"""Actions one rank request may give (Personalizer's limit)."""
MAX_BODY_BYTES = 512 * 1024
"""The largest request body (a rank of 50 actions with their features fits many times over)."""
RANK_FIELDS = ("contextFeatures", "actions", "excludedActions", "eventId", "deferActivation")
SINGLE_SLOT = "value"
"""The key of a single-slot event's rewards in its ``received`` rewards (a multi-slot event's: its slot ids)."""
MULTISLOT_FIELDS = ("contextFeatures", "actions", "slots", "eventId", "deferActivation")
SLOT_FIELDS = ("id", "baselineAction", "excludedActions", "features")
CONFIG_CHECKPOINT = "personalizer-config:{agent_id}"
EVENT_CHECKPOINT = "personalizer-event:{episode_id}"
PENDING_CHECKPOINT = "personalizer-pending:{episode_id}"
"""An event not learned from yet (its value: when it was ranked), until :mod:`.sweep` or a call settles it."""


# --------------------------------------------------------------------------- configuration


def configuration(store: Store, agent_id: str) -> ServiceConfiguration:
    """The agent's service configuration (Personalizer's defaults until one is put)."""
    stored = store.get_checkpoint(CONFIG_CHECKPOINT.format(agent_id=agent_id))
    return configuration_from(json.loads(stored)) if stored else ServiceConfiguration()


def put_configuration(store: Store, agent_id: str, body: bytes) -> ServiceConfiguration:
    """Store the configuration ``body`` states (fields it leaves out keep their values)."""
    try:
        config = configuration_from(read_body(body), configuration(store, agent_id))
    except ValueError as exc:
        raise Problem(400, "InvalidServiceConfiguration", str(exc)) from None
    store.set_checkpoint(CONFIG_CHECKPOINT.format(agent_id=agent_id), json.dumps(config.to_dict()))
    return config


def policy_configuration(store: Store, agent_id: str) -> dict[str, Any]:
    """``GET …/configurations/policy``: the policy's name and its learning arguments, in words."""
    policy = current_policy(store, agent_id)
    features = ", ".join(f.name for f in policy.features) or "none"
    return {
        "name": f"{agent_id} v{policy.version}",
        "arguments": f"softmax policy; temperature {policy.temperature:g}; exploration floor "
                     f"{policy.exploration_floor:g}; context features: {features}; learner: REINFORCE with a baseline",
    }


# --------------------------------------------------------------------------- rank


def rank(rt: Runtime, agent_id: str, body: bytes, *, multislot: bool) -> dict[str, Any]:
    """``POST …/rank`` and ``…/multislot/rank``: draw, keep the event, answer (see the module docstring)."""
    check_agent(agent_id)
    data = read_body(body)
    fields = MULTISLOT_FIELDS if multislot else RANK_FIELDS
    if unknown := sorted(set(data) - set(fields)):
        raise bad_rank(f"{unknown[0]}: unknown field (known: {', '.join(fields)})")
    actions = read_actions(data.get("actions"))
    context = read_context(data.get("contextFeatures"))
    defer = data.get("deferActivation", False)
    if not isinstance(defer, bool):
        raise bad_rank(f"deferActivation: must be true or false, got {defer!r:.80}")
    clock = clock_of(rt)
    event_id = data.get("eventId") or uuid.uuid4().hex
    episode_id = event_episode_id(agent_id, event_id)
    store = rt.store
    known = load_event(store, episode_id)
    if known is not None:  # a retried rank answers as the first did
        if known["request"] != data:
            raise Problem(409, "BadRequest", f"eventId: {event_id!r} is an earlier rank's event of another request")
        return known["answer"]
    config = configuration(store, agent_id)
    if multislot:
        slots = read_slots(data.get("slots"), actions)
        policy = same_kind(policy_for(rt, agent_id, lambda: new_slots_policy(rt, agent_id, slots, actions, context)),
                           multislot)
        drawn = draw_slots(policy, slots, actions, context, config, event_id)
        answer = {"eventId": event_id, "slots": [{"id": s, "rewardActionId": a} for s, (a, _) in drawn.items()]}
        action_id = ":".join(f"{s}={a}" for s, (a, _) in drawn.items())
        probability = math.prod(p for _, p in drawn.values())
    else:
        excluded = read_excluded(data.get("excludedActions"), actions)
        described = action_features(actions)
        policy = same_kind(policy_for(rt, agent_id, lambda: new_policy(rt, agent_id, actions, context, described)),
                           multislot)
        allowed = [a for a in actions if a not in excluded]
        candidates = None
        if policy.document is not None and policy.document.action_features:  # scored by their features
            candidates = [{"id": a, **({"features": described[a]} if described.get(a) else {})} for a in allowed]
        else:
            policy = with_actions(rt, policy, actions)
        ranking = draw(policy, allowed, context, config, event_id, candidates)
        action_id = ranking[0][0]
        probability = ranking[0][1]
        answer = {
            "eventId": event_id,
            "rewardActionId": action_id,
            "ranking": [{"id": a, "probability": p} for a, p in ranking] + [{"id": a, "probability": 0.0}
                                                                             for a in actions if a in excluded],
        }
    event = {
        "agent_id": agent_id, "event_id": event_id, "episode_id": episode_id, "multislot": multislot,
        "policy_version": policy.version, "incarnation": policy.incarnation, "action_id": action_id,
        "probability": probability, "context": context, "request": data, "answer": answer,
        "ranked_at": clock.now().isoformat(), "activated": not defer, "reward": None, "learned": False,
        "received": {},
    }
    if not multislot and candidates is not None:
        event["candidates"] = candidates
    save_event(store, event)
    store.set_checkpoint(PENDING_CHECKPOINT.format(episode_id=episode_id), event["ranked_at"])
    return answer


def policy_for(rt: Runtime, agent_id: str, create: Any) -> SoftmaxPolicy:
    """The agent's current policy; an unknown agent's is created by ``create()`` unless the
    settings say no (``AGENT_LEARNING_PERSONALIZER_CREATE_AGENTS``)."""
    client = rt.clients.get(agent_id) or rt.clients.setdefault(
        agent_id, PolicyClient(rt.store, agent_id, refresh_seconds=rt.settings.policy_refresh_seconds))
    try:
        return client.policy()
    except NotFound:
        if not rt.settings.personalizer_create_agents:
            raise Problem(404, "ResourceNotFound", f"agent {agent_id!r} has no policy; creating agents on their "
                          "first rank is off (AGENT_LEARNING_PERSONALIZER_CREATE_AGENTS)") from None
    with contextlib.suppress(AlreadyExists):  # another request created it first: rank with that one
        create_policy(rt.store, create())
    follow_mode(rt.store, agent_id, configuration(rt.store, agent_id))  # LoggingOnly pins it from the start
    return client.refresh()


def same_kind(policy: SoftmaxPolicy, multislot: bool) -> SoftmaxPolicy:
    """``policy``, if it is of the kind the route serves (a multi-slot agent's has named dimensions)."""
    if (policy.document is not None and policy.document.dimensions is not None) != multislot:
        kind, route = ("single-slot", "rank") if multislot else ("multi-slot", "multislot/rank")
        raise Problem(400, "InvalidMultiSlotApiAccess",
                      f"agent {policy.agent_id!r} is a {kind} agent; rank it with personalizer/{route}")
    return policy


def new_policy(rt: Runtime, agent_id: str, actions: dict[str, Any], context: dict[str, Any] | None,
               described: dict[str, dict[str, Any]] | None = None) -> PolicyDocument:
    """Version 1 of a new agent: uniform over the request's actions, learning from its context's
    features (strings and booleans as categories, numbers as numbers) and, when the actions have
    features, scoring actions by them (an action never seen is ranked by what its features earned)."""
    described = described or {}
    fields: dict[str, Any] = {
        "actions": [{"id": a, **({"features": described[a]} if described.get(a) else {})} for a in actions],
        "logits": [0.0] * len(actions),
    }
    if context:
        fields |= {"schema_version": STRUCTURED_SCHEMA, "features": [
            {"name": n, "kind": k} for n, k in feature_kinds(context).items()]}
    names = sorted({n for f in described.values() for n in f})
    if names:
        fields |= {"schema_version": STRUCTURED_SCHEMA, "action_features": [{"name": n} for n in names]}
    return first_version(rt, agent_id, fields)


def action_features(actions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Action id → its features as the policy scores them: Personalizer's feature objects flattened
    as a context is (``{"topic": "sports"}``, ``genre.0``); a fractional number is a category named
    by its value (a policy scores actions by categorical features). 400 naming the action."""
    out: dict[str, dict[str, Any]] = {}
    for i, (action_id, items) in enumerate(actions.items()):
        try:
            flat = flatten_features(items, f"actions[{i}].features", MAX_ACTION_FEATURES)
            out[action_id] = check_action_features(
                {k: repr(v) if isinstance(v, float) else v for k, v in flat.items() if v is not None})
        except ValueError as exc:
            raise bad_rank(f"actions[{i}].features: {exc}") from None
    return out


def new_slots_policy(rt: Runtime, agent_id: str, slots: list[dict[str, Any]], actions: dict[str, Any],
                     context: dict[str, Any] | None) -> PolicyDocument:
    """Version 1 of a new multi-slot agent: one dimension per slot, whose values are the request's actions."""
    kinds = feature_kinds(context)
    try:
        fields = structure_fields({s["id"]: list(actions) for s in slots}, kinds or None)
    except InvalidDocument as exc:
        raise bad_rank(f"slots: {exc.problems[0][1]}") from None
    return first_version(rt, agent_id, fields)


def first_version(rt: Runtime, agent_id: str, fields: dict[str, Any]) -> PolicyDocument:
    try:
        return PolicyDocument.from_dict({
            "id": policy_doc_id(agent_id, 1), "kind": "version", "agent_id": agent_id, "version": 1,
            "temperature": rt.settings.temperature, "exploration_floor": rt.settings.exploration_floor,
            "source": "init", "created_at": clock_of(rt).now().isoformat(), **fields,
        })
    except InvalidDocument as exc:
        raise bad_rank(str(exc).removeprefix("invalid policy: ")) from None


def with_actions(rt: Runtime, policy: SoftmaxPolicy, actions: dict[str, Any]) -> SoftmaxPolicy:
    """``policy``, revised to add the request's actions it does not have (a policy with context
    features cannot be revised yet: 400 naming the action)."""
    new = [a for a in actions if a not in policy.action_ids]
    if not new:
        return policy
    if policy.features or len(policy.layout.sizes) > 1:
        raise bad_rank(f"actions: {new[0]!r} is not an action of {policy.agent_id!r}, whose policy learns from "
                       f"context features; adding actions to such a policy is not supported yet "
                       f"(its actions: {policy.action_ids[:10]})")
    revise(rt.store, policy.agent_id, [*policy.actions, *(Action(id=a) for a in new)], note="personalizer rank")
    return rt.clients[policy.agent_id].refresh()


def draw(policy: SoftmaxPolicy, allowed: list[str], context: dict[str, Any] | None, config: ServiceConfiguration,
         event_id: str, candidates: list[dict[str, Any]] | None = None) -> list[tuple[str, float]]:
    """The served ranking of ``allowed``: the drawn action first with its probability, then the
    rest by probability. Online: (1 − ε)·π restricted to ``allowed`` + ε uniform, π among the
    ``candidates`` offered (their features scored) when given; otherwise the baseline (the first
    allowed action) with probability 1."""
    if not allowed:
        raise bad_rank("excludedActions: every action is excluded")
    if candidates is not None:
        try:
            pi = policy.offered_probabilities(policy.offered(candidates), context)
        except InvalidDocument as exc:
            raise bad_rank(f"actions: {exc.problems[0][1]}") from None
    else:
        pi = [policy.probability(a, context) for a in allowed]
    served = served_probabilities(allowed, pi, config)
    chosen = pick(allowed, served, event_id)
    rest = sorted((i for i in range(len(allowed)) if i != chosen), key=lambda i: -served[i])
    return [(allowed[i], served[i]) for i in [chosen, *rest]]


def served_probabilities(allowed: list[str], pi: list[float], config: ServiceConfiguration) -> list[float]:
    if config.learningMode != "Online":
        return [1.0] + [0.0] * (len(allowed) - 1)
    total = math.fsum(pi)
    eps = config.explorationPercentage
    k = len(allowed)
    return [(1 - eps) * (p / total if total > 0 else 1 / k) + eps / k for p in pi]


def pick(ids: list[str], probabilities: list[float], event_id: str) -> int:
    """The index drawn, seeded by the event id: a retried rank draws the same action."""
    u = random.Random(f"{event_id}:{','.join(ids)}").random() * math.fsum(probabilities)
    for i, p in enumerate(probabilities):
        u -= p
        if u < 0 and p > 0:
            return i
    return max(i for i, p in enumerate(probabilities) if p > 0)


def draw_slots(policy: SoftmaxPolicy, slots: list[dict[str, Any]], actions: dict[str, Any],
               context: dict[str, Any] | None, config: ServiceConfiguration,
               event_id: str) -> dict[str, tuple[str, float]]:
    """Slot id → the action drawn for it and its probability, each slot from its dimension's
    marginal restricted to the actions it may take (the baseline first), as :func:`draw` does."""
    names = list(policy.layout.names)
    if sorted(names) != sorted(s["id"] for s in slots):
        raise bad_rank(f"slots: the agent's slots are {names}, the request's {[s['id'] for s in slots]}")
    marginals = policy.marginals(context)
    out = {}
    for slot in slots:
        name = slot["id"]
        allowed = [slot["baselineAction"], *(a for a in actions if a != slot["baselineAction"]
                                            and a not in slot["excludedActions"])]
        known = marginals[name]
        if missing := [a for a in allowed if f"{name}={a}" not in known]:
            raise bad_rank(f"actions: {missing[0]!r} is not an action of slot {name!r}; adding actions to a "
                           "multi-slot agent is not supported yet")
        served = served_probabilities(allowed, [known[f"{name}={a}"] for a in allowed], config)
        i = pick(allowed, served, f"{event_id}:{name}")
        out[name] = (allowed[i], served[i])
    return out


# --------------------------------------------------------------------------- reward and activate


def reward(rt: Runtime, agent_id: str, event_id: str, body: bytes, *, multislot: bool) -> None:
    """``POST …/events/{eventId}/reward`` (``{"value": x}``) and its multi-slot twin
    (``{"reward": [{"slotId", "value"}]}``): the event's reward (module docstring)."""
    check_agent(agent_id)
    data = read_body(body)
    event = find_event(rt.store, agent_id, event_id, multislot)
    config = configuration(rt.store, agent_id)
    if multislot:
        values = read_slot_rewards(data, [s["id"] for s in event["answer"]["slots"]])
    else:
        if unknown := sorted(set(data) - {"value"}):
            raise bad_reward(f"{unknown[0]}: unknown field (known: value)")
        values = {SINGLE_SLOT: read_reward(data.get("value"), "value")}
    if event["reward"] is not None:  # settled: the earliest reward, or the wait is over
        return
    clock = clock_of(rt)
    received = event.setdefault("received", {})
    if clock.now() <= datetime.fromisoformat(event["ranked_at"]) + config.reward_wait:
        for slot, value in values.items():
            received.setdefault(slot, []).append(value)
        if config.rewardAggregation == "average":  # more may come: the mean is taken when the wait is over
            save_event(rt.store, event)
            return
    event["reward"] = aggregated(event, config)
    settle(rt.store, event, config, clock)


def slot_names(event: dict[str, Any]) -> list[str]:
    """The event's slots (a single-slot event's one reward is the slot :data:`SINGLE_SLOT`)."""
    return [s["id"] for s in event["answer"]["slots"]] if event["multislot"] else [SINGLE_SLOT]


def aggregated(event: dict[str, Any], config: ServiceConfiguration) -> float:
    """The event's reward from the rewards received within the wait: per slot the earliest or the
    mean (``rewardAggregation``), ``defaultReward`` for a slot with none; the mean over the slots."""
    received = event.get("received", {})
    per_slot = [config.defaultReward if not received.get(s) else
                received[s][0] if config.rewardAggregation == "earliest" else math.fsum(received[s]) / len(received[s])
                for s in slot_names(event)]
    return math.fsum(per_slot) / len(per_slot)


def activate(rt: Runtime, agent_id: str, event_id: str, *, multislot: bool) -> None:
    """``POST …/events/{eventId}/activate``: the event's action was shown; its reward is learned."""
    check_agent(agent_id)
    event = find_event(rt.store, agent_id, event_id, multislot)
    if event["activated"]:
        return
    event["activated"] = True
    settle(rt.store, event, configuration(rt.store, agent_id), clock_of(rt))


def settle(store: Store, event: dict[str, Any], config: ServiceConfiguration, clock: Clock) -> None:
    """Keep ``event``; once it is activated and rewarded, write its episode (once)."""
    if event["activated"] and event["reward"] is not None and not event["learned"]:
        with contextlib.suppress(ConcurrencyConflict):  # an earlier call wrote it and died before saving the event
            store.add_episode(episode_of(event, config, clock))
        event["learned"] = True
    save_event(store, event)
    if event["learned"]:
        store.delete_checkpoint(PENDING_CHECKPOINT.format(episode_id=event["episode_id"]))


def episode_of(event: dict[str, Any], config: ServiceConfiguration, clock: Clock) -> Episode:
    """The episode an activated, rewarded event is learned as."""
    text = json.dumps({k: v for k, v in event["request"].items() if k != "eventId"}, separators=(",", ":"))
    ranked = datetime.fromisoformat(event["ranked_at"])
    p = event["probability"]
    return Episode.from_dict({
        "id": event["episode_id"], "agent_id": event["agent_id"], "policy_version": event["policy_version"],
        "action_id": event["action_id"], "probability": p, "logprob": math.log(p),
        "input": text[:MAX_TEXT_CHARS], "truncated": ["input"] if len(text) > MAX_TEXT_CHARS else [],
        "output": json.dumps(event["answer"], separators=(",", ":"))[:MAX_TEXT_CHARS],
        "started_at": ranked.isoformat(), "ended_at": max(ranked, clock.now()).isoformat(),
        "metadata": {"personalizer_event_id": event["event_id"][:256]},
        "context": event["context"], "reward": event["reward"], "ttl": config.ttl_seconds,
        **({"candidates": event["candidates"]} if event.get("candidates") else {}),
        **({"incarnation": event["incarnation"]} if event["incarnation"] else {}),
    })


# --------------------------------------------------------------------------- events in the store


def clock_of(rt: Runtime) -> Clock:
    """The runtime's clock (its parts', else the system's)."""
    return rt.parts.clock if rt.parts is not None else SYSTEM_CLOCK


def event_episode_id(agent_id: str, event_id: Any) -> str:
    """The episode id of an agent's event: ``{agent_id}:{eventId}`` (a hash of the event id when
    that would be over the id limit)."""
    if not isinstance(event_id, str) or not event_id:
        raise bad_rank(f"eventId: must be a non-empty string, got {event_id!r:.80}")
    if problem := episode_id_problem(event_id):
        raise bad_rank(f"eventId: {problem}")
    episode_id = f"{agent_id}:{event_id}"
    if episode_id_problem(episode_id):
        episode_id = f"{agent_id}:h-{hashlib.sha256(event_id.encode()).hexdigest()[:40]}"
    return episode_id


def load_event(store: Store, episode_id: str) -> dict[str, Any] | None:
    stored = store.get_checkpoint(EVENT_CHECKPOINT.format(episode_id=episode_id))
    return json.loads(stored) if stored else None


def save_event(store: Store, event: dict[str, Any]) -> None:
    store.set_checkpoint(EVENT_CHECKPOINT.format(episode_id=event["episode_id"]), json.dumps(event))


def find_event(store: Store, agent_id: str, event_id: str, multislot: bool) -> dict[str, Any]:
    try:
        event = load_event(store, event_episode_id(agent_id, event_id))
    except Problem as exc:
        raise Problem(400, "InvalidRewardRequest", exc.message) from None
    if event is None:
        raise Problem(404, "ResourceNotFound", f"eventId: no rank of agent {agent_id!r} has the event {event_id!r}")
    if event["multislot"] != multislot:
        kind = "multi-slot" if event["multislot"] else "single-slot"
        raise Problem(400, "InvalidRewardRequest", f"eventId: {event_id!r} is a {kind} event; use its routes")
    return event


def current_policy(store: Store, agent_id: str) -> SoftmaxPolicy:
    check_agent(agent_id)
    client = PolicyClient(store, agent_id, refresh_seconds=0)
    try:
        return client.policy()
    except NotFound:
        raise Problem(404, "ResourceNotFound", f"agent {agent_id!r} has no policy") from None


# --------------------------------------------------------------------------- request bodies


def check_agent(agent_id: str) -> None:
    if problem := agent_id_problem(agent_id):
        raise Problem(400, "BadRequest", f"agent_id: {problem}")


def read_body(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise Problem(413, "PayloadSizeExceeded", f"body: {len(body):,} bytes; the limit is {MAX_BODY_BYTES:,}")
    try:
        data = parse_json(body or b"{}", unique_names=True)
    except ValueError as exc:
        raise Problem(400, "BadRequest", f"body: {exc}") from None
    if not isinstance(data, dict):
        raise Problem(400, "BadRequest", "body: must be a JSON object")
    return data


def bad_rank(message: str) -> Problem:
    return Problem(400, "InvalidRankRequest", message)


def bad_reward(message: str) -> Problem:
    return Problem(400, "InvalidRewardRequest", message)


def read_actions(value: Any) -> dict[str, Any]:
    """Action id → its features, in the request's order."""
    if not isinstance(value, list) or not value:
        raise bad_rank(f"actions: must be a non-empty list of actions, got {value!r:.80}")
    if len(value) > MAX_RANK_ACTIONS:
        raise bad_rank(f"actions: {len(value)} actions; the limit is {MAX_RANK_ACTIONS}")
    out: dict[str, Any] = {}
    for i, action in enumerate(value):
        if not isinstance(action, dict):
            raise bad_rank(f"actions[{i}]: must be an object with id and features")
        if unknown := sorted(set(action) - {"id", "features"}):
            raise bad_rank(f"actions[{i}].{unknown[0]}: unknown field (known: id, features)")
        action_id, features = action.get("id"), action.get("features")
        if not isinstance(action_id, str) or not ACTION_ID.fullmatch(action_id):
            raise bad_rank(f"actions[{i}].id: {action_id!r:.80} is not an action id: use {ACTION_ID_RULE}")
        if action_id in out:
            raise bad_rank(f"actions[{i}].id: {action_id!r} is listed twice")
        if not isinstance(features, list) or not all(isinstance(f, dict) for f in features):
            raise bad_rank(f"actions[{i}].features: must be a list of objects, got {features!r:.80}")
        out[action_id] = features
    return out


def read_excluded(value: Any, actions: dict[str, Any]) -> set[str]:
    if value is None:
        return set()
    if not isinstance(value, list):
        raise bad_rank(f"excludedActions: must be a list of action ids, got {value!r:.80}")
    for i, action_id in enumerate(value):
        if action_id not in actions:
            raise bad_rank(f"excludedActions[{i}]: {action_id!r:.80} is not one of the request's actions")
    return set(value)


def read_context(value: Any) -> dict[str, Any] | None:
    """The request's ``contextFeatures`` (a list of objects) as this project's context: one
    feature per leaf, named by its path (``user.profileType``; a list's items by their index)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(f, dict) for f in value):
        raise bad_rank(f"contextFeatures: must be a list of objects, got {value!r:.80}")
    try:
        flat = flatten_features(value, "contextFeatures", MAX_CONTEXT_FEATURES)
    except ValueError as exc:
        raise bad_rank(str(exc)) from None
    try:
        return check_context(flat) or None
    except ValueError as exc:
        raise bad_rank(f"contextFeatures: {exc}") from None


def read_slots(value: Any, actions: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_rank(f"slots: must be a non-empty list of slots, got {value!r:.80}")
    slots = []
    for i, slot in enumerate(value):
        if not isinstance(slot, dict):
            raise bad_rank(f"slots[{i}]: must be an object with id and baselineAction")
        if unknown := sorted(set(slot) - set(SLOT_FIELDS)):
            raise bad_rank(f"slots[{i}].{unknown[0]}: unknown field (known: {', '.join(SLOT_FIELDS)})")
        if not isinstance(slot.get("id"), str):
            raise bad_rank(f"slots[{i}].id: must be a string, got {slot.get('id')!r:.80}")
        baseline = slot.get("baselineAction")
        if baseline not in actions:
            raise bad_rank(f"slots[{i}].baselineAction: {baseline!r:.80} is not one of the request's actions")
        excluded = slot.get("excludedActions") or []
        if not isinstance(excluded, list) or any(a not in actions for a in excluded) or baseline in excluded:
            raise bad_rank(f"slots[{i}].excludedActions: must list actions of the request, not the baseline")
        if any(s["id"] == slot["id"] for s in slots):
            raise bad_rank(f"slots[{i}].id: {slot['id']!r} is given twice")
        slots.append({"id": slot["id"], "baselineAction": baseline, "excludedActions": excluded})
    return slots


def read_reward(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise bad_reward(f"{name}: must be a number from 0 to 1 (an episode's own reward), got {value!r:.80}")
    return float(value)


def read_slot_rewards(data: dict[str, Any], slots: list[str]) -> dict[str, float]:
    if unknown := sorted(set(data) - {"reward"}):
        raise bad_reward(f"{unknown[0]}: unknown field (known: reward)")
    items = data.get("reward")
    if not isinstance(items, list) or not items:
        raise bad_reward(f"reward: must be a non-empty list of {{slotId, value}}, got {items!r:.80}")
    out: dict[str, float] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"slotId", "value"}:
            raise bad_reward(f"reward[{i}]: must be an object with slotId and value")
        if item["slotId"] not in slots or item["slotId"] in out:
            raise bad_reward(f"reward[{i}].slotId: {item['slotId']!r:.80} is not one of the event's slots "
                             f"{slots}, or is given twice")
        out[item["slotId"]] = read_reward(item["value"], f"reward[{i}].value")
    return out

