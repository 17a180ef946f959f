"""``agent-learn audit``: where every episode is, rebuilt from the store."""

from __future__ import annotations

import sys
from contextlib import suppress

import click
from rich.table import Table

from agent_learning.cli.access import _current, _queues, _store, _where
from agent_learning.cli.options import _agent_id, db_option, json_option
from agent_learning.cli.output import _echo_json, _n, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument

AUDIT_COLUMNS = (
    ("episodes", "episodes"),
    ("learned", "learned"),
    ("twice", "learned_twice"),
    ("lost", "lost"),
    ("pending", "pending"),
    ("unjudged", "unjudged"),
    ("dead-lettered", "dead_lettered"),
    ("feedback", "feedback_episodes"),
    ("unapplied", "feedback_unapplied"),
    ("versions", "versions"),
)


@main.command()
@click.option("--agent-id", default=None, callback=_agent_id,
              help="Audit one agent (default: every agent with a policy).")
@json_option
@db_option
@_handle_errors
def audit(agent_id: str | None, as_json: bool, db: str | None) -> None:
    """Where every episode is: learned once, learned twice, skipped, lost, pending, unjudged, dead-lettered or
    rejected.

    Rebuilt from the store (and the queue's dead letters); exits with 1 when an episode is lost
    or learned more than once, or the chain of versions and runs is broken."""
    from agent_learning.ops.audit import audit as run_audit
    with _store(db) as (store, settings), _queues(db) as (queues, _):
        if agent_id is not None:
            with suppress(InvalidDocument):  # a corrupt policy is a problem the audit reports
                _current(store, settings, agent_id)  # an unknown agent is bad input
        result = run_audit(store, queues[settings.queue_name], [agent_id] if agent_id else None,
                           train_queue=queues[settings.train_queue_name])
    if as_json:
        _echo_json(result.to_dict())
    else:
        table = Table(title=f"audit of {_where(settings)}", title_justify="left")
        table.add_column("agent")
        for title, _ in AUDIT_COLUMNS:
            table.add_column(title, justify="right")
        table.add_column("ok")
        for a in result.agents:
            row = a.to_dict()
            table.add_row(a.agent_id, *(str(row[key]) for _, key in AUDIT_COLUMNS), "yes" if a.ok else "NO")
        out.print(table)
        for a in result.agents:
            if a.pending:
                waiting = f"{a.pending_scoring} not scored yet, {a.pending_training} not learned yet"
                out.print(f"{a.agent_id}: pending {waiting}")
            if a.pending_corrections:
                out.print(f"{a.agent_id}: {_n(a.pending_corrections, 'feedback correction')} not learned yet "
                          "(the next tick learns them)")
            if a.unjudged_by_reason:
                reasons = ", ".join(f"{r} {n}" for r, n in a.unjudged_by_reason.items())
                out.print(f"{a.agent_id}: not judged (AGENT_LEARNING_JUDGING): {reasons}; neither lost nor pending, "
                          "learned once judged (agent-learn rescore --unjudged)")
            if a.dead_lettered_by_reason:
                reasons = ", ".join(f"{r} {n}" for r, n in a.dead_lettered_by_reason.items())
                out.print(f"{a.agent_id}: dead-lettered by reason: {reasons} (agent-learn dlq list)")
            if a.skipped:
                out.print(f"{a.agent_id}: {a.skipped} episodes skipped: the version their run trained lacked their "
                          "configuration (a revision removed or renamed it); not learned, not lost")
            if a.late:
                out.print(f"{a.agent_id}: {a.late} score rows landed after their run read the range (never learned)")
            if a.other_incarnation:
                out.print(f"{a.agent_id}: {a.other_incarnation} episodes of an earlier incarnation (the agent was "
                          "deleted and created again): dead-lettered or refused by training, never learned")
            if a.scores_without_episode or a.invalid_scores:
                out.print(f"{a.agent_id}: {a.scores_without_episode} scores whose episode expired, "
                          f"{a.invalid_scores} invalid score documents ({a.rejected} episodes rejected: "
                          "training skips them)")
            for problem in a.problems:
                out.print(f"{a.agent_id}: problem: {problem}")
        for name, by_reason in result.dead_letters.items():
            if by_reason:
                reasons = ", ".join(f"{r} {n}" for r, n in by_reason.items())
                out.print(f"dead letters in {name} by reason: {reasons} (agent-learn dlq list --queue {name})")
        for note in result.notes:
            out.print(f"note: {note}")
        out.print("ok: nothing lost or learned twice" if result.ok else "NOT OK: see above")
    if not result.ok:
        sys.exit(1)
