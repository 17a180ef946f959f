"""Count the requests an azure-cosmos client sends, by operation kind, on the client side.

Pass a :class:`RequestCounter` to ``CosmosClient`` (sync or ``azure.cosmos.aio``) as its
client-level ``raw_response_hook`` (``CosmosClient(url, key, **counter.client_kwargs())``, or
``CosmosStore.connect(..., client_kwargs={**CLIENT_KWARGS, **counter.client_kwargs()})``).
azure-core's ``CustomHookPolicy`` then calls it once for every HTTP response the client
receives, retries and 4xx answers included (a 404 of a point read or a 409 of a create is a
request too, and Cosmos charges for it). azure-cosmos 4.17.1 accepts no per-call policies, and
a call that passes its own ``raw_response_hook`` replaces this one for that call (nothing in
the library does). Requests that never got an answer (connection errors) are not seen.

Kinds (the names the test server's ``/_test/stats`` uses for ``by_operation``, so the two
counts can be compared; the last word is the resource: ``docs``, ``colls``, ``dbs`` or
``other`` for the account and partition-key ranges):

* ``read docs`` — point read; ``query docs`` — one query page (a query that needs two pages
  is two requests); ``changefeed docs`` — one change-feed page (a poll that finds nothing
  is a request too); ``readfeed docs`` — a plain listing;
* ``create docs``, ``upsert docs``, ``replace docs``, ``patch docs``, ``delete docs``,
  ``batch docs`` — writes;
* anything on ``colls``/``dbs``/``other`` — metadata: the client's start-up account read,
  container properties and partition-key ranges, which it caches.

Usage::

    counter = RequestCounter()
    client = CosmosClient(endpoint, key, **counter.client_kwargs())
    with counter.measure() as m:
        store.get_current_policy("agent-a")
    m.total, m.by_kind  # 1, {"read docs": 1}

or, to see each request with its container, status and partition scope::

    with counter.counting() as calls:
        train_agent(...)
    calls.data, calls.by_operation()  # e.g. 6, {"read policies 200": 1, "query agent-scores 200": 1, ...}
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

WRITES = frozenset({"create", "upsert", "replace", "patch", "delete", "batch"})
"""Operation names that change a document."""

DATA_RESOURCE = "docs"


def _true(headers: Mapping[str, str], name: str) -> bool:
    return str(headers.get(name, "")).strip().lower() == "true"


def container_of(url: str) -> str | None:
    """The container a request addresses (``dbs/{db}/colls/{container}/...``), or ``None``."""
    segments = [s for s in urlsplit(url).path.split("/") if s]
    return segments[3] if len(segments) >= 4 and segments[0] == "dbs" and segments[2] == "colls" else None


def operation_kind(method: str, url: str, headers: Mapping[str, str]) -> str:
    """The kind of one Cosmos request: ``"<operation> <resource>"`` (see the module docstring)."""
    path = urlsplit(url).path
    segments = [s for s in path.split("/") if s]
    types = [s for i, s in enumerate(segments) if i % 2 == 0]
    resource = types[-1] if types and types[-1] in ("docs", "colls", "dbs") else "other"
    is_feed = len(segments) % 2 == 1  # dbs/x/colls/y/docs lists; dbs/x/colls/y/docs/z is one item
    lowered = {k.lower(): v for k, v in headers.items()}
    method = method.upper()
    if method == "GET":
        operation = "changefeed" if lowered.get("a-im") else "readfeed" if is_feed else "read"
    elif method == "POST":
        if _true(lowered, "x-ms-documentdb-isquery") or lowered.get("content-type") == "application/query+json":
            operation = "query"
        elif _true(lowered, "x-ms-documentdb-is-upsert"):
            operation = "upsert"
        elif _true(lowered, "x-ms-cosmos-is-batch-request"):
            operation = "batch"
        else:
            operation = "create"
    elif method == "PUT":
        operation = "replace"
    elif method == "PATCH":
        operation = "patch"
    elif method == "DELETE":
        operation = "delete"
    else:
        operation = method.lower()
    return f"{operation} {resource}"


@dataclass(frozen=True)
class Request:
    """One HTTP request: its operation, container (``None``: not on documents) and status."""

    operation: str
    """read, query, create, upsert, replace, patch, delete, batch, changefeed, readfeed; for a
    metadata request its resource (colls, dbs, other)."""
    container: str | None
    status: int
    scope: str | None = None
    """What the request was scoped to: its partition key header (``'["agent-a"]'``), or an
    effective-partition-key range (``"epk 0F3A...-0F3A...FF"``, a query on a key prefix);
    ``None``: not scoped (a cross-partition query, a metadata read)."""

    def __str__(self) -> str:
        return f"{self.operation} {self.container or '-'} {self.status}"


@dataclass
class Calls:
    """The requests made while :meth:`RequestCounter.counting` was open, one by one."""

    requests: list[Request] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.requests)

    @property
    def data(self) -> int:
        """Requests on documents (the metadata the SDK caches left out)."""
        return sum(1 for r in self.requests if r.container is not None)

    def by_operation(self, data_only: bool = True) -> dict[str, int]:
        """``"operation container status" -> count``."""
        return dict(Counter(str(r) for r in self.requests if r.container is not None or not data_only))


def scope_of(headers: Mapping[str, str]) -> str | None:
    """The partition scope a request carries (see :attr:`Request.scope`)."""
    key = headers.get("x-ms-documentdb-partitionkey")
    if key:
        return str(key)
    start, end = headers.get("x-ms-start-epk"), headers.get("x-ms-end-epk")
    return f"epk {start}-{end}" if start is not None and end is not None else None


@dataclass
class Counts:
    """Requests counted over a span: ``by_kind`` (``"read docs"`` → n), ``by_status``
    (``"read docs 404"`` → n, only for answers other than 2xx and 304) and ``by_container``
    (``"scores read docs"`` → n, document requests only)."""

    by_kind: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_container: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    @property
    def data(self) -> int:
        """Requests on documents (the ones Cosmos charges request units for)."""
        return sum(n for kind, n in self.by_kind.items() if kind.endswith(" " + DATA_RESOURCE))

    @property
    def metadata(self) -> int:
        """Requests on the account, databases, containers and partition-key ranges."""
        return self.total - self.data

    @property
    def writes(self) -> int:
        return sum(n for kind, n in self.by_kind.items() if kind.split(" ")[0] in WRITES)

    def kind(self, operation: str, resource: str = DATA_RESOURCE) -> int:
        """Requests of one kind, e.g. ``counts.kind("query")``."""
        return self.by_kind.get(f"{operation} {resource}", 0)

    def container(self, name: str) -> Counter[str]:
        """The document requests on one container, by kind (``"read docs"`` → n)."""
        prefix = name + " "
        return Counter({k[len(prefix) :]: n for k, n in self.by_container.items() if k.startswith(prefix)})

    def copy(self) -> Counts:
        return Counts(self.by_kind.copy(), self.by_status.copy(), self.by_container.copy())

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.by_kind + other.by_kind, self.by_status + other.by_status, self.by_container + other.by_container
        )

    def __sub__(self, other: Counts) -> Counts:
        def minus(a: Counter[str], b: Counter[str]) -> Counter[str]:
            out = a.copy()
            out.subtract(b)
            return +out  # drops the kinds that did not occur in the span

        return Counts(
            minus(self.by_kind, other.by_kind),
            minus(self.by_status, other.by_status),
            minus(self.by_container, other.by_container),
        )

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Counts:
        """Counts from :meth:`to_dict`'s form (results read back from JSON)."""
        return cls(*(Counter(data.get(k) or {}) for k in ("by_kind", "by_status", "by_container")))

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_kind": dict(sorted(self.by_kind.items())),
            "by_status": dict(sorted(self.by_status.items())),
            "by_container": dict(sorted(self.by_container.items())),
        }


class Measurement:
    """What a :meth:`RequestCounter.measure` block counted; read it after the block."""

    def __init__(self) -> None:
        self.counts = Counts()

    @property
    def total(self) -> int:
        return self.counts.total

    @property
    def by_kind(self) -> dict[str, int]:
        return dict(self.counts.by_kind)

    def __getattr__(self, name: str) -> Any:  # data, metadata, writes, kind, container, to_dict
        return getattr(self.counts, name)


class RequestCounter:
    """A client-level ``raw_response_hook`` that counts requests by kind (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = Counts()
        self._open: list[Calls] = []

    def __call__(self, response: Any) -> None:
        """azure-core's response hook: ``response`` is a ``PipelineResponse``."""
        request = response.http_request
        kind = operation_kind(request.method, request.url, request.headers)
        container = container_of(request.url) if kind.endswith(" " + DATA_RESOURCE) else None
        status = getattr(response.http_response, "status_code", 0)
        operation, resource = kind.split(" ", 1)
        record = Request(operation if container is not None else resource, container, status, scope_of(request.headers))
        with self._lock:
            for calls in self._open:
                calls.requests.append(record)
            self._counts.by_kind[kind] += 1
            if container is not None:
                self._counts.by_container[f"{container} {kind}"] += 1
            if not (200 <= status < 300 or status == 304):
                self._counts.by_status[f"{kind} {status}"] += 1

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments that attach this counter to a ``CosmosClient``."""
        return {"raw_response_hook": self}

    def snapshot(self) -> Counts:
        """The counts so far (a copy)."""
        with self._lock:
            return self._counts.copy()

    def reset(self) -> None:
        with self._lock:
            self._counts = Counts()

    @contextlib.contextmanager
    def counting(self) -> Iterator[Calls]:
        """Record each request sent until the block ends (blocks may nest)."""
        calls = Calls()
        with self._lock:
            self._open.append(calls)
        try:
            yield calls
        finally:
            with self._lock:
                self._open.remove(calls)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Count the requests sent inside the block (by every client this counter is attached to)."""
        measurement = Measurement()
        before = self.snapshot()
        try:
            yield measurement
        finally:
            measurement.counts = self.snapshot() - before
