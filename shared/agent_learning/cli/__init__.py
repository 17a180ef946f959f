"""``agent-learn``: run the demo, inspect and steer policies, runs, episodes and dead letters.

Every command reads its settings from ``AGENT_LEARNING_*`` environment variables, so the same
commands work on the embedded SQLite store and on Cosmos DB (``AGENT_LEARNING_STORE=cosmos``
with ``CosmosDBConnection__accountEndpoint``: Entra ID through ``DefaultAzureCredential``, or
``AGENT_LEARNING_COSMOS_KEY`` for a local server). ``--db`` overrides the SQLite file. The
dead-letter commands use the queue the settings choose (``AGENT_LEARNING_QUEUE``). List and
show commands print JSON with ``--json``. Errors are reported in one line, with exit code 2
for bad input and 1 for anything else.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager, nullcontext, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..errors import (
    AgentLearningError,
    ConcurrencyConflict,
    ConfigurationError,
    InvalidDocument,
    NotFound,
    StoredDocumentInvalid,
    TransientError,
)
from ..limits import MAX_TEMPERATURE, MIN_TEMPERATURE, agent_id_problem


def _console(stderr: bool = False) -> Console:
    """A console that prints strings literally: episodes, comments, dead-letter descriptions and
    action descriptions are user text, so neither Rich markup (``[bold]``, ``[/]``) nor emoji
    codes (``:smile:``) are interpreted, in lines or in table cells; styled parts are
    :class:`~rich.text.Text` objects. Output that is not a terminal gets 160 columns (unless
    COLUMNS says otherwise)."""
    console = Console(stderr=stderr, markup=False, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=160, markup=False, emoji=False)
    return console


err = _console(stderr=True)
out = _console()


def _settings(db: str | None) -> Any:
    from ..config import load_settings
    return load_settings(**({"sqlite_path": db} if db else {}))


def _fail(message: str, code: int) -> None:
    # One line however long: a wrapped message reads as two.
    err.print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    sys.exit(code)


def _with_notes(exc: BaseException) -> str:
    """An error's message and its notes (``add_note``: what to do about it), as one line."""
    return "; ".join([str(exc), *getattr(exc, "__notes__", ())])


BAD_INPUT = (InvalidDocument, ConfigurationError, ConcurrencyConflict, NotFound, ValueError, FileNotFoundError)


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StoredDocumentInvalid as exc:  # what the store holds, not what was asked
            _fail(_with_notes(exc), 1)
        except BAD_INPUT as exc:
            _fail(str(exc), 2)
        except AgentLearningError as exc:
            _fail(str(exc), 1)
        except Exception as exc:
            if not type(exc).__module__.startswith("azure."):
                raise
            _fail(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", 1)

    return wrapper


def _nonempty_path(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an empty path, which would otherwise mean the default one."""
    if value == "":
        raise click.BadParameter("is empty; give a file path, or leave the option out for the default")
    return value


def _ending(*suffixes: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback refusing a file name that does not end in one of ``suffixes`` (the format written)."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        _nonempty_path(ctx, param, value)
        if value is not None and not str(value).lower().endswith(suffixes):
            raise click.BadParameter(f"{value} does not end in {' or '.join(suffixes)}, the format written there")
        return value

    return check


IDS_SHOWN = 10
"""Ids a table-form listing shows before "… and N more" (``--json`` lists them all)."""


def _ids(ids: list[str]) -> str:
    """The first :data:`IDS_SHOWN` of ``ids``, comma-separated, and how many more (``-`` for none)."""
    more = len(ids) - IDS_SHOWN
    return (", ".join(ids[:IDS_SHOWN]) or "-") + (f", … and {more} more (--json lists them all)" if more > 0 else "")


def _note_text(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A --note or --reason: refused over :data:`MAX_NOTE_CHARS` rather than cut unsaid."""
    from ..documents import MAX_NOTE_CHARS
    if len(value) > MAX_NOTE_CHARS:
        raise click.BadParameter(f"is {len(value):,} characters; at most {MAX_NOTE_CHARS:,} are stored")
    return value


def _counts(counts: Mapping[str, int]) -> str:
    """``scored 2, failed 1`` (or ``none``): counts by name as a reader reads them, not a dict."""
    return ", ".join(f"{name} {count:,}" for name, count in counts.items()) or "none"


def _n(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1: ``1 version``, ``2 versions``."""
    return f"{count} {noun if count == 1 else noun + 's'}"


db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_nonempty_path,
    help="SQLite file of the embedded store and queue (default: AGENT_LEARNING_SQLITE_PATH).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")


def _agent_id(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Check ``--agent-id`` values here, so that a bad one gets one plain sentence, not a pattern."""
    for item in value if isinstance(value, tuple) else [value]:
        if item is None:
            continue
        if not item:
            raise click.BadParameter("agent id must not be empty")
        if problem := agent_id_problem(item):
            raise click.BadParameter(problem)
    return value


class _AsciiDigits(click.ParamType):
    """Refuses a number written in another script's digits, which ``int()`` and ``float()`` read
    (``١٢`` is 12): a number on the command line is written in ASCII digits."""

    @staticmethod
    def problem(value: Any) -> str | None:
        """What is wrong with ``value`` as a number on the command line, if it is written in other digits."""
        if isinstance(value, str) and not value.isascii():
            return f"{value!r} is not a number in ASCII digits (0-9)"
        return None

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if problem := self.problem(value):
            self.fail(problem, param, ctx)
        return super().convert(value, param, ctx)


class Int(_AsciiDigits, click.types.IntParamType):
    """:data:`click.INT` of ASCII digits only."""


class Float(_AsciiDigits, click.types.FloatParamType):
    """:data:`click.FLOAT` of ASCII digits only."""


class IntRange(_AsciiDigits, click.IntRange):
    """:class:`click.IntRange` of ASCII digits only."""


class FloatRange(_AsciiDigits, click.FloatRange):
    """:class:`click.FloatRange` of ASCII digits only."""


COUNT = IntRange(1, 1_000_000)
"""The type of ``--limit``, ``--last`` and ``--smooth``: a number of items, within what a store can query."""

agent_option = click.option(
    "--agent-id", required=True, callback=_agent_id, help="The agent whose policy to use."
)


def _existing(settings: Any) -> Any:
    """``settings`` if their embedded store exists; commands other than ``init-policy`` (and the
    demo, which writes its own) never create one at a mistyped path, nor in another program's file."""
    if settings.store != "sqlite":
        return settings
    if not Path(settings.sqlite_path).exists():
        from ..store.sqlite import described as sqlite_described

        raise NotFound(
            f"--db: there is no store at {sqlite_described(settings.sqlite_path)}; "
            "agent-learn init-policy creates one, and the demo writes .agent-learning/demo.db"
        )
    if not _agent_learning_file(settings.sqlite_path):
        raise ValueError(f"--db: {settings.sqlite_path} is not an agent-learning store (AGENT_LEARNING_SQLITE_PATH)")
    return settings


@contextmanager
def _usable(option: str, path: str | Path) -> Iterator[None]:
    """Report a path the filesystem refuses (a file where a folder should be, no permission, a
    read-only database) as bad input naming ``option``; a locked database is a transient failure."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise TransientError(f"{option}: {path} is locked by another process ({exc})") from None
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        if Path(path).is_dir():  # SQLite says "disk I/O error" or "unable to open database file"
            reason = "a folder, not a file"
        elif isinstance(exc, FileExistsError | NotADirectoryError):  # a file where a folder of the path should be
            reason = f"{exc.filename} is a file, not a folder"
        elif isinstance(exc, OSError) and exc.filename and str(exc.filename) != str(path):
            reason += f": {exc.filename}"
        raise ValueError(f"{option}: cannot use {path}: {reason}") from None


MARK_TABLES = ("policies", "queue_messages")
"""Tables the embedded store and the embedded queue always create: a file with neither is not theirs."""


def _agent_learning_file(path: str | Path) -> bool:
    """Whether the SQLite file at ``path`` holds the embedded store or queue; read only, so a file
    that is not theirs is left as it is."""
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    with _usable("--db", path), closing(sqlite3.connect(uri, uri=True)) as conn:
        try:
            found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name IN (?, ?)",
                                 MARK_TABLES).fetchone()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):
                raise
            return False  # not SQLite at all
    return found is not None


def _embedded(settings: Any, kind: str) -> Any:
    """Path errors of the embedded SQLite file as ``--db`` errors, if ``kind`` (a setting such as
    ``store`` or ``queue``) chooses the embedded one; otherwise nothing."""
    return _usable("--db", settings.sqlite_path) if getattr(settings, kind) == "sqlite" else nullcontext()


def _writable(option: str, path: str) -> None:
    """Check before any work that ``path`` can be written (its folders are made for the check if
    missing); a file or folder that was not there is not left behind (the writer makes them again)."""
    target = Path(path)
    existed = target.exists()
    made = [folder for folder in target.parents if not folder.exists()]  # deepest first
    try:
        with _usable(option, path):
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab"):
                pass
            if not existed:
                target.unlink()
    finally:
        for folder in made:
            with suppress(OSError):
                folder.rmdir()


@contextmanager
def _store(db: str | None, *, create: bool = False) -> Iterator[tuple[Any, Any]]:
    """The store the settings choose, and the settings; an embedded one must exist unless ``create``."""
    from .. import wiring
    settings = _settings(db) if create else _existing(_settings(db))
    with _embedded(settings, "store"):
        store = wiring.open_store(settings)
    try:
        yield store, settings
    finally:
        store.close()


def _where(settings: Any, how: bool = False) -> str:
    """The store the settings choose; with ``how``, for messages about what it lacks, an embedded
    file's absolute path and how it is chosen (a relative one depends on the working directory)."""
    if settings.store == "cosmos":
        return f"Cosmos DB {settings.cosmos_endpoint} database {settings.cosmos_database}"
    if settings.store == "memory":
        return "the memory store"
    if not how:
        return str(settings.sqlite_path)
    from ..store.sqlite import described as sqlite_described

    return sqlite_described(settings.sqlite_path)


def _current(store: Any, settings: Any, agent_id: str) -> Any:
    """The agent's current policy document; :class:`NotFound` (bad input) when it has none, and an
    invalid one raises :class:`StoredDocumentInvalid` with the rollback that repairs it as a note."""
    from ..pipeline import load_current
    from ..pipeline.publish import repair_hint
    try:
        doc = load_current(store, agent_id)
    except StoredDocumentInvalid as exc:
        exc.add_note(repair_hint(agent_id))
        raise
    if doc is None:
        agents = store.list_agents()
        known = f"agents: {', '.join(agents)}" if agents else "no agent has a policy yet (agent-learn init-policy)"
        raise NotFound(f"--agent-id: {agent_id!r} has no policy in {_where(settings, how=True)}; {known}")
    return doc


def _current_or_said(store: Any, settings: Any, agent_id: str) -> Any:
    """:func:`_current`, or ``None`` when the current document is invalid, said on stderr with the
    rollback that repairs it: for commands that read the agent's other documents all the same
    (and then exit with 1)."""
    try:
        return _current(store, settings, agent_id)
    except StoredDocumentInvalid as exc:
        err.print(Text.assemble(("error:", "bold red"), f" {_with_notes(exc)}"), highlight=False, soft_wrap=True)
        return None


TIME_FORMATS = ["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M"]
"""The forms ``--since`` and ``--until`` accept (UTC)."""


def version_window_options(command: Any) -> Any:
    """``--since``/``--until``: the versions created in a time window."""
    command = click.option("--until", type=click.DateTime(TIME_FORMATS), default=None,
                           help="Only versions created at or before this UTC date or time.")(command)
    return click.option("--since", type=click.DateTime(TIME_FORMATS), default=None,
                        help="Only versions created at or after this UTC date or time "
                             "(2026-11-01 or 2026-11-01T08:00:00).")(command)


def _utc_window(since: datetime | None, until: datetime | None) -> tuple[datetime | None, datetime | None]:
    """The window in UTC, checked."""
    since, until = (t.replace(tzinfo=UTC) if t else None for t in (since, until))
    if since and until and since > until:
        raise ValueError(f"--since: {_iso(since)} is after --until {_iso(until)}")
    return since, until


def _no_versions_in(agent_ids: list[str]) -> NotFound:
    return NotFound(f"--since/--until: no versions of {', '.join(agent_ids)} were created in that time")


def _iso(value: datetime) -> str:
    """ISO 8601, UTC as ``Z``: the one form of a time in ``--json`` output (as documents store it)."""
    return value.isoformat().replace("+00:00", "Z")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return _iso(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return str(value)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=_json_default))


def _user_fields(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def _fmt(value: float | None, digits: int = 3) -> str:
    """A number to ``digits`` decimals; anything else (a hand-edited document's ``"high"``) as its repr."""
    from ..structured import is_number
    if value is None:
        return ""
    return f"{value:.{digits}f}" if is_number(value) else f"{value!r:.40}"


def _ms(value: float | None) -> str:
    """A latency for people: ``628.7 ms``, ``0.002 ms``, ``12.3 s``."""
    from ..structured import is_number
    if value is None:
        return ""
    if not is_number(value):
        return f"{value!r:.40}"
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    return f"{value:.1f} ms" if value >= 1 else f"{value:.3g} ms"


PLAIN_PROGRESS_SECONDS = 30.0
"""On stderr that is not a terminal (a CI log), the most often progress is written as a line."""


class PlainProgress(Progress):
    """Progress on stderr that is not a terminal (a CI log, a file), where a bar is drawn once,
    at the end, as a row of bar characters (``scoring ━━━━ 0/? 0:00:00``): plain lines instead,
    one every :data:`PLAIN_PROGRESS_SECONDS` while it runs and one when it ends (none when the
    command fails: its error says what happened)."""

    def __init__(self, label: str) -> None:
        super().__init__(console=err, disable=True)
        self.label = label
        self._said = self.get_time()

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        self._say(final=False)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._say(final=False)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        super().__exit__(exc_type, exc, tb)
        if exc_type is None:
            self._say(final=True)

    def _say(self, final: bool) -> None:
        now = self.get_time()
        if not final and now - self._said < PLAIN_PROGRESS_SECONDS:
            return
        self._said = now
        for task in self.tasks:
            of = f" of {task.total:.0f}" if task.total is not None else ""
            when = "done in" if final else "so far, after"
            err.print(f"{self.label}: {task.completed:.0f}{of} {when} {task.elapsed or 0:.1f} s")


def _progress(label: str, transient: bool) -> Progress:
    """A progress bar on stderr. On stderr that is not a terminal, plain lines
    (:class:`PlainProgress`), and none for a transient bar: it would show nothing there but the
    empty line it leaves (before an error message, say)."""
    if not err.is_terminal and not transient:
        return PlainProgress(label)
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=transient,
        disable=transient and not err.is_terminal,
    )


NO_SUBCOMMAND: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""What click (8.2 and later) raises for a group given no subcommand (8.1 prints the help itself)."""


class OneLineErrors(click.Group):
    """Usage errors (a bad option value, a missing option, an unknown command) in the CLI's one
    error style: ``error: <option>: <problem>`` on one line, exit code 2. A group given no
    subcommand prints its help, as ``policy`` does, with exit code 0."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except NO_SUBCOMMAND as exc:
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.BadParameter as exc:
            param = exc.param
            name = (param.human_readable_name if isinstance(param, click.Argument) else param.opts[0]) if param else ""
            problem = "is required" if isinstance(exc, click.MissingParameter) else exc.message
            _fail(f"{name}: {problem}" if name else problem, 2)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "agent-learn"
            _fail(f"{exc.format_message().rstrip('.')} ({command} --help)", 2)
        except click.Abort:
            _fail("aborted", 1)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-learning")
def main() -> None:
    """Agents learn which configuration to use from judged experience."""


# --------------------------------------------------------------------------- demo


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
    from ..config import load_settings
    from ..demo import EMBEDDED, check_floor, is_demo_agent, reward_trend, run_demo
    from ..plots import plot_histories
    from ..simulate import SCENARIOS
    from ..store.sqlite import SQLiteStore
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
        with _usable("--db", db), SQLiteStore(db) as existing:
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


def _sample_rows(n: int, limit: int) -> list[int]:
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


# --------------------------------------------------------------------------- policies


STRUCTURE_KEYS = ("dimensions", "context", "excluded")
"""The keys of an ``--actions`` file that declares a structured policy (an object, not a list)."""


def _read_actions(actions_file: str) -> list[Any] | dict[str, Any]:
    """The actions in an ``--actions`` file, checked item by item: a list of actions, or an
    object with ``dimensions`` (and optionally ``context`` and ``excluded``)."""
    from ..documents import parse_json
    try:  # a name given twice is refused, as the HTTP routes refuse it: JSON would keep only the last
        actions = parse_json(Path(actions_file).read_text(), unique_names=True)
    except ValueError as exc:
        raise ValueError(f"--actions: {actions_file} {exc}") from None
    if isinstance(actions, dict):
        unknown = sorted(set(actions) - set(STRUCTURE_KEYS))
        if unknown or "dimensions" not in actions:
            raise ValueError(
                f"--actions: {actions_file} holds an object; it needs \"dimensions\" and may have "
                f"\"context\" and \"excluded\"" + (f" (unknown: {unknown})" if unknown else "")
            )
        return actions
    if not isinstance(actions, list) or not actions:
        raise ValueError(f"--actions: {actions_file} must hold a non-empty JSON list, or an object with dimensions")
    for i, action in enumerate(actions):
        if not isinstance(action, str | dict):
            raise ValueError(
                f"--actions: item {i} of {actions_file} is {json.dumps(action)}; an action is an id (a string) "
                'or an object such as {"id": "k=5", "config": {"retrieval_k": 5}}'
            )
    return actions


POLICY_OPTIONS = {"temperature": "--temperature", "exploration_floor": "--exploration-floor", "agent_id": "--agent-id"}
"""The option behind each policy field that does not come from the ``--actions`` file."""


def _actions_problem(exc: InvalidDocument) -> ValueError:
    """A policy built from ``--actions`` that failed validation, as the option's error: each
    problem after the option it came from (``--actions`` for the file's own fields)."""
    return ValueError("; ".join(
        f"{POLICY_OPTIONS[name]}: {problem}" if name in POLICY_OPTIONS else f"--actions: {name}: {problem}"
        for name, problem in exc.problems
    ))


def _checked_floor(floor: float, given: str, actions: list[Any] | dict[str, Any]) -> float:
    """``floor`` if every action (every value of the largest dimension) can have it, else a
    ValueError naming where it came from (``given``) and a floor that fits."""
    if not math.isfinite(floor) or floor < 0:
        raise ValueError(f"--exploration-floor: must be a finite number >= 0, got {floor}")
    if isinstance(actions, dict):
        sizes = {str(name): len(values) for name, values in (actions.get("dimensions") or {}).items()
                 if isinstance(values, list)} if isinstance(actions.get("dimensions"), dict) else {}
        if not sizes:
            return floor  # the document's validation names what is wrong with the dimensions
        largest = max(sizes, key=sizes.__getitem__)
        k, what = sizes[largest], f"values of dimension {largest!r}"
    else:
        k, what = len(actions), "actions"
    if floor * k < 1:
        return floor
    fits = float(f"{0.5 / k:.0e}")  # one significant digit, at most half of 1/k
    where = {
        "option": f"--exploration-floor: {floor} x {k} {what} reaches 1",
        "setting": f"--exploration-floor: AGENT_LEARNING_EXPLORATION_FLOOR={floor} x {k} {what} reaches 1",
        "default": f"--exploration-floor: the default floor {floor} x {k} {what} reaches 1",
    }[given]
    raise ValueError(f"{where} (the floor is each one's minimum probability, so floor x {k} must be below 1); "
                     f"pass a smaller --exploration-floor, e.g. --exploration-floor {fits:g}")


@main.command("init-policy")
@click.option("--agent-id", required=True, callback=_agent_id, help="The new agent's id.")
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON file: a list of action ids or of {id, description, config} objects; or an object "
    '{"dimensions": {"prompt": [...], "retrieval_k": [...]}, "context": {"task": "category"}, "excluded": [...]}.',
)
@click.option(
    "--temperature",
    type=FloatRange(MIN_TEMPERATURE, MAX_TEMPERATURE),
    default=None,
    help="Default: AGENT_LEARNING_TEMPERATURE.",
)
@click.option("--exploration-floor", type=Float(), default=None,
              help="Minimum probability of every action; times the number of actions, below 1. "
              "Default: AGENT_LEARNING_EXPLORATION_FLOOR.")
@db_option
@_handle_errors
def init_policy(
    agent_id: str, actions_file: str, temperature: float | None, exploration_floor: float | None, db: str | None
) -> None:
    """Create version 1 (uniform) of an agent's policy."""
    from ..pipeline import create_policy
    from ..policy import SoftmaxPolicy
    from ..structured import StructuredPolicy
    settings = _settings(db)
    actions = _read_actions(actions_file)
    if exploration_floor is None:
        given = "setting" if "exploration_floor" in settings.model_fields_set else "default"
        exploration_floor = _checked_floor(settings.exploration_floor, given, actions)
    else:
        exploration_floor = _checked_floor(exploration_floor, "option", actions)
    options = {
        "temperature": settings.temperature if temperature is None else temperature,
        "exploration_floor": exploration_floor,
    }
    if temperature is not None and not math.isfinite(temperature):
        raise ValueError(f"--temperature: {temperature} is not in the range {MIN_TEMPERATURE}<=x<={MAX_TEMPERATURE}.")
    try:
        if isinstance(actions, dict):
            first = StructuredPolicy.create(
                agent_id,
                actions["dimensions"],
                context=actions.get("context"),
                excluded=actions.get("excluded") or (),
                **options,
            ).document
        else:
            first = SoftmaxPolicy.from_actions(agent_id, actions, **options).to_document(created_at=None)
    except InvalidDocument as exc:
        raise _actions_problem(exc) from None
    with _store(db, create=True) as (store, _):
        existed = store.get_current_policy(agent_id) is not None
        try:
            doc = create_policy(store, first)
        except ConcurrencyConflict as exc:
            raise ValueError(f"--agent-id: {exc}") from None
    if existed:  # the same policy again: nothing changed
        out.print(f"{agent_id} already has this policy (now v{doc.version}) in {_where(settings)}; nothing changed")
    elif doc.dimensions:
        dims = ", ".join(f"{d.name} ({d.size})" for d in doc.dimensions)
        features = f" learning from {[f.name for f in doc.features]}" if doc.features else ""
        out.print(f"created {doc.agent_id} v{doc.version} with dimensions {dims}{features} in {_where(settings)}")
    else:
        out.print(f"created {doc.agent_id} v{doc.version} with actions {doc.action_ids} in {_where(settings)}")


@main.group(invoke_without_command=True)
@click.option("--agent-id", hidden=True, default=None)
@click.option("--json", "as_json", is_flag=True, hidden=True)
@db_option
@click.pass_context
def policy(ctx: click.Context, agent_id: str | None, as_json: bool, db: str | None) -> None:
    """Show, list, roll back, pin and unpin policies."""
    if db is not None:  # `policy --db FILE show ...`: the group's --db is the subcommands' default
        ctx.default_map = {name: {"db": db} for name in policy.commands}
    if ctx.invoked_subcommand is not None:
        return
    if agent_id is None:  # `agent-learn policy --agent-id X` is kept as `policy show`
        click.echo(ctx.get_help())
        return
    ctx.invoke(policy_show, agent_id=agent_id, as_json=as_json, db=db)


@policy.command("show")
@agent_option
@json_option
@db_option
@_handle_errors
def policy_show(agent_id: str, as_json: bool, db: str | None) -> None:
    """An agent's current policy: probabilities, logits and the last training run."""
    from ..history import source_label
    from ..policy import policy_entropy, policy_probabilities
    with _store(db) as (store, settings):
        doc = _current(store, settings, agent_id)
    if doc.structured:
        _show_structured(doc, as_json)
        return
    if as_json:
        _echo_json(_shown(doc, dict(zip(doc.action_ids, policy_probabilities(doc), strict=True))))
        return
    state = f"{source_label(doc.source, doc.parent_version)}{', pinned' if doc.pinned else ''}"
    table = Table(title=f"{agent_id} v{doc.version} ({state})", title_justify="left")
    evidence = _evidence_columns(doc)
    described = any(a.description for a in doc.actions)
    columns = (("action",) + (("description",) if described else ()) + ("probability", "logit")
               + (("episodes (faded)", "mean reward") if evidence else ()))
    for col in columns:
        table.add_column(col, justify="left" if col in ("action", "description") else "right")
    for i, (a, p, logit) in enumerate(zip(doc.actions, policy_probabilities(doc), doc.logits, strict=True)):
        table.add_row(a.id, *((a.description,) if described else ()), f"{p:.4f}", f"{logit:+.3f}",
                      *(evidence[i] if evidence else ()))
    out.print(table)
    _pinned_and_last_run(doc, f"entropy {policy_entropy(policy_probabilities(doc)):.3f} nats")


def _shown(doc: Any, probabilities: dict[str, Any]) -> dict[str, Any]:
    """``policy show --json``: the document as stored, and beside it what is computed from it."""
    return {"policy": doc.to_dict(), "probabilities": probabilities}


def _pinned_and_last_run(doc: Any, entropy_line: str | None = None) -> None:
    """The end of ``policy show``: the note of a version no run made (a rollback's, a revision's),
    whether learning is paused, the entropy, the last run."""
    if doc.note and doc.run is None:
        out.print(f"note: {doc.note}")
    if doc.pinned:
        out.print(f"learning is paused{': ' + doc.pin_reason if doc.pin_reason else ''} (agent-learn policy unpin)")
    if entropy_line:
        out.print(entropy_line)
    if doc.run:
        m = doc.run.metrics
        # a run of corrections alone had no batch of episodes: no mean reward (its metric says 0.0)
        batch = (f", mean reward {m.get('mean_reward', float('nan')):.3f}" if doc.run.episodes
                 else f" ({_n(doc.run.corrections, 'correction row')})")
        out.print(f"last run {doc.run.id}: {_n(doc.run.episodes, 'episode')}{batch}, "
                  f"KL {m.get('kl', float('nan')):.4f}")


def _show_structured(doc: Any, as_json: bool) -> None:
    """``policy show`` of a structured policy: per dimension, each value's probability with no
    context and in each segment of each categorical feature, its logit and its evidence."""
    from ..history import source_label
    from ..structured import NO_CONTEXT, segment_views
    views = segment_views(doc)
    if as_json:
        _echo_json(_shown(doc, views))
        return
    state = f"{source_label(doc.source, doc.parent_version)}{', pinned' if doc.pinned else ''}"
    out.print(f"{doc.agent_id} v{doc.version} ({state})")
    evidence = _evidence_columns(doc)
    logits = dict(zip(doc.action_ids, doc.logits, strict=True))
    rows = dict(zip(doc.action_ids, evidence or [], strict=False))
    segments = [k for k in views if k != NO_CONTEXT]
    for name, values in views[NO_CONTEXT].items():
        table = Table(title=f"{name}", title_justify="left")
        columns = ["value", NO_CONTEXT, *segments, "logit", *(("episodes (faded)", "mean reward") if evidence else ())]
        for col in columns:
            table.add_column(col, justify="left" if col == "value" else "right")
        for value_id, p in values.items():
            table.add_row(
                value_id.partition("=")[2],
                f"{p:.4f}",
                *(f"{views[seg][name][value_id]:.4f}" for seg in segments),
                f"{logits[value_id]:+.3f}",
                *(rows.get(value_id, ()) if evidence else ()),
            )
        out.print(table)
    for feature in doc.features or []:
        if feature.kind == "number":
            out.print(f"numeric feature {feature.name}: centre {feature.center:.4g}, scale {feature.scale:.4g}"
                      + ("" if feature.weights else " (not learned yet)"))
        elif not feature.segments:
            out.print(f"categorical feature {feature.name}: no segments learned yet")
    _pinned_and_last_run(doc)


def _evidence_columns(doc: Any) -> list[tuple[str, str]] | None:
    """Per action, the learner state's faded episode count and mean reward (None: no usable state)."""
    from ..learner import Evidence
    evidence, problem = Evidence.from_state(doc.learner_state, len(doc.action_ids))
    if problem or not doc.learner_state:
        return None
    return [
        (f"{n:,.1f}", f"{s / n:.3f}" if n > 0 else "—")
        for n, s in zip(evidence.count.tolist(), evidence.reward_sum.tolist(), strict=True)
    ]


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


def _left_out(histories: list[Any]) -> bool:
    """Say each version document that failed validation (on stderr: the rest is read all the same);
    whether there was one, which makes the command exit with 1."""
    for h in histories:
        for problem in h.invalid:
            _say_left_out(problem, h.agent_id)
    return any(h.invalid for h in histories)


def _say_left_out(problem: Any, agent_id: str) -> None:
    """Name an invalid document on stderr, left out of what the command shows."""
    err.print(Text.assemble(("error:", "bold red"), f" {problem} (left out; agent-learn audit "
                            f"--agent-id {agent_id} checks every document)"), highlight=False, soft_wrap=True)


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
    from ..history import history, source_label
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


def _positive_version(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """VERSION as a policy version number: ``-1`` and ``abc`` are refused in one sentence, and an
    unknown ``--option`` (which ``ignore_unknown_options`` lets through) as what it is."""
    if value.startswith("--"):
        name, known = value.partition("=")[0], [o for p in ctx.command.params for o in p.opts if o.startswith("--")]
        raise click.NoSuchOption(name, possibilities=difflib.get_close_matches(name, known), ctx=ctx)
    if problem := _AsciiDigits.problem(value):  # isdecimal() and int() take other scripts' digits too
        raise click.BadParameter(problem)
    if not value.isdecimal() or int(value) < 1:
        raise click.BadParameter(f"must be a positive integer (a policy version, as policy history lists), "
                                 f"got {value!r}")
    return int(value)


# ignore_unknown_options: `-1` reaches VERSION (to be refused there) rather than read as an option
@policy.command("rollback", context_settings={"ignore_unknown_options": True})
@agent_option
@click.argument("version", callback=_positive_version)
@click.option("--note", default="", callback=_note_text, help="Why (stored with the new version).")
@json_option
@db_option
@_handle_errors
def policy_rollback(agent_id: str, version: int, note: str, as_json: bool, db: str | None) -> None:
    """Publish VERSION's logits as a new version (history is never rewritten)."""
    from ..pipeline import rollback
    with _store(db) as (store, settings):
        try:
            before = _current(store, settings, agent_id).action_ids
        except InvalidDocument:
            before = None  # an invalid current document: the rollback replaces it
        change = rollback(store, agent_id, version, note=note)
    after = change.policy.action_ids  # across a revision the actions change too: say so
    back, gone = [a for a in after if a not in (before or after)], [a for a in before or [] if a not in after]
    done = (f"{agent_id} is now v{change.policy.version}, a copy of v{version}"
            + (f"; actions restored: {back}" if back else "")
            + (f"; actions removed: {gone} (their scores not trained yet are skipped)" if gone else ""))
    if change.replaced_invalid:
        done += (f"; it replaced an invalid current document ({change.replaced_invalid}): training resumes "
                 f"from v{change.resumed_from}'s cursor, the newest valid version record")
    if change.policy.pinned:  # a pin is state of the current document: the rollback keeps it
        done += "; learning stays paused (agent-learn policy unpin resumes it)"
    _report_change(change, as_json, done,
                   f"{agent_id} v{change.policy.version} is already a rollback to v{version}; nothing changed")


@policy.command("revise")
@agent_option
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON file: the complete new list of actions (ids or {id, description, config} objects).",
)
@click.option("--rename", "renames", multiple=True, nargs=2, metavar="OLD NEW",
              help="An action renamed: NEW keeps OLD's logit and evidence (repeatable).")
@click.option("--note", default="", callback=_note_text, help="Why (stored with the new version).")
@json_option
@db_option
@_handle_errors
def policy_revise(agent_id: str, actions_file: str, renames: tuple[tuple[str, str], ...], note: str, as_json: bool,
                  db: str | None) -> None:
    """Change an agent's actions (add, remove, rename) as a new version; history is kept."""
    from ..pipeline import revise
    from ..policy import SoftmaxPolicy
    pairs = dict(renames)
    if len(pairs) < len(renames):
        old = next(o for o in pairs if sum(o == r for r, _ in renames) > 1)
        raise ValueError(f"--rename: {old} is renamed more than once; give each OLD once")
    listed = _read_actions(actions_file)
    if isinstance(listed, dict):
        raise ValueError(
            f"--actions: {actions_file} holds an object with dimensions; policy revise takes the complete new list "
            "of actions, and revising a policy's dimensions is not supported: create a new agent with them"
        )
    try:
        actions = SoftmaxPolicy.from_actions(agent_id, listed, exploration_floor=0.0).actions  # the floor kept: below
    except InvalidDocument as exc:
        raise _actions_problem(exc) from None
    with _store(db) as (store, settings):
        current = _current(store, settings, agent_id)
        if not current.dimensions and current.exploration_floor * len(actions) >= 1:
            fit = math.ceil(1 / current.exploration_floor) - 1
            raise ValueError(
                f"--actions: {len(actions)} actions x the exploration floor {current.exploration_floor} of "
                f"v{current.version} reaches 1 (a revision keeps the floor, each action's minimum probability); "
                f"at most {fit} actions fit"
            )
        change = revise(store, agent_id, list(actions), renames=pairs, note=note)
    _report_change(change, as_json, f"{agent_id} is now v{change.policy.version}: {change.policy.note}",
                   f"{agent_id} v{change.policy.version} already has these actions; nothing changed")


@policy.command("pin")
@agent_option
@click.option("--reason", default="", callback=_note_text, help="Why learning is paused (shown by `policy show`).")
@json_option
@db_option
@_handle_errors
def policy_pin(agent_id: str, reason: str, as_json: bool, db: str | None) -> None:
    """Freeze learning for an agent: the trainer leaves its policy alone until unpinned."""
    from ..pipeline import set_pinned
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        change = set_pinned(store, agent_id, True, reason)
    kept = change.policy.pin_reason
    _report_change(change, as_json, f"{agent_id} v{change.policy.version} is pinned: learning is paused",
                   f"{agent_id} was already pinned" + (f": {kept}" if kept else "")
                   + ("; it keeps that reason, not --reason (unpin, then pin, to change it)"
                      if reason and reason != kept else ""))


@policy.command("unpin")
@agent_option
@json_option
@db_option
@_handle_errors
def policy_unpin(agent_id: str, as_json: bool, db: str | None) -> None:
    """Resume learning; scores that arrived while pinned are learned on the next run."""
    from ..pipeline import set_pinned
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        change = set_pinned(store, agent_id, False)
    _report_change(change, as_json, f"{agent_id} is unpinned: learning resumes", f"{agent_id} was not pinned")


def _report_change(change: Any, as_json: bool, done: str, unchanged: str) -> None:
    if as_json:
        repaired = ({"replaced_invalid": change.replaced_invalid, "resumed_from": change.resumed_from}
                    if change.replaced_invalid else {})  # a rollback over an invalid current document
        _echo_json({"changed": change.changed, "policy": change.policy.to_dict(), **repaired})
    else:
        out.print(done if change.changed else unchanged)


# --------------------------------------------------------------------------- runs


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
    from ..documents import TrainingRun
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


# --------------------------------------------------------------------------- evaluate


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
    from .. import counterfactual as cf  # numpy: only for this command
    from .. import wiring
    from ..evaluation import percent

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
            target, new = cf.candidate_target(store, current, wiring.open_learner(settings), settings.train_max_batch)
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


# --------------------------------------------------------------------------- episodes


@main.group()
def episodes() -> None:
    """Episodes with their scores, judges' reasons and feedback."""


@episodes.command("list")
@click.option("--agent-id", default=None, callback=_agent_id, help="Only this agent's episodes.")
@click.option("--limit", type=COUNT, default=20, show_default=True, help="The newest N episodes.")
@json_option
@db_option
@_handle_errors
def episodes_list(agent_id: str | None, limit: int, as_json: bool, db: str | None) -> None:
    """The newest episodes and their rewards."""
    from ..feedback import score_rows
    from ..pipeline import message_id_of
    with _store(db) as (store, settings):
        docs = store.list_episodes(agent_id, limit)
        if agent_id is not None and not docs:
            _current(store, settings, agent_id)  # no episodes and no policy: an unknown agent
        rows = []
        letters: dict[str, Any] | None = None  # read once, when an episode has neither score nor unjudged record
        for d in docs:
            scores = score_rows(store, str(d.get("id")), str(d.get("agent_id")))
            rejected = _rejected(scores)
            record = None if scores else store.get_unjudged(str(d.get("id")), str(d.get("agent_id")))
            if not scores and not record and letters is None:
                letters = _dead_letters(db)
            letter = None if scores or record else (letters or {}).get(message_id_of(str(d.get("id"))))
            rows.append(
                {
                    "id": d.get("id"),
                    "agent_id": d.get("agent_id"),
                    "action_id": d.get("action_id"),
                    "policy_version": d.get("policy_version"),
                    "ended_at": d.get("ended_at"),
                    "reward": scores[-1].get("reward") if scores and not rejected else None,
                    "judged_reward": scores[0].get("reward") if scores and not rejected else None,
                    "corrections": max(0, len(scores) - 1),
                    "unjudged": record.get("reason") if record else None,
                    "dead_letter": letter.reason if letter else None,
                    "rejected": rejected,
                }
            )
    if as_json:
        _echo_json(rows)
        return
    unread = letters is None and any(r["reward"] is None and not r["unjudged"] and not r["rejected"] for r in rows)
    table = Table(title=_n(len(rows), "newest episode"), title_justify="left")
    for col in ("episode", "agent", "action", "version", "reward", "judged", "corr.", "ended"):
        table.add_column(col, justify="right" if col in ("version", "reward", "judged", "corr.") else "left",
                         no_wrap=col == "episode")
    for r in rows:
        table.add_row(
            str(r["id"]), str(r["agent_id"]), str(r["action_id"]), str(r["policy_version"]),
            _fmt(r["reward"]) if r["reward"] is not None else "rejected" if r["rejected"]
            else "unjudged" if r["unjudged"] else "dead-lettered" if r["dead_letter"]
            else "not scored?" if unread else "not scored",
            _fmt(r["judged_reward"]),
            str(r["corrections"]), str(r["ended_at"])[:19],
        )
    out.print(table)
    if unread:
        out.print("not scored?: not scored yet, or dead-lettered (the dead letters could not be read: "
                  "agent-learn dlq list)")
    if any(r["rejected"] for r in rows):
        out.print("rejected: a score document is invalid, so training skips it (agent-learn episodes show, "
                  "agent-learn audit)")


def _rejected(scores: list[dict[str, Any]]) -> str | None:
    """What is wrong with the first of an episode's score rows that does not validate (training
    rejects it, and the audit counts it so), or None when they all do."""
    from ..documents import Score
    for row in scores:
        try:
            Score.from_dict(row)
        except InvalidDocument as exc:
            return str(exc)
    return None


@episodes.command("show")
@click.argument("episode_id")
@json_option
@db_option
@_handle_errors
def episodes_show(episode_id: str, as_json: bool, db: str | None) -> None:
    """One episode, its score with every judge's reason, its corrections and feedback."""
    from ..documents import Episode
    from ..feedback import score_rows
    from ..pipeline import message_id_of
    with _store(db) as (store, settings):
        doc = store.get_episode(episode_id)
        if doc is None:
            where = _where(settings, how=True)
            raise NotFound(f"EPISODE_ID: no episode {episode_id!r} in {where} (agent-learn episodes list)")
        scores = [_user_fields(s) for s in score_rows(store, episode_id, str(doc.get("agent_id")))]
        feedback = [_user_fields(f) for f in store.list_feedback(episode_id)]
        record = None if scores else store.get_unjudged(episode_id, str(doc.get("agent_id")))
    episode = _user_fields(doc)
    try:
        Episode.from_dict(doc)
        invalid = None
    except InvalidDocument as exc:  # edited by hand, or written around the library: shown as stored
        invalid = str(exc)
    unjudged = _user_fields(record) if record else None
    letters = _dead_letters(db) if not scores and not record else {}
    letter = (letters or {}).get(message_id_of(episode_id))
    dead_letter = _dead_letter_row(letter) if letter else None
    if as_json:
        _echo_json({"episode": episode, "invalid": invalid, "scores": scores, "feedback": feedback,
                    "unjudged": unjudged, "dead_letter": dead_letter})
        return
    if invalid:
        out.print(f"{episode_id} as stored is an {invalid} (the scorer dead-letters such an episode)", highlight=False)
    out.print(Text.assemble((episode_id, "bold"), f": agent {episode.get('agent_id')}, action "
                            f"{episode.get('action_id')} (p={_fmt(episode.get('probability'), 4)}) under "
                            f"v{episode.get('policy_version')}, {str(episode.get('ended_at'))[:19]}"))
    out.print(f"input: {str(episode.get('input', ''))[:300]}", highlight=False)
    out.print(f"output: {str(episode.get('output', ''))[:300]}", highlight=False)
    for step in episode.get("steps", []):
        error = f" — {step.get('error')}" if step.get("error") else ""
        out.print(f"  step {step.get('name')} ({step.get('kind')}): {step.get('status')}, "
                  f"{_ms(step.get('latency_ms'))}{error}", highlight=False)
    if unjudged:
        why = "sampled out" if unjudged.get("reason") == "sampled_out" else "over the rate"
        out.print(f"not judged: {why} by AGENT_LEARNING_JUDGING {unjudged.get('rule')} "
                  f"({str(unjudged.get('recorded_at'))[:19]}); agent-learn rescore --unjudged judges it")
    elif dead_letter:
        tries = _n(dead_letter["delivery_count"], "delivery attempt")
        out.print(f"dead-lettered: {dead_letter['reason']} after {tries}"
                  f" ({str(dead_letter['dead_lettered_at'])[:19]}): {dead_letter['description']}; it is scored "
                  "only if replayed (agent-learn dlq replay --id ...)", highlight=False)
    elif not scores:
        out.print("not scored yet" if letters is not None
                  else "not scored yet, or dead-lettered (the dead letters could not be read: agent-learn dlq list)")
    elif rejected := _rejected(scores[:1]):
        out.print(f"score {scores[0].get('id')} rejected: {rejected}; training skips it (agent-learn audit)",
                  highlight=False)
    else:
        base = scores[0]
        table = Table(title=f"judged reward {base['reward']:.3f} ({base['reward_function']['version']})",
                      title_justify="left")
        for col in ("metric", "raw", "normalised", "result", "reason"):
            table.add_column(col, justify="right" if col in ("raw", "normalised") else "left")
        for name, m in base.get("metrics", {}).items():
            result = str(m.get("result") or "")
            table.add_row(name, f"{m['raw']:g}", f"{m['normalised']:.3f}", result, m.get("reason", ""))
        out.print(table)
        for c in scores[1:]:
            if rejected := _rejected([c]):
                out.print(f"correction {c.get('id')} rejected: {rejected}; training skips it", highlight=False)
                continue
            out.print(f"correction r{c['revision']}: reward {c['reward']:.3f} ({c['reward_delta']:+.3f}), "
                      f"{str(c['scored_at'])[:19]}")
    for f in feedback:
        verdict = f"thumb {f['thumb']}" if f.get("thumb") else f"score {f.get('score')}"
        out.print(f"feedback from {f['source']}: {verdict}{' — ' + f['comment'] if f.get('comment') else ''}",
                  highlight=False)


FEEDBACK_OPTIONS = {"episode_id": "EPISODE_ID", "source": "--source", "comment": "--comment", "score": "--score",
                    "thumb": "--up/--down"}
"""The argument or option of ``agent-learn feedback`` behind each field of a feedback document."""


@main.command()
@click.argument("episode_id")
@click.option("--up", is_flag=True, help="Thumbs up.")
@click.option("--down", is_flag=True, help="Thumbs down.")
@click.option("--score", type=FloatRange(0, 1), default=None, help="A score from 0 to 1 instead of a thumb.")
@click.option("--source", default="user", show_default=True, help="Who gives it: one feedback per source.")
@click.option("--comment", default="", help="Why, in the user's words (stored with the feedback).")
@json_option
@db_option
@_handle_errors
def feedback(
    episode_id: str, up: bool, down: bool, score: float | None, source: str, comment: str, as_json: bool,
    db: str | None,
) -> None:
    """Attach a user's feedback to an episode; its reward is corrected exactly once."""
    from ..feedback import record_feedback
    from ..pipeline import message_id_of
    if up + down + (score is not None) != 1:
        raise ValueError("--up/--down/--score: give exactly one")
    if score is not None and not math.isfinite(score):
        raise ValueError(f"--score: {score} is not in the range 0<=x<=1.")
    thumb = "up" if up else "down" if down else None
    with _store(db) as (store, _):
        try:
            result = record_feedback(store, episode_id, thumb=thumb, score=score, source=source, comment=comment)
        except InvalidDocument as exc:
            if exc.kind != "feedback":
                raise
            raise ValueError("; ".join(f"{FEEDBACK_OPTIONS.get(name, name)}: {problem}"
                                       for name, problem in exc.problems)) from None
        except NotFound as exc:
            raise NotFound(f"EPISODE_ID: {str(exc).removeprefix('episode_id: ')}") from None
        unlearned = "" if result.reconciled.status == "unchanged" else _not_learned(store, result.feedback)
        agent_id = result.feedback.agent_id
        left_out = store.get_unjudged(episode_id, agent_id) if result.reconciled.status == "waiting" else None
    data = result.to_dict()
    if as_json:
        _echo_json(data)
        return
    if data["status"] == "corrected":
        said = f"stored; reward now {data['reward']:.3f} ({data['reward_delta']:+.3f})" + (unlearned or (
            ", learned from by the next training run that has new episodes (or a full batch of corrections)"))
    elif data["status"] == "unchanged":
        said = "stored; the reward already reflects it"
    elif data["status"] == "rejected":
        said = (f"stored, but not learned: the episode's score document is an {data['problem']}, so training "
                "skips the episode (agent-learn audit counts it rejected)")
    elif left_out is not None:
        said = (f"stored; AGENT_LEARNING_JUDGING left the episode unjudged ({left_out.get('reason')}), so it is "
                f"applied once `agent-learn rescore --agent-id {agent_id} --unjudged` judges it{unlearned}")
    elif (letter := (_dead_letters(db) or {}).get(message_id_of(episode_id))) is not None:
        said = (f"stored; the episode was dead-lettered ({letter.reason}), so it is applied only once "
                f"`agent-learn dlq replay --id {message_id_of(episode_id)}` has it scored{unlearned}")
    else:  # waiting: the episode has no score yet (not scored, or left unjudged)
        said = f"stored; it is applied when the episode is scored{unlearned}"
    out.print(f"feedback {data['feedback_id']}: {said}")


def _not_learned(store: Any, feedback: Any) -> str:
    """Why the reward feedback changed will not be learned when training runs next ("" if it
    will be): the episode's action is not in its agent's current policy (the trainer skips its
    rows), or its agent has no policy."""
    from ..pipeline import load_current
    from ..structured import knows_action
    episode = store.get_episode(feedback.episode_id) or {}
    action_id = str(episode.get("action_id"))
    try:
        current = load_current(store, feedback.agent_id)
    except InvalidDocument:
        return ""  # the trainer does not train it either, until the document is fixed: audit says so
    if current is None:
        return f", but not learned: {feedback.agent_id!r} has no policy (agent-learn agent list)"
    if knows_action(current, action_id):
        return ""
    return (f", but not learned: action {action_id!r} is not in {feedback.agent_id} v{current.version} (a "
            "revision removed or renamed it), so training skips it unless a rollback restores the action first")


# --------------------------------------------------------------------------- dead letters


@contextmanager
def _queues(db: str | None, name: str | None = None, *, scoring: bool = False) -> Iterator[tuple[dict[str, Any], Any]]:
    """The deployment's queues by name, the scoring queue first, then the training queue (``name``:
    only that one; ``scoring``: only the scoring queue), and the settings; closed afterwards."""
    from .. import wiring
    settings = _settings(db)
    kinds = {settings.queue_name: wiring.open_queue, settings.train_queue_name: wiring.open_train_queue}
    if name is not None and name not in kinds:
        raise ValueError(f"--queue: {name!r} is not a queue of this deployment: {' or '.join(kinds)} "
                         "(AGENT_LEARNING_QUEUE_NAME, AGENT_LEARNING_TRAIN_QUEUE_NAME)")
    if scoring:
        name = settings.queue_name
    if settings.queue == "sqlite":
        _existing(settings.model_copy(update={"store": "sqlite"}))  # the embedded queues live in that file
    queues: dict[str, Any] = {}
    try:
        for queue_name, open_queue in kinds.items():
            if name in (None, queue_name):
                with _embedded(settings, "queue"):
                    queues[queue_name] = open_queue(settings)
        yield queues, settings
    finally:
        for queue in queues.values():
            queue.close()


def _dead_letter_row(d: Any) -> dict[str, Any]:
    """A dead letter as ``dlq list --json`` shows it."""
    return {
        "message_id": d.message_id,
        "reason": d.reason,
        "description": d.description,
        "delivery_count": d.delivery_count,
        "dead_lettered_at": _iso(datetime.fromtimestamp(d.dead_lettered_at, UTC)) if d.dead_lettered_at else None,
        "properties": dict(d.properties),
        "body": d.body.decode("utf-8", errors="replace"),
    }


def _dead_letters(db: str | None) -> dict[str, Any] | None:
    """The queue's dead letters by message id (an episode's is ``message_id_of`` its id), or None
    when the queue cannot list them: episodes are shown all the same."""
    from ..audit import DEAD_LETTER_LIMIT
    try:
        with _queues(db, scoring=True) as (queues, settings):
            return {d.message_id: d for d in queues[settings.queue_name].dead_letters(DEAD_LETTER_LIMIT)}
    except Exception:  # Service Bus unreachable, no rights to peek: the store's view stands
        return None


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
    from ..recovery import REPLAY_LIMIT, replay_dead_letters
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


# --------------------------------------------------------------------------- rescore


@main.command()
@agent_option
@click.option("--episode-id", "episode_ids", multiple=True, help="Only this episode (repeatable; default: all).")
@click.option("--rejudge", is_flag=True, help="Judge them again (default: keep the metrics, reshape the reward).")
@click.option("--unjudged", is_flag=True,
              help="Judge the episodes AGENT_LEARNING_JUDGING left unjudged instead (learned once each).")
@click.option("--limit", type=COUNT, default=None,
              help="With --unjudged: judge at most N (in episode-id order: a random part of the backlog).")
@json_option
@db_option
@_handle_errors
def rescore(agent_id: str, episode_ids: tuple[str, ...], rejudge: bool, unjudged: bool, limit: int | None,
            as_json: bool, db: str | None) -> None:
    """Score an agent's episodes again with the settings' reward function (and judge, with --rejudge).

    Episodes a published version already learned from keep the update they made: their new
    score is recorded, not learned again. Episodes not trained yet are learned once, with their
    new score. With --unjudged, judge the episodes the agent's judging rule left unjudged: each
    is learned once, by the next training run; running it again judges only those still
    unjudged. Exits with 1 when an episode could not be (re-)scored (it keeps what it had)."""
    from .. import wiring
    from ..recovery import rescore as run_rescore
    if unjudged and (episode_ids or rejudge):
        raise ValueError("--unjudged: judges every episode recorded unjudged (up to --limit); "
                         "it takes neither --episode-id nor --rejudge")
    if limit is not None and not unjudged:
        raise ValueError("--limit: only with --unjudged")
    if unjudged:
        _judge_unjudged(agent_id, limit, as_json, db)
        return
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        with _progress("re-scoring", transient=True) as bar:
            task = bar.add_task("re-scoring", total=len(set(episode_ids)) if episode_ids else None)
            result = run_rescore(
                store,
                wiring.open_scorer(settings, store),
                agent_id,
                episode_ids=list(episode_ids) if episode_ids else None,
                rejudge=rejudge,
                progress=lambda n: bar.update(task, completed=n),
            )
    failed = [{"episode_id": e, "reason": r, "description": d} for e, r, d in result.failed]
    if as_json:
        _echo_json({"already_trained": result.already_trained, "lost": result.lost, "pending": result.pending,
                    "failed": failed})
    else:
        out.print(f"re-scored {_n(result.rescored, 'episode')} of {agent_id}")
        out.print(
            f"already trained ({len(result.already_trained)}; recorded, not learned again): "
            + _ids(result.already_trained)
        )
        if result.lost:
            out.print(f"lost ({len(result.lost)}; no run learned their earlier score and none reads behind the"
                      " cursor: recorded, not learned): " + _ids(result.lost))
        out.print(f"pending ({len(result.pending)}; learned once, with the new score): " + _ids(result.pending))
        for f in failed:
            out.print(f"failed: {f['episode_id']}: {f['reason']}: {f['description']}")
    if failed:
        sys.exit(1)


def _judge_unjudged(agent_id: str, limit: int | None, as_json: bool, db: str | None) -> None:
    from .. import wiring
    from ..recovery import judge_unjudged
    with _store(db) as (store, settings):
        _current(store, settings, agent_id)
        with _progress("judging", transient=True) as bar:
            task = bar.add_task("judging", total=limit)
            result = judge_unjudged(store, wiring.open_scorer(settings, store), agent_id, limit=limit,
                                    progress=lambda n: bar.update(task, completed=n))
    failed = [{"episode_id": e, "reason": r, "description": d} for e, r, d in result.failed]
    if as_json:
        _echo_json({"judged": result.judged, "duplicates": result.duplicates, "failed": failed,
                    "stopped": result.stopped, "more": result.more})
    else:
        out.print(f"judged {_n(len(result.judged), 'unjudged episode')} of {agent_id} (each learned once, by the next "
                  f"training run): " + _ids(result.judged))
        if result.duplicates:
            out.print(f"judged meanwhile ({len(result.duplicates)}): " + _ids(result.duplicates))
        for f in failed:
            out.print(f"failed: {f['episode_id']}: {f['reason']}: {f['description']} (it stays unjudged)")
        stuck = len(failed) - bool(result.stopped)  # a stopped run's last failure is worth retrying
        if stuck:
            out.print(f"not judged, for a reason retrying does not fix: {_n(stuck, 'episode')}; each run tries "
                      "them again without counting them against --limit, so it goes on to the others")
        if result.stopped:
            out.print(f"stopped: {result.stopped}")
        if result.more:
            out.print("more episodes remain unjudged: run it again (agent-learn audit counts them)")
    if failed:
        sys.exit(1)


# --------------------------------------------------------------------------- report


@main.command()
@click.option("--agent-id", "agent_ids", multiple=True, callback=_agent_id,
              help="Agents to chart (repeatable; default: every agent).")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default="agent-learning-report.png",
              callback=_ending(".png"),
              show_default=True, help="Where to write the chart.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default="agent-learning-report.html",
              callback=_ending(".html", ".htm"),
              show_default=True, help="Where to write the page (the chart and a table of every version).")
@click.option("--title", default="agent-learning report", show_default=True, help="Title of the chart and page.")
@click.option("--last", type=COUNT, default=None, help="Only the newest N versions of each agent.")
@version_window_options
@click.option("--smooth", type=COUNT, default=None,
              help="Draw reward and entropy as means over N versions (default: none up to 100 versions, "
                   "then a fiftieth of them).")
@json_option
@db_option
@_handle_errors
def report(agent_ids: tuple[str, ...], png_path: str, html_path: str, title: str, last: int | None,
           since: datetime | None, until: datetime | None, smooth: int | None, as_json: bool, db: str | None
           ) -> None:
    """Charts of every policy version (PNG and a self-contained HTML page); rollbacks, revisions
    and a pin are marked.

    Exits with 1 if a version document or an agent's current one is invalid (it is named, and
    the versions are charted)."""
    from ..history import history
    from ..report import write_report
    since, until = _utc_window(since, until)
    _writable("--png", png_path)
    _writable("--html", html_path)
    with _store(db) as (store, settings):
        agents = list(dict.fromkeys(agent_ids)) or store.list_agents()  # each agent once, as given
        if not agents:
            raise NotFound(f"no agent has a policy in {_where(settings, how=True)}")
        # an invalid current document is said, and its versions are charted: a rollback chooses from them
        currents = {a: _current_or_said(store, settings, a) for a in agents}
        histories, headings = [], {}
        windowed = since is not None or until is not None
        with _progress("reading policy versions", as_json) as bar:
            task = bar.add_task("agents", total=len(agents))
            for agent_id in agents:
                h = history(store, agent_id, last, since=since, until=until)
                histories.append(h)
                headings[agent_id] = _versions_read(store, agent_id, currents[agent_id], len(h.versions), last,
                                                    windowed, bool(h.invalid) or currents[agent_id] is None,
                                                    "charted")
                bar.advance(task)
    invalid = _left_out(histories) or any(c is None for c in currents.values())
    empty = [h.agent_id for h in histories if not h.versions and not h.invalid]
    if empty:
        raise _no_versions_in(empty)
    histories = [h for h in histories if h.versions]  # an agent whose every version is invalid: said above
    if not histories:
        sys.exit(1)
    try:
        files = write_report(histories, png_path, html_path, title, smooth, headings)
    except RuntimeError as exc:  # matplotlib missing
        raise ConfigurationError(str(exc)) from None
    summary = {"png": str(files.png), "html": str(files.html),
               "agents": {h.agent_id: {"versions": len(h.versions), "series": files.series[h.agent_id]}
                          for h in histories}}
    if as_json:
        _echo_json(summary)
        sys.exit(1 if invalid else 0)
    for h in histories:
        out.print(f"{h.agent_id}: {headings[h.agent_id]}; series per chart (probabilities, reward, entropy) "
                  f"{files.series[h.agent_id]}")
    out.print(f"wrote {files.png} and {files.html}")
    if invalid:
        sys.exit(1)


TRAINING_FAILED = ("invalid_policy", "unavailable", "failed")
"""Training outcomes that make ``agent-learn train`` exit with 1."""


@main.command()
@click.option("--agent-id", default=None, callback=_agent_id, help="Train one agent (default: every agent).")
@click.option("--limit", type=IntRange(1, None), default=None,
              help="Score at most this many episodes and learn from at most this many per agent (default: all).")
@json_option
@db_option
@_handle_errors
def train(agent_id: str | None, limit: int | None, as_json: bool, db: str | None) -> None:
    """Enqueue and score new episodes, apply feedback left unapplied, then run one training step
    (what the timer does).

    Exits with 1 if an episode could not be scored (it is tried again on a later run) or an agent
    could not be trained (the others are scored and trained all the same)."""
    from ..feedback import sweep
    from ..local import open_local
    settings = _existing(_settings(db))
    with _embedded(settings, "store"):
        pipeline = open_local(settings)
    try:
        if agent_id is not None:
            with suppress(StoredDocumentInvalid):  # an invalid policy is what training reports, as for every agent
                _current(pipeline.store, settings, agent_id)  # an unknown agent is bad input, as everywhere
        enqueued = pipeline.pump()
        with _progress("scoring", as_json) as bar:
            task = bar.add_task("score", total=enqueued or None)
            # Messages already waiting (a replayed dead letter, an earlier run's leftovers) are scored
            # too: the total grows with them rather than read 3/2.
            outcomes = pipeline.score_pending(
                max_messages=limit, progress=lambda n: bar.update(task, completed=n, total=max(n, enqueued) or None)
            )
        sweep(pipeline.store, clock=pipeline.clock)
        results = pipeline.train([agent_id] if agent_id else None, limit=limit)
    finally:
        pipeline.close()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "enqueued": enqueued,
                    "outcomes": dict(outcomes),  # as demo --json and LocalPipeline.run_once name them
                    "scored": dict(outcomes),  # the same, under the name it had first (scripts read it)
                    "training": [
                        {
                            "agent_id": r.agent_id,
                            "status": r.status,
                            "version": r.version,
                            "reason": r.reason,
                            "episodes": r.run.episodes if r.run else 0,
                            # corrections alone have no batch mean, as in the text
                            "mean_reward": r.run.metrics["mean_reward"] if r.run and r.run.episodes else None,
                        }
                        for r in results
                    ],
                },
                indent=2,
            )
        )
    else:
        out.print(f"enqueued {enqueued}; scoring outcomes: {_counts(outcomes)}")
        for r in results:
            line = f"{r.agent_id}: {r.status}" + (
                f" → v{r.version}" if r.status == "published" else f" (v{r.version} stays current)" if r.version else ""
            )
            if r.run and r.run.episodes:
                line += f" ({_n(r.run.episodes, 'episode')}, mean reward {r.run.metrics['mean_reward']:.3f})"
            if r.reason:  # for a publish: the guardrail in warn mode found the candidate worse
                line += f" — {'published although ' if r.status == 'published' else ''}{r.reason}"
            out.print(line)
    if outcomes["failed"] and not as_json:
        out.print(f"{outcomes['failed']} episode(s) could not be scored (the warning above says why); each is tried"
                  " again on a later run and dead-lettered after the queue's max deliveries")
    if outcomes["retry"] and not as_json:
        out.print(f"{_n(outcomes['retry'], 'scoring attempt')} found the judge unavailable (the warning above says"
                  " why); each episode is tried again on a later run and dead-lettered after the queue's max"
                  " deliveries (`agent-learn dlq replay` sends it back)")
    if outcomes["failed"] or outcomes["retry"] or any(r.status in TRAINING_FAILED for r in results):
        sys.exit(1)  # every episode and agent was tried; what failed is listed above


LOCAL_SETTINGS = "local.settings.json"
"""The Functions host's settings file, which ``config`` compares with what the command line reads."""


@main.command("config")
@json_option
@db_option
@_handle_errors
def config_command(as_json: bool, db: str | None) -> None:
    """Every effective setting and where it came from: an environment variable (the
    azure-agents-learning-sdk's names under their own), implied by one, --db, or the default.
    Settings only ./local.settings.json sets are marked: func start reads that file, agent-learn does not."""
    from ..config import effective_settings
    from ..documents import parse_json

    overrides = {"sqlite_path": db} if db else {}
    local = Path(LOCAL_SETTINGS)
    values = parse_json(local.read_text()).get("Values", {}) if local.is_file() else {}
    rows = effective_settings(_settings(db), overrides, local_settings=values if isinstance(values, dict) else {})
    if as_json:
        _echo_json([{"setting": r.setting, "variable": r.variable, "value": r.value, "source": r.source,
                     "origin": r.origin or None} for r in rows])
        return
    for r in rows:
        source = {"environment": f"environment:{r.origin}", "implied": f"implied by {r.origin}", "option": "--db",
                  LOCAL_SETTINGS: f"{LOCAL_SETTINGS} (func start only)"}.get(r.source, r.source)
        value = "" if r.value is None else r.value if isinstance(r.value, str) else json.dumps(r.value)
        out.print(f"{source:<48} {r.variable}={value}")


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
        from ..recovery import migrate_scores

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
    from ..audit import audit as run_audit
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


if __name__ == "__main__":  # pragma: no cover
    main()
