"""What would an agent's reward have been under another policy? Off-policy estimates on its logs.

``agent-learn evaluate`` runs on this module: it reads an agent's scored episodes (each with the
probability its configuration was chosen with, its context and its reward after feedback), and
estimates, with every estimator of :mod:`agent_learning.evaluation`, the mean reward of a
*target* — a policy version, "always this configuration" (or, for dimensions, "always this
value, the other dimensions as the current version chooses them"), uniform, or the candidate
the next training run would publish — against the current version on the same episodes.

Configurations are indexed in the joint space of the current version (mixed radix, the first
dimension slowest); a target's probabilities are computed once per distinct context. Episodes of
a configuration the current version lacks (a revision removed or renamed it) take the index
after the last: no target chooses it, so they count with importance weight 0 — left out, they
would raise IPS and DR by the share of episodes they are.
"""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent_learning.core.errors import InvalidDocument, NotFound
from agent_learning.documents import (
    Candidate,
    PolicyDocument,
    Score,
    ScoreCursor,
    stored_policy,
)
from agent_learning.evaluation import (
    ESTIMATORS,
    Estimate,
    Logs,
    NoOverlap,
    Target,
    compare,
    compare_metric,
    estimator_named,
    metric_values,
    reward_range,
)
from agent_learning.policy.softmax import (
    JOINT_SEPARATOR,
    Layout,
    SoftmaxPolicy,
    dimension_probabilities,
    drawn_excluded,
    feature_logits,
    joint_index,
    normaliser,
)
from agent_learning.store.base import Store

MAX_EPISODES = 100_000
"""The most logged episodes one evaluation reads (the newest ones)."""
MAX_TABLE_CELLS = 20_000_000
"""Distinct contexts × configurations beyond which a target keeps only the probability of each
logged configuration (IPS and SNIPS; the doubly robust estimate needs every configuration's)."""
PAGE = 1_000
"""Score rows read per store call."""

Array = NDArray[np.float64]


@dataclass
class Logged:
    """An agent's logged episodes as the estimators take them."""

    logs: Logs
    """Actions are configuration indices of the current version (:attr:`lacking` for one it lacks);
    groups the episode's segment (its categorical context values), for the doubly robust reward model."""
    local: list[tuple[int, ...] | None]
    """Per episode, its value index in each dimension (one dimension for a flat policy; None for a
    configuration the current version lacks)."""
    contexts: list[Mapping[str, Any] | None]
    """Distinct contexts, in first-seen order."""
    rows: NDArray[np.int64]
    """Per episode, the index of its context in ``contexts``."""
    metrics: dict[str, Array] = field(default_factory=dict)
    """Guardrail metric → its value on each episode (NaN where the score does not record it)."""
    first: datetime | None = None
    last: datetime | None = None
    """The earliest and latest ``scored_at`` of the episodes (a re-score moves an episode's, not its place)."""
    skipped: int = 0
    """Scores of configurations the current version does not have (a revision removed them)."""
    lacking: int | None = None
    """The action index of those episodes (one past the current version's configurations; None: none)."""
    invalid: int = 0
    truncated: bool = False
    """More episodes matched than :data:`MAX_EPISODES`: the newest were kept."""
    reward_function: str | None = None
    """The version of the reward function every reward is of (:func:`read_logged` keeps one)."""
    other_rewards: dict[str, int] = field(default_factory=dict)
    """Episodes left out because their reward is of another reward function, by its version."""
    offered: list[list[Candidate]] | None = None
    """Per distinct context (:attr:`contexts`), the actions its request offered, when the episodes
    chose among offered actions: then each episode is its own context, and actions index
    :attr:`universe`."""
    universe: list[str] | None = None
    """With :attr:`offered`: every action id the episodes were offered, the current version's first."""


def read_logged(
    store: Store,
    current: PolicyDocument,
    *,
    since: datetime | None = None,
    limit: int = MAX_EPISODES,
    progress: Callable[[int], None] | None = None,
) -> Logged:
    """The agent's judged episodes scored at or after ``since`` (the newest ``limit``), each with
    its reward after feedback. Every score is read, oldest first (``progress`` is told how many so
    far), and at most ``limit`` episodes are held. Rewards of different reward functions (a change
    of weights, a ``rescore`` of some episodes) are on different scales, so only the episodes whose
    reward is of the reward function the newest score was written with are kept; the others are
    counted in ``other_rewards``. Raises :class:`NotFound` when fewer than two are kept."""
    layout = Layout.of(current)
    # episode id → [local, reward, probability, context, scored_at, measures, the score's reward function,
    # the reward function of the reward after feedback (a correction's: it may be the one the episode was learned with)]
    episodes: OrderedDict[str, list[Any]] = OrderedDict()
    invalid = read = offered = 0
    truncated = False
    after: ScoreCursor | None = None
    while True:
        page = store.read_scores(current.agent_id, after, PAGE, settled=False)
        read += len(page)
        for raw in page:
            try:
                score = Score.from_dict(raw)
            except InvalidDocument:
                invalid += 1
                continue
            if score.is_correction:
                if score.episode_id in episodes:  # the reward after this feedback
                    episodes[score.episode_id][1] = score.reward
                    episodes[score.episode_id][7] = score.reward_function.version
                continue
            if since is not None and score.scored_at < since:
                continue
            offered += score.candidates is not None
            local = layout.parse(score.action_id)
            version = score.reward_function.version
            episodes[score.episode_id] = [
                local, score.reward, score.probability, score.context, score.scored_at, score.measures, version,
                version, score.candidates, score.action_id,
            ]
            if len(episodes) > limit:  # the oldest goes: memory stays bounded however long the agent ran
                episodes.popitem(last=False)
                truncated = True
        if progress is not None:
            progress(read)
        if len(page) < PAGE:
            break
        after = ScoreCursor.of_row(page[-1])
    values = list(episodes.values())
    newest = max(values, key=lambda v: v[4])[6] if values else None
    other_rewards = dict(Counter(v[7] for v in values if v[7] != newest))
    values = [v for v in values if v[7] == newest]
    skipped = sum(v[0] is None for v in values)
    if len(values) < 2:
        raise NotFound(
            f"{'--since' if since else '--agent-id'}: {current.agent_id!r} has {len(values)} scored episodes"
            + (f" since {since.isoformat()}" if since else "")
            + (f" with a reward of reward function {newest} (the newest; {sum(other_rewards.values())} of other "
               "reward functions are not comparable)" if other_rewards else "")
            + "; an estimate needs at least 2"
        )
    if offered:
        return _offered_logged(values, current, invalid, truncated, newest, other_rewards)
    keys: dict[str, int] = {}
    contexts: list[Mapping[str, Any] | None] = []
    rows = np.empty(len(values), dtype=np.int64)
    segments: dict[tuple[Any, ...], int] = {}
    groups = np.empty(len(values), dtype=np.int64)
    for i, (_, _, _, context, *_) in enumerate(values):
        key = json.dumps(context, sort_keys=True)
        if key not in keys:
            keys[key] = len(contexts)
            contexts.append(context)
        rows[i] = keys[key]
        groups[i] = segments.setdefault(segment_of(context), len(segments))
    configurations = math.prod(layout.sizes)
    lacking = configurations if any(v[0] is None for v in values) else None
    actions = [configurations if v[0] is None else joint_index(v[0], layout.sizes) for v in values]
    logs = Logs.of(
        actions, [v[1] for v in values], [v[2] for v in values], configurations + (lacking is not None), groups
    )
    return Logged(
        logs,
        [v[0] for v in values],
        contexts,
        rows,
        metric_values([v[5] for v in values]),
        min(v[4] for v in values),
        max(v[4] for v in values),
        skipped,
        lacking,
        invalid,
        truncated,
        newest,
        other_rewards,
    )


def segment_of(context: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """An episode's segment for the doubly robust reward model: its categorical context values."""
    return tuple(sorted((k, v) for k, v in (context or {}).items() if isinstance(v, str | bool)))


def _offered_logged(values: list[list[Any]], current: PolicyDocument, invalid: int, truncated: bool,
                    newest: str | None, other_rewards: dict[str, int]) -> Logged:
    """:func:`read_logged`'s episodes that chose among the actions their request offered: each its
    own context (its features and its offer), actions indexing every id offered (the current
    version's first). An episode without an offer was offered the version's actions."""
    universe = list(current.action_ids)
    index = {a: i for i, a in enumerate(universe)}
    offers: list[list[Candidate]] = []
    for v in values:
        offer = v[8] if v[8] is not None else [Candidate.model_construct(id=a) for a in current.action_ids]
        offers.append(list(offer))
        for c in offer:
            if c.id not in index:
                index[c.id] = len(universe)
                universe.append(c.id)
    groups: dict[tuple[Any, ...], int] = {}
    group = np.array([groups.setdefault(segment_of(v[3]), len(groups)) for v in values])
    logs = Logs.of([index[v[9]] for v in values], [v[1] for v in values], [v[2] for v in values], len(universe), group)
    return Logged(
        logs, [None] * len(values), [v[3] for v in values], np.arange(len(values)),
        metric_values([v[5] for v in values]), min(v[4] for v in values), max(v[4] for v in values), 0, None,
        invalid, truncated, newest, other_rewards, offers, universe,
    )


# --------------------------------------------------------------------------- targets


Dimensions = Callable[[Mapping[str, Any] | None], list[list[float]]]
"""A policy's per-dimension probabilities p_d(· | x) in a context (one dimension for a flat policy)."""
Among = Callable[[Mapping[str, Any] | None, Sequence[Candidate]], list[float]]
"""A flat policy's probabilities of each action a request offered, in a context."""


@dataclass(frozen=True)
class Distribution:
    """What a policy chooses in a context: its per-dimension probabilities, the configurations it
    excludes removed. Called, the whole joint table (one entry per configuration: only for a joint
    space that fits in memory); :meth:`chosen`, only the probabilities of given configurations."""

    dimensions: Dimensions
    excluded: Sequence[tuple[int, ...]]
    sizes: tuple[int, ...]
    among: Among | None = None
    """Its probabilities among the actions one request offered (None: it cannot choose among offers)."""

    def __call__(self, context: Mapping[str, Any] | None) -> Array:
        return joint(self.dimensions(context), self.excluded, self.sizes)

    def chosen(self, contexts: Sequence[Mapping[str, Any] | None], rows: NDArray[np.int64],
               local: Sequence[tuple[int, ...] | None]) -> Array:
        """π(a_i | x_i) of each configuration ``local[i]`` (0 for None) in context ``contexts[rows[i]]``,
        each distinct context's probabilities computed once; the joint table is never built."""
        probs = [self.dimensions(c) for c in contexts]
        z = [normaliser(p, self.excluded) for p in probs]
        excluded = set(self.excluded)
        return np.fromiter(
            (
                0.0 if a is None or a in excluded else math.prod(p[i] for p, i in zip(probs[u], a, strict=True)) / z[u]
                for u, a in zip(rows, local, strict=True)
            ),
            np.float64,
            len(local),
        )


def joint(probs: Sequence[Sequence[float]], excluded: Sequence[tuple[int, ...]], sizes: Sequence[int]) -> Array:
    """The joint distribution over configurations from per-dimension probabilities, excluded
    configurations removed and the rest renormalised."""
    out = np.ones(1)
    for p in probs:
        out = np.multiply.outer(out, np.asarray(p, dtype=np.float64)).ravel()
    for local in excluded:
        out[joint_index(local, sizes)] = 0.0
    return out / out.sum()


def of_document(doc: PolicyDocument) -> Distribution:
    """What ``doc`` chooses in a context (exploration floor included), and among what a request
    offered (its features scored, as it chose)."""
    layout = Layout.of(doc)

    def dimensions(context: Mapping[str, Any] | None) -> list[list[float]]:
        return dimension_probabilities(feature_logits(doc, context), layout, doc.temperature, doc.exploration_floor)

    among: Among | None = None
    if len(layout.sizes) == 1 and not doc.excluded:
        policy = SoftmaxPolicy(doc)

        def among(context: Mapping[str, Any] | None, offer: Sequence[Candidate]) -> list[float]:
            return policy.offered_probabilities(policy.offered(list(offer)), context)

    return Distribution(dimensions, drawn_excluded(doc), layout.sizes, among)


def always(doc: PolicyDocument, action_id: str) -> Distribution:
    """Always ``action_id``: a configuration (a flat policy's action, or one value per dimension),
    or, for dimensions, one value (``prompt=concise``) with the other dimensions as ``doc``
    chooses them."""
    layout = Layout.of(doc)
    excluded = drawn_excluded(doc)
    local = layout.parse(action_id)
    if local is not None:
        if local in set(excluded):
            raise ValueError(f"--action: {action_id!r} is an excluded configuration")
        one = [[float(i == v) for i in range(k)] for v, k in zip(local, layout.sizes, strict=True)]

        def among(context: Mapping[str, Any] | None, offer: Sequence[Candidate]) -> list[float]:
            """``action_id`` where it was offered, else the request's baseline (its first action)."""
            chosen = next((i for i, c in enumerate(offer) if c.id == action_id), 0)
            return [float(i == chosen) for i in range(len(offer))]

        return Distribution(lambda context: one, excluded, layout.sizes, among if len(layout.sizes) == 1 else None)
    dims = [d for d, ids in enumerate(layout.value_ids) if action_id in ids]
    paired = _in_pair(layout, action_id)
    if paired is not None:
        k, keep = paired
        if sum(1 for e in excluded if keep[e[k]]) == sum(keep) * math.prod(layout.sizes) // layout.sizes[k]:
            raise ValueError(f"--action: every configuration with {action_id!r} is excluded")
        of_pair = of_document(doc).dimensions

        def with_value(context: Mapping[str, Any] | None) -> list[list[float]]:
            """The pair's other value as ``doc`` chooses it given this one."""
            probs = of_pair(context)
            total = math.fsum(p for p, kept in zip(probs[k], keep, strict=True) if kept)
            probs[k] = [p / total if kept else 0.0 for p, kept in zip(probs[k], keep, strict=True)]
            return probs

        return Distribution(with_value, excluded, layout.sizes)
    if not dims or len(layout.sizes) == 1:
        raise ValueError(
            f"--action: {action_id!r} is not an action of {doc.agent_id!r}"
            + (f" (actions: {', '.join(doc.action_ids)})" if len(doc.action_ids) <= 20 else "")
            + (
                f"; a whole configuration is one value per dimension in this order, joined by "
                f"{JOINT_SEPARATOR!r}: {layout.joint_id([0] * len(layout.sizes))!r}"
                if len(layout.sizes) > 1
                else ""
            )
        )
    d, value = dims[0], layout.value_ids[dims[0]].index(action_id)
    if sum(1 for e in excluded if e[d] == value) == math.prod(layout.sizes) // layout.sizes[d]:
        raise ValueError(f"--action: every configuration with {action_id!r} is excluded")
    fixed = [float(i == value) for i in range(layout.sizes[d])]
    chooses = of_document(doc).dimensions

    def dimensions(context: Mapping[str, Any] | None) -> list[list[float]]:
        probs = chooses(context)
        probs[d] = fixed
        return probs

    return Distribution(dimensions, excluded, layout.sizes)


def _in_pair(layout: Layout, action_id: str) -> tuple[int, list[bool]] | None:
    """For a value of a dimension in a declared interaction: the merged dimension it is in, and
    which of that dimension's pairs of values have it (None for any other id)."""
    merge, original = layout.merge, layout.original
    if merge is None or original is None:
        return None
    for d, ids in enumerate(original.value_ids):
        for k, part in enumerate(merge.parts):
            if action_id in ids and len(part) == 2 and d in part:
                value, second = ids.index(action_id), merge.sizes[part[1]]
                return k, [divmod(j, second)[part.index(d)] == value for j in range(layout.sizes[k])]
    return None


def uniform(doc: PolicyDocument) -> Distribution:
    """Every configuration that is not excluded, equally likely."""
    layout = Layout.of(doc)
    equal = [[1.0 / k] * k for k in layout.sizes]
    return Distribution(lambda context: equal, drawn_excluded(doc), layout.sizes,
                        lambda context, offer: [1.0 / len(offer)] * len(offer))


def target_of(logged: Logged, distribution: Distribution) -> Target:
    """A :class:`Target` on the logged episodes: the whole table when it fits
    (:data:`MAX_TABLE_CELLS`), else the probability of each logged configuration only; 0 for a
    configuration the current version lacks. On episodes that chose among offered actions, each
    row is the target's probabilities among its offer (0 for the actions not offered)."""
    if logged.offered is not None:
        if distribution.among is None:
            raise ValueError("the episodes chose among the actions their request offered; this target cannot "
                             "(only a flat policy without exclusions chooses among offered actions)")
        assert logged.universe is not None
        index = {a: i for i, a in enumerate(logged.universe)}
        table = np.zeros((len(logged.contexts), len(logged.universe)))
        for u, (context, offer) in enumerate(zip(logged.contexts, logged.offered, strict=True)):
            table[u, [index[c.id] for c in offer]] = distribution.among(context, offer)
        return Target.of_table(table, logged.rows)
    if len(logged.contexts) * math.prod(distribution.sizes) <= MAX_TABLE_CELLS:
        table = np.vstack([distribution(c) for c in logged.contexts])
        if logged.lacking is not None:
            table = np.hstack([table, np.zeros((len(table), 1))])
        return Target.of_table(table, logged.rows)
    return Target.of_chosen(distribution.chosen(logged.contexts, logged.rows, logged.local))


# --------------------------------------------------------------------------- the comparison


@dataclass
class Comparison:
    """A target against the current version, by every estimator that could run."""

    target: str
    current_version: int
    episodes: int
    estimates: dict[str, tuple[Estimate, Estimate, Estimate]] = field(default_factory=dict)
    """Estimator name → (target, current, target − current)."""
    metrics: dict[str, tuple[Estimate, Estimate]] = field(default_factory=dict)
    """Guardrail metric → its mean per episode under the target and the current version (SNIPS)."""
    notes: list[str] = field(default_factory=list)
    reward_range: tuple[float, float] = (0.0, 1.0)
    """The range of a mean reward (:func:`~agent_learning.evaluation.reward_range`): estimates are cut to it."""

    def to_dict(self) -> dict[str, Any]:
        """As ``evaluate --json`` prints it (each estimate with its weights' diagnostics)."""
        return {
            "target": self.target,
            "current_version": self.current_version,
            "episodes": self.episodes,
            "reward_range": list(self.reward_range),
            "estimates": {
                name: {"target": estimate_dict(t), "current": estimate_dict(c), "difference": estimate_dict(d)}
                for name, (t, c, d) in self.estimates.items()
            },
            "metrics": {name: {"target": estimate_dict(t), "current": estimate_dict(c)}
                        for name, (t, c) in self.metrics.items()},
            "notes": list(self.notes),
        }


def estimate_dict(e: Estimate) -> dict[str, Any]:
    """An estimate as JSON: its figures, and its diagnostics with whether it is ``reliable``."""
    out = e._asdict()
    if e.diagnostics is not None:
        out["diagnostics"] = {**e.diagnostics._asdict(), "reliable": e.diagnostics.reliable}
    return out


def compare_to_current(
    logged: Logged,
    current: PolicyDocument,
    target: Distribution,
    label: str,
    confidence: float = 0.95,
    option: str = "target",
) -> Comparison:
    """``target`` against ``current`` on ``logged`` with IPS, SNIPS and DR; raises NotFound, naming
    ``option`` (what chose the target), when the target never chooses a logged configuration."""
    bounds = reward_range(logged.logs.rewards)
    result = Comparison(label, current.version, len(logged.logs), reward_range=bounds)
    overlap = True
    tgt, cur = target_of(logged, target), target_of(logged, of_document(current))
    for name in ESTIMATORS:
        if name == "dr" and (tgt.table is None or cur.table is None):
            configurations = math.prod(target.sizes)
            result.notes.append(
                f"dr: not estimated: {len(logged.contexts)} distinct contexts × {configurations:,} configurations "
                f"exceed {MAX_TABLE_CELLS:,}"
                + (" (narrow the window with --since)" if configurations <= MAX_TABLE_CELLS else "")
            )
            continue
        try:
            result.estimates[name] = compare(logged.logs, tgt, cur, estimator_named(name), confidence, bounds)
        except NoOverlap:  # the same weights for every estimator: none can estimate
            overlap = False
            continue
        for what, e in zip(("target", "current", "target − current"), result.estimates[name], strict=True):
            if e.clipped_from is not None:
                result.notes.append(
                    f"{name}: the {what} estimate {e.clipped_from:.3f} lies outside the range of a mean reward "
                    f"[{bounds[0]:g}, {bounds[1]:g}] (of a difference, ±{bounds[1] - bounds[0]:g}); shown cut to "
                    f"{e.value:.3f}, with its interval"
                )
    snips = result.estimates.get("snips")
    if snips is not None and snips[0].diagnostics is not None and not snips[0].diagnostics.reliable:
        result.notes.append(f"unreliable: the target's estimates rely on rarely logged configurations "
                            f"({snips[0].diagnostics.problem}); the guardrail would not publish on them")
    chosen_target, chosen_current = tgt.chosen(logged.logs), cur.chosen(logged.logs)
    for name, values in logged.metrics.items():
        found = compare_metric(name, values, logged.logs.logged, chosen_target, chosen_current, confidence)
        if found is not None:
            result.metrics[name] = found[:2]
    if logged.truncated:
        result.notes.append(f"only the newest {len(logged.logs):,} episodes were read")
    if logged.other_rewards:
        others = ", ".join(f"{n} of {version}" for version, n in sorted(logged.other_rewards.items()))
        result.notes.append(
            f"rewards of reward function {logged.reward_function} (the newest score's) only: episodes rewarded by "
            f"another ({others}) are left out, their rewards being on another scale (agent-learn rescore "
            "scores episodes again with the settings' reward function)"
        )
    if logged.skipped:
        result.notes.append(
            f"{logged.skipped} scores of configurations the current version lacks count with weight 0 "
            "(no target chooses them)"
        )
    if not overlap:
        raise NotFound(
            f"{option}: {label} never chooses a configuration {current.agent_id!r} logged; "
            "nothing to estimate from" + "".join(f"; {note}" for note in result.notes)
        )
    return result


def version_target(store: Store, current: PolicyDocument, version: int) -> Distribution:
    """Version ``version`` of the agent, which must have the current version's configurations."""
    raw = store.get_policy_version(current.agent_id, version)
    if raw is None:
        raise NotFound(f"--version: {current.agent_id!r} has no version {version}")
    doc = stored_policy(raw)
    if doc.action_ids != current.action_ids or doc.dimensions != current.dimensions or doc.excluded != current.excluded:
        raise ValueError(
            f"--version: v{version} has other configurations than the current v{current.version}; "
            "estimates compare policies over the same configurations"
        )
    return of_document(doc)
