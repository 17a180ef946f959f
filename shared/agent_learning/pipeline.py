"""The three pipeline handlers: enqueue, score, train. Plain functions over the ports.

The same code runs under Azure Functions (the triggers in ``function_app.py`` call these),
in the embedded local runner and in tests. Every handler is idempotent, because every
trigger delivers at least once:

* :func:`enqueue_episodes` — the message id is the episode id, so Service Bus duplicate
  detection (and the embedded queue's) drops a redelivered batch.
* :func:`score_message` — an episode that already has a score is not judged again (unless
  ``force``); scores have the episode's id, so even a concurrent duplicate overwrites.
* :func:`train_agent` — the current policy document holds the logits and the cursor of the
  last score folded into them; a run reads the scores after that cursor and publishes the
  next version with one compare-and-swap on the document's ETag. A second trainer (or a
  replay) that read the same version loses the swap and changes nothing, so every score is
  learned from exactly once. Version and run records are written after the swap and
  re-created from the current document if a crash interrupted that.

Each stage runs in an OpenTelemetry span and records its metrics (:mod:`agent_learning.telemetry`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from .clock import SYSTEM_CLOCK, Clock
from .documents import (
    Episode,
    PolicyDocument,
    Rejected,
    Score,
    ScoreCursor,
    ScoreRequest,
    TrainingRun,
    run_doc_id,
)
from .errors import ConcurrencyConflict, InvalidDocument, PermanentError, TransientError
from .feedback import TOLERANCE, reconcile
from .judges.base import Judge
from .queue.base import OutgoingMessage, WorkQueue
from .rewards import RewardFunction
from .store.base import Store
from .telemetry import (
    EPISODES_DEAD_LETTERED,
    EPISODES_ENQUEUED,
    EPISODES_SCORED,
    JUDGE_DURATION,
    JUDGE_FAILURES,
    MEAN_REWARD,
    POLICY_ENTROPY,
    QUEUE_LAG,
    REWARD,
    SPAN_ENQUEUE,
    SPAN_JUDGE,
    SPAN_SCORE,
    SPAN_TRAIN,
    TRAINING_RUNS,
    count,
    record,
    span,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- enqueue


@dataclass(frozen=True)
class EnqueueResult:
    """What :func:`enqueue_episodes` did with a batch of changed documents."""

    received: int
    sent: int
    duplicates: int
    failed: list[tuple[int, str]] = field(default_factory=list)


EMBED_LIMIT_CHARS = 64_000
"""Episodes up to this size (as JSON) travel inside the scoring message, saving a read."""


def score_request_message(doc: Mapping[str, Any], embed_limit: int = EMBED_LIMIT_CHARS) -> OutgoingMessage:
    """The queue message that asks for ``doc`` to be scored. Its id is the episode id.

    The episode is not validated here: a malformed episode is rejected by the scorer, which
    dead-letters it with the reason, so every bad document ends up somewhere visible.
    """
    episode_id = doc.get("id")
    if not isinstance(episode_id, str) or not episode_id:
        raise InvalidDocument("episode", [("id", "missing or not a string; the document cannot be referenced")])
    body: dict[str, Any] = {"type": "score_request", "episode_id": episode_id}
    props: dict[str, str | int | float | bool] = {}
    agent_id = doc.get("agent_id")
    # Only an id of a plausible length (agent ids have at most 128 characters): a document may
    # hold anything up to 2 MB, and a message Service Bus cannot take would block the batch.
    if isinstance(agent_id, str) and len(agent_id) <= 128:
        body["agent_id"] = agent_id
        props["agent_id"] = agent_id
    episode = {k: v for k, v in doc.items() if not (isinstance(k, str) and k.startswith("_"))}
    try:
        text = json.dumps(episode, allow_nan=True)
    except (TypeError, ValueError):
        text = None
    if text is not None and len(text) <= embed_limit:
        body["episode"] = episode
    payload = json.dumps(body, allow_nan=True)
    return OutgoingMessage(message_id=message_id_of(episode_id), body=payload, properties=props)


def message_id_of(episode_id: str) -> str:
    """The scoring message id of an episode: its id, or the id's SHA-256 when longer than the
    128 characters Service Bus allows (Cosmos ids may have 255)."""
    return episode_id if len(episode_id) <= 128 else hashlib.sha256(episode_id.encode()).hexdigest()


def enqueue_episodes(docs: Iterable[Mapping[str, Any]], send: Callable[[list[OutgoingMessage]], int]) -> EnqueueResult:
    """Send one scoring message per changed episode document.

    ``send`` is the queue's batch send (``WorkQueue.send`` or a Service Bus sender). A
    document that cannot be turned into a message is reported in ``failed`` and does not
    stop the rest of the batch.
    """
    messages: list[OutgoingMessage] = []
    failed: list[tuple[int, str]] = []
    received = 0
    with span(SPAN_ENQUEUE) as sp:
        for i, doc in enumerate(docs):
            received += 1
            try:
                if not isinstance(doc, Mapping):
                    raise InvalidDocument(
                        "episode", [("(document)", f"must be a JSON object, got {type(doc).__name__}")]
                    )
                messages.append(score_request_message(doc))
            except InvalidDocument as exc:
                log.error("not enqueued: document %d of the batch: %s", i, exc)
                failed.append((i, str(exc)))
        sent = send(messages) if messages else 0
        count(EPISODES_ENQUEUED, sent)
        for key, value in {"received": received, "sent": sent, "failed": len(failed)}.items():
            sp.set_attribute(key, value)
    return EnqueueResult(received=received, sent=sent, duplicates=len(messages) - sent, failed=failed)


# --------------------------------------------------------------------------- score


@dataclass(frozen=True)
class ScoreOutcome:
    """What happened to one scoring message, and what the caller must do with it.

    ``scored``/``duplicate`` → complete; ``retry`` → abandon (redeliver later);
    ``dead_letter`` → dead-letter with ``reason`` and ``description``.
    """

    status: Literal["scored", "duplicate", "retry", "dead_letter"]
    episode_id: str | None
    reason: str = ""
    description: str = ""
    score: Score | None = None


@dataclass
class Scorer:
    """Everything the score handler needs. Policy versions are immutable, so cached."""

    store: Store
    judge: Judge
    reward: RewardFunction
    clock: Clock = SYSTEM_CLOCK

    def __post_init__(self) -> None:
        self._cached_version = lru_cache(maxsize=1024)(self._load_policy_version)

    def policy_version(self, agent_id: str, version: int) -> PolicyDocument | None:
        """The policy version an episode was drawn from, or ``None`` if there is no such version.

        The trainer publishes the current document before it writes the version record, so
        agents can log episodes under a version whose record does not exist yet (for as long
        as a crash in between leaves it unwritten). The current document is a copy of the
        latest version, so it stands in for that record. A missing version is not cached.
        """
        try:
            return self._cached_version(agent_id, version)
        except LookupError:
            return None

    def _load_policy_version(self, agent_id: str, version: int) -> PolicyDocument:
        raw = self.store.get_policy_version(agent_id, version)
        if raw is not None:
            return PolicyDocument.from_dict(raw)
        tagged = self.store.get_current_policy(agent_id)
        current = None if tagged is None else PolicyDocument.from_dict(tagged.doc)
        if current is None or current.version != version:
            raise LookupError(f"agent {agent_id!r} has no policy version {version}")
        return current.as_kind("version")


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
    return score_episode(request.episode_id, scorer, episode=request.episode, force=force)


def score_episode(
    episode_id: str,
    scorer: Scorer,
    *,
    episode: Mapping[str, Any] | None = None,
    check_existing: bool = True,
    force: bool = False,
) -> ScoreOutcome:
    """Score one episode (``episode`` is its document if the caller has it; else it is read).

    ``check_existing`` looks for a stored score first (a duplicate is not judged again);
    ``force`` judges and overwrites it (re-scoring). A score slot held by another episode's
    feedback correction (ids ``{episode_id}:r{k}`` written before corrections had ids of their
    own) is dead-lettered as ``ScoreIdTaken``, never taken for a duplicate or overwritten.

    Feedback that arrived before the score left a marker that the score's write replaces;
    the written score then says ``feedback_pending`` and the feedback is reconciled here.
    """
    with span(SPAN_SCORE, {"episode_id": episode_id}) as sp:
        outcome = _score_episode(episode_id, scorer, episode, check_existing, force)
        sp.set_attribute("outcome", outcome.status)
        if outcome.reason:
            sp.set_attribute("reason", outcome.reason)
        if outcome.score is not None:
            attrs = {"agent_id": outcome.score.agent_id}
            sp.set_attribute("agent_id", outcome.score.agent_id)
            count(EPISODES_SCORED, 1, attrs)
            record(REWARD, outcome.score.reward, attrs)
        return outcome


def _score_episode(
    episode_id: str, scorer: Scorer, episode: Mapping[str, Any] | None, check_existing: bool, force: bool
) -> ScoreOutcome:
    store = scorer.store
    if check_existing or force:
        existing = store.get_score(episode_id)
        if taken := _slot_taken(episode_id, existing):
            return taken
        if existing is not None and not force:
            if existing.get("feedback_pending"):  # a crash may have come between the score and its feedback
                reconcile(store, episode_id, clock=scorer.clock)
            return ScoreOutcome("duplicate", episode_id, "AlreadyScored")
    raw = dict(episode) if episode is not None else store.get_episode(episode_id)
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
        policy = scorer.policy_version(episode.agent_id, episode.policy_version)
    except InvalidDocument as exc:
        return ScoreOutcome("dead_letter", episode_id, "InvalidPolicy", str(exc))
    if policy is None:
        return ScoreOutcome(
            "dead_letter",
            episode_id,
            "UnknownPolicyVersion",
            f"invalid episode: policy_version: agent {episode.agent_id!r} has no version {episode.policy_version}",
        )
    if episode.action_id not in policy.action_ids:
        return ScoreOutcome(
            "dead_letter",
            episode_id,
            "UnknownAction",
            f"invalid episode: action_id: {episode.action_id!r} is not an action of "
            f"{policy.id} (known: {policy.action_ids})",
        )
    try:
        judgement = run_judge(scorer.judge, episode)
        reward, info = scorer.reward(judgement.metrics, episode)
    except TransientError as exc:
        return ScoreOutcome("retry", episode_id, "JudgeUnavailable", str(exc))
    except PermanentError as exc:
        return ScoreOutcome("dead_letter", episode_id, "JudgeFailed", str(exc))
    score = Score(
        id=episode.id,
        episode_id=episode.id,
        agent_id=episode.agent_id,
        action_id=episode.action_id,
        policy_version=episode.policy_version,
        probability=episode.probability,
        metrics=judgement.metrics,
        judge=judgement.judge,
        reward=reward,
        reward_function=info,
        scored_at=scorer.clock.now(),
    )
    try:
        stored = store.put_score(score) if force else store.add_score(score)
    except ConcurrencyConflict:
        return _slot_taken(episode_id, store.get_score(episode_id)) or ScoreOutcome(
            "duplicate", episode_id, "AlreadyScored"
        )
    record(QUEUE_LAG, max(0.0, (stored.scored_at - episode.ended_at).total_seconds()), {"agent_id": episode.agent_id})
    if stored.feedback_pending:
        reconcile(store, episode_id, clock=scorer.clock)
    return ScoreOutcome("scored", episode_id, score=stored)


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


def count_settled(
    outcome: ScoreOutcome, delivery_count: int, max_deliveries: int | None, *, explicit: bool = True
) -> None:
    """Count a message that is dead-lettered now: explicitly (``explicit``: the caller can
    dead-letter, as the embedded runner does), or by failing its last allowed delivery (as under
    Azure Functions, which cannot dead-letter a message itself)."""
    last = max_deliveries is not None and delivery_count >= max_deliveries
    if (outcome.status == "dead_letter" and (explicit or last)) or (outcome.status == "retry" and last):
        reason = outcome.reason if outcome.status == "dead_letter" else "MaxDeliveryCountExceeded"
        count(EPISODES_DEAD_LETTERED, 1, {"reason": reason})


def settle(queue: WorkQueue, message: Any, outcome: ScoreOutcome) -> None:
    """Apply a score outcome to a received queue message."""
    count_settled(outcome, getattr(message, "delivery_count", 1), getattr(queue, "max_deliveries", None))
    if outcome.status in ("scored", "duplicate"):
        queue.complete(message)
    elif outcome.status == "retry":
        queue.abandon(message)
    else:
        queue.dead_letter(message, outcome.reason, outcome.description)


# --------------------------------------------------------------------------- train


MAX_TRAIN_BATCH = 20_000
"""The most score rows one training run reads (``AGENT_LEARNING_TRAIN_MAX_BATCH``'s bound). A
run holds its whole batch in memory; measured at 11.3 KB per row (tracemalloc peak of
:func:`train_agent` on SQLite, rows with three judge metrics carrying 500-character reasons;
8.5 KB with the offline judge's), so a full batch stays within a 256 MB budget (about 225 MB).
A larger backlog is learned over several runs."""


@dataclass(frozen=True)
class TrainOutcome:
    """The result of :func:`train_agent`."""

    status: Literal[
        "published",
        "no_new_scores",
        "too_few_scores",
        "pinned",
        "lost_race",
        "no_policy",
        "invalid_policy",
        "unavailable",
        "failed",
    ]
    """``invalid_policy``: the current document does not validate (an operator must fix it);
    ``unavailable``: the store (or another dependency) failed transiently, the next tick retries;
    ``failed``: anything else went wrong (``reason`` names the exception)."""
    agent_id: str
    version: int | None = None
    run: TrainingRun | None = None
    reason: str = ""
    probabilities: list[float] | None = None
    """π of the published version (exploration floor included)."""


def train_agent(
    agent_id: str,
    store: Store,
    learner: Any,
    *,
    clock: Clock = SYSTEM_CLOCK,
    max_batch: int = 10_000,
    min_batch: int = 1,
    drift: Any = None,
) -> TrainOutcome:
    """Fold an agent's new scores into its policy and publish the next version.

    A run reads at most ``max_batch`` score rows after the cursor. While fewer than
    ``min_batch`` of them are new episodes it waits (``too_few_scores``), unless the page is
    full: then more rows wait behind it, and what was read is learned, so that feedback
    corrections never block the episodes behind them. An episode's corrections in one batch
    enter the update as one row, their net reward change (none if it nets to zero).

    ``learner`` is a :class:`~agent_learning.learner.Reinforce` (imported by the caller, so
    that importing this module does not import numpy). ``drift`` (a
    :class:`~agent_learning.drift.DriftConfig`) turns on the warnings of :mod:`agent_learning.drift`.
    """
    if not 1 <= max_batch <= MAX_TRAIN_BATCH:
        raise ValueError(f"max_batch: {max_batch} is not between 1 and {MAX_TRAIN_BATCH} (MAX_TRAIN_BATCH)")
    with span(SPAN_TRAIN, {"agent_id": agent_id}) as sp:
        outcome = _train_agent(agent_id, store, learner, clock, max_batch, min_batch)
        sp.set_attribute("status", outcome.status)
        count(TRAINING_RUNS, 1, {"agent_id": agent_id, "status": outcome.status})
        if outcome.status == "published" and outcome.run is not None and outcome.probabilities is not None:
            from .history import policy_entropy

            attrs = {"agent_id": agent_id}
            sp.set_attribute("version", outcome.version or 0)
            if outcome.run.episodes:
                record(MEAN_REWARD, outcome.run.metrics["mean_reward"], attrs)
            record(POLICY_ENTROPY, policy_entropy(outcome.probabilities), attrs)
            if drift is not None:
                from .drift import review

                review(store, agent_id, outcome.version or 0, outcome.probabilities, drift, sp)
        return outcome


def _train_agent(
    agent_id: str, store: Store, learner: Any, clock: Clock, max_batch: int, min_batch: int
) -> TrainOutcome:
    started = clock.now()
    tagged = store.get_current_policy(agent_id)
    if tagged is None:
        return TrainOutcome("no_policy", agent_id, reason="the agent has no current policy")
    try:
        current = PolicyDocument.from_dict(tagged.doc)
    except InvalidDocument as exc:
        log.error("not training %s: its current policy document is invalid: %s", agent_id, exc)
        return TrainOutcome("invalid_policy", agent_id, reason=str(exc))
    materialise(store, current)
    if current.pinned:
        reason = "learning is paused for this agent" + (f": {current.pin_reason}" if current.pin_reason else "")
        return TrainOutcome("pinned", agent_id, current.version, reason=reason)

    rows = store.read_scores(agent_id, current.cursor, max_batch)
    if not rows:
        return TrainOutcome("no_new_scores", agent_id, current.version)
    index = {a: i for i, a in enumerate(current.action_ids)}
    actions: list[int] = []
    rewards: list[float] = []
    probs: list[float] = []
    corrected: dict[str, tuple[int, float, float]] = {}  # episode id → (action, probability, net delta)
    correction_rows = 0
    rejected: list[Rejected] = []
    for row in rows:
        try:
            score = Score.from_dict(row)
            if score.agent_id != agent_id:
                raise InvalidDocument("score", [("agent_id", f"{score.agent_id!r} is not {agent_id!r}")])
            if score.action_id not in index:
                raise InvalidDocument("score", [("action_id", f"{score.action_id!r} is not an action of {agent_id!r}")])
        except InvalidDocument as exc:
            rejected.append(Rejected(id=str(row.get("id")), error=str(exc)[:4000]))
            continue
        if score.is_correction:
            correction_rows += 1
            _, _, net = corrected.get(score.episode_id, (0, 0.0, 0.0))
            corrected[score.episode_id] = (index[score.action_id], score.probability, net + (score.reward_delta or 0.0))
            continue
        actions.append(index[score.action_id])
        rewards.append(score.reward)
        probs.append(score.probability)
    if rejected:
        log.error(
            "training %s: %d invalid score documents skipped (first: %s)", agent_id, len(rejected), rejected[0].error
        )
    episodes = len(actions)
    if (episodes or correction_rows) and episodes < min_batch and not rejected and len(rows) < max_batch:
        # Feedback corrections alone wait for new episodes, to be learned together with them; but
        # only while nothing is queued behind them (a full page), or they would block the episodes.
        return TrainOutcome(
            "too_few_scores",
            agent_id,
            current.version,
            reason=f"{episodes} new scores and {correction_rows} feedback corrections; "
            f"training waits for {min_batch} new scores",
        )
    # One row per corrected episode, with the net change of its reward: the learner's step grows
    # with its rows, and feedback that nets to zero (a thumb toggled back) must change nothing.
    for action, probability, net in corrected.values():
        if abs(net) > TOLERANCE:
            actions.append(action)
            rewards.append(net)
            probs.append(probability)
    flags = [False] * episodes + [True] * (len(actions) - episodes)

    from .learner import Batch  # numpy only where training runs

    batch = Batch.from_arrays(actions, rewards, probs, len(index), flags)
    update = learner.update(current.logits, batch, current.temperature, state=current.learner_state)
    if update.metrics.get("state_reset"):
        log.warning(
            "training %s: the learner state of v%d was unusable; its evidence restarts", agent_id, current.version
        )
    logits = [float(x) for x in update.logits]
    new_version = current.version + 1
    cursor_to = ScoreCursor(seq=int(rows[-1]["seq"]), id=str(rows[-1]["id"]))
    run = TrainingRun(
        id=run_doc_id(agent_id, new_version),
        agent_id=agent_id,
        base_version=current.version,
        policy_version=new_version,
        cursor_from=current.cursor,
        cursor_to=cursor_to,
        episodes=episodes,
        corrections=correction_rows,
        rejected=len(rejected),
        rejected_samples=rejected[:20],
        metrics=update.metrics,
        learner={"name": getattr(learner, "name", type(learner).__name__), **learner.config.to_dict()},
        started_at=started,
        finished_at=clock.now(),
    )
    note = f"trained on {episodes} episodes"
    if correction_rows:
        note += f" and {correction_rows} feedback corrections"
    if rejected:
        note += f", skipped {len(rejected)} invalid"
    new_current = current.model_copy(
        update={
            "version": new_version,
            "logits": logits,
            "source": "train",
            "parent_version": current.version,
            "cursor": cursor_to,
            "run": run,
            "created_at": clock.now(),
            "note": note,
            "learner_state": update.state,
        }
    )
    new_current = PolicyDocument.from_dict(new_current.to_dict())  # re-validate the whole document
    try:
        store.replace_current_policy(new_current, tagged.etag)
    except ConcurrencyConflict as exc:
        return TrainOutcome("lost_race", agent_id, current.version, reason=str(exc))
    materialise(store, new_current)
    from .history import policy_probabilities

    return TrainOutcome("published", agent_id, new_version, run, probabilities=policy_probabilities(new_current))


def materialise(store: Store, current: PolicyDocument) -> None:
    """Make sure the version and run records of ``current`` exist (idempotent)."""
    store.create_policy_version(current.as_kind("version"))
    if current.run is not None and store.get_run(current.run.id) is None:
        store.put_run(current.run)


def train_all(
    store: Store,
    learner: Any,
    *,
    agent_ids: Iterable[str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    max_batch: int = 10_000,
    min_batch: int = 1,
    drift: Any = None,
) -> list[TrainOutcome]:
    """:func:`train_agent` for ``agent_ids`` (default: every agent with a policy); one agent's
    failure does not stop the rest. A transient failure (a store outage) is ``unavailable`` and
    logged as a warning, anything else ``failed`` and logged as an error with its traceback."""
    outcomes = []
    for agent_id in store.list_agents() if agent_ids is None else agent_ids:
        try:
            outcomes.append(
                train_agent(
                    agent_id, store, learner, clock=clock, max_batch=max_batch, min_batch=min_batch, drift=drift
                )
            )
        except TransientError as exc:
            log.warning("training %s: unavailable, the next run retries: %s", agent_id, exc)
            outcomes.append(TrainOutcome("unavailable", agent_id, reason=f"{type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.exception("training %s failed", agent_id)
            outcomes.append(TrainOutcome("failed", agent_id, reason=f"{type(exc).__name__}: {exc}"))
    return outcomes


# --------------------------------------------------------------------------- init


def create_policy(store: Store, policy_doc: PolicyDocument) -> PolicyDocument:
    """Publish the first version of an agent's policy; refuses to overwrite an existing one."""
    if policy_doc.version != 1 or policy_doc.source != "init":
        raise ValueError("a new policy starts at version 1 with source 'init'")
    current = policy_doc.as_kind("current")
    try:
        store.replace_current_policy(current, None)
    except ConcurrencyConflict:
        raise ConcurrencyConflict(
            f"agent {policy_doc.agent_id!r} already has a policy; it is never overwritten (roll back or pin it instead)"
        ) from None
    materialise(store, current)
    return current


def load_current(store: Store, agent_id: str) -> PolicyDocument | None:
    """The agent's current policy document, validated, or ``None``."""
    tagged = store.get_current_policy(agent_id)
    return None if tagged is None else PolicyDocument.from_dict(tagged.doc)

