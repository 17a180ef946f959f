"""``agent-learn``: run the demo and manage policies on the embedded store.

Every command reads its settings from ``AGENT_LEARNING_*`` environment variables; ``--db``
overrides the SQLite file. Errors are reported in one line, with exit code 2 for bad input
and 1 for anything else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import AgentLearningError, ConcurrencyConflict, ConfigurationError, InvalidDocument

err = Console(stderr=True)
out = Console()


def _settings(db: str | None) -> Any:
    from .config import load_settings

    return load_settings(**({"sqlite_path": db} if db else {}))


def _fail(message: str, code: int) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    sys.exit(code)


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (InvalidDocument, ConfigurationError, ConcurrencyConflict, ValueError, FileNotFoundError) as exc:
            _fail(str(exc), 2)
        except AgentLearningError as exc:
            _fail(str(exc), 1)

    return wrapper


db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="SQLite file of the embedded store (default: AGENT_LEARNING_SQLITE_PATH).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-learning")
def main() -> None:
    """Agents learn which configuration to use from judged experience."""


# --------------------------------------------------------------------------- demo


@main.command()
@click.option("--episodes", "episodes", default=4_000, show_default=True, help="Episodes per simulated agent.")
@click.option("--batch", default=100, show_default=True, help="Episodes per agent between training runs.")
@click.option("--seed", default=7, show_default=True)
@click.option("--agents", default="math-tutor,support-bot", show_default=True, help="Comma-separated simulated agents.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=".agent-learning/demo.db",
    show_default=True,
    help="SQLite file (replaced).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default="agent-learning-demo.png",
    show_default=True,
    help="Where to write the PNG chart.",
)
@click.option("--no-plot", is_flag=True, help="Skip the chart.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@_handle_errors
def demo(
    episodes: int, batch: int, seed: int, agents: str, db: str, plot_path: str, no_plot: bool, as_json: bool
) -> None:
    """Simulated agents learn through the embedded pipeline (SQLite store and queue, offline judge)."""
    from .config import load_settings
    from .demo import run_demo
    from .simulate import SCENARIOS

    names = [a.strip() for a in agents.split(",") if a.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"--agents: unknown simulated agent(s) {unknown}; choose from {sorted(SCENARIOS)}")
    settings = load_settings()
    with Progress(
        TextColumn("[bold]training rounds"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as bar:
        task = bar.add_task("demo", total=episodes // batch)
        result = run_demo(
            db_path=db,
            scenarios=names,
            episodes_per_agent=episodes,
            batch=batch,
            seed=seed,
            settings=settings,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    summary = result.summary()
    if not no_plot:
        from .plots import plot_histories

        try:
            summary["plot"] = str(plot_histories(result.agents, plot_path, title="agent-learning demo"))
        except RuntimeError as exc:
            err.print(f"[yellow]no plot:[/] {exc}")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for h in result.agents:
        table = Table(title=f"{h.agent_id}: action probabilities by policy version", title_justify="left")
        table.add_column("version", justify="right")
        for a in h.action_ids:
            table.add_column(f"{a}{' *' if a == h.best_action else ''}", justify="right")
        table.add_column("mean reward", justify="right")
        rows = _sample_rows(len(h.versions), 12)
        for i in rows:
            reward = h.mean_reward[i]
            table.add_row(
                str(h.versions[i]), *(f"{p:.3f}" for p in h.probabilities[i]), "" if reward is None else f"{reward:.3f}"
            )
        out.print(table)
        trend = [m for m in h.mean_reward if m is not None]
        if trend:
            k = max(1, len(trend) // 5)
            out.print(
                f"  reward trend (first {k} runs → last {k}): {sum(trend[:k]) / k:.3f} → {sum(trend[-k:]) / k:.3f}; "
                f"true best action [bold]{h.best_action}[/] ({h.expected_rewards[h.best_action]:.3f}) "
                f"now has probability [bold]{h.final[h.best_action]:.3f}[/]  (* = true best)"
            )
    out.print(
        f"{summary['episodes']} episodes in {summary['seconds']:.1f} s "
        f"({summary['episodes_per_second']:.0f}/s); outcomes {summary['outcomes']}; store {result.db_path}"
    )
    if "plot" in summary:
        out.print(f"chart: {summary['plot']}")


def _sample_rows(n: int, limit: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


# --------------------------------------------------------------------------- policies


@main.command("init-policy")
@click.option("--agent-id", required=True)
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON file: a list of action ids or of {id, description, config} objects.",
)
@click.option("--temperature", type=float, default=None, help="Default: AGENT_LEARNING_TEMPERATURE.")
@click.option("--exploration-floor", type=float, default=None, help="Minimum probability of every action.")
@db_option
@_handle_errors
def init_policy(
    agent_id: str, actions_file: str, temperature: float | None, exploration_floor: float | None, db: str | None
) -> None:
    """Create version 1 (uniform) of an agent's policy."""
    from .pipeline import create_policy
    from .policy import SoftmaxPolicy
    from .store.sqlite import SQLiteStore

    settings = _settings(db)
    try:
        actions = json.loads(Path(actions_file).read_text())
    except ValueError as exc:
        raise ValueError(f"--actions: {actions_file} is not valid JSON ({exc})") from None
    if not isinstance(actions, list) or not actions:
        raise ValueError(f"--actions: {actions_file} must hold a non-empty JSON list")
    policy = SoftmaxPolicy.from_actions(
        agent_id,
        actions,
        temperature=settings.temperature if temperature is None else temperature,
        exploration_floor=settings.exploration_floor if exploration_floor is None else exploration_floor,
    )
    with SQLiteStore(settings.sqlite_path) as store:
        doc = create_policy(store, policy.to_document(created_at=None))
    out.print(f"created {doc.agent_id} v{doc.version} with actions {doc.action_ids} in {settings.sqlite_path}")


@main.command()
@click.option("--agent-id", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the current policy document.")
@db_option
@_handle_errors
def policy(agent_id: str, as_json: bool, db: str | None) -> None:
    """Show an agent's current policy."""
    from .demo import policy_probabilities
    from .pipeline import load_current
    from .store.sqlite import SQLiteStore

    settings = _settings(db)
    with SQLiteStore(settings.sqlite_path) as store:
        doc = load_current(store, agent_id)
    if doc is None:
        raise ValueError(f"--agent-id: {agent_id!r} has no policy in {settings.sqlite_path}")
    if as_json:
        click.echo(json.dumps(doc.to_dict(), indent=2))
        return
    table = Table(
        title=f"{agent_id} v{doc.version} ({doc.source}{', pinned' if doc.pinned else ''})", title_justify="left"
    )
    for col in ("action", "probability", "logit"):
        table.add_column(col, justify="left" if col == "action" else "right")
    for a, p, logit in zip(doc.action_ids, policy_probabilities(doc), doc.logits, strict=True):
        table.add_row(a, f"{p:.4f}", f"{logit:+.3f}")
    out.print(table)
    if doc.run:
        m = doc.run.metrics
        out.print(
            f"last run: {doc.run.episodes} episodes, mean reward {m.get('mean_reward', float('nan')):.3f}, "
            f"entropy {m.get('entropy_after', float('nan')):.3f}, KL {m.get('kl', float('nan')):.4f}"
        )


@main.command()
@click.option("--agent-id", default=None, help="Train one agent (default: every agent).")
@click.option("--json", "as_json", is_flag=True)
@db_option
@_handle_errors
def train(agent_id: str | None, as_json: bool, db: str | None) -> None:
    """Enqueue and score new episodes, then run one training step (what the timer does)."""
    from .local import open_local

    settings = _settings(db)
    pipeline = open_local(settings)
    enqueued = pipeline.pump()
    outcomes = pipeline.score_pending()
    results = pipeline.train([agent_id] if agent_id else None)
    pipeline.store.close()
    pipeline.queue.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "enqueued": enqueued,
                    "scored": dict(outcomes),
                    "training": [
                        {"agent_id": r.agent_id, "status": r.status, "version": r.version, "reason": r.reason}
                        for r in results
                    ],
                },
                indent=2,
            )
        )
        return
    out.print(f"enqueued {enqueued}; scoring outcomes {dict(outcomes) or 'none'}")
    for r in results:
        line = f"{r.agent_id}: {r.status}" + (f" → v{r.version}" if r.status == "published" else "")
        if r.run:
            line += f" ({r.run.episodes} episodes, mean reward {r.run.metrics['mean_reward']:.3f})"
        if r.reason and r.status != "published":
            line += f" — {r.reason}"
        out.print(line)


if __name__ == "__main__":  # pragma: no cover
    main()
