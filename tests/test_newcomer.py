"""A newcomer's first hour, played on a fresh copy of the repository, as the README tells it.

``make demo`` (which creates its own ``.venv`` from nothing), then the commands the demo prints
next, in order, then the README's agent-side quick start (its shell and Python blocks, run from
the shell with the demo's ``.venv`` activated), then the shipped example: ``init-policy`` with
``examples/actions.json``, the example agent, ``agent-learn train`` and ``agent-learn policy
show``. Every step must exit as documented and print no traceback. The transcript is written to
the file named by ``NEWCOMER_TRANSCRIPT`` when it is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git, as the README does"
)


@dataclass
class Newcomer:
    """A shell in a fresh copy of the repository that keeps a transcript."""

    home: Path
    transcript: list[str] = field(default_factory=list)
    activated: bool = False

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AGENT_LEARNING_", "CosmosDBConnection", "ServiceBusConnection", "OPENAI_"))}
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)
        # The test runner's venv is not the newcomer's: only the system's tools are on the PATH.
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "activate").exists()]
        if self.activated:  # `source .venv/bin/activate`, as `make demo` says
            path.insert(0, str(self.home / ".venv" / "bin"))
            env["VIRTUAL_ENV"] = str(self.home / ".venv")
        env["PATH"] = os.pathsep.join(path)
        env["COLUMNS"] = "120"
        return env

    def run(self, command: str, *, expect: int = 0, timeout: float = 900) -> str:
        done = subprocess.run(["bash", "-c", command], cwd=self.home, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, check=False)
        output = done.stdout + done.stderr
        self.transcript.append(f"$ {command}\n{output.rstrip()}\n[exit {done.returncode}]\n")
        assert "Traceback" not in output, f"{command!r} printed a traceback:\n{output[-3000:]}"
        assert done.returncode == expect, f"{command!r} exited {done.returncode}, expected {expect}:\n{output[-3000:]}"
        return done.stdout


def fresh_copy(target: Path) -> Path:
    """The repository as a fresh clone would have it: the tracked files, as they are now."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def section(markdown: str, heading: str) -> str:
    start = markdown.index(heading)
    end = markdown.find("\n## ", start + len(heading))
    return markdown[start : end if end > 0 else None]


def next_commands(output: str) -> list[str]:
    """The commands the demo says to run next (``next: <command>`` lines)."""
    return [m.group(1).strip() for m in re.finditer(r"^\s*next:\s+(agent-learn .+)$", output, re.M)]


def test_the_first_hour_from_make_demo_to_a_real_agent(tmp_path: Path) -> None:
    me = Newcomer(fresh_copy(tmp_path / "agent-learning"))
    try:
        printed = me.run("make demo")
        assert (me.home / "agent-learning-demo.png").stat().st_size > 10_000

        me.activated = True
        commands = next_commands(printed)
        assert commands, f"make demo printed no next commands:\n{printed[-2000:]}"
        for command in commands:
            me.run(command)

        quick_start = section((me.home / "README.md").read_text(), "## Agent-side quick start")
        blocks = [(lang, code) for lang, code in FENCE.findall(quick_start) if lang in ("bash", "python")]
        assert [lang for lang, _ in blocks][:2] == ["bash", "python"], blocks
        for i, (lang, code) in enumerate(blocks):
            if lang == "bash":
                me.run(code)
            else:
                (me.home / f"quick_start_{i}.py").write_text(code)
                me.run(f"python quick_start_{i}.py")
        me.run("agent-learn train")
        assert "support-bot v2" in me.run("agent-learn policy show --agent-id support-bot")

        example = me.home / "examples"
        assert (example / "actions.json").exists() and (example / "support_agent.py").exists()
        me.run("agent-learn init-policy --agent-id example-agent --actions examples/actions.json")
        me.run("python examples/support_agent.py --agent-id example-agent --episodes 300")
        me.run("agent-learn train")
        shown = me.run("agent-learn policy show --agent-id example-agent")
        assert re.search(r"example-agent v([2-9]|\d\d+)", shown), shown
    finally:
        record = os.environ.get("NEWCOMER_TRANSCRIPT")
        if record:
            Path(record).write_text("\n".join(me.transcript))


def test_make_local_settings_installs_the_app_not_the_test_tools() -> None:
    """``make local-settings`` installs what ``func start`` runs with (requirements.txt), not the
    test tools: a deployer without Node.js and npm (only ``make test`` needs them) gets there.
    A dry run (``make -n``) prints every step and runs none."""
    plan = subprocess.run(["make", "-nB", "local-settings"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "requirements.txt" in plan.stdout and "infra/local_settings.py" in plan.stdout
    assert "npm" not in plan.stdout
