"""Off-policy evaluation on simulated logs with known truth: bias, spread and interval coverage.

Five actions, three context groups (shares 0.5/0.3/0.2), Bernoulli rewards with a known mean
per group and action. Logs are drawn from a logging policy, then IPS, SNIPS and DR
(:mod:`agent_learning.evaluation`) estimate a target policy's mean reward with a 95% interval;
over ``--reps`` replications we report the bias (mean estimate − truth) with its standard
error, the spread (standard deviation of the estimates), the mean interval width, the coverage
(share of intervals holding the truth) and the mean effective sample size.

    python benchmarks/evaluation.py [--reps 400] [--episodes 2000] [--json out.json] [--speed]
    python benchmarks/evaluation.py --grid [--reps 1000]

Logging policies: uniform; a softmax per group (what a learning agent logs); and a
near-deterministic one (0.96 on one action per group, 0.01 on the others). Targets: another
per-group softmax (a candidate), and "always action 4" (what would every request on one
configuration have earned). ``--speed`` times one candidate against the current version over
100,000 episodes (:func:`speed`). ``--grid`` prints the known-truth coverage grid instead
(:func:`coverage_grid`): K 4/16/100 × n 200/1,000/10,000, a rare-action target and an ordinary
one, whether each cell's intervals cover or its misses are marked unreliable. Progress to stderr,
a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from agent_learning.documents import Measures
from agent_learning.evaluation import (
    ESTIMATORS,
    GuardrailConfig,
    Logs,
    Target,
    compare,
    estimator_named,
    evaluate,
    review,
)
from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy

GROUP_SHARES = np.array([0.5, 0.3, 0.2])
MEANS = np.array(  # true mean reward q(g, a)
    [
        [0.55, 0.70, 0.40, 0.60, 0.35],
        [0.30, 0.45, 0.80, 0.50, 0.60],
        [0.65, 0.25, 0.50, 0.35, 0.75],
    ]
)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


LOGGING = {
    "uniform": np.full(MEANS.shape, 1 / MEANS.shape[1]),
    "softmax": _softmax(4 * MEANS),
    "near-deterministic": np.where(np.eye(3, 5, dtype=bool), 0.96, 0.01),
}
TARGETS = {
    "candidate": _softmax(8 * MEANS),
    "always action 4": np.tile(np.eye(5)[3], (3, 1)),
}


@dataclass(frozen=True)
class Setting:
    logging: str
    target: str

    @property
    def truth(self) -> float:
        return float(GROUP_SHARES @ (TARGETS[self.target] * MEANS).sum(axis=1))

    def draw(self, rng: np.random.Generator, n: int) -> tuple[Logs, Target]:
        """n logged episodes and the target's probabilities on them."""
        groups = rng.choice(len(GROUP_SHARES), size=n, p=GROUP_SHARES)
        mu = LOGGING[self.logging][groups]
        actions = (mu.cumsum(axis=1) > rng.random(n)[:, None]).argmax(axis=1)
        rewards = (rng.random(n) < MEANS[groups, actions]).astype(float)
        logs = Logs.of(actions, rewards, mu[np.arange(n), actions], MEANS.shape[1], groups)
        return logs, Target.of_table(TARGETS[self.target], groups)


def settings() -> list[Setting]:
    return [Setting(lg, t) for lg in LOGGING for t in TARGETS]


def replicate(setting: Setting, estimator: str, reps: int, n: int, seed: int = 0) -> dict[str, float]:
    """Bias, its standard error, spread, mean width, coverage and mean ESS over ``reps`` logs
    (common random numbers: the same seed gives every estimator the same logs)."""
    rng = np.random.default_rng(seed)
    est = estimator_named(estimator)
    values, widths, covered, ess = [], [], 0, []
    for _ in range(reps):
        logs, target = setting.draw(rng, n)
        e = evaluate(logs, target, est)
        values.append(e.value)
        widths.append(e.high - e.low)
        covered += e.low <= setting.truth <= e.high
        ess.append(e.effective_sample_size)
    v = np.array(values)
    return {
        "truth": setting.truth,
        "bias": float(v.mean() - setting.truth),
        "bias_se": float(v.std(ddof=1) / np.sqrt(reps)),
        "std": float(v.std(ddof=1)),
        "width": float(np.mean(widths)),
        "coverage": covered / reps,
        "ess": float(np.mean(ess)),
    }


GRID_ACTIONS = (4, 16, 100)
GRID_EPISODES = (200, 1_000, 10_000)
GRID_TARGETS = ("ordinary", "rare actions")
GRID_COVERS = 0.9
"""A grid cell passes when its intervals cover the truth this often, or when this share of the
replications whose interval misses are marked unreliable (:class:`~agent_learning.evaluation.Diagnostics`)."""


@dataclass(frozen=True)
class Cell:
    """One cell of the coverage grid: K Bernoulli actions, logged by a learning agent's softmax (the
    exploration floor 0.01 mixed in), so that some actions are logged far less than others, and a
    target: ``ordinary``, the log's softmax sharpened towards the better actions (a candidate one step
    on), or ``rare actions``, 90% of its mass on the quarter of the actions the log takes least."""

    k: int
    target: str

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The true means, the logging policy and the target (each over the K actions)."""
        rng = np.random.default_rng(self.k)
        means = rng.uniform(0.2, 0.8, self.k)
        logits = np.linspace(0.0, -6.0, self.k)[rng.permutation(self.k)]
        logging = 0.99 * _softmax(logits[None, :])[0] + 0.01 / self.k
        if self.target == "ordinary":
            target = _softmax((logits + 4 * (means - means.mean()))[None, :])[0]
        else:
            rare = np.argsort(logging)[: max(self.k // 4, 1)]
            target = np.full(self.k, 0.1 / (self.k - len(rare)))
            target[rare] = 0.9 / len(rare)
        return means, logging, target


def grid_cell(cell: Cell, n: int, reps: int, seed: int = 0) -> dict[str, float]:
    """Over ``reps`` logs of ``n`` episodes, SNIPS's 95% interval within the rewards' range (as the
    guardrail takes it): the share that covers the target's true value, and of those that miss, the
    share marked unreliable (1 when none misses)."""
    means, logging, target = cell.arrays()
    truth = float(target @ means)
    rng = np.random.default_rng(seed)
    snips = estimator_named("snips")
    covered = missed_unreliable = 0
    for _ in range(reps):
        actions = rng.choice(cell.k, size=n, p=logging)
        rewards = (rng.random(n) < means[actions]).astype(float)
        logs = Logs.of(actions, rewards, logging[actions], cell.k)
        found = evaluate(logs, Target.of_table(target[None, :], np.zeros(n, dtype=np.int64)), snips,
                         bounds=(0.0, 1.0))
        if found.low <= truth <= found.high:
            covered += 1
        else:
            assert found.diagnostics is not None
            missed_unreliable += not found.diagnostics.reliable
    misses = reps - covered
    return {"coverage": covered / reps, "misses_unreliable": missed_unreliable / misses if misses else 1.0}


def passes(figures: dict[str, float]) -> bool:
    """The grid's rule (:data:`GRID_COVERS`)."""
    return figures["coverage"] >= GRID_COVERS or figures["misses_unreliable"] >= GRID_COVERS


def coverage_grid(reps: int = 1000, seed: int = 0) -> list[dict[str, object]]:
    """Every cell of the grid (progress to stderr)."""
    rows: list[dict[str, object]] = []
    for target in GRID_TARGETS:
        for k in GRID_ACTIONS:
            for n in GRID_EPISODES:
                print(f"grid: {target}, K={k}, n={n} ...", file=sys.stderr, flush=True)
                figures = grid_cell(Cell(k, target), n, reps, seed)
                rows.append({"target": target, "k": k, "n": n, **figures, "passes": passes(figures)})
    return rows


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def speed(n: int = 100_000, repeats: int = 7) -> dict[str, float]:
    """Median ms of evaluating one candidate against the current version over ``n`` logged
    episodes: the paired SNIPS comparison alone, and the guardrail's whole review from the
    documents (probabilities of every episode under both versions included) for a flat policy
    with a token budget and for a structured one (3 dimensions × 4 values, 5 categorical
    features)."""
    rng = np.random.default_rng(1)
    logs, current = Setting("softmax", "candidate").draw(rng, n)
    candidate = Target.of_table(_softmax(5 * MEANS), current.rows)
    out = {"compare": _median_ms(lambda: compare(logs, candidate, current, estimator_named("snips")), repeats)}

    now = datetime(2026, 1, 1, tzinfo=UTC)
    flat = SoftmaxPolicy.from_actions("flat", ["a", "b", "c", "d"]).to_document(created_at=now)
    moved = flat.model_copy(update={"logits": [0.3, 0.1, -0.2, 0.0]})
    actions = rng.integers(0, 4, n).tolist()
    rewards = rng.random(n).tolist()
    logged = [0.25] * n
    measures = [Measures(latency_ms=900.0, tool_calls=1, tool_failures=0, tokens=1_000)] * n
    budget = GuardrailConfig(budget_tokens=2_000)
    out["review_flat"] = _median_ms(
        lambda: review(budget, flat, moved, actions, rewards, logged, [None] * n, measures), repeats
    )

    dims = {"prompt": ["a", "b", "c", "d"], "k": ["1", "3", "5", "10"], "tools": ["none", "web", "code", "both"]}
    features = {f"f{i}": "category" for i in range(5)}
    structured = StructuredPolicy.create("structured", dims, context=features).document
    trained = structured.model_copy(update={"logits": rng.normal(size=12).tolist()})
    local = [tuple(row) for row in rng.integers(0, 4, (n, 3)).tolist()]
    values = ["x", "y", "z"]
    contexts = [{name: values[int(v)] for name, v in zip(features, row, strict=True)}
                for row in rng.integers(0, 3, (n, 5)).tolist()]
    out["review_structured"] = _median_ms(
        lambda: review(GuardrailConfig(), structured, trained, local, rewards, logged, contexts), repeats
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400, help="replications per setting (default 400)")
    parser.add_argument("--episodes", type=int, default=2000, help="logged episodes per replication (default 2000)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--speed", action="store_true", help="time a comparison over 100,000 episodes")
    parser.add_argument("--grid", action="store_true", help="the known-truth coverage grid (--reps per cell)")
    args = parser.parse_args()
    if args.grid:
        print("| target | K | n | coverage | misses marked unreliable | passes |")
        print("|---|---:|---:|---:|---:|---|")
        for row in coverage_grid(args.reps):
            print(f"| {row['target']} | {row['k']} | {row['n']:,} | {row['coverage']:.1%} | "
                  f"{row['misses_unreliable']:.1%} | {'yes' if row['passes'] else 'NO'} |", flush=True)
        return
    rows = []
    print("| logging | target | estimator | truth | bias ± se | std | width | coverage | ESS |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for setting in settings():
        for name in ESTIMATORS:
            print(f"{setting.logging} / {setting.target} / {name} ...", file=sys.stderr, flush=True)
            r = replicate(setting, name, args.reps, args.episodes)
            rows.append({"logging": setting.logging, "target": setting.target, "estimator": name, **r})
            print(
                f"| {setting.logging} | {setting.target} | {name} | {r['truth']:.3f} | "
                f"{r['bias']:+.4f} ± {r['bias_se']:.4f} | {r['std']:.4f} | {r['width']:.4f} | "
                f"{r['coverage']:.3f} | {r['ess']:.0f} |",
                flush=True,
            )
    out: dict[str, object] = {"reps": args.reps, "episodes": args.episodes, "rows": rows}
    if args.speed:
        out["speed_ms_100k"] = ms = speed()
        print(f"\nOne candidate against the current version over 100,000 episodes, median: paired SNIPS "
              f"{ms['compare']:.1f} ms; the guardrail's review from the documents, flat policy with a token budget "
              f"{ms['review_flat']:.1f} ms, structured (3 × 4 values, 5 features) {ms['review_structured']:.1f} ms")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
