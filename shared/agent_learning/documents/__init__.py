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
after the episode was learned from is learned exactly once (see :mod:`agent_learning.feedback`).
Episode ids may not contain ``~``, so no episode id is ever a correction id. Corrections written
before this form existed have ids ``{episode_id}:r{k}``; they are still read and counted
(:func:`legacy_correction_doc_id`), and none are written any more. A :class:`CorrectionLedger`
(id ``{episode_id}~ledger``, stored with the scores) says how far an episode's corrections go,
so that applying feedback never walks them.

Every document carries ``schema_version``. Parsing is strict (no string-to-number coercion,
no unknown fields, no NaN/inf) and reports every problem with the field path, e.g.
``invalid episode: steps[2].latency_ms: Input should be a finite number``. Properties that
Cosmos adds (``_rid``, ``_etag``, ``_ts``, ...) are dropped before validation.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
import zlib
from collections.abc import Mapping
from itertools import product
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import DocumentTooLarge, InvalidDocument, StoredDocumentInvalid
from ..limits import AGENT_ID_PATTERN as _ID
from ..limits import AGENT_ID_RULE as AGENT_ID_RULE
from ..limits import DEFAULT_EXPLORATION_FLOOR as DEFAULT_EXPLORATION_FLOOR
from ..limits import DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE
from ..limits import DOC_ID_PATTERN as _DOC_ID
from ..limits import DOC_ID_RULE as DOC_ID_RULE
from ..limits import MAX_TEMPERATURE as MAX_TEMPERATURE
from ..limits import MIN_TEMPERATURE as MIN_TEMPERATURE
from ..limits import agent_id_problem as agent_id_problem
from ..limits import episode_id_problem as episode_id_problem

SCHEMA_VERSION = 2
"""The newest schema this library understands. Documents are written with the oldest schema
that holds them: 1, except policies with dimensions, exclusions or context features (2), so
that a library that knows only schema 1 keeps reading every document it could read before and
refuses a structured policy with "upgrade agent-learning" instead of misreading it."""
STRUCTURED_SCHEMA = 2
"""The schema of a policy with ``dimensions``, ``excluded`` or ``features``."""

# Size caps: they keep judge prompts bounded. `EpisodeCapture` truncates to them; parsing
# rejects anything longer. Together they admit about 4 MB per episode (256 steps of up to
# ~16,000 characters each), so the whole episode has its own bound, MAX_EPISODE_BYTES.
MAX_TEXT_CHARS = 20_000
MAX_STEP_TEXT_CHARS = 4_000
MAX_NAME_CHARS = 128
MAX_NOTE_CHARS = 1_000
"""A note, pin reason or feedback comment."""
MAX_STEPS = 256
MAX_JSON_CHARS = 8_000
MAX_JSON_DEPTH = 64
"""How deep a free-form JSON field (tool arguments, a config) may nest: Cosmos DB refuses a
document nested beyond 128 levels, and an episode adds a few around the field."""
MAX_TOOL_DEFINITIONS_CHARS = 4 * MAX_JSON_CHARS
"""An episode's ``tool_definitions``, as compact JSON (EpisodeCapture keeps the leading ones that fit)."""
MAX_METADATA_KEYS = 32
MAX_ACTIONS = 1_024
MAX_LOGIT = 1_000.0

AgentId = Annotated[str, StringConstraints(strict=True, pattern=_ID)]


_ACTION_ID = r"^[A-Za-z0-9][A-Za-z0-9._:=\-]{0,127}$"
ActionId = Annotated[str, StringConstraints(strict=True, pattern=_ACTION_ID)]
DocId = Annotated[str, StringConstraints(strict=True, pattern=_DOC_ID)]
_FEEDBACK_SOURCE = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$"
FEEDBACK_SOURCE_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64 characters"
_DIMENSION_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,31}$"
_INCARNATION = r"^[0-9a-f]{32}$"
Incarnation = Annotated[str, StringConstraints(strict=True, pattern=_INCARNATION)]
"""Which creation of an agent a document belongs to (:func:`~agent_learning.pipeline.create_policy`
draws one per creation). A document without one belongs to the agent's first creation under a
release from before incarnations (the "legacy incarnation"), and to no later one."""
INCARNATION_RULE = "32 lowercase hexadecimal digits, copied from the policy document the action was drawn from"
DIMENSION_NAME_RULE = "a letter or '_' first, then letters, digits or '_', at most 32 characters"
ACTION_ID_RULE = "letters, digits, '.', '_', ':', '=' and '-', starting with a letter or digit, at most 128 characters"
ACTION_ID = re.compile(_ACTION_ID)
DIMENSION_NAME = re.compile(_DIMENSION_NAME)
MAX_ID_CHARS = 200
"""The longest document id written (Cosmos allows 255)."""
# A score's id: an episode id (the judges' score) or a correction id, ``~r{k}`` after a DocId.
ScoreId = Annotated[
    str,
    StringConstraints(strict=True, max_length=MAX_ID_CHARS, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]*(~r[1-9][0-9]*)?$"),
]
LedgerId = Annotated[
    str, StringConstraints(strict=True, max_length=MAX_ID_CHARS, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]*~ledger$")
]
Name = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_NAME_CHARS)]
Text = Annotated[str, StringConstraints(strict=True, max_length=MAX_TEXT_CHARS)]
StepText = Annotated[str, StringConstraints(strict=True, max_length=MAX_STEP_TEXT_CHARS)]
ShortText = Annotated[str, StringConstraints(strict=True, max_length=MAX_NOTE_CHARS)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0)]
Probability = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]
MIN_LOGGED_PROBABILITY = 1e-300
"""The smallest probability an episode may log: its importance weight 1/μ stays below 1e300, so
that sums of weights stay finite (at 5e-324 the weight is infinite and the agent's training runs
failed on it). No policy draws an action that unlikely."""
Version = Annotated[int, Field(strict=True, ge=1)]
Count = Annotated[int, Field(strict=True, ge=0)]
MAX_METADATA_VALUE_CHARS = 256

MAX_CONTEXT_FEATURES = 20
"""Features one decision's context may carry (a request's task type, language, tier, length...)."""
MAX_CONTEXT_VALUE_CHARS = 128
"""The longest categorical context value: a segment name, not free text."""
CONTEXT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
"""A context feature's name: a letter or ``_`` first, then letters, digits, ``_``, ``.``, ``-``; at most 64."""
EXACT_INTEGERS = 2**53
"""Integers in a context or metadata are below this in magnitude: each is exactly a float, so every
JSON reader (Cosmos DB's included) reads back the number written."""
NUMBER_RULE = "a finite number (an integer must be below 2**53 in magnitude, so that a float holds it exactly)"


def _unset(value: Any) -> bool:
    """Fields added after documents without them were stored are written only when set, so that a
    document that does not use one is written exactly as before (older readers, which refuse
    unknown fields, still read it)."""
    return value is None


def check_context(context: Any) -> dict[str, str | int | float | bool]:
    """A decision's context, checked: at most :data:`MAX_CONTEXT_FEATURES` features, each named by
    :data:`CONTEXT_NAME`, each a category (a string of at most :data:`MAX_CONTEXT_VALUE_CHARS`
    characters, or a boolean) or a finite number (an integer below :data:`EXACT_INTEGERS` in
    magnitude). Raises ``ValueError`` naming the feature.

    It runs on every ``choose(context=...)``, so the common types are checked first and names
    already found valid are remembered (:data:`_VALID_NAMES`)."""
    if not isinstance(context, dict):
        if not isinstance(context, Mapping):
            raise ValueError(f"must be an object of feature names to values, got {type(context).__name__}")
        context = dict(context)
    if len(context) > MAX_CONTEXT_FEATURES:
        raise ValueError(f"has {len(context)} features; the limit is {MAX_CONTEXT_FEATURES}")
    normalised: dict[str, Any] | None = None  # a copy, once a value is not of a plain type
    for name, value in context.items():
        if name not in _VALID_NAMES:
            if not isinstance(name, str):
                raise ValueError(f"feature names must be strings, got {type(name).__name__} {name!r:.80}")
            if not CONTEXT_NAME.fullmatch(name):
                raise ValueError(
                    f"{str(name)[:80]!r} is not a feature name: use a letter or '_' first, then letters, digits, "
                    "'_', '.' or '-', at most 64 characters"
                )
            if len(_VALID_NAMES) < 4_096:
                _VALID_NAMES.add(name)
        kind = type(value)
        if kind is str:
            ok = 0 < len(value) <= MAX_CONTEXT_VALUE_CHARS
            if ok and not is_unicode(value):
                raise ValueError(f"{name}: {value!r:.80} {NOT_UNICODE}")
        elif kind is bool:
            ok = True
        elif kind is float:
            ok = math.isfinite(value)
        elif kind is int:
            ok = abs(value) < EXACT_INTEGERS
        else:
            plain = _plain_scalar(value)
            ok = plain is not None and (
                type(plain) is bool
                or (type(plain) is int and abs(plain) < EXACT_INTEGERS)
                or (type(plain) is float and math.isfinite(plain))
                or (type(plain) is str and 0 < len(plain) <= MAX_CONTEXT_VALUE_CHARS and is_unicode(plain))
            )
            if ok:
                if normalised is None:
                    normalised = dict(context)
                normalised[name] = plain
        if not ok:
            raise ValueError(
                f"{name}: must be a category (a non-empty string of at most {MAX_CONTEXT_VALUE_CHARS} characters, "
                f"or a boolean) or {NUMBER_RULE}, got {value!r:.80}"
            )
    return dict(context) if normalised is None else normalised


def _plain_scalar(value: Any) -> str | bool | int | float | None:
    """``value`` as the plain Python type it stands for, or None. A numpy or pandas scalar (a
    ``numpy.int64`` read from a data frame, a ``numpy.bool_``) or a subclass of ``str``/``float``
    becomes the built-in type, so that its segment name, the logged episode and the number the
    learner reads agree (``repr(numpy.float64(1.5))`` is not ``"1.5"``). numpy is not imported."""
    if isinstance(value, str):
        return str.__str__(value)  # the characters, not the subclass's str(): a str Enum's value
    if isinstance(value, bool | float | int):
        for plain in (bool, int, float):  # bool before int: a bool is an int
            if isinstance(value, plain):
                return plain(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(getattr(value, "dtype", None), "kind", None) == "b" and getattr(value, "ndim", None) == 0:
        return bool(value)
    return None


_VALID_NAMES: set[str] = set()
"""Context feature names that passed :data:`CONTEXT_NAME` (bounded: at most 4,096 are kept)."""

MAX_EPISODE_BYTES = 2_000_000
"""The largest episode, in bytes of its compact JSON as azure-cosmos sends it (non-ASCII characters
escaped as ``\\uXXXX``, so never less than its UTF-8 length; see :func:`json_bytes`). Cosmos DB
items are limited to 2 MB (2,097,152 bytes, the properties Cosmos adds included) and a larger write
fails with 413, which no retry cures; the remaining ~97 KB are room for those system properties
(``_rid``, ``_self``, ``_etag``, ``_ts``, ...: well under 1 KB). :class:`Episode` rejects a larger
document; :class:`~agent_learning.capture.EpisodeCapture` cuts step texts to stay below it."""

MAX_TTL_SECONDS = 2**31 - 1
"""The longest time to live an episode may carry: Cosmos DB accepts an item's ``ttl`` of -1 (never
expires) or 1 to 2^31 - 1 seconds and refuses 0 and anything larger."""

MAX_TRAIN_BATCH = 20_000
"""The most score rows one training run reads (``AGENT_LEARNING_TRAIN_MAX_BATCH``'s bound). A
run holds its whole batch in memory; measured at 11.3 KB per row (tracemalloc peak of
:func:`~agent_learning.pipeline.train_agent` on SQLite, rows with three judge metrics carrying
500-character reasons; 8.5 KB with the offline judge's), so a full batch stays within a 256 MB
budget (about 225 MB). A larger backlog is learned over several runs."""

TRAIN_BATCH = 10_000
"""The score rows one training run reads by default (``AGENT_LEARNING_TRAIN_MAX_BATCH``)."""

D = TypeVar("D", bound="Document")


def json_bytes(value: Any) -> int:
    """The size of ``value`` as compact JSON with non-ASCII characters escaped (all ASCII, so
    characters are bytes): the measure :data:`MAX_EPISODE_BYTES` bounds."""
    return len(json.dumps(value, separators=(",", ":")))


def parse_json(text: str | bytes, *, unique_names: bool = False) -> Any:
    """``text`` parsed as JSON; raises ``ValueError`` saying what is wrong with it ("is not valid
    JSON (…)", "is nested too deeply to parse", or with ``unique_names`` "names 'x' twice in one
    object": JSON keeps only the last, which would drop the first unseen), for the caller to
    prefix with the field."""
    try:
        return json.loads(text, object_pairs_hook=_unique_names if unique_names else None)
    except RecursionError:
        raise ValueError("is nested too deeply to parse") from None
    except _NameGivenTwice as exc:
        raise ValueError(f"names {exc.args[0]!r:.80} twice in one object; only the last would count") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ValueError(f"is not valid JSON ({exc})") from None


class _NameGivenTwice(Exception):
    """A JSON object gives one name twice (raised by :func:`_unique_names`, worded by :func:`parse_json`)."""


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's entries as a dict; :class:`_NameGivenTwice` for a name given twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        raise _NameGivenTwice(next(name for name, _ in pairs if name in seen or seen.add(name)))
    return value


def _json_size(value: Any, field: str, limit: int = MAX_JSON_CHARS) -> Any:
    """Check that ``value`` is plain JSON (finite numbers, text that is valid Unicode) and not
    larger than ``limit``."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"must be JSON with finite numbers ({exc})") from None
    if len(text) > limit:
        raise ValueError(f"is {len(text)} characters as JSON; the limit is {limit}")
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and (depth := _nesting(value)) > MAX_JSON_DEPTH:
        raise ValueError(f"is nested {depth} levels deep; the limit is {MAX_JSON_DEPTH}")
    # Escaped, a surrogate (lone, or half of a pair for a character past U+FFFF) reads \udXXX:
    # only then is the text encoded to look for a lone one.
    if "\\ud" in text and not is_unicode(json.dumps(value, ensure_ascii=False)):
        raise ValueError(f"holds text that {NOT_UNICODE}")
    return value


def _nesting(value: Any) -> int:
    """How many objects and arrays deep ``value`` goes (iteratively: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


NOT_UNICODE = "is not valid Unicode (a lone surrogate, U+D800–U+DFFF): documents are stored as UTF-8"


def is_unicode(text: str) -> bool:
    """False if ``text`` holds a lone surrogate (U+D800–U+DFFF), which no UTF-8 document can hold:
    Python strings may (``"\\ud800"`` in JSON decodes to one), Cosmos DB and SQLite's JSON may not."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-after[", "function-before[", "function-wrap[")):
            continue  # pydantic's validator wrappers, not fields
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"


class Document(BaseModel):
    """Base of every stored document: strict, immutable, JSON round-trippable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True)
    schema_version: Annotated[int, Field(strict=True, ge=1)] = 1

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, value: int) -> int:
        if value > SCHEMA_VERSION:
            raise ValueError(
                f"{value} is newer than this library understands ({SCHEMA_VERSION}); upgrade agent-learning"
            )
        return value

    @classmethod
    def from_dict(cls: type[D], data: Any) -> D:
        """Validate a dict (e.g. a stored item); raises :class:`InvalidDocument`."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("_"))}
        else:
            raise InvalidDocument(
                cls._doc_kind(), [("(document)", f"must be a JSON object, got {type(data).__name__}")]
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _invalid(cls._doc_kind(), exc) from None

    @classmethod
    def from_json(cls: type[D], text: str | bytes) -> D:
        """Parse a JSON text; raises :class:`InvalidDocument` (also for malformed JSON)."""
        try:
            data = parse_json(text)
        except ValueError as exc:
            raise InvalidDocument(cls._doc_kind(), [("(document)", str(exc))]) from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (datetimes as ISO 8601 strings)."""
        return self.model_dump(mode="json", exclude_none=False)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def _doc_kind(cls) -> str:
        field = cls.model_fields.get("type")
        return str(field.default) if field is not None and field.default else cls.__name__


class _OverLimit(ValueError):
    """A document over its size limit, told apart from other problems (:class:`DocumentTooLarge`)."""


def invalid_from_pydantic(kind: str, exc: ValidationError) -> InvalidDocument:
    """Turn pydantic's errors into an :class:`InvalidDocument` with one path per problem (a
    :class:`DocumentTooLarge` when the problem is the document's size)."""
    problems = []
    over_limit = False
    for err in exc.errors(include_url=False):
        over_limit = over_limit or isinstance(err.get("ctx", {}).get("error"), _OverLimit)
        msg = err["msg"].removeprefix("Value error, ")
        field = _path(err["loc"])
        if err["type"] == "string_pattern_mismatch" and (rule := _PATTERN_RULES.get(err["ctx"]["pattern"])):
            msg = f"{str(err['input'])[:80]!r} does not fit: use {rule}"
        elif err["type"] == "string_unicode":
            msg = NOT_UNICODE
        # Model-level validators (of the document or of a nested model such as a step) name
        # their field as "field: problem".
        match = _FIELD_PREFIX.match(msg) if err["type"] == "value_error" else None
        if match:
            sub, msg = match.group(1), match.group(2)
            field = sub if field == "(document)" else f"{field}.{sub}"
        problems.append((field, msg))
    return (DocumentTooLarge if over_limit else InvalidDocument)(kind, problems)


_invalid = invalid_from_pydantic


_PATTERN_RULES = {
    _ID: AGENT_ID_RULE,
    _ACTION_ID: ACTION_ID_RULE,
    _DOC_ID: DOC_ID_RULE,
    _FEEDBACK_SOURCE: FEEDBACK_SOURCE_RULE,
    _DIMENSION_NAME: DIMENSION_NAME_RULE,
    _INCARNATION: INCARNATION_RULE,
}
"""Plain sentences for the id patterns, in place of pydantic's "String should match pattern '…'"."""

_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.S)


# --------------------------------------------------------------------------- episodes


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


# --------------------------------------------------------------------------- policies


class Action(BaseModel):
    """One configuration an agent can choose: an id, a description and its settings."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: ActionId
    description: ShortText = ""
    config: dict[str, Any] = {}

    @field_validator("config")
    @classmethod
    def _config_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _json_size(value, "config")


class ScoreCursor(BaseModel):
    """Position in an agent's score stream: scores are ordered by ``(seq, id)``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: Count
    id: ScoreId

    def __lt__(self, other: ScoreCursor) -> bool:
        return (self.seq, self.id) < (other.seq, other.id)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> ScoreCursor:
        """The position of a score row as a store's ``read_scores`` returns it."""
        return cls(seq=int(row["seq"]), id=str(row["id"]))


MAX_DIMENSIONS = 8
"""Named dimensions one structured policy may have."""
MAX_SEGMENTS = 32
"""Segments (values) of one categorical context feature a policy learns offsets for; further
values seen in training share the global logits."""
MAX_LEARNED_VALUES = 2_048
"""Context parameters one policy may hold, counted per action: (learned segments of all its
categorical features + its numeric features) × actions. It keeps a policy document and its
learner state small (about 50 KB at the limit for 40 actions); segments seen once the budget is
spent share the global logits."""
MAX_EXCLUDED = 4_096
"""Configurations the exclusion rules of one policy may exclude in all (each draw checks them)."""
DimensionName = Annotated[str, StringConstraints(strict=True, pattern=_DIMENSION_NAME)]
SegmentName = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_CONTEXT_VALUE_CHARS)]
ExclusionRule = Annotated[
    dict[DimensionName, Annotated[str, StringConstraints(strict=True, max_length=128)]],
    Field(json_schema_extra={"additionalProperties": False}),  # keys are dimension names only, as validated
]
Offsets = list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_LOGIT, le=MAX_LOGIT)]]


class Dimension(BaseModel):
    """A named dimension of a structured policy: the next ``size`` entries of ``actions``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: DimensionName
    size: Annotated[int, Field(strict=True, ge=1, le=MAX_ACTIONS)]


class ContextFeature(BaseModel):
    """A context feature a policy learns from (:mod:`agent_learning.structured`).

    ``category``: ``segments`` maps each learned segment to one logit offset per action.
    ``number``: one ``weights`` entry per action, applied to ``(x − center) / scale``; the
    trainer sets ``center`` and ``scale`` once 30 episodes have carried the feature, from every
    episode that did up to that training run (pooled over runs; until then it has no ``weights``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(strict=True, pattern=f"^{CONTEXT_NAME.pattern}$")]
    kind: Literal["category", "number"]
    segments: dict[SegmentName, Offsets] | None = Field(None, exclude_if=_unset)
    weights: Offsets | None = Field(None, exclude_if=_unset)
    center: Annotated[float, Field(strict=True, allow_inf_nan=False)] = 0.0
    scale: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)] = 1.0

    @model_validator(mode="after")
    def _kind_fields(self) -> ContextFeature:
        if self.kind == "category" and self.weights is not None:
            raise ValueError("weights: only a number feature has weights")
        if self.kind == "number" and self.segments is not None:
            raise ValueError("segments: only a category feature has segments")
        if self.segments is not None and len(self.segments) > MAX_SEGMENTS:
            raise ValueError(f"segments: {len(self.segments)} segments; the limit is {MAX_SEGMENTS}")
        return self


class PolicyDocument(Document):
    """A softmax policy over discrete actions.

    ``kind="version"`` documents are immutable history. The ``kind="current"`` document is
    a full copy of the latest version that agents point-read and trainers replace with an
    ETag check; it also carries ``cursor``, the last score folded into the logits, so the
    logits and the training cursor always change together in one atomic write. ``run`` is
    the training run that produced the version (``None`` for ``init`` and ``rollback``); it
    is also written to the ``runs`` container, and can be rebuilt from here after a crash.
    """

    id: DocId
    type: Literal["policy"] = "policy"
    kind: Literal["version", "current"]
    agent_id: AgentId
    version: Version
    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_ACTIONS)]
    logits: list[Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_LOGIT, le=MAX_LOGIT)]]
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = 1.0
    exploration_floor: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, lt=1)] = 0.0
    pinned: bool = False
    pin_reason: ShortText = ""
    source: Literal["init", "train", "rollback", "import", "revise"]
    parent_version: Version | None = None
    cursor: ScoreCursor | None = None
    run: TrainingRun | None = None
    created_at: AwareDatetime
    note: ShortText = ""
    learner_state: dict[str, Any] = {}
    dimensions: Annotated[list[Dimension], Field(min_length=1, max_length=MAX_DIMENSIONS)] | None = Field(
        None, exclude_if=_unset
    )
    """Named dimensions (schema 2): ``actions`` are their values, dimension after dimension."""
    excluded: list[ExclusionRule] | None = Field(None, exclude_if=_unset)
    """Rules of configurations never chosen: the values (ids after ``=``) of some dimensions."""
    features: Annotated[list[ContextFeature], Field(max_length=MAX_CONTEXT_FEATURES)] | None = Field(
        None, exclude_if=_unset
    )
    """Context features the policy's choice depends on (schema 2)."""
    unpinned_version: Version | None = Field(None, exclude_if=_unset)
    """The version the current document was at when an operator last unpinned it: a drift warning
    pins the agent again (``AGENT_LEARNING_AUTO_PIN``) only on the evidence of the runs after it."""
    incarnation: Incarnation | None = Field(None, exclude_if=_unset)
    """Which creation of the agent this is (:data:`Incarnation`): drawn by ``create_policy`` and
    kept by every later version, so the episodes and scores of a deleted agent re-created under
    the same id are told from the new one's."""

    @model_validator(mode="before")
    @classmethod
    def _structured_schema(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "schema_version" not in data
            and any(data.get(k) is not None for k in ("dimensions", "excluded", "features"))
        ):
            return {**data, "schema_version": STRUCTURED_SCHEMA}
        return data

    @field_validator("learner_state")
    @classmethod
    def _state_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _json_size(value, "learner_state", 16 * MAX_JSON_CHARS)

    @model_validator(mode="after")
    def _consistent(self) -> PolicyDocument:
        if len(self.logits) != len(self.actions):
            raise ValueError(f"logits: has {len(self.logits)} entries but there are {len(self.actions)} actions")
        ids = [a.id for a in self.actions]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"actions: duplicate action ids {dupes}")
        largest = max(d.size for d in self.dimensions) if self.dimensions else len(self.actions)
        if self.exploration_floor * largest >= 1:
            raise ValueError(f"exploration_floor: {self.exploration_floor} x {largest} actions must be below 1")
        self._check_structure()
        if self.kind == "version" and (self.pinned or self.pin_reason):
            raise ValueError("pinned: only the current document can be pinned")
        expected = policy_doc_id(self.agent_id, self.version if self.kind == "version" else None)
        if self.id != expected:
            raise ValueError(f"id: expected {expected!r} for a {self.kind} document")
        return self

    def _check_structure(self) -> None:
        structured = self.dimensions is not None or self.excluded is not None or self.features is not None
        if structured and self.schema_version < STRUCTURED_SCHEMA:
            raise ValueError(
                f"schema_version: a policy with dimensions, exclusions or features is schema {STRUCTURED_SCHEMA}"
            )
        names = [d.name for d in self.dimensions or []]
        if len(set(names)) != len(names):
            raise ValueError(f"dimensions: duplicate names {sorted({n for n in names if names.count(n) > 1})}")
        if self.dimensions is not None:
            if sum(d.size for d in self.dimensions) != len(self.actions):
                raise ValueError(
                    f"dimensions: sizes add up to {sum(d.size for d in self.dimensions)}, "
                    f"but there are {len(self.actions)} actions"
                )
            start = 0
            longest = 0
            for d in self.dimensions:
                ids = [a.id for a in self.actions[start : start + d.size]]
                for action_id in ids:
                    if not action_id.startswith(f"{d.name}=") or ":" in action_id:
                        raise ValueError(f"actions: {action_id!r} must be {d.name}=<value> (no ':')")
                longest += max(len(i) for i in ids) + 1
                start += d.size
            if longest - 1 > 128:
                raise ValueError(f"dimensions: a configuration id may be {longest - 1} characters; the limit is 128")
        for i, rule in enumerate(self.excluded or []):
            if not rule:
                raise ValueError(f"excluded[{i}]: an empty rule would exclude everything")
            for name, value in rule.items():
                if name not in names:
                    raise ValueError(f"excluded[{i}]: {name!r} is not a dimension (dimensions: {names})")
                if f"{name}={value}" not in self.action_ids:
                    raise ValueError(f"excluded[{i}].{name}: {value!r} is not one of its values")
        if self.excluded:
            sizes = {d.name: d.size for d in self.dimensions or []}
            joint = math.prod(sizes.values())
            bound = sum(joint // math.prod(sizes[n] for n in rule) for rule in self.excluded)
            if bound > MAX_EXCLUDED:
                raise ValueError(
                    f"excluded: the rules exclude up to {bound} configurations; the limit is {MAX_EXCLUDED}"
                )
            if bound >= joint and len(excluded_configurations(self)) >= joint:
                raise ValueError("excluded: the rules exclude every configuration")
        seen = set()
        for feature in self.features or []:
            if feature.name in seen:
                raise ValueError(f"features: {feature.name!r} appears twice")
            seen.add(feature.name)
            for segment, offsets in (feature.segments or {}).items():
                if len(offsets) != len(self.actions):
                    raise ValueError(f"features.{feature.name}.segments.{segment}: needs one offset per action")
            if feature.weights is not None and len(feature.weights) != len(self.actions):
                raise ValueError(f"features.{feature.name}.weights: needs one weight per action")
        learned = sum(len(f.segments or {}) if f.kind == "category" else 1 for f in self.features or [])
        if learned * len(self.actions) > MAX_LEARNED_VALUES:
            raise ValueError(
                f"features: {learned} segments and numeric features × {len(self.actions)} actions is "
                f"{learned * len(self.actions)} parameters; the limit is {MAX_LEARNED_VALUES}"
            )

    @property
    def action_ids(self) -> list[str]:
        return [a.id for a in self.actions]

    @property
    def structured(self) -> bool:
        """Whether choosing needs :class:`~agent_learning.structured.StructuredPolicy`."""
        return self.dimensions is not None or self.excluded is not None or self.features is not None

    def as_kind(self, kind: Literal["version", "current"]) -> PolicyDocument:
        """The same policy as a version document or as the current document.

        ``pinned``, ``pin_reason`` and ``unpinned_version`` are state of the current document only
        (pausing learning does not make a new policy), so version documents are never pinned.
        """
        doc_id = policy_doc_id(self.agent_id, self.version if kind == "version" else None)
        update: dict[str, Any] = {"kind": kind, "id": doc_id}
        if kind == "version":
            update["pinned"] = False
            update["pin_reason"] = ""
            update["unpinned_version"] = None
        return self.model_copy(update=update)


def excluded_configurations(doc: PolicyDocument) -> list[tuple[int, ...]]:
    """Every configuration ``doc.excluded`` excludes, as per-dimension value indices, each once,
    sorted. A rule names values of some dimensions (``{"prompt": "concise", "retrieval_k": "10"}``:
    value ids without the ``name=`` prefix); every configuration that has them is excluded."""
    if not doc.excluded or not doc.dimensions:
        return []
    found: set[tuple[int, ...]] = set()
    start = 0
    index: list[dict[str, int]] = []
    for d in doc.dimensions:
        index.append({a.id.partition("=")[2]: i for i, a in enumerate(doc.actions[start : start + d.size])})
        start += d.size
    for rule in doc.excluded:
        choices = [[index[k][rule[d.name]]] if d.name in rule else range(d.size) for k, d in enumerate(doc.dimensions)]
        found.update(product(*choices))
    return sorted(found)


def policy_doc_id(agent_id: str, version: int | None) -> str:
    """``{agent}:v{n}`` for a version, ``{agent}:current`` for the current document."""
    return f"{agent_id}:current" if version is None else f"{agent_id}:v{version}"


def stored_policy(raw: dict[str, Any]) -> PolicyDocument:
    """A policy document read from a store; an invalid one raises :class:`StoredDocumentInvalid`
    naming the document (``invalid policy 'support:v3': logits: ...``), since the reader did not write it."""
    try:
        return PolicyDocument.from_dict(raw)
    except InvalidDocument as exc:
        name = f"policy {raw.get('id')!r}" if isinstance(raw, dict) else "policy document"  # a list has no id
        raise StoredDocumentInvalid(name, exc.problems) from None


# --------------------------------------------------------------------------- scores


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
    """The episode's context, copied by the scorer so that the trainer reads it with the reward."""
    measures: Measures | None = Field(None, exclude_if=_unset)
    """Latency, tool outcomes and tokens of the episode (judges' scores written by this version)."""
    incarnation: Incarnation | None = Field(None, exclude_if=_unset)
    """The episode's incarnation: training refuses a score of another one than its policy's."""

    @field_validator("context")
    @classmethod
    def _context(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_context(value) or None  # {} is no context

    @model_validator(mode="after")
    def _id_is_episode(self) -> Score:
        expected = correction_doc_id(self.episode_id, self.revision)
        legacy = self.revision > 0 and self.id == legacy_correction_doc_id(self.episode_id, self.revision)
        if self.id != expected and not legacy:
            what = "episode_id" if self.revision == 0 else f"the id of correction {self.revision}"
            raise ValueError(f"id: must equal {what} {expected!r}")
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


def correction_ledger_id(episode_id: str) -> str:
    """The id of an episode's :class:`CorrectionLedger`."""
    return _with_suffix(episode_id, "~ledger")


def feedback_sources_id(episode_id: str) -> str:
    """The id of the list of sources that gave feedback on an episode (where a store keeps one)."""
    return _with_suffix(episode_id, "~sources")


def _with_suffix(episode_id: str, suffix: str) -> str:
    if len(episode_id) + len(suffix) <= MAX_ID_CHARS:
        return episode_id + suffix
    return hashlib.sha256(episode_id.encode()).hexdigest() + suffix


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


# --------------------------------------------------------------------------- feedback

FeedbackSource = Annotated[str, StringConstraints(strict=True, pattern=_FEEDBACK_SOURCE)]


class Feedback(Document):
    """A user's verdict on one episode: thumbs up/down or a score in [0, 1].

    ``id`` is :func:`feedback_doc_id` of the episode and the source, so one source has one
    feedback per episode: posting again replaces it. Over HTTP the source is the caller's
    identity (:mod:`agent_learning.callers`), never a field of the request. ``value`` is the verdict on [0, 1]
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


# --------------------------------------------------------------------------- runs


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


PolicyDocument.model_rebuild()
