"""ServiceBusQueue against the in-process AMQP broker (tests/fakes/amqp_broker.py) with the real SDK.

The broker is a pytest plugin (``amqp_broker`` fixture). Every SDK call is bounded: receives by
``max_wait_time``, sends by ``send_timeout``, settlement and management calls by the client's
``timeout``, connection setup by ``auth_timeout``, and each test by a pytest-timeout marker.
``counts()`` needs the HTTP administration API, which the broker does not serve; it is tested
with a stand-in administration client.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

from amqp_broker import Broker, amqp_broker  # noqa: F401  (amqp_broker is the fixture)

from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, TransientError
from agent_learning.queue import (
    MAX_DELIVERY_COUNT_EXCEEDED,
    DeadLetter,
    OutgoingMessage,
    ReceivedMessage,
)
from agent_learning.queue.servicebus import ORIGINAL_MESSAGE_ID_PROPERTY, REPLAY_PROPERTY, ServiceBusQueue

pytestmark = pytest.mark.timeout(60)

QUEUE = "score-episodes"
WAIT = 1.0  # max_wait_time of receives that are expected to find nothing
CLIENT_KW: dict[str, Any] = {"retry_total": 1, "retry_backoff_factor": 0.1, "timeout": 10, "auth_timeout": 10}


def msg(message_id: str, body: str = "{}", **properties: Any) -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id, body=body, properties=properties)


def ids(messages: list[ReceivedMessage] | list[DeadLetter]) -> list[str]:
    return [m.message_id for m in messages]


def receive_exactly(queue: ServiceBusQueue, count: int, deadline: float = 10.0) -> list[ReceivedMessage]:
    """Receive until ``count`` messages arrived (one receive may return fewer than are ready)."""
    got: list[ReceivedMessage] = []
    end = time.monotonic() + deadline
    while len(got) < count and time.monotonic() < end:
        got.extend(queue.receive(count - len(got)))
    return got


@pytest.fixture
def make_queue(amqp_broker: Broker) -> Iterator[Callable[..., ServiceBusQueue]]:
    made: list[ServiceBusQueue] = []

    def make(name: str = QUEUE, *, settings: dict[str, Any] | None = None, **kw: Any) -> ServiceBusQueue:
        amqp_broker.queue(name, **(settings or {}))
        options = {"max_wait_time": WAIT, "send_timeout": 10.0, "operation_timeout": 10.0, **CLIENT_KW, **kw}
        queue = ServiceBusQueue.from_connection_string(amqp_broker.connection_string, name, **options)
        made.append(queue)
        return queue

    yield make
    for queue in made:
        queue.close()


@pytest.fixture
def queue(make_queue: Callable[..., ServiceBusQueue]) -> ServiceBusQueue:
    return make_queue(settings={"max_delivery_count": 3, "lock_duration": 30.0})


# -- sending -----------------------------------------------------------------------------------


def test_repr_names_the_queue(queue: ServiceBusQueue) -> None:
    assert "score-episodes" in repr(queue)


def test_send_one_arrives_with_id_properties_and_content_type(queue: ServiceBusQueue, amqp_broker: Broker) -> None:
    assert queue.send([msg("episode-1", '{"episode": "é"}', agent="a", n=3, ok=True, w=0.5)]) == 1
    [stored] = amqp_broker.queue(QUEUE).messages()
    assert stored.message_id == "episode-1"
    assert stored.body == '{"episode": "é"}'.encode()
    assert stored.content_type == "application/json"
    assert stored.application_properties == {"agent": "a", "n": 3, "ok": True, "w": 0.5}
    assert stored.delivery_count == 0 and not stored.locked


def test_send_500_goes_in_several_batches_in_order(queue: ServiceBusQueue, amqp_broker: Broker) -> None:
    padding = "x" * 2_000  # 500 x ~2 KB: four or more 256 KB batches
    sent = queue.send(msg(f"m{i:03d}", f'{{"i": {i}, "pad": "{padding}"}}', i=i) for i in range(500))
    assert sent == 500
    view = amqp_broker.queue(QUEUE)
    assert view.message_ids() == [f"m{i:03d}" for i in range(500)]
    assert [m.sequence_number for m in view.messages()] == list(range(1, 501))
    assert 4 <= amqp_broker.transfers_received <= 10  # batches, not 500 single sends
    assert view.messages()[499].application_properties == {"i": 499}


def test_oversize_body_raises_invalid_document_naming_body(queue: ServiceBusQueue, amqp_broker: Broker) -> None:
    huge = '"' + "x" * 300_000 + '"'
    with pytest.raises(InvalidDocument) as error:
        queue.send([msg("small"), msg("huge", huge)])
    assert error.value.fields == ["body"]
    assert "huge" in str(error.value)
    assert amqp_broker.queue(QUEUE).messages() == []  # all batches are built before any is sent


def test_send_validates_what_service_bus_cannot_carry(queue: ServiceBusQueue) -> None:
    with pytest.raises(InvalidDocument, match=ORIGINAL_MESSAGE_ID_PROPERTY):
        queue.send([OutgoingMessage("a", "{}", {ORIGINAL_MESSAGE_ID_PROPERTY: "b"})])
    with pytest.raises(InvalidDocument, match=REPLAY_PROPERTY):
        queue.send([OutgoingMessage("a", "{}", {REPLAY_PROPERTY: "b"})])
    with pytest.raises(InvalidDocument) as error:
        queue.send([msg("a", big=2**63)])
    assert error.value.fields == ["properties.big"]


def test_duplicate_message_id_within_the_window_is_dropped_by_the_broker(
    make_queue: Callable[..., ServiceBusQueue], amqp_broker: Broker
) -> None:
    queue = make_queue(settings={"duplicate_detection_window": 1.0})
    assert queue.send([msg("a", '{"v": 1}'), msg("b")]) == 2
    assert queue.send([msg("a", '{"v": 2}')]) == 1  # handed over; the broker drops it
    assert amqp_broker.queue(QUEUE).message_ids() == ["a", "b"]
    assert amqp_broker.duplicates_dropped == 1
    [a, _] = receive_exactly(queue, 2)
    queue.complete(a)  # the history outlives the message
    assert queue.send([msg("a", '{"v": 3}')]) == 1
    assert amqp_broker.queue(QUEUE).message_ids() == ["b"]
    time.sleep(1.1)
    queue.send([msg("a", '{"v": 4}')])
    assert [m.body for m in amqp_broker.queue(QUEUE).messages()] == [b"{}", b'{"v": 4}']


# -- receiving and settling --------------------------------------------------------------------


def test_received_message_times(queue: ServiceBusQueue) -> None:
    before = time.time()
    queue.send([msg("a", '{"x": 1}', k="v")])
    [m] = queue.receive()
    assert before - 1 <= m.enqueued_at <= time.time() + 1
    assert m.locked_until == pytest.approx(time.time() + 30.0, abs=3)


def test_a_value_or_sequence_body_from_another_client_does_not_fail_the_receive(
    queue: ServiceBusQueue, amqp_broker: Broker
) -> None:
    from azure.servicebus import ServiceBusClient
    from azure.servicebus.amqp import AmqpAnnotatedMessage

    queue.send([msg("ours", '{"x": 1}')])
    foreign = [{"value_body": 42}, {"sequence_body": [[1, 2]]}, {"value_body": {1: b"\xff"}}]
    client = ServiceBusClient.from_connection_string(amqp_broker.connection_string, **CLIENT_KW)
    with client, client.get_queue_sender(QUEUE) as sender:
        for i, body in enumerate(foreign):
            sender.send_messages(AmqpAnnotatedMessage(**body, properties={"message_id": f"foreign-{i}"}))
    received = receive_exactly(queue, 4)
    assert [(m.message_id, m.body) for m in received[:3]] == [
        ("ours", b'{"x": 1}'),
        ("foreign-0", b"42"),
        ("foreign-1", b"[[1, 2]]"),
    ]
    assert received[3].message_id == "foreign-2" and received[3].body  # no JSON for an int key: its repr
    queue.dead_letter(received[1], "InvalidMessage")
    assert [(d.message_id, d.body) for d in queue.dead_letters()] == [("foreign-0", b"42")]


def test_a_binary_property_from_another_client_does_not_fail_the_receive(
    queue: ServiceBusQueue, amqp_broker: Broker
) -> None:
    from proton import Message
    from proton.utils import BlockingConnection

    queue.send([msg("ours")])
    connection = BlockingConnection(f"{amqp_broker.host}:{amqp_broker.port}", timeout=10)
    try:  # a .NET producer's byte[] property, say: the SDK hands it over as bytes, like a string
        connection.create_sender(QUEUE).send(Message(id="foreign", body=b"{}", properties={"sum": b"\xff\x00a"}))
    finally:
        connection.close()
    received = receive_exactly(queue, 2)
    assert [(m.message_id, m.properties) for m in received] == [("ours", {}), ("foreign", {"sum": "\\xff\x00a"})]
    queue.dead_letter(received[1], "InvalidMessage")
    assert [d.properties for d in queue.dead_letters()] == [{"sum": "\\xff\x00a"}]


def test_receive_with_nothing_waits_at_most_max_wait_time(queue: ServiceBusQueue) -> None:
    queue.send([msg("a")])
    queue.complete(queue.receive()[0])
    started = time.monotonic()
    assert queue.receive(5) == []
    assert time.monotonic() - started < WAIT + 3


def test_complete_removes_the_message_from_the_broker(queue: ServiceBusQueue, amqp_broker: Broker) -> None:
    queue.send([msg("a"), msg("b")])
    [a, b] = receive_exactly(queue, 2)
    queue.complete(a)
    assert amqp_broker.queue(QUEUE).message_ids() == ["b"]
    queue.complete(b)
    assert amqp_broker.queue(QUEUE).messages() == []


def test_a_settlement_that_fails_transiently_keeps_the_lock_for_a_retry(
    queue: ServiceBusQueue, amqp_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped connection during complete (the one fault injected, at the SDK's receiver) left
    the message unsettled but forgot its lock: the retry said "lock lost" and the message came
    back after its lock expired, to be scored again."""
    from azure.servicebus.exceptions import ServiceBusConnectionError

    queue.send([msg("a")])
    [a] = receive_exactly(queue, 1)
    receiver = queue._receiver
    real = receiver.complete_message
    failures = iter([ServiceBusConnectionError(message="connection reset")])

    def complete_once_failing(message: Any) -> None:
        if (error := next(failures, None)) is not None:
            raise error
        real(message)

    monkeypatch.setattr(receiver, "complete_message", complete_once_failing)
    with pytest.raises(TransientError, match="complete"):
        queue.complete(a)
    queue.complete(a)  # the retry settles it
    assert amqp_broker.queue(QUEUE).messages() == []


def test_lock_expiry_redelivers_and_the_stale_lock_cannot_settle(
    make_queue: Callable[..., ServiceBusQueue], amqp_broker: Broker
) -> None:
    queue = make_queue(settings={"lock_duration": 1.0})
    queue.send([msg("a")])
    [old] = queue.receive()
    time.sleep(1.3)
    [new] = queue.receive()
    assert (new.message_id, new.delivery_count) == ("a", 2)
    assert new.lock_token != old.lock_token
    with pytest.raises(ConcurrencyConflict, match="lock lost"):
        queue.complete(old)
    queue.complete(new)
    assert amqp_broker.queue(QUEUE).messages() == []


def test_broker_rejects_a_settlement_whose_lock_it_no_longer_holds(
    make_queue: Callable[..., ServiceBusQueue], amqp_broker: Broker
) -> None:
    """The broker's lock-lost answer reaches the port as ConcurrencyConflict (not only client checks)."""
    queue = make_queue(settings={"lock_duration": 30.0})
    queue.send([msg("a")])
    [m] = queue.receive()
    assert amqp_broker.queue(QUEUE).expire_locks() == 1  # the SDK still believes it holds the lock
    with pytest.raises(ConcurrencyConflict, match="lock lost") as error:
        queue.complete(m)
    assert "MessageLockLost" in type(error.value.__cause__).__name__
    [again] = receive_exactly(queue, 1)
    assert (again.message_id, again.delivery_count) == ("a", 2)


# -- dead letters ------------------------------------------------------------------------------


def test_dead_letter_with_reason_is_listed_then_replayed(queue: ServiceBusQueue, amqp_broker: Broker) -> None:
    """What Service Bus adds to the contract's dead letter: the reason on the wire, the enqueue time
    kept, and a replayed copy under a fresh id that names the original."""
    queue.send([msg("a", '{"episode": "é"}', agent="x", n=3, ok=True, w=0.5)])
    [m] = queue.receive()
    queue.dead_letter(m, "InvalidDocument", "steps[2].latency_ms: not a number")
    [dead] = queue.dead_letters()
    assert dead.dead_lettered_at == pytest.approx(m.enqueued_at, abs=0.01)  # Service Bus keeps it
    stored = amqp_broker.queue(QUEUE).dead_letters()[0]
    assert stored.application_properties["DeadLetterReason"] == "InvalidDocument"

    assert queue.dead_letters() == [dead]  # peek takes no lock and changes nothing
    assert queue.replay_dead_letters() == 1
    assert queue.dead_letters() == []
    [back] = queue.receive()
    assert (back.message_id, back.delivery_count, back.body, back.properties) == (
        "a",
        1,
        '{"episode": "é"}'.encode(),
        {"agent": "x", "n": 3, "ok": True, "w": 0.5},
    )
    # On the wire the copy has a fresh id (so duplicate detection cannot drop it) and the original.
    [wire] = amqp_broker.queue(QUEUE).messages()
    assert wire.message_id != "a"
    assert wire.application_properties[ORIGINAL_MESSAGE_ID_PROPERTY] == "a"
    assert wire.content_type == "application/json"


@pytest.mark.parametrize("new_id", [True, False])
def test_replay_does_not_replay_its_own_copies_dead_lettered_again_meanwhile(
    make_queue: Callable[..., ServiceBusQueue], new_id: bool
) -> None:
    """A live consumer that still fails every message (the cause not fixed yet) dead-letters the
    copies while the replay runs; the replay moves what was dead-lettered, once, and ends."""
    queue = make_queue(replay_with_new_message_id=new_id, settings={"duplicate_detection_window": 0.001})
    consumer = make_queue()
    queue.send(msg(f"m{i}") for i in range(3))
    for m in receive_exactly(queue, 3):
        queue.dead_letter(m, "JudgeFailed")
    stop = threading.Event()

    def fail_everything() -> None:
        while not stop.is_set():
            for m in consumer.receive(10):
                consumer.dead_letter(m, "JudgeFailed")

    worker = threading.Thread(target=fail_everything, daemon=True)
    worker.start()
    try:
        started = time.monotonic()
        assert queue.replay_dead_letters() == 3
        assert time.monotonic() - started < 15
    finally:
        stop.set()
        worker.join(10)
    deadline = time.monotonic() + 10
    while len(queue.dead_letters()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(ids(queue.dead_letters())) == ["m0", "m1", "m2"]  # the copies, back for the next replay


def test_a_replay_ends_once_it_has_received_every_dead_letter_there_when_it_began(
    make_queue: Callable[..., ServiceBusQueue],
) -> None:
    """No wait for a next message it does not expect: an empty sub-queue is replayed without a
    receive, and a replay stops receiving once every dead letter peeked when it began has come."""
    queue = make_queue(replay_batch_size=2, settings={"lock_duration": 30.0})
    receiver = queue._get_dead_letter_receiver()
    receive, pages = receiver.receive_messages, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        page = receive(*args, **kwargs)
        pages.append(len(page))
        return page

    receiver.receive_messages = counted  # type: ignore[method-assign]
    assert queue.replay_dead_letters() == 0 and pages == []
    queue.send(msg(f"m{i}") for i in range(3))
    for m in receive_exactly(queue, 3):
        queue.dead_letter(m, "JudgeFailed")
    assert queue.replay_dead_letters() == 3
    assert sum(pages) == 3 and 0 not in pages  # no last, empty receive waiting max_wait_time
    assert sorted(ids(receive_exactly(queue, 3))) == ["m0", "m1", "m2"] and queue.dead_letters() == []


def test_a_replay_that_outlasts_the_dead_letter_lock_raises_concurrency_conflict(
    queue: ServiceBusQueue, amqp_broker: Broker
) -> None:
    queue.send([msg("a")])
    queue.dead_letter(queue.receive()[0], "JudgeFailed")
    sender = queue._get_sender()
    send = sender.send_messages

    def send_then_expire(*args: Any, **kwargs: Any) -> None:  # the copies sent, the locks run out
        send(*args, **kwargs)
        amqp_broker.queue(QUEUE).expire_locks()

    sender.send_messages = send_then_expire  # type: ignore[method-assign]
    with pytest.raises(ConcurrencyConflict, match="outlasted the dead-letter lock after 0 replayed: 'a'"):
        queue.replay_dead_letters()
    sender.send_messages = send  # type: ignore[method-assign]
    assert ids(queue.dead_letters()) == ["a"]  # still there, to replay again
    assert ids(receive_exactly(queue, 1)) == ["a"]  # and its copy was sent


def test_replay_with_the_same_id_is_dropped_within_the_duplicate_window(
    make_queue: Callable[..., ServiceBusQueue], amqp_broker: Broker
) -> None:
    """Why replay_with_new_message_id defaults to True: Service Bus drops a same-id copy."""
    queue = make_queue(replay_with_new_message_id=False)
    queue.send([msg("a")])
    queue.dead_letter(queue.receive()[0], "r")
    assert queue.replay_dead_letters() == 1
    assert amqp_broker.queue(QUEUE).messages() == []  # the copy was dropped as a duplicate: lost
    assert amqp_broker.duplicates_dropped == 1


def test_max_delivery_count_dead_letters_on_lock_expiry(make_queue: Callable[..., ServiceBusQueue]) -> None:
    queue = make_queue(settings={"lock_duration": 0.5, "max_delivery_count": 2})
    queue.send([msg("a")])
    for expected in (1, 2):
        [m] = queue.receive()
        assert m.delivery_count == expected
        time.sleep(0.7)
    queue.send([msg("b")])
    assert ids(queue.receive(10)) == ["b"]
    [dead] = queue.dead_letters()
    assert (dead.message_id, dead.reason, dead.delivery_count) == ("a", MAX_DELIVERY_COUNT_EXCEEDED, 2)


# -- counts, errors, lifecycle -----------------------------------------------------------------


def test_counts_maps_transient_http_failures(make_queue: Callable[..., ServiceBusQueue]) -> None:
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

    class FailingAdmin:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def get_queue_runtime_properties(self, name: str, **kwargs: Any) -> Any:
            raise self.error

    busy = HttpResponseError("busy")
    busy.status_code = 503
    with pytest.raises(TransientError) as error:
        make_queue(admin_client=FailingAdmin(busy)).counts()
    assert error.value.__cause__ is busy
    with pytest.raises(ResourceNotFoundError):
        make_queue(admin_client=FailingAdmin(ResourceNotFoundError("no such queue"))).counts()


def test_counts_is_bounded_by_operation_timeout_when_the_management_endpoint_never_answers() -> None:
    with socket.socket() as silent:  # accepts connections and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        conn_str = f"Endpoint=sb://127.0.0.1:{silent.getsockname()[1]}/;SharedAccessKeyName=k;SharedAccessKey=x"
        queue = ServiceBusQueue.from_connection_string(conn_str, QUEUE, operation_timeout=1.0, **CLIENT_KW)
        started = time.monotonic()
        with queue, pytest.raises(TransientError, match="counts"):
            queue.counts()
        assert time.monotonic() - started < 10  # azure-core's defaults would wait 300 s per attempt


def test_counts_without_an_administration_client(amqp_broker: Broker) -> None:
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(amqp_broker.connection_string, **CLIENT_KW)
    with ServiceBusQueue(client, QUEUE, max_wait_time=WAIT) as queue, pytest.raises(NotImplementedError, match="admin"):
        queue.counts()


def test_connection_failure_is_a_transient_error(amqp_broker: Broker) -> None:
    amqp_broker.stop()  # nothing listens on the port any more
    queue = ServiceBusQueue.from_connection_string(
        amqp_broker.connection_string, QUEUE, max_wait_time=WAIT, send_timeout=5.0, **{**CLIENT_KW, "retry_total": 0}
    )
    with queue, pytest.raises(TransientError) as error:
        queue.send([msg("a")])
    assert error.value.__cause__ is not None


def test_two_queue_objects_in_threads_never_get_the_same_message(
    make_queue: Callable[..., ServiceBusQueue], amqp_broker: Broker
) -> None:
    total = 200
    producer = make_queue()
    producer.send(msg(f"m{i:03d}") for i in range(total))
    consumers = [make_queue(), make_queue()]
    seen: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def drain(index: int) -> None:
        try:
            while batch := consumers[index].receive(7):
                for m in batch:
                    consumers[index].complete(m)  # raises if the other one held this lock
                    seen[index].append(m.message_id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=45)
    assert not errors
    everything = seen[0] + seen[1]
    assert sorted(everything) == [f"m{i:03d}" for i in range(total)]
    assert amqp_broker.queue(QUEUE).messages() == []


def test_from_namespace_uses_default_azure_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.identity

    made: list[dict[str, Any]] = []

    class FakeCredential:
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

        def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # never called: nothing connects
            raise AssertionError("no token expected")

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", FakeCredential)
    with ServiceBusQueue.from_namespace("ns.servicebus.windows.net", QUEUE, max_wait_time=2.0) as queue:
        assert queue.max_wait_time == 2.0
        assert "ns.servicebus.windows.net" in repr(queue)
    with ServiceBusQueue.from_namespace("ns.servicebus.windows.net", QUEUE, managed_identity_client_id="abc"):
        pass
    assert made == [{}, {"managed_identity_client_id": "abc"}]
    with pytest.raises(ValueError, match="not both"):
        ServiceBusQueue.from_namespace("ns", QUEUE, credential=FakeCredential(), managed_identity_client_id="abc")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_wait_time": 0}, "max_wait_time"),
        ({"send_timeout": float("nan")}, "send_timeout"),
        ({"operation_timeout": -1}, "operation_timeout"),
        ({"replay_batch_size": 0}, "replay_batch_size"),
    ],
)
def test_constructor_validates_arguments(amqp_broker: Broker, kwargs: dict[str, Any], argument: str) -> None:
    from azure.servicebus import ServiceBusClient

    client = ServiceBusClient.from_connection_string(amqp_broker.connection_string)
    try:
        with pytest.raises(ValueError, match=argument):
            ServiceBusQueue(client, QUEUE, **kwargs)
        with pytest.raises(ValueError, match="queue_name"):
            ServiceBusQueue(client, " ")
    finally:
        client.close()


# -- the broker serves the async client too ----------------------------------------------------


def test_async_client_sends_and_receives(amqp_broker: Broker) -> None:
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.aio import ServiceBusClient as AsyncServiceBusClient

    async def main() -> tuple[list[str], list[int | None], list[str]]:
        async with AsyncServiceBusClient.from_connection_string(amqp_broker.connection_string, **CLIENT_KW) as client:
            async with client.get_queue_sender("async-queue") as sender:
                await sender.send_messages(
                    [ServiceBusMessage('{"a": 1}', message_id="x1"), ServiceBusMessage('{"a": 2}', message_id="x2")],
                    timeout=10,
                )
            async with client.get_queue_receiver("async-queue", max_wait_time=5) as receiver:
                received = []
                while len(received) < 2:
                    batch = await receiver.receive_messages(max_message_count=2, max_wait_time=5)
                    assert batch, "the async receiver got nothing"
                    received.extend(batch)
                for message in received:
                    await receiver.complete_message(message)
                return (
                    [m.message_id for m in received],
                    [m.delivery_count for m in received],
                    ["".join(b.decode() for b in m.body) for m in received],
                )

    message_ids, delivery_counts, bodies = asyncio.run(asyncio.wait_for(main(), timeout=45))
    assert message_ids == ["x1", "x2"]
    assert delivery_counts == [0, 0]  # the SDK's raw count: previous attempts
    assert bodies == ['{"a": 1}', '{"a": 2}']
    assert amqp_broker.queue("async-queue").messages() == []


def test_broker_serves_peek_and_renew_lock_to_the_raw_sdk(amqp_broker: Broker) -> None:
    """$management requests the adapter does not use directly: renew-lock (and peek on the queue)."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    amqp_broker.queue("raw", lock_duration=3.0)
    with ServiceBusClient.from_connection_string(amqp_broker.connection_string, **CLIENT_KW) as client:
        with client.get_queue_sender("raw") as sender:
            sender.send_messages([ServiceBusMessage(f"{i}", message_id=f"r{i}") for i in range(3)], timeout=10)
        with client.get_queue_receiver("raw", max_wait_time=5) as receiver:
            peeked = receiver.peek_messages(max_message_count=10, sequence_number=2, timeout=10)
            assert [(m.message_id, m.sequence_number) for m in peeked] == [("r1", 2), ("r2", 3)]
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            first_expiry = message.locked_until_utc
            time.sleep(1.0)
            renewed = receiver.renew_message_lock(message, timeout=10)
            assert renewed > first_expiry
            time.sleep(2.5)  # past the first expiry, before the renewed one
            receiver.complete_message(message)
    assert amqp_broker.queue("raw").message_ids() == ["r1", "r2"]


def test_broker_serves_the_sdks_settlement_fallback_over_management(amqp_broker: Broker) -> None:
    """update-disposition: the SDK settles over $management when the receive link cannot (private API)."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient.from_connection_string(amqp_broker.connection_string, **CLIENT_KW) as client:
        with client.get_queue_sender("mgmt") as sender:
            sender.send_messages([ServiceBusMessage("x", message_id="a"), ServiceBusMessage("y", message_id="b")])
        with client.get_queue_receiver("mgmt", max_wait_time=5) as receiver:
            received: list[Any] = []
            while len(received) < 2:
                received.extend(receiver.receive_messages(max_message_count=2, max_wait_time=5))
            a, b = received
            receiver._settle_message_via_mgmt_link("completed", [a.lock_token])
            receiver._settle_message_via_mgmt_link(
                "suspended",
                [b.lock_token],
                dead_letter_details={"deadletter-reason": "why", "deadletter-description": "because"},
            )
    assert amqp_broker.queue("mgmt").messages() == []
    [dead] = amqp_broker.queue("mgmt").dead_letters()
    assert dead.message_id == "b"
    assert dead.application_properties["DeadLetterReason"] == "why"
    assert dead.application_properties["DeadLetterErrorDescription"] == "because"
