""":class:`Score`, the judged and shaped outcome of an episode or a feedback correction of it, with
its parts and the correction ids, and :class:`UnjudgedRecord`, an episode left unjudged in its score slot."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_learning.documents.actions import MAX_CANDIDATES, Candidate
from agent_learning.documents.base import Document
from agent_learning.documents.context import shared_context
from agent_learning.documents.cursor import ScoreCursor
from agent_learning.documents.fields import (
    ActionId,
    AgentId,
    Count,
    DocId,
    Finite,
    Incarnation,
    Name,
    NonNegative,
    Probability,
    ScoreId,
    StepText,
    Version,
    _unset,
    _with_suffix,
)


class MetricScore(BaseModel):
    """One judge metric: the evaluator's raw value and its normalisation to [0, 1]."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    raw: Finite
    normalised: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)]
    result: Literal["pass", "fail", "not_applicable"] | None = None
    threshold: Finite | None = None
    reason: StepText = ""
    evaluator: Name
    evaluator_version: Name
    prompt_tokens: Count | None = Field(None, exclude_if=_unset)
    """Tokens the evaluator sent to the judge model (as the evaluator reports them)."""
    completion_tokens: Count | None = Field(None, exclude_if=_unset)


class JudgeInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    model: Name


class RewardInfo(BaseModel):
    """Which reward function produced a reward, and with which settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    version: Name
    weights: dict[str, NonNegative]
    penalties: dict[str, Finite]
    components: dict[str, Finite]


class Measures(BaseModel):
    """What an episode cost and how its tools fared, copied by the scorer next to its reward so
    that guardrail metrics are estimated from the same rows (:mod:`agent_learning.evaluation`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    latency_ms: NonNegative
    tool_calls: Count
    tool_failures: Count
    """Tool steps that failed."""
    tokens: Count | None = None
    """The agent's model tokens (prompt + completion); None when it did not record them."""
    judge_tokens: Count | None = None
    """Tokens the judges spent on the episode (prompt + completion), when they report them."""


class Score(Document):
    """The judged and shaped outcome of one episode, or a feedback correction of it.

    ``revision`` 0 is the judges' score: its ``id`` equals the episode id. ``revision`` k ≥ 1
    is the k-th feedback correction (id ``{episode_id}~r{k}``, or ``{episode_id}:r{k}`` when it
    was written before that form existed): ``reward`` is the episode's
    reward after that feedback and ``reward_delta`` what it adds to everything learned
    before, which is what the trainer learns from it.

    ``seq`` is assigned by the store on first write and kept on every overwrite, so the
    training cursor ``(seq, id)`` never sees a re-scored episode twice. ``feedback_pending``
    says that feedback arrived before the judges' score, so the scorer reconciled it.
    ``late_write`` says the store saw the write complete later than ``seq`` plus its settle
    window allows (Cosmos DB), so a trainer may have passed it (see :mod:`agent_learning.store.cosmos`).
    """

    id: ScoreId
    type: Literal["score"] = "score"
    episode_id: DocId
    agent_id: AgentId
    action_id: ActionId
    policy_version: Version
    probability: Probability
    metrics: dict[Name, MetricScore]
    judge: JudgeInfo
    reward: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-1, le=1)]
    reward_function: RewardInfo
    scored_at: AwareDatetime
    seq: Count | None = None
    revision: Count = 0
    reward_delta: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2, le=2)] | None = None
    feedback_pending: bool = False
    late_write: bool = False
    context: dict[str, Any] | None = Field(None, exclude_if=_unset)
    """The episode's context, copied by the scorer so that the trainer reads it with the reward
    (:func:`~agent_learning.documents.context.shared_context`: scores of equal contexts share one
    dict, not to be changed)."""
    measures: Measures | None = Field(None, exclude_if=_unset)
    """Latency, tool outcomes and tokens of the episode (judges' scores written by this version)."""
    candidates: Annotated[list[Candidate], Field(min_length=1, max_length=MAX_CANDIDATES)] | None = Field(
        None, exclude_if=_unset
    )
    """The actions the request offered (``choose(actions=...)``), with their features: ``probability``
    is the action's among these; absent when the policy chose among its own actions."""
    incarnation: Incarnation | None = Field(None, exclude_if=_unset)
    """The episode's incarnation: training refuses a score of another one than its policy's."""

    @field_validator("context")
    @classmethod
    def _context(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else shared_context(value) or None  # {} is no context

    @model_validator(mode="after")
    def _id_is_episode(self) -> Score:
        expected = correction_doc_id(self.episode_id, self.revision)
        legacy = self.revision > 0 and self.id == legacy_correction_doc_id(self.episode_id, self.revision)
        if self.id != expected and not legacy:
            what = "episode_id" if self.revision == 0 else f"the id of correction {self.revision}"
            raise ValueError(f"id: must equal {what} {expected!r}")
        if self.candidates is not None and self.action_id not in {c.id for c in self.candidates}:
            raise ValueError(f"candidates: the action chosen, {self.action_id!r}, is not among them")
        if (self.reward_delta is None) != (self.revision == 0):
            raise ValueError("reward_delta: a correction (revision >= 1) needs one; a judges' score has none")
        return self

    @property
    def is_correction(self) -> bool:
        return self.revision > 0

    @property
    def cursor(self) -> ScoreCursor:
        if self.seq is None:
            raise ValueError("score has no seq yet; it is assigned when the store writes it")
        return ScoreCursor(seq=self.seq, id=self.id)


def correction_doc_id(episode_id: str, revision: int) -> str:
    """The id of an episode's score (``revision`` 0) or of its k-th feedback correction
    (``{episode_id}~r{k}``: ``~`` is not allowed in episode ids, so the two never meet).

    Ids stay within :data:`MAX_ID_CHARS`: a long episode id is replaced by its hash in
    correction ids.
    """
    return episode_id if revision == 0 else _with_suffix(episode_id, f"~r{revision}")


def legacy_correction_doc_id(episode_id: str, revision: int) -> str:
    """The id correction ``revision`` got before correction ids had their own form
    (``{episode_id}:r{k}``, which is also a valid episode id). Read, never written."""
    return _with_suffix(episode_id, f":r{revision}")


class UnjudgedRecord(Document):
    """An episode the scorer did not judge (``AGENT_LEARNING_JUDGING``), recorded in its score slot.

    It has no ``seq``, so the trainer never reads it, and it is never returned as a score. The
    judges' score a later judging writes (``agent-learn rescore --unjudged``) replaces it and gets
    a new ``seq``, so it is learned then. ``reason`` is ``sampled_out`` (the agent's fraction left
    it out) or ``over_rate`` (its ``N/min`` was used up); ``rule`` is the entry that applied.
    ``feedback_pending`` says feedback waits for the episode's score (the store reports it).
    """

    id: DocId
    type: Literal["unjudged"] = "unjudged"
    episode_id: DocId
    agent_id: AgentId
    action_id: ActionId
    policy_version: Version
    reason: Literal["sampled_out", "over_rate"]
    rule: Name
    recorded_at: AwareDatetime
    feedback_pending: bool = False

    @model_validator(mode="after")
    def _id_is_episode(self) -> UnjudgedRecord:
        if self.id != self.episode_id:
            raise ValueError(f"id: must equal episode_id {self.episode_id!r}")
        return self
