"""``agent-learn policy history``: every version of an agent's policy."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from agent_learning.cli.access import _current_or_said, _store
from agent_learning.cli.options import (
    COUNT,
    _no_versions_in,
    _utc_window,
    agent_option,
    db_option,
    json_option,
    version_window_options,
)
from agent_learning.cli.output import _echo_json, _fmt, _iso, _left_out, _n, out
from agent_learning.cli.policy import policy
from agent_learning.cli.root import _handle_errors


def _history_rows(h: Any) -> list[dict[str, Any]]:
    rows = []
    for i, doc in enumerate(h.documents):
        rows.append(
            {
                "version": doc.version,
                "source": doc.source,
                "parent_version": doc.parent_version,
                "created_at": _iso(doc.created_at),
                "probabilities": {a: round(p, 6) for a, p in zip(h.action_ids, h.probabilities[i], strict=True)
                                  if p is not None},
                "mean_reward": h.mean_reward[i],
                "entropy": h.entropy[i],
                "run": doc.run.id if doc.run else None,
                "episodes": doc.run.episodes if doc.run else None,
                "note": doc.note,
            }
        )
        segments = {  # a structured policy: "probabilities" is with no context; per learned segment here
            name: {a: round(p, 6) for a, p in series[i].items()}
            for name, series in h.segments.items()
            if series[i] is not None
        }
        if segments:
            rows[-1]["segments"] = segments
        if doc.run and doc.run.evaluation:  # the publish guardrail's estimate and verdict
            ev = doc.run.evaluation
            rows[-1]["guardrail"] = {"verdict": ev.verdict, "estimate": ev.candidate.model_dump() if ev.candidate
                                     else None, "difference": ev.difference.model_dump() if ev.difference else None}
    return rows


@policy.command("history")
@agent_option
@click.option("--limit", type=COUNT, default=None,
              help="Only the newest N versions (of those in --since/--until, if given).")
@version_window_options
@json_option
@db_option
@_handle_errors
def policy_history(agent_id: str, limit: int | None, since: datetime | None, until: datetime | None,
                   as_json: bool, db: str | None) -> None:
    """Every version: its probabilities, the mean reward and the run that produced it.

    Exits with 1 if a version document or the current one is invalid (it is named, and the
    versions are listed)."""
    from agent_learning.ops.history import history, source_label
    since, until = _utc_window(since, until)
    windowed = since is not None or until is not None
    with _store(db) as (store, settings):
        current = _current_or_said(store, settings, agent_id)  # the versions are what a rollback chooses from
        versions = history(store, agent_id, newest=limit, since=since, until=until)
        rows = _history_rows(versions)
        invalid = _left_out([versions]) or current is None
        shown = _versions_read(store, agent_id, current, len(rows), limit, windowed, invalid)
    if windowed and not rows and not invalid:
        raise _no_versions_in([agent_id])
    if as_json:
        _echo_json(rows)
        sys.exit(1 if invalid else 0)
    table = Table(title=f"{agent_id}: {shown}", title_justify="left")
    table.add_column("version", justify="right")
    table.add_column("source")
    actions = list(dict.fromkeys(a for r in rows for a in r["probabilities"]))
    for a in actions:
        table.add_column(a, justify="right")
    for col in ("reward", "entropy", "run", "episodes"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=col == "run")
    for r in rows:
        table.add_row(
            str(r["version"]),
            source_label(r["source"], r["parent_version"]),
            *(_fmt(r["probabilities"].get(a)) or "—" for a in actions),
            _fmt(r["mean_reward"]),
            _fmt(r["entropy"]),
            r["run"].removeprefix(f"{agent_id}:") if r["run"] else "",
            "" if r["episodes"] is None else str(r["episodes"]),
        )
    out.print(table)
    if any("segments" in r for r in rows):  # a contextual policy: agents draw from their segment's probabilities
        out.print("probabilities and entropy (nats): with no context, what a request without features gets "
                  "(--json has each learned segment); reward: mean reward of the run's batch")
    else:
        out.print("reward: mean reward of the run's batch; entropy: of the policy agents draw from (nats)")
    if invalid:
        sys.exit(1)


def _versions_read(store: Any, agent_id: str, current: Any, read: int, newest: int | None, windowed: bool,
                   invalid: bool, verb: str = "shown") -> str:
    """How many versions the agent has, and which ``read`` of them a command shows: ``14 policy
    versions`` or ``14 policy versions, the newest 4 shown`` (``newest``: ``--limit``/``--last``;
    ``windowed``: ``--since``/``--until``; ``invalid``: a version or the current document was left
    out). Versions run from 1 to the current one (``agent-learn audit`` checks it), so counting
    them reads no version; an invalid current document's number is that of the newest version record."""
    if newest or windowed or invalid:
        last = current.version if current else next(
            (n for d in store.list_policy_versions(agent_id, 1) if type(n := d.get("version")) is int), 0)
        total = max(last, read)
    else:
        total = read
    which = (("the newest " if newest else "the ") + str(read) + (" valid" if invalid else "")
             + (" created in the window" if windowed else ""))
    return _n(total, "policy version") + (f", {which} {verb}" if read < total else "")
