"""Reward shaping: judge metrics + penalties (+ user feedback) → one reward in [−1, 1], versioned.

Rule ``judges-feedback/2``. The judges' part (unchanged from ``weighted-penalties/1``)::

    n_m      = normalise(m, raw_m)                 each judge metric on [0, 1]
    weighted = Σ_m w_m n_m / Σ_m w_m               weights need not sum to 1
    penalty  = min(p_tool · failed_tool_calls, p_tool_max)
             + p_latency · min(1, (latency − budget) / budget)   if latency > budget
             + p_empty                                            if the output is empty
             + c_tokens · tokens / 1000                           cost-aware: the agent's tokens
    judged   = clip(weighted − penalty, −1, 1)

User feedback (:class:`~agent_learning.documents.Feedback`: thumbs up = 1, thumbs down = 0,
or a score in [0, 1]) is blended in with the weight ``w_f`` (``AGENT_LEARNING_FEEDBACK_WEIGHT``,
0.5 by default)::

    f̄        = mean of the episode's feedback values, one per source
    reward   = judged                               without feedback
             = clip((1 − w_f)·judged + w_f·f̄, −1, 1)   with feedback

The weight in force is stored with every score (``reward_function.weights["feedback"]``), so
feedback arriving later is blended with the weight the episode was scored under, whichever
process applies it. Feedback never rewrites a score: it is applied through corrections that
carry only the change of the reward, so it is learned exactly once (see
:mod:`agent_learning.rewards.feedback`).

Rule ``agent-reward/1``: an episode that carries the agent's own reward (``Episode.reward``, in
[0, 1]: :func:`agent_reward`) is scored from it alone, without the judges or the penalties; later
feedback is blended into it as above.

Normalisation: ``intent_resolution`` is 1–5 → (raw − 1) / 4; ``task_adherence`` and
``task_completion`` are 0/1 → raw. A raw value outside its scale, or between its whole
numbers (0.5 from a pass/fail judge), is an error, never clamped or rounded.

A metric with a positive weight that is missing from the judgement raises
:class:`MissingMetric`: a missing metric never silently counts as zero.

The reward's ``version`` is the rule name plus a hash of every setting, so two rewards with
the same version are comparable and a change of weights is visible in every score.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from agent_learning.core.errors import PermanentError
from agent_learning.documents import Episode, MetricScore, RewardInfo
from agent_learning.judges.metrics import INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION

RULE = "judges-feedback/2"
AGENT_RULE = "agent-reward/1"
"""The rule of an episode that carries its own reward: that reward, no judges, no penalties."""
AGENT = "agent"
"""Key of the agent's own reward in ``components`` (rule ``agent-reward/1``)."""
FEEDBACK = "feedback"
"""Key of the feedback weight in ``RewardInfo.weights`` and of f̄ in ``components``."""
DEFAULT_FEEDBACK_WEIGHT = 0.5


class MissingMetric(PermanentError):
    """A weighted metric is absent from a judgement."""


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the judge metrics and the penalties. Read from the environment by
    :class:`agent_learning.app.settings.Settings` (``AGENT_LEARNING_W_INTENT`` and friends)."""

    w_intent: float = 0.4
    """Weight of intent resolution (1–5, normalised to [0, 1])."""
    w_adherence: float = 0.3
    """Weight of task adherence (0/1)."""
    w_completion: float = 0.3
    """Weight of task completion (0/1)."""
    tool_failure_penalty: float = 0.1
    """Penalty per failed tool call."""
    max_tool_failure_penalty: float = 0.3
    """Cap of the tool-failure penalty."""
    latency_budget_ms: float = 30_000.0
    """Latency without penalty, in milliseconds."""
    latency_penalty: float = 0.1
    """Penalty at twice the latency budget (linear above the budget)."""
    empty_output_penalty: float = 0.5
    """Penalty for an empty output."""
    cost_per_thousand_tokens: float = 0.0
    """Penalty per 1,000 model tokens the agent spent on the episode (0: cost plays no part); makes learning
    cost-aware, e.g. 0.01 makes 5,000 tokens cost 0.05 reward."""
    feedback_weight: float = DEFAULT_FEEDBACK_WEIGHT
    """Weight of user feedback in the reward."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"reward setting {name} must be a finite number >= 0, got {value!r}")
        if self.w_intent + self.w_adherence + self.w_completion <= 0:
            raise ValueError("reward weights w_intent, w_adherence and w_completion cannot all be 0")
        if not math.isfinite(self.w_intent + self.w_adherence + self.w_completion):  # the reward divides by it
            raise ValueError("reward weights w_intent, w_adherence and w_completion must add up to a finite number")
        if self.latency_budget_ms <= 0:
            raise ValueError("reward setting latency_budget_ms must be > 0")
        if self.feedback_weight > 1:
            raise ValueError(f"reward setting feedback_weight must be in [0, 1], got {self.feedback_weight!r}")

    @property
    def weights(self) -> dict[str, float]:
        return {INTENT_RESOLUTION: self.w_intent, TASK_ADHERENCE: self.w_adherence, TASK_COMPLETION: self.w_completion}

    @property
    def penalties(self) -> dict[str, float]:
        """The penalty settings; the token cost only when it is on (rewards without it keep their version)."""
        return {
            k: v
            for k, v in asdict(self).items()
            if not k.startswith("w_") and k != "feedback_weight" and not (k == "cost_per_thousand_tokens" and v == 0)
        }


class RewardFunction:
    """Turns a judgement and its episode into a reward; see the module docstring."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        digest = hashlib.sha256(
            json.dumps(
                {k: float(v) for k, v in asdict(self.config).items() if k != "cost_per_thousand_tokens" or v},
                sort_keys=True,
            ).encode()
        ).hexdigest()
        self.version = f"{RULE}+{digest[:10]}"
        self._penalties = self.config.penalties  # asdict() per episode was 8% of the demo's time

    def __call__(self, metrics: Mapping[str, MetricScore], episode: Episode) -> tuple[float, RewardInfo]:
        cfg = self.config
        weights = cfg.weights
        total_weight = sum(weights.values())
        missing = [m for m, w in weights.items() if w > 0 and m not in metrics]
        if missing:
            raise MissingMetric(
                f"metrics {missing} are missing from the judgement; a missing metric is never scored as zero"
            )
        weighted = math.fsum(w * metrics[m].normalised for m, w in weights.items() if w > 0) / total_weight

        failed_tools = sum(1 for s in episode.steps if s.status == "error" and s.kind == "tool")
        tool_pen = min(cfg.tool_failure_penalty * failed_tools, cfg.max_tool_failure_penalty)
        over = episode.latency_ms - cfg.latency_budget_ms
        latency_pen = cfg.latency_penalty * min(1.0, over / cfg.latency_budget_ms) if over > 0 else 0.0
        empty_pen = cfg.empty_output_penalty if not episode.output.strip() else 0.0
        tokens = episode.usage.total if episode.usage is not None else 0
        cost_pen = cfg.cost_per_thousand_tokens * tokens / 1000
        reward = max(-1.0, min(1.0, weighted - tool_pen - latency_pen - empty_pen - cost_pen))
        info = RewardInfo(
            version=self.version,
            weights={**weights, FEEDBACK: cfg.feedback_weight},
            penalties=self._penalties,  # validation copies it
            components={
                "weighted": weighted,
                "tool_failures": -tool_pen,
                "latency": -latency_pen,
                "empty_output": -empty_pen,
                **({"tokens": -cost_pen} if cfg.cost_per_thousand_tokens else {}),
                "judged": reward,
            },
        )
        return reward, info


def agent_reward(reward: float, config: RewardConfig) -> tuple[float, RewardInfo]:
    """The reward of an episode that carries its own (rule ``agent-reward/1``): ``reward`` as it
    is; user feedback is blended into it later as into a judged reward, with ``config``'s weight."""
    info = RewardInfo(
        version=AGENT_RULE, weights={FEEDBACK: config.feedback_weight}, penalties={}, components={AGENT: reward}
    )
    return reward, info


def judged_reward(info: RewardInfo) -> float:
    """The judges' part of a score's reward (the agent's own reward, under ``agent-reward/1``),
    from its stored components."""
    if "judged" in info.components:
        return info.components["judged"]
    if AGENT in info.components:
        return info.components[AGENT]
    parts = ("weighted", "tool_failures", "latency", "empty_output")  # scores of rule weighted-penalties/1
    return max(-1.0, min(1.0, math.fsum(info.components.get(p, 0.0) for p in parts)))


def with_feedback(info: RewardInfo, values: Sequence[float]) -> tuple[float, RewardInfo]:
    """The reward of a judged score once user feedback ``values`` (each in [0, 1]) is blended in.

    Uses the feedback weight stored in ``info`` (the default for scores written before
    feedback existed); returns the reward and the reward information to store with it.
    """
    judged = judged_reward(info)
    weight = info.weights.get(FEEDBACK, DEFAULT_FEEDBACK_WEIGHT)
    if not values:
        return judged, info
    if any(not (isinstance(v, int | float) and 0 <= v <= 1) for v in values):
        raise ValueError(f"feedback values must be numbers in [0, 1], got {list(values)!r}")
    mean = math.fsum(values) / len(values)
    reward = max(-1.0, min(1.0, (1 - weight) * judged + weight * mean))
    blended = info.model_copy(
        update={
            "weights": {**info.weights, FEEDBACK: weight},
            "components": {**info.components, "judged": judged, FEEDBACK: mean, "feedback_count": float(len(values))},
        }
    )
    return reward, blended
