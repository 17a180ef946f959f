"""The demo: simulated agents learn through the embedded pipeline, start to finish.

Each round, every simulated agent reads its current policy, runs ``batch`` episodes with
it and writes them; then the pipeline pumps the new episodes onto the queue, scores them
with the offline judge and trains every agent once (what the timer does in Azure). Time is
simulated, so the demo is fast and reproducible for a given seed.
"""

from __future__ import annotations

import random
import shlex
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent_learning.agent.client import PolicyClient
from agent_learning.app.embedded import charge, open_local
from agent_learning.app.settings import PREFIX, Settings, load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConfigurationError, InvalidDocument
from agent_learning.ops.history import AgentHistory, history
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy.softmax import policy_probabilities
from agent_learning.sim.simulate import SCENARIOS, Scenario
from agent_learning.store.base import Store

__all__ = [
    "EMBEDDED",
    "AgentHistory",
    "DemoResult",
    "RewardTrend",
    "agent_summary",
    "history",
    "is_demo_agent",
    "next_commands",
    "policy_probabilities",
    "reward_trend",
    "run_demo",
]


@dataclass(frozen=True)
class RewardTrend:
    """The mean reward of an agent's first ``runs`` training runs and of its last ``runs``
    (``runs`` = a fifth of its runs, at least one): what the demo's text and JSON both report."""

    runs: int
    first: float
    last: float


def reward_trend(h: AgentHistory) -> RewardTrend | None:
    """The reward trend of ``h``'s training runs (None before its first run)."""
    means = [m for m in h.mean_reward if m is not None]
    if not means:
        return None
    k = max(1, len(means) // 5)
    return RewardTrend(k, sum(means[:k]) / k, sum(means[-k:]) / k)


EMBEDDED: dict[str, Any] = {
    "store": "sqlite", "queue": "sqlite", "judge": "offline", "judging": "*=all", "telemetry": "off"
}
"""The settings the demo always runs on, whatever the environment chooses: its SQLite file for the
store and both queues, the offline judge on every episode and no telemetry export (never a Cosmos
account, a Service Bus namespace, a billed judge model, the real judge's sampling or an Application
Insights resource configured for the real pipeline)."""


def next_commands(db_path: str, agent_ids: Sequence[str], structured: Sequence[str] = ()) -> list[str]:
    """What to run after the demo, on its data: the first agent's policy and history, the
    structured agent's policy per segment when it ran, the audit and the report; each a shell
    command line (a path with spaces is quoted)."""
    if not agent_ids:
        return []
    db = f"--db {shlex.quote(db_path)}"
    first = agent_ids[0]
    out = [
        f"agent-learn policy show --agent-id {first} {db}",
        f"agent-learn policy history --agent-id {first} --limit 5 {db}",
    ]
    out += [f"agent-learn policy show --agent-id {a} {db}" for a in structured if a != first]
    return [*out, f"agent-learn audit {db}", f"agent-learn report {db}"]


def serve_command(db_path: str) -> str:
    """The command that serves the app's routes, the dashboard among them, on the demo's data."""
    return f"agent-learn serve --db {shlex.quote(db_path)}"


@dataclass
class DemoResult:
    agents: list[AgentHistory]
    episodes: int
    seconds: float
    outcomes: dict[str, int]
    db_path: str
    cpu_seconds: Counter[str] = field(default_factory=Counter)
    """CPU seconds of this process per stage: ``agents`` (choosing and writing the episodes), then
    the pipeline's (:attr:`~agent_learning.app.embedded.CycleReport.cpu_seconds`)."""

    def summary(self) -> dict[str, Any]:
        """The machine-readable summary printed by ``agent-learn demo --json``."""
        return {
            "episodes": self.episodes,
            "seconds": round(self.seconds, 3),
            "episodes_per_second": round(self.episodes / self.seconds, 1) if self.seconds else None,
            "outcomes": self.outcomes,
            "db_path": self.db_path,
            "agents": {a.agent_id: agent_summary(a) for a in self.agents},
            "next": next_commands(
                self.db_path, [a.agent_id for a in self.agents], [a.agent_id for a in self.agents if a.segments]
            ),
            "serve": serve_command(self.db_path),
        }


def agent_summary(a: AgentHistory) -> dict[str, Any]:
    """One agent's part of :meth:`DemoResult.summary`. A structured agent (the triage bot) has
    no single best action: it reports, per segment, the best configuration, its true mean and
    the probability the final policy gives it there."""
    out: dict[str, Any] = {
        "versions": len(a.versions),
        "final_version": a.versions[-1],
        "final_probabilities": {k: round(v, 4) for k, v in a.final.items()},
    }
    if a.best_action is not None:
        out["true_best_action"] = a.best_action
        out["best_action_probability"] = round(a.final[a.best_action], 4)
        out["expected_rewards"] = {k: round(v, 4) for k, v in a.expected_rewards.items()}
    best = a.best_by_segment()
    if best:
        out["best_by_segment"] = {
            segment: {"configuration": config, "true_mean": round(mean, 4), "probability": round(p, 4)}
            for segment, (config, mean, p) in best.items()
        }
    trend = reward_trend(a)
    out["reward_trend"] = asdict(trend) if trend else None
    return out


def is_demo_agent(store: Store, agent_id: str) -> bool:
    """Whether ``agent_id`` in ``store`` is one of the demo's simulated agents: a scenario's name
    with that scenario's actions (the quick start's ``support-bot`` shares the name, not the actions)."""
    scenario = SCENARIOS.get(agent_id)
    if scenario is None:
        return False
    try:
        doc = load_current(store, agent_id)
    except InvalidDocument:
        return False
    first = scenario().first_policy(temperature=1.0, exploration_floor=0.0, created_at=None)
    return doc is not None and doc.action_ids == first.action_ids


def check_floor(settings: Settings, scenarios: Sequence[Scenario]) -> None:
    """Raise :class:`ConfigurationError` naming ``AGENT_LEARNING_EXPLORATION_FLOOR`` when it is too
    large for one of the simulated agents (times its number of actions, it must stay below 1)."""
    for scenario in scenarios:
        largest = max(map(len, scenario.dimensions.values())) if scenario.dimensions else len(scenario.actions)
        if settings.exploration_floor * largest >= 1:
            raise ConfigurationError(
                f"{PREFIX}EXPLORATION_FLOOR={settings.exploration_floor:g}: x {largest} actions of the simulated "
                f"{scenario.agent_id} reaches 1 (the floor is each one's minimum probability); set it below "
                f"{1 / largest:g}"
            )


def run_demo(
    *,
    db_path: str | Path = ".agent-learning/demo.db",
    scenarios: Sequence[str] = ("math-tutor", "support-bot", "triage-bot"),
    episodes_per_agent: int = 4_000,
    batch: int = 100,
    seed: int = 7,
    settings: Settings | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Run the demo on a fresh embedded database at ``db_path``, with the offline judge (:data:`EMBEDDED`
    overrides ``settings``); bad arguments raise :class:`ValueError` before the file is touched."""
    settings = (settings or load_settings(**EMBEDDED)).model_copy(update=EMBEDDED)
    if batch < 1:
        raise ValueError(f"batch: {batch} is not a number of episodes (at least 1)")
    if episodes_per_agent < batch or episodes_per_agent % batch:
        raise ValueError(f"episodes_per_agent: {episodes_per_agent} is not a multiple of batch {batch} "
                         "(a training run follows each batch)")
    unknown = [name for name in scenarios if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"scenarios: unknown simulated agent(s) {unknown}; choose from {sorted(SCENARIOS)}")
    if len(set(scenarios)) != len(scenarios):
        raise ValueError(f"scenarios: {list(scenarios)} names an agent more than once; name each once")
    chosen: list[Scenario] = [SCENARIOS[name]() for name in scenarios]
    check_floor(settings, chosen)  # before the old demo store is deleted
    path = Path(db_path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    clock = ManualClock()
    pipeline = open_local(settings, path=path, clock=clock)
    store = pipeline.store
    rng = random.Random(seed)
    clients = []
    for i, scenario in enumerate(chosen):
        first = scenario.first_policy(
            temperature=settings.temperature, exploration_floor=settings.exploration_floor, created_at=clock.now()
        )
        create_policy(store, first)
        clients.append(
            PolicyClient(store, scenario.agent_id, refresh_seconds=0, rng=random.Random(seed * 1000 + i), clock=clock)
        )

    rounds = episodes_per_agent // batch
    outcomes: dict[str, int] = {}
    cpu: Counter[str] = Counter()
    t0 = time.perf_counter()
    for r in range(rounds):
        since = time.process_time()
        for scenario, client in zip(chosen, clients, strict=True):
            policy = client.policy()
            for _ in range(batch):
                scenario.step(store, policy, rng, clock)
        charge(cpu, "agents", since)
        clock.advance(60)
        report = pipeline.run_once()
        cpu.update(report.cpu_seconds)
        for status, n in report.outcomes.items():
            outcomes[status] = outcomes.get(status, 0) + n
        if progress:
            progress(r + 1, rounds)
    seconds = time.perf_counter() - t0

    agents = []
    for scenario in chosen:
        h = history(store, scenario.agent_id)
        if scenario.dimensions is not None:
            h.expected_by_segment = scenario.expected_by_segment(
                pipeline.scorer.judge, pipeline.scorer.reward, n=300, seed=seed
            )
        else:
            h.expected_rewards = scenario.expected_rewards(
                pipeline.scorer.judge, pipeline.scorer.reward, n=1_000, seed=seed
            )
        agents.append(h)
    pipeline.close()  # the store and both queues
    return DemoResult(agents, rounds * batch * len(chosen), seconds, outcomes, str(path), cpu)
