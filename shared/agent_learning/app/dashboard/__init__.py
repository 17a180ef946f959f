"""The operators' dashboard: a read-only HTML page of every agent, and one page per agent.

Two routes of :mod:`agent_learning.app.http` answer it, on the Functions app (behind its function
key) and on ``agent-learn serve``:

    GET /api/dashboard                     every agent at a glance, and the queues
    GET /api/dashboard/agents/{agent_id}   one agent's learning, shareable by its URL

:mod:`~agent_learning.app.dashboard.data` gathers what a page shows from the store and the queues,
:mod:`~agent_learning.app.dashboard.render` turns it into HTML with inline SVG charts
(:mod:`~agent_learning.app.dashboard.svg`): no script, nothing fetched from the network, every
stored string escaped. ``?page=N`` turns the pages of a long table. docs/dashboard.md says what
each part shows.

Importing this package imports neither pydantic nor numpy (the Functions app's start-up, as
:mod:`agent_learning.app.handlers`): the routes import what gathers and renders a page when called.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from agent_learning.app.handlers import HttpAnswer, Runtime, _unavailable_is_503

if TYPE_CHECKING:
    from agent_learning.queue.base import WorkQueue

HTML = {"Content-Type": "text/html", "Cache-Control": "no-store"}
"""The headers of a page (UTF-8: both hosts add the charset to a text type)."""


def page_number(query: Mapping[str, str]) -> int | HttpAnswer:
    """The ``page`` query parameter (1 when absent), or a 400 naming it."""
    raw = query.get("page", "1")
    if not raw.isdigit() or int(raw) < 1:
        return HttpAnswer(400, json.dumps({"error": f"page: {raw!r} is not a page number (1, 2, ...)"}),
                          {"Content-Type": "application/json"})
    return int(raw)


def queues(rt: Runtime) -> list[WorkQueue]:
    """The scoring and the training queue of the runtime's parts (none on a runtime without parts)."""
    return [rt.parts.queue, rt.parts.train_queue] if rt.parts is not None else []


@_unavailable_is_503
def overview(query: Mapping[str, str], rt: Runtime) -> HttpAnswer:
    """The page of every agent."""
    number = page_number(query)
    if isinstance(number, HttpAnswer):
        return number
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.dashboard import data, render
    from agent_learning.judges.sampling import JudgingRules

    now = datetime.now(UTC)
    found = data.overview(rt.store, JudgingRules.parse(rt.settings.judging), queues(rt), now)
    links = render.Links("", query.get("code"))
    return HttpAnswer(200, render.overview_html(found, links, number, now), HTML)


@_unavailable_is_503
def agent(agent_id: str, query: Mapping[str, str], rt: Runtime) -> HttpAnswer:
    """The page of one agent; 404 (a page saying so) for an agent without a current policy."""
    number = page_number(query)
    if isinstance(number, HttpAnswer):
        return number
    # lazy: pydantic (see the module docstring)
    from agent_learning.app.dashboard import data, render
    from agent_learning.judges.sampling import JudgingRules

    links = render.Links("../../", query.get("code"))
    now = datetime.now(UTC)
    found = data.agent_page(rt.store, agent_id, JudgingRules.parse(rt.settings.judging), rt.settings.drift_config())
    if found is None:
        return HttpAnswer(404, render.not_found_html(agent_id, links), HTML)
    return HttpAnswer(200, render.agent_html(found, links, number, now), HTML)
