""":class:`Episode`, one agent run with its steps and usage, its size limits, and
:class:`ScoreRequest`, the scoring queue's message naming an episode."""

# ruff: noqa: RUF012 - pydantic copies field defaults; ruff sees Document is a BaseModel only in its own file

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent_learning.documents.actions import MAX_CANDIDATES, Candidate
from agent_learning.documents.base import Document, _OverLimit
from agent_learning.documents.context import EXACT_INTEGERS, NUMBER_RULE, check_context
from agent_learning.documents.fields import (
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
    MAX_STEPS,
    MAX_TOOL_DEFINITIONS_CHARS,
    NOT_UNICODE,
    ActionId,
    AgentId,
    Count,
    DocId,
    Incarnation,
    Name,
    NonNegative,
    Probability,
    StepText,
    Text,
    Version,
    _json_size,
    _unset,
    is_unicode,
    json_bytes,
)

MIN_LOGGED_PROBABILITY = 1e-300
"""The smallest probability an episode may log: its importance weight 1/μ stays below 1e300, so
that sums of weights stay finite (at 5e-324 the weight is infinite and the agent's training runs
failed on it). No policy draws an action that unlikely."""

MAX_EPISODE_BYTES = 2_000_000
"""The largest episode, in bytes of its compact JSON as azure-cosmos sends it (non-ASCII characters
escaped as ``\\uXXXX``, so never less than its UTF-8 length; see :func:`json_bytes`). Cosmos DB
items are limited to 2 MB (2,097,152 bytes, the properties Cosmos adds included) and a larger write
fails with 413, which no retry cures; the remaining ~97 KB are room for those system properties
(``_rid``, ``_self``, ``_etag``, ``_ts``, ...: well under 1 KB). :class:`Episode` rejects a larger
document; :class:`~agent_learning.agent.capture.EpisodeCapture` cuts step texts to stay below it."""

MAX_TTL_SECONDS = 2**31 - 1
"""The longest time to live an episode may carry: Cosmos DB accepts an item's ``ttl`` of -1 (never
expires) or 1 to 2^31 - 1 seconds and refuses 0 and anything larger."""


class Step(BaseModel):
    """One step of an agent run: a tool call, a model call, a retrieval, ..."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Name
    kind: Literal["tool", "llm", "retrieval", "step"] = "tool"
    status: Literal["ok", "error"]
    latency_ms: NonNegative
    error: StepText | None = None
    arguments: dict[str, Any] | None = None
    result: StepText | None = None
    call_id: Annotated[str, StringConstraints(strict=True, max_length=128)] | None = None

    @field_validator("arguments")
    @classmethod
    def _arguments_json(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _json_size(value, "arguments")

    @model_validator(mode="after")
    def _error_needs_text(self) -> Step:
        if self.status == "error" and not self.error:
            raise ValueError("error: a step with status 'error' needs an error text")
        return self


class Usage(BaseModel):
    """Model tokens an agent run spent (summed over its model calls)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: Count = 0
    completion_tokens: Count = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


PARTIAL: dict[str, Any] = {"partial": True}
"""Validation context of an episode still being recorded (``Episode.model_validate(fields,
context=PARTIAL)``): its fields are checked, not its size as a whole (its caps bound the fields given
so far well under :data:`MAX_EPISODE_BYTES`; the finished episode is measured)."""

MAX_ESCAPED_PER_CHAR = 12
"""The most characters one character of an episode's JSON (pydantic's, non-ASCII kept) takes in
the JSON :data:`MAX_EPISODE_BYTES` measures (:func:`json_bytes`): 12 for a character past U+FFFF
(``\\udXXX\\udXXX``), fewer for a number Python writes longer; an episode whose JSON is at most
the limit over this long is under the limit, unmeasured."""


class _Serialised:
    """The JSON text validation made of an episode, with the field values it was made from (a copy
    with other values is serialised again). It never makes two episodes unequal."""

    __slots__ = ("fields", "text")

    def __init__(self, fields: dict[str, Any], text: str) -> None:
        self.fields, self.text = fields, text

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


class Episode(Document):
    """One agent run under one policy decision. Written once by the agent; never updated."""

    id: DocId
    type: Literal["episode"] = "episode"
    agent_id: AgentId
    policy_version: Version
    action_id: ActionId
    probability: Probability
    logprob: Annotated[float, Field(strict=True, allow_inf_nan=False, le=0)]
    input: Text
    output: Text = ""
    instructions: Text | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    steps: Annotated[list[Step], Field(max_length=MAX_STEPS)] = []
    started_at: AwareDatetime
    ended_at: AwareDatetime
    metadata: dict[Annotated[str, StringConstraints(strict=True, min_length=1, max_length=64)], Any] = {}
    truncated: list[Name] = []
    ttl: Annotated[int, Field(strict=True)] | None = None
    """Seconds until Cosmos DB deletes the episode (:data:`MAX_TTL_SECONDS` at most), -1 for never;
    absent, the container's default applies."""
    context: dict[str, Any] | None = Field(None, exclude_if=_unset)
    """The request's features the action was chosen for (:func:`check_context`); absent when the
    agent gave none (an empty context is none)."""
    usage: Usage | None = Field(None, exclude_if=_unset)
    """Model tokens the run spent, when the agent recorded them (:meth:`EpisodeCapture.add_usage`)."""
    reward: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)] | None = Field(
        None, exclude_if=_unset
    )
    """The agent's own reward in [0, 1] (a test result, a rating, a business metric): the episode is
    scored from it, without the judges (:func:`agent_learning.rewards.agent_reward`)."""
    candidates: Annotated[list[Candidate], Field(min_length=1, max_length=MAX_CANDIDATES)] | None = Field(
        None, exclude_if=_unset
    )
    """The actions the request offered (``choose(actions=...)``), with their features: ``probability``
    is the action's among these; absent when the policy chose among its own actions."""
    incarnation: Incarnation | None = Field(None, exclude_if=_unset)
    """The incarnation of the policy the action was drawn from (:data:`Incarnation`); the scorer
    dead-letters an episode of another incarnation than its policy version's."""

    @field_validator("context")
    @classmethod
    def _context(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_context(value) or None  # {} is no context

    @field_validator("ttl")
    @classmethod
    def _ttl(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and not 1 <= value <= MAX_TTL_SECONDS:
            raise ValueError(
                f"must be -1 (never expires) or 1 to {MAX_TTL_SECONDS:,} seconds, as Cosmos DB accepts, got {value}"
            )
        return value

    @field_validator("tool_definitions")
    @classmethod
    def _tools_json(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return None if value is None else _json_size(value, "tool_definitions", MAX_TOOL_DEFINITIONS_CHARS)

    @field_validator("metadata")
    @classmethod
    def _metadata_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"has {len(value)} keys; the limit is {MAX_METADATA_KEYS}")
        for key, item in value.items():
            ok = (
                isinstance(item, bool)
                or (isinstance(item, int) and abs(item) < EXACT_INTEGERS)
                or (isinstance(item, float) and math.isfinite(item))
                or (isinstance(item, str) and len(item) <= MAX_METADATA_VALUE_CHARS)
            )
            if ok and isinstance(item, str) and not is_unicode(item):
                raise ValueError(f"{key}: {item!r:.80} {NOT_UNICODE}")
            if not ok:
                raise ValueError(
                    f"{key}: must be a string of at most {MAX_METADATA_VALUE_CHARS} characters, a boolean or "
                    f"{NUMBER_RULE}, got {item!r:.80}"
                )
        return value

    _json: _Serialised | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Episode:
        if self.ended_at < self.started_at:
            raise ValueError("ended_at: is before started_at")
        if self.candidates is not None and self.action_id not in {c.id for c in self.candidates}:
            raise ValueError(f"candidates: the action chosen, {self.action_id!r}, is not among them")
        if abs(self.logprob - math.log(self.probability)) > 1e-6:
            raise ValueError(f"logprob: {self.logprob} is not log(probability) = {math.log(self.probability)}")
        if self.probability < MIN_LOGGED_PROBABILITY:
            raise ValueError(f"probability: {self.probability!r} is below {MIN_LOGGED_PROBABILITY!r}, the smallest "
                             f"an episode may log (its importance weight would not be finite)")
        if info.context is PARTIAL:
            return self
        text = self.model_dump_json()
        if len(text) > MAX_EPISODE_BYTES // MAX_ESCAPED_PER_CHAR:  # only then can it be over the limit
            size = json_bytes(self.model_dump(mode="json"))
            if size > MAX_EPISODE_BYTES:
                raise _OverLimit(
                    f"is {size:,} bytes as JSON; the limit is {MAX_EPISODE_BYTES:,} (MAX_EPISODE_BYTES: the 2 MB "
                    "Cosmos DB item limit less room for system properties)"
                )
        self._json = _Serialised(self.__dict__, text)
        return self

    def to_json(self) -> str:
        """The episode as JSON, serialised once, when it was validated (what the stores write)."""
        kept = self._json
        return kept.text if kept is not None and kept.fields is self.__dict__ else self.model_dump_json()

    @property
    def latency_ms(self) -> float:
        return (self.ended_at - self.started_at).total_seconds() * 1000.0

    @property
    def failed_steps(self) -> int:
        return sum(1 for s in self.steps if s.status == "error")


class ScoreRequest(Document):
    """The body of a scoring queue message: which episode to score.

    ``episode`` carries the episode document itself when it is small enough, which saves
    the scorer a read; it is validated like a stored episode.
    """

    type: Literal["score_request"] = "score_request"
    episode_id: DocId
    agent_id: AgentId | None = None
    episode: dict[str, Any] | None = None
