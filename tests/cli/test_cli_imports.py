"""``agent-learn`` imports only click, rich and its command tree to start: what a command uses is
imported when it runs, so the help and a usage error take a fraction of a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("numpy", "pydantic", "pydantic_settings", "opentelemetry", "azure", "agent_learning.judges",
         "agent_learning.documents", "agent_learning.app.settings", "agent_learning.pipeline")
"""Packages and library modules the command tree must not import (directly or through another)."""

PROBE = """
import json, sys
import agent_learning.cli as cli
try:
    cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize(("args", "code"), [([], 0), (["--help"], 0), (["policy", "show", "--agent-id", "a b"], 2),
                                            (["demo", "--episodes", "0"], 2), (["no-such-command"], 2),
                                            (["logs", "export", "--agent-id", "a b"], 2)])
def test_the_help_and_a_usage_error_import_nothing_heavy(args: list[str], code: int) -> None:
    shared = str(Path(__file__).resolve().parents[2] / "shared")  # the library, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [shared, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, env=env)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["code"] == code, out.stderr
    loaded = [m for m in result["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert loaded == []
