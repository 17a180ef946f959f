"""Pytest plugin: every adapter of each port (store, queue) behind one fixture, and the marks of the
external ones.

Registered in ``tests/conftest.py``. Fixtures:

- ``store``: a fresh, empty store of each adapter in turn (``memory``, ``sqlite``, ``cosmos``), closed
  after the test. The store contract suite (``tests/store/test_store_contract.py``) and every test that
  must hold on any store take this one; a module that needs more in the store overrides ``store`` by
  requesting it (``def store(store): ...``).
- ``durable_store``: the same, over the adapters a deployment runs on (``sqlite``, ``cosmos``): for tests
  that need what only a store that persists has (the reliability suite, the Functions app, the audit).
- ``queue``: a fresh, empty queue of each adapter in turn (``sqlite``, ``servicebus``), configured alike
  (a 30 s lock, at most 3 deliveries), as a :class:`QueueUnderTest`. The queue contract suite
  (``tests/queue/test_queue_contract.py``) takes it; the adapter files override it with their own.

Every behaviour is tested over the wire once: a test that would repeat another's use of Cosmos DB at
many times the cost of the embedded stores runs on those only (:func:`only_on`).

The ``cosmos`` case is the real azure-cosmos SDK against the patched local Cosmos server
(``tests/fakes/cosmos_fixture.py``), in a new database per test. The ``servicebus`` case is the real
azure-servicebus SDK against the in-process AMQP broker (``tests/fakes/amqp_broker.py``), with an
administration client read from the broker so that ``counts()`` works as on Azure; it is skipped
without the SDK or proton.

External adapters carry a mark, so ``pytest -m "not cosmos"`` runs everything else without Node, and
``-m "not servicebus"`` without the AMQP broker; a test that takes a fake's fixture directly
(``cosmos_server``, ``amqp_broker``, ...) gets the mark at collection (:func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from cosmos_fixture import new_cosmos_store

from agent_learning.core.clock import ManualClock
from agent_learning.queue import ReceivedMessage, SQLiteQueue, WorkQueue
from agent_learning.store import MemoryStore, SQLiteStore, Store

STORE_ADAPTERS: Final = ("memory", "sqlite", "cosmos")
"""Every adapter of the store port, in the order the tests run them."""

DURABLE_STORE_ADAPTERS: Final = ("sqlite", "cosmos")
"""The store adapters a deployment runs on: embedded SQLite, and Cosmos DB."""

EMBEDDED_STORE_ADAPTERS: Final = ("memory", "sqlite")
"""The store adapters that run in the test's process, with no server."""

EXTERNAL_MARKS: Final = {"cosmos": pytest.mark.cosmos, "servicebus": pytest.mark.servicebus}
"""The mark of each adapter that needs a local server (registered in ``pytest.ini``)."""

FAKE_FIXTURES: Final = {
    "cosmos_server": "cosmos",
    "cosmos_client": "cosmos",
    "cosmos_database": "cosmos",
    "amqp_broker": "servicebus",
}
"""Fixtures of the local servers, and the mark a test that takes one of them gets."""


def adapter_params(*adapters: str) -> list[Any]:
    """``pytest.param`` per adapter, with the adapter's mark when it is an external one."""
    return [pytest.param(a, id=a, marks=[EXTERNAL_MARKS[a]] if a in EXTERNAL_MARKS else []) for a in adapters]


def only_on(fixture: str, *adapters: str) -> pytest.MarkDecorator:
    """Run a test on some adapters of ``fixture`` ("store", "durable_store") only: where only one
    adapter has what the test needs, or where another test already makes the same use of the store
    over the wire, so the wire case would repeat it at many times the cost of the embedded ones
    (then say which test, beside it)."""
    return pytest.mark.parametrize(fixture, adapter_params(*adapters), indirect=True)


# --------------------------------------------------------------------------- store


def open_store(adapter: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of ``adapter``."""
    if adapter == "cosmos":
        store: Store = new_cosmos_store(request)
    elif adapter == "sqlite":
        store = SQLiteStore(tmp_path / "store.db")
    elif adapter == "memory":
        store = MemoryStore()
    else:
        raise ValueError(f"unknown store adapter {adapter!r}; known: {', '.join(STORE_ADAPTERS)}")
    return store


def store_adapter(request: pytest.FixtureRequest) -> str:
    """The adapter the running test's store is ("memory", "sqlite" or "cosmos")."""
    params = request.node.callspec.params
    return str(params["store"] if "store" in params else params["durable_store"])


@pytest.fixture(params=adapter_params(*STORE_ADAPTERS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each adapter in turn."""
    s = open_store(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture(params=adapter_params(*DURABLE_STORE_ADAPTERS))
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store of each adapter a deployment runs on (SQLite, then Cosmos DB)."""
    s = open_store(request.param, request, tmp_path)
    yield s
    s.close()


# --------------------------------------------------------------------------- queue

QUEUE_ADAPTERS: Final = ("sqlite", "servicebus")
"""Every adapter of the queue port, in the order the tests run them."""

LOCK_SECONDS: Final = 30.0
"""The lock duration of every contract queue: long enough that no lock expires during a test."""

MAX_DELIVERIES: Final = 3
"""Deliveries before a message is dead-lettered (Service Bus's MaxDeliveryCount)."""

NAME: Final = "score-episodes"
WAIT: Final = 1.0  # max_wait_time of Service Bus receives that are expected to find nothing
RECEIVE_DEADLINE: Final = 10.0  # how long receive_exactly keeps receiving on Service Bus


class BrokerAdmin:
    """Stands in for ServiceBusAdministrationClient (HTTP), which the AMQP broker cannot serve."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def get_queue_runtime_properties(self, name: str, **kwargs: Any) -> Any:  # kwargs: the timeouts
        view = self.broker.queue(name)

        @dataclasses.dataclass
        class Runtime:
            active_message_count: int
            dead_letter_message_count: int

        return Runtime(len(view.messages()), len(view.dead_letters()))


@dataclasses.dataclass
class QueueUnderTest:
    """One adapter's queue, and how to receive a known number of messages from it."""

    adapter: str
    queue: WorkQueue

    def receive_exactly(self, count: int) -> list[ReceivedMessage]:
        """``count`` ready messages: one call on SQLite (which returns every ready message it is
        asked for); on Service Bus receives until they arrived (one receive may return fewer)."""
        if self.adapter == "sqlite":
            return self.queue.receive(count)
        got: list[ReceivedMessage] = []
        end = time.monotonic() + RECEIVE_DEADLINE
        while len(got) < count and time.monotonic() < end:
            got.extend(self.queue.receive(count - len(got)))
        return got


def _servicebus() -> tuple[Any, Any]:
    """A Service Bus queue on a started broker, and the broker."""
    pytest.importorskip("azure.servicebus")
    pytest.importorskip("proton")
    from amqp_broker import BROKER_START_TIMEOUT, Broker

    from agent_learning.queue.servicebus import ServiceBusQueue

    broker = Broker(port=0)
    broker.start(timeout=BROKER_START_TIMEOUT)
    broker.queue(NAME, max_delivery_count=MAX_DELIVERIES, lock_duration=LOCK_SECONDS)
    return broker, ServiceBusQueue.from_connection_string(
        broker.connection_string, NAME, admin_client=BrokerAdmin(broker), max_wait_time=WAIT, send_timeout=10.0,
        operation_timeout=10.0, retry_total=1, retry_backoff_factor=0.1, timeout=10, auth_timeout=10,
    )


@pytest.fixture(params=adapter_params(*QUEUE_ADAPTERS))
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[QueueUnderTest]:
    """A fresh, empty queue of each adapter in turn."""
    broker: Any = None
    if request.param == "sqlite":
        q: Any = SQLiteQueue(tmp_path / "queue.db", lock_seconds=LOCK_SECONDS, max_deliveries=MAX_DELIVERIES,
                             clock=ManualClock())
    else:
        broker, q = _servicebus()
    yield QueueUnderTest(request.param, q)
    q.close()
    if broker is not None:
        broker.stop()
        assert not broker.errors, "the AMQP broker reported errors:\n" + "\n".join(broker.errors)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that takes a local server's fixture with that server's adapter."""
    for item in items:
        for name in {FAKE_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in FAKE_FIXTURES}:
            item.add_marker(EXTERNAL_MARKS[name])
