"""The Azure Service Bus adapter of the work-queue port (``azure-servicebus``, sync client).

One :class:`ServiceBusQueue` wraps one queue of a namespace in peek-lock mode. It keeps one
sender and one receiver open (created on first use) and, for the dead-letter operations, one
receiver on ``<queue>/$DeadLetterQueue``. Only this module imports ``azure.servicebus``.

How the port maps onto Service Bus:

* **Delivery count.** The SDK's ``delivery_count`` is the AMQP header's, which Service Bus sets
  to the number of *previous* delivery attempts (0 on the first delivery; the .NET and Java
  SDKs add 1). :class:`~agent_learning.queue.ReceivedMessage` counts from 1, like the SQLite
  queue, so this adapter adds 1.
* **Settlement** goes through the receiver that received the message: :meth:`receive` keeps a
  map from lock token to the SDK message. A token this object did not hand out, already
  settled, or whose lock expired raises :class:`~agent_learning.core.errors.ConcurrencyConflict`, as
  does the SDK's ``MessageLockLostError`` / ``MessageAlreadySettled``.
* **Lock duration, MaxDeliveryCount and duplicate detection** are properties of the queue in
  Azure (Bicep), not of this object. :meth:`send` returns how many messages were handed to
  Service Bus: it cannot see which of them the broker dropped as duplicates.
* **Replay.** With duplicate detection on, a copy sent with the dead letter's own message id
  within the detection window would be dropped by Service Bus *after* the dead letter had been
  completed, losing the message. So by default (``replay_with_new_message_id=True``) the copy
  gets a fresh message id and carries the original in the application property
  :data:`ORIGINAL_MESSAGE_ID_PROPERTY`; this adapter reports the original id everywhere
  (received messages and dead letters), so the port's message id survives a replay. With
  ``replay_with_new_message_id=False`` the copy reuses the id, which is only safe when the
  queue has no duplicate detection or the window has certainly passed. Either way the copy
  carries :data:`REPLAY_PROPERTY`, so a replay never replays its own copies: it moves the dead
  letters once and ends, even while a consumer dead-letters the copies again.
* **Dead letters** are listed with ``peek_messages`` on the dead-letter sub-queue, in sequence
  number order (a ``$management`` request: no lock is taken and delivery counts do not move;
  the test broker serves it too). Service Bus has no dead-lettering timestamp:
  ``dead_lettered_at`` is the enqueued time the sub-queue reports, which a dead letter keeps
  from the original send, so it is a lower bound.
* **Application properties.** Received keys and string values arrive as ``bytes`` from the SDK
  and are decoded to ``str`` (a binary value another client sent too, its bytes that are not
  UTF-8 as ``\\xNN`` escapes, rather than failing the receive). azure-servicebus 7.15 cannot
  send a Python ``int`` outside the 32-bit range (Azure/azure-sdk-for-python#34717), so such
  ints are sent as AMQP longs with the SDK's own (private) wrapper;
  :class:`~agent_learning.queue.OutgoingMessage` refuses ints beyond 64 bits, on every adapter.
* **Counts** come from ``ServiceBusAdministrationClient.get_queue_runtime_properties`` (HTTPS,
  not AMQP). Service Bus reports no lock count, so ``locked`` counts the unexpired locks held by
  *this object* only. This path is not exercised against a broker in the tests: the local AMQP
  test broker does not serve the HTTP management API (against it, :meth:`counts` fails with
  :class:`~agent_learning.core.errors.TransientError` within ``operation_timeout``, retries included).
* **Errors.** ``ServiceBusConnectionError``, ``ServiceBusCommunicationError``,
  ``OperationTimeoutError`` and ``ServiceBusServerBusyError`` (after the SDK's own retries) are
  raised as :class:`~agent_learning.core.errors.TransientError` with the SDK error as the cause, as
  are the administration API's connection failures and 408/429/5xx answers; anything else
  propagates unchanged.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageBatch,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSender,
    ServiceBusSubQueue,
)
from azure.servicebus.amqp import AmqpMessageBodyType
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageLockLostError,
    MessageSizeExceededError,
    OperationTimeoutError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, TransientError
from agent_learning.queue.base import (
    LOCK_SECONDS,
    MAX_MESSAGE_ID_CHARS,
    DeadLetter,
    OutgoingMessage,
    PropertyValue,
    QueueCounts,
    ReceivedMessage,
    WorkQueue,
    dead_letter_text,
)

try:  # the SDK's own wrapper for an AMQP long (private: see _wire_properties)
    from azure.servicebus._pyamqp.utils import amqp_long_value as _amqp_long
except ImportError:  # pragma: no cover - a future SDK; plain ints then go as they are

    def _amqp_long(value: int) -> Any:
        return value


if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.servicebus.management import ServiceBusAdministrationClient

ORIGINAL_MESSAGE_ID_PROPERTY = "agent-learning-original-message-id"
"""Application property of a replayed copy: the message id the port reports for it."""

REPLAY_PROPERTY = "agent-learning-replay"
"""Application property of a replayed copy: the replay that sent it, which does not replay it again
when a consumer dead-letters it before that replay ends."""

_REPLAY_PROPERTIES = (ORIGINAL_MESSAGE_ID_PROPERTY, REPLAY_PROPERTY)  # only a replay may send them

DEAD_LETTER_REASON_PROPERTY = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION_PROPERTY = "DeadLetterErrorDescription"
_SYSTEM_PROPERTIES = frozenset(
    {ORIGINAL_MESSAGE_ID_PROPERTY, REPLAY_PROPERTY, DEAD_LETTER_REASON_PROPERTY, DEAD_LETTER_DESCRIPTION_PROPERTY}
)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ServiceBusConnectionError,
    ServiceBusCommunicationError,
    OperationTimeoutError,
    ServiceBusServerBusyError,
)
"""SDK errors raised as :class:`TransientError` (the SDK has already retried them)."""

CONTENT_TYPE = "application/json"

PEEK_PAGE = 250
"""Dead letters peeked per request when a replay counts those it must move."""

_QUEUE_KEYWORDS = frozenset(
    {"max_wait_time", "send_timeout", "operation_timeout", "replay_with_new_message_id", "replay_batch_size",
     "lock_seconds"}
)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class ServiceBusQueue(WorkQueue):
    """A :class:`WorkQueue` on one Azure Service Bus queue; see the module docstring.

    ``max_wait_time`` bounds each :meth:`receive` (seconds to wait for a first message);
    ``send_timeout`` bounds each batch send; ``operation_timeout`` bounds the other broker
    calls (peek, dead-letter receive) and, retries included, the administration API request of
    :meth:`counts`. Settlement is bounded by the client's ``timeout``
    keyword (SDK default 60 s). ``lock_seconds`` is the queue's LockDuration as deployed
    (``AGENT_LEARNING_QUEUE_LOCK_SECONDS``), which receivers size their work by; the broker's
    own setting decides the lock. ``admin_client`` serves :meth:`counts`; the classmethod
    constructors create one. Methods may be called from several threads: calls are
    serialised, since the SDK's sync handlers are not thread-safe.
    """

    def __init__(
        self,
        client: ServiceBusClient,
        queue_name: str,
        *,
        max_wait_time: float = 5.0,
        send_timeout: float = 30.0,
        operation_timeout: float = 30.0,
        admin_client: ServiceBusAdministrationClient | None = None,
        replay_with_new_message_id: bool = True,
        replay_batch_size: int = 50,
        lock_seconds: float = LOCK_SECONDS,
    ) -> None:
        if not isinstance(queue_name, str) or not queue_name.strip():
            raise ValueError(f"queue_name must be a non-empty string, got {queue_name!r}")
        if isinstance(replay_batch_size, bool) or not isinstance(replay_batch_size, int) or replay_batch_size < 1:
            raise ValueError(f"replay_batch_size must be an integer >= 1, got {replay_batch_size!r}")
        self._client = client
        self.name = queue_name
        self.max_wait_time = _positive("max_wait_time", max_wait_time)
        self.send_timeout = _positive("send_timeout", send_timeout)
        self.operation_timeout = _positive("operation_timeout", operation_timeout)
        self.lock_seconds = _positive("lock_seconds", lock_seconds)
        self.replay_with_new_message_id = bool(replay_with_new_message_id)
        self.replay_batch_size = replay_batch_size
        self._admin: ServiceBusAdministrationClient | _LazyAdmin | None = admin_client
        self._lock = threading.RLock()
        self._sender: ServiceBusSender | None = None
        self._receiver: ServiceBusReceiver | None = None
        self._dead_letter_receiver: ServiceBusReceiver | None = None
        self._locked: dict[str, tuple[ServiceBusReceivedMessage, float]] = {}  # token -> (message, locked_until)
        self._closed = False

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_connection_string(cls, conn_str: str, queue_name: str, **kw: Any) -> ServiceBusQueue:
        """A queue from a connection string (local brokers, tests, SAS keys).

        Keywords of this class (``max_wait_time``, ``send_timeout``, ...) configure the queue;
        any other keyword goes to ``ServiceBusClient.from_connection_string`` (for example
        ``retry_total``, ``timeout`` or ``auth_timeout``).
        """
        queue_kw, client_kw = _split_keywords(kw)
        client = ServiceBusClient.from_connection_string(conn_str, **client_kw)
        queue = cls(client, queue_name, **queue_kw)
        if queue._admin is None:
            queue._admin = _LazyAdmin(lambda: _admin_from_connection_string(conn_str))
        return queue

    @classmethod
    def from_namespace(
        cls,
        fully_qualified_namespace: str,
        queue_name: str,
        credential: TokenCredential | None = None,
        *,
        managed_identity_client_id: str | None = None,
        **kw: Any,
    ) -> ServiceBusQueue:
        """A queue in Azure, authenticated with Entra ID.

        ``credential`` defaults to ``DefaultAzureCredential()`` (with
        ``managed_identity_client_id`` for a user-assigned managed identity). The identity needs
        "Azure Service Bus Data Sender" and "Data Receiver" on the queue, and a management read
        role for :meth:`counts`. Other keywords are split as in :meth:`from_connection_string`.
        """
        if credential is None:
            from azure.identity import DefaultAzureCredential  # lazy: only with Entra ID

            if managed_identity_client_id:
                credential = DefaultAzureCredential(managed_identity_client_id=managed_identity_client_id)
            else:
                credential = DefaultAzureCredential()
        elif managed_identity_client_id:
            raise ValueError("pass either credential or managed_identity_client_id, not both")
        queue_kw, client_kw = _split_keywords(kw)
        client = ServiceBusClient(fully_qualified_namespace, credential, **client_kw)
        queue = cls(client, queue_name, **queue_kw)
        if queue._admin is None:
            chosen = credential
            queue._admin = _LazyAdmin(lambda: _admin_from_namespace(fully_qualified_namespace, chosen))
        return queue

    def __repr__(self) -> str:
        namespace = getattr(self._client, "fully_qualified_namespace", "?")
        return f"ServiceBusQueue({namespace!r}, {self.name!r})"

    # -- handlers ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _get_sender(self) -> ServiceBusSender:
        if self._sender is None:
            self._sender = self._client.get_queue_sender(self.name)
        return self._sender

    def _get_receiver(self) -> ServiceBusReceiver:
        if self._receiver is None:
            self._receiver = self._client.get_queue_receiver(
                self.name,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                max_wait_time=self.max_wait_time,
                prefetch_count=0,
            )
        return self._receiver

    def _get_dead_letter_receiver(self) -> ServiceBusReceiver:
        if self._dead_letter_receiver is None:
            self._dead_letter_receiver = self._client.get_queue_receiver(
                self.name,
                sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
                max_wait_time=self.max_wait_time,
                prefetch_count=0,
            )
        return self._dead_letter_receiver

    def close(self) -> None:
        """Close the sender, the receivers and the client; idempotent."""
        with self._lock:
            handlers = [self._sender, self._receiver, self._dead_letter_receiver]
            self._sender = self._receiver = self._dead_letter_receiver = None
            self._locked.clear()
            if self._closed:
                return
            self._closed = True
            errors: list[BaseException] = []
            for handler in handlers:
                if handler is not None:
                    try:
                        handler.close()
                    except Exception as exc:
                        errors.append(exc)
            try:
                self._client.close()
            except Exception as exc:
                errors.append(exc)
            if isinstance(self._admin, _LazyAdmin):
                self._admin.close()
            if errors:
                raise errors[0]

    # -- sending -----------------------------------------------------------------------------

    def send(self, messages: Iterable[OutgoingMessage]) -> int:
        """Send ``messages`` in as few batches as fit; returns how many were handed to Service Bus.

        The count includes messages that Service Bus then drops as duplicates (duplicate
        detection happens in the broker and is invisible to the sender). Every batch is built
        before the first is sent, so a message too large for a Service Bus message raises
        :class:`~agent_learning.core.errors.InvalidDocument` (naming ``body``) before anything is
        sent. Each batch is atomic; if a later batch fails, earlier ones stay enqueued, and
        sending the same messages again is safe on a queue with duplicate detection.
        """
        outgoing = []
        for message in messages:
            if not isinstance(message, OutgoingMessage):
                raise TypeError(f"send() takes OutgoingMessage objects, got {type(message).__name__}")
            if reserved := [key for key in _REPLAY_PROPERTIES if key in message.properties]:
                problem = "is reserved for replayed messages"
                raise InvalidDocument("message", [(f"properties.{key}", problem) for key in reserved])
            outgoing.append(message)
        if not outgoing:
            return 0
        with self._lock, self._translate("send"):
            self._check_open()
            sender = self._get_sender()
            batches = self._batches(sender, [_to_service_bus(m.message_id, m.body, m.properties) for m in outgoing])
            for batch in batches:
                sender.send_messages(batch, timeout=self.send_timeout)
        return len(outgoing)

    @staticmethod
    def _batches(sender: ServiceBusSender, messages: Iterable[ServiceBusMessage]) -> list[ServiceBusMessageBatch]:
        batches = [sender.create_message_batch()]
        for message in messages:
            try:
                batches[-1].add_message(message)
                continue
            except MessageSizeExceededError:
                if len(batches[-1]) == 0:
                    raise _too_large(message, batches[-1]) from None
            batches.append(sender.create_message_batch())
            try:
                batches[-1].add_message(message)
            except MessageSizeExceededError:
                raise _too_large(message, batches[-1]) from None
        return [batch for batch in batches if len(batch)]

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, max_messages: int = 1) -> list[ReceivedMessage]:
        """Lock and return up to ``max_messages``, waiting up to ``max_wait_time`` for the first."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be an integer >= 1, got {max_messages!r}")
        with self._lock, self._translate("receive"):
            self._check_open()
            self._forget_expired()
            received = self._get_receiver().receive_messages(
                max_message_count=max_messages, max_wait_time=self.max_wait_time
            )
            result = []
            for message in received:
                converted = _to_received(message)
                self._locked[converted.lock_token] = (message, converted.locked_until)
                result.append(converted)
            return result

    def _forget_expired(self) -> None:
        now = time.time()
        for token in [t for t, (_, until) in self._locked.items() if until <= now]:
            del self._locked[token]

    # -- settlement --------------------------------------------------------------------------

    def complete(self, message: ReceivedMessage) -> None:
        self._settle(message, "complete")

    def abandon(self, message: ReceivedMessage) -> None:
        self._settle(message, "abandon")

    def dead_letter(self, message: ReceivedMessage, reason: str, description: str = "") -> None:
        if not isinstance(reason, str) or not isinstance(description, str):
            raise TypeError("reason and description must be strings")
        self._settle(message, "dead_letter", dead_letter_text(reason), dead_letter_text(description))

    def _settle(self, message: ReceivedMessage, action: str, reason: str = "", description: str = "") -> None:
        with self._lock:
            self._check_open()
            token = getattr(message, "lock_token", None)
            entry = self._locked.pop(token, None) if isinstance(token, str) else None
            if entry is None:
                raise self._lock_lost(message, "this queue object holds no lock with that token")
            sdk_message, locked_until = entry
            if locked_until <= time.time():
                raise self._lock_lost(message, "the lock expired")
            receiver = self._receiver
            if receiver is None:
                raise self._lock_lost(message, "the receiver that held it was closed")
            try:
                with self._translate(action):
                    if action == "complete":
                        receiver.complete_message(sdk_message)
                    elif action == "abandon":
                        receiver.abandon_message(sdk_message)
                    else:
                        receiver.dead_letter_message(sdk_message, reason=reason, error_description=description)
            except (MessageLockLostError, MessageAlreadySettled) as exc:
                raise self._lock_lost(message, str(exc) or type(exc).__name__) from exc
            except TransientError:  # not settled: the lock is still held, and a retry may settle it
                self._locked[token] = entry
                raise

    def _lock_lost(self, message: ReceivedMessage, why: str) -> ConcurrencyConflict:
        message_id = getattr(message, "message_id", "?")
        return ConcurrencyConflict(f"lock lost for message {message_id!r} in queue {self.name!r}: {why}")

    # -- dead letters ------------------------------------------------------------------------

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters in sequence-number order, read with peek (no locks taken)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        with self._lock, self._translate("dead_letters"):
            self._check_open()
            result: list[DeadLetter] = []
            for page in self._peeked_pages(limit):
                result.extend(_to_dead_letter(m) for m in page)
            return result[:limit]

    def _peeked_pages(self, limit: int | None = None) -> Iterator[list[ServiceBusReceivedMessage]]:
        """The dead letters in sequence-number order, page by page, up to ``limit`` (None: all),
        peeked (no locks taken)."""
        receiver = self._get_dead_letter_receiver()
        seen = 0
        next_sequence = 1  # peek from the start every time (the SDK's own cursor moves on)
        while limit is None or seen < limit:
            page = receiver.peek_messages(
                max_message_count=PEEK_PAGE if limit is None else limit - seen,
                sequence_number=next_sequence,
                timeout=self.operation_timeout,
            )
            if not page:
                return
            yield page
            seen += len(page)
            next_sequence = max(m.sequence_number or 0 for m in page) + 1

    def replay_dead_letters(self, message_ids: Iterable[str] | None = None) -> int:
        """Move dead letters (all, or those with the given ids) back to the queue; returns how many.

        Dead letters are received from the dead-letter sub-queue in peek-lock mode; each chosen
        one is sent to the queue as a copy (same body, application properties and content type;
        the message id as described in the module docstring) and then completed. A copy is sent
        before its dead letter is completed, so a failure in between duplicates rather than
        loses. Dead letters not chosen stay locked until the replay ends and are then abandoned
        (which increments their delivery count in the sub-queue); the replay must finish within
        the queue's lock duration: a dead letter whose lock expired raises
        :class:`~agent_learning.core.errors.ConcurrencyConflict` saying so. A copy this replay sent that
        is dead-lettered again before it ends (a consumer still failing) is left for the next
        replay, so the replay ends. It ends as soon as it has received every dead letter peeked
        when it began (an empty sub-queue at once), so it waits ``max_wait_time`` for a next
        message only when one of those is locked elsewhere.
        """
        wanted: set[str] | None = None
        if message_ids is not None:
            if isinstance(message_ids, str):
                raise TypeError("message_ids must be an iterable of ids, not a single string")
            wanted = set(message_ids)
            if not wanted:
                return 0
        replayed = 0
        skipped: list[ServiceBusReceivedMessage] = []
        replay = uuid.uuid4().hex
        with self._lock:
            self._check_open()
            with self._translate("replay_dead_letters"):
                receiver = self._get_dead_letter_receiver()
                waiting = {m.sequence_number for page in self._peeked_pages() for m in page}  # there when it began
                sender = self._get_sender()
                try:
                    while waiting:
                        page = receiver.receive_messages(
                            max_message_count=self.replay_batch_size,
                            max_wait_time=min(self.max_wait_time, self.operation_timeout),
                        )
                        if not page:
                            break
                        chosen = []
                        for message in page:
                            waiting.discard(message.sequence_number)
                            own = _properties(message.application_properties).get(REPLAY_PROPERTY) == replay
                            if not own and (wanted is None or _port_message_id(message) in wanted):
                                chosen.append(message)
                            else:
                                skipped.append(message)
                        if chosen:
                            copies = [self._replay_copy(m, replay) for m in chosen]
                            for batch in self._batches(sender, copies):
                                sender.send_messages(batch, timeout=self.send_timeout)
                            for message in chosen:
                                try:
                                    receiver.complete_message(message)
                                except (MessageLockLostError, MessageAlreadySettled) as exc:
                                    raise ConcurrencyConflict(
                                        f"replay of queue {self.name!r} outlasted the dead-letter lock after"
                                        f" {replayed} replayed: {_port_message_id(message)!r} and the other"
                                        " dead letters sent with it stay dead-lettered, their copies sent;"
                                        " replay them again (a copy already scored is a duplicate)"
                                    ) from exc
                                replayed += 1
                finally:
                    for message in skipped:
                        with suppress(Exception):  # best effort: the lock expires anyway
                            receiver.abandon_message(message)
        return replayed

    def _replay_copy(self, dead: ServiceBusReceivedMessage, replay: str) -> ServiceBusMessage:
        original_id = _port_message_id(dead)
        properties = {
            key: value
            for key, value in _properties(dead.application_properties).items()
            if key not in _SYSTEM_PROPERTIES
        }
        properties[REPLAY_PROPERTY] = replay
        if self.replay_with_new_message_id:
            properties[ORIGINAL_MESSAGE_ID_PROPERTY] = original_id
            message_id = uuid.uuid4().hex
        else:
            message_id = original_id
        return _to_service_bus(message_id, _body_bytes(dead), properties, _text(dead.content_type) or CONTENT_TYPE)

    # -- counts ------------------------------------------------------------------------------

    def counts(self) -> QueueCounts:
        """Active and dead-letter counts from the administration API; ``locked`` is this object's.

        Raises :class:`NotImplementedError` when the queue was built without an administration
        client (the plain constructor without ``admin_client``).
        """
        with self._lock:
            self._check_open()
            if self._admin is None:
                raise NotImplementedError(
                    "counts() needs a ServiceBusAdministrationClient: build the queue with "
                    "from_connection_string()/from_namespace() or pass admin_client="
                )
            admin = self._admin.get() if isinstance(self._admin, _LazyAdmin) else self._admin
            with self._translate("counts"):
                # azure-core's defaults wait 300 s for a reply, per retry: bound the whole call.
                bound = self.operation_timeout
                runtime = admin.get_queue_runtime_properties(
                    self.name, timeout=bound, connection_timeout=bound, read_timeout=bound
                )
            self._forget_expired()
            return QueueCounts(
                active=int(runtime.active_message_count or 0),
                locked=len(self._locked),
                dead_letter=int(runtime.dead_letter_message_count or 0),
            )

    def oldest_enqueued_at(self) -> float | None:
        """The enqueued time of the first message a peek from the start of the queue finds."""
        with self._lock, self._translate("oldest_enqueued_at"):
            self._check_open()
            page = self._get_receiver().peek_messages(
                max_message_count=1, sequence_number=1, timeout=self.operation_timeout
            )
        enqueued = page[0].enqueued_time_utc if page else None
        return enqueued.timestamp() if enqueued is not None else None

    # -- errors ------------------------------------------------------------------------------

    @contextmanager
    def _translate(self, operation: str) -> Iterator[None]:
        try:
            yield
        except TRANSIENT_ERRORS as exc:
            raise TransientError(f"Service Bus {operation} on queue {self.name!r} failed: {exc}") from exc
        except Exception as exc:
            transient = _transient_http_error(exc)
            if transient:
                raise TransientError(f"Service Bus {operation} on queue {self.name!r} failed: {exc}") from exc
            raise


# -- conversions -------------------------------------------------------------------------------


def _split_keywords(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    queue_kw = {k: v for k, v in kw.items() if k in _QUEUE_KEYWORDS or k == "admin_client"}
    client_kw = {k: v for k, v in kw.items() if k not in queue_kw}
    return queue_kw, client_kw


_INT32 = range(-(2**31), 2**31)


def _wire_properties(properties: Mapping[str, PropertyValue]) -> dict[str, Any]:
    """Application properties as the SDK must be given them.

    azure-servicebus 7.15 encodes every Python ``int`` as an AMQP int (32 bits) and raises
    ``ValueError`` for anything larger (Azure/azure-sdk-for-python#34717), so larger ints are
    wrapped as AMQP longs with the SDK's own helper (:class:`OutgoingMessage` refuses ints
    beyond 64 bits).
    """
    wire: dict[str, Any] = {}
    for key, value in properties.items():
        if isinstance(value, int) and not isinstance(value, bool) and value not in _INT32:
            wire[key] = _amqp_long(value)
        else:
            wire[key] = value
    return wire


def _to_service_bus(
    message_id: str,
    body: str | bytes,
    properties: Mapping[str, PropertyValue],
    content_type: str = CONTENT_TYPE,
) -> ServiceBusMessage:
    return ServiceBusMessage(
        body,
        message_id=message_id,
        application_properties=_wire_properties(properties),
        content_type=content_type,
    )


def _too_large(message: ServiceBusMessage, batch: ServiceBusMessageBatch) -> InvalidDocument:
    return InvalidDocument(
        "message",
        [
            (
                "body",
                f"message {message.message_id!r} does not fit in one Service Bus message"
                f" ({batch.max_size_in_bytes} bytes including properties)",
            )
        ],
    )


def _text(value: Any) -> Any:
    """``bytes`` from the SDK as ``str``: it hands AMQP strings over as bytes, and cannot tell them from
    binary values (another client's), whose bytes that are not UTF-8 become ``\\xNN`` escapes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    return value


def _properties(raw: Mapping[Any, Any] | None) -> dict[str, PropertyValue]:
    """Application properties with the SDK's bytes keys and string values decoded to str."""
    return {str(_text(key)): _text(value) for key, value in (raw or {}).items()}


def _body_bytes(message: ServiceBusReceivedMessage) -> bytes:
    """The body as bytes: data sections joined, a string or binary value as it is.

    Another client may send an AMQP value or sequence body of any other type; it becomes its JSON
    text (its ``repr`` if it has none), which the scorer rejects like any malformed message,
    instead of the conversion failing the receive of every message delivered with it.
    """
    body = message.body
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    if message.body_type == AmqpMessageBodyType.DATA:  # an iterable of sections
        return b"".join(bytes(chunk) if not isinstance(chunk, str) else chunk.encode("utf-8") for chunk in body)
    value = list(body) if message.body_type == AmqpMessageBodyType.SEQUENCE else body
    try:
        return json.dumps(value, default=repr).encode("ascii")
    except (TypeError, ValueError):  # keys JSON cannot have
        return repr(value).encode("utf-8", errors="backslashreplace")


def _port_message_id(message: ServiceBusReceivedMessage) -> str:
    properties = _properties(message.application_properties)
    original = properties.get(ORIGINAL_MESSAGE_ID_PROPERTY)
    if isinstance(original, str) and 1 <= len(original) <= MAX_MESSAGE_ID_CHARS:
        return original
    return str(_text(message.message_id))


def _delivery_count(message: ServiceBusReceivedMessage) -> int:
    # The header carries previous attempts; the port counts deliveries (1 on the first).
    return int(message.delivery_count or 0) + 1


def _user_properties(message: ServiceBusReceivedMessage) -> dict[str, PropertyValue]:
    return {k: v for k, v in _properties(message.application_properties).items() if k not in _SYSTEM_PROPERTIES}


def _to_received(message: ServiceBusReceivedMessage) -> ReceivedMessage:
    locked_until = message.locked_until_utc
    enqueued = message.enqueued_time_utc
    return ReceivedMessage(
        message_id=_port_message_id(message),
        body=_body_bytes(message),
        properties=_user_properties(message),
        delivery_count=_delivery_count(message),
        lock_token=str(message.lock_token),
        enqueued_at=enqueued.timestamp() if enqueued is not None else time.time(),
        locked_until=locked_until.timestamp() if locked_until is not None else time.time(),
    )


def _to_dead_letter(message: ServiceBusReceivedMessage) -> DeadLetter:
    enqueued = message.enqueued_time_utc
    return DeadLetter(
        message_id=_port_message_id(message),
        body=_body_bytes(message),
        properties=_user_properties(message),
        delivery_count=_delivery_count(message),
        reason=message.dead_letter_reason or "",
        description=message.dead_letter_error_description or "",
        dead_lettered_at=enqueued.timestamp() if enqueued is not None else 0.0,
    )


def _transient_http_error(exc: BaseException) -> bool:
    """True for the administration API's connection failures and 408/429/5xx responses."""
    # lazy: azure.core's errors matter only with the administration client
    from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return True
    if isinstance(exc, HttpResponseError):
        status = getattr(exc, "status_code", None)
        return status in (408, 429) or (isinstance(status, int) and status >= 500)
    return False


# -- the administration client -----------------------------------------------------------------


class _LazyAdmin:
    """Creates the HTTP administration client on first use (most queues never count)."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self._client: ServiceBusAdministrationClient | None = None

    def get(self) -> ServiceBusAdministrationClient:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _admin_from_connection_string(conn_str: str) -> ServiceBusAdministrationClient:
    from azure.servicebus.management import ServiceBusAdministrationClient  # lazy: most queues never count

    return ServiceBusAdministrationClient.from_connection_string(conn_str)


def _admin_from_namespace(namespace: str, credential: Any) -> ServiceBusAdministrationClient:
    from azure.servicebus.management import ServiceBusAdministrationClient  # lazy: most queues never count

    return ServiceBusAdministrationClient(namespace, credential)
