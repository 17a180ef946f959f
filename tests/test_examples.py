"""The shipped example: ``examples/support_agent.py`` runs as a user runs it and its policy learns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_learning.pipeline import load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "support_agent.py"


def clean_env() -> dict[str, str]:
    """The environment without this project's or the model's settings, the library importable."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_LEARNING_", "OPENAI_"))}
    return {**base, "PYTHONPATH": str(ROOT / "shared")}


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env={**clean_env(), **(env or {})},
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_example_actions_are_valid_configurations() -> None:
    policy = SoftmaxPolicy.from_actions("example", json.loads((ROOT / "examples" / "actions.json").read_text()))
    assert len(policy.actions) >= 4
    for action in policy.actions:
        assert set(action.config) == {"prompt", "retrieval_k", "tools"}, action.id


def test_the_example_agent_learns_with_a_simulated_model(tmp_path: Path) -> None:
    done = run(tmp_path, "--episodes", "400")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "simulated model" in done.stdout and "after 400 episodes: v9" in done.stdout
    with SQLiteStore(tmp_path / ".agent-learning" / "local.db") as store:
        current = load_current(store, "example-agent")
        episodes = store.list_episodes()
    assert current is not None and current.version == 9
    probabilities = SoftmaxPolicy.from_document(current).probabilities
    assert probabilities["concise-k1-search"] > 0.9  # the simulated model's best configuration
    failed = [s for e in episodes for s in e["steps"] if s["status"] == "error"]
    assert failed and {s["error"] for s in failed} == {"search timed out"}  # recorded, the run went on

    again = run(tmp_path, "--episodes", "50")  # the policy exists: it goes on from v9
    assert again.returncode == 0 and "created" not in again.stdout and "v10" in again.stdout


def test_the_example_agent_calls_an_openai_compatible_model(tmp_path: Path, judge_server) -> None:
    pytest.importorskip("openai")
    done = run(tmp_path, "--episodes", "20", "--train-every", "10",
               env={"OPENAI_BASE_URL": judge_server.base_url, "OPENAI_API_KEY": judge_server.api_key or "x",
                    "OPENAI_MODEL": judge_server.model})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{judge_server.model} at {judge_server.base_url}" in done.stdout
    assert len(judge_server.requests) == 20  # one model call per episode


def test_without_openai_installed_the_example_says_so(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "openai.py").write_text("raise ImportError('no openai here')\n")
    path = f"{blocker}{os.pathsep}{ROOT / 'shared'}"
    done = run(tmp_path, "--episodes", "1", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "PYTHONPATH": path})
    assert done.returncode == 1 and "pip install openai" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--actions", "missing.json"], "missing.json"),
        (["--actions", "broken.json"], "--actions broken.json: not JSON"),
        (["--agent-id", "bad id!"], "agent_id: 'bad id!' does not fit"),
        (["--actions", "ids.json"], "action 'a': its config must give prompt, retrieval_k, tools"),
    ],
)
def test_the_example_agent_names_bad_input_without_a_traceback(tmp_path: Path, args: list[str], named: str) -> None:
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "ids.json").write_text('["a", "b"]')  # valid actions, but no configuration this agent can run
    done = run(tmp_path, "--episodes", "3", *args)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and named in done.stderr, done.stderr


def test_the_example_agent_uses_the_store_agent_learn_reads(tmp_path: Path) -> None:
    """`agent-learn policy show --agent-id example-agent` (examples/README.md) finds the policy."""
    env = {"AGENT_LEARNING_SQLITE_PATH": str(tmp_path / "elsewhere.db")}
    done = run(tmp_path, "--episodes", "50", env=env)
    assert done.returncode == 0, done.stderr
    show = [sys.executable, "-m", "agent_learning.cli", "policy", "show", "--agent-id", "example-agent"]
    shown = subprocess.run(show, cwd=tmp_path, env={**clean_env(), **env}, capture_output=True, text=True,
                           timeout=120, check=False)
    assert shown.returncode == 0 and "example-agent v2" in shown.stdout, shown.stdout + shown.stderr


def test_with_another_store_the_example_does_not_print_a_db_it_never_used(tmp_path: Path) -> None:
    done = run(tmp_path, "--episodes", "10", "--db", "unused.db", env={"AGENT_LEARNING_STORE": "memory"})
    assert done.returncode == 0, done.stderr
    assert "unused.db" not in done.stdout and done.stdout.splitlines()[-1] == (
        "store: MemoryStore; next: agent-learn policy show --agent-id example-agent")


def test_the_commands_of_the_examples_readme_run_in_the_demos_environment(tmp_path: Path) -> None:
    """examples/README.md's block, run from a repository root whose ``.venv`` is the one ``make demo``
    makes (here: this interpreter's, its ``agent-learn`` beside it)."""
    readme = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() and all(line.startswith(".venv/bin/") for line in block.splitlines()), block
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for name in ("python", "agent-learn"):
        (tmp_path / ".venv" / "bin" / name).symlink_to(Path(sys.executable).parent / name)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "example-agent v7" in done.stdout, done.stdout + done.stderr
