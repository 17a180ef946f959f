"""Running `agent-learn` in-process for the CLI tests: settings cleared, then the command."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner, Result

from agent_learning.cli import main

SETTING_PREFIXES = ("AGENT_LEARNING_", "CosmosDBConnection", "ServiceBusConnection")


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every setting the library reads (and COLUMNS, which changes the tables' width), so a
    test sees the defaults plus what it sets itself."""
    for name in list(os.environ):
        if name.startswith(SETTING_PREFIXES) or name == "COLUMNS":
            monkeypatch.delenv(name)


def cli(*args: str) -> Result:
    """``agent-learn ARGS`` in-process; the result holds exit code, stdout and stderr."""
    return CliRunner().invoke(main, list(args))


def ok(*args: str) -> Result:
    """``agent-learn ARGS``, which must exit with 0."""
    result = cli(*args)
    assert result.exit_code == 0, (args, result.output)
    return result
