"""``agent-learn store``: maintenance of the store itself."""

from __future__ import annotations

import sys

import click

from agent_learning.cli.access import _settings, _store
from agent_learning.cli.options import json_option
from agent_learning.cli.output import _echo_json, _n, _progress, out
from agent_learning.cli.root import _handle_errors, main


@main.group("store")
def store_group() -> None:
    """Maintenance of the store itself."""


@store_group.command("migrate-scores")
@click.option("--source", default="scores", show_default=True,
              help="The old scores container (partition key /id).")
@click.option("--overwrite", is_flag=True,
              help="Replace copies whose content differs with the old container's version.")
@json_option
@_handle_errors
def store_migrate_scores(source: str, overwrite: bool, as_json: bool) -> None:
    """Copy the scores of a Cosmos DB deployment from before hierarchical partition keys (container
    `scores`, key /id) into `agent-scores` (key [agent_id, id]), keeping every field (seq too).

    Each agent it copies for is paused (pinned) until the whole copy is there, so a trainer running
    meanwhile loses nothing; an interrupted copy leaves them paused. Idempotent: run it again to
    finish an interrupted copy (and resume them). Exits with 1 when a copy differs
    from the old document or a document without an agent id was left behind
    (docs/operating.md: migrating the scores container)."""
    settings = _settings(None)
    if settings.store != "cosmos":  # checked before any store is opened: this command has no --db
        raise ValueError("AGENT_LEARNING_STORE: migrate-scores copies between Cosmos DB containers: set "
                         "AGENT_LEARNING_STORE=cosmos and CosmosDBConnection__accountEndpoint "
                         f"(the {settings.store} store has one place for scores)")
    with _store(None) as (store, settings):
        from agent_learning.ops.recovery import migrate_scores

        with _progress("copying scores", transient=as_json) as bar:
            task = bar.add_task("copying scores", total=None)
            result = migrate_scores(store, source=source, overwrite=overwrite,
                                    progress=lambda n: bar.update(task, completed=n))
    if as_json:
        _echo_json(result.to_dict())
    else:
        out.print(f"{result.read} read from {source!r}: {result.copied} copied, {result.already} already there, "
                  f"{result.overwritten} overwritten, {len(result.differing)} differing, "
                  f"{len(result.skipped)} without an agent id; {_n(len(result.paused), 'agent')} paused for the "
                  "copy and resumed")
        if result.differing:
            out.print(f"differing (kept as they are; --overwrite copies the old ones): {result.differing[:20]}")
        if result.skipped:
            out.print(f"without an agent id (left in {source!r}): {result.skipped[:20]}")
    if result.differing or result.skipped:
        sys.exit(1)
