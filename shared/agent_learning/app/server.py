"""The Functions app in one local process (``agent-learn serve``): every route of
:mod:`agent_learning.app.http` under ``/api/``, answered by the same handlers, and the pipeline's
triggers as background stages on one thread.

::

    HTTP  /api/<template>  ──►  http.Route.handle(Request, Runtime)  ──►  HttpAnswer
    stages: change feed (pump) → scorer (score_pending) → timer (handlers.train) → training (train_pending)

The routes are read from :data:`agent_learning.app.http.ROUTES` when the app is built, each
template (``agents/{agent_id}/choose``) as Starlette's path syntax, so a route added to the table
is served with no change here; a path no route matches answers 404, a method its route does not
take 405, both with a JSON ``error``. With a key, every request must carry it as the
``x-functions-key`` header, the ``code`` query parameter or the ``Ocp-Apim-Subscription-Key``
header, else 401.

Starlette and uvicorn (the ``[serve]`` extra) are imported when an app is built.
"""

from __future__ import annotations

import copy
import errno
import hmac
import logging
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from agent_learning.app import handlers, http
from agent_learning.app.callers import KEY_HEADER, KEY_PARAM
from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.handlers import HttpAnswer, Runtime, build_runtime
from agent_learning.app.settings import Settings
from agent_learning.core.errors import AgentLearningError

log = logging.getLogger(__name__)

PREFIX = "/api/"
"""Where the routes are, as on the Functions host."""

SUBSCRIPTION_KEY_HEADER = "ocp-apim-subscription-key"
"""The header an Azure AI services client sends its key in (``AzureKeyCredential``)."""

STAGE_BATCH = 10
"""Scoring messages one pass of the scorer handles at most: the next pass follows at once while
more wait, and a stop waits for one pass only (a judge model takes seconds an episode)."""

GRACE_SECONDS = 5
"""How long shutting down waits for the requests under way."""

STOP_WAIT_SECONDS = 30.0
"""How long shutting down waits for the pass under way; messages it still holds come back when
their locks expire."""


def missing_server(exc: ImportError) -> AgentLearningError:
    """The error for a missing server library: the extra that installs it."""
    return AgentLearningError(
        f"agent-learn serve needs the [serve] extra ({exc.name} is missing): pip install 'agent-learning[serve]'"
    )


def _json(status: int, error: str, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse  # lazy: the [serve] extra

    return JSONResponse({"error": error}, status_code=status, headers=headers)


def key_matches(key: str, headers: dict[str, str], query: dict[str, str]) -> bool:
    """Whether a request carries ``key`` in one of the forms the Functions host and Azure AI
    services take (headers with lowercase names)."""
    given = [headers.get(KEY_HEADER), headers.get(SUBSCRIPTION_KEY_HEADER), query.get(KEY_PARAM)]
    wanted = key.encode()
    return any(hmac.compare_digest(g.encode(), wanted) for g in given if g is not None)


def asgi_app(rt: Runtime, *, key: str | None = None, routes: Sequence[http.Route] = http.ROUTES,
             lifespan: Callable[[Any], Any] | None = None) -> Any:
    """The ASGI app answering ``routes`` under ``/api/`` from ``rt``; with ``key``, only requests
    that carry it."""
    try:
        from starlette.applications import Starlette  # lazy: the [serve] extra
        from starlette.concurrency import run_in_threadpool
        from starlette.requests import Request as StarletteRequest
        from starlette.responses import Response
        from starlette.routing import Route as StarletteRoute
    except ImportError as exc:
        raise missing_server(exc) from None

    def endpoint(route: http.Route) -> Callable[[StarletteRequest], Any]:
        async def answer(request: StarletteRequest) -> Response:
            plain = http.Request(request.method, dict(request.path_params), dict(request.query_params),
                                 dict(request.headers), await request.body())
            try:
                # the handlers block (the store): off the event loop, as the Functions worker runs them
                result: HttpAnswer = await run_in_threadpool(route.handle, plain, rt)
            except Exception:
                log.exception("route %s failed", route.name)
                return _json(500, f"{route.name}: internal error (the server's log says why)")
            headers = dict(result.headers or {})
            media_type = headers.pop("Content-Type", "text/plain")
            return Response(result.body, status_code=result.status, headers=headers, media_type=media_type)

        return answer

    async def not_found(request: StarletteRequest, exc: Exception) -> Response:
        return _json(404, f"no route {request.url.path}")

    async def wrong_method(request: StarletteRequest, exc: Exception) -> Response:
        allowed = dict(getattr(exc, "headers", None) or {})
        methods = allowed.get("Allow", "")
        return _json(405, f"{request.url.path} takes {methods or 'other methods'}, not {request.method}", allowed)

    app = Starlette(
        routes=[StarletteRoute(PREFIX + r.template, endpoint(r), methods=list(r.methods), name=r.name) for r in routes],
        exception_handlers={404: not_found, 405: wrong_method},
        lifespan=lifespan,
    )
    return app if key is None else KeyRequired(app, key)


class KeyRequired:
    """ASGI middleware: an HTTP request without the key answers 401 before any route is looked up."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            from starlette.requests import Request as StarletteRequest  # lazy: the [serve] extra

            request = StarletteRequest(scope)
            if not key_matches(self.key, dict(request.headers), dict(request.query_params)):
                problem = "wrong key" if any(
                    name in request.headers for name in (KEY_HEADER, SUBSCRIPTION_KEY_HEADER)
                ) or KEY_PARAM in request.query_params else "no key"
                response = _json(401, f"{problem}: send the key as the {KEY_HEADER} header, the {KEY_PARAM}= query "
                                      f"parameter or the Ocp-Apim-Subscription-Key header")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Stages:
    """The pipeline's triggers as the Functions host runs them, on one background thread over the
    runtime's parts: the change feed (:meth:`LocalPipeline.pump`) and the scorer
    (:meth:`LocalPipeline.score_pending`) every ``poll_seconds``, the timer
    (:func:`~agent_learning.app.handlers.train`: the feedback sweep and one training message per
    agent with new scores) and the training trigger (:meth:`LocalPipeline.train_pending`) every
    ``train_seconds``. A stage that fails is logged and runs again at its next turn."""

    def __init__(self, rt: Runtime, pipeline: LocalPipeline, *, poll_seconds: float, train_seconds: float) -> None:
        self.rt, self.pipeline = rt, pipeline
        self.poll_seconds, self.train_seconds = poll_seconds, train_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-learn-stages", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> bool:
        """Stop after the pass under way; whether the thread ended within ``timeout`` seconds."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.train_seconds
        while not self._stop.is_set():
            busy = self.feed_and_score()
            if time.monotonic() >= next_tick:
                self.tick()
                next_tick = time.monotonic() + self.train_seconds
            if not busy:
                self._stop.wait(self.poll_seconds)

    def feed_and_score(self) -> bool:
        """One pass of the change feed and the scorer; whether scoring messages may still wait."""
        sent = self._stage("change feed", self.pipeline.pump)
        if sent:
            log.info("change feed: %d episodes sent to the scoring queue", sent)
        outcomes = self._stage("scorer", lambda: self.pipeline.score_pending(max_messages=STAGE_BATCH))
        if outcomes:
            log.info("scorer: %s", ", ".join(f"{status} {n}" for status, n in sorted(outcomes.items())))
        return bool(outcomes) and sum(outcomes.values()) >= STAGE_BATCH

    def tick(self) -> None:
        """One timer tick and the training runs it asks for (training logs what it holds or fails)."""
        self._stage("timer", lambda: handlers.train(self.rt))
        for outcome in self._stage("training", self.pipeline.train_pending) or []:
            if outcome.status == "published":
                log.info("training %s: published v%s", outcome.agent_id, outcome.version)

    def _stage(self, name: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as exc:
            log.error("%s failed (%s: %s); it runs again at its next turn", name, type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            return None


@contextmanager
def local_runtime(settings: Settings) -> Iterator[tuple[Runtime, LocalPipeline]]:
    """One runtime on the parts ``settings`` choose (:class:`~agent_learning.app.wiring.Components`),
    and the embedded runner on the same parts; closed together."""
    rt = build_runtime(settings)
    assert rt.parts is not None  # build_runtime builds them
    try:
        yield rt, LocalPipeline.of(rt.parts)
    finally:
        rt.parts.close()


def stages_lifespan(stages: Stages) -> Callable[[Any], Any]:
    """A Starlette lifespan that runs ``stages`` while the server serves."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        from starlette.concurrency import run_in_threadpool  # lazy: the [serve] extra

        stages.start()
        try:
            yield
        finally:
            if not await run_in_threadpool(stages.stop):
                log.warning("the background stages did not stop within %.0f s; the messages they hold come back "
                            "when their locks expire", STOP_WAIT_SECONDS)

    return lifespan


def route_lines(routes: Sequence[http.Route] = http.ROUTES) -> list[str]:
    """``GET  /api/policies/{agent_id}``: one line per route, for the banner."""
    width = max(len(", ".join(r.methods)) for r in routes)
    return [f"{', '.join(r.methods):<{width}}  {PREFIX}{r.template}" for r in routes]


class HidesKey(logging.Filter):
    """Hides the value of a ``code=`` query parameter (the key) in uvicorn's access log lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) > 2:  # client, method, path and query, ...
            record.args = (*record.args[:2], _KEY_IN_QUERY.sub(r"\1<hidden>", str(record.args[2])), *record.args[3:])
        return True


_KEY_IN_QUERY = re.compile(rf"([?&]{KEY_PARAM}=)[^&]*", re.IGNORECASE)


def log_config(base: dict[str, Any]) -> dict[str, Any]:
    """uvicorn's logging ``base`` with its start-up chatter left out, each request logged (the key
    hidden), and this library's warnings and the stages' work in the same format."""
    config = copy.deepcopy(base)
    config.setdefault("filters", {})["hide_key"] = {"()": HidesKey}
    config["handlers"]["access"]["filters"] = ["hide_key"]
    config["loggers"]["uvicorn.error"] = {"level": "WARNING"}
    config["loggers"]["agent_learning"] = {"handlers": ["default"], "level": "WARNING", "propagate": False}
    config["loggers"][__name__] = {"level": "INFO"}
    return config


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` and ``port`` (0: one the system picks); ``ValueError`` naming
    the option when the address cannot be had. Its protocol is named (TCP): asyncio turns Nagle's
    algorithm off (``TCP_NODELAY``) only on connections of such a socket, and without that each
    answer with a body waits for the client's delayed ACK between its head and its body (≈40 ms)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        option = "--host" if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL else "--port"
        raise ValueError(f"{option}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def serve(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until SIGINT or SIGTERM (then the requests under way finish and the
    app's lifespan ends; the signal is raised again afterwards, as uvicorn does)."""
    try:
        import uvicorn  # lazy: the [serve] extra
        from uvicorn.config import LOGGING_CONFIG
    except ImportError as exc:
        raise missing_server(exc) from None
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level=None,
                            log_config=log_config(LOGGING_CONFIG), timeout_graceful_shutdown=GRACE_SECONDS)
    uvicorn.Server(config).run(sockets=[sock])
