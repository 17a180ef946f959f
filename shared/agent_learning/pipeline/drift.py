"""Warnings when a policy's reward falls, on evidence: a sharp drop, or a collapse of exploration.

After every published version the trainer compares the latest runs with the runs before them
(a run's mean reward is that of the episodes it learned from, which were chosen mostly under
the version before it). One small batch's swing is noise, so both sides pool whole runs,
newest first, until each holds at least ``window`` episodes: the *recent* side (the latest run
and as many before it as needed) and the *earlier* side (the runs before those). With n, m
and v each side's episodes, mean reward and reward variance (within runs, from each run's
reward std, plus between runs), the fall and its standard error are::

    fall = m_earlier − m_recent        se = √(v_recent / n_recent + v_earlier / n_earlier)

* ``reward_drop`` — ``fall ≥ reward_drop`` and ``fall ≥ z·se``: the reward fell by at least
  the threshold, and by more than ``z`` standard errors (``evidence_z``, 3 by default: about
  one false alarm in 700 comparisons of the same reward distribution).
* ``exploration_collapse`` — the new policy's normalised entropy H(π)/log K (K configurations:
  a structured policy's combinations of values; a contextual policy's H averaged over the
  batch's requests, each in its own segment) is at most
  ``collapse_entropy``, and ``fall ≥ collapse_reward_fall`` and ``fall ≥ z·se``: the policy has
  stopped exploring while doing worse, so it may not notice a better action again (never with
  K = 1: one configuration has nothing to explore).

No warning until both sides hold ``window`` episodes. A fall that lasts warns at every run
until the earlier side is made of runs after it.

Each warning is logged, counted in the ``agent_learning.policy.warnings`` metric and added
to the training span as an event. :func:`review` only reports: with ``auto_pin`` the trainer
(:func:`~agent_learning.pipeline.train_agent`) pins the agent's policy (learning frozen) with
the warnings as the reason, for an operator to inspect, roll back if need be, and unpin (a
rollback keeps the pin). An unpin holds until new evidence: a warning pins the agent again only
when the runs after the unpin give it on their own (both sides of the comparison made of them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent_learning.core.errors import InvalidDocument
from agent_learning.core.telemetry import POLICY_WARNINGS, count
from agent_learning.documents import TrainingRun
from agent_learning.store.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftConfig:
    """Thresholds of the warnings (``AGENT_LEARNING_COLLAPSE_ENTROPY`` and friends)."""

    collapse_entropy: float = 0.1
    """Normalised entropy H/log K at or below which a policy has collapsed."""
    collapse_reward_fall: float = 0.1
    """Reward fall that, with a collapse, warns."""
    reward_drop: float = 0.25
    """Reward drop that warns."""
    window: int = 200
    """Episodes each side of the comparison pools at least (whole runs)."""
    evidence_z: float = 3.0
    """Standard errors a fall must exceed to warn."""
    auto_pin: bool = False
    """Pin an agent's policy when a warning fires."""

    def __post_init__(self) -> None:
        for name in ("collapse_entropy", "collapse_reward_fall", "reward_drop", "evidence_z"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"drift setting {name}={value!r} must be a finite number")
        ranges = {
            "collapse_entropy": (0 <= self.collapse_entropy <= 1, "between 0 and 1"),
            "collapse_reward_fall": (self.collapse_reward_fall >= 0, ">= 0"),
            "reward_drop": (self.reward_drop > 0, "> 0"),
            "evidence_z": (self.evidence_z >= 0, ">= 0"),
        }
        for name, (ok, bound) in ranges.items():
            if not ok:
                raise ValueError(f"drift setting {name}={getattr(self, name)!r} must be {bound}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"drift setting window={self.window!r} must be a whole number of episodes >= 1")
        if not isinstance(self.auto_pin, bool):  # "false" would pin
            raise ValueError(f"drift setting auto_pin={self.auto_pin!r} must be True or False")


FIRST_RUNS_READ = 16
"""Runs :func:`review` reads first; while the two sides are not both full it reads four times as
many, up to :data:`MAX_RUNS_READ` (runs of 100 episodes fill the default window's sides from 4)."""
MAX_RUNS_READ = 4_096
"""The most runs :func:`review` reads per published version: with runs smaller on average than
``window`` / 2,048 episodes, the sides never fill and no warning is given."""


@dataclass(frozen=True)
class RunReward:
    """What a drift comparison needs of one training run."""

    episodes: int
    mean: float
    std: float
    version: int = 0
    """The version the run published."""


@dataclass(frozen=True)
class Side:
    """Runs pooled: episodes, mean reward and reward variance (within and between runs)."""

    episodes: int
    mean: float
    variance: float

    @classmethod
    def pool(cls, runs: Sequence[RunReward]) -> Side:
        n = sum(r.episodes for r in runs)
        mean = sum(r.episodes * r.mean for r in runs) / n
        variance = sum(r.episodes * (r.std**2 + (r.mean - mean) ** 2) for r in runs) / n
        return cls(n, mean, variance)


def split(runs: Sequence[RunReward], window: int) -> tuple[Side, Side] | None:
    """The recent and the earlier side of ``runs`` (newest first), or None if either holds
    fewer than ``window`` episodes."""
    sides: list[Side] = []
    taken: list[RunReward] = []
    for run in runs:
        taken.append(run)
        if sum(r.episodes for r in taken) >= window:
            sides.append(Side.pool(taken))
            taken = []
            if len(sides) == 2:
                return sides[0], sides[1]
    return None


@dataclass(frozen=True)
class DriftWarning:
    kind: Literal["exploration_collapse", "reward_drop"]
    agent_id: str
    version: int
    message: str


def assess(
    agent_id: str,
    version: int,
    runs: Sequence[RunReward],
    entropy: float,
    n_actions: int,
    config: DriftConfig,
) -> list[DriftWarning]:
    """Warnings for the run that published ``version``.

    ``runs`` are the agent's latest runs with episodes, newest first (the run that published
    ``version`` first); ``entropy`` is that of the new policy, in nats.
    """
    sides = split(runs, config.window)
    if sides is None:
        return []
    recent, earlier = sides
    fall = earlier.mean - recent.mean
    se = math.sqrt(recent.variance / recent.episodes + earlier.variance / earlier.episodes)
    if fall < config.evidence_z * se:
        return []
    evidence = (
        f"{earlier.mean:.3f} over {earlier.episodes} episodes → {recent.mean:.3f} over the latest "
        f"{recent.episodes}, {fall / se if se > 0 else math.inf:.1f} standard errors"
    )
    warnings = []
    if fall >= config.reward_drop:
        warnings.append(
            DriftWarning(
                "reward_drop",
                agent_id,
                version,
                f"{agent_id}: mean reward dropped by {fall:.3f} ({evidence}) up to the run that published v{version}",
            )
        )
    # one configuration (K = 1): nothing to explore, so nothing to collapse
    normalised = entropy / math.log(n_actions) if n_actions > 1 else math.inf
    if normalised <= config.collapse_entropy and fall >= config.collapse_reward_fall:
        warnings.append(
            DriftWarning(
                "exploration_collapse",
                agent_id,
                version,
                f"{agent_id}: v{version} has stopped exploring (entropy {normalised:.3f} of its maximum) while "
                f"its mean reward fell by {fall:.3f} ({evidence})",
            )
        )
    return warnings


def review(
    store: Store,
    agent_id: str,
    version: int,
    entropy: float,
    choices: int,
    config: DriftConfig,
    span: Any = None,
    *,
    pin_after: int | None = None,
) -> list[DriftWarning]:
    """Check a freshly published version: log, count and return its warnings (the caller
    decides whether to pin). ``entropy`` is what its requests draw from, in nats
    (:func:`~agent_learning.policy.served_entropy`), and ``choices`` how many configurations it
    chooses among (:func:`~agent_learning.policy.policy_choices`).

    With ``pin_after`` (the version an operator unpinned the agent at), only the warnings that
    the runs after that version give on their own are returned: the others are logged and
    counted all the same, but rest on evidence the operator has seen, so they must not pin it again."""
    runs = latest_runs(store, agent_id, config.window)
    warnings = assess(agent_id, version, runs, entropy, choices, config)
    for w in warnings:
        log.warning("policy warning (%s): %s", w.kind, w.message)
        count(POLICY_WARNINGS, 1, {"agent_id": agent_id, "kind": w.kind})
        if span is not None:
            span.add_event(w.kind, {"message": w.message})
    if warnings and pin_after is not None:
        fresh = assess(agent_id, version, [r for r in runs if r.version > pin_after], entropy, choices, config)
        if not fresh:
            log.warning("%s: not pinned again: the fall rests on runs up to v%s, when an operator unpinned it",
                        agent_id, pin_after)
        return fresh
    return warnings


def latest_runs(store: Store, agent_id: str, window: int) -> list[RunReward]:
    """The agent's latest runs with episodes, newest first, held ones left out: as many as both
    sides of the comparison need (read 16, 64, 256, ... at a time; at most :data:`MAX_RUNS_READ`)."""
    limit = FIRST_RUNS_READ
    while True:
        raw = store.list_runs(agent_id, limit=limit)
        runs = [r for r in (reward_of(d) for d in raw if d.get("status") != "held") if r is not None]
        if len(raw) < limit or limit >= MAX_RUNS_READ or split(runs, window) is not None:
            return runs
        limit = min(4 * limit, MAX_RUNS_READ)


def reward_of(run: Mapping[str, Any]) -> RunReward | None:
    """A stored run's episodes, mean reward and reward std (None for a run without episodes, and
    for an invalid run document, which is logged and left out: it must not fail the training run
    that has just published)."""
    try:
        TrainingRun.from_dict(dict(run))
    except InvalidDocument as exc:
        log.warning("drift review of %s leaves out run %r: %s", run.get("agent_id"), run.get("id"), exc)
        return None
    metrics = run.get("metrics") or {}
    episodes = int(run.get("episodes") or 0)
    if episodes <= 0 or "mean_reward" not in metrics:
        return None
    # episode_reward_std: the std of the episodes' rewards (runs before it was recorded: the
    # learner's importance-weighted reward_std, close to it).
    std = metrics.get("episode_reward_std", metrics.get("reward_std", 0.0))
    version = run.get("policy_version")
    return RunReward(episodes, float(metrics["mean_reward"]), float(std), version if type(version) is int else 0)
