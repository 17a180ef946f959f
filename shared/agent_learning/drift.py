"""Warnings when a policy stops exploring while its reward falls, or its reward drops sharply.

After every published version the trainer compares the latest training run with the runs
before it (each run's mean reward is that of the episodes it learned from, which were chosen
mostly under the version before it):

* ``reward_drop`` — the mean reward fell by at least ``reward_drop`` from the previous run:
  the version published before the latest run does worse than the one before it.
* ``exploration_collapse`` — the new policy's normalised entropy H(π)/log K is at most
  ``collapse_entropy`` *and* the mean reward is at least ``collapse_reward_fall`` below the
  mean of the previous ``window`` runs: the policy has stopped exploring while doing worse,
  so it may not notice a better action again.

Each warning is logged, counted in the ``agent_learning.policy.warnings`` metric and added
to the training span as an event. :func:`review` only reports: with ``auto_pin`` the trainer
(:func:`~agent_learning.pipeline.train_agent`) pins the agent's policy (learning frozen) with
the warnings as the reason, for an operator to inspect, roll back or unpin.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .policy import policy_entropy
from .store.base import Store
from .telemetry import POLICY_WARNINGS, count

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftConfig:
    """Thresholds of the warnings (``AGENT_LEARNING_COLLAPSE_ENTROPY`` and friends)."""

    collapse_entropy: float = 0.1
    """Normalised entropy H/log K at or below which a policy has collapsed."""
    collapse_reward_fall: float = 0.1
    """Reward fall that, with a collapse, warns."""
    reward_drop: float = 0.25
    """Reward drop between two runs that warns."""
    window: int = 3
    """Earlier runs the latest is compared with."""
    auto_pin: bool = False
    """Pin an agent's policy when a warning fires."""


@dataclass(frozen=True)
class DriftWarning:
    kind: Literal["exploration_collapse", "reward_drop"]
    agent_id: str
    version: int
    message: str


def assess(
    agent_id: str,
    version: int,
    mean_rewards: Sequence[float],
    entropy: float,
    n_actions: int,
    config: DriftConfig,
) -> list[DriftWarning]:
    """Warnings for the run that published ``version``.

    ``mean_rewards`` are the mean rewards of the agent's latest runs, newest first (the run
    that published ``version`` first); ``entropy`` is that of the new policy, in nats.
    """
    if len(mean_rewards) < 2:
        return []
    latest, previous = mean_rewards[0], list(mean_rewards[1 : config.window + 1])
    warnings = []
    drop = previous[0] - latest
    if drop >= config.reward_drop:
        warnings.append(
            DriftWarning(
                "reward_drop",
                agent_id,
                version,
                f"{agent_id}: mean reward dropped by {drop:.3f} ({previous[0]:.3f} → {latest:.3f}) "
                f"in the run that published v{version}",
            )
        )
    normalised = entropy / math.log(n_actions) if n_actions > 1 else 0.0
    fall = sum(previous) / len(previous) - latest
    if normalised <= config.collapse_entropy and fall >= config.collapse_reward_fall:
        warnings.append(
            DriftWarning(
                "exploration_collapse",
                agent_id,
                version,
                f"{agent_id}: v{version} has stopped exploring (entropy {normalised:.3f} of its maximum) while "
                f"its mean reward fell by {fall:.3f} below the previous {len(previous)} runs",
            )
        )
    return warnings


def review(
    store: Store,
    agent_id: str,
    version: int,
    probabilities: Sequence[float],
    config: DriftConfig,
    span: Any = None,
) -> list[DriftWarning]:
    """Check a freshly published version: log, count and return its warnings (the caller
    decides whether to pin)."""
    runs: list[Mapping[str, Any]] = store.list_runs(agent_id, limit=config.window + 1)
    means = [float(r["metrics"]["mean_reward"]) for r in runs if r.get("episodes") and "mean_reward" in r["metrics"]]
    warnings = assess(agent_id, version, means, policy_entropy(list(probabilities)), len(probabilities), config)
    for w in warnings:
        log.warning("policy warning (%s): %s", w.kind, w.message)
        count(POLICY_WARNINGS, 1, {"agent_id": agent_id, "kind": w.kind})
        if span is not None:
            span.add_event(w.kind, {"message": w.message})
    return warnings
