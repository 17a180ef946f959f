"""The local server's app and background stages in-process (``agent-learn serve`` drives them end to
end in tests/cli/test_serve.py): any route of the table is served, and a failing stage is logged and
runs again."""

from __future__ import annotations

import json
import logging
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

import uvicorn
from serving import call, until

from agent_learning.app import http, server
from agent_learning.app.handlers import HttpAnswer, Runtime
from agent_learning.app.settings import load_settings


def echo(request: http.Request, rt: Runtime) -> HttpAnswer:
    """What the route was handed, as JSON."""
    seen = {"method": request.method, "params": dict(request.params), "query": dict(request.query),
            "header": request.header("X-Probe"), "body": request.body.decode()}
    return HttpAnswer(201, json.dumps(seen), {"Content-Type": "application/json", "X-Route": "echo"})


ADDED = (
    http.Route("reward", ("POST",), "agents/{agent_id}/probe/events/{eventId}/reward", echo),
    http.Route("service", ("GET", "PUT"), "agents/{agent_id}/probe/configurations/service", echo),
)
"""Routes of the kind the Personalizer API adds to the table (on a path of their own here)."""


@pytest.fixture
def runtime(embedded_env: Path) -> Iterator[tuple[Runtime, Any]]:
    with server.local_runtime(load_settings()) as parts:
        yield parts


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served over HTTP on a free port of this machine, in a thread; its URL."""
    sock = server.listen("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()


def test_a_route_added_to_the_table_is_served_with_its_parameters_methods_and_answer(runtime: Any) -> None:
    rt, _ = runtime
    with serving(server.asgi_app(rt, routes=(*http.ROUTES, *ADDED))) as url:
        status, headers, body = call(f"{url}/api/agents/shop/probe/events/ev%201/reward?x=1", "POST",
                                     b'{"value": 1}', {"X-Probe": "yes"})
        assert (status, headers["X-Route"], headers.get_content_type()) == (201, "echo", "application/json")
        assert json.loads(body) == {"method": "POST", "params": {"agent_id": "shop", "eventId": "ev 1"},
                                    "query": {"x": "1"}, "header": "yes", "body": '{"value": 1}'}
        for method in ("GET", "PUT"):
            status, _, body = call(f"{url}/api/agents/shop/probe/configurations/service", method, b"")
            assert (status, json.loads(body)["method"]) == (201, method)
        status, headers, _ = call(f"{url}/api/agents/shop/probe/events/ev1/reward")
        assert (status, headers["Allow"]) == (405, "POST")
        status, _, body = call(f"{url}/api/policies/shop")  # the table's own routes stay
        assert (status, json.loads(body)) == (404, {"error": "agent 'shop' has no policy"})


def test_a_failing_stage_is_logged_and_runs_again_at_its_next_turn(
    runtime: Any, embedded_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt, pipeline = runtime
    stages = server.Stages(rt, pipeline, poll_seconds=0.01, train_seconds=0.01)
    with sqlite3.connect(embedded_env) as db:
        db.execute("DROP TABLE episodes")  # the change feed's reads fail from now on
    caplog.set_level(logging.ERROR, logger=server.__name__)
    stages.start()
    try:
        until(lambda: sum("change feed failed" in r.getMessage() for r in caplog.records) >= 2, "second failure")
    finally:
        assert stages.stop()
    assert "no such table: episodes" in caplog.records[0].getMessage()


def test_answers_with_a_body_do_not_wait_for_the_clients_delayed_ack(runtime: Any) -> None:
    """Regression: the listening socket named no protocol, so asyncio left Nagle's algorithm on and
    every answer with a body on a kept-alive connection waited ≈40 ms for the client's delayed ACK."""
    rt, _ = runtime
    with serving(server.asgi_app(rt, routes=ADDED)) as url:
        connection = HTTPConnection(*url.removeprefix("http://").split(":"))
        took = []
        for _ in range(9):
            start = time.perf_counter()
            connection.request("GET", "/api/agents/a/probe/configurations/service")
            answer = connection.getresponse()
            assert answer.status == 201 and answer.read()
            took.append(time.perf_counter() - start)
        connection.close()
    assert statistics.median(took) < 0.025, took
