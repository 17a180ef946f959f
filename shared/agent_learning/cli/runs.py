"""``agent-learn runs``: training runs, what each consumed and changed."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table

from agent_learning.cli.access import _current_or_said, _store, _where
from agent_learning.cli.options import COUNT, agent_option, db_option, json_option
from agent_learning.cli.output import _echo_json, _fmt, _n, _say_left_out, _user_fields, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.core.errors import InvalidDocument, NotFound


@main.group()
def runs() -> None:
    """Training runs: what each consumed and changed."""


@runs.command("list")
@agent_option
@click.option("--limit", type=COUNT, default=20, show_default=True, help="The newest N runs.")
@json_option
@db_option
@_handle_errors
def runs_list(agent_id: str, limit: int, as_json: bool, db: str | None) -> None:
    """An agent's training runs, newest first.

    Exits with 1 if a run document or the current policy document is invalid (it is named, and
    the runs are listed)."""
    with _store(db) as (store, settings):
        current = _current_or_said(store, settings, agent_id)  # its runs say how it got there
        stored = store.list_runs(agent_id, limit)
    docs = [_user_fields(d) for d in stored if _valid_run(d)]
    invalid = len(docs) < len(stored) or current is None
    if as_json:
        _echo_json([_run_shown(d) for d in docs])
        sys.exit(1 if invalid else 0)
    table = Table(title=f"{agent_id}: {_n(len(docs), 'newest training run')}", title_justify="left")
    for col in ("run", "versions", "episodes", "correction rows", "corrected episodes", "rejected", "skipped",
                "reward", "KL", "finished"):
        table.add_column(col, justify="left" if col in ("run", "versions", "finished") else "right",
                         no_wrap=col in ("run", "versions"))
    for d in docs:
        m = d.get("metrics", {})
        table.add_row(
            d["id"],
            (f"v{d['base_version']} held" if d.get("status") == "held"
             else f"v{d['base_version']}→v{d['policy_version']}"),
            str(d["episodes"]),
            str(d.get("corrections", 0)), str(_corrected_episodes(d)), str(d.get("rejected", 0)),
            str(d.get("skipped", 0)),
            _fmt(m.get("mean_reward")) if d["episodes"] else "",  # corrections alone: no batch mean
            _fmt(m.get("kl"), 4), str(d.get("finished_at", ""))[:19],
        )
    out.print(table)
    if invalid:
        sys.exit(1)


def _valid_run(doc: dict[str, Any]) -> bool:
    """Whether a stored run document validates; one that does not is named on stderr (left out)."""
    from agent_learning.documents import TrainingRun
    try:
        TrainingRun.from_dict(doc)
    except InvalidDocument as exc:
        _say_left_out(f"run {doc.get('id')!r} is invalid: {exc}", str(doc.get("agent_id")))
        return False
    return True


def _corrected_episodes(run: dict[str, Any]) -> int:
    """The episodes whose learned reward a run's correction rows changed (``metrics.corrections``);
    its ``corrections`` counts the rows consumed (several for an episode whose feedback changed
    more than once)."""
    return int(run.get("metrics", {}).get("corrections", 0))


def _run_shown(run: dict[str, Any]) -> dict[str, Any]:
    """A run in ``runs list/show --json``: the document as stored, and beside it what is computed from it."""
    return {"run": run, "corrected_episodes": _corrected_episodes(run)}


@runs.command("show")
@click.argument("run_id")
@json_option
@db_option
@_handle_errors
def runs_show(run_id: str, as_json: bool, db: str | None) -> None:
    """One training run by id (``{agent}:run:v{n}``, as `runs list` shows)."""
    if ":run:v" not in run_id:
        raise ValueError(f"RUN_ID: {run_id!r} is not a run id; run ids look like 'support-bot:run:v5'")
    with _store(db) as (store, settings):
        doc = store.get_run(run_id)
    if doc is None:
        where = _where(settings, how=True)
        raise NotFound(f"RUN_ID: no run {run_id!r} in {where} (agent-learn runs list --agent-id ...)")
    if not _valid_run(doc):
        sys.exit(1)
    doc = _user_fields(doc)
    if as_json:
        _echo_json(_run_shown(doc))
        return
    table = Table(title=f"run {run_id}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key in ("status", "base_version", "policy_version", "episodes", "corrections", "corrected_episodes",
                "rejected", "skipped", "cursor_from",
                "cursor_to", "started_at", "finished_at"):
        value = _corrected_episodes(doc) if key == "corrected_episodes" else doc.get(
            key, "published" if key == "status" else None)
        if isinstance(value, dict) and {"seq", "id"} <= set(value):
            value = f"score {value['id']} (seq {value['seq']})"
        table.add_row(key, "—" if value is None else str(value))
    for key, value in sorted(doc.get("metrics", {}).items()):
        table.add_row(f"metrics.{key}", f"{value:.6g}")
    for sample in doc.get("rejected_samples", []):
        table.add_row("rejected", f"{sample['id']}: {sample['error']}")
    evaluation = doc.get("evaluation")
    if evaluation:
        table.add_row("guardrail", f"{evaluation['verdict']}: {evaluation['reason']}")
    out.print(table)
    out.print("softmax_entropy: of softmax(logits / T), without the exploration floor; "
              "policy show and policy history give the entropy of the policy agents draw from (floor included)")
