"""SQLiteQueue: what only the embedded adapter does (the queue contract, run over every adapter, is
tests/queue/test_queue_contract.py): lock expiry on a manual clock, the duplicate-detection window,
the file (WAL, several queues and objects on one file, threads and processes), and a state-machine
model of the whole port."""

from __future__ import annotations

import dataclasses
import multiprocessing
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, TransientError
from agent_learning.queue import (
    MAX_DELIVERY_COUNT_EXCEEDED,
    OutgoingMessage,
    QueueCounts,
    ReceivedMessage,
    SQLiteQueue,
    WorkQueue,
)

LOCK = 30.0
WINDOW = 600.0


def msg(message_id: str, body: str = "{}", **properties: Any) -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id, body=body, properties=properties)


def ids(messages: list[ReceivedMessage]) -> list[str]:
    return [m.message_id for m in messages]


@pytest.fixture
def queue(tmp_path: Path, clock: ManualClock) -> Iterator[SQLiteQueue]:
    q = SQLiteQueue(
        tmp_path / "queue.db",
        lock_seconds=LOCK,
        max_deliveries=3,
        duplicate_window_seconds=WINDOW,
        clock=clock,
    )
    yield q
    q.close()


def test_is_a_work_queue_in_wal_mode(queue: SQLiteQueue, tmp_path: Path) -> None:
    assert isinstance(queue, WorkQueue)
    with sqlite3.connect(tmp_path / "queue.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables and all(name.startswith("queue_") for name in tables)


def test_received_message_times(queue: SQLiteQueue, clock: ManualClock) -> None:
    sent_at = clock.time()
    queue.send([msg("a", '{"x": 1}')])
    clock.advance(5)
    [m] = queue.receive()
    assert m.enqueued_at == sent_at
    assert m.locked_until == clock.time() + LOCK


def test_lock_hides_message_until_expiry_then_redelivers(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send([msg("a")])
    [first] = queue.receive()
    clock.advance(LOCK - 0.001)
    assert queue.receive() == []
    clock.advance(0.001)
    [second] = queue.receive()
    assert second.message_id == "a"
    assert second.delivery_count == 2
    assert second.lock_token != first.lock_token
    assert second.locked_until == clock.time() + LOCK


def test_a_completed_message_does_not_come_back_when_its_lock_would_have_expired(
    queue: SQLiteQueue, clock: ManualClock
) -> None:
    queue.send([msg("a"), msg("b")])
    [a] = queue.receive()
    queue.complete(a)
    assert queue.counts() == QueueCounts(active=1, locked=0, dead_letter=0)
    clock.advance(LOCK * 2)
    assert ids(queue.receive(10)) == ["b"]


def test_settling_with_a_stale_lock_raises(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send([msg("a")])
    [old] = queue.receive()
    clock.advance(LOCK)
    [new] = queue.receive()  # redelivered to "someone else"
    for settle in (queue.complete, queue.abandon, lambda m: queue.dead_letter(m, "bad")):
        with pytest.raises(ConcurrencyConflict, match="lock lost for message 'a'"):
            settle(old)
    for forged in ("garbage", "0:" + new.lock_token, new.lock_token + "0"):
        with pytest.raises(ConcurrencyConflict):
            queue.complete(dataclasses.replace(new, lock_token=forged))
    queue.complete(new)
    with pytest.raises(ConcurrencyConflict, match="lock lost for message 'a'"):
        queue.complete(new)  # already settled
    assert queue.counts() == QueueCounts(active=0, locked=0, dead_letter=0)


def test_expired_lock_cannot_settle_even_if_not_redelivered(queue: SQLiteQueue, clock: ManualClock) -> None:
    """Like Service Bus: once the lock expires, settlement fails and the message stays queued."""
    queue.send([msg("a")])
    [m] = queue.receive()
    clock.advance(LOCK + 1)
    with pytest.raises(ConcurrencyConflict, match="lock expired"):
        queue.complete(m)
    assert queue.counts() == QueueCounts(active=1, locked=0, dead_letter=0)
    assert queue.receive()[0].delivery_count == 2


def test_max_deliveries_via_lock_expiry(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send([msg("a")])
    for expected in (1, 2, 3):
        [m] = queue.receive()
        assert m.delivery_count == expected
        clock.advance(LOCK)
    queue.send([msg("b")])
    assert ids(queue.receive(10)) == ["b"]  # "a" is dead-lettered, not delivered a 4th time
    [dead] = queue.dead_letters()
    assert (dead.message_id, dead.reason, dead.delivery_count) == ("a", MAX_DELIVERY_COUNT_EXCEEDED, 3)
    assert dead.dead_lettered_at == clock.time()


def test_counts_reflect_an_expired_lock_at_the_limit(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send([msg("a")])
    for _ in range(3):
        queue.receive()
        clock.advance(LOCK)
    assert queue.counts() == QueueCounts(active=0, locked=0, dead_letter=1)


def test_a_dead_letter_is_stamped_when_it_was_dead_lettered(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send([msg("a")])
    [m] = queue.receive()
    clock.advance(2)
    queue.dead_letter(m, "InvalidDocument", "steps[2].latency_ms: not a number")
    [dead] = queue.dead_letters()
    assert dead.dead_lettered_at == clock.time()


def test_replaying_everything_keeps_the_dead_letter_order(queue: SQLiteQueue) -> None:
    queue.send(msg(f"m{i}") for i in range(3))
    for m in queue.receive(3):
        queue.dead_letter(m, "oops")
    assert queue.replay_dead_letters() == 3
    assert [(m.message_id, m.delivery_count) for m in queue.receive(10)] == [("m0", 1), ("m1", 1), ("m2", 1)]


def test_replay_bypasses_duplicate_detection(queue: SQLiteQueue) -> None:
    queue.send([msg("a")])
    [m] = queue.receive()
    queue.dead_letter(m, "r")
    assert queue.send([msg("a")]) == 0  # still within the window
    assert queue.replay_dead_letters() == 1
    assert ids(queue.receive(10)) == ["a"]


def test_duplicate_detection_within_window_and_after(queue: SQLiteQueue, clock: ManualClock) -> None:
    assert queue.send([msg("a"), msg("b"), msg("a")]) == 2  # a duplicate within one batch too
    [a, _] = queue.receive(2)
    queue.complete(a)  # history outlives the message itself
    clock.advance(WINDOW - 1)
    assert queue.send([msg("a", "other"), msg("c")]) == 1
    clock.advance(1)
    assert queue.send([msg("a", "again")]) == 1
    assert queue.send([msg("a")]) == 0  # the new send opened a new window
    clock.advance(LOCK)
    assert [(m.message_id, m.body) for m in queue.receive(10)] == [
        ("b", b"{}"),
        ("c", b"{}"),
        ("a", b"again"),
    ]


def test_duplicate_history_is_pruned(queue: SQLiteQueue, clock: ManualClock, tmp_path: Path) -> None:
    queue.send(msg(f"m{i}") for i in range(10))
    clock.advance(WINDOW)
    queue.send([msg("late")])
    with sqlite3.connect(tmp_path / "queue.db") as conn:
        rows = conn.execute("SELECT message_id FROM queue_duplicate_detection").fetchall()
    assert rows == [("late",)]


def test_outgoing_message_validation() -> None:
    with pytest.raises(InvalidDocument) as error:
        OutgoingMessage("", b"{}", {"x": [1]})  # type: ignore[arg-type, dict-item]
    assert error.value.fields == ["message_id", "body", "properties.x"]
    with pytest.raises(InvalidDocument, match="message_id"):
        OutgoingMessage("x" * 129, "{}")
    with pytest.raises(InvalidDocument):  # empty property keys are rejected
        OutgoingMessage("a", "{}", {"": 1})
    source = {"k": 1}
    message = OutgoingMessage("a", "{}", source)
    source["k"] = 2
    assert message.properties == {"k": 1}


def test_outgoing_message_refuses_text_and_integers_no_queue_can_carry() -> None:
    with pytest.raises(InvalidDocument) as error:
        OutgoingMessage("a\ud800", '"\udc00"', {"s": "\ud800", "big": 2**63, "small": -(2**63) - 1})
    assert error.value.fields == ["message_id", "body", "properties.s", "properties.big", "properties.small"]
    assert "lone surrogate" in str(error.value) and "64 bits" in str(error.value)
    with pytest.raises(InvalidDocument, match="lone surrogate"):
        OutgoingMessage("a", "{}", {"\udfff": 1})
    assert OutgoingMessage("a", "{}", {"max": 2**63 - 1, "min": -(2**63), "pair": "\U0001f600"}).properties["min"] < 0


def test_an_episode_id_no_queue_can_carry_is_reported_and_the_rest_of_the_batch_is_sent(
    queue: SQLiteQueue,
) -> None:
    from agent_learning.pipeline.enqueue import enqueue_episodes

    docs = [{"id": "ep-1", "agent_id": "a"}, {"id": "ep-\ud800", "agent_id": "a"}, {"id": "ep-3", "agent_id": "a"}]
    result = enqueue_episodes(docs, queue.send)  # before, the whole batch failed with UnicodeEncodeError
    assert (result.sent, [i for i, _ in result.failed]) == (2, [1])
    assert ids(queue.receive(10)) == ["ep-1", "ep-3"]


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"lock_seconds": 0}, "lock_seconds"),
        ({"lock_seconds": float("nan")}, "lock_seconds"),
        ({"max_deliveries": 0}, "max_deliveries"),
        ({"max_deliveries": 2.5}, "max_deliveries"),
        ({"duplicate_window_seconds": -1}, "duplicate_window_seconds"),
        ({"name": ""}, "name"),
    ],
)
def test_constructor_validates_arguments(tmp_path: Path, kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        SQLiteQueue(tmp_path / "q.db", **kwargs)


def test_an_expired_lock_is_no_longer_counted(queue: SQLiteQueue, clock: ManualClock) -> None:
    queue.send(msg(f"m{i}") for i in range(5))
    received = queue.receive(3)
    queue.complete(received[0])
    queue.dead_letter(received[1], "r")
    assert queue.counts() == QueueCounts(active=3, locked=1, dead_letter=1)
    clock.advance(LOCK)
    assert queue.counts() == QueueCounts(active=3, locked=0, dead_letter=1)


def test_queues_sharing_a_file_are_independent(tmp_path: Path, clock: ManualClock) -> None:
    with (
        SQLiteQueue(tmp_path / "app.db", name="one", clock=clock) as one,
        SQLiteQueue(tmp_path / "app.db", name="two", clock=clock) as two,
    ):
        one.send([msg("a")])
        assert two.send([msg("a")]) == 1  # duplicate detection is per queue
        two.send([msg("b")])
        assert ids(one.receive(10)) == ["a"]
        assert ids(two.receive(10)) == ["a", "b"]
        assert one.counts().active == 1 and two.counts().active == 2


def test_second_object_on_same_file_sees_the_same_messages(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "durable.db"
    first = SQLiteQueue(path, lock_seconds=LOCK, clock=clock)
    first.send([msg("a", '{"k": 1}', p="x"), msg("b")])
    [a] = first.receive()
    first.close()
    first.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        first.receive()

    reopened = SQLiteQueue(str(path), lock_seconds=LOCK, clock=clock)
    assert reopened.counts() == QueueCounts(active=2, locked=1, dead_letter=0)
    assert ids(reopened.receive(10)) == ["b"]  # "a" is still locked
    reopened.complete(a)  # the lock lives in the file, not the object
    assert reopened.send([msg("a")]) == 0  # so does duplicate-detection history
    clock.advance(LOCK)
    [b] = reopened.receive()
    assert (b.message_id, b.delivery_count) == ("b", 2)
    reopened.close()


def test_a_new_file_in_a_folder_that_does_not_exist_yet(tmp_path: Path, clock: ManualClock) -> None:
    # The store makes its file's folder; the queue beside it (a Cosmos DB store, say) must too.
    with SQLiteQueue(tmp_path / "new" / "queue.db", clock=clock) as q:
        assert q.send([msg("a")]) == 1
    assert (tmp_path / "new" / "queue.db").is_file()


def test_memory_queue(clock: ManualClock) -> None:
    with SQLiteQueue(":memory:", clock=clock) as q:
        q.send([msg("a")])
        [m] = q.receive()
        q.complete(m)
        assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=0)


@pytest.mark.parametrize("shared_object", [True, False], ids=["one-object", "object-per-thread"])
def test_two_threads_never_get_the_same_message(tmp_path: Path, shared_object: bool) -> None:
    path = tmp_path / "threads.db"
    total = 1_000
    producer = SQLiteQueue(path)
    producer.send(msg(f"m{i:04d}") for i in range(total))
    queues = [producer, producer] if shared_object else [SQLiteQueue(path), SQLiteQueue(path)]
    seen: list[list[str]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def drain(index: int) -> None:
        try:
            start.wait()
            while batch := queues[index].receive(7):
                for m in batch:
                    queues[index].complete(m)  # raises if another thread held this lock
                    seen[index].append(m.message_id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    everything = seen[0] + seen[1]
    assert len(everything) == total
    assert set(everything) == {f"m{i:04d}" for i in range(total)}
    assert producer.counts() == QueueCounts(active=0, locked=0, dead_letter=0)
    for q in {id(q): q for q in queues}.values():
        q.close()


def _drain_in_process(path: str, out: str, start: Any) -> None:
    """Child-process worker: drain the queue, write the completed ids to ``out``."""
    q = SQLiteQueue(path)
    start.wait()
    done: list[str] = []
    while batch := q.receive(5):
        for m in batch:
            q.complete(m)
            done.append(m.message_id)
    q.close()
    Path(out).write_text("\n".join(done))


def test_a_file_another_process_keeps_locked_is_a_transient_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent_learning.queue.sqlite.BUSY_TIMEOUT_MS", 50)
    queue = SQLiteQueue(tmp_path / "queue.db")
    queue.send([msg("m-1")])
    other = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    for call in (lambda: queue.send([msg("m-2")]), lambda: queue.receive(1)):
        with pytest.raises(TransientError, match=r"queue\.db.*locked"):
            call()
    other.execute("ROLLBACK")
    other.close()
    assert ids(queue.receive(2)) == ["m-1"]
    queue.close()


def test_two_processes_drain_without_processing_twice(tmp_path: Path) -> None:
    path = tmp_path / "procs.db"
    total = 500
    with SQLiteQueue(path) as q:
        q.send(msg(f"m{i:03d}") for i in range(total))
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    outs = [tmp_path / f"worker{i}.txt" for i in range(2)]
    workers = [ctx.Process(target=_drain_in_process, args=(str(path), str(out), start)) for out in outs]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
        if w.is_alive():
            w.kill()
    assert [w.exitcode for w in workers] == [0, 0]
    done = [line for out in outs for line in out.read_text().split("\n") if line]
    assert Counter(done).most_common(1)[0][1] == 1
    assert sorted(done) == [f"m{i:03d}" for i in range(total)]
    with SQLiteQueue(path) as q:
        assert q.counts() == QueueCounts(active=0, locked=0, dead_letter=0)


class QueueModel(RuleBasedStateMachine):
    """Random operations against a plain-Python model of the same semantics."""

    MAX = 2
    LOCK = 10.0
    WINDOW = 25.0

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.queue = SQLiteQueue(
            ":memory:",
            lock_seconds=self.LOCK,
            max_deliveries=self.MAX,
            duplicate_window_seconds=self.WINDOW,
            clock=self.clock,
        )
        self.next_seq = 0
        self.active: dict[int, list[Any]] = {}  # seq -> [message_id, delivery_count, token, locked_until]
        self.dead: list[str] = []
        self.sent_at: dict[str, float] = {}
        self.held: list[ReceivedMessage] = []

    def _enqueue(self, message_id: str) -> None:
        self.active[self.next_seq] = [message_id, 0, None, 0.0]
        self.next_seq += 1

    def _expire(self, now: float) -> None:
        for seq, (message_id, count, token, until) in list(self.active.items()):
            if token is not None and until <= now and count >= self.MAX:
                del self.active[seq]
                self.dead.append(message_id)

    @rule(names=st.lists(st.sampled_from("abcdef"), max_size=3))
    def send(self, names: list[str]) -> None:
        now = self.clock.time()
        expected = 0
        for name in names:
            if name not in self.sent_at or now - self.sent_at[name] >= self.WINDOW:
                self.sent_at[name] = now
                self._enqueue(name)
                expected += 1
        assert self.queue.send(msg(n) for n in names) == expected

    @rule(n=st.integers(1, 4))
    def receive(self, n: int) -> None:
        now = self.clock.time()
        self._expire(now)
        available = [seq for seq, v in self.active.items() if v[2] is None or v[3] <= now][:n]
        got = self.queue.receive(n)
        assert ids(got) == [self.active[seq][0] for seq in available]
        for seq, m in zip(available, got, strict=True):
            entry = self.active[seq]
            entry[1] += 1
            entry[2], entry[3] = m.lock_token, m.locked_until
            assert m.delivery_count == entry[1]
            assert m.locked_until == now + self.LOCK
        self.held.extend(got)

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 10), action=st.sampled_from(["complete", "abandon", "dead_letter"]))
    def settle(self, index: int, action: str) -> None:
        m = self.held.pop(index % len(self.held))
        now = self.clock.time()
        seqs = [seq for seq, v in self.active.items() if v[2] == m.lock_token and v[3] > now]
        args = ["r"] if action == "dead_letter" else []
        if not seqs:
            with pytest.raises(ConcurrencyConflict, match="lock lost"):
                getattr(self.queue, action)(m, *args)
            return
        getattr(self.queue, action)(m, *args)
        [seq] = seqs
        entry = self.active[seq]
        if action == "abandon" and entry[1] < self.MAX:
            entry[2] = None
            return
        del self.active[seq]
        if action != "complete":
            self.dead.append(m.message_id)

    @rule(seconds=st.sampled_from([1, 5, 10]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: self.dead)
    @rule()
    def replay(self) -> None:
        assert self.queue.replay_dead_letters() == len(self.dead)
        for message_id in self.dead:
            self._enqueue(message_id)
        self.dead = []

    @invariant()
    def counts_match(self) -> None:
        now = self.clock.time()
        self._expire(now)
        locked = sum(1 for v in self.active.values() if v[2] is not None and v[3] > now)
        assert self.queue.counts() == QueueCounts(len(self.active), locked, len(self.dead))
        assert [d.message_id for d in self.queue.dead_letters(1000)] == self.dead

    def teardown(self) -> None:
        self.queue.close()


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
