"""The outer environment's settings, kept out of a test (without importing the library: the
CLI sizes its consoles when it is imported)."""

from __future__ import annotations

import os

import pytest

SETTING_PREFIXES = ("AGENT_LEARNING_", "CosmosDBConnection", "ServiceBusConnection")


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every setting the library reads (and COLUMNS, which changes the tables' width), so a
    test sees the defaults plus what it sets itself."""
    for name in list(os.environ):
        if name.startswith(SETTING_PREFIXES) or name == "COLUMNS":
            monkeypatch.delenv(name)
