"""``agent-learn report``: charts of every policy version, as PNG and HTML."""

from __future__ import annotations

import sys
from datetime import datetime

import click

from agent_learning.cli.access import _current_or_said, _store, _where, _writable
from agent_learning.cli.history import _versions_read
from agent_learning.cli.options import (
    COUNT,
    _agent_id,
    _ending,
    _no_versions_in,
    _utc_window,
    db_option,
    json_option,
    version_window_options,
)
from agent_learning.cli.output import _echo_json, _left_out, _progress, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import ConfigurationError, NotFound


@main.command()
@click.option("--agent-id", "agent_ids", multiple=True, callback=_agent_id,
              help="Agents to chart (repeatable; default: every agent).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default="agent-learning-report.png",
              callback=_ending(".png"),
              show_default=True, help="Where to write the chart.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default="agent-learning-report.html",
              callback=_ending(".html", ".htm"),
              show_default=True, help="Where to write the page (the chart and a table of every version).")
@click.option("--title", default="agent-learning report", show_default=True, help="Title of the chart and page.")
@click.option("--last", type=COUNT, default=None, help="Only the newest N versions of each agent.")
@version_window_options
@click.option("--smooth", type=COUNT, default=None,
              help="Draw reward and entropy as means over N versions (default: none up to 100 versions, "
                   "then a fiftieth of them).")
@json_option
@db_option
@_handle_errors
def report(agent_ids: tuple[str, ...], png_path: str, html_path: str, title: str, last: int | None,
           since: datetime | None, until: datetime | None, smooth: int | None, as_json: bool, db: str | None
           ) -> None:
    """Charts of every policy version (PNG and a self-contained HTML page); rollbacks, revisions
    and a pin are marked.

    Exits with 1 if a version document or an agent's current one is invalid (it is named, and
    the versions are charted)."""
    from agent_learning.ops.history import history
    from agent_learning.ops.report import write_report
    since, until = _utc_window(since, until)
    _writable("--png", png_path)
    _writable("--html", html_path)
    with _store(db) as (store, settings):
        agents = list(dict.fromkeys(agent_ids)) or store.list_agents()  # each agent once, as given
        if not agents:
            raise NotFound(f"no agent has a policy in {_where(settings, how=True)}")
        # an invalid current document is said, and its versions are charted: a rollback chooses from them
        currents = {a: _current_or_said(store, settings, a) for a in agents}
        histories, headings = [], {}
        windowed = since is not None or until is not None
        with _progress("reading policy versions", as_json) as bar:
            task = bar.add_task("agents", total=len(agents))
            for agent_id in agents:
                h = history(store, agent_id, last, since=since, until=until)
                histories.append(h)
                headings[agent_id] = _versions_read(store, agent_id, currents[agent_id], len(h.versions), last,
                                                    windowed, bool(h.invalid) or currents[agent_id] is None,
                                                    "charted")
                bar.advance(task)
    invalid = _left_out(histories) or any(c is None for c in currents.values())
    empty = [h.agent_id for h in histories if not h.versions and not h.invalid]
    if empty:
        raise _no_versions_in(empty)
    histories = [h for h in histories if h.versions]  # an agent whose every version is invalid: said above
    if not histories:
        sys.exit(1)
    try:
        files = write_report(histories, png_path, html_path, title, smooth, headings)
    except RuntimeError as exc:  # matplotlib missing
        raise ConfigurationError(str(exc)) from None
    summary = {"png": str(files.png), "html": str(files.html),
               "agents": {h.agent_id: {"versions": len(h.versions), "series": files.series[h.agent_id]}
                          for h in histories}}
    if as_json:
        _echo_json(summary)
        sys.exit(1 if invalid else 0)
    for h in histories:
        out.print(f"{h.agent_id}: {headings[h.agent_id]}; series per chart (probabilities, reward, entropy) "
                  f"{files.series[h.agent_id]}")
    out.print(f"wrote {files.png} and {files.html}")
    if invalid:
        sys.exit(1)
