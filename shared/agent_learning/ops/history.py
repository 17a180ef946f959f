"""An agent's policy over its versions: probabilities, mean reward and entropy per version.

Read from the immutable version documents, each of which embeds the training run that
produced it; the CLI's ``policy history`` and ``report`` and the demo's chart use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import PolicyDocument, stored_policy
from agent_learning.policy.softmax import NO_CONTEXT, SoftmaxPolicy, policy_entropy, policy_probabilities, segment_views

__all__ = ["AgentHistory", "history", "policy_entropy", "policy_probabilities", "source_label", "versions_created"]


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
    """Whether learning is paused now, at the newest of ``versions`` (a pin makes no version: it is
    state of the current document, so False when the versions read end before the current one)."""
    segments: dict[str, list[dict[str, float] | None]] = field(default_factory=dict)
    """A structured policy's probabilities per segment (``"task=billing"``): per version, each value's
    probability of being chosen in its dimension in that segment (None before the segment was learned)."""
    expected_by_segment: dict[str, dict[str, float]] = field(default_factory=dict)
    """A simulated structured agent's true mean reward of each configuration, per segment (the demo's)."""
    estimates: list[tuple[float, float, float] | None] = field(default_factory=list)
    """Per version, the publish guardrail's estimate of its mean reward before it was published
    (value, low, high; None for versions published without one)."""
    invalid: list[str] = field(default_factory=list)
    """Why each version document that failed validation was left out of ``versions`` (it names
    the document and its fields); the others are read all the same."""

    @property
    def best_action(self) -> str | None:
        """The action with the highest true mean reward (None unless the history knows them)."""
        return max(self.expected_rewards, key=self.expected_rewards.__getitem__) if self.expected_rewards else None

    def best_by_segment(self) -> dict[str, tuple[str, float, float]]:
        """Per segment: the configuration with the highest true mean, that mean, and the probability
        the latest version gives it in that segment (the demo's structured agent)."""
        if not self.expected_by_segment or not self.documents:
            return {}
        policy = SoftmaxPolicy(self.documents[-1])
        out = {}
        for segment, means in self.expected_by_segment.items():
            best = max(means, key=means.__getitem__)
            name, _, value = segment.partition("=")
            out[segment] = (best, means[best], policy.probability(best, {name: value}))
        return out

    @property
    def final(self) -> dict[str, float]:
        """The latest version's probabilities, of its own actions."""
        return {a: p for a, p in zip(self.action_ids, self.probabilities[-1], strict=True) if p is not None}


def history(
    store: Any,
    agent_id: str,
    newest: int | None = None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> AgentHistory:
    """Probabilities, mean reward and entropy of every version of an agent's policy; with
    ``since``/``until``, of the versions created in that window (inclusive); with ``newest``,
    of the newest ``newest`` of those. The store reads no other version document (a window
    first reads every version's number and time, a few dozen bytes each, then the versions
    from the window's first to its last: versions are numbered in the order they were made, so
    only a clock that went backwards puts another version among them, which is then dropped).

    The mean reward of a version is that of the batch its training run learned from (none
    for ``init`` and ``rollback`` versions); the entropy is that of the policy agents draw
    from, exploration floor included. For a structured policy both the probabilities and the
    entropy are those with no context (what a request without features gets); ``segments``
    holds the probabilities in each learned segment, which is what agents that send the
    feature draw from. A version document that fails validation is left out and said in
    ``invalid``.
    """
    if since is None and until is None:
        raw = store.list_policy_versions(agent_id, newest)
    else:
        wanted = versions_created(store, agent_id, since, until)
        if newest is not None:
            wanted = wanted[max(len(wanted) - newest, 0) :]
        keep = set(wanted)
        found = store.list_policy_versions(agent_id, between=(wanted[0], wanted[-1])) if wanted else []
        raw = [d for d in found if d.get("version") in keep]
    docs, invalid = [], []
    for d in raw:
        try:
            docs.append(stored_policy(d))
        except InvalidDocument as exc:
            invalid.append(str(exc))
    h = AgentHistory(agent_id, list(dict.fromkeys(a for doc in docs for a in doc.action_ids)), invalid=invalid)
    for doc in docs:
        views = segment_views(doc)
        # the probabilities with no context are the view of that name (computed once)
        probs = [p for v in views[NO_CONTEXT].values() for p in v.values()]
        own = dict(zip(doc.action_ids, probs, strict=True))
        h.versions.append(doc.version)
        h.probabilities.append([own.get(a) for a in h.action_ids])
        h.mean_reward.append(doc.run.metrics.get("mean_reward") if doc.run and doc.run.episodes else None)
        h.entropy.append(policy_entropy(probs))
        h.documents.append(doc)
        guess = doc.run.evaluation.candidate if doc.run and doc.run.evaluation else None
        h.estimates.append((guess.value, guess.low, guess.high) if guess else None)
        if views:
            for name in views:
                if name != NO_CONTEXT:
                    h.segments.setdefault(name, [None] * (len(h.versions) - 1))
            for name, series in h.segments.items():
                view = views.get(name)
                series.append({k: p for values in view.values() for k, p in values.items()} if view else None)
    current = store.get_current_policy(agent_id)
    state = current.doc if current is not None and isinstance(current.doc, dict) else {}  # a list: edited by hand
    newest = h.versions[-1] if h.versions else None
    h.pinned = bool(state.get("pinned") and state.get("version") == newest)
    return h


def source_label(source: str, parent_version: int | None) -> str:
    """How a version was made, for people: ``train``, ``revise``, ``rollback of v30``."""
    return f"{source} of v{parent_version}" if source == "rollback" else source


def versions_created(store: Any, agent_id: str, since: datetime | None, until: datetime | None) -> list[int]:
    """The numbers of an agent's versions created from ``since`` to ``until`` (inclusive; either
    may be None), oldest first. Raises :class:`InvalidDocument` for a version whose creation
    time is not an ISO 8601 date and time with its offset, rather than leave it out unsaid, and
    ``ValueError`` for a ``since`` or ``until`` without a time zone (which no stored time compares with)."""
    for name, bound in (("since", since), ("until", until)):
        if bound is not None and bound.utcoffset() is None:
            raise ValueError(f"{name}: {bound.isoformat()} has no time zone; give one (e.g. tzinfo=UTC)")
    out = []
    for version, stamp in store.policy_version_times(agent_id):
        try:
            at = datetime.fromisoformat(stamp)
        except (TypeError, ValueError):
            at = None
        if at is None or at.tzinfo is None:
            raise InvalidDocument("policy", [("created_at", f"of version {version} is not a date and time: {stamp!r}")])
        if (since is None or at >= since) and (until is None or at <= until):
            out.append(version)
    return out
