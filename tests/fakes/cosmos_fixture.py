"""Pytest plugin: a local, patched Cosmos-DB-compatible server for wire tests of the real azure-cosmos SDK.

Register with ``pytest_plugins = ["cosmos_fixture"]`` in ``tests/conftest.py``. Fixtures:

- ``cosmos_server`` (session): installs ``@vercel/cosmosdb-server`` 1.0.1 with ``npm ci`` in
  ``tests/fakes/cosmos_server`` when ``node_modules`` is missing, starts ``node server.js`` (HTTPS, keep-alive, the
  patches in ``patches.js``) on a free 127.0.0.1 port and stops it at session end. It has ``.endpoint``,
  ``.key``, ``.stats()``, ``.reset_stats()``, ``.client()`` and ``.log_path`` (server output). Without
  ``node``/``npm`` it skips, except under CI (``CI`` set), where it fails.
- ``cosmos_client`` (session): a sync ``CosmosClient`` built with ``CLIENT_KWARGS``.
- ``cosmos_database`` (function): a new database with a unique name, deleted afterwards.

What the server does differently from the stock 1.0.1 package is listed in ``cosmos_server/patches.js``.

SDK call patterns (azure-cosmos 4.17.1, checked against this server; they use only public Cosmos semantics):

Conditional point read (If-None-Match). ``read_item(..., initial_headers={"If-None-Match": etag})`` does NOT
work in 4.17.1: the SDK accepts ``initial_headers`` but never sends them, so the read is always a full 200.
Send the condition with ``etag=`` and ``match_condition=MatchConditions.IfModified``. A 304 does not raise:
``read_item`` returns an empty ``CosmosDict`` (``{}``, falsy; a real item always has ``"id"``), the response
hook gets ``(headers, None)`` with the unchanged ``etag`` header; a 200 returns the item::

    item = container.read_item(item_id, partition_key=pk, etag=etag, match_condition=MatchConditions.IfModified)
    if not item:  # 304 Not Modified: the cached copy with `etag` is current
        ...

Change feed, resumed across calls (latest version: an item written twice appears once, at its last LSN; no
deletes). The continuation is an opaque string; store it and pass it back with ``continuation=``. After a page
with items ``pager.continuation_token`` holds it; when a call finds nothing new (HTTP 304) the pager yields no
page and its ``continuation_token`` stays None: the token is then the ``etag`` of the client's last response
headers (which also equals the token after a page with items). See ``read_change_feed`` below::

    feed = (container.query_items_change_feed(start_time="Beginning", max_item_count=n) if token is None
            else container.query_items_change_feed(continuation=token, max_item_count=n))
    pager = feed.by_page()
    items = list(next(pager, []))            # one page: at most n items, in LSN order
    token = pager.continuation_token or container.client_connection.last_response_headers["etag"]

``partition_key=`` scopes the feed (only with ``start_time``; a continuation keeps its own scope).

ORDER BY on two fields across partitions needs a composite index on those paths, as in Cosmos (else 400)::

    container.query_items(
        "SELECT * FROM c WHERE c.kind = @kind ORDER BY c.seq, c.id",
        parameters=[{"name": "@kind", "value": "x"}],
        enable_cross_partition_query=True,
        max_item_count=50,
    )  # iterate items, or .by_page() for pages of at most 50

Timeouts: use ``CLIENT_KWARGS`` for every client (sync and ``azure.cosmos.aio``). Measured on 4.17.1 against a
server that accepts connections but never answers: a call fails after about
``read_timeout * (retry_total + 1)`` = 10 s. The client-level ``timeout=`` keyword is NOT honoured in 4.17.1
(``timeout=10`` still took 22 s); a per-call ``timeout=`` is (checked between attempts).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest

SERVER_DIR: Final = Path(__file__).resolve().parent / "cosmos_server"
PINNED_VERSION: Final = "1.0.1"
#: Any base64 string is accepted as the account key.
TEST_KEY: Final = "Y29zbW9zLXRlc3Qta2V5LW5vdC1hLXNlY3JldA=="
START_TIMEOUT_S: Final = 30.0
NPM_CI_TIMEOUT_S: Final = 600.0

#: Keyword arguments for ``CosmosClient`` (sync and aio) so that no SDK call hangs: connect within 5 s,
#: read within 5 s, one retry. The SDK skips TLS verification for 127.0.0.1 by itself.
CLIENT_KWARGS: Final[dict[str, Any]] = {
    "connection_timeout": 5,
    "read_timeout": 5,
    "retry_total": 1,
    "retry_backoff_max": 1,
}

_READY_RE: Final = re.compile(r"COSMOS_SERVER_READY port=(\d+)")


class CosmosServer:
    """A running patched cosmosdb-server process."""

    def __init__(
        self, port: int, process: subprocess.Popen[str], log_path: Path, pump: threading.Thread | None = None
    ) -> None:
        self.port = port
        self.endpoint = f"https://127.0.0.1:{port}/"
        self.key = TEST_KEY
        self.process = process
        self.log_path = log_path
        self._pump = pump  # the thread copying the server's output to log_path

    def client(self, **kwargs: Any) -> Any:
        """A sync ``CosmosClient`` for this server (``CLIENT_KWARGS``, overridable)."""
        from azure.cosmos import CosmosClient

        return CosmosClient(self.endpoint, credential=self.key, **{**CLIENT_KWARGS, **kwargs})

    def stats(self) -> dict[str, Any]:
        """Request counts since the last reset: ``total``, ``by_method_resource`` ("GET docs", "POST colls", ...)
        and ``by_operation`` ("read docs", "query docs", "upsert docs", "changefeed docs", "batch docs", ...)."""
        return self._test_call("GET", "/_test/stats")

    def reset_stats(self) -> None:
        """Zero the request counters."""
        self._test_call("POST", "/_test/reset")

    def log_text(self) -> str:
        """The server's stdout and stderr so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def _test_call(self, method: str, path: str) -> dict[str, Any]:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the package's self-signed certificate
        request = urllib.request.Request(
            self.endpoint.rstrip("/") + path, method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        """Stop the process (stdin EOF, then SIGTERM, then SIGKILL) and finish its log."""
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()  # the server exits on stdin EOF
        try:
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self._pump is not None:
            self._pump.join(timeout=5)


def read_change_feed(container: Any, continuation: str | None, max_item_count: int = 100) -> tuple[list[dict], str]:
    """Read one change-feed page after ``continuation`` (from the beginning when None).

    Returns the items (at most ``max_item_count``, in LSN order, empty when nothing changed) and the
    continuation to pass next time. Works against Cosmos DB too; not thread-safe for a client shared between
    threads (the token after an empty page comes from the client's last response headers).
    """
    if continuation is None:
        feed = container.query_items_change_feed(start_time="Beginning", max_item_count=max_item_count)
    else:
        feed = container.query_items_change_feed(continuation=continuation, max_item_count=max_item_count)
    pager = feed.by_page()
    items = list(next(pager, []))
    token = pager.continuation_token or container.client_connection.last_response_headers["etag"]
    return items, token


def status_rewriting_store(server: CosmosServer, database: Any) -> tuple[Any, dict[str, int | None]]:
    """A ``CosmosStore`` on ``database`` whose answers get ``answer["status"]`` on arrival, when it
    is set: the server did the work and only the answer is lost, as with a throttle or a timeout."""
    from agent_learning.store.cosmos import CosmosStore

    answer: dict[str, int | None] = {"status": None}

    def rewrite(pipeline_response: Any) -> None:
        if answer["status"] is not None:
            pipeline_response.http_response.status_code = answer["status"]

    store = CosmosStore.connect(server.endpoint, database.id, key=server.key,
                                client_kwargs={**CLIENT_KWARGS, "raw_response_hook": rewrite})
    store.ensure_containers()
    return store, answer


def _require_tool(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    message = f"`{name}` is not installed: the Cosmos wire tests need Node.js >= 20 and npm"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{message} (CI must not skip them)", pytrace=False)
    pytest.skip(message)


def _installed_version() -> str | None:
    manifest = SERVER_DIR / "node_modules" / "@vercel" / "cosmosdb-server" / "package.json"
    try:
        return json.loads(manifest.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """Serialise ``npm ci`` between processes (e.g. pytest-xdist workers)."""
    digest = hashlib.sha256(str(SERVER_DIR).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"cosmos-server-npm-{digest}.lock"
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_installed(npm: str) -> None:
    """Run ``npm ci`` in ``tests/fakes/cosmos_server`` unless the pinned package is already installed."""
    with _install_lock():
        if _installed_version() == PINNED_VERSION:
            return
        try:
            result = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=SERVER_DIR,
                capture_output=True,
                text=True,
                timeout=NPM_CI_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"npm ci in {SERVER_DIR} took over {NPM_CI_TIMEOUT_S:.0f} s", pytrace=False)
        if result.returncode != 0 or _installed_version() != PINNED_VERSION:
            pytest.fail(
                f"npm ci in {SERVER_DIR} failed (exit {result.returncode}):\n{result.stdout[-4000:]}\n"
                f"{result.stderr[-4000:]}",
                pytrace=False,
            )


def start_server(node: str, log_path: Path, timeout: float = START_TIMEOUT_S) -> CosmosServer:
    """Start ``node server.js`` on a free port and wait for its ready line."""
    env = {**os.environ, "COSMOS_SERVER_EXIT_ON_STDIN_EOF": "1"}
    process = subprocess.Popen(
        [node, str(SERVER_DIR / "server.js"), "0"],  # port 0: the OS picks a free one, no race
        cwd=SERVER_DIR,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    found: dict[str, int] = {}
    ready = threading.Event()

    def pump() -> None:
        # Copy every output line to the log (for the whole run), noting the ready line.
        assert process.stdout is not None
        with process.stdout as stream, open(log_path, "a", encoding="utf-8") as log:
            for line in stream:
                log.write(line)
                log.flush()
                match = _READY_RE.search(line)
                if match and "port" not in found:
                    found["port"] = int(match.group(1))
                    ready.set()
        ready.set()  # EOF: the process ended

    pump_thread = threading.Thread(target=pump, name="cosmos-server-log", daemon=True)
    pump_thread.start()
    ready.wait(timeout)
    if "port" not in found:
        try:
            reason = f"exited with code {process.wait(timeout=1)}"
        except subprocess.TimeoutExpired:
            reason = f"printed no ready line in {timeout:.0f} s"
        server = CosmosServer(0, process, log_path, pump_thread)
        server.stop()
        pytest.fail(f"cosmos test server {reason}; its output ({log_path}):\n{server.log_text()}", pytrace=False)
    return CosmosServer(found["port"], process, log_path, pump_thread)


def pytest_configure(config: pytest.Config) -> None:
    """The local server's certificate is self-signed and the SDK does not verify it on 127.0.0.1: silence
    urllib3's per-request warning about that."""
    config.addinivalue_line("filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="session")
def cosmos_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CosmosServer]:
    """The patched Cosmos-compatible server, one per test session."""
    pytest.importorskip("azure.cosmos")
    node = _require_tool("node")
    npm = _require_tool("npm")
    ensure_installed(npm)
    log_path = tmp_path_factory.mktemp("cosmos_server") / "server.log"
    server = start_server(node, log_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cosmos_client(cosmos_server: CosmosServer) -> Iterator[Any]:
    """A sync ``CosmosClient`` for the session's server."""
    client = cosmos_server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def cosmos_database(cosmos_client: Any) -> Iterator[Any]:
    """A new, uniquely named database (``DatabaseProxy``), deleted after the test."""
    from azure.cosmos import exceptions

    database = cosmos_client.create_database(f"test-{uuid.uuid4().hex[:12]}")
    try:
        yield database
    finally:
        with contextlib.suppress(exceptions.CosmosResourceNotFoundError):
            cosmos_client.delete_database(database.id)


class SteppingClock:
    """A clock that starts now and moves on by ``step`` seconds every time it is read.

    A store on it sees a settle window (60 s by default) pass between any two of its operations,
    so a score is readable by the store's next read, as on the embedded stores: for tests that
    write and read back at once, with one writer at a time. It runs ahead of the server, so
    the store's server-clock correction (which only moves a lagging clock forward) stays off.
    """

    def __init__(self, step: float = 61.0) -> None:
        self.step = step
        self._t = time.time()
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            self._t += self.step
            return self._t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), tz=UTC)


def new_cosmos_store(request: pytest.FixtureRequest) -> Any:
    """A ``CosmosStore`` with its containers in this test's new database, on a :class:`SteppingClock`
    (every score settled by the next read).

    For store fixtures parametrised over adapters: the database is requested first, so a run
    without the Azure SDK skips the Cosmos case instead of failing on the import."""
    database = request.getfixturevalue("cosmos_database")
    from agent_learning.store.cosmos import CosmosStore

    store = CosmosStore(database, clock=SteppingClock())
    store.ensure_containers()
    return store
