"""``agent-learn demo``: simulated agents learn through the embedded pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from agent_learning.cli.access import _agent_learning_file, _usable, _writable
from agent_learning.cli.options import Int, IntRange, _ending, _nonempty_path
from agent_learning.cli.output import _counts, _fmt, _n, _progress, err, out
from agent_learning.cli.root import _handle_errors, main
from agent_learning.cli.serve import DEFAULT_HOST, DEFAULT_PORT


@main.command()
@click.option("--episodes", "episodes", type=IntRange(1, 10_000_000), default=4_000, show_default=True,
              help="Episodes per simulated agent (a multiple of --batch).")
@click.option("--batch", type=IntRange(1, 1_000_000), default=100, show_default=True,
              help="Episodes per agent between training runs.")
@click.option("--seed", type=Int(), default=7, show_default=True,
              help="Random seed: the same seed gives the same run.")
@click.option(
    "--agents",
    default="math-tutor,support-bot,triage-bot",
    show_default=True,
    help="Comma-separated simulated agents.",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=".agent-learning/demo.db",
    callback=_nonempty_path,
    show_default=True,
    help="SQLite file (replaced).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default="agent-learning-demo.png",
    callback=_ending(".png"),
    show_default=True,
    help="Where to write the PNG chart.",
)
@click.option("--no-plot", is_flag=True, help="Skip the chart.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@click.option("--force", is_flag=True,
              help="Replace --db even if it holds agents other than the demo's, or is not a store.")
@_handle_errors
def demo(
    episodes: int, batch: int, seed: int, agents: str, db: str, plot_path: str, no_plot: bool, as_json: bool,
    force: bool,
) -> None:
    """Simulated agents learn through the embedded pipeline (SQLite store and queue, offline judge)."""
    from agent_learning.app.demo import EMBEDDED, check_floor, is_demo_agent, reward_trend, run_demo
    from agent_learning.app.settings import load_settings
    from agent_learning.app.wiring import open_store
    from agent_learning.ops.plots import plot_histories
    from agent_learning.sim.simulate import SCENARIOS
    names = [a.strip() for a in agents.split(",") if a.strip()]
    if not names:
        raise ValueError(f"--agents: no agent given; choose from {sorted(SCENARIOS)}")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"--agents: unknown simulated agent(s) {unknown}; choose from {sorted(SCENARIOS)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--agents: {', '.join(repeated)} given more than once; name each simulated agent once")
    if episodes % batch:
        raise ValueError(f"--episodes: {episodes} is not a multiple of --batch {batch} (a training run follows "
                         f"each batch); try --episodes {max(batch, episodes - episodes % batch)}")
    if Path(db).exists() and not Path(db).is_file():  # /dev/null, a pipe: never deleted, even with --force
        raise ValueError(f"--db: {db} is not a regular file, and the demo replaces the whole file; choose another --db")
    _writable("--db", db)
    if not no_plot:
        if Path(plot_path).resolve() == Path(db).resolve():
            raise ValueError(f"--plot: {plot_path} is also --db, and the chart would replace the demo's store; "
                             "choose another file for one of them")
        _writable("--plot", plot_path)
    if Path(db).exists() and not force:
        if not _agent_learning_file(db):
            raise ValueError(f"--db: {db} is not an agent-learning store, and the demo replaces the whole file; "
                             "pass --force to replace it, or choose another --db")
        with _usable("--db", db), open_store(load_settings(**EMBEDDED), path=db) as existing:
            others = sorted(a for a in existing.list_agents() if not is_demo_agent(existing, a))
        if others:
            raise ValueError(
                f"--db: {db} holds the policies of {', '.join(others)}, which the demo did not write, and the demo "
                "replaces the whole file; pass --force to replace it, or choose another --db"
            )
    settings = load_settings(**EMBEDDED)
    check_floor(settings, [SCENARIOS[name]() for name in names])
    with _progress("training rounds", as_json) as bar:
        task = bar.add_task("demo", total=episodes // batch)
        with _usable("--db", db):  # the file is replaced: its folder must let it be deleted and made again
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
        try:
            summary["plot"] = str(plot_histories(result.agents, plot_path, title="agent-learning demo"))
        except RuntimeError as exc:
            err.print(Text.assemble(("no plot:", "yellow"), f" {exc}"))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for h in result.agents:
        what = "each value's probability with no context" if h.segments else "action probabilities"
        table = Table(title=f"{h.agent_id}: {what}, by policy version", title_justify="left")
        table.add_column("version", justify="right")
        for a in h.action_ids:
            table.add_column(f"{a}{' *' if a == h.best_action else ''}", justify="right")
        table.add_column("mean reward", justify="right")
        rows = _sample_rows(len(h.versions), 12)
        for i in rows:
            reward = h.mean_reward[i]
            table.add_row(
                str(h.versions[i]), *(_fmt(p) or "—" for p in h.probabilities[i]), _fmt(reward)
            )
        out.print(table)
        trend = reward_trend(h)
        if trend and h.best_action is not None:
            out.print(
                Text.assemble(
                    f"  mean reward of the first {_n(trend.runs, 'training run')} → the last {trend.runs}: "
                    f"{trend.first:.3f} → {trend.last:.3f}; true best action ",
                    (h.best_action, "bold"),
                    f" ({h.expected_rewards[h.best_action]:.3f}) now has probability ",
                    (f"{h.final[h.best_action]:.3f}", "bold"),
                    "  (* = true best)",
                )
            )
        elif trend:
            out.print(
                f"  mean reward of the first {_n(trend.runs, 'training run')} → the last {trend.runs}: "
                f"{trend.first:.3f} → {trend.last:.3f}; the values' probabilities above are with no context"
            )
            for segment, (config, mean, p) in h.best_by_segment().items():
                out.print(
                    Text.assemble(
                        f"  {segment}: true best configuration ",
                        (config, "bold"),
                        f" ({mean:.3f}) now has probability ",
                        (f"{p:.3f}", "bold"),
                    )
                )
    out.print(
        f"{_n(summary['episodes'], 'episode')} in {summary['seconds']:.1f} s "
        f"({summary['episodes_per_second']:.0f}/s); outcomes {_counts(summary['outcomes'])}; store {result.db_path}"
    )
    if "plot" in summary:
        out.print(f"chart: {summary['plot']}")
    for command in summary["next"]:
        out.print(f"next: {command}")
    out.print(f"dashboard: {summary['serve']}, then open "
              f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/api/dashboard", highlight=False)


def _sample_rows(n: int, limit: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})
