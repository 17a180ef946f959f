"""User feedback on episodes, merged into rewards exactly once.

Feedback (thumbs up/down or a 0–1 score) is stored as its own document, one per episode and
source (:func:`~agent_learning.documents.feedback_doc_id`), so posting the same feedback again
overwrites it. The reward rule (:func:`agent_learning.rewards.with_feedback`, rule
``judges-feedback/2``) blends the feedback into the judges' reward.

Feedback never rewrites a score that the trainer may be reading. An episode's learned reward
is the sum over its score rows: the judges' score (revision 0) plus every feedback correction
(revision k ≥ 1, id ``{episode_id}:r{k}``, each with a new ``seq`` and ``reward_delta`` = the
new reward minus everything before it). :func:`reconcile` computes the reward the feedback
calls for, compares it with that sum, and writes the difference as the next correction, with
a create-only id: two reconcilers racing for the same correction cannot both write it (the
loser recomputes and finds nothing left to do), and the same feedback posted twice changes
nothing. The trainer learns from a correction's delta alone (no baseline is subtracted, see
:mod:`agent_learning.learner`), so whether the judges' score was already learned from or is
learned in the same batch, the feedback moves the policy once.

Who reconciles: the feedback call itself when the episode is already scored; otherwise it
leaves a marker in the episode's score slot (``Store.mark_feedback_waiting``), and the scorer,
whose create then replaces the marker and comes back with ``feedback_pending``, reconciles right
after writing the score. Episodes without feedback cost nothing extra.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from .clock import SYSTEM_CLOCK, Clock
from .documents import Feedback, Score, correction_doc_id
from .errors import ConcurrencyConflict, InvalidDocument, NotFound, TransientError
from .rewards import with_feedback
from .store.base import Store
from .telemetry import FEEDBACK_CORRECTIONS, FEEDBACK_RECEIVED, SPAN_FEEDBACK, count, span

log = logging.getLogger(__name__)

TOLERANCE = 1e-9
"""Reward differences below this are rounding, not feedback."""

MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class Reconciled:
    """What :func:`reconcile` did for one episode."""

    status: Literal["waiting", "unchanged", "corrected"]
    episode_id: str
    reward: float | None = None
    delta: float = 0.0
    correction: Score | None = None


@dataclass(frozen=True)
class FeedbackResult:
    """What :func:`record_feedback` stored and what it did to the episode's reward."""

    feedback: Feedback
    reconciled: Reconciled

    def to_dict(self) -> dict[str, Any]:
        r = self.reconciled
        return {
            "feedback_id": self.feedback.id,
            "episode_id": self.feedback.episode_id,
            "status": r.status,
            "reward": r.reward,
            "reward_delta": r.delta,
            "correction_id": r.correction.id if r.correction else None,
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

    Give ``thumb`` (``"up"``/``"down"``) or ``score`` (0 to 1). Raises :class:`NotFound` for
    an unknown episode and :class:`InvalidDocument` (naming the field) for bad input.
    Idempotent: the same source posting the same verdict again changes nothing.
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
        if not isinstance(agent_id, str):
            raise InvalidDocument("episode", [("agent_id", "the stored episode has no agent id")])
        feedback = Feedback.from_dict({**fields, "agent_id": agent_id})
        store.put_feedback(feedback)
        count(FEEDBACK_RECEIVED, 1, {"agent_id": agent_id, "kind": "thumb" if thumb is not None else "score"})
        if store.mark_feedback_waiting(episode_id, agent_id):
            result = Reconciled("waiting", episode_id)
        else:
            result = reconcile(store, episode_id, clock=clock)
        sp.set_attribute("outcome", result.status)
        return FeedbackResult(feedback, result)


def reconcile(store: Store, episode_id: str, *, clock: Clock = SYSTEM_CLOCK) -> Reconciled:
    """Bring an episode's learned reward in line with its feedback (idempotent, race-safe)."""
    for _ in range(MAX_ATTEMPTS):
        raw = store.get_score(episode_id)
        if raw is None:
            return Reconciled("waiting", episode_id)
        base = Score.from_dict(raw)
        learned, revision = base.reward, 0
        while (row := store.get_score(correction_doc_id(episode_id, revision + 1))) is not None:
            learned += float(row.get("reward_delta") or 0.0)
            revision += 1
        values = []
        for doc in store.list_feedback(episode_id):
            try:
                values.append(Feedback.from_dict(doc).value)
            except InvalidDocument as exc:
                log.error("feedback %s ignored: %s", doc.get("id"), exc)
        target, info = with_feedback(base.reward_function, values)
        delta = target - learned
        if abs(delta) <= TOLERANCE:
            return Reconciled("unchanged", episode_id, target)
        correction = base.model_copy(
            update={
                "id": correction_doc_id(episode_id, revision + 1),
                "revision": revision + 1,
                "reward": target,
                "reward_delta": max(-2.0, min(2.0, delta)),
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
        count(FEEDBACK_CORRECTIONS, 1, {"agent_id": base.agent_id})
        return Reconciled("corrected", episode_id, target, delta, stored)
    raise TransientError(f"feedback of episode {episode_id!r} kept changing while it was being applied")


def score_rows(store: Store, episode_id: str) -> list[dict[str, Any]]:
    """An episode's score and its feedback corrections, oldest first (for inspection)."""
    rows = []
    revision = 0
    while (row := store.get_score(correction_doc_id(episode_id, revision))) is not None:
        rows.append(row)
        revision += 1
    return rows
