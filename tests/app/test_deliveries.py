"""What becomes of a queue message is decided once (:mod:`agent_learning.app.deliveries`): the
Functions host and the embedded runner settle every outcome alike, each its own way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_learning.app.deliveries import (
    INVALID_MESSAGE,
    HostSettles,
    PoisonMessage,
    QueueSettles,
    TransientScoringError,
    deliver_training,
    settle_score,
)
from agent_learning.core.errors import InvalidDocument, TransientError
from agent_learning.pipeline import ScoreOutcome
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue

OUTCOMES = [
    ScoreOutcome("scored", "e0"),
    ScoreOutcome("duplicate", "e1"),
    ScoreOutcome("unjudged", "e2"),
    ScoreOutcome("retry", "e3", description="judge answered 503"),
    ScoreOutcome("dead_letter", "e4", "UnknownAction", "action 'x' is not in v1"),
]
EXPECTED = ["complete", "complete", "complete", "abandon", ("dead_letter", "UnknownAction")]


def on_host(settle: Any) -> Any:
    try:
        settle(HostSettles("score", "m", 1))
    except TransientScoringError:
        return "abandon"
    except PoisonMessage as exc:
        return ("dead_letter", exc.reason)
    return "complete"


def test_every_host_settles_a_scoring_outcome_alike(tmp_path: Path) -> None:
    queue = SQLiteQueue(str(tmp_path / "queue.db"), name="score-episodes")
    queue.send([OutgoingMessage(f"m{i}", "{}") for i in range(len(OUTCOMES))])
    messages = queue.receive(len(OUTCOMES))
    completed: list[Any] = []
    for message, outcome in zip(messages, OUTCOMES, strict=True):
        settle_score(outcome, QueueSettles(queue, message, completed), 1, 10)
    assert completed == messages[:3]  # completed together by the caller
    queue.complete_all(completed)
    counts = queue.counts()
    assert (counts.active, counts.locked, counts.dead_letter) == (1, 0, 1)  # the retry comes back
    assert [(d.reason, d.description) for d in queue.dead_letters()] == [("UnknownAction", "action 'x' is not in v1")]

    hosted = [on_host(lambda s, o=o: settle_score(o, s, 1, 10)) for o in OUTCOMES]
    assert hosted == EXPECTED


def test_a_training_message_that_is_no_training_request_is_dead_lettered_on_every_host(tmp_path: Path) -> None:
    body = '{"agent": "a"}'

    def train(raw: bytes | str) -> Any:  # as train_requested refuses it
        raise InvalidDocument("train request", [("agent_id", "missing")])

    queue = SQLiteQueue(str(tmp_path / "queue.db"), name="train-agents")
    queue.send([OutgoingMessage("t", body)])
    (message,) = queue.receive(1)
    assert deliver_training(message.body, train, QueueSettles(queue, message)) is None
    assert [d.reason for d in queue.dead_letters()] == [INVALID_MESSAGE]

    with pytest.raises(PoisonMessage) as caught:
        deliver_training(body, train, HostSettles("train_agent", "t", 1))
    assert caught.value.reason == INVALID_MESSAGE


def test_a_dead_letter_the_queue_failed_to_make_is_not_counted(tmp_path: Path, captured: Any) -> None:
    class Unreachable(SQLiteQueue):
        def dead_letter(self, message: Any, reason: str, description: str = "") -> None:
            raise TransientError("the queue is unreachable")

    queue = Unreachable(str(tmp_path / "queue.db"), name="score-episodes")
    queue.send([OutgoingMessage("m", "{}")])
    (message,) = queue.receive(1)
    with pytest.raises(TransientError):
        settle_score(OUTCOMES[-1], QueueSettles(queue, message), 1, 10)
    assert captured.total("agent_learning.episodes.dead_lettered") == 0
    with pytest.raises(PoisonMessage):  # the host dead-letters it after its last delivery: counted then
        settle_score(OUTCOMES[-1], HostSettles("score", "m", 10), 10, 10)
    assert captured.total("agent_learning.episodes.dead_lettered", reason="UnknownAction") == 1
