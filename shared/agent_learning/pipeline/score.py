"""Score: judge the episode a message names, shape its reward and store the score.

Idempotent, because every trigger delivers at least once: an episode that already has a
score is not judged again (unless ``force``); scores have the episode's id and are created
only once, so of two concurrent deliveries the first write wins and the other is a
``duplicate`` (it does not overwrite). :func:`agent_learning.app.deliveries.settle_score` applies an
outcome to the queue message that carried it.

Not every episode need be judged (``AGENT_LEARNING_JUDGING``, :mod:`agent_learning.judges.sampling`):
a valid episode that its agent's rule leaves out is recorded in its score slot
(``Store.mark_unjudged``) and its message completed (outcome ``unjudged``, counted once: a copy of
the message finds the record and is a ``duplicate``), to be judged later by
:func:`agent_learning.ops.recovery.judge_unjudged`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_learning.core import notices
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, PermanentError, TransientError
from agent_learning.core.telemetry import (
    EPISODES_SCORED,
    EPISODES_UNJUDGED,
    JUDGE_DURATION,
    JUDGE_FAILURES,
    QUEUE_LAG,
    REWARD,
    SPAN_JUDGE,
    SPAN_SCORE,
    count,
    record,
    span,
)
from agent_learning.documents import (
    Episode,
    JudgeInfo,
    Measures,
    MetricScore,
    PolicyDocument,
    RewardInfo,
    Score,
    ScoreRequest,
    UnjudgedRecord,
    stored_policy,
)
from agent_learning.judges.base import Judge
from agent_learning.judges.sampling import Decision, Judging
from agent_learning.pipeline.publish import load_current
from agent_learning.policy.softmax import knows_action
from agent_learning.rewards import RewardFunction, agent_reward
from agent_learning.rewards.feedback import reconcile
from agent_learning.store.base import Store


@dataclass(frozen=True)
class ScoreOutcome:
    """What happened to one scoring message, and what the caller must do with it.

    ``scored``/``duplicate``/``unjudged`` → complete; ``retry`` → abandon (redeliver later);
    ``dead_letter`` → dead-letter with ``reason`` and ``description``. ``unjudged``: the
    episode is recorded as not judged (``record``), by its agent's ``AGENT_LEARNING_JUDGING`` rule.
    """

    status: Literal["scored", "duplicate", "unjudged", "retry", "dead_letter"]
    episode_id: str | None
    reason: str = ""
    description: str = ""
    score: Score | None = None
    record: UnjudgedRecord | None = None


def load_policy_version(store: Store, agent_id: str, version: int) -> PolicyDocument:
    """The policy version an episode was drawn from: its version record, or the current document
    standing in for it.

    The trainer publishes the current document before it writes the version record, so
    agents can log episodes under a version whose record does not exist yet (for as long
    as a crash in between leaves it unwritten). The current document is a copy of the
    latest version, so it stands in for that record. Raises ``LookupError`` if there is no
    such version, :class:`InvalidDocument` if the document found does not validate.
    """
    raw = store.get_policy_version(agent_id, version)
    if raw is not None:
        return stored_policy(raw)
    current = load_current(store, agent_id)
    if current is None or current.version != version:
        raise LookupError(f"agent {agent_id!r} has no policy version {version}")
    return current.as_kind("version")


class PolicyVersions:
    """:func:`load_policy_version` of one store, remembering up to ``size`` versions (they are
    immutable); a missing version is not remembered. Thread-safe.

    ``max_age`` (seconds; ``None``: no limit) bounds how long a version is remembered: an older
    one is read again, so a version deleted with its agent (``agent-learn agent delete``) is no
    longer found once ``max_age`` has passed. ``fresh=True`` reads it again whatever its age, and
    so does a notice that the agent's policy changed in this process (:mod:`agent_learning.core.notices`:
    it may have been created again, as another incarnation).
    """

    def __init__(self, store: Store, size: int, *, max_age: float | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store, self._size, self._max_age, self._clock = store, size, max_age, clock
        self._kept: OrderedDict[tuple[str, int], tuple[float, int, PolicyDocument]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, agent_id: str, version: int, *, fresh: bool = False) -> PolicyDocument | None:
        """The version, or ``None`` if there is no such version; raises :class:`InvalidDocument`."""
        key, now, notice = (agent_id, version), self._clock.time(), notices.generation(agent_id)
        with self._lock:
            kept = None if fresh else self._kept.get(key)
            if kept is not None and kept[1] == notice and (self._max_age is None or now - kept[0] < self._max_age):
                self._kept.move_to_end(key)
                return kept[2]
        try:
            policy = load_policy_version(self._store, agent_id, version)
        except LookupError:
            with self._lock:
                self._kept.pop(key, None)
            return None
        with self._lock:
            self._kept[key] = (now, notice, policy)
            self._kept.move_to_end(key)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return policy


INCARNATION_MISMATCH = "IncarnationMismatch"
"""The dead-letter reason of an episode of another incarnation of its agent than its policy
version's (the agent was deleted and created again since it was written)."""


def policy_problem(episode: Episode, version_of: Callable[..., PolicyDocument | None]) -> tuple[str, str] | None:
    """Why ``episode`` cannot be scored against its policy, as the dead-letter reason and
    description (``UnknownPolicyVersion``, :data:`INCARNATION_MISMATCH`, ``UnknownAction``), or
    ``None`` if it can be.

    ``version_of`` finds the version (e.g. a :class:`PolicyVersions`; ``fresh=True`` bypasses its
    cache); its :class:`InvalidDocument` (an invalid policy document) propagates. An action or an
    incarnation the remembered version lacks is checked again on a fresh read: the version may be
    of a deleted agent, re-created under the same id since. An episode without an incarnation
    belongs to the legacy incarnation (:data:`~agent_learning.documents.Incarnation`).
    """
    policy = version_of(episode.agent_id, episode.policy_version)
    if policy is not None and (
        policy.incarnation != episode.incarnation or not knows_action(policy, episode.action_id)
    ):
        policy = version_of(episode.agent_id, episode.policy_version, fresh=True)
    if policy is None:
        return (
            "UnknownPolicyVersion",
            f"invalid episode: policy_version: agent {episode.agent_id!r} has no version {episode.policy_version}",
        )
    if policy.incarnation != episode.incarnation:
        return INCARNATION_MISMATCH, "invalid episode: incarnation: " + other_incarnation(
            f"episode {episode.id!r}", episode.incarnation, policy.incarnation, episode.agent_id
        )
    if not knows_action(policy, episode.action_id):
        return (
            "UnknownAction",
            f"invalid episode: action_id: {episode.action_id!r} is not an action of "
            f"{policy.id} (known: {policy.action_ids})",
        )
    return None


def other_incarnation(what: str, found: str | None, expected: str | None, agent_id: str) -> str:
    """Why ``what`` (of incarnation ``found``) is not learned by ``agent_id``, now ``expected``."""
    def name(incarnation: str | None) -> str:
        return incarnation or "legacy (from before incarnations)"

    return (
        f"{what} belongs to incarnation {name(found)} of agent {agent_id!r}, whose policy is incarnation "
        f"{name(expected)}: the agent was deleted and created again since (or the episode's writer did not "
        "copy the policy's incarnation); the new agent does not learn from it"
    )


CACHED_VERSIONS = 1024
"""Policy versions a scorer keeps parsed."""
AGENT_JUDGE = JudgeInfo(name="agent", model="none")
"""Who scored an episode that carries its own reward: the agent itself, no judge model."""


@dataclass
class Scorer:
    """Everything the score handler needs. Policy versions are immutable, so cached."""

    store: Store
    judge: Judge
    reward: RewardFunction
    clock: Clock = SYSTEM_CLOCK
    judging: Judging = field(default_factory=Judging)
    """Which episodes are judged (default: every one); holds this process's ``N/min`` windows."""

    def __post_init__(self) -> None:
        self._versions = PolicyVersions(self.store, CACHED_VERSIONS)

    def policy_version(self, agent_id: str, version: int, *, fresh: bool = False) -> PolicyDocument | None:
        """The policy version an episode was drawn from (:func:`load_policy_version`), or ``None``
        if there is no such version. A missing version is not cached; ``fresh`` reads it again."""
        return self._versions(agent_id, version, fresh=fresh)


def score_message(body: bytes | str, scorer: Scorer, *, delivery_count: int = 1, force: bool = False) -> ScoreOutcome:
    """Judge the episode a message names, shape its reward and store the score.

    Every delivery first checks for a stored score (one point read): a redelivery after a
    crash, and a copy of the message that arrives as a first delivery (after the queue's
    duplicate-detection window, a dead-letter replay or a change-feed rewind), cost no second
    judging (``delivery_count`` is accepted for compatibility: every delivery is checked alike).
    ``force`` re-scores (see :func:`score_episode`).
    """
    try:
        request = ScoreRequest.from_json(body)
    except InvalidDocument as exc:
        return ScoreOutcome("dead_letter", None, "InvalidMessage", str(exc))
    if request.episode is not None and request.episode.get("id") != request.episode_id:
        return ScoreOutcome("dead_letter", request.episode_id, "InvalidMessage",
                            "invalid score_request: episode.id: does not match episode_id")
    return score_episode(request.episode_id, scorer, episode=request.episode, agent_id=request.agent_id, force=force)


def score_episode(
    episode_id: str,
    scorer: Scorer,
    *,
    episode: Mapping[str, Any] | None = None,
    agent_id: str | None = None,
    check_existing: bool = True,
    force: bool = False,
    sample: bool = True,
) -> ScoreOutcome:
    """Score one episode (``episode`` is its document if the caller has it; else it is read).

    ``agent_id`` (the message's, when it names one) locates the score slot without reading the
    episode first, so a duplicate of a message without the episode costs one read; the stored
    score always takes the agent of the episode itself.

    ``check_existing`` looks for a stored score first (a duplicate is not judged again);
    ``force`` judges and overwrites it (re-scoring). With ``sample`` (and without ``force``) the
    agent's ``AGENT_LEARNING_JUDGING`` rule decides whether the episode is judged or recorded
    unjudged; ``sample=False`` judges it whatever the rule says (judging the backlog). A score
    slot held by another episode's feedback correction (ids ``{episode_id}:r{k}`` written before
    corrections had ids of their own) is dead-lettered as ``ScoreIdTaken``, never taken for a
    duplicate or overwritten.

    Feedback that arrived before the score left a marker that the score's write replaces;
    the written score then says ``feedback_pending`` and the feedback is reconciled here.
    """
    with span(SPAN_SCORE, {"episode_id": episode_id}) as sp:
        outcome = _score_episode(episode_id, scorer, episode, agent_id, check_existing, force, sample)
        sp.set_attribute("outcome", outcome.status)
        if outcome.reason:
            sp.set_attribute("reason", outcome.reason)
        # the stored document's agent; without one (a failure), the episode's or the message's
        written = outcome.score or outcome.record
        agent = written.agent_id if written is not None else (episode or {}).get("agent_id", agent_id)
        if isinstance(agent, str):
            sp.set_attribute("agent_id", agent)
        if outcome.score is not None:
            attrs = {"agent_id": outcome.score.agent_id}
            count(EPISODES_SCORED, 1, attrs)
            record(REWARD, outcome.score.reward, attrs)
        if outcome.record is not None:
            count(EPISODES_UNJUDGED, 1, {"agent_id": outcome.record.agent_id, "reason": outcome.record.reason})
        return outcome


def _score_episode(
    episode_id: str,
    scorer: Scorer,
    episode: Mapping[str, Any] | None,
    agent_id: str | None,
    check_existing: bool,
    force: bool,
    sample: bool,
) -> ScoreOutcome:
    store = scorer.store
    raw = dict(episode) if episode is not None else None
    read = raw is not None or agent_id is None
    if raw is not None:
        agent_id = raw.get("agent_id")
    elif agent_id is None:  # its agent keys the score slot: read the episode to learn it
        raw = store.get_episode(episode_id)
        agent_id = raw.get("agent_id") if raw is not None else None
    existing = None
    if (check_existing or force) and isinstance(agent_id, str):
        existing = store.get_score(episode_id, agent_id)
        if taken := _slot_taken(episode_id, existing):
            return taken
        if existing is not None and not force:
            if existing.get("feedback_pending"):  # a crash may have come between the score and its feedback
                reconcile(store, episode_id, agent_id, clock=scorer.clock)
            return ScoreOutcome("duplicate", episode_id, "AlreadyScored")
    if not read:
        raw = store.get_episode(episode_id)
    if raw is None:
        return ScoreOutcome(
            "dead_letter",
            episode_id,
            "EpisodeNotFound",
            f"episode {episode_id!r} does not exist (expired by TTL or never written)",
        )
    try:
        episode = Episode.from_dict(raw)
    except InvalidDocument as exc:
        return ScoreOutcome("dead_letter", episode_id, "InvalidEpisode", str(exc))
    try:
        problem = policy_problem(episode, scorer.policy_version)
    except InvalidDocument as exc:
        return ScoreOutcome("dead_letter", episode_id, "InvalidPolicy", str(exc))
    if problem is not None:
        return ScoreOutcome("dead_letter", episode_id, *problem)
    decision: Decision | None = None
    if episode.reward is not None:  # the agent's own reward: no judges, whatever the judging rule
        reward, info = agent_reward(episode.reward, scorer.reward.config)
        return _store_score(scorer, episode, existing, force, {}, AGENT_JUDGE, reward, info)
    if sample and not force:
        decision = scorer.judging.decide(episode.agent_id, episode.id, scorer.clock.time())
        if not decision.judge:
            return _record_unjudged(scorer, episode, decision)
        if decision.check_recorded and (kept := store.get_unjudged(episode.id, episode.agent_id)) is not None:
            scorer.judging.release(episode.agent_id, decision)  # an earlier delivery's answer stands
            return ScoreOutcome("duplicate", episode_id, "AlreadyRecordedUnjudged",
                                f"recorded unjudged before ({kept.get('reason')}); agent-learn rescore --unjudged")
    try:
        judgement = run_judge(scorer.judge, episode)
        reward, info = scorer.reward(judgement.metrics, episode)
    except TransientError as exc:
        if decision is not None:  # its redelivery asks for a place again: one episode, one place
            scorer.judging.release(episode.agent_id, decision)
        return ScoreOutcome("retry", episode_id, "JudgeUnavailable", str(exc))
    except PermanentError as exc:
        return ScoreOutcome("dead_letter", episode_id, "JudgeFailed", str(exc))
    return _store_score(scorer, episode, existing, force, judgement.metrics, judgement.judge, reward, info)


def _store_score(
    scorer: Scorer,
    episode: Episode,
    existing: Mapping[str, Any] | None,
    force: bool,
    metrics: Mapping[str, MetricScore],
    judge: JudgeInfo,
    reward: float,
    info: RewardInfo,
) -> ScoreOutcome:
    """Write the episode's score (create-only, or over ``existing`` when ``force``) and apply the
    feedback that waited for it."""
    store, episode_id = scorer.store, episode.id
    score = Score(
        id=episode.id,
        episode_id=episode.id,
        agent_id=episode.agent_id,
        action_id=episode.action_id,
        policy_version=episode.policy_version,
        probability=episode.probability,
        metrics=dict(metrics),
        judge=judge,
        reward=reward,
        reward_function=info,
        scored_at=scorer.clock.now(),
        context=episode.context,
        candidates=episode.candidates,
        measures=measures_of(episode, metrics),
        incarnation=episode.incarnation,
    )
    try:
        stored = store.put_score(score) if force else store.add_score(score)
    except ConcurrencyConflict:
        return _slot_taken(episode_id, store.get_score(episode_id, episode.agent_id)) or ScoreOutcome(
            "duplicate", episode_id, "AlreadyScored"
        )
    if existing is None:  # a re-score of an old episode says nothing about the queue
        lag = max(0.0, (stored.scored_at - episode.ended_at).total_seconds())
        record(QUEUE_LAG, lag, {"agent_id": episode.agent_id})
    if stored.feedback_pending:
        reconcile(store, episode_id, episode.agent_id, clock=scorer.clock)
    return ScoreOutcome("scored", episode_id, score=stored)


def _record_unjudged(scorer: Scorer, episode: Episode, decision: Decision) -> ScoreOutcome:
    """Record an episode its agent's rule leaves out; a duplicate if it has a score by now."""
    assert decision.reason is not None
    record = UnjudgedRecord(
        id=episode.id,
        episode_id=episode.id,
        agent_id=episode.agent_id,
        action_id=episode.action_id,
        policy_version=episode.policy_version,
        reason=decision.reason,
        rule=str(decision.rule),
        recorded_at=scorer.clock.now(),
    )
    mark = scorer.store.mark_unjudged(record)
    if mark == "scored":
        return ScoreOutcome("duplicate", episode.id, "AlreadyScored")
    if mark == "kept":  # an earlier delivery recorded it: counted then, not again
        return ScoreOutcome("duplicate", episode.id, "AlreadyRecordedUnjudged",
                            "recorded unjudged before; agent-learn rescore --unjudged")
    why = "sampled out" if decision.reason == "sampled_out" else "over the rate"
    return ScoreOutcome(
        "unjudged",
        episode.id,
        "SampledOut" if decision.reason == "sampled_out" else "OverRate",
        f"not judged ({why}, AGENT_LEARNING_JUDGING {decision.rule}); agent-learn rescore --unjudged judges it",
        record=record,
    )


def measures_of(episode: Episode, metrics: Mapping[str, MetricScore]) -> Measures:
    """The episode's latency, tool outcomes and tokens, and the judges' tokens, for the score."""
    tools = [s for s in episode.steps if s.kind == "tool"]
    judged = [m.prompt_tokens + (m.completion_tokens or 0) for m in metrics.values() if m.prompt_tokens is not None]
    return Measures(
        latency_ms=episode.latency_ms,
        tool_calls=len(tools),
        tool_failures=sum(1 for s in tools if s.status == "error"),
        tokens=episode.usage.total if episode.usage is not None else None,
        judge_tokens=sum(judged) if judged else None,
    )


def _slot_taken(episode_id: str, existing: Mapping[str, Any] | None) -> ScoreOutcome | None:
    """The dead letter for an episode whose score slot holds a row of another episode, else ``None``."""
    other = existing.get("episode_id") if existing is not None else None
    if existing is None or not isinstance(other, str) or other == episode_id:
        return None
    return ScoreOutcome(
        "dead_letter",
        episode_id,
        "ScoreIdTaken",
        f"the score id {episode_id!r} holds feedback correction {existing.get('revision')!r} of episode "
        f"{other!r} (an id corrections had before they got the form '{{episode_id}}~r{{k}}'); "
        "write the episode again under another id",
    )


def run_judge(judge: Judge, episode: Episode) -> Any:
    """One judge call, in its own span, with its duration and failures recorded."""
    name = getattr(judge, "info", None)
    attrs = {"judge": name.name if name is not None else type(judge).__name__, "agent_id": episode.agent_id}
    started = time.perf_counter()
    outcome = "ok"
    try:
        with span(SPAN_JUDGE, {**attrs, "episode_id": episode.id}):
            return judge.judge(episode)
    except TransientError:
        outcome = "transient"
        raise
    except PermanentError:
        outcome = "permanent"
        raise
    finally:
        record(JUDGE_DURATION, time.perf_counter() - started, {**attrs, "outcome": outcome})
        if outcome != "ok":
            count(JUDGE_FAILURES, 1, {**attrs, "kind": outcome})


