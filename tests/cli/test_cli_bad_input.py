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


pytestmark = pytest.mark.usefixtures("embedded_env")


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
        "an empty agent id": ["policy", "show", "--agent-id", ""],
        "a missing option": ["policy", "show"],
        "an unknown option": ["policy", "show", "--agent-id", "a", "--bogus"],
        "an unknown command": ["nosuch"],
        "a number out of range": ["runs", "list", "--agent-id", "a", "--limit", "0"],
        "a word for a number": ["demo", "--episodes", "many"],
        "a note too long": ["policy", "rollback", "--agent-id", "a", "2", "--note", "n" * 1_001],
        "a pin reason too long": ["policy", "pin", "--agent-id", "a", "--reason", "r" * 1_001],
    }


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    failures = []
    for case, args in bad_inputs(tmp_path).items():
        result = runner.invoke(main, args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        one_line = len(lines) == 1 and lines[0].startswith("error: ")
        if result.exit_code != 2 or not isinstance(result.exception, SystemExit) or not one_line:
            failures.append((case, result.exit_code, repr(result.exception), result.output[-300:]))
    assert not failures, failures


def test_an_actions_file_naming_a_key_twice_is_refused_not_cut_to_the_last(tmp_path: Path) -> None:
    """Before the fix `{"k": 1, "k": 3}` made the action's config {"k": 3} without a word."""
    actions = tmp_path / "dup.json"
    actions.write_text('[{"id": "a", "config": {"k": 1, "k": 3}}, {"id": "b"}]')
    result = CliRunner().invoke(main, ["init-policy", "--agent-id", "a", "--actions", str(actions)])
    assert result.exit_code == 2, result.output
    assert result.output == f"error: --actions: {actions} names 'k' twice in one object; only the last would count\n"
    assert not (tmp_path / "local.db").exists()


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


def test_errors_name_the_option_in_plain_words(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["policy", "show", "--agent-id", ""]).output.strip() == (
        "error: --agent-id: agent id must not be empty"
    )
    bad = runner.invoke(main, ["init-policy", "--agent-id", "bad id", "--actions", "x.json"]).output
    assert bad.startswith("error: --agent-id: 'bad id' is not an agent id: use letters, digits")
    assert "pattern" not in bad and "^" not in bad
    assert runner.invoke(main, ["policy", "show"]).output.strip() == "error: --agent-id: is required"
    long_reason = runner.invoke(main, ["policy", "pin", "--agent-id", "a", "--reason", "r" * 1_200]).output.strip()
    assert long_reason == "error: --reason: is 1,200 characters; at most 1,000 are stored"  # not cut unsaid


def test_every_command_and_option_says_what_it_is_for() -> None:
    import click

    def commands(group: click.Group, path: str) -> list[tuple[str, click.Command]]:
        found = []
        for name, command in group.commands.items():
            found.append((f"{path} {name}", command))
            if isinstance(command, click.Group):
                found.extend(commands(command, f"{path} {name}"))
        return found

    missing = [
        f"{path} {param.opts[0]}"
        for path, command in commands(main, "agent-learn")
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not param.help
    ]
    missing += [path for path, command in commands(main, "agent-learn") if not command.help]
    assert not missing, missing


@pytest.mark.parametrize("version", ["-1", "0", "abc", "1.5"])
def test_a_rollback_version_must_be_a_positive_integer(version: str) -> None:
    result = CliRunner().invoke(main, ["policy", "rollback", "--agent-id", "a", version])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: VERSION: must be a positive integer (a policy version, as policy "
                                     f"history lists), got {version!r}")


@pytest.mark.parametrize("args, name, value", [
    (["policy", "rollback", "--agent-id", "a", "١٢"], "VERSION", "١٢"),  # Arabic-Indic 12
    (["policy", "rollback", "--agent-id", "a", "１２"], "VERSION", "１２"),  # fullwidth 12
    (["evaluate", "--agent-id", "a", "--version", "٣"], "--version", "٣"),
    (["policy", "history", "--agent-id", "a", "--limit", "٢"], "--limit", "٢"),
    (["report", "--last", "٥"], "--last", "٥"),
    (["demo", "--seed", "٧"], "--seed", "٧"),
    (["evaluate", "--agent-id", "a", "--confidence", "٠.٩"], "--confidence", "٠.٩"),
    (["feedback", "ep-1", "--score", "٠.٥"], "--score", "٠.٥"),
    (["init-policy", "--exploration-floor", "٠.١", "--agent-id", "a", "--actions", "x.json"],
     "--exploration-floor", "٠.١"),
])
def test_a_number_in_other_digits_is_refused_naming_its_argument(args: list[str], name: str, value: str) -> None:
    """Before the fix `policy rollback ... ١٢` rolled back to v12: int() reads every script's digits."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {name}: {value!r} is not a number in ASCII digits (0-9)"


def test_a_rollback_with_an_unknown_option_names_the_option_not_version() -> None:
    """Unknown options reach VERSION (so that ``-1`` is refused there); a ``--name`` is still one."""
    result = CliRunner().invoke(main, ["policy", "rollback", "--agent-id", "a", "--not", "2"], prog_name="agent-learn")
    assert result.exit_code == 2
    assert result.output.strip() == ("error: No such option '--not'. Did you mean '--note'? "
                                     "(agent-learn policy rollback --help)")
