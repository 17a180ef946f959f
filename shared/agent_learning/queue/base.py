"""The work-queue port: what the scoring pipeline needs from a message queue.

In Azure the adapter is Service Bus; locally it is :class:`~agent_learning.queue.SQLiteQueue`.
Both follow Service Bus queue semantics in peek-lock mode, so one handler runs on either.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument
from agent_learning.documents import NOT_UNICODE, is_unicode

PropertyValue = str | int | float | bool
"""The types an application property may have (an ``int`` within 64 bits, as AMQP carries it)."""

PROPERTY_INT_RANGE = range(-(2**63), 2**63)
"""The integers an application property can carry (an AMQP long)."""

MAX_MESSAGE_ID_CHARS = 128
"""Service Bus rejects longer message ids."""

MAX_DEAD_LETTER_TEXT_CHARS = 4096
"""Service Bus's limit on a dead-letter reason and on a description (its .NET and JavaScript SDKs
refuse longer ones); every adapter cuts longer text to it (see :func:`dead_letter_text`)."""

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"
"""Dead-letter reason of a message delivered ``max_deliveries`` times (the Service Bus string)."""


def dead_letter_text(text: str) -> str:
    """``text`` as a dead-letter reason or description can hold it: a lone surrogate escaped, and
    cut to :data:`MAX_DEAD_LETTER_TEXT_CHARS` characters, the last one "…", when longer."""
    if not is_unicode(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_DEAD_LETTER_TEXT_CHARS:
        text = text[: MAX_DEAD_LETTER_TEXT_CHARS - 1] + "…"
    return text


@dataclass(frozen=True)
class OutgoingMessage:
    """A message to send. ``body`` is JSON text; ``properties`` are application properties."""

    message_id: str
    body: str
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if not isinstance(self.message_id, str):
            problems.append(("message_id", "must be a string"))
        elif not 1 <= len(self.message_id) <= MAX_MESSAGE_ID_CHARS:
            problems.append(("message_id", f"must be 1 to {MAX_MESSAGE_ID_CHARS} characters"))
        elif not is_unicode(self.message_id):
            problems.append(("message_id", NOT_UNICODE))
        if not isinstance(self.body, str):
            problems.append(("body", "must be a string (JSON text)"))
        elif not is_unicode(self.body):
            problems.append(("body", NOT_UNICODE))
        if not isinstance(self.properties, Mapping):
            problems.append(("properties", "must be a mapping"))
        else:
            for key, value in self.properties.items():
                if not isinstance(key, str) or not key:
                    problems.append(("properties", f"key {key!r} must be a non-empty string"))
                elif not is_unicode(key):
                    problems.append(("properties", f"key {key!r} {NOT_UNICODE}"))
                elif not isinstance(value, str | int | float | bool):
                    problems.append((f"properties.{key}", f"unsupported type {type(value).__name__}"))
                elif isinstance(value, str) and not is_unicode(value):
                    problems.append((f"properties.{key}", NOT_UNICODE))
                elif isinstance(value, int) and value not in PROPERTY_INT_RANGE:
                    problems.append((f"properties.{key}", "integer does not fit in 64 bits"))
            # A private copy: the caller mutating its dict later must not change the message.
            object.__setattr__(self, "properties", dict(self.properties))
        if problems:
            raise InvalidDocument("message", problems)


@dataclass(frozen=True)
class ReceivedMessage:
    """A message delivered under a lock; settle it with complete, abandon or dead_letter."""

    message_id: str
    body: bytes
    properties: Mapping[str, PropertyValue]
    delivery_count: int  # 1 on first delivery
    lock_token: str  # changes on every delivery
    enqueued_at: float  # epoch seconds
    locked_until: float  # epoch seconds


@dataclass(frozen=True)
class DeadLetter:
    """A message in the dead-letter sub-queue, with why it is there."""

    message_id: str
    body: bytes
    properties: Mapping[str, PropertyValue]
    delivery_count: int
    reason: str
    description: str
    dead_lettered_at: float


@dataclass(frozen=True)
class QueueCounts:
    """How many messages a queue holds."""

    active: int  # available now or locked
    locked: int  # currently locked (subset of active)
    dead_letter: int


LOCK_SECONDS = 60.0
"""A queue's message lock when nothing else says (Service Bus's default LockDuration)."""
MAX_DELIVERIES = 10
"""Deliveries of a message before it is dead-lettered, when nothing else says (Service Bus's default)."""


class WorkQueue(ABC):
    """A queue with Azure Service Bus peek-lock semantics.

    * At-least-once delivery. :meth:`receive` locks each returned message for the queue's lock
      duration and increments its delivery count (1 on the first delivery); a locked message is
      invisible to other receivers. When the lock expires without settlement the message is
      receivable again, with a new lock token.
    * Settlement takes the :class:`ReceivedMessage` and needs its lock to still be held:
      :meth:`complete` removes the message, :meth:`abandon` releases the lock at once,
      :meth:`dead_letter` moves it to the dead-letter sub-queue with a reason and description.
      A lock that expired, or a message already settled or received again, raises
      :class:`~agent_learning.core.errors.ConcurrencyConflict` ("lock lost", like Service Bus's
      ``MessageLockLostError``).
    * A message is delivered at most ``max_deliveries`` times (Service Bus MaxDeliveryCount):
      when a message that has reached it is abandoned or its lock expires, it is dead-lettered
      with reason ``"MaxDeliveryCountExceeded"``.
    * Duplicate detection: a message whose ``message_id`` was sent within the duplicate-detection
      window is accepted silently but not enqueued again; :meth:`send` returns how many were
      enqueued.
    * :meth:`receive` returns available messages in FIFO order of enqueueing.
    """

    name: str
    """The queue's name (on Service Bus the entity's): ``score-episodes``, ``train-agents``."""

    lock_seconds: float = LOCK_SECONDS
    """How long a received message stays locked (on Service Bus the queue's LockDuration decides;
    this is what the receiver plans with)."""

    @abstractmethod
    def send(self, messages: Iterable[OutgoingMessage]) -> int:
        """Enqueue messages atomically; returns how many were enqueued (duplicates not counted)."""

    @abstractmethod
    def receive(self, max_messages: int = 1) -> list[ReceivedMessage]:
        """Lock and return up to ``max_messages`` (>= 1) available messages, oldest first; may be empty."""

    @abstractmethod
    def complete(self, message: ReceivedMessage) -> None:
        """Remove a received message from the queue."""

    def complete_all(self, messages: Sequence[ReceivedMessage]) -> list[ReceivedMessage]:
        """:meth:`complete` each message; returns those whose lock was lost (for which :meth:`complete`
        raises :class:`~agent_learning.core.errors.ConcurrencyConflict`), in order. The embedded queue
        completes them all in one transaction."""
        lost = []
        for message in messages:
            try:
                self.complete(message)
            except ConcurrencyConflict:
                lost.append(message)
        return lost

    @abstractmethod
    def abandon(self, message: ReceivedMessage) -> None:
        """Release the lock now so the message can be received again (or dead-letter it at the limit)."""

    @abstractmethod
    def dead_letter(self, message: ReceivedMessage, reason: str, description: str = "") -> None:
        """Move a received message to the dead-letter sub-queue.

        ``reason`` and ``description`` longer than :data:`MAX_DEAD_LETTER_TEXT_CHARS` are cut to it.
        """

    @abstractmethod
    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters, oldest first."""

    @abstractmethod
    def replay_dead_letters(self, message_ids: Iterable[str] | None = None) -> int:
        """Move dead letters (all, or the given ids) back to the queue with delivery count reset to 0.

        Returns how many were moved. Replay bypasses duplicate detection.
        """

    @abstractmethod
    def counts(self) -> QueueCounts:
        """Active, locked and dead-lettered message counts."""

    @abstractmethod
    def oldest_enqueued_at(self) -> float | None:
        """When the oldest message in the queue (available or locked, not dead-lettered) was
        enqueued, in epoch seconds; ``None`` when the queue holds none. Takes no lock."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources; the queue must not be used afterwards."""

    def __enter__(self) -> WorkQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
