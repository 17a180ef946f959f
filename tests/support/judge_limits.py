"""Judge limits short enough for tests against the local judge server: each attempt times out
after 1 s and an episode gives up after 4 s, so a retry or an outage is seen in seconds."""

from __future__ import annotations

from agent_learning.judges.evaluators import JudgeLimits


def fast_limits(max_attempts: int = 3) -> JudgeLimits:
    return JudgeLimits(
        attempt_timeout=1.0,
        evaluator_deadline=3.0,
        episode_deadline=4.0,
        max_attempts=max_attempts,
        backoff_base=0.05,
        backoff_max=0.2,
        retry_after_cap=0.5,
    )
