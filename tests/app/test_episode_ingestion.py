"""Isolated agents: the ingestion route ``POST /api/agents/{agent_id}/episodes`` writes an episode
only for a caller allowed to write that agent (``AGENT_LEARNING_EPISODE_WRITERS``), and the
agent-side :class:`HttpEpisodeWriter` talks to it through a local HTTP server (the real app
function behind it, with the host's function-key check)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func
from app_functions import functions, trust_principal_header
from factories import DEFAULT_ACTIONS, INCARNATION, CountingStore, make_episode

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import HttpEpisodeWriter, HttpPolicySource, PolicyClient
from agent_learning.app import handlers
from agent_learning.app.callers import identify, key_identity, principal_identity
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DocumentTooLarge,
    InvalidDocument,
    NotFound,
    PermanentError,
    TransientError,
)
from agent_learning.documents import MAX_EPISODE_BYTES, Episode
from agent_learning.pipeline import create_policy, score_request_message
from agent_learning.pipeline.score import PolicyVersions
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.base import Store
from agent_learning.store.sqlite import SQLiteStore

SUPPORT_KEY = "support-team-function-key"
BILLING_KEY = "billing-team-function-key"
PRINCIPAL = "6f1c2a3b-0000-4000-8000-00000000abcd"
WRITERS = {
    key_identity(SUPPORT_KEY): ["support-*"],
    key_identity(BILLING_KEY): ["billing"],
    principal_identity(PRINCIPAL): ["ops-bot"],
}


class App:
    """The app's runtime on a SQLite store with ``writers``, and requests to its ingest function."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: dict[str, list[str]]) -> None:
        settings = load_settings(
            sqlite_path=str(tmp_path / "app.db"), store="sqlite", queue="sqlite", episode_writers=writers
        )
        self.store = SQLiteStore(settings.sqlite_path)
        monkeypatch.setattr(handlers, "_runtime", handlers.Runtime(settings, self.store, send=None))

    def post(
        self, agent_id: str, body: Any, key: str | None = SUPPORT_KEY, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **({"x-functions-key": key} if key else {}), **(headers or {})}
        request = func.HttpRequest(
            method="POST",
            url=f"/api/agents/{agent_id}/episodes",
            route_params={"agent_id": agent_id},
            headers=sent,
            body=raw,
        )
        response = functions()["ingest"].get_user_function()(request)
        assert response.mimetype == "application/json"
        return response.status_code, json.loads(response.get_body())


AGENTS = ("support-eu", "support-us", "billing", "ops-bot")
"""The agents with a policy: uniform over make_episode's action and one other, so its 0.5."""


def start(store: Store, agent_id: str) -> None:
    """Create ``agent_id`` over make_episode's action and one other, of make_episode's incarnation."""
    first = SoftmaxPolicy.from_actions(agent_id, DEFAULT_ACTIONS[:2]).to_document(created_at=None)
    create_policy(store, first.model_copy(update={"incarnation": INCARNATION}))


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    a = App(tmp_path, monkeypatch, WRITERS)
    for agent in AGENTS:
        start(a.store, agent)
    yield a
    a.store.close()


def episode(episode_id: str = "ep-1", agent_id: str = "support-eu", **overrides: Any) -> dict[str, Any]:
    return make_episode(episode_id, agent_id=agent_id, **overrides).to_dict()


# --------------------------------------------------------------------------- the route


def test_ingest_is_an_http_post_with_function_key_auth() -> None:
    trigger, output = json.loads(functions()["ingest"].get_function_json())["bindings"]
    assert trigger["type"] == "httpTrigger" and trigger["authLevel"] == "FUNCTION"
    assert trigger["methods"] == ["POST"] and trigger["route"] == "agents/{agent_id}/episodes"
    assert output["type"] == "http"


def test_an_allowed_caller_writes_and_a_retry_is_a_no_op(app: App) -> None:
    doc = episode()
    assert app.post("support-eu", doc) == (201, {"id": "ep-1", "status": "created"})
    assert app.post("support-eu", doc) == (200, {"id": "ep-1", "status": "exists"})
    stored = app.store.get_episode("ep-1")
    assert stored is not None and Episode.from_dict(stored) == Episode.from_dict(doc)
    assert len(app.store.list_episodes()) == 1


def test_a_caller_cannot_write_another_agent(app: App) -> None:
    status, body = app.post("billing", episode("ep-b", "billing"))  # the support key
    assert status == 403 and "'billing'" in body["error"] and key_identity(SUPPORT_KEY) in body["error"]
    status, body = app.post("support-eu", episode(), key=None)  # no key: anonymous, not in the map
    assert status == 403 and "anonymous" in body["error"]
    status, body = app.post("support-eu", episode(), key="a-key-nobody-was-given")
    assert status == 403
    assert app.store.list_episodes() == []


def test_a_principal_header_names_the_writer_only_where_the_settings_trust_it(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A self-hosted container (no ``WEBSITE_INSTANCE_ID``) checks keys but passes the header
    through: without the setting, the support key's holder posing as ops-bot's writer is still
    the support key."""
    monkeypatch.delenv("WEBSITE_INSTANCE_ID", raising=False)
    forged = {"X-MS-CLIENT-PRINCIPAL-ID": PRINCIPAL}
    status, body = app.post("ops-bot", episode("ep-ops", "ops-bot"), headers=forged)
    assert status == 403 and key_identity(SUPPORT_KEY) in body["error"] and "principal" not in body["error"]
    assert app.store.list_episodes() == []
    trust_principal_header(monkeypatch)  # App Service Authentication on: the header is the platform's
    assert app.post("ops-bot", episode("ep-ops", "ops-bot"), headers=forged)[0] == 201  # it wins over the key


def test_the_body_must_be_an_episode_of_the_path_agent(app: App) -> None:
    status, body = app.post("support-eu", episode(agent_id="support-us"))  # both allowed, but not the path's
    assert status == 400 and body["error"].startswith("agent_id:") and "support-us" in body["error"]
    status, body = app.post("support-eu", episode(probability=0.5) | {"probability": 7})
    assert status == 400 and body["error"].startswith("probability:")
    status, body = app.post("support-eu", episode() | {"ttl": 0})  # Cosmos DB would refuse it
    assert status == 400 and body["error"].startswith("ttl: must be -1 (never expires) or 1 to 2,147,483,647")
    status, body = app.post("support-eu", b"{not json")
    assert status == 400 and body["error"].startswith("body: is not valid JSON (")
    status, body = app.post("support-eu", b"[" * 10_000)
    assert status == 400 and "nested" in body["error"]
    for not_an_object in (b"null", b"[]", b'"episode"', b""):  # JSON, but no episode: the body is named
        status, body = app.post("support-eu", not_an_object)
        assert status == 400 and body["error"].startswith("body:"), body
        assert "NoneType" not in body["error"] and "(document)" not in body["error"]
    status, body = app.post("not an id!", episode())
    assert status == 400 and body["error"].startswith("agent_id:")
    assert app.store.list_episodes() == []


def test_a_body_over_the_episode_limit_is_413(app: App) -> None:
    padded = json.dumps(episode()).encode() + b" " * MAX_EPISODE_BYTES
    status, body = app.post("support-eu", padded)
    assert status == 413 and body["error"].startswith("body:") and f"{MAX_EPISODE_BYTES:,}" in body["error"]


def test_an_episode_over_the_limit_as_the_document_measures_it_is_413_too(app: App) -> None:
    """A body under the limit in UTF-8 that is over it with non-ASCII characters escaped."""
    step = {"name": "search", "kind": "tool", "status": "ok", "latency_ms": 1.0, "result": "😀" * 1_000}
    doc = episode() | {"steps": [step] * 200}
    raw = json.dumps(doc, ensure_ascii=False).encode()
    assert len(raw) < MAX_EPISODE_BYTES < len(json.dumps(doc))
    status, body = app.post("support-eu", raw)
    assert status == 413 and body["error"].startswith("(document): is ") and f"{MAX_EPISODE_BYTES:,}" in body["error"]
    assert app.store.list_episodes() == []


def test_an_episode_the_scorer_would_dead_letter_is_refused(app: App) -> None:
    status, body = app.post("support-eu", episode(action_id="calculator"))
    assert (status, body) == (400, {"error": "action_id: 'calculator' is not an action of support-eu:v1 "
                                             "(known: ['direct', 'step-by-step'])"})
    status, body = app.post("support-eu", episode(policy_version=2))
    assert (status, body) == (400, {"error": "policy_version: agent 'support-eu' has no version 2"})
    status, body = app.post("support-new", episode(agent_id="support-new"))
    assert (status, body) == (404, {"error": "agent 'support-new' has no policy"})
    assert app.store.list_episodes() == []

    # A miss is not remembered: once the agent has a policy its episodes are written.
    first = SoftmaxPolicy.from_actions("support-new", ["direct"]).to_document(created_at=None)
    created = create_policy(app.store, first)
    new = episode(agent_id="support-new", probability=1.0, incarnation=created.incarnation)
    assert app.post("support-new", new)[0] == 201

    # An episode of another incarnation of the agent (deleted and created again since) is refused.
    status, body = app.post("support-eu", episode(incarnation="f" * 32))
    assert status == 400 and body["error"].startswith(f"incarnation: episode 'ep-1' belongs to incarnation {'f' * 32}")


def test_policy_versions_are_read_once_and_an_invalid_policy_is_left_to_the_scorer(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = CountingStore(app.store)
    monkeypatch.setattr(handlers, "_runtime", handlers.Runtime(handlers.runtime().settings, counting, send=None))
    for i in range(3):
        assert app.post("support-eu", episode(f"ep-{i}"))[0] == 201
    assert counting.calls["get_policy_version"] == 1

    # The episode is valid; its policy is not: the scorer dead-letters it as InvalidPolicy.
    monkeypatch.setattr(app.store, "get_policy_version", lambda agent_id, version: {"id": "broken"})
    assert app.post("support-us", episode("ep-us", "support-us"))[0] == 201


def test_a_deleted_agents_episodes_are_refused_once_the_refresh_interval_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm worker's parsed versions of a deleted agent stop vouching for its episodes."""
    monkeypatch.setenv("AGENT_LEARNING_POLICY_REFRESH_SECONDS", "0")
    a = App(tmp_path, monkeypatch, WRITERS)
    start(a.store, "support-eu")
    assert a.post("support-eu", episode("ep-1"))[0] == 201
    a.store.delete_agent("support-eu")  # what `agent-learn agent delete` does
    assert a.post("support-eu", episode("ep-2")) == (404, {"error": "agent 'support-eu' has no policy"})
    assert a.store.list_episodes() == []
    a.store.close()


def test_the_episodes_route_keeps_a_version_for_the_refresh_interval(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    settings = handlers.runtime().settings
    versions = PolicyVersions(app.store, handlers.CACHED_POLICY_VERSIONS, max_age=settings.policy_refresh_seconds,
                              clock=clock)
    rt = handlers.Runtime(settings, app.store, send=None, policy_versions=versions)
    monkeypatch.setattr(handlers, "_runtime", rt)
    assert app.post("support-eu", episode("ep-1"))[0] == 201
    app.store.delete_agent("support-eu")
    clock.advance(settings.policy_refresh_seconds - 1)
    assert app.post("support-eu", episode("ep-2"))[0] == 201  # a version is kept this long
    clock.advance(1)
    assert app.post("support-eu", episode("ep-3")) == (404, {"error": "agent 'support-eu' has no policy"})
    assert app.store.get_episode("ep-3") is None


def test_an_episode_the_route_accepts_is_scored(app: App) -> None:
    assert app.post("billing", episode("ep-b", "billing"), key=BILLING_KEY)[0] == 201
    stored = app.store.get_episode("ep-b")
    assert stored is not None
    message = score_request_message(stored)
    assert handlers.score(message.body, 1, message.message_id, handlers.runtime()) == "scored"
    assert app.store.get_score("ep-b", "billing") is not None


def test_an_id_holding_another_episode_conflicts_whoever_wrote_it(app: App) -> None:
    assert app.post("support-eu", episode())[0] == 201
    status, body = app.post("support-eu", episode(output="something else"))
    assert status == 409 and body["error"].startswith("id:")
    # True == 1 in Python, not in JSON: 1 for true (or 0 for false) is different content.
    flags = {"context": {"premium": True}, "metadata": {"beta": False}}
    assert app.post("support-eu", episode("ep-2", **flags))[0] == 201
    for changed in ({"context": {"premium": 1}}, {"metadata": {"beta": 0}}):
        status, body = app.post("support-eu", episode("ep-2", **(flags | changed)))
        assert status == 409 and body["error"].startswith("id:"), changed
    # Ids are global: another agent's caller gets 409 too, and learns nothing of the content.
    status, body = app.post("billing", episode(agent_id="billing"), key=BILLING_KEY)
    assert status == 409 and "support" not in body["error"] and "What is" not in body["error"]
    stored = app.store.get_episode("ep-1")
    assert stored is not None and stored["agent_id"] == "support-eu" and stored["output"] == "4"


def test_without_writers_the_route_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = App(tmp_path, monkeypatch, {})
    status, body = app.post("support-eu", episode())
    assert status == 404 and "AGENT_LEARNING_EPISODE_WRITERS" in body["error"]
    assert app.store.list_episodes() == []
    app.store.close()


def test_a_throttled_store_answers_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cosmos_server: Any, cosmos_database: Any
) -> None:
    """Cosmos DB's answers, their status rewritten to 429 on arrival: the route says "retry"
    (503 and Retry-After, which HttpEpisodeWriter honours) instead of failing with a 500."""
    from cosmos_fixture import status_rewriting_store

    store, status = status_rewriting_store(cosmos_server, cosmos_database)
    start(store, "support-eu")
    settings = load_settings(sqlite_path=str(tmp_path / "unused.db"), episode_writers=WRITERS)
    rt = handlers.Runtime(settings, store, send=None)
    caller = identify({"x-functions-key": SUPPORT_KEY})
    body = json.dumps(episode()).encode()
    status["status"] = 429
    answer = handlers.post_episode("support-eu", body, caller, rt)
    assert answer.status == 503 and (answer.headers or {}).get("Retry-After") == str(handlers.RETRY_AFTER_SECONDS)
    assert "retry" in json.loads(answer.body)["error"] and "support-eu:v1" not in answer.body  # nothing of the store's
    status["status"] = None
    assert handlers.post_episode("support-eu", body, caller, rt).status == 201
    store.close()


# --------------------------------------------------------------------------- the setting


def test_the_writers_setting_is_validated_at_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_EPISODE_WRITERS", json.dumps({key_identity("k"): ["support-*", "billing"]}))
    assert load_settings().episode_writers == {key_identity("k"): ["support-*", "billing"]}
    for bad, problem in [
        ("{", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        (json.dumps({SUPPORT_KEY: ["a"]}), "is not a caller identity"),  # the key itself, not its identity
        (json.dumps({"anonymous": []}), "non-empty list"),
        (json.dumps({"anonymous": "support-*"}), "non-empty list"),
        (json.dumps({"anonymous": ["a/b"]}), "'a/b' is not an agent id or pattern"),
        (json.dumps({"anonymous": {"support-*": True}}), "non-empty list"),
        # One identity twice (JSON would keep only the last entry; an identity's case does not count):
        # the first entry's agents would silently lose their writer.
        ('{"anonymous": ["support-*"], "anonymous": ["billing"]}', "anonymous: given twice"),
        (json.dumps({key_identity("k"): ["support-*"], key_identity("k").upper(): ["billing"]}), "given twice"),
    ]:
        monkeypatch.setenv("AGENT_LEARNING_EPISODE_WRITERS", bad)
        with pytest.raises(ConfigurationError, match="AGENT_LEARNING_EPISODE_WRITERS") as info:
            load_settings()
        assert problem in str(info.value)
        assert SUPPORT_KEY not in str(info.value)  # a key pasted by mistake is not logged


# --------------------------------------------------------------------------- the agent's writer


class IngestServer:
    """A local HTTP server in front of the app's ingest and policy functions, checking function
    keys as the Functions host does (401 without a known key). ``faults`` are statuses answered
    first (with ``fault_error`` as the error), ``pages`` bodies answered first to a GET (200, HTML:
    a sign-in page in front of the app)."""

    def __init__(self, keys: set[str]) -> None:
        self.faults: list[tuple[int, dict[str, str]]] = []
        self.fault_error = "probability: injected"
        self.pages: list[bytes] = []
        self.weak_etags = False  # a compressing proxy in front of the app weakens its ETags
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urllib.parse.urlsplit(self.path)
                match = re.fullmatch(r"/api/agents/([^/]+)/episodes", url.path)
                if outer.faults:
                    status, headers = outer.faults.pop(0)
                    return self.answer(status, {"error": outer.fault_error}, headers)
                if match is None:
                    return self.answer(404, {"error": "no such route"})
                if self.headers.get("x-functions-key") not in keys:
                    return self.answer(401, {"error": "unauthorized"})
                request = func.HttpRequest(
                    method="POST",
                    url=self.path,
                    headers=dict(self.headers.items()),
                    params=dict(urllib.parse.parse_qsl(url.query)),
                    route_params={"agent_id": urllib.parse.unquote(match.group(1))},
                    body=body,
                )
                response = functions()["ingest"].get_user_function()(request)
                self.answer(response.status_code, json.loads(response.get_body()))

            def do_GET(self) -> None:
                if outer.pages:
                    return self.answer(200, outer.pages.pop(0), {"Content-Type": "text/html"})
                match = re.fullmatch(r"/api/policies/([^/]+)", self.path)
                if match is None or self.headers.get("x-functions-key") not in keys:
                    return self.answer(401, {"error": "unauthorized"})
                agent_id = urllib.parse.unquote(match.group(1))
                request = func.HttpRequest(
                    method="GET",
                    url=self.path,
                    headers=dict(self.headers.items()),
                    params={},
                    route_params={"agent_id": agent_id},
                    body=b"",
                )
                response = functions()["policy"].get_user_function()(request)
                body, headers = response.get_body(), dict(response.headers)
                if outer.weak_etags and "ETag" in headers:
                    headers["ETag"] = "W/" + headers["ETag"]
                self.answer(response.status_code, json.loads(body) if body else None, headers)

            def answer(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
                raw = data if isinstance(data, bytes) else b"" if data is None else json.dumps(data).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server(app: App) -> Iterator[IngestServer]:
    s = IngestServer({SUPPORT_KEY, BILLING_KEY})
    yield s
    s.close()


def test_an_isolated_agent_reads_its_policy_and_writes_episodes_over_http(app: App, server: IngestServer) -> None:
    """No store on the agent side: PolicyClient reads through HttpPolicySource (conditionally),
    EpisodeCapture writes through HttpEpisodeWriter (sync and async)."""
    policy = SoftmaxPolicy.from_actions("support-apac", ["brief", "thorough"]).to_document(created_at=None)
    create_policy(app.store, policy)
    source, writer = HttpPolicySource(server.url, SUPPORT_KEY), HttpEpisodeWriter(server.url, SUPPORT_KEY)
    assert SUPPORT_KEY not in repr(writer) + repr(source)
    client = PolicyClient(source, "support-apac", refresh_seconds=0)
    decision = client.choose()
    assert client.choose().version == 1 and client.reads_with_transfer == 1 and client.reads_not_modified == 1
    server.weak_etags = True  # W/"x" from a proxy: the next refresh sends "x" back, still a 304
    weakened = PolicyClient(source, "support-apac", refresh_seconds=0)
    weakened.choose(), weakened.choose()
    assert weakened.reads_with_transfer == 1 and weakened.reads_not_modified == 1
    server.weak_etags = False
    with EpisodeCapture(writer, decision, input="Where is my order?", episode_id="ep-sync") as run:
        with run.tool("lookup", arguments={"order": "A-1"}) as call:
            call.result = "shipped"
        written = run.end("It has shipped.")

    async def agent() -> Episode:
        async with EpisodeCapture(writer, decision, input="And the invoice?", episode_id="ep-async") as run:
            return await run.aend("Sent.")

    for expected in (written, asyncio.run(agent())):
        stored = app.store.get_episode(expected.id)
        assert stored is not None and Episode.from_dict(stored) == expected
    writer.add_episode(written)  # a retry after a lost answer: a no-op
    with pytest.raises(ConcurrencyConflict, match="ep-sync"):
        writer.add_episode(written.model_copy(update={"output": "changed"}))


def test_the_http_policy_source_reports_what_went_wrong(app: App, server: IngestServer) -> None:
    with pytest.raises(NotFound, match="init-policy"):
        PolicyClient(HttpPolicySource(server.url, SUPPORT_KEY), "nobody").choose()
    with pytest.raises(ConfigurationError, match="401"):
        HttpPolicySource(server.url, "wrong-key").get_current_policy_if_changed("support-eu", None)
    server.pages = [b"<html>Sign in to your account</html>"]  # it raised a bare JSONDecodeError
    with pytest.raises(TransientError, match=r"/api/policies/support-eu answered with a body that is not JSON: "
                                             r"'<html>Sign in"):
        PolicyClient(HttpPolicySource(server.url, SUPPORT_KEY), "support-eu").choose()
    server.close()
    with pytest.raises(TransientError, match="failed"):
        HttpPolicySource(server.url, SUPPORT_KEY).get_current_policy_if_changed("support-eu", None)


def test_the_http_writer_maps_refusals_to_errors(app: App, server: IngestServer) -> None:
    billing = make_episode("ep-b", agent_id="billing")
    with pytest.raises(ConfigurationError, match=r"403.*may not write episodes of agent 'billing'"):
        HttpEpisodeWriter(server.url, SUPPORT_KEY).add_episode(billing)
    with pytest.raises(ConfigurationError, match="401"):
        HttpEpisodeWriter(server.url, "wrong-key").add_episode(billing)
    server.faults = [(400, {})]
    with pytest.raises(InvalidDocument) as info:
        HttpEpisodeWriter(server.url, BILLING_KEY).add_episode(billing)
    assert info.value.fields == ["probability"] and not isinstance(info.value, DocumentTooLarge)
    server.faults = [(413, {})]  # e.g. a route with a smaller MAX_EPISODE_BYTES than the agent's library
    with pytest.raises(DocumentTooLarge) as too_large:
        HttpEpisodeWriter(server.url, BILLING_KEY).add_episode(billing)
    assert too_large.value.fields == ["probability"]
    # A route of another version may name several fields, as InvalidDocument words them.
    server.faults = [(400, {})]
    server.fault_error = "probability: must be at most 1; steps[0].status: one of ok; error, got 'x'; context: odd"
    with pytest.raises(InvalidDocument) as several:
        HttpEpisodeWriter(server.url, BILLING_KEY).add_episode(billing)
    assert several.value.problems == [
        ("probability", "must be at most 1"), ("steps[0].status", "one of ok; error, got 'x'"), ("context", "odd")
    ]
    server.fault_error = "probability: injected"
    server.faults = [(415, {})]
    with pytest.raises(PermanentError, match="415"):
        HttpEpisodeWriter(server.url, BILLING_KEY).add_episode(billing)
    assert app.store.list_episodes() == []


def test_the_http_writer_retries_what_may_pass(app: App, server: IngestServer) -> None:
    pauses: list[float] = []
    writer = HttpEpisodeWriter(server.url, BILLING_KEY, attempts=3, backoff=0.25, sleep=pauses.append)
    server.faults = [(503, {}), (429, {"Retry-After": "2"})]
    writer.add_episode(make_episode("ep-b", agent_id="billing"))
    assert pauses == [0.25, 2.0] and server.requests == 3 and app.store.get_episode("ep-b") is not None

    server.faults = [(503, {})] * 3
    with pytest.raises(TransientError, match=r"503.*3 attempts"):
        writer.add_episode(make_episode("ep-c", agent_id="billing"))
    server.close()
    with pytest.raises(TransientError, match="failed"):
        writer.add_episode(make_episode("ep-d", agent_id="billing"))
