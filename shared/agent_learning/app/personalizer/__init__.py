"""The Azure AI Personalizer REST API (``2022-09-01-preview``), per agent: an agent's Personalizer
endpoint is ``<app>/api/agents/{agent_id}``, so the ``azure-ai-personalizer`` client given it
calls ``agents/{agent_id}/personalizer/rank`` and the rest of :data:`ROUTES`.

Each route answers as Personalizer does: its success status (201 for a rank, 204 for a reward or
an activation, 200 otherwise) and errors as ``{"error": {"code", "message"}}`` with the message
naming the field; 503 with ``Retry-After`` while the store is throttled or unreachable. What an
event, a reward and the service configuration are here: :mod:`.events` and :mod:`.config`; the
model, the policy configuration and the logs: :mod:`.admin`; evaluations: :mod:`.evaluations`;
what LoggingOnly and Apprentice do beyond serving: :mod:`.modes`.

:mod:`agent_learning.app.http` adds :data:`ROUTES` to the app's route table. Importing this
module imports neither pydantic nor numpy (the Functions app's start-up); :func:`_part` does.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from agent_learning.app.handlers import RETRY_AFTER_SECONDS, HttpAnswer, Runtime
from agent_learning.app.personalizer.config import Problem
from agent_learning.core.errors import StoredDocumentInvalid, TransientError

if TYPE_CHECKING:
    from types import ModuleType

    from agent_learning.app.http import Request

log = logging.getLogger("agent_learning.app.personalizer")

API_VERSION = "2022-09-01-preview"
"""The Personalizer API version served (the ``api-version`` query parameter; absent is this one)."""
BASE = "agents/{agent_id}/personalizer"


class RouteSpec(NamedTuple):
    """A route as :class:`agent_learning.app.http.Route` takes it: name, methods, template, handler."""

    name: str
    methods: tuple[str, ...]
    template: str
    handle: Callable[[Request, Runtime], HttpAnswer]
    own_keys: bool = True
    """Personalizer's clients send keys the Functions host does not read: the app checks them."""


def _part(name: str = "events") -> ModuleType:
    """The module that does a route's work, imported on its first request."""
    # lazy: they import pydantic (the documents) and numpy (evaluations), which the app's cold start leaves out
    return importlib.import_module(f"agent_learning.app.personalizer.{name}")


def _answer(operation: Callable[[Request, Runtime, Any], Any], status: int) -> Callable[[Request, Runtime], HttpAnswer]:
    """A route handler: ``operation(request, rt, events)``'s result as JSON with ``status`` (no
    body for 204; an :class:`HttpAnswer` as it is), its :class:`Problem` as Personalizer's error,
    a store outage as 503."""

    def handle(request: Request, rt: Runtime) -> HttpAnswer:
        try:
            version = request.query.get("api-version", API_VERSION)
            if version != API_VERSION:
                raise Problem(400, "BadRequest", f"api-version: {version!r:.40} is not served; use {API_VERSION}")
            result = operation(request, rt, _part())
        except Problem as p:
            return error(p.status, p.code, p.message)
        except TransientError as exc:
            log.warning("personalizer: answered 503: %s", exc)
            return error(503, "ServiceUnavailable", f"the store is throttled or unreachable; retry in "
                         f"{RETRY_AFTER_SECONDS} s", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        except StoredDocumentInvalid as exc:
            log.error("personalizer: a stored document is invalid: %s", exc)
            return error(503, "InternalServerError", str(exc), {"Retry-After": str(RETRY_AFTER_SECONDS)})
        if isinstance(result, HttpAnswer):
            return result
        if status == 204:
            return HttpAnswer(204)
        return HttpAnswer(status, json.dumps(result), {"Content-Type": "application/json"})

    return handle


def error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> HttpAnswer:
    """Personalizer's error answer."""
    body = json.dumps({"error": {"code": code, "message": message}})
    return HttpAnswer(status, body, {"Content-Type": "application/json", **(headers or {})})


def _agent(r: Request) -> str:
    return r.params.get("agent_id", "")


def _event(r: Request) -> str:
    return r.params.get("event_id", "")


def _service_configuration(r: Request, rt: Runtime, ev: Any) -> Any:
    ev.check_agent(_agent(r))
    modes = _part("modes")
    if r.method.upper() == "PUT":
        config = ev.put_configuration(rt.store, _agent(r), r.body)
        modes.follow_mode(rt.store, _agent(r), config)
    else:
        config = ev.configuration(rt.store, _agent(r))
    return modes.with_apprentice_metrics(rt.store, _agent(r), config)


def _policy_configuration(r: Request, rt: Runtime, ev: Any) -> Any:
    admin, method = _part("admin"), r.method.upper()
    if method == "PUT":
        return admin.put_policy_configuration(rt, _agent(r), r.body)
    if method == "DELETE":
        return admin.reset_policy_configuration(rt, _agent(r))
    return admin.policy_configuration(rt, _agent(r))


def _evaluation(r: Request, rt: Runtime, ev: Any) -> Any:
    evaluations, method, evaluation_id = _part("evaluations"), r.method.upper(), r.params.get("evaluation_id", "")
    if method == "PUT":
        return evaluations.create(rt, _agent(r), evaluation_id, r.body)
    if method == "DELETE":
        return evaluations.delete(rt, _agent(r), evaluation_id) or HttpAnswer(204)
    return evaluations.get(rt, _agent(r), evaluation_id)


def _model(r: Request, rt: Runtime, ev: Any) -> Any:
    admin, method = _part("admin"), r.method.upper()
    if method == "PUT":
        return admin.import_model(rt, _agent(r), r.body) or HttpAnswer(204)
    if method == "DELETE":
        return admin.reset_model(rt, _agent(r)) or HttpAnswer(204)
    return admin.export_model(rt, _agent(r), r.query.get("signed"))


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("personalizer_rank", ("POST",), f"{BASE}/rank", _answer(
        lambda r, rt, ev: ev.rank(rt, _agent(r), r.body, multislot=False), 201)),
    RouteSpec("personalizer_reward", ("POST",), f"{BASE}/events/{{event_id}}/reward", _answer(
        lambda r, rt, ev: ev.reward(rt, _agent(r), _event(r), r.body, multislot=False), 204)),
    RouteSpec("personalizer_activate", ("POST",), f"{BASE}/events/{{event_id}}/activate", _answer(
        lambda r, rt, ev: ev.activate(rt, _agent(r), _event(r), multislot=False), 204)),
    RouteSpec("personalizer_multislot_rank", ("POST",), f"{BASE}/multislot/rank", _answer(
        lambda r, rt, ev: ev.rank(rt, _agent(r), r.body, multislot=True), 201)),
    RouteSpec("personalizer_multislot_reward", ("POST",), f"{BASE}/multislot/events/{{event_id}}/reward", _answer(
        lambda r, rt, ev: ev.reward(rt, _agent(r), _event(r), r.body, multislot=True), 204)),
    RouteSpec("personalizer_multislot_activate", ("POST",), f"{BASE}/multislot/events/{{event_id}}/activate",
              _answer(lambda r, rt, ev: ev.activate(rt, _agent(r), _event(r), multislot=True), 204)),
    RouteSpec("personalizer_service_configuration", ("GET", "PUT"), f"{BASE}/configurations/service",
              _answer(_service_configuration, 200)),
    RouteSpec("personalizer_policy_configuration", ("GET", "PUT", "DELETE"), f"{BASE}/configurations/policy",
              _answer(_policy_configuration, 200)),
    RouteSpec("personalizer_model", ("GET", "PUT", "DELETE"), f"{BASE}/model", _answer(_model, 200)),
    RouteSpec("personalizer_model_properties", ("GET",), f"{BASE}/model/properties", _answer(
        lambda r, rt, ev: _part("admin").model_properties(rt, _agent(r)), 200)),
    RouteSpec("personalizer_evaluations", ("GET",), f"{BASE}/evaluations", _answer(
        lambda r, rt, ev: _part("evaluations").listed(rt, _agent(r), r.query), 200)),
    RouteSpec("personalizer_evaluation", ("GET", "PUT", "DELETE"), f"{BASE}/evaluations/{{evaluation_id}}",
              _answer(_evaluation, 200)),
    RouteSpec("personalizer_log_properties", ("GET",), f"{BASE}/logs/properties", _answer(
        lambda r, rt, ev: _part("admin").log_properties(rt, _agent(r)), 200)),
    RouteSpec("personalizer_logs", ("DELETE",), f"{BASE}/logs", _answer(
        lambda r, rt, ev: _part("admin").delete_logs(rt, _agent(r)), 204)),
)
"""The Personalizer routes of an agent, relative to ``/api/``."""
