"""``agent-learn config``: every effective setting and where it came from."""

from __future__ import annotations

import json
from pathlib import Path

from agent_learning.cli.access import _settings
from agent_learning.cli.options import db_option, json_option
from agent_learning.cli.output import _echo_json, out
from agent_learning.cli.root import _handle_errors, main

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
    from agent_learning.app.settings import effective_settings
    from agent_learning.documents import parse_json

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
