"""Learners gone wrong, for the guardrail to stop: each changes the one learner's step."""

from __future__ import annotations

import dataclasses
from typing import Any

from agent_learning.learning.reinforce import Reinforce


class InvertedRewards(Reinforce):
    """A broken learner: it learns from 1 − reward, so it moves towards the worst action."""

    def step(self, params: Any, model: Any, batch: Any, state: Any = None) -> Any:
        return super().step(params, model, dataclasses.replace(batch, rewards=1.0 - batch.rewards), state)


class TenfoldStep(Reinforce):
    """A learner whose step is ten times what it should be (a learning rate set wrong)."""

    def step(self, params: Any, model: Any, batch: Any, state: Any = None) -> Any:
        new, metrics, learned = super().step(params, model, batch, state)
        new.theta = params.theta + 10 * (new.theta - params.theta)
        return new, metrics, learned
