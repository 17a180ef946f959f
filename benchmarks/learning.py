"""Learning quality: our REINFORCE learner against standard bandit algorithms.

Simulated K-armed problems with rewards in [0, 1]; the learner and batched Thompson sampling
(on the raw reward, a Normal posterior that sees the rewards' scale, with and without the learner's
forgetting; and Beta-Bernoulli) update every ``batch`` episodes (the training timer), UCB1 and
ε-greedy after every episode. The ratio column divides by Thompson sampling on the raw reward
without forgetting, with the ratio's paired standard error.
For each problem and algorithm, over ``seeds`` seeds: cumulative (expected) regret after
``horizon`` episodes, the probability the final policy puts on the best action, and the
number of episodes until that probability first reaches 0.9 (checked after every update).

    python benchmarks/learning.py [--seeds 20] [--horizon 2000] [--plot regret.png] [--json out.json]

Non-stationarity, on K=4 Bernoulli after ``horizon`` episodes, two changes: the best and the
worst arm swap (0.8/0.7/0.6/0.5 becomes 0.5/0.7/0.6/0.8: the leader falls, which its own
episodes show), and the worst arm rises above the best (0.8/0.7/0.6/0.9: the leader stays as
good, and only episodes of an arm the policy has learned to avoid can show the change).
Reported are the episodes after the change until the policy first puts ≥ 0.5 on the new best
arm (checked after every update, up to 20,000).

Contextual, factorized and interaction problems (``benchmarks/structured.py``) run in the same command unless
``--no-structured`` (``--no-contextual`` keeps the factorized ones alone, without Vowpal Wabbit:
``--seeds 200 --no-stationary --no-shift --no-contextual`` gives the factorized figures over 200
seeds); the contextual ones need ``vowpalwabbit`` (``pip install -e 'shared[bench]'``). Every row
counts the seeds whose final policy gives the best action less than 0.5 ("best < 0.5").
``--speed`` adds the structured policy's choose and update times; ``--guardrail`` the regret of
ours behind the publish guardrail as the trainer runs it (:func:`agent_learning.evaluation.review`:
a held update is not applied and its batch is learned again with the next one; a shrunk one is
applied as shrunk) against ours without it. ``--interaction`` runs the interaction problems alone.
``--gap`` runs nothing else:
where ours' regret against per-dimension Thompson builds up on the 300-configuration problem,
per 500 episodes, with what Thompson's probabilities and the greedy choice would cost on ours'
own episodes (``docs/benchmarks.md``, "Where the gap is").

Progress goes to stderr; markdown tables (and JSON) to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from agent_learning.evaluation import GuardrailConfig, review
from agent_learning.learning.reinforce import Batch, LearnerConfig, Reinforce, softmax
from agent_learning.policy.softmax import DEFAULT_EXPLORATION_FLOOR, SoftmaxPolicy, mix_floor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import structured  # beside this file: the contextual and factorized problems

Rng = np.random.Generator


# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class Problem:
    """A K-armed bandit: arm means and a reward sampler."""

    name: str
    means: np.ndarray
    kind: str = "bernoulli"  # "bernoulli" or "gaussian" (clipped to [low, high])
    sigma: float = 0.25
    low: float = 0.0
    high: float = 1.0
    batch: int = 50

    def draw(self, rng: Rng, pulls: int) -> np.ndarray:
        """``pulls`` rewards of every arm, shape (K, pulls)."""
        mu = self.means[:, None]
        if self.kind == "bernoulli":
            return (rng.random((len(self.means), pulls)) < mu).astype(float)
        return np.clip(rng.normal(mu, self.sigma, (len(self.means), pulls)), self.low, self.high)

    @property
    def expected(self) -> np.ndarray:
        """Every arm's expected reward: ``means``, or for a clipped Gaussian the mean of the
        clipped distribution (clipping pulls a mean near a bound toward the middle)."""
        if self.kind == "bernoulli":
            return self.means
        z = NormalDist()
        cdf, pdf = np.vectorize(z.cdf), np.vectorize(z.pdf)
        lo, hi = (self.low - self.means) / self.sigma, (self.high - self.means) / self.sigma
        inside = self.means * (cdf(hi) - cdf(lo)) + self.sigma * (pdf(lo) - pdf(hi))
        return self.low * cdf(lo) + self.high * (1.0 - cdf(hi)) + inside

    @property
    def best(self) -> int:
        return int(np.argmax(self.expected))


def k16_means() -> np.ndarray:
    rng = np.random.default_rng(16)
    return np.concatenate([[0.8], rng.uniform(0.5, 0.7, 15)])


def k64_means() -> np.ndarray:
    rng = np.random.default_rng(64)
    return np.concatenate([[0.8], rng.uniform(0.5, 0.7, 63)])


K4 = np.array([0.8, 0.7, 0.6, 0.5])
PROBLEMS: list[Problem] = [
    Problem("K=4 Bernoulli", K4),
    Problem("K=16 Bernoulli", k16_means()),
    Problem("K=4 Gaussian", K4, kind="gaussian"),
    Problem("K=16 Gaussian", k16_means(), kind="gaussian"),
    Problem("K=4 small gap (0.55 vs 0.5)", np.array([0.55, 0.5, 0.5, 0.5])),
    Problem("K=64 Bernoulli", k64_means()),
    Problem(
        "K=4 narrow band 0.6-0.7", np.array([0.68, 0.66, 0.64, 0.62]), kind="gaussian", sigma=0.03, low=0.6, high=0.7
    ),
    Problem("K=4 batch 10", K4, batch=10),
    Problem("K=4 batch 500", K4, batch=500),
]


class Environment:
    """One realisation of a problem. Every arm's rewards are drawn in advance from the seed, so
    the j-th pull of arm a pays the same whichever algorithm pulls it: the algorithms are
    compared on the same luck (common random numbers), which makes their ratios much less
    noisy than independent draws would at the same number of seeds."""

    def __init__(self, problem: Problem, seed: int, pulls: int) -> None:
        self.problem = problem
        self.table = problem.draw(np.random.default_rng(seed), pulls)
        self.pulled = np.zeros(len(problem.means), dtype=np.int64)

    def pull(self, actions: np.ndarray) -> np.ndarray:
        rewards = np.empty(len(actions))
        for arm in np.unique(actions):
            where = np.flatnonzero(actions == arm)
            start = self.pulled[arm]
            rewards[where] = self.table[arm, start : start + len(where)]
            self.pulled[arm] += len(where)
        return rewards


# --------------------------------------------------------------------------- algorithms


class Algorithm:
    """A bandit algorithm: choose a batch of actions, then learn from their rewards."""

    name = "?"

    def __init__(self, k: int, rng: Rng) -> None:
        self.k, self.rng = k, rng

    def probs(self) -> np.ndarray:
        """The probability of choosing each action now."""
        raise NotImplementedError

    def run_batch(self, env: Environment, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Choose ``n`` actions with the current (frozen) policy, observe, update once."""
        p = self.probs()
        actions = self.rng.choice(self.k, size=n, p=p)
        rewards = env.pull(actions)
        self.update(actions, rewards, p[actions])
        return actions, rewards

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        raise NotImplementedError


class Ours(Algorithm):
    """agent_learning's learner with its defaults, the default exploration floor included; the
    learner state rides from update to update as it does in the policy documents."""

    name = "REINFORCE (ours)"

    def __init__(
        self, k: int, rng: Rng, config: LearnerConfig | None = None, floor: float = DEFAULT_EXPLORATION_FLOOR
    ) -> None:
        super().__init__(k, rng)
        self.learner = Reinforce(config)
        self.theta = np.zeros(k)
        self.state: dict = {}
        self.floor = floor if floor * k < 1 else 0.5 / k / k

    def probs(self) -> np.ndarray:
        return np.asarray(mix_floor(list(softmax(self.theta)), self.floor))

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        update = self.learner.update(self.theta, Batch.from_arrays(actions, rewards, logged, self.k), state=self.state)
        self.theta, self.state = update.logits, update.state


class Guarded(Ours):
    """Ours behind the publish guardrail as the trainer runs it (:func:`agent_learning.evaluation.review`
    on the two versions' documents): a held candidate is not applied and its batch is learned again
    with the next one; a shrunk one is applied as shrunk, with the candidate's learner state."""

    name = "REINFORCE + guardrail"

    def __init__(self, k: int, rng: Rng, guardrail: GuardrailConfig | None = None) -> None:
        super().__init__(k, rng)
        self.guardrail = guardrail or GuardrailConfig()
        self.document = SoftmaxPolicy.from_actions(
            "bench", [f"a{i}" for i in range(k)], exploration_floor=self.floor
        ).to_document(created_at=datetime(2026, 1, 1, tzinfo=UTC))
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.held = self.shrunk = self.updates = 0

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        self.pending.append((actions, rewards, logged))
        a, r, mu = (np.concatenate(x) for x in zip(*self.pending, strict=True))
        update = self.learner.update(self.theta, Batch.from_arrays(a, r, mu, self.k), state=self.state)
        current = self.document.model_copy(update={"logits": [float(x) for x in self.theta]})
        candidate = current.model_copy(update={"logits": [float(x) for x in update.logits]})
        found = review(self.guardrail, current, candidate, [(int(x),) for x in a], r.tolist(), mu.tolist(),
                       [None] * len(a))
        assert found is not None
        evaluation, published = found
        self.updates += 1
        if evaluation.verdict == "held":
            self.held += 1
            return
        self.shrunk += evaluation.verdict == "shrunk"
        self.theta, self.state, self.pending = np.asarray(published.logits), update.state, []


class BatchedThompson(Algorithm):
    """Beta-Bernoulli Thompson sampling; rewards in [0, 1] enter as Bernoulli(reward) draws.
    The posterior is updated once per batch, like the timer-driven learner."""

    name = "Thompson (Beta, batched)"

    def __init__(self, k: int, rng: Rng) -> None:
        super().__init__(k, rng)
        self.a, self.b = np.ones(k), np.ones(k)

    def probs(self, samples: int = 4000) -> np.ndarray:
        draws = self.rng.beta(self.a, self.b, size=(samples, self.k))
        return np.bincount(draws.argmax(axis=1), minlength=self.k) / samples

    def run_batch(self, env: Environment, n: int) -> tuple[np.ndarray, np.ndarray]:
        draws = self.rng.beta(self.a, self.b, size=(n, self.k))
        actions = draws.argmax(axis=1)
        rewards = env.pull(actions)
        self.update(actions, rewards, np.ones(n))
        return actions, rewards

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        success = (self.rng.random(len(rewards)) < rewards).astype(float)
        self.a += np.bincount(actions, weights=success, minlength=self.k)
        self.b += np.bincount(actions, weights=1 - success, minlength=self.k)


class GaussianThompson(Algorithm):
    """Thompson sampling on the raw reward, the reference the table's ratio divides by: a Normal
    posterior of each arm's mean with the arm's sample variance taken as known, one prior
    pseudo-pull of 0.5 (variance 0.25 before two pulls), so N((0.5 + Σr) / (n + 1), s² / (n + 1))
    (:class:`structured.RawPosterior`). Unlike the Beta-Bernoulli reference it sees the rewards'
    scale, as the learner does. Updated once per batch; it never forgets."""

    name = "Thompson (raw reward, batched)"
    half_life: float | None = None
    min_variance = structured.RawPosterior.min_variance

    def __init__(self, k: int, rng: Rng) -> None:
        super().__init__(k, rng)
        self.raw = structured.RawPosterior((k,), self.half_life)

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Every arm's posterior mean and standard deviation."""
        return self.raw.posterior()

    def probs(self, samples: int = 4000) -> np.ndarray:
        return self.raw.probabilities(self.rng, samples)

    def run_batch(self, env: Environment, n: int) -> tuple[np.ndarray, np.ndarray]:
        actions = self.raw.draws(self.rng, n).argmax(axis=1)
        rewards = env.pull(actions)
        self.update(actions, rewards, np.ones(n))
        return actions, rewards

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        self.raw.learn(actions, rewards)


class FadingGaussianThompson(GaussianThompson):
    """Thompson sampling on the raw reward whose sums (n, Σr, Σr²) fade by 2^(−N/H) before each
    batch of N adds, H the learner's default evidence half-life (3,000 episodes), as its evidence does."""

    name = "Thompson (raw reward, batched, forgetting)"
    half_life = structured.HALF_LIFE


class UCB1(Algorithm):
    """UCB1 (Auer et al. 2002), updated after every episode."""

    name = "UCB1"

    def __init__(self, k: int, rng: Rng) -> None:
        super().__init__(k, rng)
        self.n, self.s = np.zeros(k), np.zeros(k)

    def _index(self) -> int:
        if (untried := np.flatnonzero(self.n == 0)).size:
            return int(untried[0])
        t = self.n.sum()
        return int(np.argmax(self.s / self.n + np.sqrt(2 * np.log(t) / self.n)))

    def probs(self) -> np.ndarray:
        p = np.zeros(self.k)
        p[self._index()] = 1.0
        return p

    def run_batch(self, env: Environment, n: int) -> tuple[np.ndarray, np.ndarray]:
        actions, rewards = np.empty(n, dtype=int), np.empty(n)
        for i in range(n):
            a = self._index()
            r = env.pull(np.array([a]))[0]
            self.n[a] += 1
            self.s[a] += r
            actions[i], rewards[i] = a, r
        return actions, rewards


class EpsilonGreedy(UCB1):
    """ε-greedy with ε = 0.1, updated after every episode."""

    name = "ε-greedy (0.1)"
    eps = 0.1

    def _greedy(self) -> int:
        means = np.where(self.n > 0, self.s / np.maximum(self.n, 1), np.inf)
        return int(np.argmax(means))

    def probs(self) -> np.ndarray:
        p = np.full(self.k, self.eps / self.k)
        p[self._greedy()] += 1 - self.eps
        return p

    def _index(self) -> int:
        return int(self.rng.integers(self.k)) if self.rng.random() < self.eps else self._greedy()


class Uniform(Algorithm):
    name = "uniform"

    def probs(self) -> np.ndarray:
        return np.full(self.k, 1 / self.k)

    def update(self, actions: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> None:
        return None


ALGORITHMS: list[Callable[[int, Rng], Algorithm]] = [
    Ours,
    GaussianThompson,
    FadingGaussianThompson,
    BatchedThompson,
    UCB1,
    EpsilonGreedy,
    Uniform,
]


# --------------------------------------------------------------------------- running


@dataclass
class Result:
    regret: list[float] = field(default_factory=list)
    p_best: list[float] = field(default_factory=list)
    reach: list[int | None] = field(default_factory=list)
    curves: list[np.ndarray] = field(default_factory=list)


def run(
    problem: Problem, make: Callable[[int, Rng], Algorithm], seed: int, horizon: int
) -> tuple[float, float, int | None, np.ndarray]:
    env = Environment(problem, seed, horizon)
    algo = make(len(problem.means), np.random.default_rng([seed, 1]))
    gap = problem.expected[problem.best] - problem.expected
    curve, total, done, reach = [], 0.0, 0, None
    while done < horizon:
        n = min(problem.batch, horizon - done)
        actions, _ = algo.run_batch(env, n)
        total += gap[actions].sum()
        done += n
        curve.append((done, total))
        if reach is None and algo.probs()[problem.best] >= 0.9:
            reach = done
    return total, float(algo.probs()[problem.best]), reach, np.array(curve)


SHIFT_AFTER = np.array([0.5, 0.7, 0.6, 0.8])
"""The best and the worst arm swap."""
RISE_AFTER = np.array([0.8, 0.7, 0.6, 0.9])
"""The worst arm rises above the best, which stays as good."""
CHANGES = {"best and worst swap": SHIFT_AFTER, "the worst arm rises above the best": RISE_AFTER}
SHIFT_CAP = 20_000


CURVE_EPISODES = 8_000
"""Episodes after the change that the recovery plot shows."""


def after_change(
    make: Callable[[int, Rng], Algorithm], seed: int, horizon: int, batch: int, after_means: np.ndarray
) -> Iterator[float]:
    """``horizon`` episodes of K4, then P(new best) after each batch of ``after_means`` (up to the cap)."""
    before = Environment(Problem("before", K4, batch=batch), seed, horizon)
    after = Environment(Problem("after", after_means, batch=batch), seed + 10_000, SHIFT_CAP)
    algo = make(len(K4), np.random.default_rng([seed, 1]))
    for done in range(0, horizon, batch):
        algo.run_batch(before, min(batch, horizon - done))
    for _ in range(0, SHIFT_CAP, batch):
        algo.run_batch(after, batch)
        yield float(algo.probs()[after.problem.best])


def recovery(
    make: Callable[[int, Rng], Algorithm],
    seed: int,
    horizon: int,
    batch: int = 50,
    after_means: np.ndarray = SHIFT_AFTER,
    curve: list[float] | None = None,
) -> int | None:
    """Episodes after K4 becomes ``after_means`` until P(new best) ≥ 0.5 (None: not within the cap);
    ``curve``, if given, receives P(new best) after each batch of the first ``CURVE_EPISODES``."""
    recovered, wanted = None, CURVE_EPISODES // batch if curve is not None else 0
    for i, p in enumerate(after_change(make, seed, horizon, batch, after_means)):
        if i < wanted:
            curve.append(p)  # type: ignore[union-attr]
        if recovered is None and p >= 0.5:
            recovered = (i + 1) * batch
        if recovered is not None and i + 1 >= wanted:
            break
    return recovered


def shift_table(
    seeds: int, horizon: int, t0: float, after_means: np.ndarray = SHIFT_AFTER
) -> tuple[list[str], dict[str, dict[str, float | int | None]], dict[str, np.ndarray]]:
    """The recovery table after K4 becomes ``after_means``, its figures, and per algorithm the mean
    P(new best) after each batch of the first ``CURVE_EPISODES`` episodes."""
    lines = [
        "| algorithm | seeds recovering | episodes to P(new best) ≥ 0.5: median | max |",
        "|---|---:|---:|---:|",
    ]
    out: dict[str, dict[str, float | int | None]] = {}
    curves: dict[str, np.ndarray] = {}
    for make in ALGORITHMS[:-1]:  # uniform never prefers any arm
        seen: list[list[float]] = [[] for _ in range(seeds)]
        times = [recovery(make, seed, horizon, after_means=after_means, curve=seen[seed]) for seed in range(seeds)]
        curves[make.name] = np.mean(seen, axis=0)  # type: ignore[attr-defined]
        ok = [t for t in times if t is not None]
        row = {"recovered": len(ok), "median": float(np.median(ok)) if ok else None, "max": max(ok) if ok else None}
        out[make.name] = row  # type: ignore[attr-defined]
        med = "" if row["median"] is None else int(row["median"])
        lines.append(f"| {make.name} | {len(ok)}/{seeds} | {med} | {row['max'] or ''} |")  # type: ignore[attr-defined]
        print(f"[{time.perf_counter() - t0:6.1f} s] best arm changes ({'/'.join(map(str, after_means))}): "
              f"{make.name} done", file=sys.stderr, flush=True)
    return lines, out, curves


def guardrail_table(seeds: int, horizon: int, t0: float) -> tuple[list[str], dict[str, dict[str, float | int]]]:
    """Regret of ours with the publish guardrail (defaults) against ours without it, same seeds,
    and how many updates it held; then episodes to recover when the best arm changes."""
    lines = [
        "| problem | ours | ours + guardrail | ratio | updates held | updates shrunk |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    out: dict[str, dict[str, float | int]] = {}
    for problem in PROBLEMS:
        guarded: list[Guarded] = []

        def make(k: int, rng: Rng, guarded: list[Guarded] = guarded) -> Guarded:
            guarded.append(Guarded(k, rng))
            return guarded[-1]

        plain = [run(problem, Ours, seed, horizon)[0] for seed in range(seeds)]
        on = [run(problem, make, seed, horizon)[0] for seed in range(seeds)]
        held, updates = sum(g.held for g in guarded), sum(g.updates for g in guarded)
        shrunk = sum(g.shrunk for g in guarded)
        row = {"ours": float(np.mean(plain)), "guarded": float(np.mean(on)), "held": held, "shrunk": shrunk,
               "updates": updates}
        row["ratio"] = row["guarded"] / row["ours"]
        out[problem.name] = row
        lines.append(
            f"| {problem.name} | {row['ours']:.1f} | {row['guarded']:.1f} | {row['ratio']:.3f}× | {held}/{updates} "
            f"| {shrunk}/{updates} |"
        )
        print(f"[{time.perf_counter() - t0:6.1f} s] guardrail: {problem.name} done", file=sys.stderr, flush=True)
    lines += ["", "| best arm changes | seeds recovering | episodes to recover: median | max |", "|---|---:|---:|---:|"]
    for (change, after_means), key in zip(CHANGES.items(), ("recovery", "rise"), strict=True):
        for name, make_algo in (("ours", Ours), ("ours + guardrail", Guarded)):
            times = (recovery(make_algo, seed, horizon, after_means=after_means) for seed in range(seeds))
            ok = [t for t in times if t is not None]
            median, longest = (float(np.median(ok)), max(ok)) if ok else (-1.0, -1)
            out[f"{key}: {name}"] = {"recovered": len(ok), "median": median, "max": longest}
            lines.append(f"| {change}: {name} | {len(ok)}/{seeds} | {median:.0f} | {longest} |")
    return lines, out


def positive(text: str) -> int:
    """A command-line count: a whole number of at least 1."""
    value = int(text)  # argparse names the option and the value if this fails
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def named(parser: argparse.ArgumentParser, problems: list[Any], prefixes: str) -> list[Any]:
    """The ``problems`` whose names start with ``prefixes`` (all if empty; names hold commas, as in
    "300, drawn per seed") or else with one of its comma-separated parts; a part that names none
    of them is an error that lists the names."""
    wanted = [prefixes] if any(p.name.startswith(prefixes) for p in problems) else prefixes.split(",")
    for x in wanted:
        if not any(p.name.startswith(x) for p in problems):
            parser.error(f"--problems: {x!r} names no problem here (one of: {', '.join(p.name for p in problems)})")
    return [p for p in problems if any(p.name.startswith(x) for x in wanted)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive, default=20)
    parser.add_argument("--horizon", type=positive, default=2_000)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--problems", default="", help="comma-separated name prefixes (default: all)")
    parser.add_argument("--no-shift", action="store_true", help="skip the non-stationarity run")
    parser.add_argument("--no-stationary", action="store_true", help="skip the stationary problems")
    parser.add_argument("--no-structured", action="store_true", help="skip the contextual and factorized problems")
    parser.add_argument("--no-contextual", action="store_true", help="of the structured problems, the factorized only")
    parser.add_argument("--speed", action="store_true", help="time the structured policy's choose and update")
    parser.add_argument("--guardrail", action="store_true", help="regret with the publish guardrail on vs off")
    parser.add_argument(
        "--gap",
        action="store_true",
        help="only: where ours' regret against per-dimension Thompson builds up (the factorized problems "
        "--problems names, by default the fixed 300 configurations)",
    )
    parser.add_argument(
        "--interaction",
        action="store_true",
        help="only: the problem whose best configuration needs a depth × tool interaction, ours with and "
        "without the pair declared against Thompson sampling on the pair's joint",
    )
    args = parser.parse_args(argv)
    if args.interaction:
        print("\n".join(structured.interaction_lines(args.seeds, time.perf_counter(), {})))
        return
    if args.gap:
        for problem in named(parser, structured.FACTOR_PROBLEMS, args.problems or structured.FACTOR_PROBLEMS[1].name):
            print("\n".join(structured.gap_lines(problem, args.seeds, time.perf_counter())))
        return

    chosen = [] if args.no_stationary else named(parser, PROBLEMS, args.problems)
    table: dict[str, dict[str, Result]] = {}
    t0 = time.perf_counter()
    for problem in chosen:
        table[problem.name] = {}
        for make in ALGORITHMS:
            res = Result()
            for seed in range(args.seeds):
                regret, p_best, reach, curve = run(problem, make, seed, args.horizon)
                res.regret.append(regret)
                res.p_best.append(p_best)
                res.reach.append(reach)
                res.curves.append(curve)
            table[problem.name][make.name] = res  # type: ignore[attr-defined]
            print(f"[{time.perf_counter() - t0:6.1f} s] {problem.name}: {make.name} done", file=sys.stderr, flush=True)

    lines = [
        "| problem | algorithm | regret (mean ± sd) | vs raw-reward Thompson (± paired se) | vs Beta Thompson | "
        "P(best) at end | seeds reaching 0.9 | episodes to 0.9 (median) | best < 0.5 (seeds) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    out: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for pname, algos in table.items():
        reference = np.array(algos[GaussianThompson.name].regret)
        beta = float(np.mean(algos[BatchedThompson.name].regret))
        out[pname] = {}
        for aname, res in algos.items():
            reached = [r for r in res.reach if r is not None]
            row = {
                "regret_mean": float(np.mean(res.regret)),
                "regret_sd": float(np.std(res.regret)),
                "vs_reference": float(np.mean(res.regret)) / reference.mean(),
                "vs_reference_se": structured.paired_se(np.array(res.regret), reference),
                "vs_beta_thompson": float(np.mean(res.regret)) / beta if beta else None,
                "p_best_mean": float(np.mean(res.p_best)),
                "p_best_min": float(np.min(res.p_best)),
                "reached": len(reached),
                "reach_median": float(np.median(reached)) if reached else None,
                "best_below_half": int(sum(p < 0.5 for p in res.p_best)),
            }
            out[pname][aname] = row
            lines.append(
                f"| {pname} | {aname} | {row['regret_mean']:.1f} ± {row['regret_sd']:.1f} | "
                f"{row['vs_reference']:.2f}× ± {row['vs_reference_se']:.2f} | "
                f"{'' if row['vs_beta_thompson'] is None else format(row['vs_beta_thompson'], '.2f') + '×'} | "
                f"{row['p_best_mean']:.3f} | {row['reached']}/{args.seeds} | "
                f"{'' if row['reach_median'] is None else int(row['reach_median'])} | "
                f"{row['best_below_half']}/{args.seeds} |"
            )
    if table:
        print("\n".join(lines))
    results: dict[str, object] = {"problems": out}
    change_curves: dict[str, dict[str, np.ndarray]] = {}
    if not args.no_shift:
        for (change, after_means), key in zip(CHANGES.items(), ("best_arm_changes", "worse_arm_rises"), strict=True):
            shift_lines, results[key], change_curves[change] = shift_table(args.seeds, args.horizon, t0, after_means)
            print(f"\nThe best arm changes after {args.horizon} episodes (K=4 Bernoulli, {change}):\n")
            print("\n".join(shift_lines))
    if not args.no_structured:
        structured_lines, results["structured"] = structured.tables(args.seeds, t0, contextual=not args.no_contextual)
        kinds = "Factorized" if args.no_contextual else "Contextual and factorized"
        print(f"\n{kinds} problems ({args.seeds} seeds):\n")
        print("\n".join(structured_lines))
    if args.guardrail:
        guard_lines, results["guardrail"] = guardrail_table(args.seeds, args.horizon, t0)
        print(f"\nThe publish guardrail on vs off ({args.seeds} seeds, defaults):\n")
        print("\n".join(guard_lines))
    if args.speed:
        results["speed"] = structured.speed()
        print("\n" + structured.speed_lines(results["speed"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        if table:
            plot(table, args.plot)
        if "structured" in results:
            structured.plot(results["structured"], args.plot.with_name(args.plot.stem + "_structured.png"))
        if change_curves:
            plot_changes(change_curves, args.plot.with_name(args.plot.stem + "_changes.png"))


def _panels(n: int) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels side by side (matplotlib imported here: only plots need it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    return fig, list(axes[0])


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(table: dict[str, dict[str, Result]], path: Path) -> None:
    names = [n for n in table if n in ("K=4 Bernoulli", "K=16 Bernoulli")] or list(table)[:2]
    fig, axes = _panels(len(names))
    for ax, pname in zip(axes, names, strict=False):
        for aname, res in table[pname].items():
            x = res.curves[0][:, 0]
            y = np.mean([c[:, 1] for c in res.curves], axis=0)
            ax.plot(x, y, label=aname, linewidth=2.4 if "ours" in aname else 1.4)
        ax.set_title(f"{pname}: cumulative regret (mean of seeds)")
        ax.set_xlabel("episodes")
        ax.set_ylabel("regret")
    _save(fig, path)


def plot_changes(curves: dict[str, dict[str, np.ndarray]], path: Path) -> None:
    """Per change, each algorithm's mean probability on the new best arm after the change."""
    fig, axes = _panels(len(curves))
    for ax, (change, by_algorithm) in zip(axes, curves.items(), strict=True):
        for name, mean in by_algorithm.items():
            if name == "UCB1":
                continue  # its greedy index flips between arms: not a probability to compare
            x = np.arange(1, len(mean) + 1) * (CURVE_EPISODES // len(mean))
            ax.plot(x, mean, label=name, linewidth=2.4 if "ours" in name else 1.4)
        ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"K=4 Bernoulli, {change}")
        ax.set_xlabel("episodes after the change")
        ax.set_ylabel("P(new best arm), mean of seeds")
        ax.set_ylim(0, 1)
    _save(fig, path)


if __name__ == "__main__":
    main()
