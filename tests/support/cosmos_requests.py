"""Count the HTTP requests an azure-cosmos client sends, as it sends them (over the wire).

Pass a :class:`RequestCounter` as the client's ``raw_response_hook``: azure-core calls it once per
HTTP response, retries included, so it sees every request the SDK makes against the local server
or a real account alike::

    counter = RequestCounter()
    client = CosmosClient(endpoint, credential=key, raw_response_hook=counter)
    with counter.counting() as calls:
        train_agent(...)
    calls.total, calls.data, calls.by_operation()  # e.g. {"read policies 200": 1, "query scores 200": 1}

``data`` counts the requests on documents (what a run costs each time); metadata requests (a
container's properties, its partition key ranges) are cached by the SDK after its first call.
Used by tests and by ``benchmarks/store_access.py``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse


@dataclass(frozen=True)
class Request:
    """One HTTP request: its operation, container (``None``: not on documents) and status."""

    operation: str
    """read, query, create, upsert, replace, patch, delete, batch, changefeed, readfeed, or a
    metadata resource ("colls", "pkranges", "dbs", "account")."""
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
    """The requests made while :meth:`RequestCounter.counting` was open."""

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


def classify(method: str, path: str, headers: Any) -> tuple[str, str | None]:
    """The operation and container of a request to ``path`` (``/dbs/d/colls/c/docs/x``)."""
    segments = [s for s in path.split("/") if s]
    if len(segments) < 5 or segments[2] != "colls" or segments[4] != "docs":
        kinds = segments[0::2]
        return (kinds[-1] if kinds else "account"), None
    container = segments[3]
    is_feed = len(segments) == 5
    header = lambda name: str(headers.get(name, "")).lower()  # noqa: E731
    if method == "GET":
        if header("a-im"):
            return "changefeed", container
        return ("readfeed" if is_feed else "read"), container
    if method == "POST":
        if header("x-ms-documentdb-isquery") == "true" or header("content-type") == "application/query+json":
            return "query", container
        if header("x-ms-documentdb-is-upsert") == "true":
            return "upsert", container
        if header("x-ms-cosmos-is-batch-request") == "true":
            return "batch", container
        return "create", container
    return {"PUT": "replace", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower()), container


def scope_of(headers: Any) -> str | None:
    """The partition scope a request carries (see :attr:`Request.scope`)."""
    key = headers.get("x-ms-documentdb-partitionkey")
    if key:
        return str(key)
    start, end = headers.get("x-ms-start-epk"), headers.get("x-ms-end-epk")
    return f"epk {start}-{end}" if start is not None and end is not None else None


class RequestCounter:
    """An azure-core ``raw_response_hook`` that records every request a client sends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[Calls] = []

    def __call__(self, response: Any) -> None:
        request = response.http_request
        operation, container = classify(request.method, urlparse(request.url).path, request.headers)
        record = Request(operation, container, response.http_response.status_code, scope_of(request.headers))
        with self._lock:
            for calls in self._open:
                calls.requests.append(record)

    @contextmanager
    def counting(self) -> Iterator[Calls]:
        """Record the requests sent until the block ends (blocks may nest)."""
        calls = Calls()
        with self._lock:
            self._open.append(calls)
        try:
            yield calls
        finally:
            with self._lock:
                self._open.remove(calls)
