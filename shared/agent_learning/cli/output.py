"""Console output of the CLI: literal consoles, one-line errors, JSON, numbers for people and progress."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text


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


def _fail(message: str, code: int) -> None:
    # One line however long: a wrapped message reads as two.
    err.print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    sys.exit(code)


def _with_notes(exc: BaseException) -> str:
    """An error's message and its notes (``add_note``: what to do about it), as one line."""
    return "; ".join([str(exc), *getattr(exc, "__notes__", ())])


IDS_SHOWN = 10
"""Ids a table-form listing shows before "… and N more" (``--json`` lists them all)."""


def _ids(ids: list[str]) -> str:
    """The first :data:`IDS_SHOWN` of ``ids``, comma-separated, and how many more (``-`` for none)."""
    more = len(ids) - IDS_SHOWN
    return (", ".join(ids[:IDS_SHOWN]) or "-") + (f", … and {more} more (--json lists them all)" if more > 0 else "")


def _counts(counts: Mapping[str, int]) -> str:
    """``scored 2, failed 1`` (or ``none``): counts by name as a reader reads them, not a dict."""
    return ", ".join(f"{name} {count:,}" for name, count in counts.items()) or "none"


def _n(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1: ``1 version``, ``2 versions``."""
    return f"{count} {noun if count == 1 else noun + 's'}"


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
    from agent_learning.policy.softmax import is_number
    if value is None:
        return ""
    return f"{value:.{digits}f}" if is_number(value) else f"{value!r:.40}"


def _ms(value: float | None) -> str:
    """A latency for people: ``628.7 ms``, ``0.002 ms``, ``12.3 s``."""
    from agent_learning.policy.softmax import is_number
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
