"""Off-policy evaluation: what a policy's mean reward would have been on the logged episodes.

Every episode logs μ_i, the probability with which its action a_i was drawn (exploration floor
included), so any other policy π can be evaluated on what already happened. Notation for n
logged episodes over K actions (for a structured policy K indexes joint configurations)::

    w_i = min(π(a_i | x_i) / μ_i, clip)               importance weight (clip = ∞ by default)

The estimators (Horvitz & Thompson 1952; Swaminathan & Joachims 2015; Dudík et al. 2011; the
shape of Open Bandit Pipeline's ``ope/estimators.py``) each give, per episode, a term ψ_i whose
mean is the estimate and whose spread is its standard error (the estimator's influence
function), so that every estimator gets its interval, and a *difference* of two policies on
the same episodes its paired interval, in one place (:func:`interval`)::

    IPS    ψ_i = w_i r_i
    SNIPS  ψ_i = V̂ + w_i (r_i − V̂) / w̄            V̂ = Σ w_i r_i / Σ w_i,  w̄ = Σ w_i / n
    DR     ψ_i = Σ_a π(a | x_i) q̂(g_i, a) + w_i (r_i − q̂(g_i, a_i))

Interval: V̂ ± t_{(1+c)/2, ESS−1} · sd(ψ) / √n, the normal approximation of the estimator
(delta method for SNIPS, whose ψ is its linearisation) with Student's t quantile at the
effective sample size's degrees of freedom, which widens it where few episodes carry the
weight. It is analytic rather than bootstrapped so that a candidate over 100,000 episodes is
evaluated in milliseconds. It assumes what the estimators assume (below) plus enough
effective samples for the central limit theorem; the effective sample size (Kish)
``(Σ w)² / Σ w²`` says how many episodes carry the estimate, and the publish guardrail does
not act on fewer than its ``min_effective_samples``. Coverage on simulated logs with known
truth, down to an effective sample size of 20 (a near-deterministic logging policy), is in
docs/evaluation.md (``benchmarks/evaluation.py``).

Assumptions shared by all three: μ_i is the true probability of a_i given what the logging
policy saw, π gives probability only where μ does (overlap), and rewards depend on the
context and action only (not on which policy chose). Clipping trades variance for a bias that
the interval does not include (downward for IPS with rewards ≥ 0; SNIPS and DR lean towards
what the logging policy chose), so a clipped interval may miss the truth; unclipped IPS is
unbiased, SNIPS and DR are consistent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, ClassVar, Literal, NamedTuple, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agent_learning.documents import (
    Candidate,
    Evaluation,
    Interval,
    Measures,
    MetricCheck,
    PolicyDocument,
    WeightDiagnostics,
)
from agent_learning.learning.columns import shared_rows
from agent_learning.policy.features import FeatureReader
from agent_learning.policy.softmax import (
    Layout,
    SoftmaxPolicy,
    context_key,
    dimension_probabilities,
    drawn_excluded,
    feature_logits,
    normaliser,
)

Array = NDArray[np.float64]

PROBABILITY_TOLERANCE = 1e-6
"""How far a row of target probabilities may sum from 1 (rounding in stored documents)."""


class Estimate(NamedTuple):
    """An estimated mean reward (or difference of two) with its confidence interval."""

    value: float
    low: float
    high: float
    effective_sample_size: float
    clipped_from: float | None = None
    """The estimator's own value when it lay outside the reward's range and ``value`` is cut to it."""
    diagnostics: Diagnostics | None = None
    """How far its importance weights let it be trusted (:func:`weight_diagnostics`)."""


RARE_EPISODES = 10.0
"""An action is *rarely logged* in a batch of n episodes when fewer than this many of them are expected to
take it: logged at μ < RARE_EPISODES / n."""
RARE_MASS_EXCESS = 0.1
"""How much more of its mass a target may put on rarely logged actions than their share of the log before
its estimate is unreliable — if fewer than :data:`RARE_EPISODES` episodes took them in all: those few would
carry it. With more, what the rarely logged actions earn is measured on enough episodes, and the interval's
spread carries the rest (a step towards actions the current version neglects, as after the world changed,
has them; on ``benchmarks/guardrail.py``, 20 seeds before it drew common random numbers, recovery after
the best action became the worst took 1.41× as long with the guardrail without this condition, 1.21×
with it; the coverage grid of ``benchmarks/evaluation.py --grid`` keeps its rule)."""
MEAN_WEIGHT_TOLERANCE = 0.1
"""How far the mean importance weight may be from 1 (its expectation: the target's total mass) before the
estimate is unreliable — if that is also more than :data:`MEAN_WEIGHT_Z` standard errors of it: the log
missed, or over-sampled, actions the target takes (SNIPS renormalises that away, and its interval does not
see it), beyond what the weights' own spread explains."""
MAX_WEIGHT_SHARE = 0.1
"""The share of all the weight one episode may carry before the estimate is unreliable: it rests on that
episode's action, logged too rarely for its reward to be known."""
MEAN_WEIGHT_Z = 3.0
"""Standard errors of the mean weight within which its distance from 1 is chance, not a missed action."""


class Diagnostics(NamedTuple):
    """An estimate's importance weights, summarised (:func:`weight_diagnostics`)."""

    max_weight: float
    mean_weight: float
    rare_mass: float
    """IPS estimate of the target's mass on rarely logged actions (:data:`RARE_EPISODES`)."""
    rare_logged: float
    """The share of episodes that took them."""
    mean_weight_se: float = 0.0
    """The standard error of ``mean_weight``."""
    episodes: int = 0

    @property
    def problem(self) -> str:
        """Why the estimate relies on rarely logged actions ("" when it does not)."""
        off = abs(self.mean_weight - 1)
        if off > MEAN_WEIGHT_TOLERANCE and off > MEAN_WEIGHT_Z * self.mean_weight_se:
            return f"mean importance weight {self.mean_weight:.3g}, not within {MEAN_WEIGHT_TOLERANCE:g} of 1"
        if self.max_weight > MAX_WEIGHT_SHARE * self.mean_weight * self.episodes:
            return (f"one episode carries {self.max_weight / (self.mean_weight * self.episodes):.0%} of the weight "
                    f"(largest weight {self.max_weight:.3g})")
        if self.rare_mass - self.rare_logged > RARE_MASS_EXCESS and self.rare_logged * self.episodes < RARE_EPISODES:
            return (f"{self.rare_mass:.0%} of the target's mass is on actions logged too rarely to judge "
                    f"({self.rare_logged:.0%} of the episodes; largest weight {self.max_weight:.3g})")
        return ""

    @property
    def reliable(self) -> bool:
        return not self.problem

    def document(self) -> WeightDiagnostics:
        """As stored in a run's :class:`~agent_learning.documents.Evaluation`."""
        return WeightDiagnostics(max_weight=self.max_weight, mean_weight=self.mean_weight, rare_mass=self.rare_mass,
                                 rare_logged=self.rare_logged, reliable=self.reliable)


def weight_diagnostics(w: Array, logged: Array) -> Diagnostics:
    """Largest and mean weight, and the target's mass on rarely logged actions against their share of the
    log. With the mean weight they flag what the effective sample size cannot: a target whose mass lies
    where the log rarely went has few or no episodes there, and the ones it has look ordinary."""
    rare = logged * len(w) < RARE_EPISODES
    top = float(w.max())
    se = top * float((w / top).std(ddof=1)) / math.sqrt(len(w)) if top > 0 and len(w) > 1 else 0.0
    return Diagnostics(top, float(w.mean()), float((w * rare).mean()), float(rare.mean()), se, len(w))


def reward_range(rewards: ArrayLike) -> tuple[float, float]:
    """The range a mean reward lies in: [0, 1], the scale of the judges, feedback and agents' own
    rewards, widened to any logged reward beyond it (penalties take a reward below 0)."""
    r = np.asarray(rewards, dtype=np.float64)
    return (min(0.0, float(r.min())), max(1.0, float(r.max()))) if r.size else (0.0, 1.0)


def difference_range(bounds: tuple[float, float]) -> tuple[float, float]:
    """The range of a difference of two means that each lie in ``bounds``."""
    width = bounds[1] - bounds[0]
    return -width, width


class NoOverlap(ValueError):
    """The target policy gives probability 0 to every logged action: nothing to estimate from."""


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Logs:
    """Logged episodes as validated arrays: action index, reward, logged probability μ, and
    an optional group per episode (segments of the context) for the doubly robust reward model."""

    actions: NDArray[np.int64]
    rewards: Array
    logged: Array
    groups: NDArray[np.int64]

    @classmethod
    def of(
        cls,
        actions: ArrayLike,
        rewards: ArrayLike,
        logged_probabilities: ArrayLike,
        n_actions: int,
        groups: ArrayLike | None = None,
    ) -> Logs:
        """Validate and convert; errors name the argument and the first bad entry."""
        a = _vector(actions, "actions")
        n = len(a)
        if n < 2:
            raise ValueError(f"actions: an estimate needs at least 2 logged episodes, got {n}")
        if not np.issubdtype(a.dtype, np.integer) and np.any(a != np.round(a)):
            raise ValueError("actions: must be integer action indices")
        a = a.astype(np.int64)
        _range_check(a, "actions", lambda v: (v >= 0) & (v < n_actions), f"is not an action index in [0, {n_actions})")
        r = _floats(rewards, "rewards", n)
        _range_check(r, "rewards", np.isfinite, "is not a finite number")
        mu = _floats(logged_probabilities, "logged_probabilities", n)
        _range_check(mu, "logged_probabilities", lambda v: (v > 0) & (v <= 1), "is not a probability in (0, 1]")
        if groups is None:
            g = np.zeros(n, dtype=np.int64)
        else:
            g = _vector(groups, "groups")
            if len(g) != n or not np.issubdtype(g.dtype, np.integer):
                raise ValueError(f"groups: needs one integer per episode ({n})")
            g = g.astype(np.int64)
            _range_check(g, "groups", lambda v: v >= 0, "is not a non-negative group index")
        return cls(a, r, mu, g)

    def __len__(self) -> int:
        return len(self.actions)


@dataclass(frozen=True)
class Target:
    """A target policy's probabilities on the logged episodes, stored compactly: ``table[u]``
    is the distribution over the K actions in context u and ``rows[i]`` the context of
    episode i (one context for a context-free policy; one per episode at worst). Built with
    :meth:`of_chosen` it holds only π(a_i | x_i), which is all IPS and SNIPS need."""

    table: Array | None
    rows: NDArray[np.int64]
    given: Array | None = None

    @classmethod
    def of(cls, target_probabilities: ArrayLike, n: int, n_actions: int | None = None) -> Target:
        """From an (n, K) array of probabilities, one row per logged episode."""
        p = np.asarray(target_probabilities, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != n or (n_actions is not None and p.shape[1] != n_actions):
            want = f"({n}, K)" if n_actions is None else f"({n}, {n_actions})"
            raise ValueError(f"target_probabilities: shape {p.shape}, expected {want}: one row per episode")
        return cls.of_table(p, np.arange(n))

    @classmethod
    def of_table(cls, table: ArrayLike, rows: ArrayLike) -> Target:
        """From distinct contexts' distributions and each episode's context index."""
        t = np.asarray(table, dtype=np.float64)
        bad = ~np.isfinite(t) | (t < 0) | (t > 1 + PROBABILITY_TOLERANCE)
        if bad.any():
            u, k = np.argwhere(bad)[0]
            raise ValueError(f"target_probabilities[{u}, {k}]: {t[u, k].item()!r} is not a probability")
        sums = t.sum(axis=1)
        off = np.abs(sums - 1) > PROBABILITY_TOLERANCE
        if off.any():
            u = int(np.argmax(off))
            raise ValueError(f"target_probabilities[{u}]: sums to {sums[u]:.6g}, not 1")
        return cls(t, np.asarray(rows, dtype=np.int64))

    @classmethod
    def of_chosen(cls, probabilities: ArrayLike) -> Target:
        """From π(a_i | x_i) of every logged episode alone."""
        p = np.asarray(probabilities, dtype=np.float64)
        _range_check(
            p, "target_probabilities", lambda v: (v >= 0) & (v <= 1 + PROBABILITY_TOLERANCE), "is not a probability"
        )
        return cls(None, np.arange(len(p)), p)

    def chosen(self, logs: Logs) -> Array:
        """π(a_i | x_i) of every logged episode."""
        if self.table is None:
            assert self.given is not None
            if len(self.given) != len(logs):
                n, m = len(logs), len(self.given)
                raise ValueError(f"target_probabilities: has {m} entries but there are {n} episodes")
            return self.given
        return self.table[self.rows, logs.actions]

    def every_action(self) -> Array:
        """The (contexts, K) table; only a target built from every action's probabilities has it."""
        if self.table is None:
            raise ValueError("target_probabilities: doubly robust needs the target's probability of every action")
        return self.table


# --------------------------------------------------------------------------- estimators


class Estimator(Protocol):
    """Per-episode terms ψ whose mean is the estimate of the target's mean reward."""

    name: str

    def terms(self, logs: Logs, target: Target) -> Array: ...


def weights(logs: Logs, target: Target, clip: float | None) -> Array:
    """w_i = min(π(a_i | x_i) / μ_i, clip)."""
    w = target.chosen(logs) / logs.logged
    return w if clip is None else np.minimum(w, clip)


def effective_sample_size(w: Array) -> float:
    """Kish's (Σ w)² / Σ w²: how many on-policy episodes the weighted ones are worth (taken on
    w / max w, which it does not change, so that a weight beyond 1e154 does not overflow its square)."""
    top = float(w.max())
    if not top > 0:
        return 0.0
    v = w / top
    return float(v.sum()) ** 2 / float((v * v).sum())


def _overlap(w: Array) -> None:
    if not w.sum() > 0:
        raise NoOverlap(
            "target_probabilities: the target gives probability 0 to every logged action; no episode speaks for it"
        )


@dataclass(frozen=True)
class IPS:
    """Inverse propensity scoring: the mean of w_i r_i. Unbiased for the target's mean reward
    when μ is the true logging probability and the target has overlap with it (and without
    clipping); its variance grows with the weights, and it is not invariant to shifting the
    rewards by a constant."""

    clip: float | None = None
    name: ClassVar[str] = "ips"

    def terms(self, logs: Logs, target: Target) -> Array:
        w = weights(logs, target, self.clip)
        _overlap(w)
        return w * logs.rewards


@dataclass(frozen=True)
class SNIPS:
    """Self-normalised IPS: Σ w_i r_i / Σ w_i. Consistent under IPS's assumptions, biased by
    O(1/n); bounded by the observed rewards and invariant to shifting them, so its variance is
    usually far below IPS's. The guardrail's estimator: it needs only π(a_i | x_i)."""

    clip: float | None = None
    name: ClassVar[str] = "snips"

    def terms(self, logs: Logs, target: Target) -> Array:
        w = weights(logs, target, self.clip)
        _overlap(w)
        value = float((w * logs.rewards).sum() / w.sum())
        return value + w * (logs.rewards - value) / w.mean()


@dataclass(frozen=True)
class DoublyRobust:
    """Doubly robust: a reward model's prediction for the target's choices, corrected by the
    importance-weighted residuals of the logged ones. Unbiased if either the logging
    probabilities or the reward model is right; with an informative model its variance is below
    IPS's. The model q̂(g, a) is the mean reward of action a in group g, shrunk towards the
    action's mean and that towards the overall mean by ``prior`` pseudo-episodes, cross-fitted:
    episodes at even positions are predicted by a model fitted on the odd ones and vice versa,
    so no episode's residual is taken against a model that saw it."""

    clip: float | None = None
    prior: float = 10.0
    name: ClassVar[str] = "dr"

    def terms(self, logs: Logs, target: Target) -> Array:
        table = target.every_action()
        w = weights(logs, target, self.clip)
        _overlap(w)
        k = table.shape[1]
        n_groups = int(logs.groups.max()) + 1
        fold = np.arange(len(logs)) % 2
        models = [self.reward_model(logs, fold == 1 - f, n_groups, k) for f in (0, 1)]
        q_logged = np.empty(len(logs))
        predicted = np.empty(len(logs))
        # Σ_a π(a|x) q̂(g, a) once per distinct (context, group, fold), not per episode.
        keys = (target.rows * n_groups + logs.groups) * 2 + fold
        unique, inverse = np.unique(keys, return_inverse=True)
        u, rest = np.divmod(unique, 2 * n_groups)
        g, f = np.divmod(rest, 2)
        expected = np.empty(len(unique))
        for side in (0, 1):
            on = f == side
            expected[on] = (table[u[on]] * models[side][g[on]]).sum(axis=1)
        predicted[:] = expected[inverse.reshape(-1)]
        for side in (0, 1):
            on = fold == side
            q_logged[on] = models[side][logs.groups[on], logs.actions[on]]
        return predicted + w * (logs.rewards - q_logged)

    def reward_model(self, logs: Logs, fit: NDArray[np.bool_], n_groups: int, k: int) -> Array:
        """q̂(g, a), (G, K), from the episodes selected by ``fit``."""
        a, g, r = logs.actions[fit], logs.groups[fit], logs.rewards[fit]
        overall = float(r.mean()) if len(r) else float(logs.rewards.mean())
        n_a = np.bincount(a, minlength=k)
        by_action = (np.bincount(a, weights=r, minlength=k) + self.prior * overall) / (n_a + self.prior)
        cell = g * k + a
        n_ga = np.bincount(cell, minlength=n_groups * k).reshape(n_groups, k)
        s_ga = np.bincount(cell, weights=r, minlength=n_groups * k).reshape(n_groups, k)
        return (s_ga + self.prior * by_action) / (n_ga + self.prior)


ESTIMATORS: dict[str, type[IPS] | type[SNIPS] | type[DoublyRobust]] = {
    "ips": IPS,
    "snips": SNIPS,
    "dr": DoublyRobust,
}


def estimator_named(name: str, clip: float | None = None) -> IPS | SNIPS | DoublyRobust:
    """The estimator called ``name`` (``ips``, ``snips`` or ``dr``) with weights clipped at ``clip``."""
    if name not in ESTIMATORS:
        raise ValueError(f"estimator: {name!r} is not one of {', '.join(ESTIMATORS)}")
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip: {clip!r} must be a positive number (or None: no clipping)")
    return ESTIMATORS[name](clip=clip)


def interval(
    terms: Array,
    effective: float,
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
    spread: float = 1.0,
) -> Estimate:
    """The mean of ``terms`` with its normal-approximation interval (module docstring).

    With ``bounds``, the range the estimated mean lies in, the value and the interval are cut to
    it (which keeps the coverage: the truth lies in it too), and the half-width is at least the
    Wilson score interval's at the edge of the range, ``spread · (high − low) · z² / (ESS + z²)``:
    a few effective samples that happen to agree (every reward 1) say little, not everything.
    ``spread`` (0 to 1) is the share of the range the terms span: 1 for one policy's mean; for a
    difference, :func:`weight_spread` (0 for identical policies, whose difference is exactly 0)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: {confidence!r} must be between 0 and 1")
    n = len(terms)
    value = float(terms.mean())
    scale = float(np.abs(terms).max())  # the spread of terms / scale: huge weights do not overflow its squares
    sd = scale * float((terms / scale).std(ddof=1)) if scale > 0 else 0.0
    half = t_quantile(0.5 + confidence / 2, max(effective - 1, 1.0)) * sd / math.sqrt(n)
    if bounds is None:
        return Estimate(value, value - half, value + half, effective)
    low, high = bounds
    z2 = NormalDist().inv_cdf(0.5 + confidence / 2) ** 2
    half = max(half, spread * (high - low) * z2 / (effective + z2))
    cut = min(max(value, low), high)
    return Estimate(cut, max(cut - half, low), min(cut + half, high), effective, None if cut == value else value)


def weight_spread(w_a: Array, w_b: Array) -> float:
    """How far apart two policies' importance weights are, from 0 (the same policy) to 1 (disjoint
    on every episode): mean |w_a − w_b| / (mean w_a + mean w_b), the share of a difference's range
    its terms span."""
    total = float(w_a.mean() + w_b.mean())
    return min(float(np.abs(w_a - w_b).mean()) / total, 1.0) if total > 0 else 1.0


EXACT_T_BELOW = 30
"""Degrees of freedom below which :func:`t_quantile` is exact (at ⌊df⌋); from there the expansion is
within 1e-4 of it up to p = 0.99995."""


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: below :data:`EXACT_T_BELOW` degrees of freedom exact at ⌊df⌋ (rounding
    the interval wider), by bisection on the closed form of the distribution (Abramowitz & Stegun
    26.7.3–4), else the Cornish–Fisher expansion in 1/df (26.7.5)."""
    if df < EXACT_T_BELOW:
        return _exact_t_quantile(p, max(math.floor(df), 1))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def _exact_t_quantile(p: float, df: int) -> float:
    """The t quantile at an integer ``df``: the angle θ = atan(t / √df) at which P(|T| ≤ t), a
    finite series in cos θ, reaches |2p − 1|, found by bisection."""
    if p == 0.5:
        return 0.0
    goal = abs(2 * p - 1)
    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        theta = (lo + hi) / 2
        c2, s = math.cos(theta) ** 2, math.sin(theta)
        term = total = 1.0
        if df % 2:  # odd: (2/π)(θ + sin θ cos θ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + …))
            for j in range(1, (df - 1) // 2):
                term *= c2 * 2 * j / (2 * j + 1)
                total += term
            covered = 2 / math.pi * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
        else:  # even: sin θ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + …)
            for j in range(1, df // 2):
                term *= c2 * (2 * j - 1) / (2 * j)
                total += term
            covered = s * total
        lo, hi = (theta, hi) if covered < goal else (lo, theta)
    t = math.sqrt(df) * math.tan((lo + hi) / 2)
    return t if p > 0.5 else -t


def estimate(
    actions: ArrayLike,
    rewards: ArrayLike,
    logged_probabilities: ArrayLike,
    target_probabilities: ArrayLike,
    *,
    estimator: str = "snips",
    confidence: float = 0.95,
    clip: float | None = None,
    groups: ArrayLike | None = None,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """The target policy's mean reward on logged episodes, with a ``confidence`` interval.

    ``actions`` are integer indices into the columns of ``target_probabilities``, an (n, K)
    array of the target's probabilities for every action on each logged episode;
    ``logged_probabilities`` the probability with which each logged action was drawn.
    ``estimator`` is ``"ips"``, ``"snips"`` or ``"dr"`` (whose reward model is fitted per
    action and, if given, per ``groups`` index); ``clip`` caps the importance weights;
    ``bounds``, the range the mean reward lies in (e.g. ``(0, 1)``), cuts the estimate and its
    interval to it and keeps a few agreeing samples from giving a zero-width interval.
    """
    try:
        table = np.asarray(target_probabilities, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"target_probabilities: not an array of numbers ({exc})") from None
    if table.ndim != 2:
        raise ValueError(f"target_probabilities: shape {table.shape}, expected (n, K): one row per episode")
    k = table.shape[1]
    logs = Logs.of(actions, rewards, logged_probabilities, k, groups)
    if bounds is not None and not (len(bounds) == 2 and all(map(math.isfinite, bounds)) and bounds[0] < bounds[1]):
        raise ValueError(f"bounds: {bounds!r} must be (low, high), two finite numbers with low < high")
    return evaluate(logs, Target.of(table, len(logs), k), estimator_named(estimator, clip), confidence, bounds)


def evaluate(
    logs: Logs,
    target: Target,
    estimator: Estimator,
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """:func:`estimate` on validated inputs (``bounds``: see :func:`interval`), with its diagnostics."""
    w = weights(logs, target, getattr(estimator, "clip", None))
    found = interval(estimator.terms(logs, target), effective_sample_size(w), confidence, bounds)
    return found._replace(diagnostics=weight_diagnostics(w, logs.logged))


def compare(
    logs: Logs,
    candidate: Target,
    current: Target,
    estimator: Estimator,
    confidence: float = 0.95,
    bounds: tuple[float, float] | None = None,
) -> tuple[Estimate, Estimate, Estimate]:
    """The candidate's and the current policy's estimates and their paired difference
    (candidate − current, whose interval is narrower than either's when they choose alike, with
    the candidate's diagnostics); with ``bounds``, the range of a mean, each cut to its range
    (:func:`interval`)."""
    cand_terms, cur_terms, w_cand, w_cur = _paired(logs, candidate, current, estimator)
    cand_diag = weight_diagnostics(w_cand, logs.logged)
    return (
        interval(cand_terms, effective_sample_size(w_cand), confidence, bounds)._replace(diagnostics=cand_diag),
        interval(cur_terms, effective_sample_size(w_cur), confidence, bounds)._replace(
            diagnostics=weight_diagnostics(w_cur, logs.logged)
        ),
        _difference(cand_terms, cur_terms, w_cand, w_cur, confidence, bounds)._replace(diagnostics=cand_diag),
    )


def difference(logs: Logs, candidate: Target, current: Target, estimator: Estimator, confidence: float = 0.95,
               bounds: tuple[float, float] | None = None) -> Estimate:
    """:func:`compare`'s paired difference alone, without either policy's own estimate or diagnostics
    (what the guardrail's check of each segment reads)."""
    return _difference(*_paired(logs, candidate, current, estimator), confidence, bounds)


def _paired(logs: Logs, candidate: Target, current: Target, estimator: Estimator) -> tuple[Array, Array, Array, Array]:
    """Each policy's terms of ``estimator`` and importance weights on ``logs``."""
    cand_terms = estimator.terms(logs, candidate)
    cur_terms = estimator.terms(logs, current)
    clip = getattr(estimator, "clip", None)
    return cand_terms, cur_terms, weights(logs, candidate, clip), weights(logs, current, clip)


def _difference(cand_terms: Array, cur_terms: Array, w_cand: Array, w_cur: Array, confidence: float,
                bounds: tuple[float, float] | None) -> Estimate:
    ess = min(effective_sample_size(w_cand), effective_sample_size(w_cur))
    apart = difference_range(bounds) if bounds is not None else None
    return interval(cand_terms - cur_terms, ess, confidence, apart, weight_spread(w_cand, w_cur))


# --------------------------------------------------------------------------- the publish guardrail


LATENCY, TOOL_FAILURES, TOKENS, JUDGE_TOKENS = "latency_ms", "tool_failure_rate", "tokens", "judge_tokens"
METRICS = (LATENCY, TOOL_FAILURES, TOKENS, JUDGE_TOKENS)
"""Guardrail metrics, per episode: latency, whether a tool call failed (0/1), the agent's model tokens and the
judges' tokens (:class:`~agent_learning.documents.Measures`)."""
METRIC_RANGES = {LATENCY: (0.0, math.inf), TOOL_FAILURES: (0.0, 1.0), TOKENS: (0.0, math.inf),
                 JUDGE_TOKENS: (0.0, math.inf)}
"""The values each metric can take: the interval of one policy's mean is cut to them (a rate's lower bound
never reads below 0), which keeps its coverage, since the mean lies in them too."""


def metric_values(measures: Sequence[Measures | None]) -> dict[str, Array]:
    """Each guardrail metric of every episode (NaN where its score does not say)."""
    nan = math.nan
    rows = [
        (
            m.latency_ms,
            float(m.tool_failures > 0),
            nan if m.tokens is None else m.tokens,
            nan if m.judge_tokens is None else m.judge_tokens,
        )
        if m is not None
        else (nan, nan, nan, nan)
        for m in measures
    ]
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(METRICS))
    return {name: table[:, i] for i, name in enumerate(METRICS)}


def compare_metric(
    name: str, values: Array, logged: Array, candidate: Array, current: Array, confidence: float
) -> tuple[Estimate, Estimate, Estimate] | None:
    """SNIPS estimates of metric ``name``'s mean under the candidate and the current version (their
    intervals within :data:`METRIC_RANGES`), and their paired difference (candidate − current), from
    the episodes that record it (None with fewer than two)."""
    known = np.isfinite(values)
    if known.sum() < 2:
        return None
    logs = Logs.of(np.zeros(int(known.sum()), dtype=np.int64), values[known], logged[known], 1)
    try:
        cand, cur, diff = compare(
            logs, Target.of_chosen(candidate[known]), Target.of_chosen(current[known]), SNIPS(), confidence
        )
    except NoOverlap:
        return None
    low, high = METRIC_RANGES[name]
    cand, cur = (e._replace(low=max(e.low, low), high=min(e.high, high)) for e in (cand, cur))
    return cand, cur, diff


@dataclass(frozen=True)
class GuardrailConfig:
    """Whether a trained candidate is published (``AGENT_LEARNING_GUARDRAIL`` and friends)."""

    mode: Literal["off", "warn", "enforce"] = "enforce"
    """enforce: a candidate confidently worse than the current version is held, not published; warn: it is
    published with a warning; off: candidates are not evaluated."""
    margin: float = 0.01
    """Reward a candidate may lose and still be published: it is held when the upper bound of candidate −
    current is below −margin. Above 0 so that a converged policy's exploration (the evidence bound lifting
    a neglected action, worth thousandths of reward) is not held as a loss: at 0, 9% of the updates of a
    converged K=4 problem were held for differences of 1e-5 (docs/benchmarks.md)."""
    confidence: float = 0.95
    """Two-sided confidence of the intervals: a candidate no worse than the current version is held at most
    (1 − confidence)/2 of the time."""
    min_effective_samples: float = 30.0
    """Effective samples a candidate's estimate needs to be evaluable: with fewer, its step is shrunk towards
    the current version until it has them, or it is held (a confident loss or budget breach is held at any
    number)."""
    min_effective_share: float = 0.5
    """The share of the batch's episodes whose effective samples a candidate's estimate needs to be evaluable:
    the trust region on the probability ratio (the effective share is 1 / E_μ[w²], so a candidate may not put
    more than a χ² divergence of 1/share − 1 between itself and what the log chose). A healthy step keeps
    above 0.8; a step ten times too large falls below it and is shrunk."""
    safe_confidence: float | None = 0.9
    """One-sided confidence with which a published step is shown to lose no more than ``margin`` (the lower
    bound of candidate − current at this confidence at least −margin, as safe policy improvement asks); a
    candidate not shown so is shrunk towards the current version until it is. Above 0.5 so that a step
    truly worse by more than the margin is published whole at most 1 − safe_confidence of the time; the
    higher, the slower healthy learning (docs/benchmarks.md: Guardrail benchmark). None: a step is
    published unless it is confidently worse."""
    budget_latency_ms: float | None = None
    """Mean latency per episode, in milliseconds, that a candidate may not confidently exceed (None: no budget)."""
    budget_tool_failure_rate: float | None = None
    """Share of episodes with a failed tool call that a candidate may not confidently exceed (None: no budget)."""
    budget_tokens: float | None = None
    """Mean model tokens per episode (the agent's, prompt + completion) that a candidate may not confidently exceed
    (None: no budget)."""

    @property
    def budgets(self) -> dict[str, float]:
        """Guardrail metric → its budget, for the budgets that are set."""
        given = {
            LATENCY: self.budget_latency_ms,
            TOOL_FAILURES: self.budget_tool_failure_rate,
            TOKENS: self.budget_tokens,
        }
        return {name: value for name, value in given.items() if value is not None}

    def __post_init__(self) -> None:
        for name, value in self.budgets.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"budget of {name}: {value!r} must be a positive number")
        if self.mode not in ("off", "warn", "enforce"):
            raise ValueError(f"mode: {self.mode!r} is not one of off, warn, enforce")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin: {self.margin!r} must be a non-negative number")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence: {self.confidence!r} must be between 0 and 1")
        if not (math.isfinite(self.min_effective_samples) and self.min_effective_samples >= 2):
            raise ValueError(f"min_effective_samples: {self.min_effective_samples!r} must be at least 2")
        if not 0 <= self.min_effective_share <= 1:
            raise ValueError(f"min_effective_share: {self.min_effective_share!r} must be between 0 and 1")
        if self.safe_confidence is not None and not 0.5 <= self.safe_confidence < 1:
            raise ValueError(f"safe_confidence: {self.safe_confidence!r} must be at least 0.5 and below 1")


class ContextGroups:
    """A batch's rows grouped by their contexts as far as some features tell them apart, found once
    per set of feature names and kept: a review computes the probabilities of one batch under up to
    a dozen documents of the same features. Rows that share context objects (the scores the trainer
    reads do: :func:`~agent_learning.learning.columns.shared_rows`) are keyed once per object."""

    def __init__(self, contexts: Sequence[Mapping[str, Any] | None]) -> None:
        self.contexts = contexts
        self._shared = shared_rows(contexts)
        self._found: dict[tuple[str, ...], tuple[list[Mapping[str, Any] | None], NDArray[np.int64]]] = {}

    def of(self, names: Sequence[str]) -> tuple[list[Mapping[str, Any] | None], NDArray[np.int64]]:
        """The distinct contexts by the features ``names`` (:func:`context_key`), in the order first
        seen, and each row's index among them."""
        key = tuple(names)
        if key not in self._found:
            objects, spread = (self.contexts, None) if self._shared is None else self._shared
            keys: dict[tuple[Any, ...], int] = {}
            first: list[Mapping[str, Any] | None] = []
            rows = np.empty(len(objects), dtype=np.int64)
            for i, context in enumerate(objects):
                u = keys.setdefault(context_key(context, names), len(first))
                if u == len(first):
                    first.append(context)
                rows[i] = u
            self._found[key] = (first, rows if spread is None else rows[spread])
        return self._found[key]


def chosen_probabilities(
    doc: PolicyDocument,
    actions: Sequence[Any],
    contexts: Sequence[Mapping[str, Any] | None],
    candidates: Sequence[Sequence[Candidate] | None] | None = None,
    groups: ContextGroups | None = None,
) -> Array:
    """π(a_i | x_i) under ``doc``, exploration floor included: the probability an agent choosing
    from it would have given each logged action (its value index per dimension: a flat list's
    action index as one dimension) in its context; for a row with ``candidates`` (the actions its
    request offered, its action given as a position among them), π(a_i | x_i, C_i). ``groups``:
    the contexts' :class:`ContextGroups`, kept by a caller that asks for several documents."""
    if not len(actions):
        return np.zeros(0)
    if candidates is not None and any(candidates):
        policy = SoftmaxPolicy(doc)
        own = [i for i, c in enumerate(candidates) if not c]
        out = np.zeros(len(actions))
        if own:
            out[own] = chosen_probabilities(doc, [actions[i] for i in own], [contexts[i] for i in own])
        for i, offered in enumerate(candidates):
            if offered:
                j = int(np.asarray(actions[i]).reshape(-1)[0])
                out[i] = policy.probability(offered[j].id, contexts[i], offered)
        return out
    # Once per distinct context (the features the document knows), then gathered per episode.
    first, rows = (groups or ContextGroups(contexts)).of([f.name for f in doc.features or []])
    layout = Layout.of(doc)
    excluded = drawn_excluded(doc)
    table, z = [], []
    for context in first:
        probs = dimension_probabilities(feature_logits(doc, context), layout, doc.temperature, doc.exploration_floor)
        table.append([p for dim in probs for p in dim])
        z.append(normaliser(probs, excluded))
    values = np.asarray(table, dtype=np.float64)
    local = np.asarray(actions, dtype=np.int64).reshape(len(contexts), len(layout.sizes))
    chosen = np.prod(values[rows[:, None], local + np.asarray(layout.starts)], axis=1) / np.asarray(z)[rows]
    if excluded:
        radix = np.cumprod((*layout.sizes[1:], 1)[::-1])[::-1]  # mixed radix of the joint index
        blocked = np.isin(local @ radix, np.asarray(excluded, dtype=np.int64) @ radix)
        chosen[blocked] = 0.0
    return chosen


SHRINK_BISECTIONS = 8
"""Bisections of the search for the largest share of its step (:func:`toward`) at which a candidate that is
not evaluable is evaluable and passes: to within 1/256 of it; one that passes at no share of 1/256 or more
is held. (A saturated step — logits far beyond the exploration floor — changes the policy little until it
is shrunk a long way, so halving a few times is not enough.)"""


SHRUNK_SHARE = 0.75
"""The share of the largest step that passes the bisection (:data:`SHRINK_BISECTIONS`) that is published: that step
is the one of several whose estimate happened to pass, so its estimate is likely to flatter it, and a step just
inside the margin by its estimate is often just outside it in truth. (A step confidently better than the current
version is published as it passed.) On ``benchmarks/guardrail.py`` (20 seeds, before it drew common random
numbers) a step ten times too large was held or shrunk to within the margin 69% of the time at 1, 92% at 0.75
and 96% at 0.5, and recovery after the best action became the worst took 1.38×, 1.41× and 1.68× as long as
without the guardrail; with :data:`RARE_MASS_EXCESS` asking for fewer than :data:`RARE_EPISODES` episodes behind
the rare mass, 94% and 1.21× at 0.75, 88% and 1.40× at 0.85 (docs/benchmarks.md: The guardrail benchmark)."""


def toward(current: PolicyDocument, candidate: PolicyDocument, step: float) -> PolicyDocument:
    """``candidate`` with its step shrunk to ``step`` (0: the current version, 1: the candidate): every
    parameter interpolated, θ_s = θ_cur + s (θ_cand − θ_cur) — the logits, each segment's offsets and each
    numeric feature's weights (a parameter one of them lacks counts as 0; a feature's center and scale are
    the candidate's, set once before it has weights, so they agree wherever both have weights).

    Every context's logits are linear in these parameters, so they interpolate the same way, ℓ_s = ℓ_cur
    + s Δℓ, for the flat policy and for each dimension of a structured one (a joint configuration's logit
    is the sum of its values'), and the log probability ratio is log π_s(a|x) / π_cur(a|x) = s (Δℓ_a − E_u
    Δℓ) / T for a softmax u between the two: the ratio lies within exp(± s (max Δℓ − min Δℓ) / T), a trust
    region that shrinks with s; the exploration floor mixes both with the same uniform distribution, which
    only brings the ratio nearer 1. Mixing the two versions' probabilities instead is exact for a flat
    policy but is no structured policy: a mixture of factorised (or contextual) distributions is not one."""
    def mix(new: Sequence[float] | None, old: Sequence[float] | None, k: int) -> list[float]:
        # an action the current version lacks (one a request offered, which the candidate added) has 0
        a, b = (np.zeros(k) if v is None else np.pad(np.asarray(v, dtype=np.float64), (0, k - len(v)))
                for v in (new, old))
        return [float(x) for x in b + step * (a - b)]

    def mix_weights(new: Mapping[str, float], old: Mapping[str, float]) -> dict[str, float]:
        return {v: float(old.get(v, 0.0) + step * (new.get(v, 0.0) - old.get(v, 0.0))) for v in {**old, **new}}

    k = len(candidate.logits)
    features = None
    if candidate.features is not None or current.features is not None:
        before = {f.name: f for f in current.features or []}
        features = []
        for f in candidate.features or []:
            old = before.get(f.name)
            if f.segmented:
                segs, old_segs = f.segments or {}, (old.segments or {}) if old is not None else {}
                mixed = {name: mix(segs.get(name), old_segs.get(name), k) for name in {**old_segs, **segs}}
                features.append(f.model_copy(update={"segments": mixed or None}))
            elif f.weights is not None:
                features.append(f.model_copy(update={"weights": mix(f.weights, old.weights if old else None, k)}))
            else:
                features.append(f)
    action_features = None
    if candidate.action_features is not None:
        before_a = {f.name: f for f in current.action_features or []}
        action_features = []
        for f in candidate.action_features:
            old_f = before_a.get(f.name)
            weights = mix_weights(f.weights, old_f.weights if old_f else {})
            new_ctx, old_ctx = f.by_context or {}, (old_f.by_context or {}) if old_f else {}
            by_context = {
                name: {seg: {v: x for v, x in mix_weights(new_ctx.get(name, {}).get(seg, {}),
                                                          old_ctx.get(name, {}).get(seg, {})).items() if v in weights}
                       for seg in {**old_ctx.get(name, {}), **new_ctx.get(name, {})}}
                for name in {**old_ctx, **new_ctx}
            }
            action_features.append(f.model_copy(update={"weights": weights, "by_context": by_context or None}))
    return candidate.model_copy(
        update={"logits": mix(candidate.logits, current.logits, k), "features": features,
                "action_features": action_features}
    )


@dataclass(frozen=True)
class SegmentRows:
    """Each episode's segment (for a contextual policy: its category features' segments, as the policy
    names them, ``"tier=gold, region=eu"``) as the distinct labels, in the order first seen, and the
    rows of each, in order."""

    labels: list[str]
    rows: list[NDArray[np.int64]]
    episodes: int

    @classmethod
    def of(cls, labels: Sequence[str]) -> SegmentRows:
        """The segments of episodes labelled ``labels``."""
        index: dict[str, int] = {}
        codes = np.fromiter((index.setdefault(label, len(index)) for label in labels), dtype=np.int64,
                            count=len(labels))
        return cls.coded(list(index), codes)

    @classmethod
    def coded(cls, labels: list[str], codes: NDArray[np.int64]) -> SegmentRows:
        """The segments of episodes whose labels are ``labels[codes]``, each label used."""
        order = np.argsort(codes, kind="stable")  # stable: each segment's rows in their order
        counts = np.bincount(codes, minlength=len(labels)).tolist()
        ends = np.cumsum(counts, dtype=np.int64).tolist()
        return cls(labels, [order[end - k:end] for k, end in zip(counts, ends, strict=True)], len(codes))


def segment_rows(doc: PolicyDocument, contexts: Sequence[Mapping[str, Any] | None],
                 groups: ContextGroups | None = None) -> SegmentRows | None:
    """Each episode's segment for a contextual policy — its category features' segments, as the policy
    names them (``"tier=gold, region=eu"``) — as :class:`SegmentRows`, each label written once per
    distinct context; None for a policy without category features."""
    readers = [FeatureReader(f) for f in doc.features or [] if f.segmented]
    if not readers:
        return None
    first, rows = (groups or ContextGroups(contexts)).of([r.name for r in readers])
    index: dict[str, int] = {}
    codes = np.array([
        index.setdefault(", ".join(f"{r.name}={r.segment(c[r.name])}" if c and r.name in c else f"{r.name}=(none)"
                                   for r in readers), len(index))
        for c in first
    ], dtype=np.int64)
    return SegmentRows.coded(list(index), codes[rows])


def review(
    config: GuardrailConfig,
    current: PolicyDocument,
    candidate: PolicyDocument,
    actions: Sequence[Any],
    rewards: Sequence[float],
    logged: Sequence[float],
    contexts: Sequence[Mapping[str, Any] | None],
    measures: Sequence[Measures | None] | None = None,
    candidates: Sequence[Sequence[Candidate] | None] | None = None,
) -> tuple[Evaluation, PolicyDocument] | None:
    """The guardrail's evaluation of ``candidate`` against ``current`` on logged episodes
    (:func:`judge`) and the document to publish if it is not held: the candidate, or — when it is not
    evaluable or not shown safe (``safe_confidence``) and not confidently worse — the largest share of
    its step (:func:`toward`, :data:`SHRINK_BISECTIONS`) whose estimate is evaluable and passes, times
    :data:`SHRUNK_SHARE` unless that step is confidently better (verdict ``shrunk``). Held when no share
    of 1/256 or more passes, or when a smaller share is confidently worse or over budget. ``None`` when
    the guardrail is off."""
    if config.mode == "off":
        return None
    metrics = metric_values(measures) if measures is not None and config.budgets else None
    groups = ContextGroups(contexts)  # the rows' distinct contexts, found once for every document judged
    segments = segment_rows(candidate, contexts, groups)
    p_cur = chosen_probabilities(current, actions, contexts, candidates, groups)

    def verdict(doc: PolicyDocument) -> tuple[Evaluation, str]:
        return _judge(config, rewards, logged, chosen_probabilities(doc, actions, contexts, candidates, groups), p_cur,
                      metrics, segments)

    evaluation, unevaluable = verdict(candidate)
    if not unevaluable or config.mode != "enforce":
        return evaluation, candidate
    low, high, best = 0.0, 1.0, None
    for _ in range(SHRINK_BISECTIONS):
        step = (low + high) / 2
        shrunk = toward(current, candidate, step)
        found, why = verdict(shrunk)
        if found.verdict == "published":
            low, best = step, (found, shrunk)
        elif not why:  # confidently worse (or over budget) even at a smaller step: held, nothing of it published
            reason = f"at {step:.3g} of its step (as trained, {unevaluable}) {found.reason}"
            return found.model_copy(update={"reason": reason[:4000]}), candidate
        else:
            high = step
    if best is None:
        return evaluation, candidate
    found, shrunk = best
    assert found.difference is not None
    if found.difference.low <= 0:  # not confidently better: the step that passed may be flattered by its estimate
        safer = toward(current, candidate, low * SHRUNK_SHARE)
        again, _ = verdict(safer)
        if again.verdict == "published":
            low, found, shrunk = low * SHRUNK_SHARE, again, safer
    reason = f"shrunk to {low:.3g} of its step (as trained, {unevaluable}); {found.reason}"
    return found.model_copy(update={"verdict": "shrunk", "reason": reason[:4000], "step": low}), shrunk


def judge(
    config: GuardrailConfig,
    rewards: ArrayLike,
    logged: ArrayLike,
    candidate: ArrayLike,
    current: ArrayLike,
    metrics: Mapping[str, Array] | None = None,
    segments: Sequence[str] | None = None,
) -> Evaluation:
    """The verdict on a candidate from each logged episode's reward, logged probability and
    probability under the candidate and under the current version. SNIPS, paired: the
    difference candidate − current is estimated on the same episodes, so what they choose alike
    cancels. ``held`` (``warned`` in warn mode), at any number of episodes (the intervals keep a
    minimum width on few effective samples, :func:`interval`), when

    - the difference's upper bound is below −margin (confidently worse);
    - a guardrail metric with a budget (``metrics``: per metric, its value on each episode, NaN
      where unknown) is confidently over it — its lower bound above the budget — and confidently
      above the current version on it — the paired difference's lower bound above 0 (so a
      candidate that moves towards the budget, or keeps to the current version's, is not held
      for it);
    - on a segment (``segments``: each episode's, for a contextual policy) with at least
      ``min_effective_samples`` effective samples, the difference's upper bound is below −margin
      at the confidence shared among those segments (Bonferroni): a segment never regresses;
    - or the estimate is not evaluable: fewer effective samples than ``min_effective_samples``
      or than ``min_effective_share`` of the episodes, or weights that rely on rarely logged
      actions (:class:`Diagnostics`); or it is not shown safe: the difference's lower bound at
      ``safe_confidence`` (one-sided) below −margin. :func:`review` then shrinks the candidate's
      step until it is both.

    Otherwise ``published``."""
    return _judge(config, rewards, logged, candidate, current, metrics, segments)[0]


def _judge(
    config: GuardrailConfig,
    rewards: ArrayLike,
    logged: ArrayLike,
    candidate: ArrayLike,
    current: ArrayLike,
    metrics: Mapping[str, Array] | None,
    segments: Sequence[str] | SegmentRows | None,
) -> tuple[Evaluation, str]:
    """:func:`judge`'s evaluation and, when it is held only because it is not evaluable, why not ("" else)."""
    est = SNIPS()
    r = np.asarray(rewards, dtype=np.float64)
    common = {"estimator": est.name, "confidence": config.confidence, "margin": config.margin, "episodes": len(r)}
    stop = "held" if config.mode == "enforce" else "warned"
    if len(r) < 2:
        why = "fewer than 2 episodes to evaluate on"
        return Evaluation(verdict=stop, reason=f"not evaluable: {why}", effective_sample_size=float(len(r)),
                          **common), why
    # Only π(a_i | x_i) enters SNIPS: every episode is given action 0 of a one-action log.
    logs = Logs.of(np.zeros(len(r), dtype=np.int64), r, logged, 1)
    cand_p, cur_p = Target.of_chosen(candidate), Target.of_chosen(current)
    bounds = reward_range(r)
    try:
        cand, cur, diff = compare(logs, cand_p, cur_p, est, config.confidence, bounds)
    except NoOverlap:
        why = "no logged episode has a positive probability under both versions"
        return Evaluation(verdict=stop, reason=f"not evaluable: {why}", effective_sample_size=0.0, **common), why
    ess = diff.effective_sample_size
    diag = cand.diagnostics
    assert diag is not None
    figures = {"candidate": _interval(cand), "current": _interval(cur), "difference": _interval(diff),
               "diagnostics": diag.document()}
    change = f"{diff.value:+.4g} reward ({percent(config.confidence)} interval {diff.low:+.4g} to {diff.high:+.4g})"
    checks: dict[str, MetricCheck] = {}
    mu, p_cand, p_cur = (np.asarray(x, dtype=np.float64) for x in (logged, candidate, current))
    for name, budget in config.budgets.items():
        found = (
            None
            if metrics is None or name not in metrics
            else compare_metric(name, metrics[name], mu, p_cand, p_cur, config.confidence)
        )
        if found is not None:
            c, k, d = found
            checks[name] = MetricCheck(
                budget=budget, candidate=_interval(c), current=_interval(k), over=c.low > budget and d.low > 0
            )
    over = [
        f"{name} {c.candidate.value:.4g} (lower bound {c.candidate.low:.4g}, current {c.current.value:.4g}) "
        f"over its budget {c.budget:g}"
        for name, c in checks.items()
        if c.over
    ]
    unevaluable = ""
    if ess < config.min_effective_samples:
        unevaluable = f"{ess:.0f} effective samples, fewer than the {config.min_effective_samples:g} needed to judge"
    elif ess < config.min_effective_share * len(r):
        unevaluable = (f"{ess:.0f} effective samples of {len(r)} episodes, fewer than the share "
                       f"{config.min_effective_share:g} its step may leave (the trust region)")
    elif not diag.reliable:
        unevaluable = f"unreliable: {diag.problem}"
    elif config.safe_confidence is not None:
        safe = compare(logs, cand_p, cur_p, est, 2 * config.safe_confidence - 1, bounds)[2]
        if safe.low < -config.margin:
            unevaluable = (f"not shown to lose less than the margin {config.margin:g} "
                           f"({percent(config.safe_confidence)} lower bound {safe.low:+.4g})")
    why = ""
    if diff.high < -config.margin:
        verdict = stop
        reason = f"confidently worse than the current version by more than the margin {config.margin:g}: {change}"
    elif over:
        verdict = stop
        reason = "confidently over budget: " + "; ".join(over)
    elif lost := segment_losses(config, logs, cand_p, cur_p, bounds, segments):
        verdict = stop
        reason = "confidently worse on a segment by more than the margin: " + "; ".join(lost)
    elif unevaluable:
        verdict, why = stop, unevaluable
        reason = f"not evaluable: {unevaluable}: {change}"
    else:
        verdict = "published"
        reason = f"not confidently worse than the current version by more than the margin {config.margin:g}: {change}"
    evaluation = Evaluation(verdict=verdict, reason=reason[:4000], effective_sample_size=ess, metrics=checks or None,
                            **figures, **common)
    return evaluation, why


def segment_losses(
    config: GuardrailConfig,
    logs: Logs,
    candidate: Target,
    current: Target,
    bounds: tuple[float, float],
    segments: Sequence[str] | SegmentRows | None,
) -> list[str]:
    """The segments on which the candidate is confidently worse than the current version by more than the
    margin, among those with at least ``min_effective_samples`` effective samples, each at confidence
    1 − (1 − confidence) / (their number), so that a sound candidate is held on some segment no more often
    than on the whole batch."""
    if segments is None:
        return []
    if not isinstance(segments, SegmentRows):
        segments = SegmentRows.of(segments)
    if segments.episodes != len(logs):
        raise ValueError(f"segments: has {segments.episodes} entries but there are {len(logs)} episodes")
    p_cand, p_cur = candidate.chosen(logs), current.chosen(logs)
    w_cand, w_cur = p_cand / logs.logged, p_cur / logs.logged
    eligible = []
    for label, on in zip(segments.labels, segments.rows, strict=True):
        if len(on) >= 2 and min(effective_sample_size(w_cand[on]), effective_sample_size(w_cur[on])) >= (
            config.min_effective_samples
        ):
            eligible.append((label, on))
    if len(eligible) < 2:
        return []  # one segment is the whole batch, judged already
    confidence = 1 - (1 - config.confidence) / len(eligible)
    lost = []
    for label, on in eligible:
        part = Logs(logs.actions[on], logs.rewards[on], logs.logged[on], logs.groups[on])
        diff = difference(part, Target.of_chosen(p_cand[on]), Target.of_chosen(p_cur[on]), SNIPS(), confidence, bounds)
        if diff.high < -config.margin:
            lost.append(f"{label}: {diff.value:+.4g} reward ({percent(confidence)} interval {diff.low:+.4g} to "
                        f"{diff.high:+.4g})")
    return lost


def percent(confidence: float) -> str:
    """A confidence as people write it: 0.95 → ``95%``, 0.999 → ``99.9%`` (never rounded up to 100%)."""
    return f"{confidence * 100:g}%"


def _interval(e: Estimate) -> Interval:
    return Interval(value=e.value, low=e.low, high=e.high)


# --------------------------------------------------------------------------- helpers


def _vector(values: ArrayLike, name: str) -> NDArray[Any]:
    try:
        out = np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not an array of numbers ({exc})") from None
    if out.ndim != 1:
        raise ValueError(f"{name}: must be one-dimensional, got shape {out.shape}")
    if out.dtype == object or not np.issubdtype(out.dtype, np.number):
        raise ValueError(f"{name}: must hold numbers, got {out.dtype}")
    return out


def _floats(values: ArrayLike, name: str, n: int) -> Array:
    out = _vector(values, name).astype(np.float64)
    if len(out) != n:
        raise ValueError(f"{name}: has {len(out)} entries but there are {n} episodes")
    return out


def _range_check(values: NDArray[Any], name: str, ok: Any, problem: str) -> None:
    good = ok(values)
    if not good.all():
        i = int(np.argmin(good))
        raise ValueError(f"{name}[{i}]: {values[i].item()!r} {problem}")
