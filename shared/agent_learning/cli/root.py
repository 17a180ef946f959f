"""The ``agent-learn`` command group: usage errors and command errors as one line with an exit code."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from agent_learning.cli.output import _fail, _with_notes
from agent_learning.core.errors import (
    AgentLearningError,
    ConcurrencyConflict,
    ConfigurationError,
    InvalidDocument,
    NotFound,
    StoredDocumentInvalid,
)

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
