"""The timer's sweep of Personalizer events whose reward wait is over: an activated event takes
its reward from those received within the wait (``rewardAggregation``), or ``defaultReward`` when
none came, and is learned as its episode; an event never activated in its wait is not learned
from, and stops being swept (an activation later still learns it, once it has a reward).

The pending events are the store's checkpoints ``personalizer-pending:{episode id}``
(:meth:`~agent_learning.store.base.Store.list_checkpoints`), each removed once its event is settled,
so a sweep reads only the events still waiting.
"""

from __future__ import annotations

import logging
from datetime import datetime

from agent_learning.app.personalizer.config import ServiceConfiguration
from agent_learning.app.personalizer.events import PENDING_CHECKPOINT, aggregated, configuration, load_event, settle
from agent_learning.core.clock import Clock
from agent_learning.store.base import Store

log = logging.getLogger("agent_learning.app.personalizer")

PENDING_PREFIX = PENDING_CHECKPOINT.format(episode_id="")


def sweep_events(store: Store, clock: Clock) -> int:
    """Settle every pending event whose reward wait is over; returns how many were learned."""
    configs: dict[str, ServiceConfiguration] = {}
    learned = 0
    for name, ranked_at in store.list_checkpoints(PENDING_PREFIX).items():
        event = load_event(store, name.removeprefix(PENDING_PREFIX))
        if event is None or event["learned"]:
            store.delete_checkpoint(name)
            continue
        agent_id = event["agent_id"]
        config = configs.get(agent_id) or configs.setdefault(agent_id, configuration(store, agent_id))
        if clock.now() <= datetime.fromisoformat(ranked_at) + config.reward_wait:
            continue
        if not event["activated"]:
            store.delete_checkpoint(name)
            continue
        if event["reward"] is None:
            event["reward"] = aggregated(event, config)
        settle(store, event, config, clock)
        learned += 1
    if learned:
        log.info("personalizer sweep: %d events learned after their reward wait", learned)
    return learned
