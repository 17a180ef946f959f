"""Recovery tools: replay dead-lettered scoring messages, and re-score episodes.

An operator (or the ``agent-learn`` CLI) runs these after the cause of a failure is fixed.
Neither can make an episode count twice in learning:

* :func:`replay_dead_letters` sends dead-lettered messages back to the scoring queue. The
  scorer is idempotent: an episode that has a score by now (a copy of its message got through)
  keeps that score, one that does not is judged and scored once, and a message whose cause is
  not fixed goes back to the dead-letter queue with its reason.
* :func:`rescore` overwrites the scores of a range of an agent's episodes, e.g. after the
  reward weights or the judge changed. A score keeps its ``seq`` when it is overwritten, and
  the trainer's cursor moves along ``(seq, id)``:

  - an episode that a published policy version has already learned from is **not learned
    from again**: its new score is recorded (with its new reward-function version) for
    inspection and reporting, and the policy keeps the update it made with the old reward;
  - an episode scored but not trained yet is learned from **once, with the new reward**;
  - an episode behind the cursor that no run learned from (*lost* in :mod:`agent_learning.ops.audit`:
    a late write on Cosmos DB) is listed as lost: its new score is recorded but not learned
    either, as no run reads behind the cursor.

  Nothing learns from an already-learned episode again (re-feeding it on top of the update
  it made would count it twice): not a rollback either, which publishes an earlier version's
  logits but keeps the training cursor, so a rollback to a version before such episodes undoes
  their updates without learning their new scores. New rewards shape what is learned from the
  episodes after the cursor.

  Feedback stays exact across a re-score (see :mod:`agent_learning.rewards.feedback`): a pending
  episode's feedback is reconciled against its new judges' reward right after, so that what is
  learned is what the reward rule gives for the new score and the feedback (a correction makes
  up the difference). An already-learned episode gets no correction: before its score is
  overwritten, the score it was learned with is kept in its correction ledger, and its feedback,
  now and later, is applied to that score, so the re-score is not learned, in whole or in part.
  Feedback correction rows are not episodes and are not re-scored.

Episodes that never got a score (dead-lettered) are not re-scored by :func:`rescore`: replay
their messages.

* :func:`migrate_scores` copies a Cosmos DB deployment's old scores container into the new one
  with every agent it copies for paused (pinned) until the whole copy is there, so that a trainer
  running beside it cannot learn part of an agent's scores and move its cursor past the rest.

* :func:`judge_unjudged` judges the episodes of an agent that the scorer recorded unjudged
  (``AGENT_LEARNING_JUDGING`` left them out), e.g. at a quiet hour when the judge model has
  quota to spare. Each judges' score replaces the episode's record and gets a new ``seq``, so
  the episode is learned once, by the next training run (its logged probability corrects for
  the policy version it was drawn under, as for any episode). Episodes are taken in episode-id
  order: with random ids, a ``limit`` judges a uniform random part of the backlog, so judging
  only part of it keeps the learning unbiased. Idempotent: an episode judged meanwhile is a
  duplicate, and one that fails keeps its record (one that cannot be judged, such as an
  episode expired by TTL, is tried again by every run, and does not count against the limit, so
  a limited run still reaches the episodes after it). Feedback that waited for the episode's
  score is applied when the score is written.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agent_learning.core.errors import ConfigurationError, InvalidDocument, NotFound
from agent_learning.documents import Episode, Score, ScoreCursor
from agent_learning.judges.base import Judge, Judgement
from agent_learning.ops.audit import audit_agent
from agent_learning.pipeline import Scorer, load_current, score_episode, set_pinned
from agent_learning.queue.base import WorkQueue
from agent_learning.rewards.feedback import keep_learned_base, reconcile
from agent_learning.store.base import RawDoc, Store

log = logging.getLogger(__name__)

T = TypeVar("T")

REPLAY_LIMIT = 10_000
"""How many dead letters, oldest first, :func:`replay_dead_letters` reads to choose from by default."""

# --------------------------------------------------------------------------- dead letters


@dataclass(frozen=True)
class ReplayResult:
    """What :func:`replay_dead_letters` did (or, with ``dry_run``, would do)."""

    replayed: list[str]
    """Message ids sent back to the queue."""
    left: Counter[str] = field(default_factory=Counter)
    """Dead letters left where they are, by reason."""
    more: bool = False
    """The ``limit`` dead letters read may not be all: any after them were not considered (run it
    again once these are replayed, or with a larger ``limit``)."""
    moved: int | None = None
    """How many dead letters the queue moved back (``None`` on a dry run): more than ``replayed``
    when copies share an id, fewer when another replay moved some first."""


def replay_dead_letters(
    queue: WorkQueue,
    *,
    reasons: Iterable[str] | None = None,
    message_ids: Iterable[str] | None = None,
    limit: int = REPLAY_LIMIT,
    dry_run: bool = False,
) -> ReplayResult:
    """Send dead-lettered messages back to the queue, with their delivery count reset.

    ``reasons`` selects dead letters by dead-letter reason (e.g. ``"JudgeFailed"`` after a judge
    fix, on the embedded queue; under Azure Functions every message that failed its deliveries is
    ``"MaxDeliveryCountExceeded"``, whatever the cause), ``message_ids`` by message id
    (the episode id); both given, a dead letter must match both. Neither given, every dead
    letter (up to ``limit``) is replayed. Only the oldest ``limit`` dead letters are read: ``more``
    in the result says there may be others. ``dry_run`` only reports what would be replayed.
    Queues replay by message id, so a dead letter that shares its id with a chosen one (another
    copy of the same message) goes back with it.
    """
    if isinstance(reasons, str) or isinstance(message_ids, str):
        raise TypeError("reasons and message_ids take an iterable of strings, not a single string")
    wanted_reasons = None if reasons is None else set(reasons)
    wanted_ids = None if message_ids is None else set(message_ids)
    chosen: list[str] = []
    left: Counter[str] = Counter()
    letters = queue.dead_letters(limit)
    for letter in letters:
        if (wanted_reasons is None or letter.reason in wanted_reasons) and (
            wanted_ids is None or letter.message_id in wanted_ids
        ):
            chosen.append(letter.message_id)
        else:
            left[letter.reason] += 1
    ids = list(dict.fromkeys(chosen))
    moved = None if dry_run else queue.replay_dead_letters(ids) if ids else 0
    return ReplayResult(ids, left, more=len(letters) >= limit, moved=moved)


# --------------------------------------------------------------------------- re-scoring


@dataclass
class RescoreResult:
    """What :func:`rescore` did. Ids are episode ids."""

    already_trained: list[str] = field(default_factory=list)
    """Re-scored; a published version had learned from them: not learned from again."""
    lost: list[str] = field(default_factory=list)
    """Re-scored; behind the training cursor, but no run learned their earlier score (``lost`` in
    :mod:`agent_learning.ops.audit`): the new score is not learned either."""
    pending: list[str] = field(default_factory=list)
    """Re-scored before any training run read them: learned from once, with the new score."""
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    """``(episode id, reason, description)``: not re-scored; the old score stays."""

    @property
    def rescored(self) -> int:
        return len(self.already_trained) + len(self.lost) + len(self.pending)


class _StoredJudgement(Judge):
    """The judgement a score already holds: re-shaping a reward needs no judge call."""

    def __init__(self, score: Score) -> None:
        self._judgement = Judgement(dict(score.metrics), score.judge)

    def judge(self, episode: Episode) -> Judgement:
        return self._judgement


def rescore(
    store: Store,
    scorer: Scorer,
    agent_id: str,
    *,
    after: ScoreCursor | None = None,
    until: ScoreCursor | None = None,
    episode_ids: Iterable[str] | None = None,
    rejudge: bool = False,
    page_size: int = 500,
    progress: Callable[[int], None] | None = None,
) -> RescoreResult:
    """Re-score an agent's scored episodes with ``scorer``'s reward function (and judge).

    The range is the agent's scores after ``after`` up to and including ``until``, in the
    trainer's ``(seq, id)`` order (both ``None``: all of them; on Cosmos DB only scores older
    than the settle window are visible), or exactly ``episode_ids``. Without ``rejudge`` the
    stored judge metrics are kept and only the reward is shaped again (no judge call: the way
    to apply new reward weights); with it, ``scorer.judge`` judges every episode again.

    Each score is overwritten in place and keeps its ``seq``; see the module docstring for what
    that means for learning. Before each episode not trained yet the cursor is read again, so a
    trainer publishing meanwhile is seen; only an episode a trainer reads while it is being
    re-scored is learned with its old score and listed in ``pending``. An episode that fails
    (expired, invalid, the judge unavailable) keeps its old score and is listed in ``failed``.
    ``progress`` is told how many episodes were done, after each.
    """
    if isinstance(episode_ids, str):
        raise TypeError("episode_ids takes an iterable of ids, not a single string")
    trained_to = _trained_to(store, agent_id)
    result = RescoreResult()
    lost: set[str] | None = None  # read from the books before the first score behind the cursor changes
    if episode_ids is not None:
        rows = _rows_by_id(store, agent_id, episode_ids)
    else:
        rows = _rows_in_range(store, agent_id, after, until, page_size)
    for episode_id, row in _counted(rows, progress):
        if row is None:
            result.failed.append((episode_id, "NotScored", _not_scored(store, agent_id, episode_id, episode_ids)))
            continue
        try:
            old = Score.from_dict(row)
        except InvalidDocument as exc:
            result.failed.append((episode_id, "InvalidScore", str(exc)))
            continue
        if old.is_correction:
            if episode_ids is not None:
                result.failed.append((episode_id, "NotAnEpisode",
                                      f"{episode_id!r} is feedback correction {old.revision} of {old.episode_id!r}"))
            continue
        trained = trained_to is not None and not trained_to < old.cursor
        if not trained:  # a trainer may have passed it since the range was read: look again
            trained_to = _trained_to(store, agent_id)
            trained = trained_to is not None and not trained_to < old.cursor
        if trained:
            if lost is None:
                lost = set()
                audit_agent(store, agent_id, with_feedback=set(), lost=lost)
            keep_learned_base(store, old, clock=scorer.clock)
        judge = scorer.judge if rejudge else _StoredJudgement(old)
        outcome = score_episode(episode_id, replace(scorer, judge=judge), force=True)
        if outcome.status != "scored":
            result.failed.append((episode_id, outcome.reason, outcome.description))
        elif trained:
            (result.lost if episode_id in (lost or ()) else result.already_trained).append(episode_id)
        else:
            reconcile(store, episode_id, agent_id, clock=scorer.clock)
            result.pending.append(episode_id)
    return result


def _trained_to(store: Store, agent_id: str) -> ScoreCursor | None:
    """The cursor up to which the agent's published versions have learned (``None``: nothing yet)."""
    current = load_current(store, agent_id)
    return None if current is None else current.cursor


def _counted(items: Iterable[T], progress: Callable[[int], None] | None) -> Iterator[T]:
    """``items``; after each is dealt with (when the next is asked for), ``progress`` is told how
    many were."""
    for done, item in enumerate(items, 1):
        yield item
        if progress is not None:
            progress(done)


@dataclass
class JudgeUnjudgedResult:
    """What :func:`judge_unjudged` did. Ids are episode ids."""

    judged: list[str] = field(default_factory=list)
    """Judged now: learned once, by the next training run."""
    duplicates: list[str] = field(default_factory=list)
    """Judged by someone else meanwhile: nothing to do."""
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    """``(episode id, reason, description)``: not judged; the record stays. Apart from the one a
    ``stopped`` run ends with, these cannot be judged as they stand (e.g. ``EpisodeNotFound``:
    expired by TTL) and every run meets them again."""
    stopped: str | None = None
    """Why the run stopped before its limit (the judge was unavailable), if it did."""
    more: bool = False
    """Records remain after the last one read (beyond ``limit``, or after a stop)."""


def judge_unjudged(
    store: Store,
    scorer: Scorer,
    agent_id: str,
    *,
    limit: int | None = None,
    page_size: int = 100,
    progress: Callable[[int], None] | None = None,
) -> JudgeUnjudgedResult:
    """Judge up to ``limit`` (``None``: all) of the episodes ``agent_id``'s judging rule left
    unjudged, whatever the rule says now; see the module docstring. A transient judge failure
    (throttling, an outage) stops the run, so that a throttled judge is not pressed further:
    run it again later. An episode that cannot be judged as it stands (expired, invalid, a
    permanent judge failure) keeps its record and is listed in ``failed``, and is not counted
    against ``limit``: every run tries it again, and goes on to the episodes after it, so a
    limited run always reaches the rest of the backlog. ``progress`` is told how many were
    judged (or found judged meanwhile), after each."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit: {limit} must be at least 1")
    result = JudgeUnjudgedResult()
    after: str | None = None
    done = 0  # judged, or judged meanwhile: what counts against the limit
    while limit is None or done < limit:
        want = page_size if limit is None else min(page_size, limit - done)
        page = store.list_unjudged(agent_id, after, want)
        for row in page:
            episode_id = str(row["id"])
            after = episode_id
            outcome = score_episode(episode_id, scorer, sample=False)
            if outcome.status == "scored":
                result.judged.append(episode_id)
            elif outcome.status in ("duplicate", "unjudged"):
                result.duplicates.append(episode_id)
            else:
                result.failed.append((episode_id, outcome.reason, outcome.description))
                if outcome.status == "retry":
                    result.stopped = f"the judge is unavailable ({outcome.description}); run again later"
                    result.more = True
                    return result
                continue
            done += 1
            if progress is not None:
                progress(done)
        if len(page) < want:
            return result
    result.more = bool(store.list_unjudged(agent_id, after, 1))
    return result


def _rows_in_range(
    store: Store, agent_id: str, after: ScoreCursor | None, until: ScoreCursor | None, page_size: int
) -> Iterator[tuple[str, RawDoc | None]]:
    cursor = after
    while True:
        page = store.read_scores(agent_id, cursor, page_size)
        for row in page:
            position = ScoreCursor.of_row(row)
            if until is not None and until < position:
                return
            yield position.id, row
            cursor = position
        if len(page) < page_size:
            return


def _not_scored(store: Store, agent_id: str, episode_id: str, named: Iterable[str] | None) -> str:
    """Why ``episode_id`` has no score of ``agent_id`` to re-score; for an id the caller
    ``named``, whether the episode exists, is another agent's or was recorded unjudged."""
    problem = f"{episode_id!r} has no score of agent {agent_id!r}"
    if named is None:
        return problem
    episode = store.get_episode(episode_id)
    if episode is None:
        return f"{episode_id!r}: no episode has this id"
    if episode.get("agent_id") != agent_id:
        return f"{problem}: it is an episode of {episode.get('agent_id')!r}"
    if store.get_unjudged(episode_id, agent_id) is not None:
        return f"{problem} (it was recorded unjudged: agent-learn rescore --unjudged judges it)"
    return f"{problem} yet (agent-learn episodes show {episode_id} says why)"


def _rows_by_id(store: Store, agent_id: str, episode_ids: Iterable[str]) -> Iterator[tuple[str, RawDoc | None]]:
    for episode_id in dict.fromkeys(episode_ids):
        yield episode_id, store.get_score(episode_id, agent_id)


# --------------------------------------------------------------------------- migrating scores

COPY_PIN_REASON = "agent-learn store migrate-scores is copying this agent's scores (run it again if it stopped)"
"""The pin reason of an agent whose scores :func:`migrate_scores` copies; a later migration knows
the pin for its own and lifts it when its copy is whole."""


def migrate_scores(store: Any, **options: Any) -> Any:
    """Copy the old ``scores`` container of a Cosmos DB deployment into ``agent-scores``
    (the store's ``copy_legacy_scores``, :func:`agent_learning.store.cosmos.copy_legacy_scores`, with
    ``options``; returns its
    ``ScoreCopy``), losing nothing to a trainer running beside it.

    A copy lands in an agent's feed in ``(seq, id)`` order only once it is whole: a trainer that read
    part of it would move the agent's cursor past scores still to come, and no run reads behind the
    cursor. So each agent is pinned before the first of its documents is copied (a run that read the
    policy before the pin loses its compare-and-swap and publishes nothing), and every agent pinned so
    is unpinned after the whole copy, its pins of an interrupted migration too. A copy that fails
    leaves them pinned: running it again finishes the copy and unpins them. An agent an operator had
    pinned stays pinned; one without a policy (no trainer) or with an invalid one (which no trainer
    trains until it is repaired) is copied as it is.
    """
    copy_legacy_scores = getattr(store, "copy_legacy_scores", None)
    if copy_legacy_scores is None:
        raise ConfigurationError("AGENT_LEARNING_STORE: migrate-scores copies between Cosmos DB containers: "
                                 f"a {type(store).__name__} has one place for scores")

    def pause(agent_id: str) -> None:
        try:
            set_pinned(store, agent_id, True, COPY_PIN_REASON)
        except (NotFound, InvalidDocument) as exc:
            log.warning("migrate-scores: %s is not paused (%s): no trainer trains it", agent_id, exc)

    result = copy_legacy_scores(**options, before_agent=pause)
    for agent in store.training_cursors():
        if agent.pinned and agent.pin_reason == COPY_PIN_REASON:
            set_pinned(store, agent.agent_id, False)
            result.paused.append(agent.agent_id)
    return result
