"""The softmax policy agents choose from. Pure Python: no numpy on the agent side.

For logits θ, temperature T and exploration floor f over K actions, the probability of
action a is::

    π(a) = f + (1 − K·f) · softmax(θ / T)_a

* ``temperature`` T > 0 scales the logits: T > 1 flattens the policy, T < 1 sharpens it.
* ``exploration_floor`` f ≥ 0 is the minimum probability of every action (K·f < 1). It keeps
  every action tried now and then, so the policy notices when the best action changes, and
  it bounds the importance weights the learner uses for off-policy episodes.

The learner optimises the softmax part (``softmax(θ/T)``); the floor is exploration on top
of it. Episodes log π(a) as it was when the action was drawn, which is the behaviour
probability the learner's importance weights divide by.
"""

from __future__ import annotations

import math
import numbers
import random
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from agent_learning.core.clock import SYSTEM_CLOCK
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import (
    DEFAULT_EXPLORATION_FLOOR,
    DEFAULT_TEMPERATURE,
    Action,
    PolicyDocument,
    ScoreCursor,
    invalid_from_pydantic,
    policy_doc_id,
)
from agent_learning.policy.decision import Decision, read_only, validated_context
from agent_learning.policy.structured import StructuredPolicy, context_key, cumulative


def _number(name: str, value: Any) -> float:
    """``value`` as a float if it is a real number (numpy's too), else ``ValueError`` naming ``name``:
    ``"1"`` and ``True`` are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a number, got {type(value).__name__} {value!r:.40}")
    return float(value)


def softmax(logits: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Numerically stable softmax of ``logits / temperature``."""
    if temperature <= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    exps = [math.exp(x - top) for x in scaled]
    total = math.fsum(exps)
    return [e / total for e in exps]


def mix_floor(probs: Sequence[float], floor: float) -> list[float]:
    """``f + (1 − K·f)·p``: every action keeps at least probability ``floor``."""
    k = len(probs)
    if not floor >= 0 or floor * k >= 1:  # NaN fails both comparisons: refused too
        raise ValueError(f"exploration_floor must satisfy 0 <= f and f x {k} actions < 1, got {floor}")
    scale = 1.0 - k * floor
    return [floor + scale * p for p in probs]


def policy_probabilities(doc: PolicyDocument) -> list[float]:
    """π(a) of every action of a policy document, exploration floor included. For a structured
    policy, each value's probability of being chosen in its dimension when no context is given
    (so the list sums to the number of dimensions, and its entropy is the joint choice's when
    nothing is excluded)."""
    if doc.structured:
        marginals = StructuredPolicy(doc).marginals()
        return [p for values in marginals.values() for p in values.values()]
    return mix_floor(softmax(doc.logits, doc.temperature), doc.exploration_floor)


ENTROPY_REQUESTS = 500
"""Requests :func:`served_entropy` averages over at most (evenly spaced over those given): enough
for a drift threshold, and a numeric feature's table is built per request."""


def served_entropy(doc: PolicyDocument, contexts: Sequence[Mapping[str, Any] | None]) -> float:
    """The entropy (nats) of what requests with ``contexts`` draw from, averaged over them (over
    :data:`ENTROPY_REQUESTS` of them): with context features, each request draws from its own
    segment's probabilities, which the entropy with no context does not show (a policy sure in
    every segment can look uncertain without one). Without features, or without contexts,
    :func:`policy_entropy` of :func:`policy_probabilities`."""
    if not (doc.structured and doc.features) or not contexts:
        return policy_entropy(policy_probabilities(doc))
    policy = StructuredPolicy(doc)
    names = [f.name for f in doc.features]
    sample = contexts[:: -(-len(contexts) // ENTROPY_REQUESTS)]
    seen: dict[tuple[Any, ...], float] = {}
    total = 0.0
    for context in sample:
        key = context_key(context, names)
        if key not in seen:
            seen[key] = policy_entropy([p for v in policy.marginals(context).values() for p in v.values()])
        total += seen[key]
    return total / len(sample)


def policy_choices(doc: PolicyDocument) -> int:
    """How many configurations a policy chooses among: its actions, or a structured policy's
    combinations of one value per dimension. Its log is the largest entropy the probabilities of
    :func:`policy_probabilities` can have (the uniform policy's; excluded combinations counted)."""
    return math.prod(d.size for d in doc.dimensions) if doc.dimensions else len(doc.actions)


def load_policy(
    document: PolicyDocument | Mapping[str, Any], *, rng: random.Random | None = None
) -> SoftmaxPolicy | StructuredPolicy:
    """The policy a stored document describes: :class:`SoftmaxPolicy` for a flat list of actions,
    :class:`~agent_learning.policy.structured.StructuredPolicy` for dimensions, exclusions or context features."""
    doc = document if isinstance(document, PolicyDocument) else PolicyDocument.from_dict(dict(document))
    return StructuredPolicy(doc, rng=rng) if doc.structured else SoftmaxPolicy.from_document(doc, rng=rng)


def policy_entropy(probabilities: list[float]) -> float:
    """Entropy in nats (0.0, not −0.0, for a sure policy)."""
    return max(0.0, -math.fsum(p * math.log(p) for p in probabilities if p > 0))


class SoftmaxPolicy:
    """An immutable softmax policy over a fixed list of actions.

    Build one with :meth:`from_actions` (uniform, version 1) or :meth:`from_document`.
    ``choose()`` draws an action with the injected ``random.Random`` (seed it for
    reproducible runs); everything it returns is precomputed, so a draw is one uniform
    number and a binary search.
    """

    __slots__ = (
        "_cum",
        "_decisions",
        "_index",
        "_probs",
        "_random",
        "actions",
        "agent_id",
        "document",
        "exploration_floor",
        "logits",
        "pinned",
        "temperature",
        "version",
    )

    def __init__(
        self,
        agent_id: str,
        actions: Sequence[Action],
        logits: Sequence[float],
        *,
        version: int = 1,
        temperature: float = DEFAULT_TEMPERATURE,
        exploration_floor: float = DEFAULT_EXPLORATION_FLOOR,
        pinned: bool = False,
        rng: random.Random | None = None,
        document: PolicyDocument | None = None,
    ) -> None:
        if len(actions) != len(logits) or not actions:
            raise ValueError(f"need one logit per action and at least one action ({len(actions)} vs {len(logits)})")
        self.logits = tuple(_number(f"logits[{i}]", x) for i, x in enumerate(logits))
        if not all(math.isfinite(x) for x in self.logits):
            raise ValueError("logits must be finite")
        self.agent_id = agent_id
        self.version = version
        self.actions = tuple(actions)
        self.temperature = _number("temperature", temperature)
        self.exploration_floor = _number("exploration_floor", exploration_floor)
        self.pinned = pinned
        self.document = document
        self._probs = tuple(mix_floor(softmax(self.logits, self.temperature), self.exploration_floor))
        self._cum = cumulative(self._probs)  # every uniform draw in [0, 1) lands on a positive probability
        self._index = {a.id: i for i, a in enumerate(self.actions)}
        incarnation = document.incarnation if document is not None else None
        self._decisions = tuple(
            Decision(agent_id, a.id, i, p, math.log(p) if p > 0 else -math.inf, version, read_only(a.config),
                     incarnation=incarnation)
            for i, (a, p) in enumerate(zip(self.actions, self._probs, strict=True))
        )
        self._random = (rng or random.Random()).random

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_actions(
        cls,
        *args: Any,
        agent_id: str | None = None,
        actions: Iterable[str | Action | Mapping[str, Any]] | None = None,
        temperature: float = DEFAULT_TEMPERATURE,
        exploration_floor: float = DEFAULT_EXPLORATION_FLOOR,
        rng: random.Random | None = None,
        seed: int | None = None,
    ) -> SoftmaxPolicy:
        """A uniform policy (all logits 0) over ``actions``, as version 1:
        ``from_actions(agent_id, actions)``, or ``from_actions(actions, agent_id=...)`` (the
        ``azure-agents-learning-sdk`` order); either may be passed by keyword.

        ``actions`` may be ids, :class:`~agent_learning.documents.Action` objects or dicts
        with ``id``, ``description`` and ``config``.
        """
        agent_id, actions = _agent_and_actions(args, agent_id, actions)
        if isinstance(actions, str | bytes | Mapping):
            raise InvalidDocument(
                "policy", [("actions", f"must be a list of actions, got {type(actions).__name__} {actions!r:.80}")]
            )
        parsed = [_as_action(a, f"actions[{i}]") for i, a in enumerate(actions)]
        if rng is None and seed is not None:
            rng = random.Random(seed)
        policy = cls(
            agent_id, parsed, [0.0] * len(parsed), temperature=temperature, exploration_floor=exploration_floor, rng=rng
        )
        policy.to_document(created_at=None)  # validate ids, floor and sizes now, with field names
        return policy

    @classmethod
    def from_document(
        cls, document: PolicyDocument | Mapping[str, Any], *, rng: random.Random | None = None, seed: int | None = None
    ) -> SoftmaxPolicy:
        """The policy described by a stored policy document (version or current)."""
        doc = document if isinstance(document, PolicyDocument) else PolicyDocument.from_dict(dict(document))
        if rng is None and seed is not None:
            rng = random.Random(seed)
        return cls(
            doc.agent_id,
            doc.actions,
            doc.logits,
            version=doc.version,
            temperature=doc.temperature,
            exploration_floor=doc.exploration_floor,
            pinned=doc.pinned,
            rng=rng,
            document=doc,
        )

    def to_document(
        self,
        *,
        kind: Literal["version", "current"] = "version",
        source: Literal["init", "train", "rollback", "import"] = "init",
        created_at: datetime | None,
        parent_version: int | None = None,
        cursor: ScoreCursor | None = None,
        run: Any = None,
        note: str = "",
        learner_state: Mapping[str, Any] | None = None,
    ) -> PolicyDocument:
        """This policy as a validated :class:`PolicyDocument`."""
        data = {
            "id": policy_doc_id(self.agent_id, self.version if kind == "version" else None),
            "kind": kind,
            "agent_id": self.agent_id,
            "version": self.version,
            "actions": [a.model_dump() for a in self.actions],
            "logits": list(self.logits),
            "temperature": self.temperature,
            "exploration_floor": self.exploration_floor,
            "pinned": self.pinned and kind == "current",
            "source": source,
            "parent_version": parent_version,
            "cursor": cursor.model_dump() if cursor else None,
            "run": run.to_dict() if hasattr(run, "to_dict") else run,
            "created_at": (created_at or SYSTEM_CLOCK.now()),
            "note": note,
            "learner_state": dict(learner_state or {}),
        }
        return PolicyDocument.from_dict(data)

    # ------------------------------------------------------------------ use

    def choose(self, rng: random.Random | None = None, *, context: Mapping[str, Any] | None = None) -> Decision:
        """Draw an action. Pass ``rng`` to override the policy's generator for this draw.

        ``context`` (the request's features: ``{"task": "billing", "tokens": 812}``) is checked
        (:func:`~agent_learning.documents.check_context`) and logged with the episode; this
        policy's probabilities do not depend on it. An empty context is no context (``None``), as
        its episode stores it."""
        u = rng.random() if rng is not None else self._random()
        decision = self._decisions[bisect_right(self._cum, u)]
        if context is None or not (checked := validated_context(context)):
            return decision
        return decision._replace(context=checked)

    def decision_for(self, action_id: str) -> Decision:
        """The decision record of a given action (for replaying a logged choice)."""
        try:
            return self._decisions[self._index[action_id]]
        except (KeyError, TypeError):  # TypeError: an unhashable value (a list) is no action id either
            raise InvalidDocument(
                "decision",
                [
                    (
                        "action_id",
                        f"{action_id!r} is not an action of policy {self.agent_id!r} (known: {self.action_ids})",
                    )
                ],
            ) from None

    def snapshot(self) -> PolicySnapshot:
        """Which stored policy version this is: its document ``id`` (``agent:vN``) and ``version``."""
        return PolicySnapshot(policy_doc_id(self.agent_id, self.version), self.version, self.agent_id)

    @property
    def action_ids(self) -> list[str]:
        return [a.id for a in self.actions]

    @property
    def probabilities(self) -> dict[str, float]:
        """Action id → probability that ``choose()`` returns it."""
        return {a.id: p for a, p in zip(self.actions, self._probs, strict=True)}

    def probability(self, action_id: str) -> float:
        return self.decision_for(action_id).probability

    def entropy(self) -> float:
        """Shannon entropy of the choice distribution, in nats."""
        return -math.fsum(p * math.log(p) for p in self._probs if p > 0)

    def __repr__(self) -> str:
        probs = ", ".join(f"{k}={v:.3f}" for k, v in self.probabilities.items())
        return f"SoftmaxPolicy({self.agent_id!r}, v{self.version}: {probs})"


class PolicySnapshot(NamedTuple):
    """What :meth:`SoftmaxPolicy.snapshot` returns: the policy version document's id and version."""

    id: str
    version: int
    agent_id: str


def _agent_and_actions(args: tuple[Any, ...], agent_id: str | None, actions: Any) -> tuple[str, Any]:
    """``from_actions``' agent id and actions from its arguments, in either order it takes."""
    given = list(args)
    if len(given) > 2:
        raise TypeError(f"from_actions() takes an agent id and actions, got {len(given)} positional arguments")
    if agent_id is None and given:
        agent_id = given.pop(0)
    if actions is None and given:
        actions = given.pop(0)
    if given or agent_id is None or actions is None:
        raise TypeError(
            "from_actions() takes from_actions(agent_id, actions) or from_actions(actions, agent_id=...): "
            + ("an argument was given twice" if given else f"missing {'agent_id' if agent_id is None else 'actions'}")
        )
    if not isinstance(agent_id, str):
        raise TypeError(f"from_actions(): agent_id must be a string, got {type(agent_id).__name__} {agent_id!r:.60}; "
                        "pass the actions first only with agent_id=... as a keyword")
    return agent_id, actions


def _as_action(value: str | Action | Mapping[str, Any], where: str = "action") -> Action:
    """``value`` as an :class:`Action`; problems are named under ``where`` (``actions[2].id``)."""
    if isinstance(value, Action):
        return value
    if isinstance(value, str):
        return _as_action({"id": value}, where)
    if isinstance(value, Mapping):
        try:
            return Action.model_validate(dict(value))
        except ValidationError as exc:
            problems = invalid_from_pydantic("action", exc).problems
            raise InvalidDocument("policy", [(f"{where}.{field}", problem) for field, problem in problems]) from None
    raise InvalidDocument(
        "policy", [(where, f"must be an id, an Action or an object with an id, got {type(value).__name__}")]
    )
