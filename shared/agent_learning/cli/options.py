"""Option types and callbacks the commands share: ASCII numbers, agent ids, paths, notes, time windows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from agent_learning.cli.output import _iso
from agent_learning.core.errors import NotFound
from agent_learning.core.limits import agent_id_problem


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


def _note_text(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A --note or --reason: refused over :data:`MAX_NOTE_CHARS` rather than cut unsaid."""
    from agent_learning.documents import MAX_NOTE_CHARS
    if len(value) > MAX_NOTE_CHARS:
        raise click.BadParameter(f"is {len(value):,} characters; at most {MAX_NOTE_CHARS:,} are stored")
    return value


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
