"""``agent-learn logs``: an agent's episodes as Vowpal Wabbit's DSJSON (Personalizer's log format),
and such logs imported (:mod:`agent_learning.ops.dsjson`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from agent_learning.cli.access import _current, _store
from agent_learning.cli.options import agent_option, db_option, json_option
from agent_learning.cli.output import _echo_json, _n, _progress, out
from agent_learning.cli.root import _handle_errors, main


@main.group()
def logs() -> None:
    """An agent's episodes as DSJSON lines (Vowpal Wabbit's --dsjson, as Personalizer logged), and
    such logs imported."""


@logs.command("export")
@agent_option
@click.option("--out", "out_file", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write the lines to this file (default: standard output).")
@db_option
@_handle_errors
def logs_export(agent_id: str, out_file: Path | None, db: str | None) -> None:
    """Write the agent's episodes with a reward as DSJSON, one line an episode, oldest first."""
    from agent_learning.ops.dsjson import export_lines
    skipped: list[str] = []
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        with _progress("reading episodes", out_file is None) as bar:
            task = bar.add_task("reading episodes", total=None)
            lines = list(export_lines(store, agent_id, progress=lambda n: bar.update(task, completed=n),
                                      skipped=skipped))
    text = "".join(f"{line}\n" for line in lines)
    if out_file is None:
        sys.stdout.write(text)
    else:
        out_file.write_text(text, encoding="utf-8")
        out.print(f"{agent_id}: {_n(len(lines), 'event')} written to {out_file}")
    if skipped:
        click.echo(f"{_n(len(skipped), 'episode')} without a reward or a score left out (agent-learn episodes list)",
                   err=True)


@logs.command("import")
@agent_option
@click.argument("file", type=click.File("r", encoding="utf-8"))
@json_option
@db_option
@_handle_errors
def logs_import(agent_id: str, file: click.utils.LazyFile, as_json: bool, db: str | None) -> None:
    """Import the DSJSON lines of FILE (- for standard input) as episodes of the agent; every line is
    checked first, and a bad one stops the import before anything is written."""
    from agent_learning.ops.dsjson import import_lines
    lines = file.readlines()
    with _store(db, create=True) as (store, _), _progress("importing", as_json) as bar:
        task = bar.add_task("importing", total=len(lines))
        result = import_lines(store, agent_id, lines, progress=lambda n: bar.update(task, completed=n))
    if as_json:
        _echo_json({"added": result.added, "already": result.already, "skipped_learn": result.skipped_learn,
                    "created_policy": result.created_policy, "actions": result.actions})
        return
    out.print(f"{agent_id}: {_n(result.added, 'event')} imported, {result.already:,} imported before"
              + (f", {_n(result.skipped_learn, 'line')} marked _skipLearn left out" if result.skipped_learn else ""))
    if result.created_policy:
        out.print(f"created {agent_id} v1 over {', '.join(result.actions)}, each as likely as the log took it; "
                  "agent-learn train learns from the log (as the timer does)")
