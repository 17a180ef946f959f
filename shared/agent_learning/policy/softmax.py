"""The softmax policy agents choose from: one class for a flat list of actions and for named
dimensions with context features and exclusions. Pure Python: no numpy on the agent side.

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

Dimensions and context. A policy may declare its configuration as named dimensions, each a short
list of values (``{"prompt": ["concise", "detailed"], "retrieval_k": [1, 3, 5, 10]}``), and may
declare context features (``{"task": "category", "tokens": "number"}``) that its choice depends on.
Its document keeps the flat fields' meaning: ``actions`` are the values, dimension after dimension
(ids ``{dimension}={value}``), and ``logits`` their global logits θ. Context adds, per
categorical feature f and segment c (a value of f seen in training), offsets δ_{f,c}, and per
numeric feature j weights β_j with a centre m_j and scale s_j. For a context x, dimension d's
value v has the logit ::

    ℓ_d(v | x) = θ_v + Σ_f δ_{f, x_f, v} + Σ_j β_{j,v} · clip((x_j − m_j) / s_j, ±4)

(a feature missing from x, a segment the policy has not learned, or a value that is not a number
for a numeric feature, adds nothing, as in the learner; ``choose()`` refuses the last). A numeric
feature may declare a transform: ``log`` reads ln(1 + x) for x, ``bins`` makes it a category by the
bin of x (:mod:`agent_learning.policy.features`, which the learner reads values with too), and ::

    p_d(v | x) = f + (1 − K_d·f) · softmax(ℓ_d(· | x) / T)_v           floor f per dimension
    π(a | x)   = Π_d p_d(a_d | x) / Z(x),   Z(x) = 1 − Σ_{e ∈ E} Π_d p_d(e_d | x)

for a configuration a = (a_1, …, a_D), where E is the set of excluded configurations (Z = 1
without exclusions). A flat list of actions is one dimension without context or exclusions: the
first formula. A configuration's id joins its values' ids with ``:``
(``prompt=concise:retrieval_k=3``); episodes log that id, π(a | x) and the context.

Interactions. A policy may declare pairs of dimensions drawn jointly
(:mod:`agent_learning.policy.interactions`): the pair (d, e) is one dimension of K_d·K_e values in
the formulas above, the logit of (v, w) being ℓ_d(v | x) + ℓ_e(w | x) + J(v, w | x). :class:`Layout`
is then the merged one, and maps its value indices to the document's ids and dimensions.

Actions described by features. A flat policy may declare categorical ``action_features`` (each
action's ``features``: ``{"genre": "comedy", "length": "short"}``). With φ_k(a) the value of feature k
of action a, weights w_{k,v} per learned value v, and interactions u_{k,f,c,v} with the segments c of
its categorical context features f, an action's logit gains ::

    ℓ(a | x) += Σ_k ( w_{k, φ_k(a)} + Σ_f u_{k, f, x_f, φ_k(a)} )

(a value or segment not learned adds nothing). θ_a, δ and β of an action the policy does not have
are 0: an action never seen is scored by its features alone. ``choose(actions=[...])`` draws among
the actions a request offers (ids of the policy's actions, or new ones with their features; at most
:data:`~agent_learning.documents.MAX_CANDIDATES`; ``excluded`` ids left out), C of them, with ::

    π(a | x, C) = f_C + (1 − |C|·f_C) · softmax_{c ∈ C}(ℓ(c | x) / T)_a,   f_C = f · min(1, K / |C|)

(the floor shrinks when more actions are offered than the policy has, so the mass it spreads,
|C|·f_C ≤ K·f, stays below 1); the decision carries the candidates, which the episode logs.

Drawing is exact. A policy whose probabilities do not depend on the context (no features) with
one dimension, or at most :data:`FIXED_SIZE` configurations, keeps every configuration's decision
ready: a draw is one uniform number and a binary search. For another context the policy keeps
ready (every context without numeric features), a joint space of at most
:data:`JOINT_TABLE_SIZE` configurations is drawn from one cumulative table of π (excluded
configurations have zero width: one uniform number). A context with numeric terms and no
exclusions keeps its segments' logits and adds the terms per call, each dimension drawn from p_d
(no table built for a number that rarely repeats; with one numeric feature, by one function written
out for the policy, :meth:`SoftmaxPolicy._quick_numeric`). Otherwise each dimension is drawn from p_d,
and a draw that lands on an excluded configuration is drawn again, which samples Π_d p_d
conditioned on a ∉ E, i.e. π.
"""

from __future__ import annotations

import math
import numbers
import random
import sys
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate, product
from math import exp, isfinite, log
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from agent_learning.core.clock import SYSTEM_CLOCK
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import (
    ACTION_ID,
    ACTION_ID_RULE,
    DEFAULT_EXPLORATION_FLOOR,
    DEFAULT_TEMPERATURE,
    DIMENSION_NAME,
    DIMENSION_NAME_RULE,
    EXACT_INTEGERS,
    MAX_CANDIDATES,
    Action,
    ActionFeature,
    Candidate,
    ContextFeature,
    Dimension,
    PolicyDocument,
    ScoreCursor,
    check_context,
    excluded_configurations,
    invalid_from_pydantic,
    policy_doc_id,
)
from agent_learning.documents.fields import JOINT_SEPARATOR
from agent_learning.policy.decision import Decision, ReadOnlyDict, read_only, validated_context
from agent_learning.policy.features import (
    NUMBER_CLIP,
    FeatureReader,
    bin_names,
    bin_values,
    segment_name,
)
from agent_learning.policy.features import is_number as is_number  # read here by the CLI
from agent_learning.policy.interactions import Merge, merged_document

MAX_DRAWS = 10_000
"""Rejection draws before choose() gives up (only if excluded configurations hold ~all the mass)."""
NO_CONTEXT = "no context"
"""The name of the view of a policy's probabilities for a request without context features."""
JOINT_TABLE_SIZE = 1_024
"""Joint spaces up to this size are drawn from one cumulative table per context (one uniform draw)."""
EXP_SAFE = 700.0
"""Logits over T within ± this go through exp() unshifted (e^700 ≈ 1e304: no overflow, nor in a sum)."""
CACHE_SIZE = 4_096
"""Contexts whose per-dimension probabilities a policy keeps ready (cleared when full)."""


ORDERED_SUM = sys.version_info < (3, 12)
"""Whether sum() of floats adds them one after the other, as ``a + b + c`` does (compensated from 3.12)."""
WRITTEN_OUT_VALUES = 64
"""A policy with one numeric feature with weights and at most this many values (all dimensions) draws
from a function written out for it (:meth:`SoftmaxPolicy._quick_numeric`), built on its first such draw."""
FIXED_SIZE = 64
"""A context-free policy with several dimensions and at most this many configurations keeps every
configuration's decision ready (one with a single dimension always does, as a flat list of actions)."""


_LAYOUTS: dict[int, tuple[weakref.ref[PolicyDocument], Layout]] = {}
""":meth:`Layout.of` of each policy document object alive, by its id (with a reference to tell it
from a later object at the same address); an entry leaves with its document."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each dimension's values sit in a policy document's ``actions``: a flat list of
    actions is one dimension, unnamed, whose values' settings are the actions' own."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    value_ids: tuple[tuple[str, ...], ...]
    """Per dimension, its values' action ids (``prompt=concise``)."""
    configs: tuple[tuple[Mapping[str, Any], ...], ...]
    """Per dimension, what each value sets in a decision's ``config`` (read-only): a named
    dimension's value under its name, an action of a flat list its whole ``config``."""
    indices: tuple[dict[str, int], ...]
    """Per dimension, value id → its index."""
    merge: Merge | None = None
    """A policy with interactions: each declared pair is one dimension here, of its pairs of values
    (:mod:`agent_learning.policy.interactions`); ``original`` is the document's own layout."""
    original: Layout | None = None

    @classmethod
    def of(cls, doc: PolicyDocument) -> Layout:
        """The dimensions ``doc``'s policy draws: its own, each declared pair merged into one. Kept
        while the document object lives (documents are immutable): a scorer checks every episode's
        action against the same cached version (:func:`knows_action`)."""
        kept = _LAYOUTS.get(id(doc))
        if kept is not None and kept[0]() is doc:
            return kept[1]
        layout = cls._of(doc)
        key = id(doc)
        _LAYOUTS[key] = (weakref.ref(doc, lambda _, key=key: _LAYOUTS.pop(key, None)), layout)  # type: ignore[misc]
        return layout

    @classmethod
    def _of(cls, doc: PolicyDocument) -> Layout:
        layout = cls.build(doc.actions, doc.dimensions)
        if not doc.interactions:
            return layout
        merge = Merge.of(doc)
        view = merged_document(doc)
        merged = cls.build(view.actions, view.dimensions)
        configs = tuple(
            layout.configs[p[0]] if len(p) == 1 else tuple(
                ReadOnlyDict({**a, **b}) for a, b in product(layout.configs[p[0]], layout.configs[p[1]]))
            for p in merge.parts
        )
        return cls(merged.names, merged.starts, merged.sizes, merged.value_ids, configs, merged.indices, merge, layout)

    @classmethod
    def build(cls, actions: Sequence[Action], dimensions: Sequence[Dimension] | None) -> Layout:
        """The layout of ``actions`` in ``dimensions``: where a stored document's kind is read
        (named dimensions, or one unnamed dimension of the actions as they are)."""
        dims = dimensions or [Dimension.model_construct(name="", size=len(actions))]
        starts = tuple(accumulate([0] + [d.size for d in dims]))[:-1]
        blocks = [actions[s : s + d.size] for s, d in zip(starts, dims, strict=True)]
        ids = tuple(tuple(a.id for a in block) for block in blocks)
        configs = tuple(
            tuple(read_only({d.name: a.config.get(d.name, a.id.partition("=")[2])} if dimensions else a.config)
                  for a in block)
            for d, block in zip(dims, blocks, strict=True)
        )
        indices = tuple({a: i for i, a in enumerate(block)} for block in ids)
        return cls(tuple(d.name for d in dims), starts, tuple(d.size for d in dims), ids, configs, indices)

    def joint_id(self, local: Sequence[int]) -> str:
        if self.original is not None and self.merge is not None:
            return self.original.joint_id(self.merge.split(local))
        return JOINT_SEPARATOR.join(self.value_ids[d][i] for d, i in enumerate(local))

    def parse(self, joint_id: str) -> tuple[int, ...] | None:
        """Per dimension, the index of a configuration's value (None if it is not one of these)."""
        if self.original is not None and self.merge is not None:
            local = self.original.parse(joint_id)
            return None if local is None else self.merge.join(local)
        parts = joint_id.split(JOINT_SEPARATOR) if len(self.names) > 1 else [joint_id]
        if len(parts) != len(self.names):
            return None
        out = []
        for index, part in zip(self.indices, parts, strict=True):
            i = index.get(part)
            if i is None:
                return None
            out.append(i)
        return tuple(out)


def feature_logits(doc: PolicyDocument, context: Mapping[str, Any] | None) -> list[float]:
    """ℓ(· | x) of ``doc``'s values for the context x (:func:`context_logits`, and its actions'
    features' terms); with interactions, of the values of its merged view (:class:`Layout`)."""
    doc = merged_document(doc)
    logits = context_logits(doc.logits, doc.features or (), context)
    if doc.action_features:
        scorer = ActionScorer(doc.action_features, doc.features or ())
        logits = [x + scorer.logit(a.features, context) for x, a in zip(logits, doc.actions, strict=True)]
    return logits


def context_logits(
    logits: Sequence[float], features: Sequence[ContextFeature], context: Mapping[str, Any] | None
) -> list[float]:
    """ℓ(· | x) for every value (all dimensions, in ``actions`` order) from the global logits and the
    context features, each value read by :class:`~agent_learning.policy.features.FeatureReader`. A
    numeric feature's value that is not a number (a string, a boolean) adds nothing, as the learner
    treats it."""
    logits = list(logits)
    if not features or not context:
        return logits
    for feature in features:
        if feature.name not in context:
            continue
        reader = FeatureReader(feature)
        value = context[feature.name]
        if feature.segmented:
            offsets = (feature.segments or {}).get(reader.segment(value))  # type: ignore[arg-type]
            if offsets is not None:
                logits = [x + o for x, o in zip(logits, offsets, strict=True)]
        elif feature.weights is not None and (x := reader.number(value)) is not None:
            logits = [v + w * x for v, w in zip(logits, feature.weights, strict=True)]
    return logits


class ActionScorer:
    """The learned weights of a policy's action features, ready to score an action's features in a
    context (module docstring: Actions described by features)."""

    __slots__ = ("features", "readers")

    def __init__(self, features: Sequence[ActionFeature], context_features: Sequence[ContextFeature] = ()) -> None:
        self.features = tuple((f.name, f.weights, f.by_context or {}) for f in features)
        self.readers = {f.name: FeatureReader(f) for f in context_features if f.segmented}

    def logit(self, features: Mapping[str, Any] | None, context: Mapping[str, Any] | None) -> float:
        """Σ_k (w_{k, φ_k(a)} + Σ_f u_{k, f, x_f, φ_k(a)}) of an action's ``features`` in ``context``."""
        total = 0.0
        if not features:
            return total
        for name, weights, by_context in self.features:
            value = features.get(name)
            if value is None:
                continue
            v = segment_name(value)
            w = weights.get(v)
            if w is None:
                continue  # a value not learned (nor any interaction of it)
            total += w
            if context:
                for feature, segments in by_context.items():
                    if feature in context:
                        reader = self.readers.get(feature)
                        value = context[feature]
                        segment = reader.segment(value) if reader is not None else segment_name(value)
                        u = segments.get(segment) if segment is not None else None
                        if u:
                            total += u.get(v, 0.0)
        return total


def offered_floor(floor: float, actions: int, offered: int) -> float:
    """f_C: the exploration floor among ``offered`` candidates of a policy of ``actions`` actions with
    floor f (module docstring): f, or f·K/|C| when more are offered, so |C|·f_C ≤ K·f < 1."""
    return floor if offered <= actions else floor * actions / offered


def context_key(context: Mapping[str, Any] | None, names: Sequence[str]) -> tuple[Any, ...]:
    """A key of ``context``'s values of the features ``names``: contexts with equal keys have equal
    probabilities. Each value's type is part of it: ``1``, ``1.0`` and ``True`` are equal in
    Python but name the segments ``1``, ``1.0`` and ``true``."""
    if not context:
        return ()
    return tuple((type(v), v) for v in map(context.get, names))


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
        out.append([floor + scale * (e / total) for e in exps])  # as mix_floor(softmax(...)): the same rounding
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


class _FlatLayouts(dict[int, Layout]):
    """The layout of one unnamed dimension of n values, made once per n."""

    def __missing__(self, n: int) -> Layout:
        layout = self[n] = Layout((("",)), (0,), (n,), (), (), ())
        return layout


_FLAT = _FlatLayouts()


def cumulative(probs: Sequence[float]) -> list[float]:
    """Cumulative sums normalised so that every uniform draw in [0, 1) lands on a positive entry."""
    cum = list(accumulate(probs))
    total = cum[-1]
    cum = [c / total for c in cum]
    last = max(i for i, p in enumerate(probs) if p > 0)
    for i in range(last, len(cum)):
        cum[i] = 1.0
    return cum


def _draw_linear(
    exps: Sequence[float], spans: Sequence[tuple[int, int, int, float, float, int]], floor: float,
    draw: Callable[[], float],
) -> tuple[int, float]:
    """One configuration drawn dimension by dimension from p_d = f + (1 − K·f)·softmax, with
    ``exps`` the exp(ℓ / T) of every value (``spans``: per dimension, where its values start and
    stop, K, K·f, 1 − K·f and K − 1): its joint index and its probability Π_d p_d."""
    index = 0
    p = 1.0
    for start, stop, size, spread, mass, last in spans:
        part = exps[start:stop]
        total = sum(part)
        u = draw()  # uniform with probability K·f, else the softmax
        if u < spread:
            i = int(u / floor)
        else:  # the first value whose cumulative sum passes the draw
            target = (u - spread) / mass * total
            i = 0
            cum = 0.0
            for e in part:
                cum += e
                if cum > target:
                    break
                i += 1
        if i > last:  # a draw at the very top of a sum rounded below it
            i = last
        index = index * size + i
        p *= floor + mass * (part[i] / total)
    return index, p


def _draw_lines(
    spans: Sequence[tuple[int, int, int, float, float, int]], slopes: Sequence[float], floor: float
) -> list[str]:
    """The lines (indented once) of :func:`_draw_linear` of exp(a + b·x) for these ``spans`` and
    slopes b, written out: from ``x``, ``random`` and ``a`` they set ``index`` and ``p`` with the same
    operations in the same order as the loop. They hold only these numbers (``repr`` reads back each
    float exactly) and indices."""
    lines = [f"    ({''.join(f'a{j}, ' for j in range(len(slopes)))}) = a"]
    for d, (start, stop, size, spread, mass, last) in enumerate(spans):
        e = [f"e{j}" for j in range(start, stop)]
        lines += [f"    {e[i]} = exp(a{start + i} + {slopes[start + i]!r} * x)" for i in range(size)]
        total = " + ".join(e) if ORDERED_SUM else f"sum(({', '.join(e)},))"  # sum(part), adding as it does
        lines += [f"    total = {total}",
                  "    u = random()",
                  f"    if u < {spread!r}:",
                  f"        i = min(int(u / {floor!r}), {last})",
                  f"        e = ({', '.join(e)},)[i]",
                  "    else:",
                  f"        target = (u - {spread!r}) / {mass!r} * total",
                  f"        if (cum := {e[0]}) > target:",  # 0.0 + e is e
                  f"            i, e = 0, {e[0]}"]
        for i in range(1, last):
            lines += [f"        elif (cum := cum + {e[i]}) > target:", f"            i, e = {i}, {e[i]}"]
        lines += ["        else:", f"            i, e = {last}, {e[last]}"]  # past every sum but the last: the last
        p_d = f"{floor!r} + {mass!r} * (e / total)"
        lines += [f"    index = index * {size} + i", f"    p *= {p_d}"] if d else ["    index = i", f"    p = {p_d}"]
    return lines


def _written_out(
    spans: Sequence[tuple[int, int, int, float, float, int]], slopes: Sequence[float], floor: float
) -> Callable[[float, Callable[[], float], Sequence[float]], tuple[int, float]]:
    """:func:`_draw_lines` as a function ``draw(x, random, a)`` returning the index and probability:
    the lines :meth:`SoftmaxPolicy._quick_numeric` draws with, on their own, to compare with the loop."""
    lines = ["def draw(x, random, a):", *_draw_lines(spans, slopes, floor)]
    namespace: dict[str, Any] = {"exp": exp}
    exec("\n".join([*lines, "    return index, p"]), namespace)  # numbers and indices only (_draw_lines)
    return namespace["draw"]  # type: ignore[no-any-return]


def _plain_number(value: Any) -> bool:
    """Whether :func:`check_context` passes ``value`` as it is, as a number: a finite float or an
    integer below :data:`~agent_learning.documents.EXACT_INTEGERS` in magnitude (not a boolean)."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    return kind is int and -EXACT_INTEGERS < value < EXACT_INTEGERS


_CONTEXT = Decision._fields.index("context")

_Base = tuple[tuple[float, ...], bool, dict[int, Decision]]
"""What :meth:`SoftmaxPolicy._base` keeps for a key of segments."""


_tuple_new = tuple.__new__
"""Builds a :class:`Decision` from its fields in order without the constructor's Python call."""


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
    return [p for values in SoftmaxPolicy(doc).marginals().values() for p in values.values()]


ENTROPY_REQUESTS = 500
"""Requests :func:`served_entropy` averages over at most (evenly spaced over those given): enough
for a drift threshold, and a numeric feature's table is built per request."""


def served_entropy(doc: PolicyDocument, contexts: Sequence[Mapping[str, Any] | None]) -> float:
    """The entropy (nats) of what requests with ``contexts`` draw from, averaged over them (over
    :data:`ENTROPY_REQUESTS` of them): with context features, each request draws from its own
    segment's probabilities, which the entropy with no context does not show (a policy sure in
    every segment can look uncertain without one). Without features, or without contexts,
    :func:`policy_entropy` of :func:`policy_probabilities`."""
    if not doc.features or not contexts:
        return policy_entropy(policy_probabilities(doc))
    policy = SoftmaxPolicy(doc)
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
    return math.prod(Layout.of(doc).sizes)


def load_policy(document: PolicyDocument | Mapping[str, Any], *, rng: random.Random | None = None) -> SoftmaxPolicy:
    """The policy a stored document describes (:meth:`SoftmaxPolicy.from_document`)."""
    return SoftmaxPolicy.from_document(document, rng=rng)


def policy_entropy(probabilities: list[float]) -> float:
    """Entropy in nats (0.0, not −0.0, for a sure policy)."""
    return max(0.0, -math.fsum(p * math.log(p) for p in probabilities if p > 0))


class SoftmaxPolicy:
    """An immutable softmax policy: over a flat list of actions, or over named dimensions whose
    probabilities may depend on the request's context (module docstring).

    Build one with :meth:`from_actions` (a flat list, uniform, version 1), :meth:`create`
    (dimensions, context features, exclusions; uniform, version 1) or :meth:`from_document`.
    ``choose()`` draws with the injected ``random.Random`` (seed it for reproducible runs) and
    returns a :class:`~agent_learning.policy.decision.Decision` whose ``config`` holds the action's
    settings (one value per dimension) and whose probability is π(a | x).
    """

    __slots__ = (
        "_bases",
        "_bin_keys",
        "_binned",
        "_cache",
        "_categorical",
        "_cum",
        "_excluded_set",
        "_features",
        "_fixed",
        "_index",
        "_linear",
        "_numeric",
        "_own",
        "_quick",
        "_random",
        "_readers",
        "_scorer",
        "_spans",
        "actions",
        "agent_id",
        "document",
        "excluded",
        "exploration_floor",
        "features",
        "incarnation",
        "layout",
        "logits",
        "pinned",
        "temperature",
        "version",
    )

    def __init__(
        self,
        source: PolicyDocument | str,
        actions: Sequence[Action] | None = None,
        logits: Sequence[float] | None = None,
        *,
        version: int = 1,
        temperature: float = DEFAULT_TEMPERATURE,
        exploration_floor: float = DEFAULT_EXPLORATION_FLOOR,
        pinned: bool = False,
        rng: random.Random | None = None,
        document: PolicyDocument | None = None,
    ) -> None:
        """``SoftmaxPolicy(document, rng=...)``: the policy a stored document describes; or
        ``SoftmaxPolicy(agent_id, actions, logits, ...)``: one over a flat list of actions
        (``document``: the stored document they come from, if any)."""
        if isinstance(source, PolicyDocument):
            document = source
            agent_id, actions, logits, version = document.agent_id, document.actions, document.logits, document.version
            temperature, exploration_floor, pinned = document.temperature, document.exploration_floor, document.pinned
        else:
            agent_id = source
        if actions is None or logits is None or len(actions) != len(logits) or not actions:
            given = (len(actions or ()), len(logits or ()))
            raise ValueError(f"need one logit per action and at least one action ({given[0]} vs {given[1]})")
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
        self.incarnation = document.incarnation if document is not None else None
        self.features = tuple(document.features or ()) if document is not None else ()
        self._own: tuple[tuple[float, ...], tuple[ContextFeature, ...]] = (self.logits, self.features)
        """The logits and features the policy draws with: the document's, or its merged view's."""
        if document is not None and document.interactions:
            view = merged_document(document)
            self.layout = Layout.of(document)
            self._own = (tuple(view.logits), tuple(view.features or ()))
            self.excluded = tuple(excluded_configurations(view))
        else:
            self.layout = Layout.build(self.actions, document.dimensions if document is not None else None)
            self.excluded = tuple(excluded_configurations(document)) if document is not None else ()
        mix_floor([0.0] * max(self.layout.sizes), self.exploration_floor)  # the floor, checked
        self._excluded_set = frozenset(self.excluded)
        self._random = (rng or random.Random()).random
        self._features = {f.name: f for f in self.features}
        self._readers = {f.name: FeatureReader(f) for f in self.features}
        self._categorical = tuple(f.name for f in self.features if f.segmented)
        self._numeric = tuple(f.name for f in self.features if f.kind == "number")
        floor = self.exploration_floor
        self._spans = tuple((start, start + size, size, size * floor, 1.0 - size * floor, size - 1)
                            for start, size in zip(self.layout.starts, self.layout.sizes, strict=True))
        """Per dimension, what :func:`_draw_linear` reads: where its values start and stop, K, K·f, 1 − K·f, K − 1."""
        self._linear = tuple(
            (f.name, self._readers[f.name], [w / self.temperature for w in f.weights])
            for f in self._own[1] if not f.segmented and f.weights
        )
        """The numeric features with weights (over T): their terms are added per call."""
        self._binned = len(self._numeric) > len(self._linear)
        """Whether a numeric feature has no weights (binned, or not learned yet): checked apart."""
        bin_keys = tuple((at, self._readers[name].names, self._readers[name].edges)
                         for at, name in enumerate(self._categorical) if self._features[name].kind == "number")
        self._bin_keys = bin_keys if len(bin_keys) == len(self._numeric) else ()
        """When every numeric feature is binned, their places in a key of segments, and their bins' names
        and edges (:meth:`_binned_table`)."""
        self._bases: dict[tuple[Any, ...], _Base] = {}
        """Per key of segments, what :meth:`_choose_linear` keeps (:meth:`_base`)."""
        self._quick: Callable[[Any, random.Random | None], Decision | None] | None = None
        """:meth:`choose` for a plain context of a policy with one numeric feature (:meth:`_quick_numeric`)
        or with only binned ones (:meth:`_quick_binned`): a closure over this policy's state, built
        on the first draw (:meth:`_first_quick`), left out of copies and pickles (:meth:`__getstate__`)."""
        self._quick = self._first_quick if self._quick_kind() is not None else None
        action_features = document.action_features if document is not None else None
        self._scorer = ActionScorer(action_features, self.features) if action_features else None
        self._index = {a.id: i for i, a in enumerate(self.actions)} if len(self.layout.sizes) == 1 else {}
        self._cache: dict[tuple[Any, ...], _Table] = {}
        self._fixed: tuple[Decision, ...] | None = None
        self._cum: list[float] | None = None
        sizes = self.layout.sizes
        if not self.features and (len(sizes) == 1 or math.prod(sizes) <= FIXED_SIZE):
            table = self._table(None)
            self._fixed = tuple(self._decision(table, local) for local in product(*(range(k) for k in sizes)))
            self._cum = cumulative([d.probability for d in self._fixed])

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
        context: Mapping[str, str] | None = None,
        action_features: Sequence[str] = (),
    ) -> SoftmaxPolicy:
        """A uniform policy (all logits 0) over ``actions``, as version 1:
        ``from_actions(agent_id, actions)``, or ``from_actions(actions, agent_id=...)`` (the
        ``azure-agents-learning-sdk`` order); either may be passed by keyword.

        ``actions`` may be ids, :class:`~agent_learning.documents.Action` objects or dicts
        with ``id``, ``description``, ``config`` and ``features``. ``context`` names the context
        features to learn from (name → ``"category"`` or ``"number"``), ``action_features`` the
        actions' features to score them by (module docstring).
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
        doc = policy.to_document(created_at=None)  # validate ids, floor and sizes now, with field names
        if not context and not action_features:
            return policy
        extra: dict[str, Any] = {}
        if context:
            extra["features"] = structure_fields({"x": [0]}, context)["features"]
        if isinstance(action_features, str) or not all(isinstance(n, str) for n in action_features):
            raise InvalidDocument("policy", [("action_features", "must be a list of feature names")])
        if action_features:
            extra["action_features"] = [{"name": name} for name in action_features]
        stored = {k: v for k, v in doc.to_dict().items() if k != "schema_version"}  # schema 2, for its features
        return cls.from_document({**stored, **extra}, rng=rng)

    @classmethod
    def create(
        cls,
        agent_id: str,
        dimensions: Mapping[str, Sequence[Any]],
        *,
        context: Mapping[str, str] | None = None,
        excluded: Sequence[Mapping[str, Any]] = (),
        interactions: Sequence[Sequence[str]] = (),
        temperature: float = DEFAULT_TEMPERATURE,
        exploration_floor: float = DEFAULT_EXPLORATION_FLOOR,
        rng: random.Random | None = None,
        seed: int | None = None,
        created_at: Any = None,
    ) -> SoftmaxPolicy:
        """A uniform version-1 policy over ``dimensions`` (name → its values: strings, numbers or
        booleans), learning from the ``context`` features named (name → ``"category"`` or
        ``"number"``), never choosing a configuration that matches a rule of ``excluded``, learning
        each pair of dimensions of ``interactions`` (``[("depth", "tool")]``) jointly."""
        if isinstance(interactions, str | bytes | Mapping) or not isinstance(interactions, Sequence):
            raise InvalidDocument("policy", [("interactions", "must be a list of pairs of dimension names")])
        doc = PolicyDocument.from_dict(
            {
                "id": policy_doc_id(agent_id, 1),
                "kind": "version",
                "agent_id": agent_id,
                "version": 1,
                **structure_fields(dimensions, context, excluded),
                **({"interactions": [list(p) if isinstance(p, tuple) else p for p in interactions]}
                   if interactions else {}),
                "temperature": temperature,
                "exploration_floor": exploration_floor,
                "source": "init",
                "created_at": (created_at or SYSTEM_CLOCK.now()).isoformat(),
            }
        )
        return cls.from_document(doc, rng=rng, seed=seed)

    @classmethod
    def from_document(
        cls, document: PolicyDocument | Mapping[str, Any], *, rng: random.Random | None = None, seed: int | None = None
    ) -> SoftmaxPolicy:
        """The policy described by a stored policy document (version or current), of any kind."""
        doc = document if isinstance(document, PolicyDocument) else PolicyDocument.from_dict(dict(document))
        if rng is None and seed is not None:
            rng = random.Random(seed)
        return cls(doc, rng=rng)

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
        """This policy as a validated :class:`PolicyDocument` (its dimensions, exclusions and
        features as its stored document has them)."""
        stored = self.document.to_dict() if self.document is not None else {}
        data = {
            **{k: stored[k] for k in ("schema_version", "dimensions", "excluded", "features", "action_features",
                                      "interactions") if k in stored},
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

    def choose(
        self,
        rng: random.Random | None = None,
        *,
        context: Mapping[str, Any] | None = None,
        actions: Sequence[str | Action | Mapping[str, Any]] | None = None,
    ) -> Decision:
        """Draw a configuration for ``context`` (the request's features: ``{"task": "billing",
        "tokens": 812}``), checked (:func:`~agent_learning.documents.check_context`) and logged with
        the episode; an empty context is no context (``None``), as its episode stores it. Pass
        ``rng`` to override the policy's generator for this draw.

        ``actions``: the actions this request offers (a flat policy's): ids of the policy's actions,
        :class:`~agent_learning.documents.Action` objects or ``{"id", "features", "config"}`` objects,
        new ids included. The action is drawn among them, with its probability among them (module
        docstring). To leave some out (Personalizer's excluded actions), offer
        ``policy.offered(actions, excluded)``."""
        fixed = self._fixed
        if fixed is None or actions is not None:  # one test: the context-free draw below keeps its speed
            if actions is not None:
                return self._choose_among(rng, context, actions)
            if (quick := self._quick) is not None and (decision := quick(context, rng)) is not None:
                return decision
            return self._choose_in(rng, context)
        decision = fixed[bisect_right(self._cum, rng.random() if rng is not None else self._random())]
        if context is None or not (checked := validated_context(context)):
            return decision
        return decision._replace(context=checked)

    def _choose_among(
        self,
        rng: random.Random | None,
        context: Mapping[str, Any] | None,
        actions: Sequence[str | Action | Mapping[str, Any]],
    ) -> Decision:
        """:meth:`choose` among the actions a request offers."""
        checked = _shape_checked(context) or None
        if checked and self._numeric:
            self._check_kinds(checked)
        offered = self.offered(actions)
        probs = self.offered_probabilities(offered, checked)
        draw = rng.random() if rng is not None else self._random()
        j = bisect_right(cumulative(probs), draw)
        action = offered[j]
        p = probs[j]
        return Decision(
            self.agent_id,
            action.id,
            j,
            p,
            math.log(p),
            self.version,
            read_only(action.config),
            checked,
            self.incarnation,
            tuple(Candidate.model_construct(id=a.id, features=a.features) for a in offered),
        )

    def offered(
        self,
        actions: Sequence[str | Action | Mapping[str, Any] | Candidate] | None,
        excluded: Sequence[str] | None = None,
    ) -> list[Action]:
        """The actions a request offers, checked (:class:`InvalidDocument` naming the field), each
        with the policy's features and config for an action of its own offered without them, less
        those ``excluded``: the candidates :meth:`choose` draws among."""
        if len(self.layout.sizes) != 1 or self.excluded:
            raise InvalidDocument("decision", [("actions", "only a flat policy (no dimensions nor exclusions) "
                                                "chooses among the actions a request offers")])
        if actions is None:
            actions = self.actions
        if isinstance(actions, str | bytes | Mapping) or not isinstance(actions, Sequence):
            raise InvalidDocument("decision", [("actions", f"must be a list of actions, got {type(actions).__name__}")])
        if not actions or len(actions) > MAX_CANDIDATES:
            raise InvalidDocument("decision", [("actions", f"offers {len(actions)} actions; "
                                                f"a request offers 1 to {MAX_CANDIDATES}")])
        out: list[Action] = []
        seen: set[str] = set()
        for i, value in enumerate(actions):
            if isinstance(value, Candidate):
                value = {"id": value.id, "features": value.features}
            action = _as_action(value, f"actions[{i}]")
            if action.id in seen:
                raise InvalidDocument("decision", [(f"actions[{i}].id", f"{action.id!r} is offered twice")])
            seen.add(action.id)
            own = self._index.get(action.id)
            mine = self.actions[own] if own is not None else None
            if mine is not None and ((action.features is None and mine.features is not None)
                                     or (not action.config and mine.config)):
                action = Action.model_construct(
                    id=action.id,
                    description=action.description or mine.description,
                    config=action.config or mine.config,
                    features=mine.features if action.features is None else action.features,
                )
            out.append(action)
        if excluded:
            if isinstance(excluded, str | bytes) or not isinstance(excluded, Sequence):
                raise InvalidDocument("decision", [("excluded", "must be a list of action ids")])
            for i, action_id in enumerate(excluded):
                if action_id not in seen:
                    raise InvalidDocument("decision", [(f"excluded[{i}]", f"{action_id!r:.140} is not offered")])
            out = [a for a in out if a.id not in set(excluded)]
            if not out:
                raise InvalidDocument("decision", [("excluded", "excludes every action offered")])
        return out

    def offered_probabilities(
        self, offered: Sequence[Action | Candidate], context: Mapping[str, Any] | None = None
    ) -> list[float]:
        """π(· | x, C) of each candidate (module docstring), from the policy's logits of its own
        actions in ``context`` (checked as the learner reads it) and their features' terms."""
        own = context_logits(self.logits, self.features, context) if self.features and context else self.logits
        scorer = self._scorer
        logits = []
        for action in offered:
            i = self._index.get(action.id)
            x = own[i] if i is not None else 0.0
            if scorer is not None:
                x += scorer.logit(action.features, context)
            logits.append(x)
        floor = offered_floor(self.exploration_floor, len(self.actions), len(offered))
        return dimension_probabilities(logits, _FLAT[len(logits)], self.temperature, floor)[0]

    def _choose_in(self, rng: random.Random | None, context: Mapping[str, Any] | None) -> Decision:
        """:meth:`choose` from the table of ``context``'s probabilities."""
        if context is not None and self._linear and not self.excluded:
            decision = self._choose_linear(rng, context)
            if decision is not None:
                return decision
        if context is None:
            table = self._table(None)
        else:
            table, context = self._checked(context)
        draw = rng.random if rng is not None else self._random
        if table.joint:
            index = bisect_right(table.cum, draw())
            decision = table.drawn.get(index) or self._joint_decision(table, index)
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
            return decision  # else decision._replace(context=context), built directly (a third of the time):
        return _tuple_new(Decision, (*decision[:_CONTEXT], context, *decision[_CONTEXT + 1 :]))

    def _choose_linear(self, rng: random.Random | None, context: Mapping[str, Any]) -> Decision | None:
        """:meth:`choose` for a policy with numeric weights and no exclusions: the logits of the
        context's segments are kept (per key, over T), its numeric terms added, and each dimension
        drawn from p_d directly, without building a table for a number that rarely repeats. None
        when a logit may be too large for exp() unshifted (:meth:`_choose_in` draws from a table)."""
        base = self._plain_base(context) if type(context) is dict else None
        if base is not None:
            checked = dict(context)  # as check_context returns a context of plain values
        else:
            checked = validated_context(context)
            if self._binned:
                self._check_kinds(checked)
            # Kept under segment names (strings): a key of strings finds its entry, any other is named first.
            base = self._bases.get(tuple(map(checked.get, self._categorical)))
            if base is None:
                key = self._key(checked)
                base = self._bases.get(key) or self._base(key, checked)
        logits, safe, drawn = base
        last: Sequence[float] = ()  # the last numeric term's weights: added inside exp() below
        x_last = 0.0
        for name, reader, weights in self._linear:
            value = checked.get(name)
            if value is None:
                continue
            x = reader.number(value)
            if x is None:
                raise InvalidDocument("context", [(f"context.{name}", reader.refusal(value))])
            if last:
                logits = [v + w * x_last for v, w in zip(logits, last, strict=True)]
            last, x_last = weights, x
        if not safe:
            return None
        # Every |ℓ / T| ≤ EXP_SAFE: no shift by the largest. Equal lengths: no zip check per call.
        exps = [exp(v + w * x_last) for v, w in zip(logits, last)] if last else list(map(exp, logits))  # noqa: B905
        index, p = _draw_linear(exps, self._spans, self.exploration_floor,
                                rng.random if rng is not None else self._random)
        return self._drawn(drawn, index, p, checked)

    def _drawn(self, drawn: dict[int, Decision], index: int, p: float, checked: dict[str, Any]) -> Decision:
        """The decision of the configuration at ``index`` drawn with probability ``p`` in the context
        ``checked``, from ``drawn`` (a key of segments' decisions so far, without context)."""
        decision = drawn.get(index) or self._decide(drawn, index)
        return _tuple_new(Decision, (self.agent_id, decision.action_id, index, p, log(p), self.version,
                                     decision.config, checked, self.incarnation, None))

    def _decide(self, drawn: dict[int, Decision], index: int) -> Decision:
        """The decision of the configuration at ``index`` without context, kept in ``drawn``."""
        decision = drawn[index] = self._decision(self._table(None), self._local(index))
        return decision

    def _plain_base(self, context: dict[str, Any]) -> _Base | None:
        """What :meth:`_choose_linear` keeps for ``context`` when :func:`check_context` would pass it
        unchanged, read without checking it in full: its categorical values are the strings of a kept
        key (checked when it was kept), its numbers plain finite floats and integers, and it has no
        other feature. None for any other context (checked in full)."""
        if self._binned:
            return None
        try:
            key = tuple(map(context.get, self._categorical))
            base = self._bases.get(key)
        except TypeError:  # an unhashable value: the check names it
            return None
        if base is None:
            return None
        present = len(key) - key.count(None)
        for name, _, _ in self._linear:
            value = context.get(name)
            if value is None:
                continue
            if not _plain_number(value):
                return None
            present += 1
        return base if present == len(context) else None

    def _base(self, key: tuple[Any, ...], checked: Mapping[str, Any]) -> _Base:
        """What :meth:`_choose_linear` keeps for a key of segments: the logits over T without
        numeric terms, whether every logit with them stays within ±:data:`EXP_SAFE` (each x̃ is
        within ±NUMBER_CLIP), and the decisions drawn so far."""
        if len(self._bases) >= CACHE_SIZE:
            self._bases.clear()
        segments = {n: checked[n] for n in self._categorical if n in checked}
        logits = tuple(x / self.temperature for x in self._logits(segments or None))
        reach = max(map(abs, logits)) + NUMBER_CLIP * sum(max(map(abs, w)) for _, _, w in self._linear)
        base = self._bases[key] = (logits, reach <= EXP_SAFE, {})
        return base

    def _joint_decision(self, table: _Table, index: int) -> Decision:
        """The decision of the configuration at ``index`` of ``table``'s joint space, kept in the table."""
        decision = table.drawn[index] = self._decision(table, self._local(index))
        return decision

    def _quick_binned(self) -> Callable[[Any, random.Random | None], Decision | None]:
        """:meth:`choose` for a policy whose numeric features are all binned, as a closure: a plain
        context's kept table (:meth:`_binned_table`) drawn from in one uniform draw, as
        :meth:`_choose_in` draws it. None for any other context (:meth:`_choose_in` checks it)."""
        binned_table, own_random, joint_decision = self._binned_table, self._random, self._joint_decision

        def quick(context: Any, rng: random.Random | None) -> Decision | None:
            if context.__class__ is not dict or not context:  # an empty context: no context (None)
                return None
            table = binned_table(context)
            if table is None or not table.joint:
                return None
            index = bisect_right(table.cum, rng.random() if rng is not None else own_random())
            decision = table.drawn.get(index) or joint_decision(table, index)
            return _tuple_new(Decision, (*decision[:_CONTEXT], dict(context), *decision[_CONTEXT + 1 :]))

        return quick

    def _quick_kind(self) -> Callable[[], Callable[[Any, random.Random | None], Decision | None]] | None:
        """What builds :attr:`_quick` for this policy, if anything does."""
        one_slope = len(self._linear) == 1 and not self._binned and not self.excluded
        if one_slope and self._spans[-1][1] <= WRITTEN_OUT_VALUES:
            return self._quick_numeric
        return self._quick_binned if self._bin_keys else None

    def _first_quick(self, context: Any, rng: random.Random | None) -> Decision | None:
        """:attr:`_quick`, built on the first draw it may serve (writing out a numeric draw costs more
        than building the rest of the policy), then drawn with."""
        build = self._quick_kind()
        self._quick = quick = build() if build is not None else None
        return quick(context, rng) if quick is not None else None

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        """The policy's state for copies and pickles, without :attr:`_quick` (a closure over this
        policy's caches and generator): a copy builds its own on its first draw."""
        state = {name: getattr(self, name) for name in self.__slots__ if hasattr(self, name)}
        state["_quick"] = None
        return None, state

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        for name, value in state[1].items():
            object.__setattr__(self, name, value)
        self._quick = self._first_quick if self._quick_kind() is not None else None

    def _quick_numeric(self) -> Callable[[Any, random.Random | None], Decision | None]:
        """:meth:`choose` for a policy with one numeric feature with weights (no binned one, nor
        exclusions), written out as one function (a call per step costs more than the step): for a
        plain context (as :meth:`_plain_base` reads it) of a key of segments kept with every logit
        within ±EXP_SAFE, x̃ computed once as :meth:`FeatureReader.number` computes it, and each
        dimension drawn from ℓ / T = a + b·x̃ by :func:`_draw_lines`, as :meth:`_choose_linear` draws.
        None for any other context (:meth:`_choose_in` checks it). Its text holds only numbers,
        indices and the names below; the feature names and the policy's state are in its namespace."""
        ((name, reader, slopes),) = self._linear
        single = len(self._categorical) == 1
        named: dict[int, tuple[str, Any]] = {}
        kept: dict[Any, tuple[float, ...]] = {}

        def name_index(index: int) -> tuple[str, Any]:
            """The action id and config of the configuration at ``index``, kept in ``named``."""
            if len(named) >= CACHE_SIZE:
                named.clear()
            decision = self._decision(self._table(None), self._local(index))
            pair = named[index] = (decision.action_id, decision.config)
            return pair

        def keep(key: Any) -> tuple[float, ...] | None:
            """The logits over T of a key of segments (its one value, with one categorical feature)
            once :meth:`_base` has kept them with every logit within ±EXP_SAFE, kept in ``kept``."""
            base = self._bases.get((key,) if single else key)
            if base is None or not base[1]:
                return None
            if len(kept) >= CACHE_SIZE:
                kept.clear()
            logits = kept[key] = base[0]
            return logits

        namespace: dict[str, Any] = {
            "named": named, "name_index": name_index, "kept": kept, "keep": keep,
            "exp": exp, "log": log, "log1p": math.log1p, "isfinite": isfinite, "new": _tuple_new, "Decision": Decision,
            "categorical": self._categorical, "c0": self._categorical[0] if single else None, "name": name,
            "own_random": self._random, "agent_id": self.agent_id, "version": self.version,
            "incarnation": self.incarnation, "center": reader.center, "scale": reader.scale,
        }
        lines = [
            "def quick(context, rng):",
            "    if context.__class__ is not dict:",
            "        return None",
            "    try:",  # one categorical feature: its value is the key, and the context's length read off it
            "        key = context.get(c0)" if single else "        key = tuple(map(context.get, categorical))",
            "        a = kept.get(key)",
            "    except TypeError:",  # an unhashable value: the check names it
            "        return None",
            "    if a is None and (a := keep(key)) is None:",
            "        return None",
            "    value = context.get(name)",
            "    if value is None or len(context) != "
            + ("(1 if key is None else 2):" if single else "len(key) - key.count(None) + 1:"),
            "        return None",
            "    kind = value.__class__",  # a plain number (_plain_number, inline)
            "    if not (isfinite(value) if kind is float else kind is int and "
            f"{-EXACT_INTEGERS!r} < value < {EXACT_INTEGERS!r}):",
            "        return None",
            *(["    if value < 0:", "        return None", "    value = log1p(value)"] if reader.log else []),
            "    x = (value - center) / scale",  # FeatureReader.number, inline
            f"    if x < {-NUMBER_CLIP!r}:",
            f"        x = {-NUMBER_CLIP!r}",
            f"    elif x > {NUMBER_CLIP!r}:",
            f"        x = {NUMBER_CLIP!r}",
            "    random = rng.random if rng is not None else own_random",
            *_draw_lines(self._spans, slopes, self.exploration_floor),
            "    action_id, config = named.get(index) or name_index(index)",
            "    return new(Decision, (agent_id, action_id, index, p, log(p), version, config, context.copy(),",
            "                          incarnation, None))",
        ]
        exec("\n".join(lines), namespace)  # numbers, indices and names only (above)
        return namespace["quick"]  # type: ignore[no-any-return]

    def _table(self, context: Mapping[str, Any] | None) -> _Table:
        if not context or not self._features:
            key: tuple[Any, ...] = ()
        elif self._linear and any(n in context for n, _, _ in self._linear):
            return self._build(context, kept=False)  # numbers rarely repeat: not kept
        else:
            key = self._key(context)
        table = self._cache.get(key)
        if table is None:
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            table = self._cache[key] = self._build(context, kept=True)
        return table

    def _key(self, context: Mapping[str, Any]) -> tuple[str | None, ...]:
        """The segments of ``context`` (None where it has none): contexts with equal keys and no
        numeric term have equal probabilities."""
        readers = self._readers
        return tuple(None if (v := context.get(n)) is None else readers[n].segment(v) for n in self._categorical)

    def _build(self, context: Mapping[str, Any] | None, *, kept: bool) -> _Table:
        logits = self._logits(context)
        return _Table(
            dimension_probabilities(logits, self.layout, self.temperature, self.exploration_floor),
            self.excluded,
            self.layout.sizes,
            kept=kept,
        )

    def _logits(self, context: Mapping[str, Any] | None) -> list[float]:
        """ℓ(· | x) of the policy's own actions (module docstring)."""
        logits = context_logits(*self._own, context)
        scorer = self._scorer
        if scorer is not None:
            logits = [x + scorer.logit(a.features, context) for x, a in zip(logits, self.actions, strict=True)]
        return logits

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
        elif self._bin_keys and type(context) is dict:  # every numeric feature binned: a number's key is its bin
            table = self._binned_table(context)
            if table is not None:
                return table, dict(context)
        checked = validated_context(context)
        if self._numeric:
            self._check_kinds(checked)
        return self._table(checked), checked

    def _binned_table(self, context: dict[str, Any]) -> _Table | None:
        """The kept table of ``context``, its binned numbers read as their bins, when each is a plain
        finite float or integer and the context has no other feature (None otherwise: checked in
        full). Its other values are as given: only strings can hit a kept table (as in :meth:`_checked`)."""
        try:
            values = list(map(context.get, self._categorical))
            for at, names, edges in self._bin_keys:
                value = values[at]
                if value is not None:
                    if not _plain_number(value):
                        return None
                    values[at] = names[bisect_right(edges, value)]
            key = tuple(values)
            table = self._cache.get(key)
        except TypeError:  # an unhashable value: the check names it
            return None
        return table if table is not None and len(context) == len(key) - key.count(None) else None

    def _local(self, index: int) -> tuple[int, ...]:
        """The value indices of the configuration at ``index`` (:func:`joint_index` inverted)."""
        local = []
        for k in reversed(self.layout.sizes):
            index, i = divmod(index, k)
            local.append(i)
        return tuple(reversed(local))

    def _decision(self, table: _Table, local: tuple[int, ...]) -> Decision:
        """The decision of the configuration ``local`` in ``table`` (probability 0 if excluded), without a context."""
        p = 0.0 if local in self._excluded_set else (
            math.prod(probs[i] for probs, i in zip(table.probs, local, strict=True)) / table.z)
        configs = [self.layout.configs[d][i] for d, i in enumerate(local)]
        config = configs[0] if len(configs) == 1 else ReadOnlyDict({k: v for c in configs for k, v in c.items()})
        return Decision(
            self.agent_id,
            self.layout.joint_id(local),
            joint_index(local, self.layout.sizes) if (merge := self.layout.merge) is None
            else joint_index(merge.split(local), merge.sizes),  # the position in the document's joint space
            p,
            math.log(p) if p > 0 else -math.inf,
            self.version,
            config,
            incarnation=self.incarnation,
        )

    def _check_kinds(self, context: Mapping[str, Any]) -> None:
        for name in self._numeric:
            if name in context and (problem := self._readers[name].refusal(context[name])) is not None:
                raise InvalidDocument("context", [(f"context.{name}", problem)])

    def _parse(self, action_id: str) -> tuple[int, ...]:
        """The value indices of a configuration id; :class:`InvalidDocument` if it is none of this policy's."""
        local = self.layout.parse(action_id) if isinstance(action_id, str) else None
        if local is None:
            what = f"an action of policy {self.agent_id!r} (known: {self.action_ids})" if len(self.layout.sizes) == 1 \
                else f"a configuration of policy {self.agent_id!r}"
            raise InvalidDocument("decision", [("action_id", f"{action_id!r} is not {what}")])
        return local

    def decision_for(self, action_id: str) -> Decision:
        """The decision record of a configuration without context (for replaying a logged choice)."""
        local = self._parse(action_id)
        if self._fixed is not None:
            return self._fixed[joint_index(local, self.layout.sizes)]
        table = self._table(None)
        return self._decision(table, local)

    def probability(
        self,
        action_id: str,
        context: Mapping[str, Any] | None = None,
        candidates: Sequence[str | Action | Mapping[str, Any] | Candidate] | None = None,
    ) -> float:
        """π(a | x) of a configuration id (0 if excluded); :class:`InvalidDocument` if unknown, or
        for a ``context`` that is not one (checked as :meth:`choose` checks its shape). A string or
        a boolean for a numeric feature, which :meth:`choose` refuses, adds nothing here (a logged
        episode's context is read as the learner reads it). With ``candidates`` (an episode's), the
        action's probability among them, π(a | x, C) (0 if it is not one of them)."""
        if candidates is not None:
            offered = self.offered(candidates)
            ids = [a.id for a in offered]
            if action_id not in ids:
                return 0.0
            return self.offered_probabilities(offered, _shape_checked(context))[ids.index(action_id)]
        if context is None and self._fixed is not None:
            return self.decision_for(action_id).probability
        return self.probability_at(self._parse(action_id), context)

    def probability_at(self, local: Sequence[int], context: Mapping[str, Any] | None = None) -> float:
        """π(a | x) of a configuration given as one value index per dimension."""
        return joint_probability(self._table(_shape_checked(context)).probs, local, self.excluded)

    def marginals(self, context: Mapping[str, Any] | None = None) -> dict[str, dict[str, float]]:
        """Per dimension, each value's probability of being chosen for ``context`` (exclusions
        included: the marginals of π, not the p_d); ``context`` is checked as in :meth:`probability`."""
        table = self._table(_shape_checked(context))
        if not self.excluded:
            return self._by_dimension(table.probs)
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
        return self._by_dimension(out)

    def _by_dimension(self, probs: Sequence[Sequence[float]]) -> dict[str, dict[str, float]]:
        """Per dimension of the document, its values' probabilities from those of the dimensions
        drawn (a merged pair's summed over the other dimension of the pair)."""
        layout, merge = self.layout, self.layout.merge
        if layout.original is None or merge is None:
            return {name: dict(zip(layout.value_ids[d], probs[d], strict=True)) for d, name in enumerate(layout.names)}
        out = [[0.0] * k for k in merge.sizes]
        for part, values in zip(merge.parts, probs, strict=True):
            for j, p in enumerate(values):
                if len(part) == 1:
                    out[part[0]][j] += p
                else:
                    v, w = divmod(j, merge.sizes[part[1]])
                    out[part[0]][v] += p
                    out[part[1]][w] += p
        original = layout.original
        return {name: dict(zip(original.value_ids[d], out[d], strict=True)) for d, name in enumerate(original.names)}

    def snapshot(self) -> PolicySnapshot:
        """Which stored policy version this is: its document ``id`` (``agent:vN``) and ``version``."""
        return PolicySnapshot(policy_doc_id(self.agent_id, self.version), self.version, self.agent_id)

    @property
    def action_ids(self) -> list[str]:
        """The actions' ids: a flat list's actions, or the values' ids dimension after dimension."""
        return [a.id for a in self.actions]

    @property
    def probabilities(self) -> dict[str, float]:
        """Configuration id → probability that ``choose()`` without context returns it (every
        configuration of a policy with dimensions: see :meth:`marginals` for large ones)."""
        if self._fixed is not None:
            return {d.action_id: d.probability for d in self._fixed}
        table = self._table(None)
        return {
            self.layout.joint_id(local): joint_probability(table.probs, local, self.excluded)
            for local in product(*(range(k) for k in self.layout.sizes))
        }

    def entropy(self) -> float:
        """Shannon entropy of the choice distribution without context, in nats."""
        return -math.fsum(p * math.log(p) for p in self.probabilities.values() if p > 0)

    def __repr__(self) -> str:
        if self._fixed is not None:
            probs = ", ".join(f"{k}={v:.3f}" for k, v in self.probabilities.items())
        else:
            probs = ", ".join(f"{n}[{k}]" for n, k in zip(self.layout.names, self.layout.sizes, strict=True))
        return f"SoftmaxPolicy({self.agent_id!r}, v{self.version}: {probs})"


StructuredPolicy = SoftmaxPolicy
"""The same class, under the name the policies with dimensions had."""


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


def _shape_checked(context: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``context`` checked (:func:`~agent_learning.policy.decision.validated_context`), or None: what
    :meth:`SoftmaxPolicy._table` may keep a table under, where :meth:`~SoftmaxPolicy.choose`
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
    """Whether ``action_id`` is something ``doc`` can choose: one of its configurations (a flat
    list's actions) that no rule excludes."""
    local = Layout.of(doc).parse(action_id)
    return local is not None and local not in set(drawn_excluded(doc))


def drawn_excluded(doc: PolicyDocument) -> list[tuple[int, ...]]:
    """The configurations ``doc`` excludes, as value indices of the dimensions its policy draws
    (:meth:`Layout.of`: each declared pair merged into one)."""
    return excluded_configurations(merged_document(doc))


def segment_views(doc: PolicyDocument) -> dict[str, dict[str, dict[str, float]]]:
    """Per dimension (a flat list's: ``action``), each value's probability of being chosen:
    :data:`NO_CONTEXT` (i.e. the global logits) and, for each learned segment of each categorical
    feature, in a context with that segment alone (``"task=billing"``)."""
    chooser = SoftmaxPolicy(doc)

    def view(context: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
        return {name or "action": values for name, values in chooser.marginals(context).items()}

    out = {NO_CONTEXT: view(None)}
    for feature in doc.features or []:
        bins = dict(zip(bin_names(feature.bins), bin_values(feature.bins), strict=True)) if feature.bins else {}
        for segment in feature.segments or {}:
            out[f"{feature.name}={segment}"] = view({feature.name: bins.get(segment, segment)})
    return out
