"""REINFORCE with a baseline for structured and contextual policies. One file.

The policy (:mod:`agent_learning.policy.structured`): dimensions d = 1..D with K_d values each, all V
values in one vector; for the context x_i of episode i the values' logits are ::

    ℓ_i = θ + Σ_f δ_{f, c_if} + Σ_j β_j x̃_ij          x̃_ij = clip((x_ij − m_j) / s_j, ±4)

(θ global logits, δ_{f,c} the offsets of segment c of categorical feature f — zero when the
episode has no learned segment of f —, β_j the weights of numeric feature j). Per dimension
s_d(· | x_i) = softmax(ℓ_i[d] / T) is the part the learner moves (the exploration floor is
exploration on top, as in :mod:`agent_learning.learning.reinforce`), and the learned joint distribution is
q(a | x) = Π_d s_d(a_d | x) / Z_s(x), Z_s = 1 − Σ_{e ∈ E} Π_d s_d(e_d | x) over the excluded
configurations E.

Per batch (N rows: episodes, then one row per corrected episode with its net reward change)::

    w_i = min(q(a_i | x_i) / μ_i, c)                 clipped importance weight; μ_i is the logged
                                                     joint probability π(a_i | x_i)
    b_i = (Σ_{k ∈ S(i)} w_k r_k + m·b) / (Σ_{k ∈ S(i)} w_k + m)
                                                     context baseline: the weighted mean reward of
                                                     the episodes with i's segments S(i) (all its
                                                     categorical features), shrunk towards the
                                                     batch's b = Σ w r / Σ w by m = baseline_prior
    A_i = (r_i − b_i) / max(σ, σ_min)                σ² = Σ w (r − b_i)² / Σ w;  a correction's A is δ/σ

The score function of the joint choice is exact (``gradient`` returns it and :func:`surrogate`
lets a test check it by finite differences)::

    ∇_{ℓ_i} log q(a_i | x_i) = ⊕_d (e_{a_id} − s_d(x_i)) / T  −  ∇_{ℓ_i} log Z_s(x_i)
    ∂Z_s/∂ℓ_{i,dv} = −Σ_{e ∈ E} Π_d' s_d'(e_d' | x_i) · (1[e_d = v] − s_d(v | x_i)) / T

so ∇ log Z_s = ⊕_d (q_d − s_d(x_i)) / T with q_d(v) = (s_d(v) − Σ_{e ∈ E, e_d = v} Π_d' s_d'(e_d')) / Z_s
the marginal of q, computed in that form and held in [0, 1] (Z_s at least
:data:`MIN_ALLOWED_MASS`), so that exclusions holding all the mass float64 resolves leave the
update finite instead of dividing by a Z_s rounded to 0 (q itself is held at most 1). With
G_i = (w_i A_i / N) ∇_{ℓ_i} log q(a_i | x_i), the gradient of the surrogate
L = 1/N Σ_i w_i A_i log q(a_i | x_i) + β Σ_d H(s_d(θ)) is Σ_i G_i for θ (plus the entropy term),
Σ_{i: c_if = c} G_i for δ_{f,c} and Σ_i x̃_ij G_i for β_j.

Direction (``direction="evidence"``, the default; ``"plain"`` follows the gradient). Every block
moves by the evidence behind it, as the flat learner's evidence direction does, dimension by
dimension (the joint log-probability is a sum over dimensions, so each dimension is a bandit on
the shared advantage)::

    θ:        d_v = T · Σ_{i: a_id = v} A_i / √(n_v + c₀)                       (the flat formula)
    δ_{f,c}:  d_v = T · Σ_{i ∈ c, a_id = v} R_i / √(n_{c,v} + c₀ + m_s)
    β_j:      d_v = T · Σ_{i: a_id = v} R_i x̃_ij / √(Σ_{i: a_id = v} x̃_ij² + c₀ + m_s)
    R_i = A_i − Ā_{d, a_id}           the advantage left after the global logits' share: Ā_{d,v}
                                      is the batch's mean A over rows with a_d = v

each centred within its dimension, c₀ = ``evidence_prior``. A segment's offset thus moves by the
z-statistic of how much better or worse a value does in the segment than overall, and
m_s = ``segment_prior`` pseudo-episodes shrink it towards the global logits while the segment's
evidence is thin. The entropy bonus adds its natural gradient −β·T·(log s_d − Σ s_d log s_d) to
θ, as in the flat learner.

Step and trust region: η·√(N/N_ref) times the direction, halved until the mean over the batch's
episodes (over its rows when it holds corrections alone) of Σ_d KL(s_d,old(x_i) ‖ s_d,new(x_i))
≤ max_kl·N/N_ref; θ keeps ``max_logit_gap`` per
dimension; every block is centred per dimension and clipped to ±``logit_bound``.

Evidence bound, per dimension and segment: the learner state holds, per value, the discounted
count, reward sum and sum of squares of every episode (``count``/``reward_sum``/``reward_sq_sum``,
the flat learner's state) and, per segment of each categorical feature, the count and reward sum
of its episodes, fading with the segment's own episodes (2^(−n_c/H)) rather than the batch's.
After the step each dimension's θ is bounded exactly as in the flat learner
(z against its leader, within the dimension; with several dimensions the Thompson floor's c_T is
``dimension_thompson_floor``, as a dropped value's episodes were drawn beside the other
dimensions' worse values), and in each segment the logits θ + δ_{f,c} are
bounded the same way by the segment's evidence (each value's mean and variance shrunk by c₀
pseudo-episodes towards the segment's pooled ones, within the dimension; each value's own
variance taken as the dimension's pooled variance; g₀ = ``segment_gap_slack``, and the pairwise
calibration without its normalisation over actions or the Thompson floor), moving δ only.
A numeric feature's centre and scale are the mean and standard deviation of the episodes that
carried it, pooled over batches up to the one in which they reach :data:`NUMBER_FIT_EPISODES`
(``numbers_pending`` in the state until then; the feature is not used before). Its episodes fall
in two halves, below and above its centre (``halves`` in the state); at x̃ = ±1 the logits
θ ± β_j are bounded by the evidence of that half as a segment's θ + δ is, but with g₀ = ``gap_slack``,
moving β_j only.
So no dimension, no segment and no side of a numeric feature is much surer than its evidence,
nor, where the odds cap applies, much less sure. The cap bounds the logits some requests are
drawn from with the evidence of exactly those requests: each dimension's θ of a policy without
context features and, in a one-dimension policy, each segment's θ + δ and each half's θ ± β.
With context features θ keeps the floor only: its pooled evidence mixes contexts that prefer
different values (capped, the numeric row of ``benchmarks/learning.py`` went from 0.97× to
1.17× per-bin Thompson). With several dimensions the segments and halves keep the floor only:
a segment's evidence for one dimension mixes the other dimensions' choices in that segment, a
few episodes a batch that move as the policy learns (capped, the demo's two-dimension agent
became sure of the second-best retrieval depth in one segment, whose early episodes had drawn
the deeper one with the wrong prompts). Without context that mixing spans every batch, as
per-dimension Thompson sampling's posteriors do, and the cap helps (the 300-configuration row
from 1.14× to 1.06× per-dimension Thompson over 200 seeds).

The flat learner's change test runs on the global evidence (every value of every dimension,
its recent sums under ``recent`` in the state; it compares judged rewards, feedback corrections
left out, as the flat learner's does); when it fires, the global evidence becomes the
recent one and every segment's and half's cells are scaled by the share of the episodes kept.

One dimension without context or exclusions gives exactly the flat learner's update
(:class:`agent_learning.learning.reinforce.Reinforce`); a test checks it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from agent_learning.documents import MAX_LEARNED_VALUES, MAX_SEGMENTS, PolicyDocument, excluded_configurations
from agent_learning.learning.reinforce import (
    RECENT,
    Evidence,
    LearnerConfig,
    _first_bad,
    advantages,
    bound_logits,
    check_kinds,
    entropy,
    fade,
    recent_from_state,
    recent_to_state,
    remember,
    weight_stats,
)
from agent_learning.policy.structured import NUMBER_CLIP, Layout, is_number, segment_name

Array = NDArray[np.float64]
NUMBER_FIT_EPISODES = 30
"""Episodes carrying a numeric feature, pooled over batches, from which its centre and scale are
set; until then the feature is not used (a first batch of one or two episodes would fix its scale
for good, and a wrong scale makes the feature a step at its centre)."""
PENDING_NUMBERS = "numbers_pending"
"""Learner-state key: per numeric feature not fitted yet, the count, mean and standard deviation
of the episodes that carried it so far."""
NUMBER_PROBE = 1.0
"""Where a numeric feature's evidence bound applies: at x̃ = ±1 (one scale from its centre), by the
evidence of the episodes on that side of the centre (±1 was best on the benchmark's numeric problem:
0.86× per-bin Thompson with 1/20 seeds ending below 0.5, against 0.68× with 4/20 unbounded and 1.31×
with 2/20 at ±2)."""


@dataclass(frozen=True)
class ContextBatch:
    """Scored episodes of a structured policy as arrays."""

    actions: NDArray[np.int64]
    """(N, D) value index per dimension."""
    rewards: Array
    logged_probs: Array
    corrections: NDArray[np.bool_]
    categories: NDArray[np.int64]
    """(N, F_c) segment index per categorical feature; −1 where the episode has none learned."""
    numbers: Array
    """(N, F_n) standardised numeric features x̃ (0 where missing)."""

    @property
    def regular(self) -> NDArray[np.bool_]:
        return ~self.corrections

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class Params:
    """The learnable arrays of a structured policy (module docstring: θ, δ, β)."""

    theta: Array
    offsets: list[Array]
    """Per categorical feature, (S_f, V): one row per segment."""
    weights: Array
    """(F_n, V)."""

    def copy(self) -> Params:
        return Params(self.theta.copy(), [o.copy() for o in self.offsets], self.weights.copy())

    def add(self, other: Params, scale: float) -> Params:
        return Params(
            self.theta + scale * other.theta,
            [o + scale * p for o, p in zip(self.offsets, other.offsets, strict=True)],
            self.weights + scale * other.weights,
        )

    def flat(self) -> Array:
        return np.concatenate([self.theta, *(o.ravel() for o in self.offsets), self.weights.ravel()])

    def with_flat(self, values: Array) -> Params:
        out = self.copy()
        v = len(self.theta)
        out.theta = values[:v].copy()
        at = v
        for k, o in enumerate(self.offsets):
            out.offsets[k] = values[at : at + o.size].reshape(o.shape).copy()
            at += o.size
        out.weights = values[at:].reshape(self.weights.shape).copy()
        return out


@dataclass
class Model:
    """A structured policy document's shape: layout, exclusions, features and segments."""

    layout: Layout
    excluded: NDArray[np.int64]
    """(|E|, D) excluded configurations."""
    categorical: list[str]
    segments: list[list[str]]
    """Per categorical feature, its segments' names, in ``offsets`` row order."""
    numeric: list[str]
    centers: list[float]
    scales: list[float]
    fitted: list[bool]
    """Per numeric feature, whether its centre and scale are set (from :data:`NUMBER_FIT_EPISODES`)."""
    temperature: float
    pending: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per numeric feature still short of :data:`NUMBER_FIT_EPISODES`, its moments so far (the
    learner state's :data:`PENDING_NUMBERS`)."""

    @property
    def slices(self) -> list[slice]:
        return [slice(s, s + k) for s, k in zip(self.layout.starts, self.layout.sizes, strict=True)]


@dataclass(frozen=True)
class StructuredUpdate:
    """New logits and features of a structured policy, with metrics and learner state."""

    logits: Array
    features: list[dict[str, Any]] | None
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    def applied_to(self, doc: PolicyDocument) -> PolicyDocument:
        """``doc`` with this update's logits, features and learner state (validated; the same
        version: the trainer's :func:`~agent_learning.pipeline.train.next_version` makes the next)."""
        return PolicyDocument.from_dict(
            {**doc.to_dict(), "logits": list(self.logits), "features": self.features, "learner_state": self.state}
        )


# --------------------------------------------------------------------------- batch from documents


class Rows(NamedTuple):
    """Scored rows of a structured policy as the trainer collects them: per row the value index
    of each dimension, the reward (a correction's: its reward change), the logged joint
    probability, whether it is a feedback correction, and the context it was chosen for."""

    actions: Sequence[Sequence[int]] | NDArray[np.int64]
    rewards: Sequence[float] | Array
    logged_probs: Sequence[float] | Array
    corrections: Sequence[bool] | NDArray[np.bool_]
    contexts: Sequence[Mapping[str, Any] | None]


def prepare(doc: PolicyDocument, rows: Rows) -> tuple[Model, Params, ContextBatch]:
    """The model, parameters and batch of ``doc`` and these rows. Segments first seen here are
    added (the most frequent first, up to :data:`MAX_SEGMENTS` per feature and
    :data:`MAX_LEARNED_VALUES` in all) with zero offsets;
    a numeric feature's centre and scale are set once :data:`NUMBER_FIT_EPISODES` episodes
    (not corrections) have carried it, pooled over batches in the learner state. Rows of the wrong
    shape or kind raise ``ValueError`` naming the field (:func:`row_arrays`)."""
    layout = Layout.of(doc)
    actions, rewards, logged_probs, corrections = row_arrays(rows, len(layout.sizes))
    contexts = rows.contexts
    v = len(doc.actions)
    budget = MAX_LEARNED_VALUES // v - sum(
        len(f.segments or {}) if f.kind == "category" else 1 for f in doc.features or []
    )  # segments that may still be added
    categorical, segments, offsets = [], [], []
    numeric, centers, scales, weights, fitted = [], [], [], [], []
    pending_in = (doc.learner_state or {}).get(PENDING_NUMBERS) or {}
    pending: dict[str, dict[str, float]] = {}
    for feature in doc.features or []:
        values = [c.get(feature.name) if c else None for c in contexts]
        if feature.kind == "category":
            known = dict(feature.segments or {})
            counts: dict[str, int] = {}
            for value in values:
                if value is not None:
                    name = segment_name(value)
                    counts[name] = counts.get(name, 0) + 1
            for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                if name not in known and len(known) < MAX_SEGMENTS and budget > 0:
                    known[name] = [0.0] * v
                    budget -= 1
            categorical.append(feature.name)
            segments.append(list(known))
            offsets.append(np.array(list(known.values()), dtype=np.float64).reshape(len(known), v))
        else:
            center, scale, is_fitted = feature.center, feature.scale, feature.weights is not None
            if not is_fitted:
                present = np.array([float(x) for x, correction in zip(values, corrections, strict=True)
                                    if is_number(x) and not correction])
                seen = pooled_moments(_moments_state(pending_in.get(feature.name)), moments(present))
                if seen[0] >= NUMBER_FIT_EPISODES:
                    center, scale, is_fitted = *centre_and_scale(seen[1], seen[2]), True
                elif seen[0]:
                    pending[feature.name] = {"count": seen[0], "mean": seen[1], "std": seen[2]}
            fitted.append(is_fitted)
            numeric.append(feature.name)
            centers.append(center)
            scales.append(scale)
            weights.append(np.asarray(feature.weights if feature.weights is not None else [0.0] * v, dtype=np.float64))
    model = Model(
        layout,
        np.array(excluded_configurations(doc), dtype=np.int64).reshape(-1, len(layout.sizes)),
        categorical,
        segments,
        numeric,
        centers,
        scales,
        fitted,
        doc.temperature,
        pending,
    )
    params = Params(
        np.asarray(doc.logits, dtype=np.float64), offsets, np.array(weights, dtype=np.float64).reshape(len(numeric), v)
    )
    n = len(rewards)
    cats = np.full((n, len(categorical)), -1, dtype=np.int64)
    nums = np.zeros((n, len(numeric)), dtype=np.float64)
    seg_index = [{name: k for k, name in enumerate(names)} for names in segments]
    for i, context in enumerate(contexts):
        if not context:
            continue
        for f, name in enumerate(categorical):
            if name in context:
                cats[i, f] = seg_index[f].get(segment_name(context[name]), -1)
        for j, name in enumerate(numeric):
            x = context.get(name)
            if is_number(x) and fitted[j]:
                nums[i, j] = standardise(float(x), centers[j], scales[j])
    batch = ContextBatch(actions, rewards, logged_probs, corrections, cats, nums)
    return model, params, batch


def row_arrays(rows: Rows, dimensions: int) -> tuple[NDArray[np.int64], Array, Array, NDArray[np.bool_]]:
    """The rows' actions (N, D), rewards, logged probabilities and correction flags as arrays, their
    kinds checked as :meth:`agent_learning.learning.reinforce.Batch.from_arrays` checks a flat batch's (0.7 is
    no value index, "0.5" no reward): ``ValueError`` naming the field, never a silent conversion."""
    n = len(rows.contexts)
    try:
        a = np.asarray(rows.actions)
    except ValueError:
        raise ValueError(f"actions: must be {dimensions} value indices per row, got rows of other lengths") from None
    if a.size == 0:
        a = a.reshape(0, dimensions)  # no rows (np.asarray([]) is 1-D)
    r, p, c = np.asarray(rows.rewards), np.asarray(rows.logged_probs), np.asarray(rows.corrections)
    for name, values, shape in (("actions", a, (n, dimensions)), ("rewards", r, (n,)),
                                ("logged_probs", p, (n,)), ("corrections", c, (n,))):
        if values.shape != shape:
            raise ValueError(f"{name}: must have shape {shape} for {n} contexts and {dimensions} dimensions")
    check_kinds(a.ravel(), r, p, c)
    return a.astype(np.int64), r.astype(np.float64), p.astype(np.float64), c.astype(bool)


Moments = tuple[int, float, float]
"""(count, mean, standard deviation) of a numeric feature's values."""


def moments(values: Array) -> Moments:
    """The count, mean and (population) standard deviation of ``values``, computed on the values
    divided by the largest magnitude so that values near ±1e308 do not overflow."""
    if not values.size:
        return 0, 0.0, 0.0
    largest = float(np.abs(values).max())
    if largest == 0.0:
        return int(values.size), 0.0, 0.0
    unit = values / largest
    return int(values.size), float(unit.mean()) * largest, float(unit.std()) * largest


def pooled_moments(a: Moments, b: Moments) -> Moments:
    """The moments of two samples together (Chan et al.'s pairwise update), without overflow."""
    (na, ma, sa), (nb, mb, sb) = a, b
    if not na or not nb:
        return a if na else b
    n = na + nb
    largest = max(abs(ma), abs(mb), sa, sb)
    if largest == 0.0:
        return n, 0.0, 0.0
    ua, ub, va, vb = ma / largest, mb / largest, sa / largest, sb / largest
    mean = ua * (na / n) + ub * (nb / n)
    var = (na * va**2 + nb * vb**2) / n + (na / n) * (nb / n) * (ub - ua) ** 2
    return n, mean * largest, math.sqrt(var) * largest


def _moments_state(data: Any) -> Moments:
    """Moments kept in the learner state; anything else (a state from before) as none."""
    try:
        n, mean, std = int(data["count"]), float(data["mean"]), float(data["std"])
    except (TypeError, KeyError, ValueError):
        return 0, 0.0, 0.0
    return (n, mean, std) if n > 0 and math.isfinite(mean) and math.isfinite(std) and std >= 0 else (0, 0.0, 0.0)


def centre_and_scale(mean: float, std: float) -> tuple[float, float]:
    """A numeric feature's centre and scale from its episodes' mean and standard deviation (scale 1
    when they are all equal), rounded as the document keeps them: the scale to 9 significant
    digits, the centre to about a billionth of the scale (9 decimals when the scale is 1 or more)."""
    if not std > 0.0:  # all equal (or a spread below the smallest float)
        return round(mean, 9), 1.0
    decimals = max(9, 8 - math.floor(math.log10(std)))
    return round(mean, decimals), round(std, decimals)


def standardise(x: float, center: float, scale: float) -> float:
    """x̃ = clip((x − m) / s, ±NUMBER_CLIP), as the policy computes it at choose time."""
    return max(-NUMBER_CLIP, min(NUMBER_CLIP, (x - center) / scale))


def features_out(doc: PolicyDocument, model: Model, params: Params) -> list[dict[str, Any]] | None:
    """The document's ``features`` with the learned segments, offsets and weights."""
    if doc.features is None:
        return None
    out = []
    for feature in doc.features:
        if feature.kind == "category":
            f = model.categorical.index(feature.name)
            segments = {name: _rounded(params.offsets[f][k]) for k, name in enumerate(model.segments[f])}
            out.append({"name": feature.name, "kind": "category", **({"segments": segments} if segments else {})})
        elif not model.fitted[model.numeric.index(feature.name)]:
            out.append({"name": feature.name, "kind": "number"})  # not seen yet: its centre comes later
        else:
            j = model.numeric.index(feature.name)
            out.append(
                {
                    "name": feature.name,
                    "kind": "number",
                    "weights": _rounded(params.weights[j]),
                    "center": model.centers[j],  # rounded where they are set
                    "scale": model.scales[j],
                }
            )
    return out


def _rounded(values: Array) -> list[float]:
    return [round(float(x), 6) for x in values]


# --------------------------------------------------------------------------- the math


class Contexts:
    """The distinct contexts of a batch: rows with the same features share their probabilities,
    so the math runs once per context (U of them) and rows only gather and scatter."""

    def __init__(self, batch: ContextBatch) -> None:
        n = len(batch)
        if batch.numbers.shape[1] and np.any(batch.numbers):  # numeric features: every row its own
            first, inverse, counts = np.arange(n), np.arange(n), np.ones(n)
        elif batch.categories.shape[1]:
            _, first, inverse, counts = np.unique(
                segment_keys(batch.categories), return_index=True, return_inverse=True, return_counts=True
            )
        else:  # no features: one context
            first, inverse, counts = np.zeros(min(n, 1), dtype=np.int64), np.zeros(n, dtype=np.int64), np.array([n])
        self.categories = batch.categories[first]
        self.numbers = batch.numbers[first]
        self.inverse = np.asarray(inverse, dtype=np.int64).reshape(-1)
        self.counts = np.asarray(counts, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.counts)

    def logits(self, params: Params) -> Array:
        """ℓ for each distinct context, (U, V)."""
        out = np.broadcast_to(params.theta, (len(self.categories), len(params.theta))).copy()
        for f, offsets in enumerate(params.offsets):
            rows = self.categories[:, f]
            has = rows >= 0
            out[has] += offsets[rows[has]]
        if params.weights.size:
            out += self.numbers @ params.weights
        return out


def segment_keys(categories: NDArray[np.int64]) -> NDArray[np.int64]:
    """One integer per row naming its segments of every categorical feature (mixed radix)."""
    keys = np.zeros(len(categories), dtype=np.int64)
    for f in range(categories.shape[1]):
        column = categories[:, f] + 1  # −1 (no segment) → 0
        keys = keys * (int(column.max(initial=0)) + 1) + column
    return keys


class Tallies:
    """Per distinct context u and value v, sums over the rows of u that chose v (in its
    dimension): rows, regular episodes, advantages, rewards and squared rewards of regular
    episodes. Everything the direction and the evidence need is a sum of these."""

    def __init__(self, contexts: Contexts, model: Model, batch: ContextBatch, advantages: Array) -> None:
        u, v = len(contexts), sum(model.layout.sizes)
        d = len(model.layout.sizes)
        cols = batch.actions + np.array(model.layout.starts)
        keys = (contexts.inverse[:, None] * v + cols).ravel()
        regular = batch.regular.astype(np.float64)

        def tally(values: Array) -> Array:
            return np.bincount(keys, weights=np.repeat(values, d), minlength=u * v).reshape(u, v)

        self.rows = np.bincount(keys, minlength=u * v).reshape(u, v).astype(np.float64)
        self.regular = tally(regular)
        self.advantage = tally(advantages)
        self.reward = tally(batch.rewards)
        self.reward_sq = tally(regular * batch.rewards**2)
        self.corrected = None if batch.regular.all() else tally(np.where(batch.regular, 0.0, batch.rewards)).sum(axis=0)
        """Per value, the sum of the batch's feedback corrections (None without any)."""
        self.categories = contexts.categories
        self.numbers = contexts.numbers
        halves = np.where(contexts.numbers > 0, 1, np.where(contexts.numbers < 0, 0, -1))
        self.cells = np.hstack([contexts.categories, halves.astype(np.int64)])
        """Per context, its cell in each evidence group: the segment of each categorical feature,
        then the half (0 below, 1 above the centre, −1 at it or missing) of each numeric one."""

    def by_segment(self, table: Array, group: int, cells: int) -> Array:
        """``table`` summed over the contexts of each cell of an evidence group, (cells, V)."""
        rows = self.cells[:, group]
        has = rows >= 0
        out = np.zeros((cells, table.shape[1]))
        np.add.at(out, rows[has], table[has])
        return out


def dimension_softmax(logits: Array, model: Model) -> Array:
    """s_d(· | x) for every row of ``logits``, dimension by dimension, (rows, V)."""
    out = np.empty_like(logits)
    for sl in model.slices:
        z = logits[:, sl] / model.temperature
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        out[:, sl] = e / e.sum(axis=1, keepdims=True)
    return out


MIN_ALLOWED_MASS = 1e-300
"""Floor of Z_s = 1 − Σ_E Π_d s_d: when the excluded configurations hold all the mass float64 can
resolve (a temperature of 0.1 and a best value in each dimension that together are excluded),
1 − Σ rounds to 0; q and the marginals of q are then held at most 1, not divided by 0."""


def excluded_mass(s: Array, model: Model) -> Array:
    """Σ_{e ∈ E} Π_d s_d(e_d), per row (0 without exclusions)."""
    if not len(model.excluded):
        return np.zeros(len(s))
    cols = model.excluded + np.array(model.layout.starts)
    return s[:, cols].prod(axis=2).sum(axis=1)


def log_q(s: Array, model: Model, batch: ContextBatch, inverse: NDArray[np.int64]) -> Array:
    """log q(a_i | x_i) of every row, from the per-context probabilities ``s``."""
    cols = batch.actions + np.array(model.layout.starts)
    log_s = np.log(np.maximum(s, 1e-300))
    out = log_s[inverse[:, None], cols].sum(axis=1)
    if len(model.excluded):
        out -= np.log(np.maximum(1.0 - excluded_mass(s, model), MIN_ALLOWED_MASS))[inverse]
        np.minimum(out, 0.0, out=out)  # a probability, also where rounding leaves Z_s unresolved
    return out


def context_gradient(s: Array, model: Model, batch: ContextBatch, inverse: NDArray[np.int64], coef: Array) -> Array:
    """Σ_{i in context u} coef_i ∇_ℓ log q(a_i | x_u) for every context u, (U, V) (module
    docstring): the rows' one-hot part is scattered with one bincount, the rest is per context."""
    t = model.temperature
    u, v = s.shape
    cols = batch.actions + np.array(model.layout.starts)
    keys = (inverse[:, None] * v + cols).ravel()
    chosen = np.bincount(keys, weights=np.repeat(coef, cols.shape[1]), minlength=u * v).reshape(u, v)
    total = np.bincount(inverse, weights=coef, minlength=u)[:, None]
    grad = (chosen - total * s) / t
    if len(model.excluded):
        ecols = model.excluded + np.array(model.layout.starts)
        masses = s[:, ecols].prod(axis=2)  # (U, |E|)
        excluded_at = np.zeros_like(s)  # per value v of each dimension: Σ_{e ∈ E, e_d = v} Π_d' s_d'(e_d')
        for k in range(len(model.excluded)):
            excluded_at[:, ecols[k]] += masses[:, k : k + 1]
        z = np.maximum(1.0 - masses.sum(axis=1), MIN_ALLOWED_MASS)
        # ∇ log Z_s = (q_d − s_d)/T with q_d(v) = (s_d(v) − excluded_at)/Z_s, q's marginal (module
        # docstring); a marginal is in [0, 1], which holds it where rounding leaves Z_s unresolved.
        marginal = np.clip((s - excluded_at) / z[:, None], 0.0, 1.0)
        grad -= total * (marginal - s) / t
    return grad


def surrogate(
    params: Params, model: Model, batch: ContextBatch, weights: Array, advantages: Array, beta: float
) -> float:
    """L = 1/N Σ w_i A_i log q(a_i | x_i) + β Σ_d H(s_d(θ)); its gradient is :func:`gradient`."""
    contexts = Contexts(batch)
    s = dimension_softmax(contexts.logits(params), model)
    value = float((weights * advantages * log_q(s, model, batch, contexts.inverse)).mean())
    g = dimension_softmax(params.theta[None, :], model)[0]
    return value + beta * sum(entropy(g[sl]) for sl in model.slices)


def gradient(
    params: Params,
    model: Model,
    batch: ContextBatch,
    weights: Array,
    advantages: Array,
    beta: float,
    contexts: Contexts | None = None,
    probabilities: Array | None = None,
) -> Params:
    """The exact gradient of :func:`surrogate` with respect to θ, every δ and every β
    (``contexts`` and their per-dimension ``probabilities`` when the caller has them already)."""
    contexts = contexts or Contexts(batch)
    s = dimension_softmax(contexts.logits(params), model) if probabilities is None else probabilities
    per_context = context_gradient(s, model, batch, contexts.inverse, weights * advantages / len(batch))
    theta = per_context.sum(axis=0)
    g = dimension_softmax(params.theta[None, :], model)[0]
    log_g = np.log(np.maximum(g, np.finfo(float).tiny))
    for sl in model.slices:
        h = -(g[sl] * log_g[sl]).sum()
        theta[sl] += beta * (-g[sl] * (log_g[sl] + h) / model.temperature)
    offsets = []
    for f, o in enumerate(params.offsets):
        rows = contexts.categories[:, f]
        has = rows >= 0
        acc = np.zeros_like(o)
        np.add.at(acc, rows[has], per_context[has])
        offsets.append(acc)
    weights_g = contexts.numbers.T @ per_context if params.weights.size else np.zeros_like(params.weights)
    return Params(theta, offsets, weights_g)


class StructuredReinforce:
    """REINFORCE with a context baseline for structured policies (module docstring)."""

    name = "reinforce"

    def __init__(self, config: LearnerConfig | None = None) -> None:
        self.config = config or LearnerConfig()
        if self.config.direction == "natural":
            raise ValueError("learner setting direction='natural' is for flat policies; use 'evidence' or 'plain'")

    # -- statistics

    def weights_and_advantages(
        self,
        params: Params,
        model: Model,
        batch: ContextBatch,
        fallback_std: float = 1.0,
        contexts: Contexts | None = None,
        probabilities: Array | None = None,
    ) -> tuple[Array, Array, dict[str, float]]:
        """Clipped importance weights w, context-baseline advantages A and their statistics
        (``contexts`` and their per-dimension ``probabilities`` when the caller has them already)."""
        cfg = self.config
        contexts = contexts or Contexts(batch)
        s = dimension_softmax(contexts.logits(params), model) if probabilities is None else probabilities
        ratio = np.exp(log_q(s, model, batch, contexts.inverse)) / batch.logged_probs
        w = np.minimum(ratio, cfg.importance_clip)
        regular = batch.regular
        wr = w * regular
        wsum = wr.sum()
        if wsum <= 0 and regular.all():
            return np.zeros_like(w), np.zeros_like(w), {"baseline": 0.0, "reward_std": 0.0}
        global_b = float((wr * batch.rewards).sum() / wsum) if wsum > 0 else 0.0
        b = np.full(len(batch), global_b)
        if batch.categories.shape[1] and wsum > 0:
            if batch.numbers.shape[1] and np.any(batch.numbers):
                _, inverse = np.unique(segment_keys(batch.categories), return_inverse=True)
            else:
                inverse = contexts.inverse  # the contexts are the segments
            sw = np.bincount(inverse, weights=wr)
            swr = np.bincount(inverse, weights=wr * batch.rewards)
            m = cfg.baseline_prior
            b = ((swr + m * global_b) / (sw + m))[inverse]
        adv, stats = advantages(cfg, batch.rewards, regular, wr, b, fallback_std)
        return w, adv, {"baseline": global_b, **stats, **weight_stats(cfg, ratio)}

    # -- direction

    def direction(self, params: Params, model: Model, tallies: Tallies) -> Params:
        """The evidence direction of the module docstring, each block centred per dimension."""
        cfg = self.config
        t = model.temperature
        n_v = tallies.regular.sum(axis=0)
        sums = tallies.advantage.sum(axis=0)
        theta = t * sums / np.sqrt(np.maximum(n_v + cfg.evidence_prior, 1.0))
        s = np.maximum(dimension_softmax(params.theta[None, :], model)[0], 1e-12)
        log_s = np.log(s)
        for sl in model.slices:
            theta[sl] -= cfg.entropy_coef * t * (log_s[sl] - (s[sl] * log_s[sl]).sum())
        mean_adv = sums / np.maximum(tallies.rows.sum(axis=0), 1)  # Ā_{d,v}
        residual = tallies.advantage - tallies.rows * mean_adv  # per context: Σ R_i over its rows with a_d = v
        prior = cfg.evidence_prior + cfg.segment_prior
        offsets = [
            t
            * tallies.by_segment(residual, f, o.shape[0])
            / np.sqrt(tallies.by_segment(tallies.regular, f, o.shape[0]) + prior)
            for f, o in enumerate(params.offsets)
        ]
        weights = np.zeros_like(params.weights)
        for j in range(params.weights.shape[0]):
            x = tallies.numbers[:, j : j + 1]
            weights[j] = t * (residual * x).sum(axis=0) / np.sqrt((tallies.regular * x**2).sum(axis=0) + prior)
        return centre(Params(theta, offsets, weights), model)

    # -- update

    def update(
        self, params: Params, model: Model, batch: ContextBatch, state: Mapping[str, Any] | None = None
    ) -> tuple[Params, dict[str, float], dict[str, Any]]:
        """One training step; returns the new parameters, metrics and learner state."""
        cfg = self.config
        v = len(params.theta)
        contexts = Contexts(batch)
        s_old = dimension_softmax(contexts.logits(params), model)
        g_old = dimension_softmax(params.theta[None, :], model)[0]
        metrics: dict[str, float] = {
            "episodes": float(batch.regular.sum()),
            "corrections": float(len(batch) - batch.regular.sum()),
            "softmax_entropy_before": sum(entropy(g_old[sl]) for sl in model.slices),
        }
        evidence, problem = Evidence.from_state(state, v)
        if problem:
            metrics["state_reset"] = 1.0
        segments_state = _segment_state(state if not problem else None, model, v)
        if len(batch) == 0:
            metrics.update(
                softmax_entropy_after=metrics["softmax_entropy_before"], kl=0.0, step_scale=0.0, grad_norm=0.0
            )
            return params.copy(), metrics, dict(state or {}) if not problem else {}
        w, adv, stats = self.weights_and_advantages(params, model, batch, evidence.pooled_std(), contexts, s_old)
        g = gradient(params, model, batch, w, adv, cfg.entropy_coef, contexts, s_old)
        tallies = Tallies(contexts, model, batch, adv)
        direction = g if cfg.direction == "plain" else self.direction(params, model, tallies)
        size = len(batch) / cfg.reference_batch if cfg.reference_batch else 1.0
        scale = cfg.learning_rate * (np.sqrt(size) if cfg.direction == "evidence" else size)
        max_kl = cfg.max_kl * size if cfg.max_kl is not None else None
        weights_u = np.bincount(contexts.inverse, weights=batch.regular.astype(float), minlength=len(contexts.counts))
        if weights_u.sum() <= 0:
            weights_u = contexts.counts
        new, kl = self._step(params, direction, scale, model, contexts, s_old, weights_u)
        if max_kl is not None:
            for _ in range(20):
                if kl <= max_kl:
                    break
                scale /= 2
                new, kl = self._step(params, direction, scale, model, contexts, s_old, weights_u)
        new_state: dict[str, Any] = {}
        if cfg.gap_per_evidence is not None:
            recent, corrections, recent_problem = recent_from_state(
                (state or {}).get(RECENT) if not problem else None, v
            )
            if recent_problem:
                metrics["recent_reset"] = 1.0
            evidence, recent_out, z, segments_state, corrections = _add_evidence(
                cfg, evidence, recent, corrections, segments_state, tallies, model, int(batch.regular.sum())
            )
            raised, lowered = self.bound_by_evidence(new, model, evidence, segments_state)
            metrics["raised_by_evidence"] = float(raised)
            metrics["lowered_by_evidence"] = float(lowered)
            kl = _mean_kl(s_old, dimension_softmax(contexts.logits(new), model), model, weights_u)
            new_state = {**evidence.to_state(), **_segment_state_out(segments_state, model)}
            if recent_out is not None:
                metrics["change_z"] = z
                new_state[RECENT] = recent_to_state(recent_out, corrections)
        g_new = dimension_softmax(new.theta[None, :], model)[0]
        regular = batch.regular
        metrics.update(
            stats,
            mean_reward=float(batch.rewards[regular].mean()) if regular.any() else 0.0,
            episode_reward_std=float(batch.rewards[regular].std()) if regular.any() else 0.0,
            softmax_entropy_after=sum(entropy(g_new[sl]) for sl in model.slices),
            kl=kl,
            step_scale=float(scale),
            grad_norm=float(np.linalg.norm(g.flat())),
        )
        return new, metrics, new_state

    def _step(
        self,
        params: Params,
        direction: Params,
        scale: float,
        model: Model,
        contexts: Contexts,
        s_old: Array,
        weights_u: Array,
    ) -> tuple[Params, float]:
        cfg = self.config
        new = params.add(direction, scale)
        if cfg.max_logit_gap is not None:
            for sl in model.slices:
                block = new.theta[sl]
                np.maximum(block, block.max() - cfg.max_logit_gap, out=block)
        new = centre(new, model)
        _clip(new, cfg.logit_bound)
        return new, _mean_kl(s_old, dimension_softmax(contexts.logits(new), model), model, weights_u)

    def bound_by_evidence(
        self, params: Params, model: Model, evidence: Evidence, segments: list[list[tuple[Array, Array]]]
    ) -> tuple[int, int]:
        """Lower logits (in place) to the odds cap where it applies, then raise them to at least the
        leader's minus the evidence gap, per dimension for θ and per dimension and segment for
        θ + δ (module docstring); returns how many were raised and how many lowered."""
        cfg = self.config
        raised = lowered = 0
        # The odds cap reads the evidence's means as each value's mean reward. With context
        # features θ is no context's logits (its pooled evidence mixes contexts that prefer
        # different values): only the floor bounds it. A segment's evidence with several
        # dimensions mixes the other dimensions' choices in that segment, a few episodes a batch
        # that move as the policy learns: only the floor bounds those cells too. Without context,
        # a value's mean mixes the other dimensions' choices across the whole batch, as
        # per-dimension Thompson sampling's posteriors do; the cap applies there.
        single = len(model.slices) == 1
        contextual = bool(params.offsets or params.weights.size)
        variances = []  # per dimension: its pooled reward variance, the spread of a cell's evidence
        # With several dimensions each one's Thompson floor is dimension_thompson_floor's (LearnerConfig).
        per_dimension = cfg if single else replace(cfg, thompson_floor=cfg.dimension_thompson_floor)
        for sl in model.slices:
            sub = Evidence(evidence.count[sl], evidence.reward_sum[sl], evidence.reward_sq_sum[sl])
            params.theta[sl], count_raised, count_lowered = bound_logits(
                per_dimension, params.theta[sl], sub, cap=not contextual, temperature=model.temperature
            )
            raised += count_raised
            lowered += count_lowered
            pooled = sub.pooled()
            variances.append(None if pooled is None else pooled[1])
        cells = [(offsets[k], segments[f][k], 1.0, cfg.segment_gap_slack)
                 for f, offsets in enumerate(params.offsets) for k in range(offsets.shape[0])]
        cells += [(params.weights[j], segments[len(params.offsets) + j][k], sign * NUMBER_PROBE, None)
                  for j in range(params.weights.shape[0]) for k, sign in enumerate((-1.0, 1.0))]
        # A segment's θ + δ, or a numeric half's θ ± β at one scale from the centre, bounded by the
        # cell's own evidence (with the dimension's pooled variance), moving δ or β only.
        for row, (count, total), scale, slack in cells:
            for sl, var in zip(model.slices, variances, strict=True):
                if var is None or count[sl].sum() <= 0:
                    continue
                mean = total[sl] / np.maximum(count[sl], 1e-12)
                cell = Evidence(count[sl], total[sl], count[sl] * (var + mean**2))
                logits = params.theta[sl] + scale * row[sl]
                bounded, count_raised, count_lowered = bound_logits(
                    cfg, logits, cell, slack, normalise=False, cap=single, temperature=model.temperature
                )
                raised += count_raised
                lowered += count_lowered
                row[sl] += (bounded - logits) / scale
        centred = centre(params, model)
        params.theta, params.offsets, params.weights = centred.theta, centred.offsets, centred.weights
        _clip(params, cfg.logit_bound)
        return raised, lowered


def centre(params: Params, model: Model) -> Params:
    """Every block with mean zero within each dimension."""
    out = params.copy()
    for sl in model.slices:
        out.theta[sl] -= out.theta[sl].mean()
        for o in out.offsets:
            if o.size:
                o[:, sl] -= o[:, sl].mean(axis=1, keepdims=True)
        if out.weights.size:
            out.weights[:, sl] -= out.weights[:, sl].mean(axis=1, keepdims=True)
    return out


def _clip(params: Params, bound: float) -> None:
    np.clip(params.theta, -bound, bound, out=params.theta)
    for o in params.offsets:
        np.clip(o, -bound, bound, out=o)
    np.clip(params.weights, -bound, bound, out=params.weights)


def _mean_kl(old: Array, new: Array, model: Model, weights: Array) -> float:
    """Weighted mean over contexts of Σ_d KL(old_d ‖ new_d), never below 0 (as ``kl_divergence``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(old > 0, old * (np.log(np.maximum(old, 1e-300)) - np.log(np.maximum(new, 1e-300))), 0.0)
    per_context = terms.sum(axis=1)
    return max(0.0, float((per_context * weights).sum() / weights.sum()))


HALVES = ("below", "above")
"""The evidence cells of a numeric feature: episodes below and above its centre."""


def _groups(model: Model) -> list[tuple[str, str, list[str]]]:
    """The evidence groups: (state key, feature, cell names), categorical features then numeric."""
    return [("segments", name, names) for name, names in zip(model.categorical, model.segments, strict=True)] + [
        ("halves", name, list(HALVES)) for name in model.numeric
    ]


def _segment_state(state: Mapping[str, Any] | None, model: Model, v: int) -> list[list[tuple[Array, Array]]]:
    """Per evidence group (:func:`_groups`) and cell: the discounted count and reward sum per value
    (none for a cell whose stored sums are unreadable, non-finite or have a negative count)."""
    out = []
    for key, name, names in _groups(model):
        feature = ((state or {}).get(key) or {}).get(name) or {}
        rows = []
        for seg in names:
            pair = feature.get(seg)
            try:
                count = np.asarray(pair[0], dtype=np.float64)
                total = np.asarray(pair[1], dtype=np.float64)
                if (
                    count.shape != (v,)
                    or total.shape != (v,)
                    or not (np.isfinite(count).all() and np.isfinite(total).all())
                    or (count < 0).any()  # discounted episodes, as Evidence.from_state requires
                ):
                    raise ValueError
            except (TypeError, ValueError, IndexError):
                count, total = np.zeros(v), np.zeros(v)
            rows.append((count, total))
        out.append(rows)
    return out


def _segment_state_out(segments: list[list[tuple[Array, Array]]], model: Model) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (key, name, names), rows in zip(_groups(model), segments, strict=True):
        out.setdefault(key, {})[name] = {
            cell: [[round(float(x), 4) for x in count], [round(float(x), 4) for x in total]]
            for cell, (count, total) in zip(names, rows, strict=True)
        }
    return out


def _add_evidence(
    cfg: LearnerConfig,
    evidence: Evidence,
    recent: Evidence,
    corrections: Array | None,
    segments: list[list[tuple[Array, Array]]],
    tallies: Tallies,
    model: Model,
    episodes: int,
) -> tuple[Evidence, Evidence | None, float, list[list[tuple[Array, Array]]], Array | None]:
    """Fade the state's evidence and add the batch's, globally and per cell (corrections shift
    reward sums only, as in the flat learner). The global evidence, and a numeric feature's
    halves (which together see every episode that carries it), fade by 2^(−N/H) for the batch's
    N episodes; a segment's by 2^(−n_c/H) for its own n_c, so that a segment with an eighth of
    the traffic keeps its evidence as long, in its own episodes, as the whole policy does. When
    the change test on the global evidence fires, the global state becomes the recent evidence
    and every cell is scaled by the share of the episodes it kept. ``corrections`` is the change
    test's C_a (:func:`~agent_learning.learning.reinforce.remember`), returned updated."""
    half_life = cfg.evidence_half_life
    batch = Evidence(tallies.regular.sum(axis=0), tallies.reward.sum(axis=0), tallies.reward_sq.sum(axis=0))
    new, recent_out, z, kept, corrections = remember(
        cfg, evidence, recent, batch, episodes, tallies.corrected, corrections
    )
    first = model.slices[0]  # one column per value of the first dimension: a cell's episodes sum over it
    out = []
    for f, rows in enumerate(segments):
        counts = tallies.by_segment(tallies.regular, f, len(rows))
        totals = tallies.by_segment(tallies.reward, f, len(rows))
        if f < len(model.categorical) and half_life:
            fades = 0.5 ** (counts[:, first].sum(axis=1) / half_life)
        else:
            fades = np.full(len(rows), fade(episodes, half_life))
        out.append(
            [(kept * (fades[k] * c + counts[k]), kept * (fades[k] * r + totals[k])) for k, (c, r) in enumerate(rows)]
        )
    return new, recent_out, z, out, corrections


def learn_structured(config: LearnerConfig, doc: PolicyDocument, rows: Rows) -> StructuredUpdate:
    """One update of a structured policy document on scored rows (the trainer's entry point)."""
    model, params, batch = prepare(doc, rows)
    _check(batch, model)
    new, metrics, state = StructuredReinforce(config).update(params, model, batch, doc.learner_state)
    state = {key: value for key, value in state.items() if key != PENDING_NUMBERS}
    if model.pending:
        state[PENDING_NUMBERS] = model.pending
    return StructuredUpdate(new.theta, features_out(doc, model, new), metrics, state)


def _check(batch: ContextBatch, model: Model) -> None:
    _first_bad("rewards", ~np.isfinite(batch.rewards), batch.rewards, "must be finite")
    p = batch.logged_probs
    _first_bad("logged_probs", ~((p > 0) & (p <= 1)), p, "must be in (0, 1]")
    for d, k in enumerate(model.layout.sizes):
        a = batch.actions[:, d]
        _first_bad(f"actions[:, {d}]", (a < 0) | (a >= k), a, f"must be a value index in [0, {k})")


__all__ = [
    "ContextBatch",
    "Model",
    "Params",
    "Rows",
    "StructuredReinforce",
    "StructuredUpdate",
    "gradient",
    "learn_structured",
    "surrogate",
]
