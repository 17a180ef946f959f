"""Offline evaluations (``PUT/GET/DELETE …/evaluations/{id}``, ``GET …/evaluations``): policies
estimated on the agent's logged events with the project's off-policy estimators
(:mod:`agent_learning.evaluation.counterfactual`).

An evaluation runs when it is put, on the agent's scored episodes from ``startTime`` on (a later
``endTime`` is kept and shown: every episode scored since ``startTime`` counts), and is kept
with status ``Succeeded``. Its ``content.value`` holds one result per policy: the agent's current
policy (``policySource: Online``), the baseline (``Baseline``: always the agent's first action;
for slots, each slot's first), uniform (``Random``) and each policy of the body
(``Custom``), whose ``arguments`` name a policy here: ``version N`` (a version of the agent),
``always ACTION`` or ``uniform``. A result's ``summary`` is the self-normalised (SNIPS) estimate
of its mean reward with its 95 % interval; ``estimates`` adds every estimator's (IPS, SNIPS,
doubly robust) and ``notes`` what limits them. ``optimalPolicy`` names the policy with the
highest estimate.

Each evaluation also compares the learned (current) policy with the baseline (the difference of
their SNIPS estimates, and ``learnedPolicyBeatsBaseline`` when its interval lies above 0): kept
as the agent's ``latestApprenticeModeMetrics`` (:mod:`.modes`). The compare needs events where the
policy's choice was served: Apprentice serves the baseline only, so its evaluation estimates the
learned policy from the events where it agrees with the baseline.

Evaluations are kept in the store's checkpoints (``personalizer-evaluation:{agent}:{id}``, with
the agent's list of ids in ``personalizer-evaluations:{agent}``).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from agent_learning.app.handlers import Runtime
from agent_learning.app.personalizer import admin, events, modes
from agent_learning.app.personalizer.config import Problem
from agent_learning.core.errors import NotFound
from agent_learning.documents import PolicyDocument, episode_id_problem
from agent_learning.evaluation import Estimate
from agent_learning.evaluation.counterfactual import (
    Comparison,
    Distribution,
    always,
    compare_to_current,
    of_document,
    read_logged,
    uniform,
    version_target,
)
from agent_learning.policy.softmax import Layout

EVALUATION_FIELDS = ("name", "startTime", "endTime", "policies", "enablePolicyOptimization")
SUMMARY_ESTIMATOR = "snips"
"""The estimator of a result's ``summary`` (the others are in its ``estimates``)."""
CONFIDENCE = 0.95
EVALUATION_CHECKPOINT = "personalizer-evaluation:{agent_id}:{evaluation_id}"
INDEX_CHECKPOINT = "personalizer-evaluations:{agent_id}"
LISTED = ("id", "name", "startTime", "endTime", "creationTime", "evaluationType", "status")


def bad(message: str) -> Problem:
    return Problem(400, "InvalidEvaluationContract", message)


def create(rt: Runtime, agent_id: str, evaluation_id: str, body: bytes) -> dict[str, Any]:
    """``PUT …/evaluations/{id}``: run the evaluation ``body`` states, keep it and answer it as
    :func:`get` does (repeating the same request changes nothing; another request under a kept id is 409)."""
    check_id(evaluation_id)
    data = events.read_body(body)
    kept = load(rt, agent_id, evaluation_id)
    if kept is not None:
        if kept["request"] != data:
            raise Problem(409, "Conflict", f"evaluationId: {evaluation_id!r} is an evaluation of another request")
        return get(rt, agent_id, evaluation_id)
    if unknown := sorted(set(data) - set(EVALUATION_FIELDS)):
        raise bad(f"{unknown[0]}: unknown field (known: {', '.join(EVALUATION_FIELDS)})")
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise bad(f"name: must be a non-empty string, got {data.get('name')!r:.80}")
    start, end = read_time(data, "startTime"), read_time(data, "endTime")
    if end < start:
        raise bad("endTime: is before startTime")
    if data.get("enablePolicyOptimization", False) is not False:
        raise bad("enablePolicyOptimization: searching for other learning settings is not done here; "
                  "name the policies to compare in policies")
    current = admin.current_document(rt.store, agent_id)
    targets = [("Online", {"name": f"{agent_id} v{current.version}", "arguments": "the current policy"},
                of_document(current)),
               ("Baseline", {"name": "baseline", "arguments": f"always {baseline(current)}"},
                always(current, baseline(current))),
               ("Random", {"name": "uniform", "arguments": "uniform"}, uniform(current))]
    for i, policy in enumerate(read_policies(data.get("policies"))):
        targets.append(("Custom", policy, custom(rt, current, policy["arguments"], f"policies[{i}].arguments")))
    try:
        logged = read_logged(rt.store, current, since=start)
    except NotFound as exc:
        raise bad(f"startTime: {exc}".replace("--since: ", "").replace("--agent-id: ", "")) from None
    results, comparisons = [], {}
    for source, policy, target in targets:
        try:
            found = compare_to_current(logged, current, target, policy["name"], CONFIDENCE, "policies")
        except NotFound as exc:
            results.append({**policy, "policySource": source, "summary": None, "estimates": {}, "notes": [str(exc)]})
            continue
        comparisons[source] = found
        results.append({**policy, "policySource": source, "summary": summary(found, 0),
                        "estimates": {name: figures(e[0]) for name, e in found.estimates.items()},
                        "notes": found.notes})
    estimated = [r for r in results if r["summary"] is not None]
    now = events.clock_of(rt).now().isoformat()
    evaluation = {
        "id": evaluation_id, "name": data["name"], "startTime": start.isoformat(), "endTime": end.isoformat(),
        "creationTime": now, "evaluationType": "Manual", "status": "Succeeded",
        "description": f"{len(logged.logs)} scored episodes of {agent_id!r} from {start.isoformat()} on",
        "optimalPolicy": max(estimated, key=lambda r: r["summary"]["expectedReward"])["name"] if estimated else None,
        "content": {"startTime": start.isoformat(), "endTime": end.isoformat(), "value": results},
        "apprentice": apprentice(evaluation_id, now, len(logged.logs), comparisons.get("Baseline")),
    }
    modes.keep_apprentice_metrics(rt.store, agent_id, evaluation["apprentice"])
    rt.store.set_checkpoint(name(agent_id, evaluation_id), json.dumps({**evaluation, "request": data}))
    ids = index(rt, agent_id)
    rt.store.set_checkpoint(INDEX_CHECKPOINT.format(agent_id=agent_id), json.dumps([*ids, evaluation_id]))
    return get(rt, agent_id, evaluation_id)


def get(rt: Runtime, agent_id: str, evaluation_id: str) -> dict[str, Any]:
    """``GET …/evaluations/{id}`` (the client's ``startTime``/``endTime`` aggregate a time series,
    which is not kept: the results are the evaluation's whole window)."""
    check_id(evaluation_id)
    kept = load(rt, agent_id, evaluation_id)
    if kept is None:
        raise Problem(404, "ResourceNotFound", f"evaluationId: {agent_id!r} has no evaluation {evaluation_id!r}")
    return {k: v for k, v in kept.items() if k != "request"}


def listed(rt: Runtime, agent_id: str, query: Any) -> dict[str, Any]:
    """``GET …/evaluations``: the agent's evaluations, oldest first (``top``, ``skip``)."""
    events.check_agent(agent_id)
    if query.get("filter"):
        raise bad("filter: filtering evaluations is not supported; list them all")
    top, skip = read_count(query, "top"), read_count(query, "skip") or 0
    ids = index(rt, agent_id)[skip:][:top]
    kept = [e for e in (load(rt, agent_id, i) for i in ids) if e is not None]
    return {"value": [{k: e[k] for k in LISTED} for e in kept]}


def delete(rt: Runtime, agent_id: str, evaluation_id: str) -> None:
    """``DELETE …/evaluations/{id}`` (deleting one that is not there changes nothing)."""
    check_id(evaluation_id)
    events.check_agent(agent_id)
    rt.store.set_checkpoint(name(agent_id, evaluation_id), "")
    ids = index(rt, agent_id)
    if evaluation_id in ids:
        rt.store.set_checkpoint(INDEX_CHECKPOINT.format(agent_id=agent_id),
                                json.dumps([i for i in ids if i != evaluation_id]))


# --------------------------------------------------------------------------- parts


def baseline(doc: PolicyDocument) -> str:
    """The baseline action: the first action (for slots, the first value of each)."""
    layout = Layout.of(doc)
    return layout.joint_id([0] * len(layout.sizes))


def custom(rt: Runtime, current: PolicyDocument, arguments: str, field: str) -> Distribution:
    """The policy ``arguments`` names (module docstring)."""
    words = arguments.split()
    try:
        if words == ["uniform"]:
            return uniform(current)
        if len(words) == 2 and words[0] == "always":
            return always(current, words[1])
        if len(words) == 2 and words[0] == "version" and words[1].isdigit():
            return version_target(rt.store, current, int(words[1]))
    except (ValueError, NotFound) as exc:
        raise bad(f"{field}: {str(exc).split(': ', 1)[-1]}") from None
    raise bad(f"{field}: {arguments!r:.80} names no policy here; use 'version N', 'always ACTION' or 'uniform'")


def read_policies(value: Any) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(f"policies: must be a list of {{name, arguments}}, got {value!r:.80}")
    for i, policy in enumerate(value):
        if not isinstance(policy, dict) or set(policy) != {"name", "arguments"} \
                or not all(isinstance(v, str) and v for v in policy.values()):
            raise bad(f"policies[{i}]: must be an object of a name and arguments (strings)")
    return value


def read_time(data: dict[str, Any], field: str) -> datetime:
    value = data.get(field)
    try:
        when = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        when = None
    if when is None:
        raise bad(f"{field}: must be an ISO 8601 date and time, got {value!r:.80}")
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def read_count(query: Any, field: str) -> int | None:
    value = query.get(field)
    if value is None:
        return None
    if not str(value).isdigit():
        raise bad(f"{field}: must be a whole number from 0, got {value!r:.40}")
    return int(value)


def figures(e: Estimate) -> dict[str, Any]:
    """An estimate as JSON: value, interval and effective sample size (NaN as null)."""
    return {k: v if math.isfinite(v) else None for k, v in
            (("value", e.value), ("low", e.low), ("high", e.high), ("effectiveSampleSize", e.effective_sample_size))}


def summary(found: Comparison, which: int, sign: float = 1.0) -> dict[str, Any] | None:
    """Personalizer's summary of estimate ``which`` (0 the target, 1 the current, 2 target − current;
    ``sign`` −1 turns a difference around)."""
    chosen = found.estimates.get(SUMMARY_ESTIMATOR) or next(iter(found.estimates.values()), None)
    if chosen is None:
        return None
    f = figures(chosen[which])
    if None in (f["value"], f["low"], f["high"]):
        return None
    low, high = sorted((sign * f["low"], sign * f["high"]))
    return {"expectedReward": sign * f["value"], "confidenceInterval": [low, high]}


def apprentice(evaluation_id: str, when: str, events_: int, found: Comparison | None) -> dict[str, Any]:
    """The learned (current) policy against the baseline: their estimates, the difference, and
    whether its interval lies above 0 (``None``: no estimate)."""
    difference = summary(found, 2, -1.0) if found is not None else None
    return {"evaluationId": evaluation_id, "creationTime": when, "numberOfEvents": events_,
            "learnedPolicy": summary(found, 1) if found is not None else None,
            "baseline": summary(found, 0) if found is not None else None,
            "learnedMinusBaseline": difference,
            "learnedPolicyBeatsBaseline": None if difference is None else difference["confidenceInterval"][0] > 0}


def check_id(evaluation_id: str) -> None:
    if problem := episode_id_problem(evaluation_id):
        raise bad(f"evaluationId: {problem}")


def name(agent_id: str, evaluation_id: str) -> str:
    return EVALUATION_CHECKPOINT.format(agent_id=agent_id, evaluation_id=evaluation_id)


def load(rt: Runtime, agent_id: str, evaluation_id: str) -> dict[str, Any] | None:
    events.check_agent(agent_id)
    stored = rt.store.get_checkpoint(name(agent_id, evaluation_id))
    return json.loads(stored) if stored else None


def index(rt: Runtime, agent_id: str) -> list[str]:
    stored = rt.store.get_checkpoint(INDEX_CHECKPOINT.format(agent_id=agent_id))
    return json.loads(stored) if stored else []
