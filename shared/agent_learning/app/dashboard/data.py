"""What the dashboard shows, gathered from the store and the queues: plain data, no HTML.

Everything is read with what the rest of the library already computes: the policy history
(:func:`~agent_learning.ops.history.history`), the audit (:func:`~agent_learning.ops.audit.audit`),
the drift warnings (:func:`~agent_learning.pipeline.drift.assess` on the stored runs), the guardrail's
evaluation stored on each run, the judging rule (``AGENT_LEARNING_JUDGING``) and the queue port's
counts. Nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import Score, TrainingRun
from agent_learning.judges.sampling import JudgingRules
from agent_learning.ops.audit import AgentAudit, Audit, audit
from agent_learning.ops.history import AgentHistory, history, source_label
from agent_learning.pipeline.drift import DriftConfig, DriftWarning, RunReward, assess
from agent_learning.policy.softmax import policy_choices
from agent_learning.queue.base import WorkQueue
from agent_learning.store.base import Store

Z_95 = 1.96
"""The normal quantile of a run's 95 % interval of its mean reward (mean ± Z·std/√episodes)."""

GOOD = 0.5
"""Where "good" starts, for a user's feedback value (0–1) and for the judge's verdict (the mean of
its metrics' normalised scores, 0–1): the judge agrees with a user when both are on the same side."""

AGREEMENT_WINDOWS = 12
"""Stretches of time the judge-against-users chart splits an agent's feedback into (equal counts)."""

AGREEMENT_FALL = 0.15
"""A fall of the latest episodes' agreement below the earlier ones' by at least this warns."""

AGREEMENT_MIN_EPISODES = 20
"""The latest episodes with feedback a fall is measured on: at least this many, and at least a
stretch of the chart (fewer: noise); the earlier ones are what they are compared with."""

FEEDBACK_LIMIT = 2_000
"""Newest feedback episodes per agent the agreement reads the judge's score of (one point read each)."""

FEED_PAGE = 1_000
"""Feedback documents read per store call."""
OVERVIEW_AUDIT_SECONDS = 5.0
"""How long the overview audits agents (each audit reads all of an agent's scores): the agents
not reached show no books, named in a note, so the page stays quick for agents with millions of
episodes; `agent-learn audit` counts them all."""


@dataclass(frozen=True)
class QueueState:
    """One queue: its depth, dead letters by reason and the age of its oldest message."""

    name: str
    active: int = 0
    locked: int = 0
    dead_letter: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    oldest_seconds: float | None = None
    """Age of the oldest message held (None: the queue is empty)."""
    error: str = ""
    """Why the queue could not be read (the rest of the page is shown all the same)."""


@dataclass(frozen=True)
class Agreement:
    """How often the judge's verdict agrees with users' feedback on the same episodes."""

    episodes: int = 0
    agreed: int = 0
    windows: list[tuple[str, int, float]] = field(default_factory=list)
    """Per stretch of time, oldest first: its last feedback's date, episodes, agreement rate."""
    warning: str = ""
    note: str = ""

    @property
    def rate(self) -> float | None:
        return self.agreed / self.episodes if self.episodes else None


@dataclass(frozen=True)
class RunPoint:
    """One training run: its reward with its interval, and the guardrail's decision on its candidate."""

    version: int
    """The version it published (or, held, would have)."""
    finished_at: str
    episodes: int
    mean: float | None
    low: float | None
    high: float | None
    std: float
    """The std of its episodes' rewards."""
    status: str
    """``published`` or ``held``."""
    verdict: str = ""
    """The guardrail's verdict (``published``, ``shrunk``, ``held``, ``warned``, ``too_few_samples``; ``""``: none)."""
    reason: str = ""
    estimate: tuple[float, float, float] | None = None
    """The off-policy estimate of the candidate: value, low, high."""


@dataclass
class AgentRow:
    """One agent at a glance."""

    agent_id: str
    version: int
    published_at: str = ""
    pinned: bool = False
    pin_reason: str = ""
    problem: str = ""
    """Why the current document does not validate (``""``: it does)."""
    last_verdict: str = ""
    last_verdict_reason: str = ""
    judging: str = "all"
    """The judging rule that applies to the agent (``all``, a fraction, ``N/min``)."""
    audit: AgentAudit | None = None
    """Its books (lost, learned twice, pending, dead-lettered, judged and unjudged episodes); None
    where the page does not audit."""
    agreement: Agreement = field(default_factory=Agreement)


@dataclass
class Overview:
    agents: list[AgentRow]
    queues: list[QueueState]
    notes: list[str]


@dataclass
class AgentPage:
    """Everything the page of one agent shows."""

    row: AgentRow
    history: AgentHistory
    runs: list[RunPoint]
    drift: list[DriftWarning]
    rollbacks: list[tuple[int, int | None]]
    """(version, the version it rolled back to)."""
    sources: list[str]
    """Per version of ``history``, how it was made (``train``, ``rollback of v3``)."""
    created: list[str]
    """Per version of ``history``, when it was made."""


def queue_state(queue: WorkQueue, now: float) -> QueueState:
    """One queue's state; a queue that cannot be read says why instead of failing the page."""
    try:
        counts = queue.counts()
        oldest = queue.oldest_enqueued_at()
        by_reason: dict[str, int] = {}
        for letter in queue.dead_letters(max(counts.dead_letter, 1)):
            by_reason[letter.reason] = by_reason.get(letter.reason, 0) + 1
    except Exception as exc:  # a queue that cannot be read: said on the page
        return QueueState(queue.name, error=f"{type(exc).__name__}: {exc}")
    return QueueState(queue.name, counts.active, counts.locked, counts.dead_letter, dict(sorted(by_reason.items())),
                      None if oldest is None else max(0.0, now - oldest))


def feedback_by_agent(store: Store, agent_id: str | None = None) -> dict[str, dict[str, tuple[float, str]]]:
    """Agent id → episode id → (mean feedback value over its sources, latest received time), from one
    pass over the feedback change feed (an overwritten document counts once, as it stands)."""
    latest: dict[str, dict[str, Any]] = {}
    continuation = None
    while True:
        page = store.read_feedback_changes(continuation, FEED_PAGE)
        for doc in page.items:
            if agent_id is None or doc.get("agent_id") == agent_id:
                latest[str(doc.get("id"))] = doc
        if not page.items or page.continuation in (None, continuation):
            break
        continuation = page.continuation
    values: dict[str, dict[str, list[float]]] = {}
    times: dict[tuple[str, str], str] = {}
    for doc in latest.values():
        agent, episode, value = doc.get("agent_id"), doc.get("episode_id"), doc.get("value")
        if not (isinstance(agent, str) and isinstance(episode, str) and isinstance(value, int | float)):
            continue
        values.setdefault(agent, {}).setdefault(episode, []).append(float(value))
        times[agent, episode] = max(times.get((agent, episode), ""), str(doc.get("received_at", "")))
    return {
        agent: {episode: (sum(v) / len(v), times[agent, episode]) for episode, v in episodes.items()}
        for agent, episodes in values.items()
    }


def judge_verdict(raw: Any) -> float | None:
    """The judge's verdict on an episode (0–1): the mean of its score's normalised metrics (None
    without a valid score with metrics)."""
    try:
        score = Score.from_dict(raw)
    except InvalidDocument:
        return None
    metrics = [m.normalised for m in score.metrics.values()]
    return sum(metrics) / len(metrics) if metrics else None


def agreement(store: Store, agent_id: str, feedback: dict[str, tuple[float, str]]) -> Agreement:
    """How often the judge agrees with users on ``agent_id``'s episodes with ``feedback``, over time
    (:data:`AGREEMENT_WINDOWS` stretches of equal counts, by when the feedback came)."""
    ordered = sorted(feedback.items(), key=lambda item: item[1][1])
    note = ""
    if len(ordered) > FEEDBACK_LIMIT:
        note = f"the newest {FEEDBACK_LIMIT:,} of {len(ordered):,} episodes with feedback"
        ordered = ordered[-FEEDBACK_LIMIT:]
    pairs: list[tuple[str, bool]] = []
    for episode_id, (value, at) in ordered:
        raw = store.get_score(episode_id, agent_id)
        verdict = judge_verdict(raw) if raw is not None else None
        if verdict is not None:
            pairs.append((at, (verdict >= GOOD) == (value >= GOOD)))
    if not pairs:
        return Agreement(note=note)
    size = math.ceil(len(pairs) / AGREEMENT_WINDOWS)
    windows = []
    for end in range(len(pairs), 0, -size):  # from the newest: the latest stretch is a full one
        chunk = pairs[max(0, end - size) : end]
        windows.insert(0, (chunk[-1][0][:10], len(chunk), sum(ok for _, ok in chunk) / len(chunk)))
    warning = ""
    latest = max(size, AGREEMENT_MIN_EPISODES)
    if len(pairs) > latest:
        recent, earlier = pairs[-latest:], pairs[:-latest]
        now = sum(ok for _, ok in recent) / len(recent)
        before = sum(ok for _, ok in earlier) / len(earlier)
        if before - now >= AGREEMENT_FALL:
            warning = (f"the judge agrees with users on {now:.0%} of the latest {len(recent)} episodes with "
                       f"feedback, down from {before:.0%} before them: has the judge's model changed?")
    return Agreement(len(pairs), sum(ok for _, ok in pairs), windows, warning, note)


def run_point(raw: dict[str, Any]) -> RunPoint | None:
    """A stored run as the charts need it (None for an invalid run document)."""
    try:
        run = TrainingRun.from_dict(raw)
    except InvalidDocument:
        return None
    mean = run.metrics.get("mean_reward") if run.episodes else None
    # the std drift compares runs with (the learner's reward_std for runs before episode_reward_std)
    std = run.metrics.get("episode_reward_std", run.metrics.get("reward_std", 0.0))
    low = high = None
    if mean is not None:
        half = Z_95 * std / math.sqrt(run.episodes)
        low, high = mean - half, mean + half
    evaluation = run.evaluation
    estimate = None
    if evaluation is not None and evaluation.candidate is not None:
        estimate = (evaluation.candidate.value, evaluation.candidate.low, evaluation.candidate.high)
    finished = run.finished_at.isoformat(sep=" ", timespec="minutes")
    verdict, reason = (evaluation.verdict, evaluation.reason) if evaluation else ("", "")
    return RunPoint(run.policy_version, finished, run.episodes, mean, low, high, std, run.status, verdict, reason,
                    estimate)


def drift_warnings(agent_id: str, h: AgentHistory, runs: Sequence[RunPoint], config: DriftConfig) -> list[DriftWarning]:
    """The warnings the trainer gave (or would have given) at each published version, recomputed
    from the stored runs as :func:`~agent_learning.pipeline.drift.review` does (the entropy is the
    version's with no context)."""
    rewards = [RunReward(r.episodes, r.mean, r.std, r.version)
               for r in runs if r.status != "held" and r.mean is not None]
    rewards.sort(key=lambda r: r.version, reverse=True)  # newest first
    at = {v: i for i, v in enumerate(h.versions)}
    found: list[DriftWarning] = []
    for i, reward in enumerate(rewards):
        j = at.get(reward.version)
        entropy = h.entropy[j] if j is not None else None
        if j is None or entropy is None:
            continue
        found.extend(assess(agent_id, reward.version, rewards[i:], entropy, policy_choices(h.documents[j]), config))
    return sorted(found, key=lambda w: w.version)


def agent_rows(store: Store, rules: JudgingRules, audited: Audit | None,
               feedback: dict[str, dict[str, dict[str, tuple[float, str]]]] | None = None,
               agent_ids: Sequence[str] | None = None) -> list[AgentRow]:
    """One :class:`AgentRow` per agent with a current policy (or per ``agent_ids``), with its audit
    figures when ``audited`` holds it."""
    books = {a.agent_id: a for a in audited.agents} if audited is not None else {}
    rows = []
    for cursor in store.training_cursors():
        if agent_ids is not None and cursor.agent_id not in agent_ids:
            continue
        row = AgentRow(cursor.agent_id, cursor.version, pinned=cursor.pinned, pin_reason=cursor.pin_reason,
                       problem=cursor.problem, judging=str(rules.rule_for(cursor.agent_id).spec))
        times = dict(store.policy_version_times(cursor.agent_id))
        row.published_at = str(times.get(cursor.version, ""))[:19].replace("T", " ")
        newest = store.list_runs(cursor.agent_id, 1)
        point = run_point(newest[0]) if newest else None
        if point is not None:
            row.last_verdict = point.verdict or point.status
            row.last_verdict_reason = point.reason
        row.audit = books.get(cursor.agent_id)
        if feedback is not None:
            row.agreement = agreement(store, cursor.agent_id, feedback.get(cursor.agent_id, {}))
        rows.append(row)
    return rows


def overview(store: Store, rules: JudgingRules, queues: Sequence[WorkQueue], now: datetime) -> Overview:
    """Every agent at a glance, and the queues."""
    scoring = queues[0] if queues else None
    training = queues[1] if len(queues) > 1 else None
    audited = audit(store, scoring, train_queue=training, seconds=OVERVIEW_AUDIT_SECONDS)
    rows = agent_rows(store, rules, audited, feedback_by_agent(store))
    states = [queue_state(q, now.timestamp()) for q in queues]
    notes = list(audited.notes)
    if not queues:
        notes.append("this host has no queues to read")
    return Overview(rows, states, notes)


def agent_page(store: Store, agent_id: str, rules: JudgingRules, config: DriftConfig) -> AgentPage | None:
    """The page of one agent (None: it has no current policy)."""
    rows = agent_rows(store, rules, None, feedback_by_agent(store, agent_id), [agent_id])
    if not rows:
        return None
    h = history(store, agent_id)
    raw_runs = store.list_runs(agent_id, 1_000_000)
    runs = sorted((p for p in map(run_point, raw_runs) if p is not None), key=lambda p: (p.version, p.finished_at))
    rollbacks = [(d.version, d.parent_version) for d in h.documents if d.source == "rollback"]
    sources = [source_label(d.source, d.parent_version) for d in h.documents]
    created = [d.created_at.isoformat(sep=" ", timespec="minutes") for d in h.documents]
    return AgentPage(rows[0], h, runs, drift_warnings(agent_id, h, runs, config), rollbacks, sources,
                     created)
