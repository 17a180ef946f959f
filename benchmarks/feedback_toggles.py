"""Feedback cost: one user toggling a thumb on one episode, on the embedded SQLite store.

    python benchmarks/feedback_toggles.py [--toggles 3000] [--json benchmarks/results/feedback_toggles.json]

Every toggle changes the episode's reward, so every post writes a feedback correction. A post
reads the episode's correction ledger instead of every earlier correction, so what a post reads
must not grow with the number of corrections before it: the figures are the total time and the
store reads of the first, the 100th and the last post.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_learning.core.clock import ManualClock
from agent_learning.judges.offline import OfflineJudge
from agent_learning.pipeline import Scorer, create_policy, score_episode
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.rewards import RewardFunction
from agent_learning.rewards.feedback import record_feedback
from agent_learning.sim.simulate import math_tutor
from agent_learning.store.base import Store
from agent_learning.store.sqlite import SQLiteStore

READS = ("get_", "list_", "read_")


class CountingReads:
    """The store, counting the calls that read from it."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.reads = inner, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not name.startswith(READS):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return attr(*args, **kwargs)

        return counted


def toggles(n: int, path: Path) -> dict[str, float]:
    """``n`` posts alternating thumbs up and down on one scored episode."""
    clock, rng = ManualClock(), random.Random(1)
    store = SQLiteStore(path)
    scenario = math_tutor("bench")
    create_policy(store, SoftmaxPolicy.from_actions("bench", scenario.actions).to_document(created_at=clock.now()))
    policy = SoftmaxPolicy.from_document(store.get_current_policy("bench").doc, rng=rng)  # type: ignore[union-attr]
    episode = scenario.run_episode(store, policy.choose(), rng, clock)
    score_episode(episode.id, Scorer(store, OfflineJudge(), RewardFunction(), clock), check_existing=False)
    counting = CountingReads(store)
    reads = []
    started = time.perf_counter()
    for i in range(n):
        before = counting.reads
        record_feedback(counting, episode.id, thumb="down" if i % 2 == 0 else "up", clock=clock)  # type: ignore[arg-type]
        reads.append(counting.reads - before)
    seconds = time.perf_counter() - started
    store.close()
    return {"toggles": n, "seconds": round(seconds, 3), "reads_first_post": reads[0],
            "reads_post_100": reads[min(99, n - 1)], "reads_last_post": reads[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toggles", type=int, default=3_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        figures = toggles(args.toggles, Path(tmp) / "toggles.db")
    for name, value in figures.items():
        print(f"{name:18s} {value:>10}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
