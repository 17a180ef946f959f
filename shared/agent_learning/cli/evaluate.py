"""``agent-learn evaluate``: what-if estimates of another policy on an agent's logged episodes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table

from agent_learning.cli.access import _current, _store
from agent_learning.cli.options import TIME_FORMATS, FloatRange, IntRange, agent_option, db_option, json_option
from agent_learning.cli.output import _echo_json, _iso, _progress, out
from agent_learning.cli.root import _handle_errors, main


@main.command()
@agent_option
@click.option("--version", "version", type=IntRange(min=1), default=None,
              help="Evaluate this version of the agent's policy.")
@click.option("--action", "action_id", default=None,
              help="Evaluate always choosing this configuration (for dimensions: this value, e.g. prompt=concise, "
                   "with the other dimensions as the current version chooses them).")
@click.option("--uniform", is_flag=True, help="Evaluate choosing every configuration equally often.")
@click.option("--candidate", is_flag=True, help="Evaluate the version the next training run would publish.")
@click.option("--since", type=click.DateTime(TIME_FORMATS), default=None,
              help="Only episodes scored at or after this UTC date or time (default: all, the newest 100,000).")
@click.option("--confidence", type=FloatRange(0.5, 0.999), default=0.95, show_default=True,
              help="Two-sided confidence of the intervals.")
@json_option
@db_option
@_handle_errors
def evaluate(agent_id: str, version: int | None, action_id: str | None, uniform: bool, candidate: bool,
             since: datetime | None, confidence: float, as_json: bool, db: str | None) -> None:
    """Estimate, from the logged episodes, what the mean reward would have been under another
    policy, against the current version (IPS, self-normalised IPS and doubly robust, with intervals).
    Without a target option, the current version is evaluated on its own logs."""
    from agent_learning.app import wiring
    from agent_learning.evaluation import counterfactual as cf  # numpy: only for this command
    from agent_learning.evaluation import percent
    from agent_learning.ops.candidate import candidate_target

    chosen = [name for name, given in (("--version", version is not None), ("--action", action_id is not None),
                                       ("--uniform", uniform), ("--candidate", candidate)) if given]
    if len(chosen) > 1:
        raise ValueError(f"{chosen[1]}: choose one target of --version, --action, --uniform and --candidate")
    with _store(db) as (store, settings):
        current = _current(store, settings, agent_id)
        with _progress("reading scores", transient=True) as bar:  # every score of the agent: may take a while
            task = bar.add_task("reading scores", total=None)
            logged = cf.read_logged(store, current, since=since.replace(tzinfo=UTC) if since else None,
                                    progress=lambda n: bar.update(task, completed=n))
        if version is not None:
            target, label = cf.version_target(store, current, version), f"v{version}"
        elif action_id is not None:
            target, label = cf.always(current, action_id), f"always {action_id}"
        elif uniform:
            target, label = cf.uniform(current), "uniform"
        elif candidate:
            target, new = candidate_target(store, current, wiring.open_learner(settings), settings.train_max_batch)
            label = f"the next candidate (v{current.version + 1}, from {new} new episodes)"
        else:
            target, label = cf.of_document(current), f"v{current.version} (current)"
        result = cf.compare_to_current(logged, current, target, label, confidence,
                                       option=chosen[0] if chosen else "--agent-id")
        if candidate and new < settings.train_min_batch:
            result.notes.append(f"a training run now publishes nothing: it waits for {settings.train_min_batch} new "
                                f"scores (AGENT_LEARNING_TRAIN_MIN_BATCH), and its candidate then has them all")
    if as_json:
        _echo_json({**result.to_dict(), "confidence": confidence, "reward_function": logged.reward_function,
                    "scored_from": logged.first, "scored_to": logged.last})
        return
    span = f"{_iso(logged.first)[:19]} to {_iso(logged.last)[:19]}" if logged.first and logged.last else ""
    out.print(f"{agent_id}: {label} against v{current.version} (current) on {result.episodes:,} episodes "
              f"scored {span} UTC")
    low, high = result.reward_range
    table = Table(title=f"mean reward, {percent(confidence)} intervals, cut to the reward's range [{low:g}, {high:g}]",
                  title_justify="left")
    for col in ("estimator", "target", "current", "target − current", "ESS"):
        table.add_column(col, justify="left" if col == "estimator" else "right")
    for name, (t, c, d) in result.estimates.items():
        table.add_row(name, _interval_text(t), _interval_text(c), _interval_text(d, signed=True),
                      f"{t.effective_sample_size:,.0f}")
    out.print(table)
    if result.metrics:
        metrics = Table(title="guardrail metrics, mean per episode (SNIPS)", title_justify="left")
        for col in ("metric", "target", "current"):
            metrics.add_column(col, justify="left" if col == "metric" else "right")
        for name, (t, c) in result.metrics.items():
            metrics.add_row(name, _interval_text(t, digits=METRIC_DIGITS.get(name, 0)),
                            _interval_text(c, digits=METRIC_DIGITS.get(name, 0)))
        out.print(metrics)
    for note in result.notes:
        out.print(f"note: {note}")
    out.print("ESS: effective sample size of the target's importance weights, (Σw)²/Σw²; "
              "an interval resting on a few dozen is wide, on fewer it is rough")


METRIC_DIGITS = {"tool_failure_rate": 3, "latency_ms": 1}
"""Decimals of each guardrail metric in `evaluate`'s table (token counts: none)."""


def _interval_text(e: Any, signed: bool = False, digits: int = 3) -> str:
    f = f"{'+' if signed else ''},.{digits}f"
    return f"{e.value:{f}} [{e.low:{f}}, {e.high:{f}}]"
