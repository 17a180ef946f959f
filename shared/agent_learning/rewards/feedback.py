"""User feedback on episodes, merged into rewards exactly once.

Feedback (thumbs up/down or a 0–1 score) is stored as its own document, one per episode and
source (:func:`~agent_learning.documents.feedback_doc_id`), so posting the same feedback again
overwrites it. The reward rule (:func:`agent_learning.rewards.with_feedback`, rule
``judges-feedback/2``) blends the feedback into the judges' reward. Over HTTP the source is
the caller (:mod:`agent_learning.app.callers`), and one episode takes feedback from at most
:data:`MAX_FEEDBACK_SOURCES` sources.

Feedback never rewrites a score that the trainer may be reading. An episode's learned reward
is the sum over its score rows: the judges' score (revision 0) plus every feedback correction
(revision k ≥ 1, id ``{episode_id}~r{k}``, each with a new ``seq`` and ``reward_delta`` = the
new reward minus everything before it). :func:`reconcile` computes the reward the feedback
calls for, compares it with that sum, and writes the difference as the next correction, with
a create-only id: two reconcilers racing for the same correction cannot both write it (the
loser recomputes and finds nothing left to do), and the same feedback posted twice changes
nothing. The trainer learns from a correction's delta alone (no baseline is subtracted, see
:mod:`agent_learning.learning.reinforce`), so whether the judges' score was already learned from or is
learned in the same batch, the feedback moves the policy once.

The sum is not recomputed by reading every correction: the episode's
:class:`~agent_learning.documents.CorrectionLedger` holds the last revision and the sum of the
deltas up to it, and is advanced (compare-and-swap) after each correction. A crash between a
correction and the ledger's advance leaves the ledger behind; readers read on from it until a
revision is missing (one read more per such crash) and repair it. So applying feedback costs
a fixed number of reads and writes however often the episode's feedback changed.

Who reconciles: the feedback call itself when the episode is already scored; otherwise it
leaves a marker in the episode's score slot (``Store.mark_feedback_waiting``), and the scorer,
whose create then replaces the marker and comes back with ``feedback_pending``, reconciles right
after writing the score. Episodes without feedback cost nothing extra. If the feedback call
dies after storing the feedback and before either, :func:`sweep` (run at the start of every
training tick) finds the document in the store's feedback change feed and applies it.

An episode its agent's judging rule left unjudged (``AGENT_LEARNING_JUDGING``) is not scored
either: its feedback is stored and waits (the record says ``feedback_pending``), and is applied
when the episode is judged (``agent-learn rescore --unjudged``), as for any episode whose score
comes after its feedback. Feedback does not make an episode judged: users give feedback more
often on some outcomes than on others, so judging the episodes with feedback would make which
episodes are learned from depend on their outcome, and bias the learning.

Re-scoring (:func:`agent_learning.ops.recovery.rescore`) keeps this exact: an episode not learned
from yet is reconciled against its new judges' reward; for one a policy version has learned
from, :func:`keep_learned_base` first records the judges' score it was learned with in the
ledger, and its feedback keeps being applied to that score, so the re-score is never learned,
in whole or in part.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import (
    ConcurrencyConflict,
    InvalidDocument,
    LimitExceeded,
    NotFound,
    StoredDocumentInvalid,
    TransientError,
)
from agent_learning.core.telemetry import FEEDBACK_CORRECTIONS, FEEDBACK_RECEIVED, SPAN_FEEDBACK, count, span
from agent_learning.documents import (
    CorrectionLedger,
    Feedback,
    LearnedBase,
    RewardInfo,
    Score,
    agent_id_problem,
    correction_doc_id,
    correction_ledger_id,
    legacy_correction_doc_id,
)
from agent_learning.rewards import with_feedback
from agent_learning.store.base import RawDoc, Store

log = logging.getLogger(__name__)

TOLERANCE = 1e-9
"""Reward differences below this are rounding, not feedback."""

MAX_ATTEMPTS = 8

MAX_FEEDBACK_SOURCES = 16
"""How many sources may give feedback on one episode. The reward averages over sources, and
applying feedback reads every source's document, so this bounds both how far invented sources
could outvote real ones and what one post costs. A new source beyond it is refused; a source
that already gave feedback may always change it. The store checks and writes in one atomic
step (``Store.put_feedback``), so posts of new sources racing each other cannot pass it."""

SWEEP_CHECKPOINT = "feedback-sweep"
"""The durable checkpoint (``Store.get_checkpoint``) of :func:`sweep` in the feedback feed."""

SWEEP_MAX_ITEMS = 10_000
"""Feedback documents one :func:`sweep` reads at most; the rest waits for the next one, so a
burst of feedback cannot hold a training tick up."""


@dataclass(frozen=True)
class Reconciled:
    """What :func:`reconcile` did for one episode."""

    status: Literal["waiting", "unchanged", "corrected", "rejected"]
    episode_id: str
    reward: float | None = None
    delta: float = 0.0
    correction: Score | None = None
    problem: str | None = None
    """``rejected``: why the episode's score document is invalid (training skips the episode, so
    no feedback on it is learned)."""


@dataclass(frozen=True)
class FeedbackResult:
    """What :func:`record_feedback` stored and what it did to the episode's reward."""

    feedback: Feedback
    reconciled: Reconciled

    def to_dict(self) -> dict[str, Any]:
        """The answer of the HTTP route and ``agent-learn feedback --json``: ``reward`` and
        ``reward_delta`` are None while the feedback is not applied (``waiting``, ``rejected``):
        a change of 0 is ``unchanged``."""
        r = self.reconciled
        return {
            "feedback_id": self.feedback.id,
            "episode_id": self.feedback.episode_id,
            "source": self.feedback.source,
            "status": r.status,
            "reward": r.reward,
            "reward_delta": None if r.reward is None else r.delta,
            "correction_id": r.correction.id if r.correction else None,
            "problem": r.problem,
        }


def record_feedback(
    store: Store,
    episode_id: str,
    *,
    thumb: str | None = None,
    score: float | None = None,
    source: str = "user",
    comment: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> FeedbackResult:
    """Attach a user's feedback to an episode (the SDK call behind the HTTP function).

    Give ``thumb`` (``"up"``/``"down"``) or ``score`` (0 to 1). ``source`` says who gives it
    (the HTTP function passes the caller's identity; in-process callers are trusted to name
    it). Raises :class:`NotFound` for an unknown episode, :class:`InvalidDocument` (naming the
    field) for bad input, :class:`StoredDocumentInvalid` for a stored episode without a valid
    agent id (nothing is stored) and :class:`LimitExceeded` for a new source beyond
    :data:`MAX_FEEDBACK_SOURCES`. Idempotent: the same source posting the same verdict again
    changes nothing. Feedback on an episode whose score document is invalid is stored, with the
    status ``rejected`` and the problem: training skips that episode.
    """
    fields: dict[str, Any] = {
        "episode_id": episode_id,
        "agent_id": "unknown",  # the episode's, once the input is known to be valid
        "source": source,
        "comment": comment,
        "received_at": clock.now(),
    }
    if thumb is not None:
        fields["thumb"] = thumb
    if score is not None:
        fields["score"] = score
    Feedback.from_dict(fields)  # bad input is reported before anything is read
    with span(SPAN_FEEDBACK, {"episode_id": episode_id, "source": source}) as sp:
        raw = store.get_episode(episode_id)
        if raw is None:
            raise NotFound(f"episode_id: episode {episode_id!r} does not exist")
        agent_id = raw.get("agent_id")
        if problem := agent_id_problem(agent_id):  # written around the validation (by hand, or a foreign writer)
            raise StoredDocumentInvalid(f"episode {episode_id!r}", [("agent_id", problem)])
        feedback = Feedback.from_dict({**fields, "agent_id": agent_id})
        try:
            store.put_feedback(feedback, MAX_FEEDBACK_SOURCES)
        except LimitExceeded as exc:
            raise LimitExceeded(
                f"{exc}, the limit (MAX_FEEDBACK_SOURCES = {MAX_FEEDBACK_SOURCES}); "
                "a source that gave feedback may still change it"
            ) from None
        count(FEEDBACK_RECEIVED, 1, {"agent_id": agent_id, "kind": "thumb" if thumb is not None else "score"})
        try:
            result = apply(store, episode_id, agent_id, clock=clock)
        except InvalidDocument as exc:  # the stored score, not this feedback: it is kept all the same
            if exc.kind != "score":
                raise
            result = Reconciled("rejected", episode_id, problem=str(exc))
        sp.set_attribute("outcome", result.status)
        return FeedbackResult(feedback, result)


def apply(store: Store, episode_id: str, agent_id: str, *, clock: Clock = SYSTEM_CLOCK) -> Reconciled:
    """Make an episode's stored feedback count: reconcile now if the episode is scored, else
    leave the marker that has its scorer do it."""
    if store.mark_feedback_waiting(episode_id, agent_id):
        return Reconciled("waiting", episode_id)
    return reconcile(store, episode_id, agent_id, clock=clock)


@dataclass(frozen=True)
class Learned:
    """What an episode's score rows add up to: ``base_reward`` (judged with ``info``) plus
    ``delta_sum``, the deltas of corrections 1..``revision``."""

    base_reward: float
    info: RewardInfo
    revision: int
    delta_sum: float
    ledger: CorrectionLedger | None
    etag: str | None
    """The ledger as read (``None``: there is none, or it was unreadable) and its ETag."""

    @property
    def reward(self) -> float:
        return self.base_reward + self.delta_sum


def learned(store: Store, base: Score) -> Learned:
    """The reward learned for ``base``'s episode: its ledger, then any correction written after
    the ledger's revision (left behind by a crash; without a ledger, from the start, old ids too)."""
    episode_id, agent_id = base.episode_id, base.agent_id
    tagged = store.get_correction_ledger(episode_id, agent_id)
    ledger = None
    if tagged is not None:
        try:
            ledger = CorrectionLedger.from_dict(tagged.doc)
        except InvalidDocument as exc:
            log.error("the correction ledger of %s is rebuilt from its corrections: %s", episode_id, exc)
    revision = ledger.revision if ledger else 0
    delta_sum = ledger.delta_sum if ledger else 0.0
    while (row := _correction(store, episode_id, agent_id, revision + 1, legacy=ledger is None)) is not None:
        delta = row.get("reward_delta")
        delta_sum += float(delta) if isinstance(delta, int | float) and not isinstance(delta, bool) else 0.0
        revision += 1
    kept = ledger.learned_base if ledger else None
    return Learned(
        kept.reward if kept else base.reward,
        kept.reward_function if kept else base.reward_function,
        revision,
        delta_sum,
        ledger,
        tagged.etag if tagged is not None else None,
    )


def _correction(store: Store, episode_id: str, agent_id: str, revision: int, *, legacy: bool) -> RawDoc | None:
    """Correction ``revision`` of an episode, or ``None``. With ``legacy``, also under its old
    id (``{episode_id}:r{k}``), where a row only counts if it says it is that correction: an
    episode may have that id and its own score there."""
    row = store.get_score(correction_doc_id(episode_id, revision), agent_id)
    if row is None and legacy:
        row = store.get_score(legacy_correction_doc_id(episode_id, revision), agent_id)
        if row is not None and (row.get("episode_id") != episode_id or row.get("revision") != revision):
            return None
    return row


def called_for(store: Store, episode_id: str, info: RewardInfo) -> tuple[float, RewardInfo]:
    """The reward an episode's stored feedback calls for, given the judges' reward ``info``."""
    values = []
    for doc in store.list_feedback(episode_id):
        try:
            values.append(Feedback.from_dict(doc).value)
        except InvalidDocument as exc:
            log.error("feedback %s ignored: %s", doc.get("id"), exc)
    return with_feedback(info, values)


def unapplied(store: Store, base: Score) -> float:
    """How far the reward learned for ``base``'s episode is from what its feedback calls for
    (0.0 when the feedback is applied). Reads only; for audits."""
    state = learned(store, base)
    gap = called_for(store, base.episode_id, state.info)[0] - state.reward
    return 0.0 if abs(gap) <= TOLERANCE else gap


def reconcile(store: Store, episode_id: str, agent_id: str, *, clock: Clock = SYSTEM_CLOCK) -> Reconciled:
    """Bring ``agent_id``'s episode's learned reward in line with its feedback (idempotent, race-safe)."""
    for _ in range(MAX_ATTEMPTS):
        raw = store.get_score(episode_id, agent_id)
        if raw is None:
            return Reconciled("waiting", episode_id)
        base = Score.from_dict(raw)
        state = learned(store, base)
        target, info = called_for(store, episode_id, state.info)
        delta = target - state.reward
        if abs(delta) <= TOLERANCE:
            _advance(store, base, state, state.revision, state.delta_sum, clock)
            return Reconciled("unchanged", episode_id, target)
        revision, step = state.revision + 1, max(-2.0, min(2.0, delta))
        correction = base.model_copy(
            update={
                "id": correction_doc_id(episode_id, revision),
                "revision": revision,
                "reward": target,
                "reward_delta": step,
                "reward_function": info,
                "scored_at": clock.now(),
                "seq": None,
                "feedback_pending": False,
            }
        )
        correction = Score.from_dict(correction.to_dict())
        try:
            stored = store.add_score(correction)
        except ConcurrencyConflict:
            continue  # another reconciler wrote this correction: recompute against it
        _advance(store, base, state, revision, state.delta_sum + step, clock)
        count(FEEDBACK_CORRECTIONS, 1, {"agent_id": base.agent_id})
        return Reconciled("corrected", episode_id, target, delta, stored)
    raise TransientError(f"feedback of episode {episode_id!r} kept changing while it was being applied")


def _advance(store: Store, base: Score, state: Learned, revision: int, delta_sum: float, clock: Clock) -> None:
    """Move the ledger to ``revision``, unless it is there already. Losing the swap is fine:
    whoever won moved it, and a ledger that is behind only costs its readers a read more."""
    if state.ledger is not None and state.ledger.revision == revision:
        return
    kept = state.ledger.learned_base if state.ledger else None
    with contextlib.suppress(ConcurrencyConflict):
        store.put_correction_ledger(_ledger(base, revision, delta_sum, kept, clock), state.etag)


def _ledger(score: Score, revision: int, delta_sum: float, kept: LearnedBase | None, clock: Clock) -> CorrectionLedger:
    return CorrectionLedger(
        id=correction_ledger_id(score.episode_id),
        episode_id=score.episode_id,
        agent_id=score.agent_id,
        revision=revision,
        delta_sum=delta_sum,
        learned_base=kept,
        updated_at=clock.now(),
    )


def keep_learned_base(store: Store, score: Score, *, clock: Clock = SYSTEM_CLOCK) -> None:
    """Before a re-score replaces the judges' ``score`` of an episode that a policy version has
    learned from: keep it in the episode's ledger (unless an earlier re-score did), so that its
    feedback keeps being applied to the reward that was learned."""
    for _ in range(MAX_ATTEMPTS):
        state = learned(store, score)
        if state.ledger is not None and state.ledger.learned_base is not None:
            return
        kept = LearnedBase(reward=score.reward, reward_function=score.reward_function)
        try:
            store.put_correction_ledger(_ledger(score, state.revision, state.delta_sum, kept, clock), state.etag)
            return
        except ConcurrencyConflict:
            continue
    raise TransientError(f"the correction ledger of episode {score.episode_id!r} kept changing")


@dataclass
class SweepResult:
    """What one :func:`sweep` did."""

    read: int = 0
    """Feedback documents read from the feed."""
    outcomes: Counter[str] = field(default_factory=Counter)
    """Episodes by what :func:`apply` did (``invalid``: a document that could not be read)."""


def sweep(
    store: Store,
    *,
    clock: Clock = SYSTEM_CLOCK,
    checkpoint: str = SWEEP_CHECKPOINT,
    max_items: int = SWEEP_MAX_ITEMS,
    page_size: int = 500,
) -> SweepResult:
    """Apply feedback that was stored but perhaps never applied (its handler died in between).

    Reads the feedback written since the checkpoint from the store's feedback change feed and
    applies each episode's feedback once more: idempotent, so feedback its handler applied
    costs reads only, and an unscored episode gets the marker its scorer needs. The checkpoint
    moves after each page, so a crash repeats at most one page. Nothing new costs one feed read.
    """
    result = SweepResult()
    continuation = store.get_checkpoint(checkpoint)
    while result.read < max_items:
        page = store.read_feedback_changes(continuation, min(page_size, max_items - result.read))
        if not page.items:
            break
        episodes: dict[str, str] = {}
        for doc in page.items:
            try:
                feedback = Feedback.from_dict(doc)
            except InvalidDocument as exc:
                log.error("feedback sweep: document %s skipped: %s", doc.get("id"), exc)
                result.outcomes["invalid"] += 1
                continue
            episodes.setdefault(feedback.episode_id, feedback.agent_id)
        for episode_id, agent_id in episodes.items():
            try:
                status = apply(store, episode_id, agent_id, clock=clock).status
            except InvalidDocument as exc:  # e.g. a corrupt score: reported, and the rest goes on
                log.error("feedback sweep: the feedback of %s cannot be applied: %s", episode_id, exc)
                status = "invalid"
            result.outcomes[status] += 1
        result.read += len(page.items)
        continuation = page.continuation
        if continuation is not None:
            store.set_checkpoint(checkpoint, continuation)
    if result.read:
        log.info("feedback sweep: %d documents read, episodes: %s", result.read, dict(result.outcomes))
    return result


def score_rows(store: Store, episode_id: str, agent_id: str) -> list[dict[str, Any]]:
    """``agent_id``'s episode's score and its feedback corrections, oldest first (for inspection)."""
    rows = []
    revision = 0
    row = store.get_score(episode_id, agent_id)
    while row is not None:
        rows.append(row)
        revision += 1
        row = _correction(store, episode_id, agent_id, revision, legacy=True)
    return rows
