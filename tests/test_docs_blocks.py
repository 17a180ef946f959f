"""Every code block in README.md and docs/ runs, in order, against the embedded default.

Per Markdown file, in a fresh folder: ``bash`` blocks run with ``agent-learn`` on the PATH,
``python`` blocks with the library importable, and the ``$ agent-learn ...`` lines of a
transcript block run on the demo's data (``agent-learn demo``, run once, as its page says), each
printing exactly what the transcript shows under it (trailing spaces aside; a command shown
without output is only run). A block that needs Azure, or is one of the two top-level commands,
is marked ``<!-- not run: reason -->`` on the line before it, and is the only kind that does not
run. Every block must exit 0 and print no traceback.

``UPDATE_DOCS=1 pytest tests/test_docs_blocks.py`` writes what the commands print into the
transcripts instead of comparing (then read the prose around them: it may quote the figures).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")  # the report command in the transcripts draws charts

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str

    @property
    def commands(self) -> list[str]:
        """The commands of a transcript: its ``$ agent-learn ...`` lines."""
        return [command for command, _ in self.transcript]

    @property
    def transcript(self) -> list[tuple[str, str]]:
        """Each ``$ agent-learn ...`` command of a transcript with the output shown under it."""
        shown: list[tuple[str, list[str]]] = []
        for line in self.code.splitlines():
            if line.startswith("$ agent-learn "):
                shown.append((line[2:], []))
            elif shown:
                shown[-1][1].append(line)
        return [(command, "\n".join(lines)) for command, lines in shown]


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").splitlines()
        if before and NOT_RUN.search(before[-1]):
            continue
        block = Block(page, text[: match.start()].count("\n") + 1, match.group(1), match.group(2))
        if block.language in ("bash", "python") or block.commands:
            found.append(block)
    return found


def environment(**settings: str) -> dict[str, str]:
    """The test's environment without its settings, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_LEARNING_", "CosmosDBConnection"))}
    env.update(settings)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT / "shared")
    env["COLUMNS"] = "160"
    return env


def run(block: Block, argv: list[str], cwd: Path, **settings: str) -> str:
    """What ``argv`` prints on stdout; it must exit 0 without a traceback."""
    done = subprocess.run(argv, cwd=cwd, env=environment(**settings), capture_output=True, text=True, timeout=300,
                          check=False)
    where = f"{block.page.relative_to(ROOT)}:{block.line}"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stdout + done.stderr, f"{where} printed a traceback:\n{done.stderr[-2000:]}"
    return done.stdout


def printed(text: str) -> str:
    """Output as a page shows it: no trailing spaces (tables pad their titles), no trailing newline."""
    return "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store ``agent-learn demo`` writes, with its defaults (made once): the transcripts' data."""
    cwd = tmp_path_factory.mktemp("demo")
    agent_learn = str(Path(sys.executable).parent / "agent-learn")
    done = subprocess.run([agent_learn, "demo", "--no-plot"], cwd=cwd, env=environment(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return cwd / DEMO_STORE


DEMO_STORE = Path(".agent-learning", "demo.db")
"""Where ``agent-learn demo`` writes by default, and where the transcripts read."""


def test_the_pages_have_runnable_blocks() -> None:
    """The README's quick start is among them (a guard against a parser that finds nothing)."""
    languages = [b.language for b in blocks(ROOT / "README.md")]
    assert languages.count("python") >= 1 and languages.count("bash") >= 1


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_a_page_runs(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    page_blocks = blocks(page)
    if any(b.commands for b in page_blocks):
        (tmp_path / DEMO_STORE.parent).mkdir()
        shutil.copy(request.getfixturevalue("demo_store"), tmp_path / DEMO_STORE)
    updated = page.read_text(encoding="utf-8")
    for block in page_blocks:
        for command, shown, output in run_block(block, tmp_path):
            if os.environ.get("UPDATE_DOCS") == "1":
                updated = updated.replace(f"$ {command}\n{shown}\n", f"$ {command}\n{output}\n", 1)
            else:
                where = f"{page.relative_to(ROOT)}:{block.line}"
                assert output == printed(shown), (
                    f"{where}: `{command}` prints otherwise than the page shows (UPDATE_DOCS=1 rewrites it):\n{output}"
                )
    if updated != page.read_text(encoding="utf-8"):
        page.write_text(updated, encoding="utf-8")


def run_block(block: Block, cwd: Path, **settings: str) -> list[tuple[str, str, str]]:
    """A ``python`` or ``bash`` block, or a transcript's commands one by one: for each command whose
    output the transcript shows, the command, that output and what it printed."""
    if block.language == "python":
        run(block, [sys.executable, "-c", block.code], cwd, **settings)
    elif block.language == "bash":
        run(block, ["bash", "-euo", "pipefail", "-c", block.code], cwd, **settings)
    else:
        outputs = [(command, shown, printed(run(block, ["bash", "-c", command], cwd, **settings)))
                   for command, shown in block.transcript]
        return [(command, shown, output) for command, shown, output in outputs if shown]
    return []


def test_the_readme_quick_start_uses_the_store_its_setting_names(tmp_path: Path) -> None:
    """With AGENT_LEARNING_SQLITE_PATH set, init-policy writes there: the agent's code and the loop
    must read there too, not open an empty store at the default path."""
    db = tmp_path / "elsewhere" / "agents.db"
    work = tmp_path / "work"
    work.mkdir()
    for block in blocks(ROOT / "README.md"):
        run_block(block, work, AGENT_LEARNING_SQLITE_PATH=str(db))
    assert db.exists() and not (work / ".agent-learning").exists()


README_MAX_LINES = 250
"""The README is the front door: what it does, the two commands, the agent-side quick start, links."""


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
