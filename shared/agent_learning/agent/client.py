"""Agent side: read an agent's current policy, cached, and choose from it; write episodes over HTTP.

:class:`PolicyClient` re-reads the current policy document at most every
``refresh_seconds`` (and at once after a version was published in its own process:
:mod:`agent_learning.core.notices`) with a conditional read (``If-None-Match`` on Cosmos DB), so an unchanged
policy costs no document transfer and no parsing. If the document cannot be read (the store
unreachable or answering with errors) or fails validation, it keeps serving the last good
policy (and logs why) rather than failing the agent; only the very first read must succeed.
A read that succeeds and finds no policy (the agent was deleted) is not such a failure: it
raises :class:`~agent_learning.core.errors.NotFound` and drops the cached policy.

In deployments that isolate agents (:mod:`agent_learning.app.ingestion`) agents have no Cosmos DB
access and go through the Function app instead: :class:`HttpPolicySource` is what
:class:`PolicyClient` reads from (``GET /api/policies/{agent_id}``, conditional) and
:class:`HttpEpisodeWriter` what :class:`~agent_learning.agent.capture.EpisodeCapture` writes to
(``POST /api/agents/{agent_id}/episodes``). Both need only the standard library.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent_learning.core import notices
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DocumentTooLarge,
    InvalidDocument,
    NotFound,
    PermanentError,
    TransientError,
)
from agent_learning.documents import Episode, agent_id_problem, stored_policy
from agent_learning.policy.softmax import Decision, SoftmaxPolicy
from agent_learning.store.base import NOT_MODIFIED, NotModified, Store, Tagged

log = logging.getLogger(__name__)

REFRESH_SECONDS = 30.0
"""How often a client re-reads its agent's current policy, unless told otherwise (settings alike)."""


class PolicyClient:
    """The agent's handle on its policy: ``client.choose()`` → :class:`Decision`. It reads from
    a store or from an :class:`HttpPolicySource`."""

    def __init__(
        self,
        store: Store | HttpPolicySource,
        agent_id: str,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        rng: random.Random | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if problem := agent_id_problem(agent_id):
            raise InvalidDocument("policy client", [("agent_id", problem)])
        if problem := _seconds_problem(refresh_seconds):
            raise InvalidDocument("policy client", [("refresh_seconds", problem)])
        self.store = store
        self.agent_id = agent_id
        self.refresh_seconds = refresh_seconds
        self.rng = rng or random.Random()
        self.clock = clock
        self._policy: SoftmaxPolicy | None = None
        self._etag: str | None = None
        self._checked_at = -float("inf")
        self._notices = -1
        self._lock = threading.Lock()
        self._refreshing = False  # an achoose() refresh is under way in a worker thread
        self.last_error: str | None = None
        self.reads_with_transfer = 0
        self.reads_not_modified = 0

    def policy(self) -> SoftmaxPolicy:
        """The current policy, refreshed if older than ``refresh_seconds`` or replaced in this process.

        Raises :class:`NotFound` when the agent has no policy (never had one, or it was deleted).
        """
        policy = self._policy
        if policy is None or self._due():
            policy = self.refresh()
        return policy

    def _due(self) -> bool:
        return (
            self.clock.time() - self._checked_at >= self.refresh_seconds
            or notices.generation(self.agent_id) != self._notices
        )

    def choose(self, context: Mapping[str, Any] | None = None, actions: Sequence[Any] | None = None) -> Decision:
        """Draw a configuration from the current policy (:meth:`policy`); ``context`` (the
        request's features) is logged with the episode, and ``actions`` (those the request
        offers, with their features) too (:meth:`SoftmaxPolicy.choose`)."""
        return self.policy().choose(context=context, actions=actions)

    async def achoose(self, context: Mapping[str, Any] | None = None, actions: Sequence[Any] | None = None) -> Decision:
        """:meth:`choose` for asyncio code: a refresh that is due reads the store in a worker
        thread, so the event loop goes on serving other requests meanwhile; choices made while
        it is under way draw from the cached policy (the first read is awaited by every caller)."""
        policy = self._policy
        if policy is None or (self._due() and not self._refreshing):
            self._refreshing = True  # set before awaiting: the loop's other tasks see it at once
            try:
                policy = await asyncio.to_thread(self.refresh)
            finally:
                self._refreshing = False
        return policy.choose(context=context, actions=actions)

    def refresh(self) -> SoftmaxPolicy:
        """Read the current document now; keep the last good policy if the read fails or the
        document is invalid (without one, the failure is raised: an invalid document as
        :class:`StoredDocumentInvalid`). No policy at all (the agent deleted) raises :class:`NotFound`."""
        with self._lock:
            self._checked_at = self.clock.time()
            self._notices = notices.generation(self.agent_id)
            try:
                known = self._etag if self._policy is not None else None
                tagged = self.store.get_current_policy_if_changed(self.agent_id, known)
                if tagged is None:
                    self._policy, self._etag = None, None
                    raise NotFound(
                        f"agent {self.agent_id!r} has no policy in {self.store.location}; create one with "
                        f"`agent-learn init-policy --agent-id {self.agent_id} --actions FILE`"
                    )
                if isinstance(tagged, Tagged):
                    doc = stored_policy(tagged.doc)
                    self._policy = SoftmaxPolicy.from_document(doc, rng=self.rng)
                    self._etag = tagged.etag
                    self.reads_with_transfer += 1
                else:
                    self.reads_not_modified += 1
                self.last_error = None
            except Exception as exc:  # no policy, invalid, or the store unreachable (an SDK error of any type)
                self.last_error = str(exc) or type(exc).__name__
                if self._policy is None:
                    raise
                log.warning("keeping policy %s v%d: %s", self.agent_id, self._policy.version, exc)
            return self._policy


class HttpPolicySource:
    """Reads an agent's current policy from ``GET {base_url}/api/policies/{agent_id}`` (the
    Function app's URL) with a function ``key``, for :class:`PolicyClient`::

        client = PolicyClient(HttpPolicySource(os.environ["FUNCTION_APP_URL"], key), "support-eu")

    A known ETag is sent as ``If-None-Match``, so an unchanged policy answers 304 with no body.
    Failures raise (:class:`PolicyClient` keeps its last good policy): a 401 or 403, or a 404
    that is not "no policy", :class:`ConfigurationError`; anything else (an answer that is not
    JSON too) :class:`TransientError` naming the URL.
    """

    def __init__(
        self, base_url: str, key: str | None = None, *, timeout: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        if problem := _seconds_problem(timeout, above_zero=True):
            raise InvalidDocument("http policy source", [("timeout", problem)])
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Accept": "application/json", **(headers or {})}
        if key:
            self._headers["x-functions-key"] = key

    def __repr__(self) -> str:  # never the key
        return f"HttpPolicySource({self.base_url!r})"

    @property
    def location(self) -> str:
        """Where the policies are read, for messages."""
        return self.base_url

    def url(self, agent_id: str) -> str:
        return f"{self.base_url}/api/policies/{urllib.parse.quote(agent_id, safe='')}"

    def get_current_policy_if_changed(self, agent_id: str, etag: str | None) -> Tagged | NotModified | None:
        """The current policy and its ETag, ``NOT_MODIFIED`` if it still has ``etag``, or ``None``."""
        url, headers = self.url(agent_id), dict(self._headers)
        if etag:
            headers["If-None-Match"] = f'"{etag}"'
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=self.timeout) as answer:
                # A proxy that compresses the answer may weaken the tag (W/"x"): the server
                # compares If-None-Match weakly, so the opaque part is what is sent back.
                body, etag = answer.read(), answer.headers.get("ETag", "").strip().removeprefix("W/").strip('"')
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return NOT_MODIFIED
            message = _error_text(exc)
            if exc.code == 404 and "has no policy" in message:
                return None
            error = ConfigurationError if exc.code in (401, 403, 404) else TransientError
            raise error(f"{url} answered {exc.code}: {message}") from None
        except OSError as exc:
            raise TransientError(f"{url} failed: {getattr(exc, 'reason', exc)}") from None
        try:
            return Tagged(json.loads(body), etag)
        except ValueError:  # e.g. a sign-in page a proxy or App Service Authentication answered with
            shown = body[:200].decode("utf-8", errors="replace")
            raise TransientError(f"{url} answered with a body that is not JSON: {shown!r}") from None


RETRY_AFTER_CAP_SECONDS = 30.0
"""The longest pause :class:`HttpEpisodeWriter` takes for a ``Retry-After`` answer."""


class HttpEpisodeWriter:
    """Writes episodes with ``POST {base_url}/api/agents/{agent_id}/episodes`` (the Function
    app's URL, ``FUNCTION_APP_URL``), authenticated with a function ``key`` of the agent's own
    (``x-functions-key``; ``headers`` may add e.g. an ``Authorization`` bearer token)::

        writer = HttpEpisodeWriter(os.environ["FUNCTION_APP_URL"], os.environ["AGENT_FUNCTION_KEY"])
        with EpisodeCapture(writer, decision, input=question) as run:
            ...

    The write is idempotent, so a connection failure, a timeout, a 429 or a 5xx is retried,
    ``attempts`` tries in all with pauses of ``backoff`` seconds doubling each time (or the
    answer's ``Retry-After``); then :class:`TransientError`. A 409 raises
    :class:`ConcurrencyConflict` (the id holds another episode), a 400 :class:`InvalidDocument`, a
    413 :class:`DocumentTooLarge` (an :class:`InvalidDocument` too), a 401, 403 or 404
    :class:`ConfigurationError` (a wrong key, a caller not allowed to write the agent, ingestion
    off, an agent without a policy), any other answer :class:`PermanentError`. A ``timeout`` that
    is not above 0, a negative ``backoff`` or ``attempts`` below 1 raise :class:`InvalidDocument` here.
    """

    def __init__(
        self,
        base_url: str,
        key: str | None = None,
        *,
        timeout: float = 10.0,
        attempts: int = 3,
        backoff: float = 0.5,
        headers: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        problems = [
            (name, problem)
            for name, problem in (
                ("timeout", _seconds_problem(timeout, above_zero=True)),
                ("backoff", _seconds_problem(backoff)),
            )
            if problem
        ]
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            problems.append(("attempts", f"must be a whole number of tries, at least 1, got {attempts!r:.40}"))
        if problems:
            raise InvalidDocument("http episode writer", problems)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if key:
            self._headers["x-functions-key"] = key
        self._sleep = sleep

    def __repr__(self) -> str:  # never the key
        return f"HttpEpisodeWriter({self.base_url!r})"

    def url(self, agent_id: str) -> str:
        return f"{self.base_url}/api/agents/{urllib.parse.quote(agent_id, safe='')}/episodes"

    def add_episode(self, episode: Episode) -> None:
        """Write ``episode``; a retry of one already written is a no-op (200)."""
        url, body = self.url(episode.agent_id), episode.to_json().encode()
        problem = ""
        for attempt in range(self.attempts):
            pause = self.backoff * 2**attempt
            try:
                request = urllib.request.Request(url, body, self._headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                    return
            except urllib.error.HTTPError as exc:
                status, message = exc.code, _error_text(exc)
                if status == 409:
                    raise ConcurrencyConflict(f"episode {episode.id!r}: {message}") from None
                if status in (400, 413):  # 413: over MAX_EPISODE_BYTES, told apart as on the server
                    error = DocumentTooLarge if status == 413 else InvalidDocument
                    raise error("episode", _problems(message)) from None
                if status in (401, 403, 404):
                    raise ConfigurationError(f"{url} answered {status}: {message}") from None
                if status != 429 and status < 500:
                    raise PermanentError(f"{url} answered {status}: {message}") from None
                problem = f"answered {status}: {message}"
                pause = _retry_after(exc.headers.get("Retry-After"), pause)
            except OSError as exc:  # refused, reset, DNS, timeout (URLError is an OSError)
                problem = f"failed: {getattr(exc, 'reason', exc)}"
            if attempt + 1 < self.attempts:
                log.warning("episode %s: %s %s; retrying", episode.id, url, problem)
                self._sleep(pause)
        raise TransientError(f"episode {episode.id!r}: {url} {problem} ({self.attempts} attempts)")


def _seconds_problem(value: object, *, above_zero: bool = False) -> str | None:
    """Why ``value`` is not a finite number of seconds, at least 0 (above 0 with ``above_zero``: a
    timeout of 0 makes every request fail at once, as on a non-blocking socket), or None."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= sys.float_info.max
        or (above_zero and value == 0)
    ):
        return f"must be a finite number of seconds, {'above' if above_zero else 'at least'} 0, got {value!r:.40}"
    return None


FIELD_PATH = re.compile(r"[A-Za-z_][\w.\[\]-]*")
"""A field as an answer names it: ``probability``, ``steps[2].latency_ms``, ``context.task``."""


def _problems(message: str) -> list[tuple[str, str]]:
    """The ``(field, problem)`` pairs of a refusal worded as :class:`InvalidDocument` words them
    (``"probability: must be at most 1; context.task: ..."``); a part that names no field belongs
    to the problem before it (a problem may contain ``"; "``)."""
    pairs: list[tuple[str, str]] = []
    for part in message.split("; "):
        field, sep, detail = part.partition(": ")
        if sep and FIELD_PATH.fullmatch(field):
            pairs.append((field, detail))
        elif pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]}; {part}")
        else:
            pairs.append(("(document)", part))
    return pairs


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The ``error`` of a JSON answer, else the answer's text (shortened)."""
    try:
        text = exc.read().decode("utf-8", errors="replace")
    except OSError:
        return exc.reason or ""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500] or str(exc.reason)
    return str(data.get("error", text))[:500] if isinstance(data, dict) else text[:500]


def _retry_after(header: str | None, default: float) -> float:
    try:
        return min(max(0.0, float(header)), RETRY_AFTER_CAP_SECONDS) if header else default
    except ValueError:
        return default
