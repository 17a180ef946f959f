"""Work queues with Azure Service Bus peek-lock semantics: the port and the SQLite adapter."""

from agent_learning.queue.base import (
    MAX_DEAD_LETTER_TEXT_CHARS,
    MAX_DELIVERY_COUNT_EXCEEDED,
    DeadLetter,
    OutgoingMessage,
    QueueCounts,
    ReceivedMessage,
    WorkQueue,
)
from agent_learning.queue.sqlite import SQLiteQueue

__all__ = [
    "MAX_DEAD_LETTER_TEXT_CHARS",
    "MAX_DELIVERY_COUNT_EXCEEDED",
    "DeadLetter",
    "OutgoingMessage",
    "QueueCounts",
    "ReceivedMessage",
    "SQLiteQueue",
    "WorkQueue",
]
