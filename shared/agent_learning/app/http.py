"""The app's HTTP routes in one table, for every host: the Functions app declares one function per
route (``function_app.py``), and a local server can serve them all; each calls :func:`dispatch`
with a plain :class:`Request`, so the same handler answers wherever it runs.

A route's handler takes the request and the :class:`~agent_learning.app.handlers.Runtime` and
returns a :class:`~agent_learning.app.handlers.HttpAnswer`. Routes are relative to ``/api/``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from agent_learning.app import dashboard, handlers, personalizer
from agent_learning.app.callers import Caller, admit, identify
from agent_learning.app.handlers import HttpAnswer, Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """An HTTP request as every host hands it over."""

    method: str
    params: Mapping[str, str] = field(default_factory=dict)
    """The route's parameters (``{"agent_id": "support-bot"}``)."""
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """A header's value, whatever the case of its name."""
        wanted = name.lower()
        return next((str(v) for k, v in self.headers.items() if str(k).lower() == wanted), None)

    def caller(self, rt: Runtime) -> Caller:
        """Who sent the request: the principal header counts only where the settings trust it."""
        return identify(self.headers, self.query, trust_principal=rt.settings.trust_principal_header)


@dataclass(frozen=True)
class Route:
    """One route: its function name in the Functions app, methods, template and handler."""

    name: str
    methods: tuple[str, ...]
    template: str
    """Relative to ``/api/``, with ``{name}`` parameters (``agents/{agent_id}/choose``)."""
    handle: Callable[[Request, Runtime], HttpAnswer]
    own_keys: bool = False
    """The route's clients send credentials the Functions host does not read (Personalizer's
    ``Ocp-Apim-Subscription-Key`` or an Entra ID token): the host serves it anonymously and the
    route admits callers itself (:func:`dispatch`, :func:`agent_learning.app.callers.admit`)."""


ROUTES: tuple[Route, ...] = (
    Route("policy", ("GET",), "policies/{agent_id}",
          lambda r, rt: handlers.get_policy(r.params.get("agent_id", ""), r.header("If-None-Match"), rt)),
    Route("feedback", ("POST",), "episodes/{episode_id}/feedback",
          lambda r, rt: handlers.post_feedback(r.params.get("episode_id", ""), r.body, r.caller(rt), rt)),
    Route("ingest", ("POST",), "agents/{agent_id}/episodes",
          lambda r, rt: handlers.post_episode(r.params.get("agent_id", ""), r.body, r.caller(rt), rt)),
    Route("choose", ("POST",), "agents/{agent_id}/choose",
          lambda r, rt: handlers.choose(r.params.get("agent_id", ""), r.body, rt)),
    Route("dashboard", ("GET",), "dashboard", lambda r, rt: dashboard.overview(r.query, rt)),
    Route("dashboard_agent", ("GET",), "dashboard/agents/{agent_id}",
          lambda r, rt: dashboard.agent(r.params.get("agent_id", ""), r.query, rt)),
    *(Route(*spec) for spec in personalizer.ROUTES),
)
"""Every HTTP route of the app (the Personalizer API's: :mod:`agent_learning.app.personalizer`)."""

BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}


def dispatch(name: str, request: Request, rt: Runtime, *, keys_checked: bool = True) -> HttpAnswer:
    """The answer of route ``name`` to ``request``. ``keys_checked=False`` says the host let the
    request through without a key check (the Functions host, for a route with ``own_keys``): such
    a route then admits only the callers the settings name, and answers the others 401 or 403."""
    route = BY_NAME[name]
    if route.own_keys and not keys_checked:
        refusal = admit(request.headers, request.query, key_digests=rt.settings.personalizer_key_sha256,
                        principals=rt.settings.personalizer_principals,
                        trust_principal=rt.settings.trust_principal_header)
        if refusal is not None:
            log.info("%s: refused a caller (%d %s)", name, refusal.status, refusal.code)
            return personalizer.error(refusal.status, refusal.code, refusal.message)
    return route.handle(request, rt)
