"""The data contract: every document the pipeline stores, with its validation.

These document types live in five containers (Cosmos) or in tables (SQLite):

* :class:`Episode` (``episodes``) — one agent run. Written by agents only, never updated.
* :class:`Score` (``scores``) — the judges' metrics and the shaped reward of one episode.
  Its id is the episode id, so re-scoring overwrites instead of duplicating.
* :class:`CorrectionLedger` (``scores`` on Cosmos, its own table elsewhere) — how far an
  episode's feedback corrections go; never read by the trainer.
* :class:`PolicyDocument` (``policies``) — an immutable version (``kind="version"``, id
  ``{agent_id}:v{version}``) or the per-agent current document (``kind="current"``, id
  ``{agent_id}:current``) that agents point-read and trainers replace with an ETag check.
* :class:`TrainingRun` (``runs``) — what one training run consumed and changed.
* :class:`Feedback` (``feedback``) — a user's verdict on one episode (thumbs or a 0–1 score),
  one document per episode and source, so posting the same feedback again overwrites it.
* :class:`UnjudgedRecord` (``scores`` on Cosmos, its own table elsewhere) — an episode the scorer
  did not judge (``AGENT_LEARNING_JUDGING``), in its score slot until a later judging replaces it.

A score with ``revision`` k ≥ 1 is a *feedback correction* (id ``{episode_id}~r{k}``): it
carries the change of the episode's reward that feedback caused, so that feedback arriving
after the episode was learned from is learned exactly once (see :mod:`agent_learning.rewards.feedback`).
Episode ids may not contain ``~``, so no episode id is ever a correction id. Corrections written
before this form existed have ids ``{episode_id}:r{k}``; they are still read and counted
(:func:`legacy_correction_doc_id`), and none are written any more. A :class:`CorrectionLedger`
(id ``{episode_id}~ledger``, stored with the scores) says how far an episode's corrections go,
so that applying feedback never walks them.

Every document carries ``schema_version``. Parsing is strict (no string-to-number coercion,
no unknown fields, no NaN/inf) and reports every problem with the field path, e.g.
``invalid episode: steps[2].latency_ms: Input should be a finite number``. Properties that
Cosmos adds (``_rid``, ``_etag``, ``_ts``, ...) are dropped before validation.

Each kind has its module: :mod:`.episode` (with the scoring queue's :class:`ScoreRequest`),
:mod:`.score` (with :class:`UnjudgedRecord`), :mod:`.feedback` (with :class:`CorrectionLedger`),
:mod:`.policy`, :mod:`.run` and :mod:`.cursor`. They share :mod:`.fields` (schema versions, size
caps, id and value types, JSON and Unicode checks), :mod:`.context` (a decision's context) and
:mod:`.base` (:class:`Document`), and :mod:`.actions` (an action's features, and the candidates one
request offered). Import every name from this package; its modules never import it.
"""

from __future__ import annotations

from agent_learning.core.errors import (  # importable from here, as before the package
    DocumentTooLarge,
    InvalidDocument,
    StoredDocumentInvalid,
)
from agent_learning.documents.actions import (
    MAX_ACTION_FEATURES,
    MAX_CANDIDATES,
    MAX_FEATURE_VALUES,
    Candidate,
    check_action_features,
)
from agent_learning.documents.base import (
    D,
    Document,
    invalid_from_pydantic,
)
from agent_learning.documents.context import (
    CONTEXT_NAME,
    EXACT_INTEGERS,
    MAX_CONTEXT_FEATURES,
    MAX_CONTEXT_VALUE_CHARS,
    MAX_SHARED_CONTEXTS,
    NUMBER_RULE,
    check_context,
    feature_kinds,
    shared_context,
)
from agent_learning.documents.cursor import (
    ScoreCursor,
)
from agent_learning.documents.episode import (
    MAX_EPISODE_BYTES,
    MAX_ESCAPED_PER_CHAR,
    MAX_TTL_SECONDS,
    MIN_LOGGED_PROBABILITY,
    PARTIAL,
    Episode,
    ScoreRequest,
    Step,
    Usage,
)
from agent_learning.documents.feedback import (
    CorrectionLedger,
    Feedback,
    LearnedBase,
    correction_ledger_id,
    feedback_doc_id,
    feedback_sources_id,
)
from agent_learning.documents.fields import (
    ACTION_ID,
    ACTION_ID_RULE,
    AGENT_ID_RULE,
    DEFAULT_EXPLORATION_FLOOR,
    DEFAULT_TEMPERATURE,
    DIMENSION_NAME,
    DIMENSION_NAME_RULE,
    DOC_ID_RULE,
    FEEDBACK_SOURCE_RULE,
    INCARNATION_RULE,
    JOINT_SEPARATOR,
    MAX_ACTIONS,
    MAX_ID_CHARS,
    MAX_JSON_CHARS,
    MAX_JSON_DEPTH,
    MAX_LOGIT,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    MAX_STEP_TEXT_CHARS,
    MAX_STEPS,
    MAX_TEMPERATURE,
    MAX_TEXT_CHARS,
    MAX_TOOL_DEFINITIONS_CHARS,
    MIN_TEMPERATURE,
    NOT_UNICODE,
    SCHEMA_VERSION,
    STRUCTURED_SCHEMA,
    ActionId,
    AgentId,
    Count,
    DimensionName,
    DocId,
    FeedbackSource,
    Finite,
    Incarnation,
    LedgerId,
    Name,
    NonNegative,
    Probability,
    ScoreId,
    ShortText,
    StepText,
    Text,
    Version,
    agent_id_problem,
    episode_id_problem,
    is_unicode,
    json_bytes,
    parse_json,
)
from agent_learning.documents.policy import (
    MAX_BIN_EDGES,
    MAX_DIMENSIONS,
    MAX_EXCLUDED,
    MAX_LEARNED_VALUES,
    MAX_SEGMENTS,
    Action,
    ActionFeature,
    BinEdge,
    ContextFeature,
    Dimension,
    ExclusionRule,
    FeatureWeights,
    Interaction,
    NumberTransform,
    Offsets,
    PolicyDocument,
    SegmentName,
    excluded_configurations,
    policy_doc_id,
    stored_policy,
)
from agent_learning.documents.run import (
    MAX_TRAIN_BATCH,
    TRAIN_BATCH,
    Evaluation,
    Interval,
    MetricCheck,
    Rejected,
    TrainingRun,
    WeightDiagnostics,
    held_run_doc_id,
    run_doc_id,
)
from agent_learning.documents.score import (
    JudgeInfo,
    Measures,
    MetricScore,
    RewardInfo,
    Score,
    UnjudgedRecord,
    correction_doc_id,
    legacy_correction_doc_id,
)

__all__ = [
    "ACTION_ID",
    "ACTION_ID_RULE",
    "AGENT_ID_RULE",
    "CONTEXT_NAME",
    "DEFAULT_EXPLORATION_FLOOR",
    "DEFAULT_TEMPERATURE",
    "DIMENSION_NAME",
    "DIMENSION_NAME_RULE",
    "DOC_ID_RULE",
    "EXACT_INTEGERS",
    "FEEDBACK_SOURCE_RULE",
    "INCARNATION_RULE",
    "JOINT_SEPARATOR",
    "MAX_ACTIONS",
    "MAX_ACTION_FEATURES",
    "MAX_BIN_EDGES",
    "MAX_CANDIDATES",
    "MAX_CONTEXT_FEATURES",
    "MAX_CONTEXT_VALUE_CHARS",
    "MAX_DIMENSIONS",
    "MAX_EPISODE_BYTES",
    "MAX_ESCAPED_PER_CHAR",
    "MAX_EXCLUDED",
    "MAX_FEATURE_VALUES",
    "MAX_ID_CHARS",
    "MAX_JSON_CHARS",
    "MAX_JSON_DEPTH",
    "MAX_LEARNED_VALUES",
    "MAX_LOGIT",
    "MAX_METADATA_KEYS",
    "MAX_METADATA_VALUE_CHARS",
    "MAX_NAME_CHARS",
    "MAX_NOTE_CHARS",
    "MAX_SEGMENTS",
    "MAX_SHARED_CONTEXTS",
    "MAX_STEPS",
    "MAX_STEP_TEXT_CHARS",
    "MAX_TEMPERATURE",
    "MAX_TEXT_CHARS",
    "MAX_TOOL_DEFINITIONS_CHARS",
    "MAX_TRAIN_BATCH",
    "MAX_TTL_SECONDS",
    "MIN_LOGGED_PROBABILITY",
    "MIN_TEMPERATURE",
    "NOT_UNICODE",
    "NUMBER_RULE",
    "PARTIAL",
    "SCHEMA_VERSION",
    "STRUCTURED_SCHEMA",
    "TRAIN_BATCH",
    "Action",
    "ActionFeature",
    "ActionId",
    "AgentId",
    "BinEdge",
    "Candidate",
    "ContextFeature",
    "CorrectionLedger",
    "Count",
    "D",
    "Dimension",
    "DimensionName",
    "DocId",
    "Document",
    "DocumentTooLarge",
    "Episode",
    "Evaluation",
    "ExclusionRule",
    "FeatureWeights",
    "Feedback",
    "FeedbackSource",
    "Finite",
    "Incarnation",
    "Interaction",
    "Interval",
    "InvalidDocument",
    "JudgeInfo",
    "LearnedBase",
    "LedgerId",
    "Measures",
    "MetricCheck",
    "MetricScore",
    "Name",
    "NonNegative",
    "NumberTransform",
    "Offsets",
    "PolicyDocument",
    "Probability",
    "Rejected",
    "RewardInfo",
    "Score",
    "ScoreCursor",
    "ScoreId",
    "ScoreRequest",
    "SegmentName",
    "ShortText",
    "Step",
    "StepText",
    "StoredDocumentInvalid",
    "Text",
    "TrainingRun",
    "UnjudgedRecord",
    "Usage",
    "Version",
    "WeightDiagnostics",
    "agent_id_problem",
    "check_action_features",
    "check_context",
    "correction_doc_id",
    "correction_ledger_id",
    "episode_id_problem",
    "excluded_configurations",
    "feature_kinds",
    "feedback_doc_id",
    "feedback_sources_id",
    "held_run_doc_id",
    "invalid_from_pydantic",
    "is_unicode",
    "json_bytes",
    "legacy_correction_doc_id",
    "parse_json",
    "policy_doc_id",
    "run_doc_id",
    "shared_context",
    "stored_policy",
]
"""Every name the package exports: the names the module ``documents`` had before it became one."""
