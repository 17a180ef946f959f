"""Bad input to `agent-learn` ends with exit 2 and one line naming the problem, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rich")
from click.testing import CliRunner

from agent_learning.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("AGENT_LEARNING_") or name.startswith("CosmosDBConnection"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(tmp_path / "local.db"))


def bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    files = {"ints.json": [1, 2], "null.json": [None, "b"], "object.json": {"id": "a"}, "nested.json": [[1]]}
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    (tmp_path / "broken.json").write_text("[")
    (tmp_path / "not-a-db.db").write_text("hello, not SQLite")
    not_db = str(tmp_path / "not-a-db.db")
    init = ["init-policy", "--agent-id", "a"]
    return {
        "actions of integers": [*init, "--actions", str(tmp_path / "ints.json")],
        "an action of null": [*init, "--actions", str(tmp_path / "null.json")],
        "actions as an object": [*init, "--actions", str(tmp_path / "object.json")],
        "a nested action": [*init, "--actions", str(tmp_path / "nested.json")],
        "actions not JSON": [*init, "--actions", str(tmp_path / "broken.json")],
        "actions missing": [*init, "--actions", str(tmp_path / "missing.json")],
        "a bad agent id": ["init-policy", "--agent-id", "a/b", "--actions", str(tmp_path / "null.json")],
        "a file that is not SQLite (policy)": ["policy", "show", "--agent-id", "a", "--db", not_db],
        "a file that is not SQLite (dlq)": ["dlq", "list", "--db", not_db],
        "a file that is not SQLite (audit)": ["audit", "--db", not_db],
        "a file that is not SQLite (train)": ["train", "--db", not_db],
        "thumbs up and down": ["feedback", "ep-1", "--up", "--down"],
        "a thumb and a score": ["feedback", "ep-1", "--up", "--score", "0.5"],
        "no verdict": ["feedback", "ep-1"],
        "an unknown agent": ["policy", "show", "--agent-id", "nobody"],
        "an unknown version": ["policy", "rollback", "--agent-id", "nobody", "3"],
        "an unknown run": ["runs", "show", "nobody:run:v2"],
        "an unknown episode": ["episodes", "show", "nobody"],
        "a bad setting": ["policy", "show", "--agent-id", "a", "--db", ""],
    }


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    failures = []
    for case, args in bad_inputs(tmp_path).items():
        result = runner.invoke(main, args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        if result.exit_code != 2 or not isinstance(result.exception, SystemExit) or len(lines) > 3:
            failures.append((case, result.exit_code, repr(result.exception), result.output[-300:]))
    assert not failures, failures


def test_no_traceback_reaches_the_terminal(tmp_path: Path) -> None:
    """The same through the installed entry point, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "shared")}
    for case in ("actions of integers", "a file that is not SQLite (policy)", "thumbs up and down"):
        args = bad_inputs(tmp_path)[case]
        done = subprocess.run([sys.executable, "-m", "agent_learning.cli", *args], capture_output=True, text=True,
                              env=env, timeout=60, check=False)
        assert done.returncode == 2, (case, done.stderr)
        assert "Traceback" not in done.stderr + done.stdout, (case, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: "), (case, done.stderr)
