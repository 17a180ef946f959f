"""What the Azure Functions triggers call: thin adapters from binding types to the pipeline.

``function_app.py`` only declares triggers and forwards to these functions; each takes its
dependencies as an argument (a :class:`Runtime`), so tests call them with the real
``azure.functions`` types and local stores. :func:`runtime` builds the production
dependencies once per worker process, from settings (:mod:`agent_learning.app.wiring`), on first
use: importing this module imports neither the Azure SDKs, numpy nor pydantic, which keeps the
app's start-up fast (``tests/test_function_app.py`` checks it). That is why the library's
modules are imported inside the functions here: each of them reaches pydantic (the documents).

Failure semantics per trigger:

* ``enqueue`` (Cosmos change feed) raises only if sending to Service Bus fails, so that the
  trigger's retry policy retries the whole batch (a redelivered batch is deduplicated by
  message id); documents that cannot be turned into messages are logged and skipped.
* ``score`` (Service Bus) returns normally when the message is done (the host completes it),
  raises ``TransientScoringError`` to have it redelivered, and raises ``PoisonMessage`` for bad
  input: the reason is logged on every delivery, each of which fails fast, and Service Bus
  dead-letters the message after MaxDeliveryCount deliveries (:mod:`agent_learning.app.deliveries`
  decides what becomes of a message, for this host and the embedded runner alike).
* ``train`` (timer) first applies feedback whose handler died before applying it, then plans
  the tick: one message per agent with new scores on the training queue
  (:mod:`agent_learning.pipeline.fanout`); it raises only if the store cannot list the agents
  or sending fails (the next tick plans again).
* ``train_agent`` (Service Bus, the training queue) trains the agent a message names; every
  outcome completes the message (a store outage is logged as a warning, ``unavailable``; a
  corrupt policy or anything else as an error; the next tick asks again), except a body that
  is not a training request, which is a ``PoisonMessage``. Every published version is checked
  for exploration collapse and reward drops.
* ``feedback`` (HTTP POST) stores a caller's feedback on an episode and reconciles its reward;
  bad input is a 400 naming the field, an unknown episode a 404, and posting again is a no-op.
* ``choose`` (HTTP POST) draws a configuration for a caller in another language, from the
  current policy as a :class:`~agent_learning.agent.client.PolicyClient` caches it; bad input is a
  400 naming the field, an unknown agent a 404.
* ``ingest`` (HTTP POST) writes an agent's episode for a caller allowed to write that agent
  (:mod:`agent_learning.app.ingestion`), if the scorer could score it (its policy version and
  action exist); posting the same episode again is a no-op.
* Every HTTP route answers 503 with ``Retry-After`` while the store is throttled or unreachable
  (:class:`~agent_learning.core.errors.TransientError`), so that the caller retries; ``policy`` and
  ``choose`` answer so too when the current policy document is invalid
  (:class:`~agent_learning.core.errors.StoredDocumentInvalid`).

:func:`build_runtime` also installs the telemetry exporters the settings choose.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_learning.app.deliveries import (
    HostSettles,
    deliver_training,
    scoring_failed,
    settle_score,
)
from agent_learning.core.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    InvalidDocument,
    LimitExceeded,
    NotFound,
    StoredDocumentInvalid,
    TransientError,
)

if TYPE_CHECKING:  # imported lazily at run time: the app's cold start stays short
    from agent_learning.app.callers import Caller
    from agent_learning.app.settings import Settings
    from agent_learning.app.wiring import Components
    from agent_learning.pipeline import EnqueueResult, Scorer, TrainingPlan, TrainOutcome
    from agent_learning.pipeline.score import PolicyVersions
    from agent_learning.store.base import Store

log = logging.getLogger("agent_learning.app.handlers")


@dataclass
class Runtime:
    """The app's dependencies: a store, ways to send scoring and training messages, the scorer,
    the learner."""

    settings: Settings
    store: Store
    send: Any
    scorer: Scorer | None = None
    learner: Any = None
    clients: dict[str, Any] = field(default_factory=dict)
    """Agent id → the :class:`~agent_learning.agent.client.PolicyClient` the choose route draws from."""
    send_train: Any = None
    """Sends training messages (the timer's fan-out)."""
    policy_versions: PolicyVersions | None = None
    """The policy versions the episodes route checks episodes against, built on first use
    (:func:`policy_versions_of`)."""
    parts: Components | None = None
    """Where the scorer and the learner are built on first use (:class:`~agent_learning.app.wiring.Components`
    of the settings and the store, unless given)."""


CACHED_POLICY_VERSIONS = 256
"""Policy versions the episodes route keeps parsed (they are immutable; a missing one is not kept),
each for at most ``AGENT_LEARNING_POLICY_REFRESH_SECONDS``, as the choose route keeps a policy: a
deleted agent's episodes are refused (404) once that has passed."""


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The production dependencies, built once from the environment."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            # lazy: pydantic (see the module docstring)
            from agent_learning.app.settings import load_settings

            _runtime = build_runtime(load_settings())
        return _runtime


def build_runtime(settings: Settings, environ: Mapping[str, str] | None = None) -> Runtime:
    """Store, queue sender, scorer and learner as ``settings`` choose them.

    Inside Azure (``WEBSITE_INSTANCE_ID`` is set) the offline judge is refused unless
    ``AGENT_LEARNING_ALLOW_OFFLINE_JUDGE`` says otherwise: a scorer without a judge model
    configuration fails loudly instead of producing made-up rewards.
    """
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.wiring import Components, configure

    env = os.environ if environ is None else environ
    if env.get("WEBSITE_INSTANCE_ID") and settings.judge == "offline" and not settings.allow_offline_judge:
        raise ConfigurationError(
            "no judge model is configured: set AGENT_LEARNING_JUDGE=evaluators with "
            "AGENT_LEARNING_JUDGE_AZURE_ENDPOINT and AGENT_LEARNING_JUDGE_DEPLOYMENT (or _JUDGE_BASE_URL and "
            "_JUDGE_MODEL); the offline judge is for local runs "
            "(AGENT_LEARNING_ALLOW_OFFLINE_JUDGE=true to use it anyway)"
        )

    configure(settings)
    parts = Components(settings)
    return Runtime(settings, parts.store, parts.queue.send, send_train=parts.train_queue.send, parts=parts)


def parts_of(rt: Runtime) -> Components:
    """Where the runtime's scorer and learner are built: the settings' parts around its store."""
    if rt.parts is None:
        # lazy: pydantic (see the module docstring)
        from agent_learning.app.wiring import Components

        rt.parts = Components(rt.settings, store=rt.store)
    return rt.parts


def scorer_of(rt: Runtime) -> Scorer:
    """The runtime's scorer, built on first use (the judge may be a remote model)."""
    if rt.scorer is None:
        rt.scorer = parts_of(rt).scorer
    return rt.scorer


def policy_versions_of(rt: Runtime) -> PolicyVersions:
    """The runtime's cache of policy versions, built on first use."""
    if rt.policy_versions is None:
        # lazy: pydantic (see the module docstring)
        from agent_learning.pipeline.score import PolicyVersions

        rt.policy_versions = PolicyVersions(
            rt.store, CACHED_POLICY_VERSIONS, max_age=rt.settings.policy_refresh_seconds
        )
    return rt.policy_versions


def learner_of(rt: Runtime) -> Any:
    """The runtime's learner, built on first use (it imports numpy)."""
    if rt.learner is None:
        rt.learner = parts_of(rt).learner
    return rt.learner


# --------------------------------------------------------------------------- triggers


def enqueue(documents: Iterable[Mapping[str, Any]], rt: Runtime) -> EnqueueResult:
    """Cosmos DB trigger on ``episodes``: one scoring message per new episode."""
    # lazy: pydantic (see the module docstring)
    from agent_learning.pipeline import enqueue_episodes

    docs = [_as_dict(d) for d in documents]
    result = enqueue_episodes(docs, rt.send)
    # Service Bus drops duplicate message ids within its window without telling the sender, so
    # "sent" counts them too (EnqueueResult.duplicates is 0 here).
    log.info("enqueue: %d documents, %d sent to the queue, %d not sendable", result.received, result.sent,
             len(result.failed))
    return result


def score(body: bytes | str, delivery_count: int, message_id: str | None, rt: Runtime) -> str:
    """Service Bus trigger: judge and store one episode's score; returns the outcome status, or
    raises what the host settles the message by (:mod:`agent_learning.app.deliveries`)."""
    # lazy: pydantic (see the module docstring)
    from agent_learning.pipeline import score_message

    try:
        outcome = score_message(body, scorer_of(rt), delivery_count=delivery_count)
    except Exception:
        scoring_failed(delivery_count, rt.settings.queue_max_deliveries)  # the host retries it
        raise
    settle_score(outcome, HostSettles("score", message_id, delivery_count), delivery_count,
                 rt.settings.queue_max_deliveries)
    return outcome.status


TRAIN_LOG_LEVELS = {
    "invalid_policy": logging.ERROR,
    "failed": logging.ERROR,
    "unavailable": logging.WARNING,
    "held": logging.WARNING,
}
"""How loud each training outcome is logged (anything else: INFO)."""


def train(rt: Runtime) -> TrainingPlan:
    """Timer trigger: learn the Personalizer events whose reward wait is over
    (:func:`agent_learning.app.personalizer.sweep.sweep_events`) and apply feedback left unapplied
    (:func:`agent_learning.rewards.feedback.sweep`; the failure of either is logged and does not
    stop training), then send one training message per agent
    with new scores (:func:`agent_learning.pipeline.plan_training`)."""
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.personalizer.events import clock_of
    from agent_learning.app.personalizer.sweep import sweep_events
    from agent_learning.pipeline import plan_training, send_plan
    from agent_learning.rewards.feedback import sweep

    try:
        sweep_events(rt.store, clock_of(rt))
    except Exception:
        log.exception("Personalizer event sweep failed; the next tick tries again")
    try:
        sweep(rt.store)
    except Exception:
        log.exception("feedback sweep failed; the next tick tries again")
    plan = plan_training(rt.store)
    sent = send_plan(plan, rt.send_train)
    log.info(
        "train: %d agents, %d with new scores (%d messages sent), %d idle, %d pinned, %d invalid or not checked",
        plan.agents, len(plan.requests), sent, len(plan.idle), len(plan.pinned), len(plan.failed),
    )
    for o in plan.failed:
        log.log(TRAIN_LOG_LEVELS.get(o.status, logging.INFO), "train %s: %s: %s", o.agent_id, o.status, o.reason)
    return plan


def train_agent(body: bytes | str, delivery_count: int, message_id: str | None, rt: Runtime) -> TrainOutcome:
    """Service Bus trigger on the training queue: one training run of the agent the message names."""
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.wiring import drift_config, guardrail_config
    from agent_learning.pipeline import train_requested

    s = rt.settings
    o = deliver_training(
        body,
        lambda b: train_requested(b, rt.store, learner_of(rt), max_batch=s.train_max_batch, min_batch=s.train_min_batch,
                                  drift=drift_config(s), guardrail=guardrail_config(s)),
        HostSettles("train_agent", message_id, delivery_count),
    )
    assert o is not None  # a body that is not a training request raised PoisonMessage
    level = TRAIN_LOG_LEVELS.get(o.status, logging.INFO)
    detail = f" v{o.version}" if o.status == "published" else f": {o.reason}" if level > logging.INFO else ""
    log.log(level, "train %s: %s%s", o.agent_id, o.status, detail)
    return o


@dataclass(frozen=True)
class HttpAnswer:
    """A plain HTTP answer, turned into ``func.HttpResponse`` by the app."""

    status: int
    body: str = ""
    headers: Mapping[str, str] | None = None


RETRY_AFTER_SECONDS = 5
"""The ``Retry-After`` of every 503 an HTTP route answers: the store throttled or unreachable, or
the current policy invalid (until a training run or ``agent-learn policy rollback`` replaces it)."""


def _unavailable(error: str) -> HttpAnswer:
    """A 503 with ``error`` and ``Retry-After``."""
    headers = {"Content-Type": "application/json", "Retry-After": str(RETRY_AFTER_SECONDS)}
    return HttpAnswer(503, json.dumps({"error": error}), headers)


def _unavailable_is_503(route: Callable[..., HttpAnswer]) -> Callable[..., HttpAnswer]:
    """An HTTP route that answers 503 with ``Retry-After`` for a :class:`TransientError` (the store
    throttled, failing or unreachable), which would otherwise reach the host as a 500."""

    @functools.wraps(route)
    def answer(*args: Any, **kwargs: Any) -> HttpAnswer:
        try:
            return route(*args, **kwargs)
        except TransientError as exc:
            log.warning("%s: answered 503: %s", route.__name__, exc)  # the store's answer stays in the log
            return _unavailable(f"the store is throttled or unreachable; retry in {RETRY_AFTER_SECONDS} s")

    return answer


@_unavailable_is_503
def get_policy(agent_id: str, if_none_match: str | None, rt: Runtime) -> HttpAnswer:
    """HTTP GET ``/api/policies/{agent_id}``: the agent's current policy document (ETag-aware);
    404 for an agent without a policy, 503 with ``Retry-After`` naming the problem when the
    document is invalid."""
    # lazy: pydantic (see the module docstring)
    from agent_learning.documents import agent_id_problem, stored_policy
    from agent_learning.store.base import NotModified

    if problem := agent_id_problem(agent_id):
        return _json_answer(400, {"error": f"agent_id: {problem}"})
    cached = _if_none_match(if_none_match)
    # Cosmos ETags carry their quotes; a conditional read of the one cached tag saves the transfer
    # there, and the comparison below answers 304 on stores whose ETags do not, for "*" and for lists.
    only = next(iter(cached)) if isinstance(cached, frozenset) and len(cached) == 1 else None
    tagged = rt.store.get_current_policy_if_changed(agent_id, f'"{only}"' if only else None)
    if tagged is None:
        return _json_answer(404, {"error": f"agent {agent_id!r} has no policy"})
    if isinstance(tagged, NotModified):  # the one tag asked about is the current one
        return HttpAnswer(304, "", {"ETag": f'"{only}"'})
    etag = tagged.etag.strip('"')
    if cached == ANY_TAG or (cached and etag in cached):
        return HttpAnswer(304, "", {"ETag": f'"{etag}"'})
    doc = {k: v for k, v in tagged.doc.items() if not k.startswith("_")}
    try:
        stored_policy(doc)
    except StoredDocumentInvalid as exc:  # never hand agents a corrupt policy; they keep their last good one
        return _invalid_policy(agent_id, exc)
    return HttpAnswer(
        200, json.dumps(doc), {"ETag": f'"{etag}"', "Content-Type": "application/json", "Cache-Control": "no-cache"}
    )


ANY_TAG = "*"
"""``If-None-Match: *``: any current document (RFC 9110 §13.1.2), so an existing policy answers 304."""


def _if_none_match(header: str | None) -> frozenset[str] | str | None:
    """The opaque tags an ``If-None-Match`` header lists (``"x"`` or ``W/"x"``: the comparison is
    weak), or :data:`ANY_TAG`; ``None`` for anything else (absent, empty, malformed), which
    means no cached copy: the client gets the document."""
    text = (header or "").strip(" \t")
    if text == ANY_TAG:
        return ANY_TAG
    if not _TAG_LIST.fullmatch(text):
        return None
    return frozenset(_ENTITY_TAG.findall(text)) - {""} or None


_ENTITY_TAG = re.compile(r'(?:W/)?"([\x21\x23-\x7e]*)"')
"""One entity tag (RFC 9110): visible ASCII other than the quote, between quotes."""
_TAG_LIST = re.compile(rf"[ \t,]*{_ENTITY_TAG.pattern}(?:[ \t]*,[ \t,]*{_ENTITY_TAG.pattern})*[ \t,]*")
"""Entity tags separated by commas (empty list elements are allowed, as RFC 9110 §5.6.1 says)."""


MAX_FEEDBACK_BYTES = 16_384
FEEDBACK_FIELDS = ("thumb", "score", "comment")
FEEDBACK_VALUES = {"thumb": "'up' or 'down'", "score": "a number from 0 to 1"}
"""The verdict fields and what each holds (a null one, when it is the only verdict, is named)."""


@_unavailable_is_503
def post_feedback(episode_id: str, body: bytes, caller: Caller, rt: Runtime) -> HttpAnswer:
    """HTTP POST ``/api/episodes/{episode_id}/feedback``: a user's verdict on an episode.

    Body: ``{"thumb": "up"|"down"}`` or ``{"score": 0.0-1.0}``, with an optional ``comment``.
    The feedback's source is the ``caller`` (:func:`agent_learning.app.callers.identify`: its Entra
    ID principal or its function key), never the body, so nobody can overwrite another
    caller's verdict: one feedback per caller and episode, and a caller posting again replaces
    its own. Answers 200 with what changed
    (``status`` ``corrected`` or ``unchanged``, with ``reward`` and ``reward_delta``; ``rejected``,
    with the ``problem``, when the episode's stored score is invalid: the feedback is kept,
    training skips the episode), 202 when the episode is not scored yet (its scorer applies the
    feedback; ``reward`` and ``reward_delta`` are null until then, as for ``rejected``), 400 naming the bad
    field (a ``source`` field included), 404 for an unknown episode, 409 for a new source beyond
    :data:`~agent_learning.rewards.feedback.MAX_FEEDBACK_SOURCES` or an episode whose stored document has
    no valid agent id (written around the validation; nothing is stored), 413 for a body over 16 KiB.
    """
    # lazy: pydantic (see the module docstring)
    from agent_learning.documents import episode_id_problem, parse_json
    from agent_learning.rewards.feedback import record_feedback

    if problem := episode_id_problem(episode_id):
        return _json_answer(400, {"error": f"episode_id: {problem}"})
    if len(body) > MAX_FEEDBACK_BYTES:
        return _json_answer(413, {"error": f"body: {len(body)} bytes; the limit is {MAX_FEEDBACK_BYTES}"})
    try:
        data = parse_json(body or b"null", unique_names=True)
    except ValueError as exc:
        return _json_answer(400, {"error": f"body: {exc}"})
    if not isinstance(data, dict):
        return _json_answer(400, {"error": "body: must be a JSON object with thumb or score"})
    if "source" in data:
        return _json_answer(
            400,
            {
                "error": "source: is not accepted; the source of feedback is the caller "
                "(its Entra ID principal or function key), not the body"
            },
        )
    unknown = sorted(set(data) - set(FEEDBACK_FIELDS))
    if unknown:
        return _json_answer(400, {"error": f"{unknown[0]}: unknown field (known: {', '.join(FEEDBACK_FIELDS)})"})
    if not isinstance(data.get("comment", ""), str):
        return _json_answer(400, {"error": "comment: must be a string"})
    if data.get("thumb") is None and data.get("score") is None:
        for name, rule in FEEDBACK_VALUES.items():
            if name in data:
                return _json_answer(400, {"error": f"{name}: must be {rule}, got null"})
    try:
        result = record_feedback(
            rt.store,
            episode_id,
            thumb=data.get("thumb"),
            score=data.get("score"),
            source=caller.id,
            comment=data.get("comment", ""),
        )
    except StoredDocumentInvalid as exc:  # the stored episode's fault, not the request's
        return _json_answer(409, {"error": f"episode_id: {exc}; it takes no feedback"})
    except InvalidDocument as exc:
        return _json_answer(400, {"error": str(exc).removeprefix("invalid feedback: ")})
    except NotFound as exc:
        return _json_answer(404, {"error": str(exc)})
    except LimitExceeded as exc:
        return _json_answer(409, {"error": str(exc)})
    answer = result.to_dict()
    return _json_answer(202 if answer["status"] == "waiting" else 200, answer)


MAX_CHOOSE_BYTES = 16_384
"""The largest body of a choose request (a context of 20 features is well under 4 KiB)."""


@_unavailable_is_503
def choose(agent_id: str, body: bytes, rt: Runtime) -> HttpAnswer:
    """HTTP POST ``/api/agents/{agent_id}/choose``: a configuration drawn from the agent's policy.

    Body: ``{}`` or ``{"context": {...}}`` (the request's features, as ``choose(context=...)``
    takes them). Answers 200 with ``action_id``, ``config``, ``probability``, ``logprob``,
    ``policy_version``, ``context`` (null without features, ``{}`` included), ``incarnation``
    (null for an agent created before incarnations) and a fresh ``episode_id`` for the episode
    the caller then writes (``POST /api/agents/{agent_id}/episodes`` or the ``episodes``
    container), with these values (``incarnation`` left out when null); 400 naming the bad field, 404 for an agent
    without a policy, 413 over 16 KiB, 503 with ``Retry-After`` when the current policy cannot be
    read (the store, or an invalid document) and none was read before.
    """
    # lazy: pydantic (see the module docstring)
    import uuid

    from agent_learning.agent.client import PolicyClient
    from agent_learning.documents import agent_id_problem, parse_json

    if problem := agent_id_problem(agent_id):
        return _json_answer(400, {"error": f"agent_id: {problem}"})
    if len(body) > MAX_CHOOSE_BYTES:
        return _json_answer(413, {"error": f"body: {len(body)} bytes; the limit is {MAX_CHOOSE_BYTES}"})
    try:
        data = parse_json(body or b"{}", unique_names=True)
    except ValueError as exc:
        return _json_answer(400, {"error": f"body: {exc}"})
    if not isinstance(data, dict):
        return _json_answer(400, {"error": 'body: must be a JSON object, {} or {"context": {...}}'})
    unknown = sorted(set(data) - {"context"})
    if unknown:
        return _json_answer(400, {"error": f"{unknown[0]}: unknown field (known: context)"})
    client = rt.clients.get(agent_id)
    if client is None:
        client = rt.clients.setdefault(
            agent_id, PolicyClient(rt.store, agent_id, refresh_seconds=rt.settings.policy_refresh_seconds)
        )
    try:
        decision = client.choose(context=data.get("context"))
    except StoredDocumentInvalid as exc:  # the stored policy's fault, not the request's
        return _invalid_policy(agent_id, exc)
    except InvalidDocument as exc:  # the request's context
        return _json_answer(400, {"error": str(exc).removeprefix("invalid context: ")})
    except NotFound:
        rt.clients.pop(agent_id, None)
        return _json_answer(404, {"error": f"agent {agent_id!r} has no policy"})
    return _json_answer(
        200,
        {
            "agent_id": agent_id,
            "action_id": decision.action_id,
            "config": dict(decision.config),
            "probability": decision.probability,
            "logprob": decision.logprob,
            "policy_version": decision.version,
            "context": decision.context,
            "incarnation": decision.incarnation,
            "episode_id": uuid.uuid4().hex,
        },
    )


@_unavailable_is_503
def post_episode(agent_id: str, body: bytes, caller: Caller, rt: Runtime) -> HttpAnswer:
    """HTTP POST ``/api/agents/{agent_id}/episodes``: an agent's episode, written for a caller
    that ``AGENT_LEARNING_EPISODE_WRITERS`` allows to write ``agent_id``.

    Body: the episode document (``Episode.to_json()``), whose ``agent_id`` must be the path's,
    and whose ``policy_version`` and ``action_id`` the agent's policy must have (the scorer's
    rule, :func:`~agent_learning.pipeline.score.policy_problem`; an invalid policy document is
    left to the scorer). Answers 201 when written, 200 when the same episode is already stored
    (a retry), 400 naming the bad field, 403 when the caller may not write this agent, 404 when
    the setting is empty (ingestion is off) or the agent has no policy (a deleted agent's once
    ``AGENT_LEARNING_POLICY_REFRESH_SECONDS`` has passed: :data:`CACHED_POLICY_VERSIONS`), 409 when the id holds a
    different episode (whichever agent's: its content is not revealed), 413 for a body or an
    episode over ``MAX_EPISODE_BYTES`` (the episode measured as
    :func:`~agent_learning.documents.json_bytes` does, non-ASCII characters escaped), 503 with
    ``Retry-After`` while the store is throttled or unreachable.
    """
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.ingestion import may_write
    from agent_learning.core.errors import DocumentTooLarge
    from agent_learning.documents import MAX_EPISODE_BYTES, Episode, agent_id_problem, parse_json
    from agent_learning.pipeline.score import policy_problem
    from agent_learning.store.base import same_document

    writers = rt.settings.episode_writers
    if not writers:
        return _json_answer(404, {"error": "episode ingestion is off: AGENT_LEARNING_EPISODE_WRITERS is empty"})
    if problem := agent_id_problem(agent_id):
        return _json_answer(400, {"error": f"agent_id: {problem}"})
    if not may_write(writers, caller.id, agent_id):
        log.warning("ingest: %s may not write episodes of %s", caller.id, agent_id)
        refused = f"caller {caller.id} may not write episodes of agent {agent_id!r} (AGENT_LEARNING_EPISODE_WRITERS)"
        return _json_answer(403, {"error": refused})
    if len(body) > MAX_EPISODE_BYTES:
        return _json_answer(413, {"error": f"body: {len(body):,} bytes; the limit is {MAX_EPISODE_BYTES:,}"})
    try:
        data = parse_json(body, unique_names=True)
    except ValueError as exc:
        return _json_answer(400, {"error": f"body: {exc}"})
    if not isinstance(data, dict):
        return _json_answer(400, {"error": "body: must be a JSON object, the episode document"})
    try:
        episode = Episode.from_dict(data)
    except InvalidDocument as exc:  # over MAX_EPISODE_BYTES as the document measures it: 413
        status = 413 if isinstance(exc, DocumentTooLarge) else 400
        return _json_answer(status, {"error": str(exc).removeprefix("invalid episode: ")})
    if episode.agent_id != agent_id:
        mismatch = f"agent_id: the episode's {episode.agent_id!r} is not the path's {agent_id!r}"
        return _json_answer(400, {"error": mismatch})
    try:
        unscorable = policy_problem(episode, policy_versions_of(rt))
    except InvalidDocument:  # the policy's problem, not the episode's: the scorer reports it
        unscorable = None
    if unscorable is not None:
        if rt.store.get_current_policy(agent_id) is None:
            return _json_answer(404, {"error": f"agent {agent_id!r} has no policy"})
        return _json_answer(400, {"error": unscorable[1].removeprefix("invalid episode: ")})
    conflict = _json_answer(409, {"error": f"id: episode {episode.id!r} already exists with different content"})
    existing = rt.store.get_episode(episode.id)
    if existing is not None and same_document(existing, episode.to_dict()):
        return _json_answer(200, {"id": episode.id, "status": "exists"})
    if existing is not None:
        return conflict
    try:
        rt.store.add_episode(episode)
    except ConcurrencyConflict:
        return conflict
    return _json_answer(201, {"id": episode.id, "status": "created"})


def _invalid_policy(agent_id: str, exc: StoredDocumentInvalid) -> HttpAnswer:
    """The 503 of a route that finds the agent's current policy document invalid (logged as an error)."""
    log.error("policy %s: the current document is invalid and is not served: %s", agent_id, exc)
    return _unavailable(f"the current policy of {agent_id!r} is invalid: {exc}")


def _json_answer(status: int, body: Mapping[str, Any]) -> HttpAnswer:
    return HttpAnswer(status, json.dumps(body), {"Content-Type": "application/json"})


def _as_dict(document: Any) -> Any:
    """A Cosmos trigger document (``func.Document``) as a plain dict; anything else unchanged."""
    to_json = getattr(document, "to_json", None)
    if callable(to_json):
        try:
            return json.loads(to_json())
        except (TypeError, ValueError):
            return document
    return document
