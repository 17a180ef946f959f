"""Structured and contextual policies: named dimensions, excluded combinations, context features.

Pure Python, like :mod:`agent_learning.policy`: agents choose without numpy.

A structured policy declares its configuration as named dimensions, each a short list of
values (``{"prompt": ["concise", "detailed"], "retrieval_k": [1, 3, 5, 10]}``), and may declare
context features (``{"task": "category", "tokens": "number"}``) that its choice depends on. Its
document keeps the flat fields' meaning: ``actions`` are the values, dimension after dimension
(ids ``{dimension}={value}``), and ``logits`` their global logits θ. Context adds, per
categorical feature f and segment c (a value of f seen in training), offsets δ_{f,c}, and per
numeric feature j weights β_j with a centre m_j and scale s_j. For a context x, dimension d's
value v has the logit ::

    ℓ_d(v | x) = θ_v + Σ_f δ_{f, x_f, v} + Σ_j β_{j,v} · clip((x_j − m_j) / s_j, ±4)

(a feature missing from x, a segment the policy has not learned, or a value that is not a number
for a numeric feature, adds nothing, as in the learner; ``choose()`` refuses the last), and ::

    p_d(v | x) = f + (1 − K_d·f) · softmax(ℓ_d(· | x) / T)_v           floor f per dimension
    π(a | x)   = Π_d p_d(a_d | x) / Z(x),   Z(x) = 1 − Σ_{e ∈ E} Π_d p_d(e_d | x)

for a configuration a = (a_1, …, a_D), where E is the set of excluded configurations (Z = 1
without exclusions). One dimension without context or exclusions is exactly the flat policy
of :mod:`agent_learning.policy`. A configuration's id joins its values' ids with ``:``
(``prompt=concise:retrieval_k=3``); episodes log that id, π(a | x) and the context.

Drawing is exact. For a context the policy keeps ready (every context without numeric
features), a joint space of at most :data:`JOINT_TABLE_SIZE` configurations is drawn from one
cumulative table of π (excluded configurations have zero width: one uniform number). Otherwise
each dimension is drawn from p_d, and a draw that lands on an excluded configuration is drawn
again, which samples Π_d p_d conditioned on a ∉ E, i.e. π.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, product
from typing import Any

from agent_learning.core.clock import SYSTEM_CLOCK
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import (
    ACTION_ID,
    ACTION_ID_RULE,
    DEFAULT_EXPLORATION_FLOOR,
    DEFAULT_TEMPERATURE,
    DIMENSION_NAME,
    DIMENSION_NAME_RULE,
    Dimension,
    PolicyDocument,
    check_context,
    excluded_configurations,
    policy_doc_id,
)
from agent_learning.policy.decision import Decision, ReadOnlyDict, read_only, validated_context

JOINT_SEPARATOR = ":"
"""Joins the values' ids into a configuration's id: ``prompt=concise:retrieval_k=3``."""
MAX_DRAWS = 10_000
"""Rejection draws before choose() gives up (only if excluded configurations hold ~all the mass)."""
NUMBER_CLIP = 4.0
"""A numeric feature enters as (x − centre) / scale, clipped to ±4: an outlier cannot swing the policy."""
NO_CONTEXT = "no context"
"""The name of the view of a policy's probabilities for a request without context features."""
JOINT_TABLE_SIZE = 1_024
"""Joint spaces up to this size are drawn from one cumulative table per context (one uniform draw)."""
CACHE_SIZE = 4_096
"""Contexts whose per-dimension probabilities a policy keeps ready (cleared when full)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each dimension's values sit in a structured document's ``actions``."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    value_ids: tuple[tuple[str, ...], ...]
    """Per dimension, its values' action ids (``prompt=concise``)."""

    @classmethod
    def of(cls, doc: PolicyDocument) -> Layout:
        dims = doc.dimensions or [Dimension.model_construct(name="", size=len(doc.actions))]
        starts = tuple(accumulate([0] + [d.size for d in dims]))[:-1]
        ids = tuple(tuple(a.id for a in doc.actions[s : s + d.size]) for s, d in zip(starts, dims, strict=True))
        return cls(tuple(d.name for d in dims), starts, tuple(d.size for d in dims), ids)

    def joint_id(self, local: Sequence[int]) -> str:
        return JOINT_SEPARATOR.join(self.value_ids[d][i] for d, i in enumerate(local))

    def parse(self, joint_id: str) -> tuple[int, ...] | None:
        """Per dimension, the index of a configuration's value (None if it is not one of these)."""
        parts = joint_id.split(JOINT_SEPARATOR) if len(self.names) > 1 else [joint_id]
        if len(parts) != len(self.names):
            return None
        out = []
        for d, part in enumerate(parts):
            try:
                out.append(self.value_ids[d].index(part))
            except ValueError:
                return None
        return tuple(out)


def feature_logits(doc: PolicyDocument, context: Mapping[str, Any] | None) -> list[float]:
    """ℓ(· | x) for every value (all dimensions, in ``actions`` order). A numeric feature's value
    that is not a number (a string, a boolean) adds nothing, as the learner treats it."""
    logits = list(doc.logits)
    if not doc.features or not context:
        return logits
    for feature in doc.features:
        if feature.name not in context:
            continue
        value = context[feature.name]
        if feature.kind == "category":
            offsets = (feature.segments or {}).get(segment_name(value))
            if offsets is not None:
                logits = [x + o for x, o in zip(logits, offsets, strict=True)]
        elif feature.weights is not None and is_number(value):
            x = max(-NUMBER_CLIP, min(NUMBER_CLIP, (float(value) - feature.center) / feature.scale))
            logits = [v + w * x for v, w in zip(logits, feature.weights, strict=True)]
    return logits


def context_key(context: Mapping[str, Any] | None, names: Sequence[str]) -> tuple[Any, ...]:
    """A key of ``context``'s values of the features ``names``: contexts with equal keys have equal
    probabilities. Each value's type is part of it: ``1``, ``1.0`` and ``True`` are equal in
    Python but name the segments ``1``, ``1.0`` and ``true``."""
    if not context:
        return ()
    return tuple((type(v), v) for v in map(context.get, names))


def is_number(value: Any) -> bool:
    """Whether ``value`` counts for a numeric feature: an int or a float, not a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def segment_name(value: Any) -> str:
    """The segment a categorical value names: the string itself, ``true``/``false`` for booleans,
    and a number's decimal form (a category given as a number)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)


def dimension_probabilities(
    logits: Sequence[float], layout: Layout, temperature: float, floor: float
) -> list[list[float]]:
    """p_d(· | x) of every dimension from the values' logits ℓ(· | x)."""
    out = []
    for start, size in zip(layout.starts, layout.sizes, strict=True):
        scaled = [x / temperature for x in logits[start : start + size]]
        top = max(scaled)
        exps = [math.exp(x - top) for x in scaled]
        total = math.fsum(exps)
        scale = 1.0 - size * floor
        out.append([floor + scale * e / total for e in exps])
    return out


def joint_probability(
    probs: Sequence[Sequence[float]], local: Sequence[int], excluded: Sequence[tuple[int, ...]]
) -> float:
    """π(a | x) from the per-dimension probabilities (0 for an excluded configuration)."""
    if excluded and tuple(local) in set(excluded):
        return 0.0
    product_ = math.prod(p[i] for p, i in zip(probs, local, strict=True))
    return product_ / normaliser(probs, excluded)


def normaliser(probs: Sequence[Sequence[float]], excluded: Sequence[tuple[int, ...]]) -> float:
    """Z(x) = 1 − Σ_{e ∈ E} Π_d p_d(e_d | x)."""
    if not excluded:
        return 1.0
    return 1.0 - math.fsum(math.prod(p[i] for p, i in zip(probs, e, strict=True)) for e in excluded)


class _Table:
    """One context's probabilities, ready to draw from: the joint distribution's cumulative sums
    when the joint space has at most :data:`JOINT_TABLE_SIZE` configurations (one uniform draw,
    exclusions have zero width), else each dimension's (a draw per dimension, rejecting
    excluded configurations)."""

    __slots__ = ("cum", "drawn", "joint", "probs", "z")

    def __init__(
        self, probs: list[list[float]], excluded: Sequence[tuple[int, ...]], sizes: Sequence[int], *, kept: bool
    ) -> None:
        self.probs = probs
        self.z = normaliser(probs, excluded)
        self.drawn: dict[Any, Any] = {}
        """Configurations drawn so far (by joint index or value indices) → their Decision without a context."""
        self.joint = kept and math.prod(sizes) <= JOINT_TABLE_SIZE
        """Whether to build the joint table: only for a table kept for later draws (building it
        costs one product per configuration, which one draw does not repay)."""
        if self.joint:
            blocked = set(excluded)
            joint = [
                0.0 if local in blocked else math.prod(p[i] for p, i in zip(probs, local, strict=True))
                for local in product(*(range(k) for k in sizes))
            ]
            self.cum: Any = cumulative(joint)
        else:
            self.cum = [cumulative(p) for p in probs]


def cumulative(probs: Sequence[float]) -> list[float]:
    """Cumulative sums normalised so that every uniform draw in [0, 1) lands on a positive entry."""
    cum = list(accumulate(probs))
    total = cum[-1]
    cum = [c / total for c in cum]
    last = max(i for i, p in enumerate(probs) if p > 0)
    for i in range(last, len(cum)):
        cum[i] = 1.0
    return cum


class StructuredPolicy:
    """A policy over named dimensions whose probabilities may depend on the request's context.

    Build one with :meth:`create` (uniform, version 1) or :meth:`from_document`; ``choose()``
    returns a :class:`~agent_learning.policy.Decision` whose ``config`` holds one value per
    dimension and whose probability is the joint π(a | x) of the module docstring.
    """

    def __init__(self, document: PolicyDocument, *, rng: random.Random | None = None) -> None:
        self.document = document
        self.agent_id = document.agent_id
        self.version = document.version
        self.pinned = document.pinned
        self.temperature = document.temperature
        self.exploration_floor = document.exploration_floor
        self.layout = Layout.of(document)
        self.actions = tuple(document.actions)
        self.excluded = excluded_configurations(document)
        self._excluded_set = frozenset(self.excluded)
        self._random = (rng or random.Random()).random
        self._features = {f.name: f for f in document.features or []}
        self._categorical = tuple(f.name for f in document.features or [] if f.kind == "category")
        self._numeric = tuple(f.name for f in document.features or [] if f.kind == "number")
        self._cache: dict[tuple[Any, ...], _Table] = {}
        self._flat = document.dimensions is None
        self._values = tuple(  # read-only: decisions share them
            tuple(read_only(self.actions[s + i].config.get(name, self.actions[s + i].id.partition("=")[2]))
                  for i in range(k))
            for name, s, k in zip(self.layout.names, self.layout.starts, self.layout.sizes, strict=True)
        )

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(
        cls,
        agent_id: str,
        dimensions: Mapping[str, Sequence[Any]],
        *,
        context: Mapping[str, str] | None = None,
        excluded: Sequence[Mapping[str, Any]] = (),
        temperature: float = DEFAULT_TEMPERATURE,
        exploration_floor: float = DEFAULT_EXPLORATION_FLOOR,
        rng: random.Random | None = None,
        seed: int | None = None,
        created_at: Any = None,
    ) -> StructuredPolicy:
        """A uniform version-1 policy over ``dimensions`` (name → its values: strings, numbers or
        booleans), learning from the ``context`` features named (name → ``"category"`` or
        ``"number"``), never choosing a configuration that matches a rule of ``excluded``."""
        doc = PolicyDocument.from_dict(
            {
                "id": policy_doc_id(agent_id, 1),
                "kind": "version",
                "agent_id": agent_id,
                "version": 1,
                **structure_fields(dimensions, context, excluded),
                "temperature": temperature,
                "exploration_floor": exploration_floor,
                "source": "init",
                "created_at": (created_at or SYSTEM_CLOCK.now()).isoformat(),
            }
        )
        if rng is None and seed is not None:
            rng = random.Random(seed)
        return cls(doc, rng=rng)

    @classmethod
    def from_document(
        cls, document: PolicyDocument | Mapping[str, Any], *, rng: random.Random | None = None, seed: int | None = None
    ) -> StructuredPolicy:
        doc = document if isinstance(document, PolicyDocument) else PolicyDocument.from_dict(dict(document))
        if rng is None and seed is not None:
            rng = random.Random(seed)
        return cls(doc, rng=rng)

    # ------------------------------------------------------------------ use

    def _table(self, context: Mapping[str, Any] | None) -> _Table:
        if not context or not self._features:
            key: tuple[Any, ...] = ()
        elif self._numeric and any(n in context for n in self._numeric):
            return self._build(context, kept=False)  # numbers rarely repeat: not kept
        else:
            key = tuple(None if (v := context.get(n)) is None else segment_name(v) for n in self._categorical)
        table = self._cache.get(key)
        if table is None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            table = self._cache[key] = self._build(context, kept=True)
        return table

    def _build(self, context: Mapping[str, Any] | None, *, kept: bool) -> _Table:
        logits = feature_logits(self.document, context)
        return _Table(
            dimension_probabilities(logits, self.layout, self.temperature, self.exploration_floor),
            self.excluded,
            self.layout.sizes,
            kept=kept,
        )

    def choose(self, rng: random.Random | None = None, *, context: Mapping[str, Any] | None = None) -> Decision:
        """Draw a configuration for ``context`` (checked and logged with the episode; an empty
        context is no context, ``None``, as its episode stores it)."""
        if context is None:
            table = self._table(None)
        else:
            table, context = self._checked(context)
        draw = rng.random if rng is not None else self._random
        if table.joint:
            index = bisect_right(table.cum, draw())
            decision = table.drawn.get(index)
            if decision is None:
                decision = table.drawn[index] = self._decision(table, self._local(index))
        else:
            excluded = self._excluded_set
            for _ in range(MAX_DRAWS):
                local = tuple([bisect_right(c, draw()) for c in table.cum])
                if local not in excluded:
                    break
            else:  # pragma: no cover - only when exclusions hold ~all the probability
                raise RuntimeError(f"{self.agent_id}: no allowed configuration drawn in {MAX_DRAWS} tries")
            decision = table.drawn.get(local)
            if decision is None:
                decision = table.drawn[local] = self._decision(table, local)
        if not context:
            return decision
        return Decision(
            self.agent_id,
            decision.action_id,
            decision.index,
            decision.probability,
            decision.logprob,
            self.version,
            decision.config,
            context,
            decision.incarnation,
        )

    def _checked(self, context: Mapping[str, Any]) -> tuple[_Table, dict[str, Any]]:
        """The table for ``context``, and ``context`` checked. A context made only of categorical
        features whose values built a cached table was checked then: it is not checked again."""
        if self._categorical and not self._numeric and type(context) is dict:
            # Tables are kept under segment names (strings): only a context of strings can hit one
            # here, and any other value (True, 1, a list) is checked below. A subclass of str (a
            # str Enum, numpy's str_) hashes like its value and hits its table: the decision keeps
            # it as given, and the episode logs its value (check_context, on the episode).
            key = tuple(map(context.get, self._categorical))
            try:
                table = self._cache.get(key)
            except TypeError:  # an unhashable value: let the check name it
                table = None
            if table is not None and len(context) == len(key) - key.count(None):
                return table, dict(context)
        checked = validated_context(context)
        if self._numeric:
            self._check_kinds(checked)
        return self._table(checked), checked

    def _local(self, index: int) -> tuple[int, ...]:
        """The value indices of the configuration at ``index`` (:func:`joint_index` inverted)."""
        local = []
        for k in reversed(self.layout.sizes):
            index, i = divmod(index, k)
            local.append(i)
        return tuple(reversed(local))

    def _decision(self, table: _Table, local: tuple[int, ...]) -> Decision:
        p = math.prod(probs[i] for probs, i in zip(table.probs, local, strict=True)) / table.z
        if self._flat:
            config: Mapping[str, Any] = read_only(self.actions[local[0]].config)
        else:
            config = ReadOnlyDict(
                {name: self._values[d][i] for d, (name, i) in enumerate(zip(self.layout.names, local, strict=True))}
            )
        return Decision(
            self.agent_id,
            self.layout.joint_id(local),
            joint_index(local, self.layout.sizes),
            p,
            math.log(p),
            self.version,
            config,
            incarnation=self.document.incarnation,
        )

    def _check_kinds(self, context: Mapping[str, Any]) -> None:
        for name, value in context.items():
            feature = self._features.get(name)
            if feature is not None and feature.kind == "number" and (isinstance(value, bool | str)):
                raise InvalidDocument("context", [(f"context.{name}", f"must be a number (got {value!r:.80})")])

    def probability(self, action_id: str, context: Mapping[str, Any] | None = None) -> float:
        """π(a | x) of a configuration id (0 if excluded); :class:`InvalidDocument` if unknown, or
        for a ``context`` that is not one (checked as :meth:`choose` checks its shape). A string or
        a boolean for a numeric feature, which :meth:`choose` refuses, adds nothing here (a logged
        episode's context is read as the learner reads it)."""
        local = self.layout.parse(action_id) if isinstance(action_id, str) else None
        if local is None:
            raise InvalidDocument(
                "decision", [("action_id", f"{action_id!r} is not a configuration of policy {self.agent_id!r}")]
            )
        return self.probability_at(local, context)

    def probability_at(self, local: Sequence[int], context: Mapping[str, Any] | None = None) -> float:
        """π(a | x) of a configuration given as one value index per dimension."""
        return joint_probability(self._table(_shape_checked(context)).probs, local, self.excluded)

    def marginals(self, context: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
        """Per dimension, each value's probability of being chosen for ``context`` (exclusions
        included: the marginals of π, not the p_d); ``context`` is checked as in :meth:`probability`."""
        table = self._table(_shape_checked(context))
        if not self.excluded:
            return {
                name: dict(zip(self.layout.value_ids[d], table.probs[d], strict=True))
                for d, name in enumerate(self.layout.names)
            }
        # P(a_d = v) = (p_d(v) − Σ_{e ∈ E, e_d = v} Π p(e)) / Z: a sum over the excluded
        # configurations only, never over the joint space (up to 1024^8 configurations).
        out = [list(p) for p in table.probs]
        blocked = [[0] * k for k in self.layout.sizes]
        for e in self.excluded:
            mass = math.prod(p[i] for p, i in zip(table.probs, e, strict=True))
            for d, i in enumerate(e):
                out[d][i] -= mass
                blocked[d][i] += 1
        joint = math.prod(self.layout.sizes)
        out = [
            [0.0 if n * k == joint else max(0.0, p) / table.z for p, n in zip(values, counts, strict=True)]
            for values, counts, k in zip(out, blocked, self.layout.sizes, strict=True)
        ]  # a value every one of whose configurations is excluded is exactly 0
        return {
            name: dict(zip(self.layout.value_ids[d], out[d], strict=True)) for d, name in enumerate(self.layout.names)
        }

    @property
    def action_ids(self) -> list[str]:
        """The values' ids, dimension after dimension (as in the document's ``actions``)."""
        return [a.id for a in self.actions]

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}[{k}]" for n, k in zip(self.layout.names, self.layout.sizes, strict=True))
        return f"StructuredPolicy({self.agent_id!r}, v{self.version}: {dims})"


def _shape_checked(context: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``context`` checked (:func:`~agent_learning.policy.decision.validated_context`), or None: what
    :meth:`StructuredPolicy._table` may keep a table under, where :meth:`~StructuredPolicy.choose`
    finds it without checking again."""
    return None if context is None else validated_context(context)


def joint_index(local: Sequence[int], sizes: Sequence[int]) -> int:
    """The configuration's position in the joint space (mixed radix, first dimension slowest)."""
    index = 0
    for i, k in zip(local, sizes, strict=True):
        index = index * k + i
    return index


def structure_fields(
    dimensions: Mapping[str, Sequence[Any]],
    context: Mapping[str, str] | None = None,
    excluded: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The document fields (``actions``, ``logits``, ``dimensions``, ``features``, ``excluded``)
    of a uniform policy over ``dimensions``; problems raise :class:`InvalidDocument`."""
    if not isinstance(dimensions, Mapping) or not dimensions:
        raise InvalidDocument("policy", [("dimensions", "must name at least one dimension and its values")])
    actions: list[dict[str, Any]] = []
    dims = []
    for name, values in dimensions.items():
        if not isinstance(name, str) or not DIMENSION_NAME.fullmatch(name):
            raise InvalidDocument("policy", [("dimensions", f"{name!r:.80} is not a dimension name: "
                                              f"use {DIMENSION_NAME_RULE}")])
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise InvalidDocument("policy", [(f"dimensions.{name}", "must be a non-empty list of values")])
        by_value: dict[tuple[type, Any], Any] = {}  # no value listed twice, nor two that make one action id
        by_id: dict[str, Any] = {}
        for value in values:
            if not (isinstance(value, str | bool) or (isinstance(value, int | float) and math.isfinite(value))):
                raise InvalidDocument(
                    "policy",
                    [(f"dimensions.{name}", f"values must be strings, numbers or booleans, got {value!r:.80}")],
                )
            action_id = f"{name}={value_id(value)}"
            if not ACTION_ID.fullmatch(action_id):
                raise InvalidDocument("policy", [(f"dimensions.{name}", f"the value {value!r:.80} makes the action id "
                                                  f"{action_id!r:.140}, which does not fit: use {ACTION_ID_RULE}")])
            as_json = (bool if isinstance(value, bool) else float if isinstance(value, int | float) else str, value)
            earlier, why = by_value.get(as_json), "are the same value"  # 1 = 1.0 ≠ true, as JSON compares them
            if earlier is None:
                earlier, why = by_id.get(action_id), f"both make the action id {action_id!r:.140}"
            if earlier is not None:  # a value is never None (checked above)
                problem = (f"the value {value!r:.80} is listed twice" if repr(earlier) == repr(value)
                           else f"the values {earlier!r:.80} and {value!r:.80} {why}")
                raise InvalidDocument("policy", [(f"dimensions.{name}", problem)])
            by_value[as_json] = by_id[action_id] = value
            actions.append({"id": action_id, "config": {name: value}})
        dims.append({"name": name, "size": len(values)})
    fields: dict[str, Any] = {"actions": actions, "logits": [0.0] * len(actions), "dimensions": dims}
    if context is not None and not isinstance(context, Mapping):
        raise InvalidDocument("policy", [("context", "must map feature names to \"category\" or \"number\"")])
    if isinstance(excluded, str | bytes | Mapping) or not isinstance(excluded, Sequence):
        raise InvalidDocument("policy", [("excluded", "must be a list of rules, each mapping dimensions to values")])
    for i, rule in enumerate(excluded):
        if not isinstance(rule, Mapping):
            raise InvalidDocument("policy", [(f"excluded[{i}]", "must map dimension names to values")])
    if context:
        try:
            check_context({name: 0 for name in context})
        except ValueError as exc:
            raise InvalidDocument("policy", [("context", str(exc))]) from None
        for name, kind in context.items():
            if kind not in ("category", "number"):
                problem = f'must be "category" or "number", got {kind!r:.80}'
                raise InvalidDocument("policy", [(f"context.{name}", problem)])
        fields["features"] = [{"name": name, "kind": kind} for name, kind in context.items()]
    if excluded:
        fields["excluded"] = [{str(k): value_id(v) for k, v in rule.items()} for rule in excluded]
    return fields


def value_id(value: Any) -> str:
    """A dimension value's id: booleans as ``true``/``false``, numbers and strings as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def knows_action(doc: PolicyDocument, action_id: str) -> bool:
    """Whether ``action_id`` is something ``doc`` can choose: one of its actions, or for a
    policy with dimensions one of its configurations that no rule excludes."""
    if not doc.dimensions:
        return action_id in doc.action_ids
    local = Layout.of(doc).parse(action_id)
    return local is not None and local not in set(excluded_configurations(doc))


def segment_views(doc: PolicyDocument) -> dict[str, dict[str, dict[str, float]]]:
    """Per dimension, each value's probability of being chosen: :data:`NO_CONTEXT` (i.e.
    the global logits) and, for each learned segment of each categorical feature, in a context
    with that segment alone (``"task=billing"``)."""
    chooser = StructuredPolicy(doc)
    names = chooser.layout.names if doc.dimensions else ("action",)

    def view(context: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
        return dict(zip(names, chooser.marginals(context).values(), strict=True))

    out = {NO_CONTEXT: view(None)}
    for feature in doc.features or []:
        for segment in feature.segments or {}:
            out[f"{feature.name}={segment}"] = view({feature.name: segment})
    return out
