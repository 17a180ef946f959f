"""Exceptions shared by every layer.

The pipeline decides what to do with a failure by its class, never by its message:

* :class:`InvalidDocument` — bad input. Never retried; the item is kept for inspection
  (dead-lettered with the message as reason) and never reaches the learner.
  :class:`DocumentTooLarge` is the one whose problem is its size.
* :class:`TransientError` — worth retrying later (a judge returned 429/5xx, a timeout).
* :class:`PermanentError` — retrying cannot help (judge output invalid after retries, an
  episode that references an unknown policy version).
* :class:`ConcurrencyConflict` — an optimistic-concurrency write lost its race (stale ETag,
  or the document already exists); :class:`AlreadyExists` when one to create exists with other content.
* :class:`LimitExceeded` — the request would grow something past a documented bound.
"""

from __future__ import annotations


class AgentLearningError(Exception):
    """Base class of every error raised by this library."""


class InvalidDocument(AgentLearningError, ValueError):
    """A document or message failed validation.

    ``problems`` is a list of ``(field, problem)`` pairs; ``str()`` names every field.
    """

    def __init__(self, kind: str, problems: list[tuple[str, str]]) -> None:
        self.kind = kind
        self.problems = problems
        detail = "; ".join(f"{field}: {problem}" for field, problem in problems)
        super().__init__(f"invalid {kind}: {detail}")

    @property
    def fields(self) -> list[str]:
        return [field for field, _ in self.problems]


class StoredDocumentInvalid(InvalidDocument):
    """A document read from a store does not validate: another writer made it (an edit by hand, a
    buggy or foreign writer), so it is not the caller's bad input (the CLI exits 1, not 2)."""


class DocumentTooLarge(InvalidDocument):
    """A document over its size limit (``MAX_EPISODE_BYTES``); HTTP answers it with 413."""


class ConfigurationError(AgentLearningError, ValueError):
    """A setting is missing or invalid; the message names the environment variable."""


class TransientError(AgentLearningError):
    """A failure that may succeed on a later attempt."""


class PermanentError(AgentLearningError):
    """A failure that will not succeed on retry; the item goes to the dead-letter queue."""


class ConcurrencyConflict(AgentLearningError):
    """An optimistic-concurrency write was rejected (stale ETag or existing document)."""


class AlreadyExists(ConcurrencyConflict):
    """A document to create exists already with other content; nothing is overwritten."""


class LimitExceeded(AgentLearningError):
    """A request would grow something past a documented bound; the message names the bound."""


class NotFound(AgentLearningError, KeyError):
    """A document that must exist does not."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"
