"""``learningMode`` beyond serving: what LoggingOnly and Apprentice do to learning.

* **LoggingOnly** serves the baseline and only logs: the agent is pinned (learning frozen, reason
  :data:`LOGGING_ONLY_PIN`) while it is in that mode, from the ``PUT …/configurations/service``
  that sets it or from the first rank that creates the agent under it, and unpinned when the
  mode leaves LoggingOnly, unless an operator pinned it for another reason.
* **Apprentice** serves the baseline and learns from its rewards. Whether the learned policy
  beats the baseline is an evaluation's finding (:mod:`.evaluations`): every evaluation keeps its
  comparison of the two, and ``GET …/configurations/service`` answers the newest one as
  ``latestApprenticeModeMetrics``. Switching to Online stays the operator's decision.
"""

from __future__ import annotations

import json
from typing import Any

from agent_learning.app.personalizer.config import ServiceConfiguration
from agent_learning.pipeline import load_current, set_pinned
from agent_learning.store.base import Store

LOGGING_ONLY_PIN = "personalizer learningMode LoggingOnly: serving the baseline and logging only"
APPRENTICE_CHECKPOINT = "personalizer-apprentice:{agent_id}"
"""The newest evaluation's learned-policy-against-baseline comparison of an agent."""


def follow_mode(store: Store, agent_id: str, config: ServiceConfiguration) -> None:
    """Pin the agent while ``config`` is LoggingOnly; unpin it when it leaves LoggingOnly if it was
    pinned for that (an agent without a policy yet is pinned when its first rank creates it)."""
    current = load_current(store, agent_id)
    if current is None:
        return
    if config.learningMode == "LoggingOnly" and not current.pinned:
        set_pinned(store, agent_id, True, LOGGING_ONLY_PIN)
    elif config.learningMode != "LoggingOnly" and current.pinned and current.pin_reason == LOGGING_ONLY_PIN:
        set_pinned(store, agent_id, False)


def keep_apprentice_metrics(store: Store, agent_id: str, metrics: dict[str, Any]) -> None:
    store.set_checkpoint(APPRENTICE_CHECKPOINT.format(agent_id=agent_id), json.dumps(metrics))


def with_apprentice_metrics(store: Store, agent_id: str, config: ServiceConfiguration) -> dict[str, Any]:
    """The configuration as the API answers it: in Apprentice mode, with the newest evaluation's
    comparison of the learned policy and the baseline (``None`` before any evaluation)."""
    out = config.to_dict()
    if config.learningMode == "Apprentice":
        stored = store.get_checkpoint(APPRENTICE_CHECKPOINT.format(agent_id=agent_id))
        out["latestApprenticeModeMetrics"] = json.loads(stored) if stored else None
    return out
