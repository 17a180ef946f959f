"""Operators' interventions on a policy: roll back, pin and unpin.

History is never rewritten. A rollback publishes the logits (and temperature and exploration
floor) of an earlier version as a *new* version with ``source="rollback"``; the training
cursor stays where it is, so no score is learned twice and none is forgotten, and so does the
learner state (the reward evidence gathered up to that cursor: what the episodes showed is
still true after a rollback). Pinning freezes
learning: it sets ``pinned`` on the current document only (no new version), the trainer then
leaves the agent alone and its cursor stays put, and unpinning resumes learning from there, so
scores that arrived meanwhile are learned then. Every change is an ETag compare-and-swap on the
current document, retried when a trainer published in between, and every call is idempotent:
pinning a pinned policy or repeating a rollback changes nothing.

Before it replaces the current document, every intervention writes the version and run records
of the version it replaces (:func:`~agent_learning.pipeline.materialise`): a trainer that died
between publishing a version and writing its records leaves only the current document holding
it, and agents may already have logged episodes under it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .clock import SYSTEM_CLOCK, Clock
from .documents import PolicyDocument
from .errors import ConcurrencyConflict, NotFound
from .pipeline import materialise
from .store.base import Store

ATTEMPTS = 5


@dataclass(frozen=True)
class Change:
    """The current policy after an intervention, and whether it changed anything."""

    policy: PolicyDocument
    changed: bool


def _swap(store: Store, agent_id: str, change: Callable[[PolicyDocument], PolicyDocument | None]) -> Change:
    """Apply ``change`` to the current document with compare-and-swap, re-reading on a lost race."""
    for _ in range(ATTEMPTS):
        tagged = store.get_current_policy(agent_id)
        if tagged is None:
            raise NotFound(f"agent_id: {agent_id!r} has no policy")
        current = PolicyDocument.from_dict(tagged.doc)
        new = change(current)
        if new is None:
            return Change(current, False)
        new = PolicyDocument.from_dict(new.to_dict())
        materialise(store, current)  # the version being replaced must not be lost with it
        try:
            store.replace_current_policy(new, tagged.etag)
        except ConcurrencyConflict:
            continue
        materialise(store, new)
        return Change(new, True)
    raise ConcurrencyConflict(f"the policy of {agent_id!r} kept changing; try again")


def set_pinned(store: Store, agent_id: str, pinned: bool, reason: str = "") -> Change:
    """Pin (freeze learning) or unpin an agent's policy. Idempotent."""

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if current.pinned == pinned:
            return None
        return current.model_copy(update={"pinned": pinned, "pin_reason": reason[:1000] if pinned else ""})

    return _swap(store, agent_id, change)


def rollback(store: Store, agent_id: str, version: int, *, clock: Clock = SYSTEM_CLOCK, note: str = "") -> Change:
    """Publish version ``version``'s logits as the next version. Repeating it changes nothing."""
    raw = store.get_policy_version(agent_id, version)
    if raw is None:
        known = [d.get("version") for d in store.list_policy_versions(agent_id)]
        if not known:
            raise NotFound(f"agent_id: {agent_id!r} has no policy")
        raise NotFound(f"VERSION: {agent_id!r} has no version {version} (versions {known[0]} to {known[-1]})")
    target = PolicyDocument.from_dict(raw)

    def change(current: PolicyDocument) -> PolicyDocument | None:
        if current.source == "rollback" and current.parent_version == version:
            return None  # already rolled back to it
        if current.version == version:
            raise ValueError(f"VERSION: v{version} is the current version of {agent_id!r}; nothing to roll back")
        if target.action_ids != current.action_ids:
            raise ValueError(f"VERSION: v{version} has other actions than the current policy")
        return current.model_copy(
            update={
                "version": current.version + 1,
                "logits": list(target.logits),
                "temperature": target.temperature,
                "exploration_floor": target.exploration_floor,
                "source": "rollback",
                "parent_version": version,
                "run": None,
                "created_at": clock.now(),
                "note": (f"rollback from v{current.version} to v{version}" + (f": {note}" if note else ""))[:1000],
            }
        )

    return _swap(store, agent_id, change)
