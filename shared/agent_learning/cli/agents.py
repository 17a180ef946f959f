"""``agent-learn agent``: list and delete agents."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from agent_learning.cli.access import _current, _store, _where
from agent_learning.cli.options import agent_option, db_option, json_option
from agent_learning.cli.output import _echo_json, _iso, _n, _say_left_out, _with_notes, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument


@main.group()
def agent() -> None:
    """List and delete agents."""


@agent.command("list")
@json_option
@db_option
@_handle_errors
def agent_list(as_json: bool, db: str | None) -> None:
    """Every agent with a policy, its current version and whether learning is paused.

    Exits with 1 if an agent's policy document is invalid (it is named, and the others are listed)."""
    docs, invalid = [], []
    with _store(db) as (store, settings):
        for agent_id in store.list_agents():
            try:
                docs.append(_current(store, settings, agent_id))
            except InvalidDocument as exc:
                invalid.append(agent_id)
                _say_left_out(_with_notes(exc), agent_id)
    # a structured policy's actions are its dimensions' values: the dimensions say how they combine
    rows = [{"agent_id": d.agent_id, "version": d.version, "actions": len(d.actions),
             "dimensions": {x.name: x.size for x in d.dimensions or []} or None, "pinned": d.pinned,
             "created_at": _iso(d.created_at)} for d in docs]
    if as_json:
        _echo_json(rows)
        sys.exit(1 if invalid else 0)
    if not rows and not invalid:
        out.print(f"no agent has a policy in {_where(settings, how=True)} (agent-learn init-policy)")
        return
    table = Table(title=f"{_n(len(rows), 'agent')} in {_where(settings)}", title_justify="left")
    for col in ("agent", "version", "actions", "pinned", "version created"):
        table.add_column(col, justify="right" if col in ("version", "actions") else "left")
    for r in rows:
        actions = str(r["actions"]) + (f" values in {_n(len(r['dimensions']), 'dimension')}" if r["dimensions"] else "")
        table.add_row(r["agent_id"], str(r["version"]), actions, "yes" if r["pinned"] else "", r["created_at"][:19])
    out.print(table)
    if invalid:
        sys.exit(1)


@agent.command("delete")
@agent_option
@click.option("--yes", is_flag=True, help="Delete without asking.")
@json_option
@db_option
@_handle_errors
def agent_delete(agent_id: str, yes: bool, as_json: bool, db: str | None) -> None:
    """Delete an agent and everything it has: policy versions, runs, episodes, scores, feedback.

    An agent whose policy is gone but whose documents are not (a delete that was interrupted, an
    episode written while it ran) is deleted too, as is one whose policy document is invalid."""
    with _store(db) as (store, settings):
        # Read unvalidated: an agent with a corrupt policy document can still be deleted.
        if store.get_current_policy(agent_id) is None and not (
            store.list_episodes(agent_id, 1) or store.list_runs(agent_id, 1)
        ):
            _current(store, settings, agent_id)  # nothing of it at all: says which agents there are
        if not yes:
            if not sys.stdin.isatty():
                raise ValueError(f"--yes: deleting {agent_id!r} cannot be undone; pass --yes to confirm")
            click.confirm(f"delete {agent_id} and all its episodes, scores, runs and versions from "
                          f"{_where(settings)}?", abort=True, err=True)
        deleted = store.delete_agent(agent_id)
    if as_json:
        _echo_json({"agent_id": agent_id, "deleted": deleted})
        return
    out.print(f"deleted {agent_id}: " + ", ".join(f"{n} {DELETED_KINDS.get(k, k)}" for k, n in deleted.items()))


DELETED_KINDS = {
    "policies": "policy documents (versions and the current one)",
    "scores": "score documents (with feedback ledgers and unjudged records)",
}
"""How `agent delete` names the counts :meth:`~agent_learning.store.base.Store.delete_agent`
returns (its keys stay as they are in ``--json``): they count documents, not versions or scores."""
