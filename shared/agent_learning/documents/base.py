""":class:`Document`, the base of every stored document, and pydantic's errors turned into an
:class:`~agent_learning.core.errors.InvalidDocument` naming each field."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent_learning.core.errors import DocumentTooLarge, InvalidDocument
from agent_learning.documents.fields import _PATTERN_RULES, NOT_UNICODE, SCHEMA_VERSION, parse_json

D = TypeVar("D", bound="Document")


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


_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.S)
