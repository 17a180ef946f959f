"""The dashboard's render time from SQLite: the page of an agent with 1,000 versions, and the page
of every agent at 50 agents.

    python benchmarks/dashboard.py [--versions 1000] [--agents 50] [--repeats 5]

One agent (a two-dimension policy with a context feature, as ``benchmarks/store_access.py``'s) gets
``--versions`` versions, each published by a training run with the guardrail's evaluation (one run
in ten held), its logits drifting; ``--agents`` - 1 more agents get 20 versions each. Each page is
answered through the route table (:func:`agent_learning.app.http.dispatch`: read from the store,
gathered and rendered), ``--repeats`` times; the median and the slowest are printed. The issue's
bound: the agent page in at most 1 s.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from agent_learning.app import http
from agent_learning.app.handlers import build_runtime
from agent_learning.app.settings import load_settings
from agent_learning.documents import Evaluation, Interval, ScoreCursor, TrainingRun, run_doc_id
from agent_learning.policy.softmax import StructuredPolicy
from agent_learning.store.sqlite import SQLiteStore

BOUND_SECONDS = 1.0
"""The issue's bound on the agent page."""


def build(store: SQLiteStore, agent_id: str, versions: int, rng: random.Random) -> None:
    """``agent_id`` with ``versions`` versions, each with its training run and the guardrail's verdict."""
    doc = StructuredPolicy.create(
        agent_id,
        {"prompt": ["concise", "step-by-step", "empathetic"], "retrieval_k": [1, 3, 5]},
        context={"task": "category"},
    ).document
    start, step = doc.created_at, timedelta(minutes=5)
    logits = list(doc.logits)
    store.create_policy_version(doc.as_kind("version"))
    for v in range(2, versions + 1):
        at = start + v * step
        logits = [x + rng.gauss(0, 0.05) for x in logits]
        held = v % 10 == 0
        value = 0.6 + 0.3 * v / versions + rng.gauss(0, 0.02)
        run = TrainingRun(
            id=run_doc_id(agent_id, v), agent_id=agent_id, base_version=v - 1, policy_version=v,
            cursor_from=ScoreCursor(seq=100 * (v - 2), id=f"e{v - 2}") if v > 2 else None,
            cursor_to=ScoreCursor(seq=100 * (v - 1), id=f"e{v - 1}"), episodes=100,
            metrics={"mean_reward": value, "episode_reward_std": 0.2}, learner={"name": "reinforce"},
            started_at=at, finished_at=at, status="held" if held else "published",
            evaluation=Evaluation(verdict="held" if held else "published", reason="benchmark", estimator="snips",
                                  confidence=0.95, margin=0.0, episodes=100, effective_sample_size=60.0,
                                  candidate=Interval(value=value, low=value - 0.05, high=value + 0.05)),
        )
        store.put_run(run)
        if held:
            continue
        doc = doc.model_copy(update={"version": v, "logits": logits, "created_at": at, "source": "train",
                                     "parent_version": v - 1, "run": run, "cursor": run.cursor_to})
        store.create_policy_version(doc.as_kind("version"))
    store.replace_current_policy(doc.as_kind("current"), None)


def timed(name: str, request: http.Request, rt: object, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        answer = http.dispatch(name, request, rt)  # type: ignore[arg-type]
        seconds.append(time.perf_counter() - t0)
        assert answer.status == 200, answer.body[:500]
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=1_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    try:
        db = folder / "store.db"
        rng = random.Random(7)
        with SQLiteStore(db) as store:
            build(store, "big", args.versions, rng)
            for i in range(args.agents - 1):
                build(store, f"agent-{i:02d}", 20, rng)
        rt = build_runtime(load_settings(store="sqlite", queue="sqlite", sqlite_path=str(db)))
        try:
            agent = timed("dashboard_agent", http.Request("GET", {"agent_id": "big"}), rt, args.repeats)
            overview = timed("dashboard", http.Request("GET"), rt, args.repeats)
        finally:
            assert rt.parts is not None
            rt.parts.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = statistics.median(agent)
    print(f"the page of an agent with {args.versions:,} versions (SQLite): median {median:.3f} s, "
          f"slowest {max(agent):.3f} s of {args.repeats} (bound {BOUND_SECONDS:g} s)")
    print(f"the page of every agent, {args.agents} agents: median {statistics.median(overview):.3f} s, "
          f"slowest {max(overview):.3f} s")
    return 0 if median <= BOUND_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
