"""What every document kind shares: the schema versions, size caps, id and value types with
their patterns and plain-sentence rules, and the checks of free-form JSON and of Unicode text."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from agent_learning.core.limits import AGENT_ID_PATTERN as _ID
from agent_learning.core.limits import AGENT_ID_RULE as AGENT_ID_RULE
from agent_learning.core.limits import DEFAULT_EXPLORATION_FLOOR as DEFAULT_EXPLORATION_FLOOR
from agent_learning.core.limits import DEFAULT_TEMPERATURE as DEFAULT_TEMPERATURE
from agent_learning.core.limits import DOC_ID_PATTERN as _DOC_ID
from agent_learning.core.limits import DOC_ID_RULE as DOC_ID_RULE
from agent_learning.core.limits import MAX_TEMPERATURE as MAX_TEMPERATURE
from agent_learning.core.limits import MIN_TEMPERATURE as MIN_TEMPERATURE
from agent_learning.core.limits import agent_id_problem as agent_id_problem
from agent_learning.core.limits import episode_id_problem as episode_id_problem

SCHEMA_VERSION = 2
"""The newest schema this library understands. Documents are written with the oldest schema
that holds them: 1, except policies with dimensions, exclusions or context features (2), so
that a library that knows only schema 1 keeps reading every document it could read before and
refuses a structured policy with "upgrade agent-learning" instead of misreading it."""
STRUCTURED_SCHEMA = 2
"""The schema of a policy with ``dimensions``, ``excluded`` or ``features``."""
JOINT_SEPARATOR = ":"
"""Joins the values' ids into a configuration's id: ``prompt=concise:retrieval_k=3``."""

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
Version = Annotated[int, Field(strict=True, ge=1)]
Count = Annotated[int, Field(strict=True, ge=0)]
MAX_METADATA_VALUE_CHARS = 256
DimensionName = Annotated[str, StringConstraints(strict=True, pattern=_DIMENSION_NAME)]
FeedbackSource = Annotated[str, StringConstraints(strict=True, pattern=_FEEDBACK_SOURCE)]

_PATTERN_RULES = {
    _ID: AGENT_ID_RULE,
    _ACTION_ID: ACTION_ID_RULE,
    _DOC_ID: DOC_ID_RULE,
    _FEEDBACK_SOURCE: FEEDBACK_SOURCE_RULE,
    _DIMENSION_NAME: DIMENSION_NAME_RULE,
    _INCARNATION: INCARNATION_RULE,
}
"""Plain sentences for the id patterns, in place of pydantic's "String should match pattern '…'"."""


def _unset(value: Any) -> bool:
    """Fields added after documents without them were stored are written only when set, so that a
    document that does not use one is written exactly as before (older readers, which refuse
    unknown fields, still read it)."""
    return value is None


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


def _with_suffix(episode_id: str, suffix: str) -> str:
    if len(episode_id) + len(suffix) <= MAX_ID_CHARS:
        return episode_id + suffix
    return hashlib.sha256(episode_id.encode()).hexdigest() + suffix
