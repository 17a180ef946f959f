"""``agent-learn dlq``: list and replay the queues' dead letters."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from agent_learning.cli.access import _dead_letter_row, _queues
from agent_learning.cli.options import COUNT, db_option, json_option
from agent_learning.cli.output import _echo_json, _fail, _ids, _n, _progress, out
from agent_learning.cli.root import _handle_errors, main


@main.group()
def dlq() -> None:
    """Dead-lettered messages of the scoring and the training queue (embedded queue or Service Bus,
    by AGENT_LEARNING_QUEUE)."""


queue_option = click.option(
    "--queue", "queue_name", default=None, metavar="NAME",
    help="Only this queue: score-episodes or train-agents, as AGENT_LEARNING_QUEUE_NAME and "
         "AGENT_LEARNING_TRAIN_QUEUE_NAME name them (default: both).",
)


@dlq.command("list")
@click.option("--limit", type=COUNT, default=100, show_default=True, help="At most N dead letters.")
@queue_option
@json_option
@db_option
@_handle_errors
def dlq_list(limit: int, queue_name: str | None, as_json: bool, db: str | None) -> None:
    """Dead letters of every queue (or --queue's), oldest first, with their reasons."""
    with _queues(db, queue_name) as (queues, _):
        # one more than shown from each: whether others remain
        dead = [(name, d) for name, queue in queues.items() for d in queue.dead_letters(limit + 1)]
    if len(queues) > 1:
        dead.sort(key=lambda pair: pair[1].dead_lettered_at or 0.0)  # stable: each queue's order stays
    rows = [{"queue": name, **_dead_letter_row(d)} for name, d in dead[:limit]]
    if as_json:
        _echo_json(rows)
        return
    title = f"{_n(len(rows), 'dead letter')} in {' and '.join(queues)}"
    if len(dead) > limit:
        title = f"the oldest {title} (more remain: --limit N lists more)"
    table = Table(title=title, title_justify="left")
    columns = ("queue",) * (len(queues) > 1) + ("message id", "reason", "deliveries", "description")
    for col in columns:
        table.add_column(col, justify="right" if col == "deliveries" else "left")
    for r in rows:
        cells = (r["queue"],) * (len(queues) > 1) + (r["message_id"], r["reason"], str(r["delivery_count"]))
        table.add_row(*cells, r["description"][:200])
    out.print(table)


@dlq.command("replay")
@click.option("--id", "ids", multiple=True, help="A dead letter's message id (repeatable).")
@click.option(
    "--reason", "reasons", multiple=True, help="Only dead letters with this reason, e.g. JudgeFailed (repeatable)."
)
@click.option("--all", "replay_all", is_flag=True, help="Replay every dead letter.")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
@queue_option
@json_option
@db_option
@_handle_errors
def dlq_replay(
    ids: tuple[str, ...], reasons: tuple[str, ...], replay_all: bool, dry_run: bool, queue_name: str | None,
    as_json: bool, db: str | None,
) -> None:
    """Send dead letters back to their queue (every queue, or --queue's) to be scored or trained again
    (after fixing their cause). A training message trains its agent from its current cursor, so
    replaying one is safe however late.

    Choose them with --all, or with --id and/or --reason (given both, a dead letter must match both)."""
    from agent_learning.ops.recovery import REPLAY_LIMIT, replay_dead_letters
    if bool(ids or reasons) == replay_all:
        raise ValueError(
            "--all/--id/--reason: give --all, or --id MESSAGE_ID and/or --reason REASON"
            " (agent-learn dlq list shows them)"
        )
    counts: dict[str, int] = {}  # replayed per queue
    chosen: list[str] | None = None if replay_all and not dry_run else []
    left: dict[str, int] = {}
    more: list[str] = []  # the queues holding more dead letters than were read
    with _queues(db, queue_name) as (queues, _), _progress("reading" if dry_run else "replaying", as_json) as bar:
        task = bar.add_task("replay", total=None)
        for name, queue in queues.items():
            if chosen is None:  # a peek first: an empty dead-letter queue costs no receive (seconds on Service Bus)
                counts[name] = queue.replay_dead_letters(None) if queue.dead_letters(1) else 0
                continue
            result = replay_dead_letters(queue, reasons=reasons or None, message_ids=ids or None, dry_run=dry_run)
            counts[name] = len(result.replayed) if result.moved is None else result.moved
            chosen += result.replayed
            for reason, n in result.left.items():
                left[reason] = left.get(reason, 0) + n
            more += [name] * result.more
        replayed = sum(counts.values())
        bar.update(task, total=replayed, completed=replayed)
    # --id alone: the ids no dead letter has (with --reason, an id may be there with another reason)
    not_found = [i for i in dict.fromkeys(ids) if i not in (chosen or [])] if ids and not reasons else None
    if as_json:
        data: dict[str, Any] = {"would_replay" if dry_run else "replayed": replayed}
        if chosen is not None:
            data.update(message_ids=chosen, left=dict(left), **({"more": True} if more else {}))
        if not_found is not None:
            data["not_found"] = not_found
        _echo_json(data)
    else:
        to = (f" to {next(iter(counts))}" if len(counts) == 1
              else " (" + ", ".join(f"{n} to {name}" for name, n in counts.items()) + ")")
        if dry_run:
            out.print(f"would replay {_n(replayed, 'dead letter')}{to}: {_ids(chosen or [])}")
        else:
            out.print(f"replayed {_n(replayed, 'dead letter')}{to}")
        if left:
            out.print("left in the dead-letter queue: " + ", ".join(f"{n} {r}" for r, n in sorted(left.items())))
        if more:
            out.print(f"only the oldest {REPLAY_LIMIT:,} dead letters were read (of {' and '.join(more)}); any after "
                      "them were not considered (running it again reads past those replayed)")
    if not_found and more:
        _fail(f"--id: none of the oldest {REPLAY_LIMIT:,} dead letters, the ones read, has the id "
              f"{', '.join(not_found)}; the ones after them were not read", 1 if chosen else 2)
    if not_found:  # none found: bad input, nothing changed (2); some: those were replayed, the rest missing (1)
        _fail(f"--id: no dead letter has the id {', '.join(not_found)} (agent-learn dlq list shows them)",
              1 if chosen else 2)
