"""An agent's policy over its versions: probabilities, mean reward and entropy per version.

Read from the immutable version documents, each of which embeds the training run that
produced it; the CLI's ``policy history`` and ``report`` and the demo's chart use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .documents import PolicyDocument
from .policy import policy_entropy, policy_probabilities

__all__ = ["AgentHistory", "history", "policy_entropy", "policy_probabilities"]


@dataclass
class AgentHistory:
    """One agent's policy over its versions."""

    agent_id: str
    action_ids: list[str]
    versions: list[int] = field(default_factory=list)
    probabilities: list[list[float | None]] = field(default_factory=list)
    """Per version, the probability of each of ``action_ids`` (every action any version had);
    None where that version did not have the action (``agent-learn policy revise``)."""
    mean_reward: list[float | None] = field(default_factory=list)
    entropy: list[float | None] = field(default_factory=list)
    expected_rewards: dict[str, float] = field(default_factory=dict)
    documents: list[PolicyDocument] = field(default_factory=list)
    pinned: bool = False
    """Whether learning is paused now (a pin makes no version: it is state of the current document)."""

    def window(
        self, *, last: int | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> AgentHistory:
        """The versions created from ``since`` to ``until`` (inclusive), of those the newest ``last``."""
        keep = [
            i for i, doc in enumerate(self.documents)
            if (since is None or doc.created_at >= since) and (until is None or doc.created_at <= until)
        ]
        if last is not None:
            keep = keep[-last:]
        return AgentHistory(
            self.agent_id,
            self.action_ids,
            [self.versions[i] for i in keep],
            [self.probabilities[i] for i in keep],
            [self.mean_reward[i] for i in keep],
            [self.entropy[i] for i in keep],
            self.expected_rewards,
            [self.documents[i] for i in keep],
            self.pinned,
        )

    @property
    def best_action(self) -> str:
        return max(self.expected_rewards, key=self.expected_rewards.__getitem__)

    @property
    def final(self) -> dict[str, float]:
        """The latest version's probabilities, of its own actions."""
        return {a: p for a, p in zip(self.action_ids, self.probabilities[-1], strict=True) if p is not None}


def history(store: Any, agent_id: str) -> AgentHistory:
    """Probabilities, mean reward and entropy of every version of an agent's policy.

    The mean reward of a version is that of the batch its training run learned from (none
    for ``init`` and ``rollback`` versions); the entropy is that of the policy agents draw
    from, exploration floor included.
    """
    docs = [PolicyDocument.from_dict(d) for d in store.list_policy_versions(agent_id)]
    h = AgentHistory(agent_id, list(dict.fromkeys(a for doc in docs for a in doc.action_ids)))
    for doc in docs:
        probs = policy_probabilities(doc)
        own = dict(zip(doc.action_ids, probs, strict=True))
        h.versions.append(doc.version)
        h.probabilities.append([own.get(a) for a in h.action_ids])
        h.mean_reward.append(doc.run.metrics.get("mean_reward") if doc.run and doc.run.episodes else None)
        h.entropy.append(policy_entropy(probs))
        h.documents.append(doc)
    current = store.get_current_policy(agent_id)
    h.pinned = bool(current and current.doc.get("pinned"))
    return h
