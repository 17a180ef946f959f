""":class:`TrainingRun`, what one training run consumed and published, with the publish guardrail's
:class:`Evaluation` of its candidate, and how many scores one run reads."""

# ruff: noqa: RUF012 - pydantic copies field defaults; ruff sees Document is a BaseModel only in its own file

from __future__ import annotations

import zlib
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from agent_learning.documents.base import Document
from agent_learning.documents.cursor import ScoreCursor
from agent_learning.documents.fields import (
    AgentId,
    Count,
    DocId,
    Finite,
    NonNegative,
    ShortText,
    StepText,
    Version,
    _unset,
)

MAX_TRAIN_BATCH = 20_000
"""The most score rows one training run reads (``AGENT_LEARNING_TRAIN_MAX_BATCH``'s bound). A
run holds its whole batch in memory; measured at 11.3 KB per row (tracemalloc peak of
:func:`~agent_learning.pipeline.train_agent` on SQLite, rows with three judge metrics carrying
500-character reasons; 8.5 KB with the offline judge's), so a full batch stays within a 256 MB
budget (about 225 MB). A larger backlog is learned over several runs."""

TRAIN_BATCH = 10_000
"""The score rows one training run reads by default (``AGENT_LEARNING_TRAIN_MAX_BATCH``)."""


class Rejected(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    error: StepText


class Interval(BaseModel):
    """An off-policy estimate with its confidence interval (:mod:`agent_learning.evaluation`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    value: Finite
    low: Finite
    high: Finite


class MetricCheck(BaseModel):
    """A guardrail metric of a candidate against its budget (mean per episode, SNIPS)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    budget: NonNegative
    candidate: Interval
    current: Interval
    over: bool
    """Confidently over the budget (lower bound above it) and confidently above the current version (the paired
    difference's lower bound above 0), at any number of episodes that record the metric."""


class WeightDiagnostics(BaseModel):
    """How far an off-policy estimate can be trusted, from its importance weights w = π / μ
    (:func:`agent_learning.evaluation.weight_diagnostics`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_weight: NonNegative
    mean_weight: NonNegative
    """The target's total probability as the log sees it: 1 in expectation; far from 1, the log missed (or
    over-sampled) where the target goes."""
    rare_mass: NonNegative
    """The target's mass (estimated) on actions logged below the floor: fewer than 10 expected in the batch."""
    rare_logged: NonNegative
    """The share of episodes logged below that floor."""
    reliable: bool
    """False when the estimate relies on rarely logged actions: mean weight off 1 by more than 0.1 (and by
    more than chance), one episode carrying more than a tenth of the weight, or the target's mass on rarely
    logged actions more than 0.1 above their share of the log."""


class Evaluation(BaseModel):
    """A trained candidate evaluated off-policy against the current version on the episodes of
    its batch, before it is published (the publish guardrail, :mod:`agent_learning.evaluation`).

    ``verdict``: ``published`` (evaluable, shown to lose less than the margin, within its budgets
    and not confidently worse on any segment: published as trained), ``shrunk`` (not evaluable or not
    shown safe as trained: its step was shrunk towards the current version until it was, and that is
    published; ``step`` says how much of it), ``held`` (confidently worse, over a budget, worse on a
    segment, or not evaluable at any step: not published), ``warned`` (would have been held or shrunk,
    published as trained because the guardrail only warns) or ``too_few_samples`` (published by an
    earlier guardrail that let a candidate it could not evaluate through; no longer given)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    verdict: Literal["published", "shrunk", "held", "warned", "too_few_samples"]
    reason: ShortText
    estimator: Literal["ips", "snips", "dr"]
    confidence: Annotated[float, Field(strict=True, gt=0, lt=1)]
    margin: NonNegative
    episodes: Count
    effective_sample_size: NonNegative
    candidate: Interval | None = None
    current: Interval | None = None
    difference: Interval | None = None
    """candidate − current on the same episodes (paired)."""
    metrics: dict[str, MetricCheck] | None = Field(None, exclude_if=_unset)
    """The guardrail metrics that have a budget."""
    diagnostics: WeightDiagnostics | None = Field(None, exclude_if=_unset)
    """The candidate's importance weights on the batch (of the shrunk candidate when ``shrunk``)."""
    step: Annotated[float, Field(strict=True, gt=0, le=1)] | None = Field(None, exclude_if=_unset)
    """The share of the trained step that was published (``shrunk``)."""


class TrainingRun(Document):
    """One training run: the score range it consumed and the update it published.

    A ``held`` run's candidate was not published (its :class:`Evaluation` says why): it consumed
    nothing, the current version and its cursor stay, and the next run learns its scores again
    together with the newer ones. Its ``policy_version`` is the version that stayed current."""

    id: DocId
    type: Literal["run"] = "run"
    agent_id: AgentId
    base_version: Version
    policy_version: Version
    cursor_from: ScoreCursor | None
    cursor_to: ScoreCursor
    episodes: Count
    corrections: Count = 0
    """Feedback correction rows consumed (0 in runs written before this field existed)."""
    rejected: Count = 0
    rejected_samples: Annotated[list[Rejected], Field(max_length=20)] = []
    skipped: Count | None = Field(None, exclude_if=_unset)
    """Scores of actions the policy no longer has (revised away): counted, not learned."""
    metrics: dict[str, Finite]
    learner: dict[str, Any]
    started_at: AwareDatetime
    finished_at: AwareDatetime
    status: Literal["published", "held"] = Field("published", exclude_if=lambda v: v == "published")
    evaluation: Evaluation | None = Field(None, exclude_if=_unset)
    """The publish guardrail's evaluation of the candidate (absent when the guardrail is off)."""

    @property
    def held(self) -> bool:
        return self.status == "held"


def run_doc_id(agent_id: str, version: int) -> str:
    """The run that produced ``version`` of ``agent_id``: one per published version."""
    return f"{agent_id}:run:v{version}"


def held_run_doc_id(agent_id: str, base_version: int, cursor_to: ScoreCursor) -> str:
    """A held run: one per current version and last score read (a repeat of the same run
    overwrites its record with the same content)."""
    return f"{agent_id}:run:v{base_version}:held:{cursor_to.seq}-{zlib.crc32(cursor_to.id.encode()):08x}"
