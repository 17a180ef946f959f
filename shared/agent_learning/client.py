"""Agent side: read an agent's current policy, cached, and choose from it.

:class:`PolicyClient` re-reads the current policy document at most every
``refresh_seconds`` with a conditional read (``If-None-Match`` on Cosmos DB), so an unchanged
policy costs no document transfer and no parsing. If the document cannot be read (the store
unreachable or answering with errors) or fails validation, it keeps serving the last good
policy (and logs why) rather than failing the agent; only the very first read must succeed.
"""

from __future__ import annotations

import logging
import random
import threading

from .clock import SYSTEM_CLOCK, Clock
from .documents import PolicyDocument
from .errors import NotFound
from .policy import Decision, SoftmaxPolicy
from .store.base import Store, Tagged

log = logging.getLogger(__name__)


class PolicyClient:
    """The agent's handle on its policy: ``client.choose()`` → :class:`Decision`."""

    def __init__(
        self,
        store: Store,
        agent_id: str,
        *,
        refresh_seconds: float = 30.0,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.agent_id = agent_id
        self.refresh_seconds = refresh_seconds
        self.rng = rng or random.Random()
        self.clock = clock
        self._policy: SoftmaxPolicy | None = None
        self._etag: str | None = None
        self._checked_at = -float("inf")
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self.reads_with_transfer = 0
        self.reads_not_modified = 0

    def policy(self) -> SoftmaxPolicy:
        """The current policy, refreshed if older than ``refresh_seconds``."""
        if self._policy is None or self.clock.time() - self._checked_at >= self.refresh_seconds:
            self.refresh()
        assert self._policy is not None
        return self._policy

    def choose(self) -> Decision:
        return self.policy().choose()

    def refresh(self) -> SoftmaxPolicy:
        """Read the current document now; keep the last good policy on any failure."""
        with self._lock:
            self._checked_at = self.clock.time()
            try:
                known = self._etag if self._policy is not None else None
                tagged = self.store.get_current_policy_if_changed(self.agent_id, known)
                if tagged is None:
                    raise NotFound(
                        f"agent {self.agent_id!r} has no policy; create one with "
                        f"`agent-learn init-policy --agent-id {self.agent_id} --actions FILE`"
                    )
                if isinstance(tagged, Tagged):
                    doc = PolicyDocument.from_dict(tagged.doc)
                    self._policy = SoftmaxPolicy.from_document(doc, rng=self.rng)
                    self._etag = tagged.etag
                    self.reads_with_transfer += 1
                else:
                    self.reads_not_modified += 1
                self.last_error = None
            except Exception as exc:  # invalid, deleted, or the store unreachable (an SDK error of any type)
                self.last_error = str(exc) or type(exc).__name__
                if self._policy is None:
                    raise
                log.warning("keeping policy %s v%d: %s", self.agent_id, self._policy.version, exc)
            return self._policy
