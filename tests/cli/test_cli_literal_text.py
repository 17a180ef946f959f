"""``agent-learn`` prints what users and agents wrote literally: Rich markup (``[/]``,
``[bold]``, ``[link=...]``) and emoji codes (``:smile:``) in episodes, feedback, dead letters,
training runs and policies are neither interpreted nor a crash (a ``MarkupError`` before)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("rich")
from cli_harness import cli
from factories import make_run

from agent_learning.documents import Episode, Rejected, Step
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.store.sqlite import SQLiteStore

AGENT = "literal-bot"
TOKENS = ("[/]", "[bold]x[/bold]", "[link=http://x]y[/link]", ":smile:")
TEXT = " ".join(TOKENS)
ACTION = "calc:smile:"  # a valid action id that Rich would turn into an emoji


pytestmark = pytest.mark.usefixtures("embedded_env")


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


def assert_literal(output: str, *tokens: str) -> None:
    for token in tokens or TOKENS:
        assert token in output, (token, output)
    assert "😄" not in output


def test_user_text_is_printed_literally_by_every_command(tmp_path: Path) -> None:
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps([{"id": ACTION, "description": TEXT}, {"id": "plain", "description": "p"}]))
    ok("init-policy", "--agent-id", AGENT, "--actions", str(actions))
    db = str(tmp_path / "local.db")
    store = SQLiteStore(db)
    episode = Episode(
        id="ep-markup",
        agent_id=AGENT,
        policy_version=1,
        action_id=ACTION,
        probability=0.5,
        logprob=math.log(0.5),
        input=f"question {TEXT}",
        output=f"answer {TEXT}",
        steps=[Step(name=f"search {TEXT}", status="error", latency_ms=5.0, error=f"failed {TEXT}", result=TEXT)],
        started_at="2026-01-01T00:00:00Z",
        ended_at="2026-01-01T00:00:01Z",
    )
    store.add_episode(episode)
    store.put_run(make_run(AGENT, 99, rejected=1, rejected_samples=[Rejected(id="ep-x", error=f"bad {TEXT}")]))
    store.close()
    ok("train")  # scores the episode and publishes v2
    ok("feedback", episode.id, "--down", "--comment", f"comment {TEXT}")
    queue = SQLiteQueue(db)
    queue.send([OutgoingMessage("ghost-1", json.dumps({"episode_id": "ghost-1"}))])
    (message,) = queue.receive(1)
    queue.dead_letter(message, "Bad[/]Reason", f"description {TEXT}")
    queue.close()

    shown = ok("episodes", "show", episode.id)
    for line in ("question", "answer", "search", "failed", "comment"):
        assert_literal(next(x for x in shown.splitlines() if line in x))
    assert_literal(ok("episodes", "list"), ACTION)
    assert_literal(ok("dlq", "list"), "Bad[/]Reason", *TOKENS)
    assert_literal(ok("runs", "show", f"{AGENT}:run:v99"))
    assert_literal(ok("policy", "show", "--agent-id", AGENT), ACTION, *TOKENS)  # with the action descriptions
    ok("policy", "pin", "--agent-id", AGENT, "--reason", f"reason {TEXT}")
    assert_literal(ok("policy", "show", "--agent-id", AGENT), f"reason {TEXT}")
    assert_literal(ok("policy", "history", "--agent-id", AGENT), ACTION)


def test_errors_quote_user_input_literally(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "local.db").close()  # an empty store: reads never create one
    result = cli("episodes", "show", "ghost[/]:smile:")
    assert result.exit_code == 2 and "ghost[/]:smile:" in result.stderr, result.output
    result = cli("runs", "show", "x:run:v[bold]1[/bold]")
    assert result.exit_code == 2 and "x:run:v[bold]1[/bold]" in result.stderr, result.output
