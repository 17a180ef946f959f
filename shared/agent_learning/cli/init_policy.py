"""``agent-learn init-policy``: an agent's first policy, from an ``--actions`` file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from agent_learning.cli.access import _settings, _store, _where
from agent_learning.cli.options import Float, FloatRange, _agent_id, db_option
from agent_learning.cli.output import out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument
from agent_learning.core.limits import MAX_TEMPERATURE, MIN_TEMPERATURE

STRUCTURE_KEYS = ("dimensions", "context", "excluded", "interactions")
"""The keys of an ``--actions`` file that declares a structured policy (an object, not a list)."""


def _read_actions(actions_file: str) -> list[Any] | dict[str, Any]:
    """The actions in an ``--actions`` file, checked item by item: a list of actions, or an
    object with ``dimensions`` (and optionally ``context``, ``excluded`` and ``interactions``)."""
    from agent_learning.documents import parse_json
    try:  # a name given twice is refused, as the HTTP routes refuse it: JSON would keep only the last
        actions = parse_json(Path(actions_file).read_text(), unique_names=True)
    except ValueError as exc:
        raise ValueError(f"--actions: {actions_file} {exc}") from None
    if isinstance(actions, dict):
        unknown = sorted(set(actions) - set(STRUCTURE_KEYS))
        if unknown or "dimensions" not in actions:
            raise ValueError(
                f"--actions: {actions_file} holds an object; it needs \"dimensions\" and may have "
                f"\"context\", \"excluded\" and \"interactions\"" + (f" (unknown: {unknown})" if unknown else "")
            )
        return actions
    if not isinstance(actions, list) or not actions:
        raise ValueError(f"--actions: {actions_file} must hold a non-empty JSON list, or an object with dimensions")
    for i, action in enumerate(actions):
        if not isinstance(action, str | dict):
            raise ValueError(
                f"--actions: item {i} of {actions_file} is {json.dumps(action)}; an action is an id (a string) "
                'or an object such as {"id": "k=5", "config": {"retrieval_k": 5}}'
            )
    return actions


POLICY_OPTIONS = {"temperature": "--temperature", "exploration_floor": "--exploration-floor", "agent_id": "--agent-id"}
"""The option behind each policy field that does not come from the ``--actions`` file."""


def _actions_problem(exc: InvalidDocument) -> ValueError:
    """A policy built from ``--actions`` that failed validation, as the option's error: each
    problem after the option it came from (``--actions`` for the file's own fields)."""
    return ValueError("; ".join(
        f"{POLICY_OPTIONS[name]}: {problem}" if name in POLICY_OPTIONS else f"--actions: {name}: {problem}"
        for name, problem in exc.problems
    ))


def _checked_floor(floor: float, given: str, actions: list[Any] | dict[str, Any]) -> float:
    """``floor`` if every action (every value of the largest dimension) can have it, else a
    ValueError naming where it came from (``given``) and a floor that fits."""
    if not math.isfinite(floor) or floor < 0:
        raise ValueError(f"--exploration-floor: must be a finite number >= 0, got {floor}")
    if isinstance(actions, dict):
        sizes = {str(name): len(values) for name, values in (actions.get("dimensions") or {}).items()
                 if isinstance(values, list)} if isinstance(actions.get("dimensions"), dict) else {}
        if not sizes:
            return floor  # the document's validation names what is wrong with the dimensions
        largest = max(sizes, key=sizes.__getitem__)
        k, what = sizes[largest], f"values of dimension {largest!r}"
    else:
        k, what = len(actions), "actions"
    if floor * k < 1:
        return floor
    fits = float(f"{0.5 / k:.0e}")  # one significant digit, at most half of 1/k
    where = {
        "option": f"--exploration-floor: {floor} x {k} {what} reaches 1",
        "setting": f"--exploration-floor: AGENT_LEARNING_EXPLORATION_FLOOR={floor} x {k} {what} reaches 1",
        "default": f"--exploration-floor: the default floor {floor} x {k} {what} reaches 1",
    }[given]
    raise ValueError(f"{where} (the floor is each one's minimum probability, so floor x {k} must be below 1); "
                     f"pass a smaller --exploration-floor, e.g. --exploration-floor {fits:g}")


@main.command("init-policy")
@click.option("--agent-id", required=True, callback=_agent_id, help="The new agent's id.")
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON file: a list of action ids or of {id, description, config} objects; or an object "
    '{"dimensions": {"prompt": [...], "retrieval_k": [...]}, "context": {"task": "category"}, "excluded": [...], '
    '"interactions": [["prompt", "retrieval_k"]]}.',
)
@click.option(
    "--temperature",
    type=FloatRange(MIN_TEMPERATURE, MAX_TEMPERATURE),
    default=None,
    help="Default: AGENT_LEARNING_TEMPERATURE.",
)
@click.option("--exploration-floor", type=Float(), default=None,
              help="Minimum probability of every action; times the number of actions, below 1. "
              "Default: AGENT_LEARNING_EXPLORATION_FLOOR.")
@db_option
@_handle_errors
def init_policy(
    agent_id: str, actions_file: str, temperature: float | None, exploration_floor: float | None, db: str | None
) -> None:
    """Create version 1 (uniform) of an agent's policy."""
    from agent_learning.pipeline import create_policy
    from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy
    settings = _settings(db)
    actions = _read_actions(actions_file)
    if exploration_floor is None:
        given = "setting" if "exploration_floor" in settings.model_fields_set else "default"
        exploration_floor = _checked_floor(settings.exploration_floor, given, actions)
    else:
        exploration_floor = _checked_floor(exploration_floor, "option", actions)
    options = {
        "temperature": settings.temperature if temperature is None else temperature,
        "exploration_floor": exploration_floor,
    }
    if temperature is not None and not math.isfinite(temperature):
        raise ValueError(f"--temperature: {temperature} is not in the range {MIN_TEMPERATURE}<=x<={MAX_TEMPERATURE}.")
    try:
        if isinstance(actions, dict):
            first = StructuredPolicy.create(
                agent_id,
                actions["dimensions"],
                context=actions.get("context"),
                excluded=actions.get("excluded") or (),
                interactions=actions.get("interactions") or (),
                **options,
            ).document
        else:
            first = SoftmaxPolicy.from_actions(agent_id, actions, **options).to_document(created_at=None)
    except InvalidDocument as exc:
        raise _actions_problem(exc) from None
    with _store(db, create=True) as (store, _):
        existed = store.get_current_policy(agent_id) is not None
        try:
            doc = create_policy(store, first)
        except ConcurrencyConflict as exc:
            raise ValueError(f"--agent-id: {exc}") from None
    if existed:  # the same policy again: nothing changed
        out.print(f"{agent_id} already has this policy (now v{doc.version}) in {_where(settings)}; nothing changed")
    elif doc.dimensions:
        dims = ", ".join(f"{d.name} ({d.size})" for d in doc.dimensions)
        features = f" learning from {[f.name for f in doc.features]}" if doc.features else ""
        out.print(f"created {doc.agent_id} v{doc.version} with dimensions {dims}{features} in {_where(settings)}")
    else:
        out.print(f"created {doc.agent_id} v{doc.version} with actions {doc.action_ids} in {_where(settings)}")
