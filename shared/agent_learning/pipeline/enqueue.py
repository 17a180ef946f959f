"""Enqueue: one scoring message per changed episode document.

The message id is the episode id (:func:`message_id_of`), so Service Bus duplicate detection
(and the embedded queue's) drops a redelivered batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_learning.core.errors import InvalidDocument
from agent_learning.core.telemetry import EPISODES_ENQUEUED, SPAN_ENQUEUE, count, span
from agent_learning.queue.base import OutgoingMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnqueueResult:
    """What :func:`enqueue_episodes` did with a batch of changed documents."""

    received: int
    sent: int
    duplicates: int
    """Messages the queue dropped as already queued, as far as the sender can see: the embedded
    queue counts them; Service Bus drops its duplicates out of the sender's sight (always 0)."""
    failed: list[tuple[int, str]] = field(default_factory=list)


EMBED_LIMIT_CHARS = 64_000
"""Episodes up to this size (as JSON) travel inside the scoring message, saving a read."""


def score_request_message(doc: Mapping[str, Any], embed_limit: int = EMBED_LIMIT_CHARS) -> OutgoingMessage:
    """The queue message that asks for ``doc`` to be scored. Its id is the episode id.

    The episode is not validated here: a malformed episode is rejected by the scorer, which
    dead-letters it with the reason, so every bad document ends up somewhere visible.
    """
    episode_id = doc.get("id")
    if not isinstance(episode_id, str) or not episode_id:
        raise InvalidDocument("episode", [("id", "missing or not a string; the document cannot be referenced")])
    body: dict[str, Any] = {"type": "score_request", "episode_id": episode_id}
    props: dict[str, str | int | float | bool] = {}
    agent_id = doc.get("agent_id")
    # Only an id of a plausible length (agent ids have at most 128 characters): a document may
    # hold anything up to 2 MB, and a message Service Bus cannot take would block the batch.
    if isinstance(agent_id, str) and len(agent_id) <= 128:
        body["agent_id"] = agent_id
        props["agent_id"] = agent_id
    episode = {k: v for k, v in doc.items() if not (isinstance(k, str) and k.startswith("_"))}
    try:
        text = json.dumps(episode, allow_nan=True)
    except (TypeError, ValueError):
        text = None
    payload = json.dumps(body, allow_nan=True)
    if text is not None and len(text) <= embed_limit:  # as "episode" last in the body: encoded once
        payload = f'{payload[:-1]}, "episode": {text}}}'
    return OutgoingMessage(message_id=message_id_of(episode_id), body=payload, properties=props)


def message_id_of(episode_id: str) -> str:
    """The scoring message id of an episode: its id, or the id's SHA-256 when longer than the
    128 characters Service Bus allows (Cosmos ids may have 255)."""
    return episode_id if len(episode_id) <= 128 else hashlib.sha256(episode_id.encode()).hexdigest()


def enqueue_episodes(docs: Iterable[Mapping[str, Any]], send: Callable[[list[OutgoingMessage]], int]) -> EnqueueResult:
    """Send one scoring message per changed episode document.

    ``send`` is the queue's batch send (``WorkQueue.send`` or a Service Bus sender). A
    document that cannot be turned into a message is reported in ``failed`` and does not
    stop the rest of the batch.
    """
    messages: list[OutgoingMessage] = []
    failed: list[tuple[int, str]] = []
    received = 0
    with span(SPAN_ENQUEUE) as sp:
        for i, doc in enumerate(docs):
            received += 1
            try:
                if not isinstance(doc, Mapping):
                    raise InvalidDocument(
                        "episode", [("(document)", f"must be a JSON object, got {type(doc).__name__}")]
                    )
                messages.append(score_request_message(doc))
            except InvalidDocument as exc:
                log.error("not enqueued: document %d of the batch: %s", i, exc)
                failed.append((i, str(exc)))
        sent = send(messages) if messages else 0
        count(EPISODES_ENQUEUED, sent)
        for key, value in {"received": received, "sent": sent, "failed": len(failed)}.items():
            sp.set_attribute(key, value)
    return EnqueueResult(received=received, sent=sent, duplicates=len(messages) - sent, failed=failed)


