"""Running `agent-learn` in-process for the CLI tests: settings cleared, then the command."""

from __future__ import annotations

from clean_settings import clear_settings
from click.testing import CliRunner, Result

from agent_learning.cli import main

__all__ = ["clear_settings", "cli"]


def cli(*args: str) -> Result:
    """``agent-learn ARGS`` in-process; the result holds exit code, stdout and stderr."""
    return CliRunner().invoke(main, list(args))


def ok(*args: str) -> Result:
    """``agent-learn ARGS``, which must exit with 0."""
    result = cli(*args)
    assert result.exit_code == 0, (args, result.output)
    return result
