"""DSJSON logs for the tests of ``agent_learning.ops.dsjson`` and ``agent-learn logs``."""

from __future__ import annotations

import json
import random

ACTIONS = [{"id": topic, "features": [{"topic": topic, "length": n}]} for topic, n in
           (("sports", 3), ("politics", 5), ("cooking", 2))]
BEST = {"gold": "cooking", "silver": "sports"}
"""The action that earns reward 1 for each user tier (the others earn 0)."""


def logged(n: int, seed: int = 3, behaviour: tuple[float, float, float] | None = None) -> list[str]:
    """A log of ``n`` events of a logging policy over :data:`ACTIONS` (uniform, or taking each with
    the probability ``behaviour`` gives); the reward is 1 for the tier's best action."""
    rng = random.Random(seed)
    shares = behaviour or (1 / 3, 1 / 3, 1 / 3)
    lines = []
    for i in range(n):
        tier = rng.choice(sorted(BEST))
        first = rng.choices(range(1, 4), shares)[0]
        order = [first, *rng.sample([k for k in range(1, 4) if k != first], 2)]
        taken = ACTIONS[order[0] - 1]["id"]
        cost = -1.0 if taken == BEST[tier] else 0.0
        probability = shares[first - 1]
        lines.append(json.dumps({
            "_label_cost": cost, "_label_probability": probability, "_label_Action": order[0],
            "_labelIndex": order[0] - 1,
            "o": [{"v": 0.0 - cost, "EventId": f"log{i}", "ActionTaken": False}],
            "Timestamp": f"2025-03-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000000Z", "Version": "1",
            "EventId": f"log{i}", "a": order,
            "c": {"user": {"tier": tier}, "_multi": [{"id": a["id"], "topic": a["id"]} for a in ACTIONS]},
            "p": [shares[k - 1] for k in order], "VWState": {"m": "logged/v9"},
        }, separators=(",", ":")))
    return lines
