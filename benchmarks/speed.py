"""Speed: ``choose()``, one learner update over 100,000 episodes, the embedded pipeline, one
training run at the largest batch, the CLI.

    python benchmarks/speed.py [--json benchmarks/results/speed.json] [--only pipeline,train,cli]

Targets (issue: learning that works): ``choose()`` median ≤ 1.5 µs; an update over 100,000
episodes at K=4 ≤ 10 ms; the embedded pipeline (SQLite store and queue, offline judge) end
to end ≥ 1,000 episodes/s on 2 cores. Hardening: the pipeline's CPU per episode, all stages,
≤ 0.65 ms (each stage reported: the agents choosing and writing episodes, enqueueing, scoring,
the feedback sweep, training); ``agent-learn --help`` and an argument error ≤ 0.25 s of CPU each.
CPU time, not wall time: the machine is shared, and CPU time moves less with the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent_learning.app.demo import run_demo
from agent_learning.documents import MAX_TRAIN_BATCH, Action
from agent_learning.learning.reinforce import Batch, Reinforce
from agent_learning.policy.softmax import SoftmaxPolicy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import structured  # beside this file: the structured policy and score documents of its speed figures


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


STAGES = ("agents", "enqueue", "score", "feedback", "train")
"""The demo's stages, in order (:attr:`agent_learning.app.demo.DemoResult.cpu_seconds`)."""


def pipeline_cpu_ms(episodes_per_agent: int = 2_000, repeats: int = 5) -> dict[str, float]:
    """CPU ms per episode of each stage of the demo (3 agents, ``episodes_per_agent`` each) and
    their total, each the median of ``repeats`` runs."""
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            result = run_demo(db_path=Path(tmp) / "speed.db", episodes_per_agent=episodes_per_agent)
        ms = {stage: result.cpu_seconds[stage] * 1e3 / result.episodes for stage in STAGES}
        runs.append({**ms, "total": sum(ms.values())})
        print(f"  pipeline run: {runs[-1]['total']:.3f} ms CPU per episode", file=sys.stderr)
    return {name: statistics.median(run[name] for run in runs) for name in (*STAGES, "total")}


TRAIN_STAGES = ("reading", "collect", "learn", "guardrail", "publishing")
"""One training run's stages: reading the score rows from the store, validating and sorting them
(``pipeline.train.collect``), the learner (preparing the batch and the update), the guardrail's
review, and the rest (reading the policy, publishing the version and its run)."""


def training_run_cpu_ms(scores: int = MAX_TRAIN_BATCH, repeats: int = 3) -> dict[str, float]:
    """CPU ms of each stage (:data:`TRAIN_STAGES`) of one training run over ``scores`` new score
    documents on the embedded store (SQLite), the guardrail on with its defaults: the structured
    policy of ``structured.speed`` (3 dimensions × 4 values, 5 categorical features of 3 values),
    each score as the scorer writes it. Each stage the median of ``repeats`` runs, each on a fresh
    copy of the store."""
    import shutil
    from contextlib import ExitStack
    from unittest import mock

    from agent_learning.documents import Score
    from agent_learning.evaluation import GuardrailConfig
    from agent_learning.learning.reinforce import LearnerConfig
    from agent_learning.pipeline import create_policy, train
    from agent_learning.store.sqlite import SQLiteStore

    contexts, actions, rewards = structured.speed_episodes(scores)
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        seeded = Path(tmp) / "seeded.db"
        store = SQLiteStore(seeded)
        doc = create_policy(store, structured.speed_policy().document)
        for text in structured.score_texts(doc, actions, rewards, contexts):
            document = json.loads(text)
            document.pop("seq")
            store.put_score(Score.from_dict(document))
        store.close()
        for r in range(repeats):
            copy = Path(tmp) / f"run{r}.db"
            shutil.copy(seeded, copy)
            store, spent = SQLiteStore(copy), dict.fromkeys(TRAIN_STAGES, 0.0)
            with ExitStack() as patches:  # each stage's function timed where the trainer calls it
                for stage, name in (("collect", "collect"), ("learn", "learn"), ("guardrail", "_guard")):
                    patches.enter_context(mock.patch.object(train, name, _timed(spent, stage, getattr(train, name))))
                reading = _timed(spent, "reading", store.read_scores)
                patches.enter_context(mock.patch.object(store, "read_scores", reading))
                t0 = time.process_time()
                outcome = train.train_agent(doc.agent_id, store, Reinforce(LearnerConfig()), max_batch=scores,
                                            guardrail=GuardrailConfig())
                total = (time.process_time() - t0) * 1e3
            store.close()
            assert outcome.run is not None and outcome.run.episodes == scores, outcome
            spent["publishing"] = total - sum(spent.values())
            runs.append({**spent, "total": total})
            print(f"  training run: {total:,.0f} ms CPU ({outcome.status})", file=sys.stderr)
    return {name: statistics.median(run[name] for run in runs) for name in (*TRAIN_STAGES, "total")}


def _timed(spent: dict[str, float], stage: str, function: Any) -> Any:
    """``function``, adding the CPU ms of each call to ``spent[stage]``."""
    def run(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[stage] += (time.process_time() - t0) * 1e3
    return run


CLI_RUNS = {"help": ["--help"], "argument_error": ["policy", "show", "--agent-id", "bad id"]}
"""The ``agent-learn`` command lines timed: the help, and an argument error (exit code 2)."""


def cli_cpu_s(repeats: int = 7) -> dict[str, float]:
    """Median CPU seconds (user + system) of a fresh ``agent-learn`` process per :data:`CLI_RUNS`
    command line, interpreter start-up included."""
    out = {}
    for name, args in CLI_RUNS.items():
        times = []
        for _ in range(repeats):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "agent_learning.cli", *args], capture_output=True,
                           env={**os.environ, "COLUMNS": "120"}, check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", default="choose,update,eps,pipeline,train,cli",
                        help="comma-separated parts to measure (default: all)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    figures = {}
    for part, name, measure, unit, target in (
        ("choose", "choose_median_us", choose_median_us, "µs", "≤ 1.5"),
        ("update", "update_100k_k4_ms", update_ms, "ms", "≤ 10"),
        ("eps", "pipeline_episodes_per_s", pipeline_eps, "episodes/s", "≥ 1,000"),
    ):
        if part not in only:
            continue
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        figures[name] = round(measure(), 3)
        print(f"{name:26s} {figures[name]:>10} {unit:11s} (target {target})")
    for part, name, measure, unit, targets in (
        ("pipeline", "pipeline_cpu_ms_per_episode", pipeline_cpu_ms, "ms CPU", {"total": "≤ 0.65"}),
        ("train", "training_run_cpu_ms", training_run_cpu_ms, "ms CPU", {}),
        ("cli", "cli_cpu_s", cli_cpu_s, "s CPU", {"help": "≤ 0.25", "argument_error": "≤ 0.25"}),
    ):
        if part not in only:
            continue
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        figures[name] = {key: round(value, 3) for key, value in measure().items()}
        for key, value in figures[name].items():
            target = f"(target {targets[key]})" if key in targets else ""
            print(f"{name}.{key:<15s} {value:>8} {unit:7s} {target}".rstrip())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
