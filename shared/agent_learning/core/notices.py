"""In-process notices that an agent's current policy changed.

:func:`~agent_learning.pipeline.publish` posts one after every write of a current document;
:class:`~agent_learning.agent.client.PolicyClient` checks for one before each choice, so an agent
picks up a version published in its own process (the embedded loop's ``run_once()``, a
rollback) at its next choice instead of after ``refresh_seconds``. Other processes learn of a
new version only by reading it, at the client's refresh interval. A notice is a counter per
agent id, whatever the store: a notice from another store with the same agent id costs one
conditional read, nothing more.
"""

from __future__ import annotations

import threading

_generations: dict[str, int] = {}
_lock = threading.Lock()


def policy_changed(agent_id: str) -> None:
    """Post that ``agent_id``'s current policy was replaced in this process."""
    with _lock:
        _generations[agent_id] = _generations.get(agent_id, 0) + 1


def generation(agent_id: str) -> int:
    """How many notices ``agent_id`` has had in this process."""
    return _generations.get(agent_id, 0)
