"""DSJSON logs for the tests of ``agent_learning.ops.dsjson`` and ``agent-learn logs``."""

from __future__ import annotations

import json
import random

ACTIONS = [{"id": topic, "features": [{"topic": topic, "length": n}]} for topic, n in
           (("sports", 3), ("politics", 5), ("cooking", 2))]
BEST = {"gold": "cooking", "silver": "sports"}
"""The action that earns reward 1 for each user tier (the others earn 0)."""


def logged(n: int, seed: int = 3) -> list[str]:
    """A log of ``n`` events of a uniform logging policy over :data:`ACTIONS`; the reward is 1 for
    the tier's best action."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        tier = rng.choice(sorted(BEST))
        order = rng.sample(range(1, 4), 3)
        taken = ACTIONS[order[0] - 1]["id"]
        cost = -1.0 if taken == BEST[tier] else 0.0
        lines.append(json.dumps({
            "_label_cost": cost, "_label_probability": 1 / 3, "_label_Action": order[0], "_labelIndex": order[0] - 1,
            "o": [{"v": 0.0 - cost, "EventId": f"log{i}", "ActionTaken": False}],
            "Timestamp": f"2025-03-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000000Z", "Version": "1",
            "EventId": f"log{i}", "a": order,
            "c": {"user": {"tier": tier}, "_multi": [{"id": a["id"], "topic": a["id"]} for a in ACTIONS]},
            "p": [1 / 3] * 3, "VWState": {"m": "logged/v9"},
        }, separators=(",", ":")))
    return lines
