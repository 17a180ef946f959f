"""A small in-process AMQP 1.0 broker that is just enough for the azure-servicebus SDK.

Built on ``python-qpid-proton`` (a dev dependency, tested with 0.40.0); tests use it to exercise
:class:`agent_learning.queue.servicebus.ServiceBusQueue` with the real SDK, since the official
Service Bus emulator needs Docker. It speaks plain AMQP on a loopback port (no TLS); the SDK
connects with ``UseDevelopmentEmulator=true`` in the connection string (see
:attr:`Broker.connection_string`).

What it implements, following Azure Service Bus queue semantics:

* SASL ANONYMOUS, and the ``$cbs`` node: every ``put-token`` is answered with status 200
  (tokens are not checked).
* Sends to a queue address (``amqps://host:port/<queue>`` or ``<queue>``), single messages and
  the SDK's batches (message format 0x80013700, whose data sections are encoded messages; see
  :func:`_split_batch` for how a batch is recognised). Each message gets a sequence number and
  an enqueued time. Queues are created on first use.
* Duplicate detection (on by default, like a queue with ``RequiresDuplicateDetection``): a
  message whose message id was accepted within ``duplicate_detection_window`` seconds is
  accepted on the wire and dropped.
* Peek-lock receive honouring link credit and drain. A delivery carries the lock token as its
  delivery tag (a UUID in ``bytes_le`` order, as the SDK reads it), the header ``delivery-count``
  (deliveries so far minus one: Service Bus puts the number of *previous* attempts on the wire),
  and the message annotations ``x-opt-sequence-number``, ``x-opt-enqueued-time`` and
  ``x-opt-locked-until`` (AMQP timestamps, ms).
* Settlement by disposition on the receive link, echoed back settled with the applied outcome
  (azure-servicebus 7.15 waits for that echo, ``rcv-settle-mode second``):
  ``accepted`` completes; ``modified`` abandons (redelivered with the delivery count + 1);
  ``released`` returns the message without counting the delivery; ``rejected`` with condition
  ``com.microsoft:dead-letter`` moves it to ``<queue>/$DeadLetterQueue`` with the application
  properties ``DeadLetterReason`` and ``DeadLetterErrorDescription`` taken from the error's info
  map. A settlement whose lock expired, or whose message was settled or re-locked since, is
  answered ``rejected`` with ``com.microsoft:message-lock-lost`` (the SDK raises
  ``MessageLockLostError``). ``modified`` with ``undeliverable-here`` (defer) is refused.
* Lock expiry (``lock_duration``) and MaxDeliveryCount (``max_delivery_count``, default 10): a
  message abandoned, or whose lock expires, after its last allowed delivery is dead-lettered with
  reason ``MaxDeliveryCountExceeded``.
* ``$management`` request/response on ``<entity>/$management``: ``com.microsoft:peek-message``
  (used by ``ServiceBusReceiver.peek_messages``), ``com.microsoft:renew-lock`` and
  ``com.microsoft:update-disposition`` (the SDK's settlement fallback). Other operations get
  status 501.

Not implemented: TLS, sessions, topics and subscriptions, scheduled and deferred messages,
time-to-live, transactions, partitioning, and the HTTP management API
(``ServiceBusAdministrationClient``). Dead-lettered messages keep their sequence number and
enqueued time (as on Service Bus); the dead-letter sub-queue has no MaxDeliveryCount.

All broker state lives on the proton container thread; the inspection helpers take a lock and
return snapshots, so tests may call them from any thread.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import queue as queue_module
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pytest
from proton import Condition, Data, Delivery, Described, Endpoint, Handler, Message, symbol, timestamp, ulong
from proton.handlers import FlowController, Handshaker
from proton.reactor import ApplicationEvent, Container, EventInjector

_LOGGER = logging.getLogger(__name__)

DEAD_LETTER_SUFFIX = "/$deadletterqueue"
MANAGEMENT_SUFFIX = "/$management"
CBS_NODE = "$cbs"

DEAD_LETTER_CONDITION = "com.microsoft:dead-letter"
LOCK_LOST_CONDITION = "com.microsoft:message-lock-lost"
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"
MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"

# Message section descriptors (AMQP 1.0 part 3.2).
_HEADER, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
_PROPERTIES, _APPLICATION_PROPERTIES = 0x73, 0x74
_DATA, _AMQP_SEQUENCE, _AMQP_VALUE, _FOOTER = 0x75, 0x76, 0x77, 0x78

_TICK_SECONDS = 0.05  # how often lock expiry is checked
_CREDIT_WINDOW = 200  # credit the broker keeps granted on links it receives on


def _now() -> float:
    return time.time()


def _ms(seconds: float) -> timestamp:
    return timestamp(round(seconds * 1000))


# -- message encoding ------------------------------------------------------------------------


def _sections(payload: bytes) -> list[tuple[int, bytes, Any]]:
    """Split an encoded message into ``(descriptor, raw bytes, decoded value)`` sections."""
    sections: list[tuple[int, bytes, Any]] = []
    view = memoryview(payload)
    pos = 0
    while pos < len(view):
        data = Data()
        consumed = data.decode(bytes(view[pos:]))
        if consumed <= 0:
            raise ValueError(f"undecodable message section at byte {pos}")
        data.rewind()
        data.next()
        value = _detach(data.get_object())
        if not isinstance(value, Described):
            raise ValueError(f"message section at byte {pos} is not a described type")
        descriptor = value.descriptor
        code = int(descriptor) if isinstance(descriptor, int) else _symbolic_descriptor(str(descriptor))
        sections.append((code, bytes(view[pos : pos + consumed]), value.value))
        pos += consumed
    return sections


def _detach(value: Any) -> Any:
    """Copy the memoryviews proton returns (they point into a buffer freed with the Data)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, Described):
        return Described(value.descriptor, _detach(value.value))
    if isinstance(value, dict):
        return type(value)((_detach(k), _detach(v)) for k, v in value.items())
    if isinstance(value, list):
        return type(value)(_detach(v) for v in value) if type(value) is list else [_detach(v) for v in value]
    return value


def _symbolic_descriptor(name: str) -> int:
    names = {
        "amqp:header:list": _HEADER,
        "amqp:delivery-annotations:map": _DELIVERY_ANNOTATIONS,
        "amqp:message-annotations:map": _MESSAGE_ANNOTATIONS,
        "amqp:properties:list": _PROPERTIES,
        "amqp:application-properties:map": _APPLICATION_PROPERTIES,
        "amqp:data:binary": _DATA,
        "amqp:amqp-sequence:list": _AMQP_SEQUENCE,
        "amqp:amqp-value:*": _AMQP_VALUE,
        "amqp:footer:map": _FOOTER,
    }
    if name not in names:
        raise ValueError(f"unknown message section {name!r}")
    return names[name]


def _encode_described(code: int, value: Any) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


def _encode_header(durable: bool, priority: Any, ttl: Any, delivery_count: int) -> bytes:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(_HEADER)
    data.put_list()
    data.enter()
    data.put_bool(bool(durable))
    if priority is None:
        data.put_null()
    else:
        data.put_ubyte(int(priority))
    if ttl is None:
        data.put_null()
    else:
        data.put_uint(int(ttl))
    data.put_bool(delivery_count == 0)  # first-acquirer
    data.put_uint(delivery_count)
    data.exit()
    data.exit()
    return bytes(data.encode())


def _looks_like_message(payload: bytes) -> bool:
    """True when ``payload`` is a complete encoded AMQP message (starts with a section)."""
    if len(payload) < 3 or payload[0] != 0x00:
        return False
    try:
        sections = _sections(payload)
    except Exception:
        return False
    return bool(sections) and all(_HEADER <= code <= _FOOTER for code, _, _ in sections)


def _split_batch(payload: bytes) -> list[bytes]:
    """The messages in one transfer: several for an SDK batch, else just ``payload``.

    proton does not expose a transfer's message-format field, so a batch (format 0x80013700) is
    recognised by its shape: a body made only of data sections, each holding a complete encoded
    message. A single message whose binary body is itself an encoded AMQP message would be
    mistaken for a batch; no client of this broker sends one.
    """
    sections = _sections(payload)
    body = [section for section in sections if section[0] in (_DATA, _AMQP_SEQUENCE, _AMQP_VALUE)]
    if body and all(code == _DATA for code, _, _ in body):
        inner = [bytes(value) for _, _, value in body]
        if all(_looks_like_message(item) for item in inner):
            return inner
    return [payload]


@dataclass
class _Stored:
    """A message held by an entity."""

    seq: int
    message_id: Any
    content_type: str | None
    header: list[Any]  # the sender's header fields (durable, priority, ttl, ...)
    annotations: dict[Any, Any]  # the sender's message annotations
    application_properties: dict[Any, Any] | None
    bare: list[tuple[int, bytes]]  # properties, body and footer sections, byte for byte
    enqueued_at: float
    delivery_count: int = 0  # deliveries so far (1 after the first receive)
    lock_token: uuid.UUID | None = None
    locked_until: float = 0.0
    dead_lettered_at: float | None = None

    @classmethod
    def parse(cls, payload: bytes, seq: int, now: float) -> _Stored:
        header: list[Any] = []
        annotations: dict[Any, Any] = {}
        application_properties: dict[Any, Any] | None = None
        bare: list[tuple[int, bytes]] = []
        message_id = None
        content_type = None
        for code, raw, value in _sections(payload):
            if code == _HEADER:
                header = list(value or [])
            elif code == _DELIVERY_ANNOTATIONS:
                continue  # for the next hop only
            elif code == _MESSAGE_ANNOTATIONS:
                annotations = dict(value or {})
            elif code == _APPLICATION_PROPERTIES:
                application_properties = dict(value or {})
                bare.append((code, raw))
            else:
                if code == _PROPERTIES and value:
                    message_id = value[0]
                    content_type = str(value[6]) if len(value) > 6 and value[6] is not None else None
                bare.append((code, raw))
        return cls(seq, message_id, content_type, header, annotations, application_properties, bare, now)

    def encode(self, *, locked_until: float | None) -> bytes:
        """The message as delivered: header and broker annotations first, then the bare message."""
        durable = self.header[0] if len(self.header) > 0 else False
        priority = self.header[1] if len(self.header) > 1 else None
        ttl = self.header[2] if len(self.header) > 2 else None
        previous_attempts = max(self.delivery_count - 1, 0)
        parts = [_encode_header(bool(durable), priority, ttl, previous_attempts)]
        annotations = dict(self.annotations)
        annotations[symbol("x-opt-sequence-number")] = self.seq
        annotations[symbol("x-opt-enqueued-time")] = _ms(self.enqueued_at)
        if locked_until is not None:
            annotations[symbol("x-opt-locked-until")] = _ms(locked_until)
        parts.append(_encode_described(_MESSAGE_ANNOTATIONS, annotations))
        parts.extend(raw for _, raw in self.bare)
        return b"".join(parts)

    def set_application_properties(self, updates: dict[str, Any]) -> None:
        properties = dict(self.application_properties or {})
        properties.update(updates)
        raw = _encode_described(_APPLICATION_PROPERTIES, properties)
        self.application_properties = properties
        for index, (code, _) in enumerate(self.bare):
            if code == _APPLICATION_PROPERTIES:
                self.bare[index] = (code, raw)
                return
        # Application properties come right after the properties section.
        position = 1 if self.bare and self.bare[0][0] == _PROPERTIES else 0
        self.bare.insert(position, (_APPLICATION_PROPERTIES, raw))

    def body(self) -> Any:
        """Data sections concatenated as bytes, else the decoded amqp-value or sequence."""
        chunks: list[bytes] = []
        for code, raw in self.bare:
            if code in (_DATA, _AMQP_VALUE, _AMQP_SEQUENCE):
                value = _sections(raw)[0][2]
                if code == _DATA:
                    chunks.append(bytes(value))
                else:
                    return value
        return b"".join(chunks)


# -- inspection snapshots ----------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerMessage:
    """A snapshot of one message held by the broker."""

    sequence_number: int
    message_id: Any
    content_type: str | None
    body: Any
    application_properties: dict[str, Any]
    delivery_count: int  # deliveries so far
    locked: bool
    enqueued_at: float
    dead_lettered_at: float | None


@dataclass
class QueueSettings:
    """Per-queue settings, like a Service Bus queue description."""

    lock_duration: float = 60.0
    max_delivery_count: int = 10
    requires_duplicate_detection: bool = True
    duplicate_detection_window: float = 600.0
    max_message_size: int = 256 * 1024  # the Standard tier's limit


class QueueView:
    """Inspection helpers for one queue and its dead-letter sub-queue (thread-safe snapshots)."""

    def __init__(self, broker: Broker, name: str) -> None:
        self._broker = broker
        self.name = name

    @property
    def settings(self) -> QueueSettings:
        return self._broker._queue_state(self.name).settings

    def messages(self) -> list[BrokerMessage]:
        """Active messages (available or locked), in sequence order."""
        with self._broker._lock:
            return [_snapshot(m) for m in self._broker._queue_state(self.name).active.sorted()]

    def dead_letters(self) -> list[BrokerMessage]:
        """Messages in ``<queue>/$DeadLetterQueue``, in sequence order."""
        with self._broker._lock:
            return [_snapshot(m) for m in self._broker._queue_state(self.name).dead.sorted()]

    def message_ids(self) -> list[Any]:
        return [m.message_id for m in self.messages()]

    def dead_letter_ids(self) -> list[Any]:
        return [m.message_id for m in self.dead_letters()]

    def locked_count(self) -> int:
        return sum(1 for m in self.messages() if m.locked)

    def expire_locks(self) -> int:
        """End every lock now, as if the lock duration had passed; returns how many.

        Clients still believe they hold the locks, so their settlements reach the broker and are
        answered with ``com.microsoft:message-lock-lost``.
        """
        with self._broker._lock:
            state = self._broker._queue_state(self.name)
            expired = 0
            for entity in (state.active, state.dead):
                for message in entity.messages.values():
                    if message.lock_token is not None:
                        message.locked_until = 0.0
                        expired += 1
            return expired


def _snapshot(message: _Stored) -> BrokerMessage:
    properties = {_text(k): _plain(v) for k, v in (message.application_properties or {}).items()}
    return BrokerMessage(
        sequence_number=message.seq,
        message_id=message.message_id,
        content_type=message.content_type,
        body=message.body(),
        application_properties=properties,
        delivery_count=message.delivery_count,
        locked=message.lock_token is not None,
        enqueued_at=message.enqueued_at,
        dead_lettered_at=message.dead_lettered_at,
    )


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes | bytearray | memoryview) else str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, bool | str | float) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, memoryview):
        return bytes(value)
    return value


# -- broker state ------------------------------------------------------------------------------


class _Entity:
    """A queue or a dead-letter sub-queue: messages by sequence number plus an availability heap."""

    def __init__(self, path: str, max_delivery_count: int | None) -> None:
        self.path = path
        self.max_delivery_count = max_delivery_count  # None: no limit (dead-letter sub-queue)
        self.messages: dict[int, _Stored] = {}
        self._available: list[int] = []  # heap of sequence numbers, validated lazily
        self.consumers: list[Any] = []  # proton Sender links, in attach order
        self._next_consumer = 0

    def add(self, message: _Stored) -> None:
        self.messages[message.seq] = message
        heapq.heappush(self._available, message.seq)

    def make_available(self, message: _Stored) -> None:
        message.lock_token = None
        message.locked_until = 0.0
        heapq.heappush(self._available, message.seq)

    def next_available(self) -> _Stored | None:
        while self._available:
            seq = self._available[0]
            message = self.messages.get(seq)
            if message is None or message.lock_token is not None:
                heapq.heappop(self._available)
                continue
            return message
        return None

    def take(self, message: _Stored) -> None:
        if self._available and self._available[0] == message.seq:
            heapq.heappop(self._available)

    def sorted(self) -> list[_Stored]:
        return [self.messages[seq] for seq in sorted(self.messages)]

    def consumers_round_robin(self) -> list[Any]:
        if not self.consumers:
            return []
        start = self._next_consumer % len(self.consumers)
        self._next_consumer += 1
        return self.consumers[start:] + self.consumers[:start]


@dataclass
class _QueueState:
    name: str
    settings: QueueSettings
    active: _Entity
    dead: _Entity
    next_seq: int = 1
    duplicates: dict[str, float] = field(default_factory=dict)  # message id -> accepted at


@dataclass
class _Outstanding:
    """An unsettled delivery to a consumer: which message and which lock it carried."""

    entity: _Entity
    queue: _QueueState
    seq: int
    lock_token: uuid.UUID


def _guarded(method: Callable[..., None]) -> Callable[..., None]:
    """Run a proton callback, recording (not raising) errors so the broker thread survives."""

    def wrapper(self: _BrokerHandler, event: Any) -> None:
        try:
            with self.broker._lock:
                method(self, event)
        except Exception as exc:
            _LOGGER.exception("amqp_broker: %s failed", method.__name__)
            self.broker.errors.append(f"{method.__name__}: {exc!r}\n{traceback.format_exc()}")

    wrapper.__name__ = method.__name__
    return wrapper


class _BrokerHandler(Handler):
    def __init__(self, broker: Broker) -> None:
        super().__init__()
        self.broker = broker
        self.handlers = [FlowController(_CREDIT_WINDOW), Handshaker()]
        self._incoming: dict[Any, bytearray] = {}  # partial transfers by proton delivery
        # Unsettled deliveries to consumers (proton decodes delivery tags as text, so a lock
        # token is never read back from the tag: the delivery object itself is the key).
        self._outstanding: dict[Any, _Outstanding] = {}
        self._by_token: dict[uuid.UUID, Any] = {}  # lock token -> delivery
        # proton wrappers hash and compare by the wrapped C object, so they key these maps.
        self._reply_links: dict[tuple[Any, str], Any] = {}  # (connection, address) -> Sender
        self._reply_backlog: dict[Any, list[bytes]] = {}  # Sender -> encoded replies
        self._link_kind: dict[Any, tuple[str, Any]] = {}  # link -> (kind, detail)
        self.connections: dict[Any, Any] = {}  # open connections

    # -- lifecycle ---------------------------------------------------------------------------

    def on_reactor_init(self, event: Any) -> None:
        event.container.schedule(_TICK_SECONDS, _Ticker(self))
        self.broker._ready.set()

    @_guarded
    def on_connection_bound(self, event: Any) -> None:
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS PLAIN")

    @_guarded
    def on_wake(self, event: Any) -> None:
        while True:
            try:
                command = self.broker._commands.get_nowait()
            except queue_module.Empty:
                return
            command(self.broker._container)

    @_guarded
    def on_tick(self, event: Any) -> None:
        now = _now()
        for state in self.broker._queues.values():
            for entity in (state.active, state.dead):
                expired = [m for m in entity.messages.values() if m.lock_token is not None and m.locked_until <= now]
                for message in sorted(expired, key=lambda m: m.seq):
                    self._release_lock(state, entity, message, counted=True, now=now)
                self._dispatch(state, entity)

    # -- links -------------------------------------------------------------------------------

    @_guarded
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if link.is_sender:
            address = _entity_path(link.remote_source.address)
            if address == CBS_NODE or address.lower().endswith(MANAGEMENT_SUFFIX):
                self._reply_links[(link.connection, address.lower())] = link
                self._link_kind[link] = ("reply", address.lower())
            else:
                state, entity = self._resolve(address)
                entity.consumers.append(link)
                self._link_kind[link] = ("consumer", (state, entity))
            link.open()
            if self._link_kind[link][0] == "consumer":
                self._dispatch(state, entity)
        else:
            address = _entity_path(link.remote_target.address)
            if address == CBS_NODE or address.lower().endswith(MANAGEMENT_SUFFIX):
                self._link_kind[link] = ("request", address)
            else:
                state, entity = self._resolve(address)
                if entity is state.dead:  # Service Bus refuses sends to a dead-letter sub-queue
                    link.condition = Condition("amqp:not-allowed", "cannot send to a dead-letter sub-queue")
                    link.open()
                    link.close()
                    return
                link.max_message_size = state.settings.max_message_size
                self._link_kind[link] = ("producer", state)
            link.open()

    @_guarded
    def on_link_remote_close(self, event: Any) -> None:
        self._forget_link(event.link)

    @_guarded
    def on_connection_remote_open(self, event: Any) -> None:
        self.connections[event.connection] = event.connection

    @_guarded
    def on_connection_remote_close(self, event: Any) -> None:
        self._forget_connection(event.connection)

    @_guarded
    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self._forget_connection(event.connection)

    def _forget_connection(self, connection: Any) -> None:
        self.connections.pop(connection, None)
        link = connection.link_head(0)
        while link is not None:
            self._forget_link(link)
            link = link.next(0)

    def _forget_link(self, link: Any) -> None:
        kind, detail = self._link_kind.pop(link, (None, None))
        if kind == "consumer":
            _, entity = detail
            if link in entity.consumers:
                entity.consumers.remove(link)
            for delivery in [d for d in self._outstanding if d.link == link]:
                self._by_token.pop(self._outstanding.pop(delivery).lock_token, None)
        elif kind == "reply":
            self._reply_links.pop((link.connection, detail), None)
            self._reply_backlog.pop(link, None)
        # Locks held through the link stay until they expire, as on Service Bus.

    @_guarded
    def on_link_flow(self, event: Any) -> None:
        link = event.link
        kind, detail = self._link_kind.get(link, (None, None))
        if kind == "consumer":
            state, entity = detail
            self._dispatch(state, entity)
        elif kind == "reply":
            self._flush_replies(link)

    # -- deliveries ----------------------------------------------------------------------------

    @_guarded
    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        link = delivery.link
        if link.is_receiver:
            self._on_transfer(link, delivery)
        elif delivery.updated:
            self._on_disposition(link, delivery)

    def _on_transfer(self, link: Any, delivery: Any) -> None:
        if delivery.aborted:
            self._incoming.pop(delivery, None)
            delivery.settle()
            link.advance()
            return
        if not delivery.readable:
            return
        buffer = self._incoming.setdefault(delivery, bytearray())
        pending = delivery.pending
        if pending:
            buffer.extend(link.recv(pending) or b"")
        if delivery.partial:
            return
        payload = bytes(self._incoming.pop(delivery))
        link.advance()
        kind, detail = self._link_kind.get(link, (None, None))
        try:
            if kind == "producer":
                self._accept_send(link, detail, payload)
            elif kind == "request":
                self._answer_request(link, detail, payload)
            else:
                raise ValueError(f"transfer on an unknown link {link.name!r}")
        except _Refused as refused:
            delivery.local.condition = Condition(refused.condition, refused.description)
            delivery.update(Delivery.REJECTED)
        else:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()

    def _accept_send(self, link: Any, state: _QueueState, payload: bytes) -> None:
        self.broker.transfers_received += 1
        if len(payload) > state.settings.max_message_size:
            raise _Refused(
                "amqp:link:message-size-exceeded",
                f"the message is {len(payload)} bytes; the limit is {state.settings.max_message_size}",
            )
        now = _now()
        messages = []
        for item in _split_batch(payload):
            messages.append(_Stored.parse(item, 0, now))
        settings = state.settings
        if settings.requires_duplicate_detection:
            cutoff = now - settings.duplicate_detection_window
            for key in [k for k, at in state.duplicates.items() if at <= cutoff]:
                del state.duplicates[key]
        for message in messages:
            if settings.requires_duplicate_detection and message.message_id is not None:
                key = str(message.message_id)
                if key in state.duplicates:
                    self.broker.duplicates_dropped += 1
                    continue
                state.duplicates[key] = now
            message.seq = state.next_seq
            state.next_seq += 1
            state.active.add(message)
        self._dispatch(state, state.active)

    def _on_disposition(self, link: Any, delivery: Any) -> None:
        outstanding = self._outstanding.pop(delivery, None)
        if outstanding is not None:
            self._by_token.pop(outstanding.lock_token, None)
        remote = delivery.remote_state
        outcome = Delivery.REJECTED
        condition: Condition | None = None
        message = None
        if outstanding is not None:
            message = outstanding.entity.messages.get(outstanding.seq)
            if message is not None and (message.lock_token != outstanding.lock_token or message.locked_until <= _now()):
                message = None
        if message is None:
            condition = Condition(
                LOCK_LOST_CONDITION,
                "The lock supplied is invalid: it expired, or the message was settled or received again.",
            )
        else:
            assert outstanding is not None
            state, entity = outstanding.queue, outstanding.entity
            if remote == Delivery.ACCEPTED:
                self._complete(entity, message)
                outcome = Delivery.ACCEPTED
            elif remote == Delivery.RELEASED:
                self._release_lock(state, entity, message, counted=False, now=_now())
                outcome = Delivery.RELEASED
            elif remote == Delivery.MODIFIED:
                if delivery.remote.undeliverable:
                    condition = Condition("amqp:not-implemented", "defer is not supported by this broker")
                    self._keep(delivery, outstanding)  # still locked
                else:
                    self._release_lock(state, entity, message, counted=True, now=_now())
                    outcome = Delivery.MODIFIED
            elif remote == Delivery.REJECTED and entity is state.dead:
                condition = Condition("amqp:not-allowed", "a dead letter cannot be dead-lettered again")
                self._keep(delivery, outstanding)  # still locked
            elif remote == Delivery.REJECTED:
                reason, description = _dead_letter_fields(delivery.remote.condition)
                if reason is None and description is None and delivery.remote.condition is None:
                    reason = "Rejected"
                self._dead_letter(state, entity, message, reason or "", description or "")
                outcome = Delivery.REJECTED
            else:
                condition = Condition("amqp:not-implemented", f"unsupported outcome {remote!r}")
                self._keep(delivery, outstanding)
        if not delivery.settled:
            # The client waits for this echo: the outcome applied, or rejected with an error.
            if condition is not None:
                delivery.local.condition = condition
                outcome = Delivery.REJECTED
            elif outcome == Delivery.MODIFIED:
                delivery.local.failed = True
            delivery.update(outcome)
        delivery.settle()
        if outstanding is not None:
            self._dispatch(outstanding.queue, outstanding.entity)

    # -- queue operations --------------------------------------------------------------------

    def _resolve(self, address: str) -> tuple[_QueueState, _Entity]:
        lowered = address.lower()
        if lowered.endswith(DEAD_LETTER_SUFFIX):
            state = self.broker._queue_state(address[: -len(DEAD_LETTER_SUFFIX)])
            return state, state.dead
        state = self.broker._queue_state(address)
        return state, state.active

    def _dispatch(self, state: _QueueState, entity: _Entity) -> None:
        """Deliver available messages to consumers with credit, lowest sequence number first."""
        while True:
            message = entity.next_available()
            consumers = [link for link in entity.consumers_round_robin() if _can_send(link)]
            if message is None or not consumers:
                break
            self._deliver(state, entity, message, consumers[0])
        for link in entity.consumers:
            if link.drain_mode and _can_send(link):
                link.drained()

    def _deliver(self, state: _QueueState, entity: _Entity, message: _Stored, link: Any) -> None:
        entity.take(message)
        now = _now()
        message.delivery_count += 1
        message.lock_token = uuid.uuid4()
        message.locked_until = now + state.settings.lock_duration
        tag = message.lock_token.bytes_le
        payload = message.encode(locked_until=message.locked_until)
        delivery = link.delivery(tag)
        link.send(payload)
        link.advance()
        self.broker.deliveries += 1
        if link.snd_settle_mode == 1:  # settled: receive-and-delete
            delivery.settle()
            self._complete(entity, message)
        else:
            self._keep(delivery, _Outstanding(entity, state, message.seq, message.lock_token))

    def _keep(self, delivery: Any, outstanding: _Outstanding) -> None:
        self._outstanding[delivery] = outstanding
        self._by_token[outstanding.lock_token] = delivery

    def _complete(self, entity: _Entity, message: _Stored) -> None:
        entity.messages.pop(message.seq, None)

    def _release_lock(
        self, state: _QueueState, entity: _Entity, message: _Stored, *, counted: bool, now: float
    ) -> None:
        """Abandon or lock expiry (``counted``), or release (the delivery does not count)."""
        if not counted:
            message.delivery_count = max(message.delivery_count - 1, 0)
        limit = entity.max_delivery_count
        if counted and limit is not None and message.delivery_count >= limit:
            description = f"Message could not be consumed after {message.delivery_count} delivery attempts."
            self._dead_letter(state, entity, message, MAX_DELIVERY_COUNT_EXCEEDED, description, now=now)
            return
        entity.make_available(message)

    def _dead_letter(
        self,
        state: _QueueState,
        entity: _Entity,
        message: _Stored,
        reason: str,
        description: str,
        *,
        now: float | None = None,
    ) -> None:
        assert entity is state.active, "the dead-letter sub-queue has no dead-letter queue"
        entity.messages.pop(message.seq, None)
        message.lock_token = None
        message.locked_until = 0.0
        message.dead_lettered_at = now if now is not None else _now()
        message.set_application_properties({DEAD_LETTER_REASON: reason, DEAD_LETTER_DESCRIPTION: description})
        state.dead.add(message)
        self._dispatch(state, state.dead)

    # -- $cbs and $management ----------------------------------------------------------------

    def _answer_request(self, link: Any, node: str, payload: bytes) -> None:
        request = Message()
        request.decode(payload)
        properties = {_text(k): v for k, v in (request.properties or {}).items()}
        operation = _text(properties.get("operation", ""))
        if node == CBS_NODE:
            reply_properties = {"status-code": 200, "status-description": "OK"}
            body: Any = None
        else:
            entity_address = node[: -len(MANAGEMENT_SUFFIX)]
            status, description, body = self._management(entity_address, operation, request.body)
            reply_properties = {"statusCode": status, "statusDescription": description}
            if status >= 400:
                reply_properties["errorCondition"] = symbol(_error_condition(status))
        reply = Message(body=body, properties=reply_properties)
        reply.correlation_id = request.id
        reply_to = _entity_path(request.reply_to).lower() if request.reply_to else node
        target = self._reply_links.get((link.connection, reply_to)) or self._reply_links.get(
            (link.connection, node.lower())
        )
        if target is None:
            raise _Refused("amqp:not-found", f"no reply link for {reply_to!r}")
        self._reply_backlog.setdefault(target, []).append(bytes(reply.encode()))
        self._flush_replies(target)

    def _flush_replies(self, link: Any) -> None:
        backlog = self._reply_backlog.get(link, [])
        while backlog and _can_send(link):
            delivery = link.delivery(uuid.uuid4().bytes)
            link.send(backlog.pop(0))
            link.advance()
            delivery.settle()

    def _management(self, address: str, operation: str, body: Any) -> tuple[int, str, Any]:
        state, entity = self._resolve(address)
        request = {_text(k): v for k, v in (body or {}).items()} if isinstance(body, dict) else {}
        if operation == "com.microsoft:peek-message":
            start = int(request.get("from-sequence-number", 1))
            count = int(request.get("message-count", 1))
            found = [m for m in entity.sorted() if m.seq >= start][:count]
            if not found:
                return 204, "No messages", None
            encoded = [{"message": m.encode(locked_until=m.locked_until if m.lock_token else None)} for m in found]
            return 200, "OK", {"messages": encoded}
        if operation == "com.microsoft:renew-lock":
            now = _now()
            expirations = []
            for token in _tokens(request.get("lock-tokens")):
                message = next((m for m in entity.messages.values() if m.lock_token == token), None)
                if message is None or message.locked_until <= now:
                    return 410, "The lock supplied is invalid.", None
                message.locked_until = now + state.settings.lock_duration
                expirations.append(_ms(message.locked_until))
            return 200, "OK", {"expirations": expirations}
        if operation == "com.microsoft:update-disposition":
            status = _text(request.get("disposition-status", ""))
            now = _now()
            for token in _tokens(request.get("lock-tokens")):
                message = next((m for m in entity.messages.values() if m.lock_token == token), None)
                if message is None or message.locked_until <= now:
                    return 410, "The lock supplied is invalid.", None
                stale = self._by_token.pop(token, None)
                if stale is not None:
                    self._outstanding.pop(stale, None)
                if status == "completed":
                    self._complete(entity, message)
                elif status == "abandoned":
                    self._release_lock(state, entity, message, counted=True, now=now)
                elif status == "suspended" and entity is state.dead:
                    return 400, "a dead letter cannot be dead-lettered again", None
                elif status == "suspended":
                    self._dead_letter(
                        state,
                        entity,
                        message,
                        _text(request.get("deadletter-reason") or ""),
                        _text(request.get("deadletter-description") or ""),
                    )
                else:
                    return 501, f"disposition {status!r} is not supported", None
            self._dispatch(state, entity)
            return 200, "OK", {}
        return 501, f"operation {operation!r} is not implemented by this broker", None


class _Ticker(Handler):
    def __init__(self, handler: _BrokerHandler) -> None:
        super().__init__()
        self._handler = handler

    def on_timer_task(self, event: Any) -> None:
        if self._handler.broker._stopping:
            return
        self._handler.on_tick(event)
        event.container.schedule(_TICK_SECONDS, self)


class _Refused(Exception):
    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description


def _can_send(link: Any) -> bool:
    return bool(link.credit > 0 and link.state & Endpoint.LOCAL_ACTIVE and link.state & Endpoint.REMOTE_ACTIVE)


def _entity_path(address: str | None) -> str:
    """``amqps://host:port/queue/$DeadLetterQueue`` -> ``queue/$DeadLetterQueue``."""
    if not address:
        return ""
    parsed = urlparse(address)
    if parsed.scheme and parsed.netloc:
        return parsed.path.lstrip("/")
    return address


def _dead_letter_fields(condition: Condition | None) -> tuple[str | None, str | None]:
    if condition is None:
        return None, None
    info = {_text(k): v for k, v in (condition.info or {}).items()} if isinstance(condition.info, dict) else {}
    reason = info.get(DEAD_LETTER_REASON)
    description = info.get(DEAD_LETTER_DESCRIPTION, condition.description)
    if condition.name != DEAD_LETTER_CONDITION and reason is None:
        reason = condition.name
    return (_text(reason) if reason is not None else None, _text(description) if description is not None else None)


def _tokens(value: Any) -> list[uuid.UUID]:
    if value is None:
        return []
    items = getattr(value, "elements", value)
    return [item if isinstance(item, uuid.UUID) else uuid.UUID(str(item)) for item in items]


def _error_condition(status: int) -> str:
    return {
        400: "com.microsoft:argument-error",
        404: "com.microsoft:message-not-found",
        410: LOCK_LOST_CONDITION,
        501: "amqp:not-implemented",
    }.get(status, "amqp:internal-error")


# -- the broker --------------------------------------------------------------------------------


class Broker:
    """An in-process AMQP 1.0 broker for the azure-servicebus SDK; see the module docstring.

    ``Broker(port=0)`` picks a free loopback port. ``start()`` runs it in a daemon thread;
    ``stop()`` ends it. Queue settings (``lock_duration``, ``max_delivery_count``, duplicate
    detection, ``max_message_size``) default to ``default_settings`` and can be changed per
    queue with :meth:`queue`.
    """

    def __init__(
        self, port: int = 0, *, host: str = "127.0.0.1", default_settings: QueueSettings | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.default_settings = default_settings or QueueSettings()
        self.errors: list[str] = []  # failures inside broker callbacks; a test should see none
        self.deliveries = 0  # transfers to consumers
        self.transfers_received = 0  # transfers from producers (a batch counts once)
        self.duplicates_dropped = 0
        self._lock = threading.RLock()
        self._queues: dict[str, _QueueState] = {}
        self._ready = threading.Event()
        self._commands: queue_module.Queue[Callable[[Any], None]] = queue_module.Queue()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._container: Container | None = None
        self._injector: EventInjector | None = None
        self._acceptor: Any = None
        self._handler: _BrokerHandler | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Broker:
        if self._thread is not None:
            raise RuntimeError("the broker is already started")
        handler = self._handler = _BrokerHandler(self)
        container = Container(handler)
        container.container_id = "amqp-broker"
        injector = EventInjector()
        container.selectable(injector)
        self._acceptor = container.listen(f"{self.host}:{self.port}")
        if self.port == 0:  # the kernel chose: read it from the listening socket
            try:
                self.port = int(self._acceptor._selectable._delegate.getsockname()[1])
            except AttributeError:  # a proton without these internals: pick a port and listen again
                self._acceptor.close()
                self.port = _free_port(self.host)
                self._acceptor = container.listen(f"{self.host}:{self.port}")
        self._container, self._injector = container, injector
        self._thread = threading.Thread(target=self._run, name=f"amqp-broker:{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the AMQP broker did not start within {timeout} s")
        deadline = time.monotonic() + timeout
        while True:  # the listener is up once a TCP connect succeeds
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the AMQP broker is not accepting on {self.host}:{self.port}") from None
                time.sleep(0.02)
        return self

    def _run(self) -> None:
        assert self._container is not None
        try:
            self._container.run()
        except Exception as exc:
            self.errors.append(f"container stopped: {exc!r}\n{traceback.format_exc()}")
            self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection and stop the broker thread; idempotent."""
        if self._thread is None or self._stopping:
            return
        self._stopping = True

        def shutdown(container: Any) -> None:
            if self._acceptor is not None:
                self._acceptor.close()
            for connection in list(self._handler.connections.values()):
                with contextlib.suppress(Exception):
                    connection.close()
            if self._injector is not None:
                self._injector.close()
            container.stop()

        self._call(shutdown)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the AMQP broker did not stop within {timeout} s")

    def _call(self, command: Callable[[Any], None]) -> None:
        """Run ``command(container)`` on the broker thread."""
        assert self._injector is not None
        self._commands.put(command)
        self._injector.trigger(ApplicationEvent("wake"))

    def __enter__(self) -> Broker:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and inspection --------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"sb://{self.host}:{self.port}/"

    @property
    def connection_string(self) -> str:
        """The form azure-servicebus 7.15 accepts for a plain-AMQP host:port (no TLS).

        ``UseDevelopmentEmulator=true`` makes the SDK keep the port and turn TLS off; a key is
        required by the parser but never checked here.
        """
        return (
            f"Endpoint={self.endpoint};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=not-checked;UseDevelopmentEmulator=true"
        )

    def queue(self, name: str, **settings: Any) -> QueueView:
        """Inspection helpers for queue ``name``, creating it (with ``settings``) if needed.

        ``settings`` are :class:`QueueSettings` fields and change the queue's settings at once.
        """
        with self._lock:
            state = self._queue_state(name)
            for key, value in settings.items():
                if not hasattr(state.settings, key):
                    raise TypeError(f"unknown queue setting {key!r}")
                setattr(state.settings, key, value)
            state.active.max_delivery_count = state.settings.max_delivery_count
        return QueueView(self, state.name)

    def queue_names(self) -> list[str]:
        with self._lock:
            return sorted(state.name for state in self._queues.values())

    def _queue_state(self, name: str) -> _QueueState:
        key = name.lower()
        with self._lock:
            state = self._queues.get(key)
            if state is None:
                settings = QueueSettings(**vars(self.default_settings))
                state = _QueueState(
                    name=name,
                    settings=settings,
                    active=_Entity(name, settings.max_delivery_count),
                    dead=_Entity(name + "/$DeadLetterQueue", None),
                )
                self._queues[key] = state
            return state


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# -- pytest fixture ----------------------------------------------------------------------------

BROKER_START_TIMEOUT = 15.0


@pytest.fixture
def amqp_broker() -> Iterator[Broker]:
    """A started :class:`Broker` on a free loopback port, stopped after the test."""
    broker = Broker(port=0)
    broker.start(timeout=BROKER_START_TIMEOUT)
    try:
        yield broker
    finally:
        broker.stop()
    assert not broker.errors, "the AMQP broker reported errors:\n" + "\n".join(broker.errors)
