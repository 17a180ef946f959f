"""Learning quality on contextual and factorized problems (run by ``benchmarks/learning.py``).

Contextual: each episode comes with a context; the arm means depend on it.

* ``S segments``: a categorical feature with S equally likely values (2, 4, 8); K = 4 arms whose
  means are 0.8/0.7/0.6/0.5, rotated so that segment s's best arm is s mod 4.
* ``numeric feature``: x uniform in [−1, 1]; arm a's mean is 0.6 + 0.2·c_a·x with
  c = (1, −1, 0, 0.5): arm 0 is best for x > 0, arm 1 for x < 0.

References: batched Thompson sampling per segment (told the segment; for the numeric problem,
told which of 4 equal bins of x the episode falls in) on the raw reward (:class:`RawPosterior`,
the reference the table's ratio divides by), the same whose posteriors fade with the learner's
evidence half-life, and the Beta-Bernoulli one; context-free batched Thompson, and
Vowpal Wabbit's contextual bandit (``--cb_explore_adf`` with ``--squarecb`` and with
``--epsilon 0.05``, the context crossed with the action), learning after every episode
("online") and, like the timer-driven learner, once per batch ("per batch").

Factorized: a configuration has several dimensions; its mean is 0.55 + the sum of one effect
per dimension value (the best value of each dimension adds 0.05–0.08, the others spread below
it) + a small interaction of the first two dimensions (±0.02). The 24- and 300-configuration
problems draw their effects once, so every seed meets the same instance and only the luck varies;
their "drawn per seed" twins draw a new instance from each seed (seed 0's is the fixed one), so
no one instance's gaps decide the comparison. References: batched Thompson over
the joint space (every configuration an arm) and independent Thompson per dimension (each
dimension's value drawn from its own posteriors, all updated with the episode's reward): on the
raw reward (:class:`RawPosterior`, the reference the table's ratio divides by) and Beta-Bernoulli;
and, to price forgetting, each per-dimension one whose posteriors fade with the learner's
evidence half-life.

Interaction (:class:`InteractionProblem`): the best configuration needs a depth × tool
interaction that per-dimension models cannot represent. Ours without the pair declared and with it,
against Thompson sampling on the raw reward over the joint of depth × tool (its 16 pairs one
dimension) and per dimension on the rest (the reference), and per dimension on all.

Every algorithm meets the same luck (common random numbers): episode t's context, and the
uniform number that decides whether the j-th pull of arm a in a context pays, are drawn from
the seed in advance. Regret is expected regret (the best mean in the episode's context minus
the chosen arm's). "best < 0.5" counts the seeds whose final policy gives the best arm less
than probability 0.5 in some segment (numeric: at the centre of some bin, x = ±0.25 or ±0.75;
factorized: the best configuration).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from agent_learning.documents import PolicyDocument
from agent_learning.learning.reinforce import LearnerConfig, Rows, fade, learn_structured
from agent_learning.policy.softmax import (
    DEFAULT_EXPLORATION_FLOOR,
    Layout,
    StructuredPolicy,
    dimension_probabilities,
    feature_logits,
)

Rng = np.random.Generator
BATCH = 50
BASE = np.array([0.8, 0.7, 0.6, 0.5])


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class ContextProblem:
    """Arms whose means depend on the episode's context (a segment or a number)."""

    name: str
    k: int
    segments: int | None
    """S for a categorical problem; None for the numeric one."""
    horizon: int

    def contexts(self, rng: Rng, n: int) -> np.ndarray:
        if self.segments is not None:
            return rng.integers(0, self.segments, n).astype(float)
        return rng.uniform(-1.0, 1.0, n)

    def means(self, x: np.ndarray) -> np.ndarray:
        """(n, K) arm means in the contexts ``x``."""
        if self.segments is not None:
            s = x.astype(int)
            return np.stack([np.roll(BASE, seg % self.k) for seg in range(self.segments)])[s]
        c = np.array([1.0, -1.0, 0.0, 0.5])
        return 0.6 + 0.2 * x[:, None] * c[None, :]

    def probes(self) -> np.ndarray:
        """The contexts at which the final policy is checked for "best < 0.5": every segment, or
        the centre of every bin of x (where the best arm is the bin's, which an oracle is told)."""
        if self.segments is not None:
            return np.arange(self.segments, dtype=float)
        return (np.arange(self.bins) + 0.5) / self.bins * 2.0 - 1.0

    def feature(self, x: float) -> dict[str, Any]:
        return {"segment": f"s{int(x)}"} if self.segments is not None else {"x": float(x)}

    def bin(self, x: np.ndarray) -> np.ndarray:
        """The segment an oracle is told: the segment itself, or one of 4 bins of x."""
        if self.segments is not None:
            return x.astype(int)
        return np.minimum(((x + 1.0) / 2.0 * 4).astype(int), 3)

    @property
    def bins(self) -> int:
        return self.segments if self.segments is not None else 4


@dataclass(frozen=True)
class FactorProblem:
    """Configurations over several dimensions with mostly additive effects."""

    name: str
    sizes: tuple[int, ...]
    horizon: int
    seed: int = 0
    varied: bool = False
    """Whether each run draws its own effects from its seed (a new instance of the problem per
    seed) rather than every run meeting the effects drawn from ``seed``."""

    def table(self, run_seed: int = 0) -> np.ndarray:
        """The mean of every configuration in the run with seed ``run_seed``, shape ``sizes``."""
        rng = np.random.default_rng(1_000 + (run_seed if self.varied else self.seed))
        total = np.full(self.sizes, 0.55)
        for d, k in enumerate(self.sizes):
            effect = np.concatenate([[rng.uniform(0.05, 0.08)], rng.uniform(-0.06, 0.02, k - 1)])
            shape = [1] * len(self.sizes)
            shape[d] = k
            total = total + rng.permutation(effect).reshape(shape)
        shape2 = list(self.sizes[:2]) + [1] * (len(self.sizes) - 2)
        total = total + rng.uniform(-0.02, 0.02, self.sizes[:2]).reshape(shape2)
        return np.clip(total, 0.02, 0.98)


INTERACTION_EFFECTS = (0.08, 0.04, 0.0, -0.06)
"""The interaction problem's effect of each depth value, and of each tool value."""
INTERACTION_BONUS = 0.35
"""What the one pair (depth 3, tool 3), each value the worst on its own, adds."""


MODEL_EFFECTS = (0.05, 0.0, -0.03)
"""The interaction problem's effect of each model value (the first ``models`` of them)."""


@dataclass(frozen=True)
class InteractionProblem(FactorProblem):
    """depth (4) × tool (4) × model (3, or 1): mean 0.5 + a_depth + a_tool + c_model, with a = 0.08,
    0.04, 0, −0.06 and c = 0.05, 0, −0.03, plus :data:`INTERACTION_BONUS` for depth 3 with tool 3.
    The best configuration (3, 3, 0: 0.78) needs the interaction: additively, depth 0 and tool 0 are
    best (0, 0, 0: 0.71), and averaged over the other dimension depth 3 and tool 3 stay worse than
    depth 0 and tool 0. ``sizes`` (4, 4, models), or (16, models) for the algorithms that see
    depth × tool as one dimension (the same configurations in the same order)."""

    models: int = 3

    @property
    def merged(self) -> InteractionProblem:
        """The problem as the algorithms that see depth × tool as one dimension meet it."""
        return replace(self, sizes=(16, self.models))

    def table(self, run_seed: int = 0) -> np.ndarray:
        a = np.array(INTERACTION_EFFECTS)
        total = 0.5 + a[:, None, None] + a[None, :, None] + np.array(MODEL_EFFECTS[: self.models])[None, None, :]
        total[3, 3, :] += INTERACTION_BONUS
        return total.reshape(self.sizes)


INTERACTION_PROBLEMS = [
    InteractionProblem("depth × tool × model = 48, best needs depth × tool", (4, 4, 3), 4_000),
    InteractionProblem("depth × tool = 16, best needs depth × tool", (4, 4, 1), 4_000, models=1),
]

CONTEXT_PROBLEMS = [
    ContextProblem("2 segments", 4, 2, 4_000),
    ContextProblem("4 segments", 4, 4, 4_000),
    ContextProblem("8 segments", 4, 8, 4_000),
    ContextProblem("numeric feature", 4, None, 4_000),
]
FACTOR_PROBLEMS = [
    FactorProblem("3×4×2 = 24", (3, 4, 2), 4_000),
    FactorProblem("5×5×4×3 = 300", (5, 5, 4, 3), 4_000),
    FactorProblem("24, drawn per seed", (3, 4, 2), 4_000, varied=True),
    FactorProblem("300, drawn per seed", (5, 5, 4, 3), 4_000, varied=True),
]


class Luck:
    """Common random numbers: the contexts, and per (context cell, arm) a stream of uniforms
    consumed in order, so every algorithm's j-th pull of an arm in a cell meets the same luck."""

    def __init__(self, seed: int, horizon: int, cells: int, arms: int, contexts: np.ndarray | None = None) -> None:
        rng = np.random.default_rng([seed, 7])
        self.contexts = contexts
        self.uniforms = rng.random((cells, arms, horizon))
        self.used = np.zeros((cells, arms), dtype=np.int64)

    def pay(self, cells: np.ndarray, arms: np.ndarray, means: np.ndarray) -> np.ndarray:
        out = np.empty(len(arms))
        for i, (c, a) in enumerate(zip(cells, arms, strict=True)):
            out[i] = float(self.uniforms[c, a, self.used[c, a]] < means[i])
            self.used[c, a] += 1
        return out


# --------------------------------------------------------------------------- algorithms


class Chooser:
    """An algorithm: probabilities for contexts, and an update from a batch."""

    name = "?"
    per_episode = False

    def probs(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def update(self, x: np.ndarray, arms: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        raise NotImplementedError


HALF_LIFE = LearnerConfig().evidence_half_life
"""The learner's default evidence half-life (``AGENT_LEARNING_EVIDENCE_HALF_LIFE``), in episodes:
the forgetting references forget at its pace."""


class RawPosterior:
    """Thompson sampling's posteriors on the raw reward: a Normal posterior of each arm's mean, with
    the arm's sample variance taken as known. Prior: one pseudo-pull of 0.5, and a variance of 0.25
    (the most a reward in [0, 1] can have) until the arm has two pulls; so after n pulls with sum S
    and sample variance s², the mean is N((0.5 + S) / (n + 1), max(s², 10⁻⁴) / (n + 1)). Unlike a
    Beta-Bernoulli posterior it sees the rewards' scale, as the learner does. With a half-life H
    the sums n, S and Σr² of a cell (a segment, or the whole problem) fade by 2^(−m/H) before the
    cell's m new episodes of a batch add, as the learner's evidence does; the prior never fades.
    ``shape`` is (cells, arms) or (arms,)."""

    min_variance = 1e-4
    """A reward's variance is taken as at least this (sd 0.01): an arm whose few rewards agree still has doubt."""

    def __init__(self, shape: tuple[int, ...], half_life: float | None = None) -> None:
        self.half_life = half_life
        self.n, self.s, self.ss = np.zeros(shape), np.zeros(shape), np.zeros(shape)

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Every arm's posterior mean and standard deviation."""
        n = np.maximum(self.n, 1)
        variance = np.where(self.n > 1, (self.ss - self.s**2 / n) / np.maximum(self.n - 1, 1), 0.25)
        return (0.5 + self.s) / (self.n + 1), np.sqrt(np.maximum(variance, self.min_variance) / (self.n + 1))

    def draws(self, rng: Rng, samples: int, cells: np.ndarray | None = None) -> np.ndarray:
        """``samples`` draws of every arm's mean (of each of ``cells``' arms, one draw per cell)."""
        mean, sd = self.posterior()
        if cells is None:
            return rng.normal(mean, sd, size=(samples, *mean.shape))
        return rng.normal(mean[cells], sd[cells])

    def probabilities(self, rng: Rng, samples: int) -> np.ndarray:
        """The probability of each arm being drawn (of a posterior of shape (arms,)), from ``samples`` draws."""
        return np.bincount(self.draws(rng, samples).argmax(axis=1), minlength=self.n.shape[-1]) / samples

    def learn(self, arms: np.ndarray, rewards: np.ndarray, cells: np.ndarray | None = None) -> None:
        """Fade each cell by its episodes in the batch (if forgetting), then add the batch."""
        where = arms if cells is None else (cells, arms)
        if self.half_life:
            episodes = len(arms) if cells is None else np.bincount(cells, minlength=self.n.shape[0])[:, None]
            keep = fade(episodes, self.half_life)  # type: ignore[arg-type]
            self.n, self.s, self.ss = self.n * keep, self.s * keep, self.ss * keep
        np.add.at(self.n, where, 1.0)
        np.add.at(self.s, where, rewards)
        np.add.at(self.ss, where, rewards * rewards)


class OursContextual(Chooser):
    """The structured learner: one dimension of K arms and the context as a feature."""

    name = "REINFORCE (ours)"

    def __init__(self, problem: ContextProblem, rng: Rng) -> None:
        kind = "category" if problem.segments is not None else "number"
        name = "segment" if problem.segments is not None else "x"
        self.problem, self.rng = problem, rng
        self.doc = StructuredPolicy.create(
            "bench", {"arm": list(range(problem.k))}, context={name: kind}, exploration_floor=DEFAULT_EXPLORATION_FLOOR
        ).document
        self.config = LearnerConfig()
        self.policy = StructuredPolicy(self.doc)

    def probs(self, x: np.ndarray) -> np.ndarray:
        return np.array([list(self.policy.marginals(self.problem.feature(v))["arm"].values()) for v in x])

    def update(self, x: np.ndarray, arms: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        contexts = [self.problem.feature(v) for v in x]
        update = learn_structured(
            self.config, self.doc, Rows(arms[:, None], rewards, logged, [False] * len(arms), contexts)
        )
        self.doc = _next(self.doc, update)
        self.policy = StructuredPolicy(self.doc)


def _next(doc: PolicyDocument, update: Any) -> PolicyDocument:
    return update.applied_to(doc)


class ThompsonCells(Chooser):
    """Beta-Bernoulli Thompson sampling with one posterior per cell (segment or bin); one cell is
    the context-free version. Updated once per batch."""

    def __init__(self, k: int, cells: int, cell_of: Callable[[np.ndarray], np.ndarray], rng: Rng, name: str) -> None:
        self.k, self.cell_of, self.rng, self.name = k, cell_of, rng, name
        self.a, self.b = np.ones((cells, k)), np.ones((cells, k))

    def draw(self, x: np.ndarray) -> np.ndarray:
        c = self.cell_of(x)
        return self.rng.beta(self.a[c], self.b[c]).argmax(axis=1)

    def probs(self, x: np.ndarray, samples: int = 2_000) -> np.ndarray:
        out = []
        for c in self.cell_of(x):
            draws = self.rng.beta(self.a[c], self.b[c], size=(samples, self.k))
            out.append(np.bincount(draws.argmax(axis=1), minlength=self.k) / samples)
        return np.array(out)

    def update(self, x: np.ndarray, arms: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        c = self.cell_of(x)
        np.add.at(self.a, (c, arms), rewards)
        np.add.at(self.b, (c, arms), 1 - rewards)


class RawThompsonCells(ThompsonCells):
    """Thompson sampling on the raw reward (:class:`RawPosterior`) with one posterior per cell,
    forgetting with the learner's evidence half-life if ``half_life``. Updated once per batch."""

    def __init__(
        self, k: int, cells: int, cell_of: Callable[[np.ndarray], np.ndarray], rng: Rng, name: str,
        half_life: float | None = None,
    ) -> None:
        self.k, self.cell_of, self.rng, self.name = k, cell_of, rng, name
        self.posterior = RawPosterior((cells, k), half_life)

    def draw(self, x: np.ndarray) -> np.ndarray:
        return self.posterior.draws(self.rng, len(x), self.cell_of(x)).argmax(axis=1)

    def probs(self, x: np.ndarray, samples: int = 2_000) -> np.ndarray:
        draws = self.posterior.draws(self.rng, samples)
        chosen = [np.bincount(draws[:, c].argmax(axis=1), minlength=self.k) / samples for c in range(self.n_cells)]
        return np.array(chosen)[self.cell_of(x)]

    @property
    def n_cells(self) -> int:
        return self.posterior.n.shape[0]

    def update(self, x: np.ndarray, arms: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        self.posterior.learn(arms, rewards, self.cell_of(x))


class VowpalWabbit(Chooser):
    """Vowpal Wabbit's ``--cb_explore_adf`` (context crossed with the action), learning after
    every episode or once per batch."""

    def __init__(self, problem: ContextProblem, explore: str, per_episode: bool, seed: int) -> None:
        from vowpalwabbit import Workspace  # imported only where this reference runs

        self.problem, self.per_episode = problem, per_episode
        self.name = f"VW {explore} ({'online' if per_episode else 'per batch'})"
        self.vw = Workspace(f"--cb_explore_adf {explore} -q ca --quiet --random_seed {seed}")

    def _lines(self, x: float, label: tuple[int, float, float] | None = None) -> list[str]:
        feature = f"segment=s{int(x)}" if self.problem.segments is not None else f"x:{x:.6f} pos:{max(x, 0):.6f}"
        lines = [f"shared |c {feature} bias"]
        for a in range(self.problem.k):
            prefix = ""
            if label is not None and label[0] == a:
                prefix = f"0:{-label[1]:.6f}:{label[2]:.6f} "  # cost = −reward, as in VW's contextual bandit tutorial
            lines.append(f"{prefix}|a arm{a}")
        return lines

    def probs(self, x: np.ndarray) -> np.ndarray:
        out = []
        for v in x:
            pmf = self.vw.predict(self._lines(v))
            out.append(np.asarray(pmf, dtype=float))
        return np.array(out)

    def learn(self, x: float, arm: int, reward: float, p: float) -> None:
        self.vw.learn(self._lines(x, (arm, reward, p)))

    def update(self, x: np.ndarray, arms: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        for v, a, r, p in zip(x, arms, rewards, logged, strict=True):
            self.learn(v, int(a), float(r), float(p))


@dataclass
class Row:
    regret: list[float] = field(default_factory=list)
    below_half: int = 0

    @classmethod
    def over_seeds(cls, seeds: int, run: Callable[[int], tuple[float, bool]]) -> Row:
        """Each seed's regret, and how many seeds ended with the best below 0.5, of ``run(seed)``."""
        row = cls()
        for seed in range(seeds):
            regret, below = run(seed)
            row.regret.append(regret)
            row.below_half += below
        return row


def run_contextual(problem: ContextProblem, make: Callable[[Rng, int], Chooser], seed: int) -> tuple[float, bool]:
    rng = np.random.default_rng([seed, 1])
    contexts = problem.contexts(np.random.default_rng([seed, 2]), problem.horizon)
    luck = Luck(seed, problem.horizon, problem.bins, problem.k)
    algo = make(rng, seed)
    total = 0.0
    for start in range(0, problem.horizon, BATCH):
        x = contexts[start : start + BATCH]
        means = problem.means(x)
        if isinstance(algo, ThompsonCells):
            arms = algo.draw(x)
            logged = np.ones(len(x))
        elif isinstance(algo, VowpalWabbit) and algo.per_episode:
            arms, logged = np.empty(len(x), dtype=int), np.empty(len(x))
            for i, v in enumerate(x):
                p = algo.probs(np.array([v]))[0]
                arms[i] = rng.choice(problem.k, p=p / p.sum())
                logged[i] = p[arms[i]]
                reward = luck.pay(problem.bin(np.array([v])), arms[i : i + 1], means[i : i + 1, arms[i]])[0]
                algo.learn(v, int(arms[i]), reward, logged[i])
            total += float((means.max(axis=1) - means[np.arange(len(x)), arms]).sum())
            continue
        else:
            p = algo.probs(x)
            p = p / p.sum(axis=1, keepdims=True)
            arms = np.array([rng.choice(problem.k, p=row) for row in p])
            logged = p[np.arange(len(x)), arms]
        rewards = luck.pay(problem.bin(x), arms, means[np.arange(len(x)), arms])
        algo.update(x, arms, rewards, logged)
        total += float((means.max(axis=1) - means[np.arange(len(x)), arms]).sum())
    probes = problem.probes()
    final = algo.probs(probes)
    best = problem.means(probes).argmax(axis=1)
    return total, bool((final[np.arange(len(probes)), best] < 0.5).any())


RAW_PER_SEGMENT = "Thompson per segment, raw reward (told it)"
"""The contextual rows' reference: their ratio column divides by it."""


def contextual_algorithms(problem: ContextProblem) -> list[Callable[[Rng, int], Chooser]]:
    out: list[Callable[[Rng, int], Chooser]] = [
        lambda rng, seed: OursContextual(problem, rng),
        lambda rng, seed: RawThompsonCells(problem.k, problem.bins, problem.bin, rng, RAW_PER_SEGMENT),
        lambda rng, seed: RawThompsonCells(
            problem.k, problem.bins, problem.bin, rng, "Thompson per segment, raw reward, forgetting", HALF_LIFE
        ),
        lambda rng, seed: ThompsonCells(
            problem.k, problem.bins, problem.bin, rng, "Thompson per segment, Beta (told it)"
        ),
        lambda rng, seed: ThompsonCells(
            problem.k, 1, lambda x: np.zeros(len(x), dtype=int), rng, "Thompson (context-free, Beta)"
        ),
    ]
    for explore in ("--squarecb", "--epsilon 0.05"):
        for online in (True, False):
            out.append(lambda rng, seed, e=explore, o=online: VowpalWabbit(problem, e, o, seed))
    return out


# --------------------------------------------------------------------------- factorized


class OursFactorized(Chooser):
    name = "REINFORCE (ours)"

    def __init__(
        self,
        sizes: Sequence[int],
        rng: Rng,
        config: LearnerConfig | None = None,
        *,
        dimensions: Sequence[int] | None = None,
        interactions: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``dimensions`` (with ``interactions``): the policy's own dimensions, whose merged view
        (each declared pair one dimension) has ``sizes``; draws and rows are in the merged view."""
        self.sizes, self.rng = tuple(sizes), rng
        self.doc = StructuredPolicy.create(
            "bench", {f"d{d}": list(range(k)) for d, k in enumerate(dimensions or sizes)},
            interactions=interactions, exploration_floor=DEFAULT_EXPLORATION_FLOOR,
        ).document
        self.config = config or LearnerConfig()
        self._refresh()

    def _refresh(self) -> None:
        if self.doc.interactions:  # the merged dimensions' own probabilities
            logits = feature_logits(self.doc, None)
            probs = dimension_probabilities(logits, Layout.of(self.doc), self.doc.temperature,
                                            self.doc.exploration_floor)
            self.marginals = [np.array(p) for p in probs]
            return
        self.marginals = [np.array(list(m.values())) for m in StructuredPolicy(self.doc).marginals().values()]

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        local = np.stack([self.rng.choice(len(p), size=n, p=p / p.sum()) for p in self.marginals], axis=1)
        logged = np.prod([p[local[:, d]] for d, p in enumerate(self.marginals)], axis=0)
        return local, logged

    def p_best(self, best: tuple[int, ...]) -> float:
        return float(np.prod([p[b] for p, b in zip(self.marginals, best, strict=True)]))

    def draw_probabilities(self, samples: int = 0, rng: Rng | None = None) -> list[np.ndarray]:
        """Per dimension, the probability of drawing each value (exact: the arguments are the
        Thompson samplers')."""
        return [p / p.sum() for p in self.marginals]

    def update_local(self, local: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        n = len(rewards)
        update = learn_structured(self.config, self.doc, Rows(local, rewards, logged, [False] * n, [None] * n))
        self.doc = _next(self.doc, update)
        self._refresh()


class JointThompson:
    """Beta-Bernoulli Thompson sampling over the joint space (every configuration an arm)."""

    name = "Thompson (joint, Beta, batched)"

    def __init__(self, sizes: Sequence[int], rng: Rng) -> None:
        self.sizes, self.rng = tuple(sizes), rng
        j = math.prod(sizes)
        self.a, self.b = np.ones(j), np.ones(j)

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        flat = self.rng.beta(self.a, self.b, size=(n, len(self.a))).argmax(axis=1)
        return np.stack(np.unravel_index(flat, self.sizes), axis=1), np.ones(n)

    def p_best(self, best: tuple[int, ...], samples: int = 2_000) -> float:
        flat = self.rng.beta(self.a, self.b, size=(samples, len(self.a))).argmax(axis=1)
        return float(np.mean(flat == np.ravel_multi_index(best, self.sizes)))

    def update_local(self, local: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        flat = np.ravel_multi_index(local.T, self.sizes)
        np.add.at(self.a, flat, rewards)
        np.add.at(self.b, flat, 1 - rewards)


class DimensionThompson:
    """Independent Beta-Bernoulli Thompson sampling per dimension, updated once per batch."""

    name = "Thompson (per dimension, Beta, batched)"

    def __init__(self, sizes: Sequence[int], rng: Rng) -> None:
        self.sizes, self.rng = tuple(sizes), rng
        self.a = [np.ones(k) for k in sizes]
        self.b = [np.ones(k) for k in sizes]

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        cols = [self.rng.beta(a, b, size=(n, len(a))).argmax(axis=1) for a, b in zip(self.a, self.b, strict=True)]
        return np.stack(cols, axis=1), np.ones(n)

    def p_best(self, best: tuple[int, ...], samples: int = 2_000) -> float:
        return float(np.prod([p[v] for p, v in zip(self.draw_probabilities(samples), best, strict=True)]))

    def draw_probabilities(self, samples: int = 2_000, rng: Rng | None = None) -> list[np.ndarray]:
        """Per dimension, the probability of drawing each value, from ``samples`` posterior draws
        (with ``rng``, if given, so that the sampler's own stream is left as it was)."""
        rng = rng or self.rng
        return [
            np.bincount(rng.beta(a, b, size=(samples, len(a))).argmax(axis=1), minlength=len(a)) / samples
            for a, b in zip(self.a, self.b, strict=True)
        ]

    def greedy(self) -> list[np.ndarray]:
        """Per dimension, all probability on the value with the highest posterior mean."""
        return [np.eye(len(a))[int(np.argmax(a / (a + b)))] for a, b in zip(self.a, self.b, strict=True)]

    def update_local(self, local: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        for d in range(len(self.sizes)):
            np.add.at(self.a[d], local[:, d], rewards)
            np.add.at(self.b[d], local[:, d], 1 - rewards)


class FadingDimensionThompson(DimensionThompson):
    """Per-dimension Thompson whose posteriors forget as the learner's evidence does: after a batch
    of N episodes each Beta posterior's counts beyond the prior are scaled by 2^(−N/H), H the
    learner's ``evidence_half_life``. Not a contender; it prices the learner's forgetting (which
    lets old evidence go in a slowly drifting world) on a world that never changes."""

    name = "Thompson (per dimension, Beta, batched, forgetting)"
    half_life = HALF_LIFE or math.inf

    def update_local(self, local: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        fade = 0.5 ** (len(rewards) / self.half_life)
        for d in range(len(self.sizes)):
            self.a[d] = 1.0 + fade * (self.a[d] - 1.0)
            self.b[d] = 1.0 + fade * (self.b[d] - 1.0)
        super().update_local(local, rewards, logged)


class RawDimensionThompson(DimensionThompson):
    """Independent Thompson sampling per dimension on the raw reward: each dimension's value drawn
    from its own :class:`RawPosterior` (Normal, the value's sample variance taken as known, one prior
    pseudo-pull of 0.5), all updated with the episode's reward once per batch."""

    name = "Thompson (per dimension, raw reward, batched)"
    half_life: float | None = None

    def __init__(self, sizes: Sequence[int], rng: Rng) -> None:
        self.sizes, self.rng = tuple(sizes), rng
        self.posteriors = [RawPosterior((k,), self.half_life) for k in sizes]

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        cols = [p.draws(self.rng, n).argmax(axis=1) for p in self.posteriors]
        return np.stack(cols, axis=1), np.ones(n)

    def draw_probabilities(self, samples: int = 2_000, rng: Rng | None = None) -> list[np.ndarray]:
        return [p.probabilities(rng or self.rng, samples) for p in self.posteriors]

    def greedy(self) -> list[np.ndarray]:
        return [np.eye(len(p.n))[int(np.argmax(p.posterior()[0]))] for p in self.posteriors]

    def update_local(self, local: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        for d, posterior in enumerate(self.posteriors):
            posterior.learn(local[:, d], rewards)


class FadingRawDimensionThompson(RawDimensionThompson):
    """Per-dimension Thompson on the raw reward whose posteriors fade with the learner's evidence
    half-life (every dimension by the whole batch: each episode has a value in each)."""

    name = "Thompson (per dimension, raw reward, batched, forgetting)"
    half_life = HALF_LIFE


FACTOR_ALGORITHMS: list[Callable[[Sequence[int], Rng], Any]] = [
    OursFactorized,
    RawDimensionThompson,
    FadingRawDimensionThompson,
    JointThompson,
    DimensionThompson,
    FadingDimensionThompson,
]


def run_factorized(problem: FactorProblem, make: Callable[[Sequence[int], Rng], Any], seed: int) -> tuple[float, bool]:
    table = problem.table(seed)
    flat_means = table.ravel()
    best = tuple(int(i) for i in np.unravel_index(int(flat_means.argmax()), problem.sizes))
    luck = Luck(seed, problem.horizon, 1, len(flat_means))
    algo = make(problem.sizes, np.random.default_rng([seed, 1]))
    total = 0.0
    for _ in range(0, problem.horizon, BATCH):
        local, logged = algo.draw(BATCH)
        flat = np.ravel_multi_index(local.T, problem.sizes)
        rewards = luck.pay(np.zeros(BATCH, dtype=int), flat, flat_means[flat])
        algo.update_local(local, rewards, logged)
        total += float((flat_means.max() - flat_means[flat]).sum())
    return total, algo.p_best(best) < 0.5


GAP_STRETCH = 500
"""Episodes per stretch in :func:`stretch_regret` and :func:`gap_lines`."""


def expected_regret(table: np.ndarray, probabilities: Sequence[np.ndarray]) -> float:
    """The expected regret of one configuration drawn with each dimension's value drawn independently."""
    gap = table.max() - table
    for p in reversed(probabilities):
        gap = gap @ p
    return float(gap)


def stretch_regret(problem: FactorProblem, make: Callable[[Sequence[int], Rng], Any], seed: int) -> np.ndarray:
    """Rows: per stretch of :data:`GAP_STRETCH` episodes, the expected regret of the algorithm's
    draws; of drawing with the probabilities per-dimension Thompson sampling would compute from the
    algorithm's own episodes (every one counted, none faded); and of the greedy choice on them."""
    table = problem.table(seed)
    flat_means = table.ravel()
    luck = Luck(seed, problem.horizon, 1, len(flat_means))
    algo = make(problem.sizes, np.random.default_rng([seed, 1]))
    shadow = DimensionThompson(problem.sizes, np.random.default_rng([seed, 2]))
    out = np.zeros((3, problem.horizon // GAP_STRETCH))
    for start in range(0, problem.horizon, BATCH):
        ways = (algo.draw_probabilities(400, shadow.rng), shadow.draw_probabilities(400), shadow.greedy())
        out[:, start // GAP_STRETCH] += [BATCH * expected_regret(table, w) for w in ways]
        local, logged = algo.draw(BATCH)
        flat = np.ravel_multi_index(local.T, problem.sizes)
        rewards = luck.pay(np.zeros(BATCH, dtype=int), flat, flat_means[flat])
        algo.update_local(local, rewards, logged)
        shadow.update_local(local, rewards, logged)
    return out


def gap_lines(problem: FactorProblem, seeds: int, t0: float) -> list[str]:
    """Where ours' regret against per-dimension Thompson builds up, as a table of the mean expected
    regret per stretch of episodes: ours and ours with evidence that never fades, each with what
    Thompson sampling's probabilities and the greedy choice would have cost on its own episodes
    (is it the episodes, or how the policy draws from them?), and per-dimension Thompson."""
    stretches = problem.horizon // GAP_STRETCH
    heads = [f"{(i + 1) * GAP_STRETCH:,}" for i in range(stretches)]
    lines = [
        f"| {problem.name}: expected regret in the {GAP_STRETCH} episodes up to | {' | '.join(heads)} | total |",
        "|---|" + "---:|" * (stretches + 1),
    ]
    never = LearnerConfig(evidence_half_life=None)
    for label, make in (
        ("ours", OursFactorized),
        ("ours, evidence never fading", lambda sizes, rng: OursFactorized(sizes, rng, never)),
        ("per-dimension Thompson", DimensionThompson),
    ):
        rows = np.mean([stretch_regret(problem, make, seed) for seed in range(seeds)], axis=0)
        names = [label, f"{label}: Thompson's probabilities on its episodes", f"{label}: greedy on its episodes"]
        names = names[:1] if make is DimensionThompson else names
        for name, row in zip(names, rows, strict=False):
            lines.append(f"| {name} | {' | '.join(f'{x:.1f}' for x in row)} | {row.sum():.1f} |")
        _progress(t0, f"{problem.name}: {label}")
    return lines


# --------------------------------------------------------------------------- tables


def tables(seeds: int, t0: float, contextual: bool = True) -> tuple[list[str], dict[str, Any]]:
    """The contextual (unless ``contextual`` is False), factorized and interaction tables (markdown
    lines) and their figures."""
    out: dict[str, Any] = {"contextual": {}, "factorized": {}, "interaction": {}}
    lines = [*contextual_lines(seeds, t0, out["contextual"]), ""] if contextual else []
    lines += [*factorized_lines(seeds, t0, out["factorized"]), ""]
    return lines + interaction_lines(seeds, t0, out["interaction"]), out


def contextual_lines(seeds: int, t0: float, out: dict[str, Any]) -> list[str]:
    """The contextual table; its figures go into ``out``."""
    lines = [
        "| contextual problem | algorithm | regret (mean ± sd) | vs raw-reward Thompson per segment (± paired se) | "
        "best < 0.5 (seeds) |",
        "|---|---|---:|---:|---:|",
    ]
    for problem in CONTEXT_PROBLEMS:
        rows: dict[str, Row] = {}
        for make in contextual_algorithms(problem):
            name = make(np.random.default_rng(0), 0).name
            row = Row.over_seeds(seeds, partial(run_contextual, problem, make))
            rows[name] = row
            _progress(t0, f"{problem.name}: {name}")
        _table_rows(lines, out, problem.name, rows, RAW_PER_SEGMENT, seeds)
    return lines


def factorized_lines(seeds: int, t0: float, out: dict[str, Any]) -> list[str]:
    """The factorized table, each ratio to per-dimension raw-reward Thompson with its paired standard
    error; its figures go into ``out``."""
    lines = [
        "| factorized problem | algorithm | regret (mean ± sd) | vs raw-reward Thompson per dimension "
        "(± paired se) | vs Beta Thompson per dimension | vs joint Beta Thompson | best < 0.5 (seeds) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for problem in FACTOR_PROBLEMS:
        rows: dict[str, Row] = {}
        for make in FACTOR_ALGORITHMS:
            row = Row.over_seeds(seeds, partial(run_factorized, problem, make))
            rows[make.name] = row  # type: ignore[attr-defined]
            _progress(t0, f"{problem.name}: {make.name}")  # type: ignore[attr-defined]
        joint = float(np.mean(rows[JointThompson.name].regret))
        per_dim = float(np.mean(rows[DimensionThompson.name].regret))
        reference = np.array(rows[RawDimensionThompson.name].regret)
        out[problem.name] = {}
        for name, row in rows.items():
            mean = float(np.mean(row.regret))
            se = paired_se(np.array(row.regret), reference)
            out[problem.name][name] = {
                "regret_mean": mean,
                "regret_sd": float(np.std(row.regret)),
                "vs_reference": mean / reference.mean(),
                "vs_reference_se": se,
                "vs_dimension_thompson": mean / per_dim,
                "vs_joint_thompson": mean / joint,
                "best_below_half": row.below_half,
            }
            lines.append(
                f"| {problem.name} | {name} | {mean:.1f} ± {np.std(row.regret):.1f} | {mean / reference.mean():.2f}× "
                f"± {se:.2f} | {mean / per_dim:.2f}× | {mean / joint:.2f}× | {row.below_half}/{seeds} |"
            )
    return lines


class RawMergedThompson(RawDimensionThompson):
    name = "Thompson (joint of depth × tool, per dimension on the rest, raw reward, batched)"


def interaction_algorithms(
    problem: InteractionProblem,
) -> list[tuple[str, Callable[[Sequence[int], Rng], Any], InteractionProblem]]:
    """The interaction problem's algorithms, each with its name and the problem as it sees it (the
    reference: the third)."""

    def declared(sizes: Sequence[int], rng: Rng) -> OursFactorized:
        return OursFactorized(sizes, rng, dimensions=problem.sizes, interactions=[("d0", "d1")])

    return [
        (OursFactorized.name, OursFactorized, problem),
        (f"{OursFactorized.name}, depth × tool declared", declared, problem.merged),
        (RawMergedThompson.name, RawMergedThompson, problem.merged),
        (RawDimensionThompson.name, RawDimensionThompson, problem),
    ]


def interaction_lines(seeds: int, t0: float, out: dict[str, Any]) -> list[str]:
    """The interaction table: each algorithm's ratio to Thompson sampling on the raw reward over the
    joint of depth × tool (per dimension on model); its figures go into ``out``."""
    lines = [
        "| problem | algorithm | regret (mean ± sd) | vs raw-reward Thompson on the joint of depth × tool "
        "(± paired se) | best < 0.5 (seeds) |",
        "|---|---|---:|---:|---:|",
    ]
    for problem in INTERACTION_PROBLEMS:
        rows: dict[str, Row] = {}
        for name, make, seen in interaction_algorithms(problem):
            rows[name] = Row.over_seeds(seeds, partial(run_factorized, seen, make))
            _progress(t0, f"{problem.name}: {name}")
        _table_rows(lines, out, problem.name, rows, RawMergedThompson.name, seeds)
    return lines


def paired_se(regret: np.ndarray, reference: np.ndarray) -> float:
    """One standard error of the ratio R = mean(regret) ÷ mean(reference) from the seeds' paired
    residuals regret − R·reference (the delta method: the same seeds meet the same luck, so what
    varies is how far each seed is from the ratio, not each algorithm's spread); 0 for one seed."""
    if len(regret) < 2:
        return 0.0
    ratio = regret.mean() / reference.mean()
    return float(np.std(regret - ratio * reference, ddof=1) / math.sqrt(len(regret)) / reference.mean())


def _table_rows(
    lines: list[str], out: dict[str, Any], problem: str, rows: dict[str, Row], reference: str, seeds: int
) -> None:
    """The contextual table's rows of ``problem``: each algorithm's regret, its ratio to ``reference``
    with the ratio's paired standard error, and its seeds below 0.5; the figures go into ``out``."""
    ref_row = np.array(rows[reference].regret)
    ref = float(ref_row.mean())
    out[problem] = {}
    for name, row in rows.items():
        mean = float(np.mean(row.regret))
        se = paired_se(np.array(row.regret), ref_row)
        out[problem][name] = {
            "regret_mean": mean,
            "regret_sd": float(np.std(row.regret)),
            "vs_reference": mean / ref,
            "vs_reference_se": se,
            "best_below_half": row.below_half,
        }
        lines.append(
            f"| {problem} | {name} | {mean:.1f} ± {np.std(row.regret):.1f} | {mean / ref:.2f}× ± {se:.2f} | "
            f"{row.below_half}/{seeds} |"
        )


def _progress(t0: float, what: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {what} done", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- speed


def speed(repeats: int = 50) -> dict[str, float]:
    """Median ``choose(context)`` time (3 dimensions × 4 values, 5 categorical features), the
    median time of one learner update over 100,000 such episodes (arrays prepared beforehand; wall
    and CPU), and the CPU time of the trainer's two steps before it on the same episodes: reading
    their score documents into rows (:func:`trainer_rows`) and preparing those rows for the update
    (:func:`prepare_cpu_ms`)."""
    import random
    import statistics

    from agent_learning.learning.reinforce import StructuredReinforce, prepare

    policy = speed_policy()
    n = 100_000
    contexts, actions, rewards = speed_episodes(n)
    model, params, batch = prepare(policy.document, Rows(actions, rewards, np.full(n, 1 / 64), [False] * n, contexts))
    learner = StructuredReinforce(LearnerConfig())
    update_ms, update_cpu_ms = [], []
    for _ in range(5):
        t, cpu = time.perf_counter(), time.process_time()
        params, _, _ = learner.step(params, model, batch, None)
        update_ms.append((time.perf_counter() - t) * 1e3)
        update_cpu_ms.append((time.process_time() - cpu) * 1e3)
    rows, read_ms = trainer_rows(policy.document, actions, rewards, contexts)
    prepare_ms = prepare_cpu_ms(policy.document, rows)
    trained = learn_structured(
        LearnerConfig(),
        policy.document,
        Rows(actions[:5000], rewards[:5000], np.full(5000, 1 / 64), [False] * 5000, contexts[:5000]),
    )
    chooser = StructuredPolicy(_next(policy.document, trained), rng=random.Random(1))
    context = contexts[0]
    for _ in range(2_000):
        chooser.choose(context=context)
    per_call = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(2_000):
            chooser.choose(context=context)
        per_call.append((time.perf_counter() - t) / 2_000 * 1e6)
    figures = {
        "choose_us_median": statistics.median(per_call),
        "update_ms_median": statistics.median(update_ms),
        "update_cpu_ms_median": statistics.median(update_cpu_ms),
        "read_cpu_ms_median": read_ms,
        "prepare_cpu_ms_median": prepare_ms,
    }
    for transform in NUMERIC_TRANSFORMS:
        figures[f"choose_us_{transform}"] = numeric_choose_us(transform, repeats)
    return figures


def speed_policy() -> StructuredPolicy:
    """The structured policy of the speed figures: 3 dimensions × 4 values, 5 categorical features."""
    import random

    return StructuredPolicy.create(
        "speed",
        {"prompt": ["a", "b", "c", "d"], "retrieval_k": [1, 3, 5, 10], "tools": ["none", "search", "code", "all"]},
        context={f"f{i}": "category" for i in range(5)},
        rng=random.Random(0),
    )


def speed_episodes(n: int) -> tuple[list[dict[str, Any]], Any, Any]:
    """``n`` episodes of :func:`speed_policy`: contexts (each feature one of 3 values), per-dimension
    value indices and rewards in [−1, 1]."""
    rng = np.random.default_rng(0)
    contexts = [{f"f{i}": f"s{rng.integers(3)}" for i in range(5)} for _ in range(n)]
    actions = rng.integers(0, 4, (n, 3))
    rewards = np.clip(0.5 + 0.2 * (actions[:, 0] == 1) + rng.normal(0, 0.2, n), -1, 1)
    return contexts, actions, rewards


def score_texts(doc: PolicyDocument, actions: Any, rewards: Any, contexts: list[dict[str, Any]]) -> list[str]:
    """Each episode's score document as the scorer stores it (three judges' metrics, the shaped
    reward, the episode's context), as JSON text."""
    from datetime import UTC, datetime

    from agent_learning.documents import JudgeInfo, MetricScore, RewardInfo, Score

    layout = Layout.of(doc)
    metric = MetricScore(raw=4.0, normalised=0.75, result="pass", threshold=3.0, reason="resolved the request",
                         evaluator="intent_resolution", evaluator_version="1.18.10")
    template = Score(
        id="e", episode_id="e", agent_id=doc.agent_id, action_id=layout.joint_id((0,) * len(layout.sizes)),
        policy_version=doc.version, probability=1 / 64, judge=JudgeInfo(name="azure-ai-evaluation", model="gpt-4o"),
        metrics={name: metric for name in ("intent_resolution", "task_adherence", "task_completion")},
        reward=0.5, reward_function=RewardInfo(version="v1", weights={"intent_resolution": 1.0}, penalties={},
                                               components={"weighted": 0.75}),
        scored_at=datetime(2026, 11, 29, tzinfo=UTC), incarnation=doc.incarnation,
    ).to_dict()
    ids = {tuple(a): layout.joint_id(a) for a in {tuple(a) for a in actions.tolist()}}
    return [
        json.dumps({**template, "id": f"e{i}", "episode_id": f"e{i}", "action_id": ids[tuple(a)], "reward": r,
                    "context": c, "seq": i})
        for i, (a, r, c) in enumerate(zip(actions.tolist(), rewards.tolist(), contexts, strict=True))
    ]


def trainer_rows(doc: PolicyDocument, actions: Any, rewards: Any, contexts: list[dict[str, Any]],
                 repeats: int = 3) -> tuple[Rows, float]:
    """The rows the trainer hands the learner for these episodes, and the median CPU time (ms, of
    ``repeats``) of reading them: each score document parsed from its JSON text (as the SQLite store
    returns a row: fresh objects per document; not timed), then validated and sorted by
    :func:`~agent_learning.pipeline.train.collect` and made rows as
    :func:`~agent_learning.pipeline.train.learn` makes them."""
    import statistics

    from agent_learning.pipeline.train import collect

    documents = [json.loads(text) for text in score_texts(doc, actions, rewards, contexts)]
    runs = []
    for _ in range(repeats):
        t = time.process_time()
        batch = collect(doc.agent_id, documents, doc)
        rows = Rows(batch.actions, batch.rewards, batch.probabilities, batch.flags, batch.contexts, None)
        runs.append((time.process_time() - t) * 1e3)
    return rows, statistics.median(runs)


def prepare_cpu_ms(doc: PolicyDocument, rows: Rows) -> float:
    """Median CPU time (ms, of 5) of :func:`~agent_learning.learning.reinforce.prepare` on ``rows``."""
    import statistics

    from agent_learning.learning.reinforce import prepare

    runs = []
    for _ in range(5):
        t = time.process_time()
        prepare(doc, rows)
        runs.append((time.process_time() - t) * 1e3)
    return statistics.median(runs)


NUMERIC_TRANSFORMS = ("standardise", "log", "bins")
"""The declared transforms of a numeric context feature :func:`numeric_choose_us` times."""


def numeric_choose_us(transform: str, repeats: int = 50) -> float:
    """Median ``choose(context)`` time of the same 3 × 4 policy with one categorical feature and one
    numeric feature ``tokens`` declared with ``transform``, trained on 5,000 episodes; each call a
    new number (numbers rarely repeat)."""
    import random
    import statistics

    declared: dict[str, Any] = {"name": "tokens", "kind": "number"}
    if transform != "standardise":
        declared["transform"] = transform
    if transform == "bins":
        declared["bins"] = [100, 1_000, 10_000]
    policy = StructuredPolicy.create(
        "speed-numeric",
        {"prompt": ["a", "b", "c", "d"], "retrieval_k": [1, 3, 5, 10], "tools": ["none", "search", "code", "all"]},
        context={"task": "category", "tokens": "number"},
    )
    doc = PolicyDocument.from_dict({**policy.document.to_dict(), "features": [{"name": "task", "kind": "category"},
                                                                               declared]})
    rng = np.random.default_rng(0)
    n = 5_000
    tokens = np.exp(rng.uniform(np.log(10), np.log(100_000), n))
    contexts = [{"task": f"s{rng.integers(3)}", "tokens": float(t)} for t in tokens]
    actions = rng.integers(0, 4, (n, 3))
    rewards = 0.5 + 0.2 * ((actions[:, 0] == 1) == (tokens > 1_000)) + rng.normal(0, 0.2, n)
    trained = learn_structured(LearnerConfig(), doc, Rows(actions, rewards, np.full(n, 1 / 64), [False] * n, contexts))
    chooser = StructuredPolicy(_next(doc, trained), rng=random.Random(1))
    calls = [{"task": c["task"], "tokens": c["tokens"]} for c in contexts[:2_000]]
    for context in calls:
        chooser.choose(context=context)
    per_call = []
    for _ in range(repeats):
        t = time.perf_counter()
        for context in calls:
            chooser.choose(context=context)
        per_call.append((time.perf_counter() - t) / len(calls) * 1e6)
    return statistics.median(per_call)


def speed_lines(figures: dict[str, float]) -> str:
    numeric = "".join(
        f"| choose(context), a categorical and a numeric feature ({t}) | {figures[f'choose_us_{t}']:.2f} µs |\n"
        for t in NUMERIC_TRANSFORMS if f"choose_us_{t}" in figures
    )
    return (
        "| structured policy, 3 dimensions × 4 values, 5 categorical features | median |\n|---|---:|\n"
        f"| choose(context), pure Python | {figures['choose_us_median']:.2f} µs |\n"
        + numeric
        + f"| one update over 100,000 episodes | {figures['update_ms_median']:.1f} ms |"
        + (f"\n| the same update, CPU time | {figures['update_cpu_ms_median']:.1f} ms |"
           f"\n| the trainer reading their 100,000 score documents into rows, CPU time | "
           f"{figures['read_cpu_ms_median']:.0f} ms |"
           f"\n| preparing those rows for the update, CPU time | "
           f"{figures['prepare_cpu_ms_median']:.1f} ms |" if "prepare_cpu_ms_median" in figures else "")
    )


def plot(figures: dict[str, Any], path: Any) -> None:
    """Regret of every algorithm on every contextual and factorized problem, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for ax, kind in zip(axes, ("contextual", "factorized"), strict=True):
        problems = list(figures[kind])
        if not problems:
            ax.set_axis_off()
            continue
        algorithms = list(figures[kind][problems[0]])
        width = 0.8 / len(algorithms)
        for j, name in enumerate(algorithms):
            values = [figures[kind][p][name]["regret_mean"] for p in problems]
            ax.bar(
                np.arange(len(problems)) + j * width,
                values,
                width,
                label=name,
                edgecolor="black" if "ours" in name else None,
                linewidth=1.5 if "ours" in name else 0,
            )
        ax.set_xticks(np.arange(len(problems)) + 0.4 - width / 2, problems)
        ax.set_ylabel("regret (mean of seeds)")
        ax.set_title(f"{kind} problems")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
