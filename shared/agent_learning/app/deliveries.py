"""What becomes of a queue message, decided in one place for every host.

A scoring message is scored (:func:`~agent_learning.pipeline.score.score_message`) and its
outcome settles it: ``scored``, ``duplicate`` and ``unjudged`` complete it, ``retry`` abandons it
(it is delivered again), ``dead_letter`` dead-letters it with the reason. A training message is
trained; any outcome completes it (the next tick plans again), a body that is not a training
request is dead-lettered. :func:`settle_score` and :func:`deliver_training` make those choices and
count and log them; a :class:`Settler` carries them out the host's way:

* :class:`HostSettles` for Azure Functions, which settles the message from what the function
  does: returning completes it, raising :class:`TransientScoringError` has it delivered again, and
  :class:`PoisonMessage` fails every delivery fast until Service Bus dead-letters it after
  MaxDeliveryCount (a function cannot dead-letter a message itself);
* :class:`QueueSettles` for the embedded runner, which settles on its queue; completions wait in a
  list so that a batch is completed together (one commit on the embedded queue).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent_learning.core.errors import AgentLearningError, ConcurrencyConflict, InvalidDocument
from agent_learning.core.telemetry import EPISODES_DEAD_LETTERED, count

if TYPE_CHECKING:  # the pipeline reaches pydantic: the Functions app imports this module at start-up
    from agent_learning.pipeline import ScoreOutcome, TrainOutcome
    from agent_learning.queue.base import WorkQueue

log = logging.getLogger(__name__)

COMPLETED = ("scored", "duplicate", "unjudged")
"""The scoring outcomes whose message is completed."""
INVALID_MESSAGE = "InvalidMessage"
"""The dead-letter reason of a training message whose body is not a training request."""

class TransientScoringError(AgentLearningError):
    """Scoring failed for a reason that may pass; the message is redelivered."""


class PoisonMessage(AgentLearningError):
    """A message that can never be processed; raised on every delivery so the Functions host
    fails it fast, and Service Bus dead-letters it after MaxDeliveryCount deliveries."""

    def __init__(self, reason: str, description: str) -> None:
        self.reason = reason
        self.description = description
        super().__init__(f"{reason}: {description}")


class Settler(Protocol):
    """How a host settles the message it delivered."""

    explicit: bool
    """Whether a dead letter happens now (the host can dead-letter), or only when the message fails
    its last allowed delivery (Azure Functions): what is counted as dead-lettered depends on it."""

    def complete(self) -> None: ...

    def abandon(self, description: str) -> None: ...

    def dead_letter(self, reason: str, description: str) -> None: ...


class HostSettles:
    """Azure Functions: returning completes the message, raising redelivers it or fails it fast;
    each is logged, as the host's log is where an operator looks."""

    explicit = False

    def __init__(self, what: str, message_id: str | None, delivery_count: int) -> None:
        self.what, self.message_id, self.delivery_count = what, message_id, delivery_count

    def complete(self) -> None:
        """The host completes the message when the function returns."""

    def abandon(self, description: str) -> None:
        log.warning("%s %s: delivery %d failed, will retry: %s", self.what, self.message_id, self.delivery_count,
                    description)
        raise TransientScoringError(description)

    def dead_letter(self, reason: str, description: str) -> None:
        log.error("%s %s: poison message (delivery %d): %s: %s", self.what, self.message_id, self.delivery_count,
                  reason, description)
        raise PoisonMessage(reason, description)


class QueueSettles:
    """The embedded runner: settles ``message`` on ``queue``; a completion waits in ``completed``
    when one is given (the caller completes the batch together), else it completes at once."""

    explicit = True

    def __init__(self, queue: WorkQueue, message: Any, completed: list[Any] | None = None) -> None:
        self.queue, self.message, self.completed = queue, message, completed

    def complete(self) -> None:
        if self.completed is None:
            self.queue.complete(self.message)
        else:
            self.completed.append(self.message)

    def abandon(self, description: str) -> None:
        self.queue.abandon(self.message)

    def dead_letter(self, reason: str, description: str) -> None:
        self.queue.dead_letter(self.message, reason, description)


def settle_score(outcome: ScoreOutcome, settler: Settler, delivery_count: int, max_deliveries: int | None) -> None:
    """Settle a scoring message by its outcome, counting what is dead-lettered by it.

    Raises what the settler raises: under Azure Functions the exception the host settles by; on a
    queue :class:`ConcurrencyConflict` when the message's lock expired (it comes back, and is
    counted as under Azure Functions: dead-lettered only after its last allowed delivery)."""
    try:
        if outcome.status in COMPLETED:
            settler.complete()
        elif outcome.status == "retry":
            settler.abandon(outcome.description)
        else:
            settler.dead_letter(outcome.reason, outcome.description)
    except ConcurrencyConflict:
        count_dead_letter(outcome.status, outcome.reason, delivery_count, max_deliveries, explicit=False)
        raise
    except (TransientScoringError, PoisonMessage):  # raised to the host, which settles the message by them
        count_dead_letter(outcome.status, outcome.reason, delivery_count, max_deliveries, explicit=settler.explicit)
        raise
    count_dead_letter(outcome.status, outcome.reason, delivery_count, max_deliveries, explicit=settler.explicit)


def scoring_failed(delivery_count: int, max_deliveries: int | None) -> None:
    """Count a scoring attempt that raised: the message comes back (its lock expires, or the host
    abandons it), and on its last allowed delivery the queue dead-letters it, as a retry is."""
    count_dead_letter("retry", "", delivery_count, max_deliveries, explicit=False)


def count_dead_letter(status: str, reason: str, delivery_count: int, max_deliveries: int | None, *,
                      explicit: bool) -> None:
    """Count a message that is dead-lettered now: explicitly (``explicit``: the host can dead-letter,
    as the embedded runner does), or by failing its last allowed delivery (as under Azure Functions,
    which cannot dead-letter a message itself)."""
    last = max_deliveries is not None and delivery_count >= max_deliveries
    if (status == "dead_letter" and (explicit or last)) or (status == "retry" and last):
        count(EPISODES_DEAD_LETTERED, 1, {"reason": reason if status == "dead_letter" else "MaxDeliveryCountExceeded"})


def deliver_training(
    body: bytes | str, train: Callable[[bytes | str], TrainOutcome], settler: Settler
) -> TrainOutcome | None:
    """Train the agent a training message names (``train(body)``) and settle the message: every
    outcome completes it, a body that is not a training request is dead-lettered
    (:data:`INVALID_MESSAGE`; returns ``None``)."""
    try:
        outcome = train(body)
    except InvalidDocument as exc:
        settler.dead_letter(INVALID_MESSAGE, str(exc))
        return None
    try:
        settler.complete()
    except ConcurrencyConflict as exc:
        log.warning("training %s outlasted its message's lock (%s); it is trained again, changing nothing",
                    outcome.agent_id, exc)
    return outcome
