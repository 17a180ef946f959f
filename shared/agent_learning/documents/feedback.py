""":class:`Feedback`, a user's verdict on one episode, and :class:`CorrectionLedger`, how far the
feedback corrections of an episode go."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents.base import Document
from agent_learning.documents.fields import (
    AgentId,
    Count,
    DocId,
    FeedbackSource,
    Finite,
    LedgerId,
    ShortText,
    _with_suffix,
)
from agent_learning.documents.score import RewardInfo


class Feedback(Document):
    """A user's verdict on one episode: thumbs up/down or a score in [0, 1].

    ``id`` is :func:`feedback_doc_id` of the episode and the source, so one source has one
    feedback per episode: posting again replaces it. Over HTTP the source is the caller's
    identity (:mod:`agent_learning.app.callers`), never a field of the request. ``value`` is the verdict on [0, 1]
    (thumbs up 1, thumbs down 0), which the reward rule blends with the judges' reward.
    """

    id: DocId
    type: Literal["feedback"] = "feedback"
    episode_id: DocId
    agent_id: AgentId
    source: FeedbackSource
    thumb: Literal["up", "down"] | None = None
    score: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)] | None = None
    value: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)]
    comment: ShortText = ""
    received_at: AwareDatetime

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "id" not in data and isinstance(data.get("episode_id"), str) and isinstance(data.get("source"), str):
                data["id"] = feedback_doc_id(data["episode_id"], data["source"])
            if "value" not in data:
                thumb, score = data.get("thumb"), data.get("score")
                if thumb in ("up", "down") and score is None:
                    data["value"] = 1.0 if thumb == "up" else 0.0
                elif thumb is None and isinstance(score, int | float) and not isinstance(score, bool):
                    data["value"] = float(score)
                else:
                    data["value"] = 0.0  # the problem is reported on thumb/score, not here
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Feedback:
        """As :meth:`Document.from_dict`; a problem of ``id`` or ``value`` derived from a bad
        ``episode_id``, ``source`` or ``score`` is left out: the field given is named once."""
        try:
            return super().from_dict(data)
        except InvalidDocument as exc:
            derived = {"id", "value"} - set(data) if isinstance(data, dict) else set()
            given = [(name, problem) for name, problem in exc.problems if name not in derived]
            if given and len(given) < len(exc.problems):
                raise InvalidDocument(exc.kind, given) from None
            raise

    @model_validator(mode="after")
    def _consistent(self) -> Feedback:
        if (self.thumb is None) == (self.score is None):
            raise ValueError("thumb: give exactly one of thumb ('up' or 'down') and score (0 to 1)")
        expected = self.score if self.score is not None else (1.0 if self.thumb == "up" else 0.0)
        if self.value != expected:
            raise ValueError(f"value: must be {expected} for this thumb/score")
        if self.id != feedback_doc_id(self.episode_id, self.source):
            raise ValueError(f"id: expected {feedback_doc_id(self.episode_id, self.source)!r}")
        return self


def feedback_doc_id(episode_id: str, source: str) -> str:
    """One feedback document per episode and source (hashed when too long for an id)."""
    doc_id = f"{episode_id}:fb:{source}"
    if len(doc_id) <= 200:
        return doc_id
    return "fb-" + hashlib.sha256(doc_id.encode()).hexdigest()


def correction_ledger_id(episode_id: str) -> str:
    """The id of an episode's :class:`CorrectionLedger`."""
    return _with_suffix(episode_id, "~ledger")


def feedback_sources_id(episode_id: str) -> str:
    """The id of the list of sources that gave feedback on an episode (where a store keeps one)."""
    return _with_suffix(episode_id, "~sources")


class LearnedBase(BaseModel):
    """The judges' score an episode was learned with, kept when a re-score replaced it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    reward: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-1, le=1)]
    reward_function: RewardInfo


class CorrectionLedger(Document):
    """How far an episode's feedback corrections go: applying feedback reads this, not every row.

    ``revision`` is the last correction it accounts for and ``delta_sum`` the sum of the
    ``reward_delta`` of corrections 1..``revision``, so the reward learned for the episode is
    its judges' reward plus ``delta_sum`` (plus the deltas of any correction after
    ``revision``: a crash between writing a correction and advancing the ledger leaves it
    behind, and readers read on from it). ``learned_base`` is set when an episode that a policy
    version had already learned from was re-scored: the judges' score it was learned with,
    which its feedback keeps being applied to (the re-score itself is not learned).
    Stored with the scores (the trainer never reads it); replaced with an ETag check.
    """

    id: LedgerId
    type: Literal["correction_ledger"] = "correction_ledger"
    episode_id: DocId
    agent_id: AgentId
    revision: Count = 0
    delta_sum: Finite = 0.0
    learned_base: LearnedBase | None = None
    updated_at: AwareDatetime

    @model_validator(mode="after")
    def _id_of_episode(self) -> CorrectionLedger:
        if self.id != correction_ledger_id(self.episode_id):
            raise ValueError(f"id: expected {correction_ledger_id(self.episode_id)!r}")
        return self
