"""Speed: ``choose()``, one learner update over 100,000 episodes, the embedded pipeline.

    python benchmarks/speed.py [--json benchmarks/results/speed.json]

Targets (issue: learning that works): ``choose()`` median ≤ 1.5 µs; an update over 100,000
episodes at K=4 ≤ 10 ms; the embedded pipeline (SQLite store and queue, offline judge) end
to end ≥ 1,000 episodes/s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agent_learning.demo import run_demo
from agent_learning.documents import Action
from agent_learning.learner import Batch, Reinforce
from agent_learning.policy import SoftmaxPolicy


def choose_median_us(k: int = 4, calls: int = 200_000, repeats: int = 7) -> float:
    """Median over ``repeats`` runs of the mean time of one ``choose()`` call, in µs."""
    actions = [Action(id=f"a{i}") for i in range(k)]
    policy = SoftmaxPolicy("bench", actions, [0.3 * i for i in range(k)], exploration_floor=0.001, rng=random.Random(1))
    choose = policy.choose
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            choose()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def update_ms(k: int = 4, n: int = 100_000, repeats: int = 15) -> float:
    """Median time of one :meth:`Reinforce.update` over ``n`` episodes, batch validation and the
    learner state (read, faded, extended, written) included."""
    rng = np.random.default_rng(0)
    actions, rewards, probs = rng.integers(0, k, n), rng.random(n), rng.uniform(0.05, 1.0, n)
    learner, theta = Reinforce(), rng.normal(size=k)
    state = learner.update(theta, Batch.from_arrays(actions, rewards, probs, k)).state
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        learner.update(theta, Batch.from_arrays(actions, rewards, probs, k), state=state)
        runs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(runs)


def pipeline_eps(episodes_per_agent: int = 4_000, repeats: int = 3) -> float:
    """Episodes per second through enqueue → score → train on the embedded default (the demo),
    the best of ``repeats`` runs: on a shared machine the slower runs measure the neighbours."""
    rates = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_demo(db_path=Path(tmp) / "speed.db", episodes_per_agent=episodes_per_agent)
        rates.append(result.episodes / result.seconds)
    print(f"  pipeline runs: {', '.join(f'{r:,.0f}' for r in rates)} episodes/s", file=sys.stderr)
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    figures = {}
    for name, measure, unit, target in (
        ("choose_median_us", choose_median_us, "µs", "≤ 1.5"),
        ("update_100k_k4_ms", update_ms, "ms", "≤ 10"),
        ("pipeline_episodes_per_s", pipeline_eps, "episodes/s", "≥ 1,000"),
    ):
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        figures[name] = round(measure(), 3)
        print(f"{name:26s} {figures[name]:>10} {unit:11s} (target {target})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
