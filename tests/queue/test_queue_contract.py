"""The queue port's contract, written once and run against every adapter (the ``queue`` fixture of
tests/support/adapters.py).

Each test asserts a documented semantic of :mod:`agent_learning.queue.base` (Service Bus peek-lock)
that an adapter could get wrong. What only one adapter does is tested in its own file: lock expiry on
a manual clock, the duplicate-detection window and the file on SQLite (``test_sqlite_queue.py``);
batching, the wire format, broker errors, real-time lock expiry and timeouts on Service Bus
(``test_servicebus_queue.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from adapters import MAX_DELIVERIES, QueueUnderTest

from agent_learning.core.errors import ConcurrencyConflict
from agent_learning.queue import (
    MAX_DEAD_LETTER_TEXT_CHARS,
    MAX_DELIVERY_COUNT_EXCEEDED,
    DeadLetter,
    OutgoingMessage,
    QueueCounts,
    ReceivedMessage,
    WorkQueue,
)


def msg(message_id: str, body: str = "{}", **properties: Any) -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id, body=body, properties=properties)


def ids(messages: list[ReceivedMessage] | list[DeadLetter]) -> list[str]:
    return [m.message_id for m in messages]


# -- sending and receiving ---------------------------------------------------------------------


def test_is_a_work_queue(queue: QueueUnderTest) -> None:
    assert isinstance(queue.queue, WorkQueue)


def test_fifo_order_and_locked_messages_are_skipped(queue: QueueUnderTest) -> None:
    q = queue.queue
    assert q.send(msg(f"m{i}") for i in range(5)) == 5
    first = queue.receive_exactly(2)
    assert ids(first) == ["m0", "m1"]
    assert ids(queue.receive_exactly(3)) == ["m2", "m3", "m4"]
    assert q.receive(10) == []


def test_received_message_fields(queue: QueueUnderTest) -> None:
    queue.queue.send([msg("a", '{"x": 1}', k="v")])
    [m] = queue.queue.receive()
    assert (m.message_id, m.body, m.properties) == ("a", b'{"x": 1}', {"k": "v"})
    assert m.delivery_count == 1  # counted from 1 (the Service Bus SDK reports previous attempts)
    assert m.lock_token


def test_properties_round_trip(queue: QueueUnderTest) -> None:
    properties = {"s": "ünï", "i": -(2**53), "f": 1.0, "t": True, "false": False, "zero": 0}
    queue.queue.send([OutgoingMessage("a", "[]", properties), OutgoingMessage("b", "[]")])
    a, b = queue.receive_exactly(2)
    assert a.properties == properties
    assert [type(v) for v in a.properties.values()] == [type(v) for v in properties.values()]
    assert b.properties == {}


def test_receive_and_send_validate(queue: QueueUnderTest) -> None:
    q = queue.queue
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_messages"):
            q.receive(bad)
    with pytest.raises(TypeError):
        q.send(["not a message"])  # type: ignore[list-item]
    assert q.send([]) == 0


def test_close_is_idempotent_and_the_queue_refuses_use_afterwards(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a")])
    [m] = q.receive()
    with q:
        pass
    q.close()
    for call in (lambda: q.receive(), lambda: q.send([msg("b")]), lambda: q.dead_letters()):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    with pytest.raises(RuntimeError, match="closed"):
        q.complete(m)


# -- settling ----------------------------------------------------------------------------------


def test_complete_removes(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a"), msg("b")])
    [a, b] = queue.receive_exactly(2)
    q.complete(a)
    assert q.counts() == QueueCounts(active=1, locked=1, dead_letter=0)
    q.complete(b)
    assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=0)
    assert q.receive() == []


def test_complete_all_removes_every_message_it_holds_the_lock_of_and_returns_the_others(
    queue: QueueUnderTest,
) -> None:
    q = queue.queue
    q.send([msg("a"), msg("b"), msg("c")])
    [a, b, c] = queue.receive_exactly(3)
    q.complete(b)  # settled already: its lock is gone
    assert q.complete_all([a, b, c]) == [b]
    assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=0)
    assert q.complete_all([]) == []


def test_abandon_redelivers_at_the_head_with_the_delivery_count_raised(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a"), msg("b")])
    [a] = q.receive()
    q.abandon(a)
    again = queue.receive_exactly(2)
    assert ids(again) == ["a", "b"]  # keeps its place at the head of the queue
    assert [m.delivery_count for m in again] == [2, 1]
    assert again[0].lock_token != a.lock_token


def test_settling_twice_or_with_an_unknown_token_raises_concurrency_conflict(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a"), msg("b")])
    [a, b] = queue.receive_exactly(2)
    q.complete(a)
    for settle in (q.complete, q.abandon, lambda m: q.dead_letter(m, "r")):
        with pytest.raises(ConcurrencyConflict, match="lock lost for message 'a'"):
            settle(a)
    with pytest.raises(ConcurrencyConflict):
        q.complete(dataclasses.replace(b, lock_token="00000000-0000-0000-0000-000000000000"))
    q.dead_letter(b, "r")
    with pytest.raises(ConcurrencyConflict):
        q.abandon(b)


def test_counts(queue: QueueUnderTest) -> None:
    q = queue.queue
    assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=0)
    q.send(msg(f"m{i}") for i in range(5))
    received = queue.receive_exactly(3)
    assert q.counts() == QueueCounts(active=5, locked=3, dead_letter=0)
    q.complete(received[0])
    q.dead_letter(received[1], "r")
    assert q.counts() == QueueCounts(active=3, locked=1, dead_letter=1)


def test_oldest_enqueued_at_is_the_oldest_message_held_locked_or_not_and_none_when_empty(
    queue: QueueUnderTest,
) -> None:
    q = queue.queue
    assert q.oldest_enqueued_at() is None
    q.send([msg("m0")])
    q.send([msg("m1")])
    first, second = queue.receive_exactly(2)
    assert q.oldest_enqueued_at() == pytest.approx(first.enqueued_at, abs=0.002)  # locked, still held
    assert first.enqueued_at <= second.enqueued_at
    q.complete(first)
    assert q.oldest_enqueued_at() == pytest.approx(second.enqueued_at, abs=0.002)
    q.dead_letter(second, "r")
    assert q.oldest_enqueued_at() is None  # dead letters are not in the queue


# -- dead letters ------------------------------------------------------------------------------


def test_max_deliveries_via_abandon(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a", "{}", k="v")])
    for expected in range(1, MAX_DELIVERIES + 1):
        [m] = q.receive()
        assert m.delivery_count == expected
        q.abandon(m)
    assert q.receive() == []
    [dead] = q.dead_letters()
    assert dead.message_id == "a"
    assert dead.reason == MAX_DELIVERY_COUNT_EXCEEDED == "MaxDeliveryCountExceeded"
    assert dead.delivery_count == MAX_DELIVERIES
    assert dead.properties == {"k": "v"}
    assert str(MAX_DELIVERIES) in dead.description
    assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=1)


def test_explicit_dead_letter_keeps_everything(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a", '{"episode": "é"}', agent="x", n=3, ok=True, w=0.5)])
    [m] = q.receive()
    q.dead_letter(m, "InvalidDocument", "steps[2].latency_ms: not a number")
    assert q.receive() == []
    [dead] = q.dead_letters()
    assert dead.message_id == "a"
    assert dead.body == '{"episode": "é"}'.encode()
    assert dead.properties == {"agent": "x", "n": 3, "ok": True, "w": 0.5}
    assert (dead.reason, dead.description) == ("InvalidDocument", "steps[2].latency_ms: not a number")
    assert dead.delivery_count == 1
    assert q.dead_letters() == [dead]  # listing takes no lock and changes nothing


def test_dead_letter_reason_and_description_are_cut_to_what_service_bus_takes(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a"), msg("b")])
    a, b = queue.receive_exactly(2)
    problems = "; ".join(f"steps[{i}].latency_ms: Input should be a valid number" for i in range(256))
    q.dead_letter(a, "InvalidEpisode", problems)  # ~14,000 characters
    q.dead_letter(b, "R" * 5000, "lone \ud800")
    dead_a, dead_b = q.dead_letters()
    assert len(dead_a.description) == MAX_DEAD_LETTER_TEXT_CHARS == 4096
    assert dead_a.description == problems[:4095] + "…"
    assert (len(dead_b.reason), dead_b.description) == (4096, "lone \\ud800")


def test_dead_letters_are_listed_oldest_first_up_to_limit(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send(msg(f"m{i}") for i in range(4))
    for m in queue.receive_exactly(4):
        q.dead_letter(m, "r")
    assert ids(q.dead_letters()) == ["m0", "m1", "m2", "m3"]
    assert ids(q.dead_letters(limit=3)) == ["m0", "m1", "m2"]
    with pytest.raises(ValueError, match="limit"):
        q.dead_letters(limit=0)


def test_replay_moves_selected_ids_back_with_delivery_count_reset(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send(msg(f"m{i}", f'{{"i": {i}}}', i=i) for i in range(4))
    for m in queue.receive_exactly(4):
        q.abandon(m)
    for m in queue.receive_exactly(4):
        assert m.delivery_count == 2
        q.dead_letter(m, "oops")
    assert q.replay_dead_letters(["m1", "m3", "unknown"]) == 2
    assert ids(q.dead_letters()) == ["m0", "m2"]
    back = queue.receive_exactly(2)
    assert [(m.message_id, m.delivery_count, m.body, m.properties) for m in back] == [
        ("m1", 1, b'{"i": 1}', {"i": 1}),
        ("m3", 1, b'{"i": 3}', {"i": 3}),
    ]
    assert q.replay_dead_letters() == 2
    assert q.counts() == QueueCounts(active=4, locked=2, dead_letter=0)
    assert q.replay_dead_letters() == 0
    assert q.replay_dead_letters([]) == 0
    with pytest.raises(TypeError):
        q.replay_dead_letters("m0")
    rest = queue.receive_exactly(2)  # in no promised order on Service Bus (in order on SQLite: its own file)
    assert sorted((m.message_id, m.delivery_count) for m in rest) == [("m0", 1), ("m2", 1)]


def test_a_replayed_message_dead_lettered_again_keeps_its_id(queue: QueueUnderTest) -> None:
    q = queue.queue
    q.send([msg("a", k="v")])
    q.dead_letter(q.receive()[0], "first")
    q.replay_dead_letters()
    q.dead_letter(q.receive()[0], "second")
    [dead] = q.dead_letters()
    assert (dead.message_id, dead.reason, dead.properties) == ("a", "second", {"k": "v"})
    assert q.replay_dead_letters(["a"]) == 1
    assert ids(q.receive()) == ["a"]
