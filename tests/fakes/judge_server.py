"""A local OpenAI-compatible chat-completions server that stands in for the LLM judge in tests.

The real ``azure-ai-evaluation`` evaluators (``IntentResolutionEvaluator``, ``TaskAdherenceEvaluator``
and the private ``_TaskCompletionEvaluator``, checked against 1.18.10) can be pointed at it, with an
OpenAI-style configuration (:meth:`JudgeServer.openai_model_config`) or an Azure OpenAI one
(:meth:`JudgeServer.azure_model_config`), so a judge adapter is tested through the SDK's own prompt
rendering, HTTP client, output parsing and error handling. Standard library only (pytest for the fixture).

Routes (``POST``, JSON body, HTTP/1.1 keep-alive with ``Content-Length``):

* ``/chat/completions`` and ``/v1/chat/completions`` (OpenAI style, ``base_url``);
* ``/openai/deployments/{deployment}/chat/completions?api-version=...`` (Azure OpenAI style); an
  unknown deployment gets 404 ``DeploymentNotFound`` and a missing ``api-version`` 400, as on Azure.

Every request must carry the key (``api-key`` header or ``Authorization: Bearer``) unless the
server was made with ``api_key=None``; otherwise it gets 401.

Which evaluator a request is for is recognised from the prompt text (:func:`identify_evaluator`).
The reply is the JSON object that evaluator parses, as the message content of an OpenAI chat
completion: ``{"reason", "score", "status"}``, plus ``"properties"`` for task completion. The score
comes from markers in the *response section* of the prompt (the text the SDK renders from the
``response`` input; for task adherence also its ``TOOL_CALLS`` section), never from the query:

============================  ==================  ===============  ================
marker (first one wins)       intent_resolution   task_adherence   task_completion
============================  ==================  ===============  ================
``[judge:good]``              5 (pass)            1 (pass)         1 (pass)
``[judge:mid]``               3 (pass)            1 (pass)         0 (fail)
``[judge:bad]``               1 (fail)            0 (fail)         0 (fail)
none                          1 + h[0] % 5        h[1] % 2         h[2] % 2
============================  ==================  ===============  ================

where ``h = sha256(response text)`` (see :func:`expected_scores`; a string ``response`` is rendered
unchanged, a message list as the SDK formats it). Prompts of no known evaluator ("unknown") are
scored like intent resolution from their last user message. A per-evaluator marker such as
``[judge:intent_resolution=4]`` or ``[judge:task_completion=null]`` overrides the table for that
evaluator. ``[judge:fault=<mode>]`` (or ``[judge:fault=<mode>@<evaluator>]``) makes every request whose
response section carries it behave as ``<mode>``, which lets one episode fail deterministically
even when many are scored concurrently.

Failure modes (:class:`Behaviour`, or the string forms accepted by :meth:`Behaviour.parse`):
``http_500`` (any ``http_<status>``), ``rate_limit[:seconds]`` (429 with ``Retry-After`` and
``retry-after-ms``), ``insufficient_quota`` (429 that must not be retried), ``hang[:seconds]``
(answer normally after a delay, or never until the client goes away or the server stops),
``disconnect`` (close the connection without answering), ``non_json``, ``out_of_range`` (7 for
intent resolution, 2 for the binary judges), ``null_score``, ``missing_score``, ``skipped``
(``status: "skipped"``), ``score:<value>``, ``content_filter`` (HTTP 400 with the Azure OpenAI
``content_filter`` error body), ``filtered_output`` (HTTP 200 with ``finish_reason:
"content_filter"`` and null content) and ``length`` (the complete JSON reply followed by
whitespace up to the completion limit, ``finish_reason: "length"``, as models in JSON mode
sometimes do). Apply them with :meth:`JudgeServer.script` (the next requests, one behaviour
each) or :meth:`JudgeServer.set_mode` (all requests, or the next ``times``), globally or for one
evaluator; :meth:`JudgeServer.reset` returns to normal.

A reply longer than the request's ``max_tokens`` or ``max_completion_tokens`` (counted as the
usage is, at 4 characters per token) is cut there with ``finish_reason: "length"``.

Every request is recorded (:attr:`JudgeServer.requests`, :class:`RecordedRequest`) and counted per
evaluator (:attr:`JudgeServer.counts`). The ``judge_server`` fixture gives each test a fresh server.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import select
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

INTENT_RESOLUTION = "intent_resolution"
TASK_ADHERENCE = "task_adherence"
TASK_COMPLETION = "task_completion"
UNKNOWN = "unknown"
EVALUATORS = (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION)

DEFAULT_API_KEY = "test-key"
DEFAULT_API_VERSION = "2024-10-21"

# Text that only the corresponding evaluator's prompt contains (azure-ai-evaluation 1.18.10 prompty files).
_SIGNATURES = (
    (INTENT_RESOLUTION, "Intent-Resolution-Judge"),
    (TASK_ADHERENCE, "You are an impartial reviewer assessing whether the AI assistant's actions"),
    (TASK_COMPLETION, "You are a judge on Task Completion"),
)
# Where the rendered ``response`` input starts and ends in each prompt (first start, first end after it).
_RESPONSE_ANCHORS = {
    INTENT_RESOLUTION: ("\nAGENT_RESPONSE: ", "\n\nCONVERSATION_HISTORY is the full dialogue"),
    TASK_COMPLETION: ("\nAGENT_RESPONSE: ", "\n\nCONVERSATION_HISTORY includes the full dialogue"),
    TASK_ADHERENCE: ("- assistant_RESPONSE (assistant\u2019s message to the user): ", "\n\n# Evaluation dimensions"),
}
_TASK_ADHERENCE_TOOLS = "\n- TOOL_CALLS (assistant\u2019s tool interactions and results): "

_NAMED_SCORES = {
    "good": {INTENT_RESOLUTION: 5, TASK_ADHERENCE: 1, TASK_COMPLETION: 1, UNKNOWN: 5},
    "mid": {INTENT_RESOLUTION: 3, TASK_ADHERENCE: 1, TASK_COMPLETION: 0, UNKNOWN: 3},
    "bad": {INTENT_RESOLUTION: 1, TASK_ADHERENCE: 0, TASK_COMPLETION: 0, UNKNOWN: 1},
}
_OUT_OF_RANGE = {INTENT_RESOLUTION: 7, TASK_ADHERENCE: 2, TASK_COMPLETION: 2, UNKNOWN: 7}
_NAMED_MARKER = re.compile(r"\[judge:(good|mid|bad)\]")
_SCORE_MARKER = re.compile(r"\[judge:(intent_resolution|task_adherence|task_completion)=([^\]\s]+)\]")
_FAULT_MARKER = re.compile(r"\[judge:fault=([a-z_0-9]+(?::[0-9.]+)?)(?:@([a-z_]+))?\]")

CONTENT_FILTER_MESSAGE = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. "
    "Please modify your prompt and retry. To learn more about our content filtering policies please read our "
    "documentation: https://go.microsoft.com/fwlink/?linkid=2198766"
)


# --------------------------------------------------------------------------------------------------
# Prompt inspection and scoring (pure functions, usable by tests to compute expectations)
# --------------------------------------------------------------------------------------------------


def identify_evaluator(messages: Any) -> str:
    """Which evaluator a chat request is for, from its prompt text; ``"unknown"`` otherwise."""
    text = _messages_text(messages)
    for name, signature in _SIGNATURES:
        if signature in text:
            return name
    return UNKNOWN


def response_section(evaluator: str, messages: Any) -> tuple[str, str]:
    """``(response, tool_calls)``: the text rendered from the evaluator's response input.

    ``tool_calls`` is non-empty only for task adherence, which renders tool calls separately.
    For an unknown prompt the whole last user message is the response.
    """
    text = _last_user_text(messages)
    anchors = _RESPONSE_ANCHORS.get(evaluator)
    if anchors is None:
        return text, ""
    start_anchor, end_anchor = anchors
    start = text.find(start_anchor)
    if start < 0:
        return text, ""
    start += len(start_anchor)
    end = text.find(end_anchor, start)
    section = text[start:] if end < 0 else text[start:end]
    if evaluator == TASK_ADHERENCE:
        response, _, tools = section.partition(_TASK_ADHERENCE_TOOLS)
        return response, tools
    return section, ""


def sample_messages(evaluator: str, response: str, tool_calls: str = "") -> list[dict[str, str]]:
    """A minimal chat request that the server takes for ``evaluator``'s prompt with this response section.

    For tests that talk to the server with a plain OpenAI client instead of the real evaluators.
    """
    if evaluator == UNKNOWN:
        return [{"role": "user", "content": response}]
    signature = dict(_SIGNATURES)[evaluator]
    start, end = _RESPONSE_ANCHORS[evaluator]
    section = response + (_TASK_ADHERENCE_TOOLS + tool_calls if evaluator == TASK_ADHERENCE else "")
    user = f"{signature}.\n\nINPUT\n{start}{section}{end}\n\nOutput a JSON object."
    return [{"role": "system", "content": "You are a judge."}, {"role": "user", "content": user}]


def hash_scores(text: str) -> dict[str, int]:
    """The scores given to a response without markers: derived from ``sha256(text)``."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return {
        INTENT_RESOLUTION: 1 + digest[0] % 5,
        TASK_ADHERENCE: digest[1] % 2,
        TASK_COMPLETION: digest[2] % 2,
        UNKNOWN: 1 + digest[0] % 5,
    }


def expected_scores(response: str, tool_calls: str = "") -> dict[str, Any]:
    """The score each evaluator gets for a response section (see the module docstring's table).

    For a string ``response`` passed to an evaluator, the section is that string unchanged.
    """
    return {name: _score_for(name, response, tool_calls)[0] for name in EVALUATORS}


def _score_for(evaluator: str, response: str, tool_calls: str) -> tuple[Any, str]:
    """``(score, basis)`` for one evaluator; ``basis`` says which rule chose it (for the reason text)."""
    searched = response + "\n" + tool_calls
    for name, value in _SCORE_MARKER.findall(searched):
        if name == evaluator:
            return _parse_scalar(value), f"marker [judge:{name}={value}]"
    named = _NAMED_MARKER.search(searched)
    if named:
        return _NAMED_SCORES[named.group(1)][evaluator], f"marker [judge:{named.group(1)}]"
    return hash_scores(response)[evaluator], "hash of the response"


def _parse_scalar(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return _messages_text(messages)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


# --------------------------------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one request. Build with the class methods or :meth:`parse`."""

    kind: str = "normal"
    status: int | None = None  # http_error
    seconds: float | None = None  # rate_limit: Retry-After; hang: delay (None = until stopped); http_error
    score: Any = None  # score

    KINDS = (
        "normal",
        "http_error",
        "rate_limit",
        "insufficient_quota",
        "hang",
        "disconnect",
        "non_json",
        "out_of_range",
        "null_score",
        "missing_score",
        "skipped",
        "score",
        "content_filter",
        "filtered_output",
        "length",
    )

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"unknown judge behaviour {self.kind!r}; known: {', '.join(self.KINDS)}")

    @classmethod
    def normal(cls) -> Behaviour:
        return cls("normal")

    @classmethod
    def http_error(cls, status: int = 500, retry_after: float | None = None) -> Behaviour:
        """An error status with an OpenAI-style error body; ``retry_after`` adds ``Retry-After``."""
        return cls("http_error", status=status, seconds=retry_after)

    @classmethod
    def rate_limit(cls, retry_after: float = 1.0) -> Behaviour:
        """HTTP 429 with ``Retry-After: <seconds>`` and ``retry-after-ms``."""
        return cls("rate_limit", status=429, seconds=retry_after)

    @classmethod
    def insufficient_quota(cls) -> Behaviour:
        """HTTP 429 with error type ``insufficient_quota`` (clients must not retry it)."""
        return cls("insufficient_quota", status=429)

    @classmethod
    def hang(cls, seconds: float | None = None) -> Behaviour:
        """Answer normally after ``seconds``; ``None``: never, until the client leaves or the server stops."""
        return cls("hang", seconds=seconds)

    @classmethod
    def disconnect(cls) -> Behaviour:
        """Close the connection without sending a response."""
        return cls("disconnect")

    @classmethod
    def non_json(cls) -> Behaviour:
        return cls("non_json")

    @classmethod
    def out_of_range(cls) -> Behaviour:
        return cls("out_of_range")

    @classmethod
    def null_score(cls) -> Behaviour:
        return cls("null_score")

    @classmethod
    def missing_score(cls) -> Behaviour:
        return cls("missing_score")

    @classmethod
    def skipped(cls) -> Behaviour:
        return cls("skipped")

    @classmethod
    def with_score(cls, score: Any) -> Behaviour:
        """A normal reply carrying this exact score (any JSON value)."""
        return cls("score", score=score)

    @classmethod
    def content_filter(cls) -> Behaviour:
        """HTTP 400 with the Azure OpenAI prompt ``content_filter`` error body."""
        return cls("content_filter", status=400)

    @classmethod
    def filtered_output(cls) -> Behaviour:
        """HTTP 200 whose choice was filtered: ``finish_reason: "content_filter"``, null content."""
        return cls("filtered_output")

    @classmethod
    def length(cls) -> Behaviour:
        """HTTP 200: the JSON reply padded with whitespace up to the completion limit, ``finish_reason: "length"``."""
        return cls("length")

    @classmethod
    def parse(cls, spec: str | Behaviour) -> Behaviour:
        """A behaviour from its string form: ``"http_500"``, ``"rate_limit:0.5"``, ``"hang"``, ``"score:4"``..."""
        if isinstance(spec, Behaviour):
            return spec
        name, _, arg = str(spec).partition(":")
        number = float(arg) if arg and name != "score" else None
        if re.fullmatch(r"http_\d{3}", name):
            status = int(name[5:])
            return cls.rate_limit(number if number is not None else 1.0) if status == 429 else cls.http_error(status)
        if name == "http_error":
            return cls.http_error(int(number) if number is not None else 500)
        if name == "rate_limit":
            return cls.rate_limit(number if number is not None else 1.0)
        if name == "hang":
            return cls.hang(number)
        if name == "score":
            return cls.with_score(_parse_scalar(arg))
        return cls(name)


@dataclass
class RecordedRequest:
    """One request the server received. ``outcome`` is filled in once it has been handled."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON, or None
    raw_body: bytes
    evaluator: str
    style: str  # "openai" or "azure" (or "" for unknown paths)
    deployment: str | None
    behaviour: Behaviour
    timestamp: float  # time.time() on arrival
    response_text: str = ""  # the response section the score was derived from
    status: int | None = None  # HTTP status sent; None if none was sent
    outcome: str = "pending"  # answered | disconnected | client_gone | server_stopped | pending

    @property
    def api_key(self) -> str | None:
        """The key sent in ``api-key`` or as ``Authorization: Bearer <key>``."""
        if "api-key" in self.headers:
            return self.headers["api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


@dataclass
class _Mode:
    behaviour: Behaviour
    remaining: int | None  # None: until cleared


@dataclass
class _State:
    scripts: dict[str | None, deque[Behaviour]] = field(default_factory=dict)
    modes: dict[str | None, _Mode] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------


class JudgeServer:
    """An OpenAI-compatible judge double on ``127.0.0.1``. Use as a context manager or start/stop."""

    def __init__(
        self,
        *,
        model: str = "judge-model",
        deployment: str = "judge-deployment",
        api_key: str | None = DEFAULT_API_KEY,
        api_version: str = DEFAULT_API_VERSION,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model = model
        self.deployment = deployment
        self.api_key = api_key
        self.api_version = api_version
        self._host = host
        self._port = port
        self._lock = threading.Condition()
        self._state = _State()
        self._requests: list[RecordedRequest] = []
        self._counts: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 5.0) -> JudgeServer:
        """Bind, serve in a daemon thread, and wait (at most ``timeout`` s) until a connection succeeds."""
        if self._httpd is not None:
            raise RuntimeError("judge server already started")
        self._stopping.clear()
        httpd = _HTTPServer((self._host, self._port), _Handler)
        httpd.judge = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="judge-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"judge server did not accept connections within {timeout} s") from None
                time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: wakes hanging requests, closes every open connection, joins the serve thread."""
        self._stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
            self._lock.notify_all()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- addresses and model configurations ----------------------------------------------------

    @property
    def host(self) -> str:
        return self._address()[0]

    @property
    def port(self) -> int:
        return self._address()[1]

    def _address(self) -> tuple[str, int]:
        if self._httpd is None:
            raise RuntimeError("judge server is not running")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def azure_endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: the Azure OpenAI endpoint (the SDK adds ``/openai/deployments/...``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the OpenAI-compatible base URL."""
        return f"{self.azure_endpoint}/v1"

    def openai_model_config(self) -> dict[str, str]:
        """A fresh OpenAI-style model config (the SDK mutates the dict it is given)."""
        return {"type": "openai", "base_url": self.base_url, "api_key": self.api_key or "none", "model": self.model}

    def azure_model_config(self) -> dict[str, str]:
        """A fresh Azure OpenAI model config (``type`` is inferred by the SDK)."""
        return {
            "azure_endpoint": self.azure_endpoint,
            "azure_deployment": self.deployment,
            "api_version": self.api_version,
            "api_key": self.api_key or "none",
        }

    # ---- control -------------------------------------------------------------------------------

    def script(self, *behaviours: str | Behaviour, evaluator: str | None = None) -> None:
        """Queue one behaviour per upcoming request (for ``evaluator``, or any request)."""
        parsed = [Behaviour.parse(b) for b in behaviours]
        with self._lock:
            self._state.scripts.setdefault(_check_evaluator(evaluator), deque()).extend(parsed)

    def set_mode(self, behaviour: str | Behaviour, *, evaluator: str | None = None, times: int | None = None) -> None:
        """Answer every request (for ``evaluator``, or any) with ``behaviour``; only ``times`` of them if given.

        Scripted behaviours come first; an evaluator's own script or mode wins over the global ones.
        """
        mode = _Mode(Behaviour.parse(behaviour), times)
        with self._lock:
            self._state.modes[_check_evaluator(evaluator)] = mode

    def reset(self, *, evaluator: str | None = None) -> None:
        """Back to normal answers: drop every script and mode, or only those set for ``evaluator``."""
        with self._lock:
            if evaluator is None:
                self._state = _State()
            else:
                key = _check_evaluator(evaluator)
                self._state.scripts.pop(key, None)
                self._state.modes.pop(key, None)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()
            self._counts.clear()

    # ---- inspection ----------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def counts(self) -> Counter[str]:
        """Requests received per evaluator name (``"unknown"`` for unrecognised prompts)."""
        with self._lock:
            return Counter(self._counts)

    def count(self, evaluator: str | None = None) -> int:
        with self._lock:
            return sum(self._counts.values()) if evaluator is None else self._counts[evaluator]

    def wait_for_requests(self, n: int, timeout: float = 5.0, *, evaluator: str | None = None) -> list[RecordedRequest]:
        """Block until at least ``n`` requests (for ``evaluator``) arrived; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                matching = [r for r in self._requests if evaluator is None or r.evaluator == evaluator]
                if len(matching) >= n:
                    return matching
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(matching)} of {n} judge requests after {timeout} s")
                self._lock.wait(remaining)

    def wait_for_outcome(self, request: RecordedRequest, timeout: float = 5.0) -> str:
        """Block until ``request`` has been handled; returns its outcome."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while request.outcome == "pending":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"judge request still pending after {timeout} s")
                self._lock.wait(remaining)
            return request.outcome

    # ---- request handling (called from handler threads) ----------------------------------------

    def _choose(self, evaluator: str, marker_fault: Behaviour | None) -> Behaviour:
        if marker_fault is not None:
            return marker_fault
        with self._lock:
            for key in (evaluator, None):
                queue = self._state.scripts.get(key)
                if queue:
                    return queue.popleft()
            for key in (evaluator, None):
                mode = self._state.modes.get(key)
                if mode is None:
                    continue
                if mode.remaining is not None:
                    mode.remaining -= 1
                    if mode.remaining <= 0:
                        del self._state.modes[key]
                return mode.behaviour
        return Behaviour.normal()

    def _record(self, record: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(record)
            self._counts[record.evaluator] += 1
            self._lock.notify_all()

    def _finish(self, record: RecordedRequest, outcome: str, status: int | None) -> None:
        with self._lock:
            record.outcome = outcome
            record.status = status
            self._lock.notify_all()

    def _next_id(self) -> int:
        with self._lock:
            return next(self._ids)


def _check_evaluator(evaluator: str | None) -> str | None:
    if evaluator is not None and evaluator not in (*EVALUATORS, UNKNOWN):
        raise ValueError(f"unknown evaluator {evaluator!r}; known: {', '.join((*EVALUATORS, UNKNOWN))}")
    return evaluator


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 256  # listen backlog: socketserver's 5 drops bursts of new connections (SYN retries, 1-7 s)
    judge: JudgeServer

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.judge._lock:
            self.judge._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.judge._lock:
            self.judge._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connections reset by clients that gave up are expected here; keep test output clean.
        pass


_AZURE_PATH = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "JudgeServer/1.0"
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ---- plumbing ------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        # Head and body in one write (as end_headers would, plus the body): no small-packet delays.
        self._headers_buffer.extend((b"\r\n", body))
        record = getattr(self, "_current", None)
        if record is not None:  # recorded before the client can see the answer
            self.server.judge._finish(record, "answered", status)
        self.flush_headers()

    def do_GET(self) -> None:
        self._read_body()
        self._send_json(404, _error_body("Resource not found", code="404", type_="invalid_request_error"))

    def do_POST(self) -> None:
        judge = self.server.judge
        raw = self._read_body()
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        messages = body.get("messages") if isinstance(body, dict) else None
        evaluator = identify_evaluator(messages)
        response, tool_calls = response_section(evaluator, messages)

        style, deployment = "", None
        if url.path in ("/chat/completions", "/v1/chat/completions"):
            style = "openai"
        elif match := _AZURE_PATH.match(url.path):
            style, deployment = "azure", match.group(1)

        record = RecordedRequest(
            method="POST",
            path=url.path,
            query=query,
            headers=headers,
            body=body,
            raw_body=raw,
            evaluator=evaluator,
            style=style,
            deployment=deployment,
            behaviour=Behaviour.normal(),
            timestamp=time.time(),
            response_text=response,
        )
        rejection = _reject(judge, record)
        if rejection is None:
            record.behaviour = judge._choose(evaluator, _marker_fault(evaluator, response + "\n" + tool_calls))
        judge._record(record)
        self._current = record
        try:
            if rejection is not None:
                self._send_json(*rejection)
            else:
                self._respond(judge, record, response, tool_calls)
        except OSError:
            self.close_connection = True
            judge._finish(record, "client_gone", None)
        finally:
            self._current = None

    # ---- answering -----------------------------------------------------------------------------

    def _respond(self, judge: JudgeServer, record: RecordedRequest, response: str, tool_calls: str) -> None:
        """Send the answer for a valid request, or record why none was sent."""
        azure = record.style == "azure"
        behaviour = record.behaviour
        kind = behaviour.kind
        if kind == "hang":
            outcome = self._hang(judge, behaviour.seconds)
            if outcome is not None:
                self.close_connection = True
                judge._finish(record, outcome, None)
                return
            behaviour = Behaviour.normal()
            kind = "normal"
        if kind == "disconnect":
            self.close_connection = True
            judge._finish(record, "disconnected", None)
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        elif kind == "http_error":
            status = behaviour.status or 500
            headers = {} if behaviour.seconds is None else _retry_after_headers(behaviour.seconds)
            self._send_json(status, _http_error_body(status, azure), headers)
        elif kind == "rate_limit":
            seconds = behaviour.seconds if behaviour.seconds is not None else 1.0
            self._send_json(429, _rate_limit_body(seconds, azure, judge.api_version), _retry_after_headers(seconds))
        elif kind == "insufficient_quota":
            message = "You exceeded your current quota, please check your plan and billing details."
            self._send_json(429, _error_body(message, code="insufficient_quota", type_="insufficient_quota"))
        elif kind == "content_filter":
            self._send_json(400, _content_filter_body())
        else:
            content, finish_reason = _reply_content(record.evaluator, behaviour, response, tool_calls)
            content, finish_reason = _limit_reply(content, finish_reason, record.body, kind == "length")
            payload = _completion(judge, record, content, finish_reason, azure)
            self._send_json(200, payload, {"x-request-id": _req_id()})

    def _hang(self, judge: JudgeServer, seconds: float | None) -> str | None:
        """Wait ``seconds`` (forever if None). Returns an outcome if the wait ended without an answer."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            if judge._stopping.is_set():
                return "server_stopped"
            if _peer_closed(self.connection):
                return "server_stopped" if judge._stopping.is_set() else "client_gone"
            if deadline is not None and time.monotonic() >= deadline:
                return None
            wait = 0.02 if deadline is None else min(0.02, max(0.0, deadline - time.monotonic()))
            judge._stopping.wait(wait)


def _reject(judge: JudgeServer, record: RecordedRequest) -> tuple[int, dict[str, Any]] | None:
    """The error answer for a request that is not a valid chat completion call, as the real services give it."""
    azure = record.style == "azure"
    if not record.style:
        return 404, _error_body("Resource not found", code="404")
    if azure and "api-version" not in record.query:
        message = "The api-version query parameter (?api-version=) is required for all requests."
        return 400, {"error": {"code": "MissingApiVersionParameter", "message": message}}
    if judge.api_key is not None and record.api_key != judge.api_key:
        if azure:
            message = (
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a "
                "valid key for an active subscription and use a correct regional API endpoint for your resource."
            )
            return 401, {"error": {"code": "401", "message": message}}
        return 401, _error_body("Incorrect API key provided.", code="invalid_api_key")
    if azure and record.deployment != judge.deployment:
        message = (
            "The API deployment for this resource does not exist. If you created the deployment within the "
            "last 5 minutes, please wait a moment and try again."
        )
        return 404, {"error": {"code": "DeploymentNotFound", "message": message}}
    if not isinstance(record.body, dict) or not isinstance(record.body.get("messages"), list):
        return 400, _error_body("'messages' is a required property", code=None, param="messages")
    return None


def _peer_closed(conn: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        if not readable:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _marker_fault(evaluator: str, text: str) -> Behaviour | None:
    for spec, scope in _FAULT_MARKER.findall(text):
        if not scope or scope == evaluator:
            return Behaviour.parse(spec)
    return None


def _req_id() -> str:
    return hashlib.sha1(str(time.perf_counter_ns()).encode()).hexdigest()[:32]


def _retry_after_headers(seconds: float) -> dict[str, str]:
    text = str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
    return {"Retry-After": text, "retry-after-ms": str(round(seconds * 1000))}


def _error_body(message: str, *, code: str | None, type_: str | None = "invalid_request_error", param: Any = None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _http_error_body(status: int, azure: bool) -> dict[str, Any]:
    if status >= 500:
        message = "The server had an error while processing your request. Sorry about that!"
        if azure:
            return {"error": {"code": "InternalServerError", "message": message}}
        return _error_body(message, code=None, type_="server_error")
    return _error_body(f"Judge server scripted error {status}.", code=str(status))


def _rate_limit_body(seconds: float, azure: bool, api_version: str) -> dict[str, Any]:
    wait = max(1, round(seconds))
    if azure:
        message = (
            f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {api_version} have "
            f"exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after {wait} second"
            f"{'' if wait == 1 else 's'}."
        )
        return {"error": {"code": "429", "message": message}}
    message = f"Rate limit reached for requests. Please try again in {seconds}s."
    return _error_body(message, code="rate_limit_exceeded", type_="requests")


def _content_filter_body() -> dict[str, Any]:
    categories = {name: {"filtered": False, "severity": "safe"} for name in ("hate", "self_harm", "sexual")}
    categories["violence"] = {"filtered": True, "severity": "medium"}
    categories["jailbreak"] = {"filtered": False, "detected": False}
    return {
        "error": {
            "message": CONTENT_FILTER_MESSAGE,
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": categories},
        }
    }


def _reply_content(evaluator: str, behaviour: Behaviour, response: str, tool_calls: str) -> tuple[str | None, str]:
    """The message content (the JSON the evaluator parses) and the finish reason."""
    kind = behaviour.kind
    if kind == "filtered_output":
        return None, "content_filter"
    if kind == "non_json":
        return "The agent did well overall; I would give it a 5 out of 5.", "stop"
    score, basis = _score_for(evaluator, response, tool_calls)
    status = "completed"
    if kind == "out_of_range":
        score, basis = _OUT_OF_RANGE[evaluator], "scripted out_of_range"
    elif kind == "null_score":
        score, basis = None, "scripted null_score"
    elif kind == "score":
        score, basis = behaviour.score, "scripted score"
    elif kind == "skipped":
        score, basis, status = None, "scripted skipped", "skipped"
    elif kind == "missing_score":
        basis = "scripted missing_score"
    shown = "absent" if kind == "missing_score" else json.dumps(score)
    reason = f"judge-server {evaluator}: score {shown} from {basis}."
    reply: dict[str, Any] = {"reason": reason, "score": score, "status": status}
    if evaluator == TASK_COMPLETION:
        reply = {
            "reason": reason,
            "properties": None
            if status == "skipped"
            else {
                "task_requirements": "judge-server: requirements as stated in the conversation.",
                "delivered_outcome": f"judge-server: {basis}.",
                "completion_gaps": "none" if score == 1 else "judge-server: scripted gap.",
            },
            "score": score,
            "status": status,
        }
    if kind == "missing_score":
        reply.pop("score")
    return json.dumps(reply), "stop"


def completion_limit(body: Any) -> int | None:
    """The completion limit a request asks for (``max_completion_tokens`` or ``max_tokens``), if any."""
    if not isinstance(body, dict):
        return None
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _limit_reply(content: str | None, finish_reason: str, body: Any, pad: bool) -> tuple[str | None, str]:
    """Cut a reply at the request's completion limit (4 characters per token), or pad it to the limit."""
    limit = completion_limit(body)
    if content is None or finish_reason != "stop":
        return content, finish_reason
    if pad:
        return content + " " * max(1, (limit or 25) * 4 - len(content)), "length"
    if limit is not None and len(content) // 4 > limit:
        return content[: limit * 4], "length"
    return content, finish_reason


def _completion(
    judge: JudgeServer, record: RecordedRequest, content: str | None, finish_reason: str, azure: bool
) -> dict[str, Any]:
    prompt_tokens = max(
        1, sum(len(_content_text(m.get("content"))) for m in record.messages if isinstance(m, dict)) // 4
    )
    completion_tokens = max(1, len(content or "") // 4)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "refusal": None},
        "finish_reason": finish_reason,
        "logprobs": None,
    }
    payload: dict[str, Any] = {
        "id": f"chatcmpl-judge-{judge._next_id()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": judge.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "system_fingerprint": "fp_judge_server",
    }
    if azure:
        safe = {name: {"filtered": False, "severity": "safe"} for name in ("hate", "self_harm", "sexual", "violence")}
        filtered = dict(safe, violence={"filtered": True, "severity": "medium"})
        choice["content_filter_results"] = filtered if finish_reason == "content_filter" else safe
        payload["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": safe}]
    return payload


# --------------------------------------------------------------------------------------------------
# pytest fixture
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def judge_server():
    """A fresh :class:`JudgeServer` per test (started within 5 s, stopped afterwards)."""
    server = JudgeServer()
    server.start(timeout=5.0)
    try:
        yield server
    finally:
        server.stop()
