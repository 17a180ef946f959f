"""What `agent-learn` prints: numbers rounded for people, one form of time in --json, the
probabilities agents draw from in `policy show --json`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rich")
from cli_harness import clear_settings
from click.testing import CliRunner

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.app.embedded import open_local
from agent_learning.cli import main
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import TransientError
from agent_learning.documents import PolicyDocument
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import create_policy, load_current
from agent_learning.pipeline.train import train_agent
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards.feedback import record_feedback
from agent_learning.store.sqlite import SQLiteStore

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    clear_settings(monkeypatch)
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")  # one episode: too few to judge, published with a warning
    path = tmp_path / "out.db"
    clock = ManualClock()
    with SQLiteStore(path) as store:
        policy = SoftmaxPolicy("bot", SoftmaxPolicy.from_actions("bot", ["a", "b", "c"]).actions, [0.3, 0.1, -0.2])
        policy = SoftmaxPolicy.from_document(create_policy(store, policy.to_document(created_at=clock.now())))
        with EpisodeCapture(store, policy.decision_for("a"), input="What is 2 + 2?", episode_id="ep-1",
                            clock=clock) as run:
            run.step("calc", latency_ms=0.0022029998945072293)
            run.step("search", latency_ms=628.68208)
            clock.advance(0.5)
            run.end("4")
    with open_local(path=path, clock=clock) as pipeline:
        pipeline.run_once()
    return str(path)


def test_text_output_rounds_probabilities_and_latencies(db: str) -> None:
    shown = CliRunner().invoke(main, ["episodes", "show", "ep-1", "--db", db])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"\(p=0\.\d{4}\)", shown.stdout) and "0.0022 ms" in shown.stdout and "628.7 ms" in shown.stdout
    assert not re.search(r"\d\.\d{6,}", shown.stdout), shown.stdout


def test_every_time_in_json_is_iso_8601_utc(db: str) -> None:
    runner = CliRunner()
    history = json.loads(runner.invoke(main, ["policy", "history", "--agent-id", "bot", "--json", "--db", db]).stdout)
    episode = json.loads(runner.invoke(main, ["episodes", "show", "ep-1", "--json", "--db", db]).stdout)
    runs = json.loads(runner.invoke(main, ["runs", "list", "--agent-id", "bot", "--json", "--db", db]).stdout)
    times = [row["created_at"] for row in history] + [episode["episode"]["started_at"], episode["episode"]["ended_at"]]
    times += [episode["scores"][0]["scored_at"]] + [r["run"][k] for r in runs for k in ("started_at", "finished_at")]
    assert times and all(ISO_Z.match(t) for t in times), times


def test_policy_show_json_has_the_probabilities_agents_draw_from(db: str) -> None:
    shown = json.loads(CliRunner().invoke(main, ["policy", "show", "--agent-id", "bot", "--json", "--db", db]).stdout)
    probabilities = shown["probabilities"]
    assert list(probabilities) == ["a", "b", "c"] and abs(sum(probabilities.values()) - 1) < 1e-12
    assert probabilities["a"] > probabilities["b"] > probabilities["c"]


def test_policy_show_json_keeps_the_document_as_stored_and_the_probabilities_beside_it(db: str) -> None:
    """Before the fix `probabilities` was added into the document, which then was no policy
    document any more: nothing that reads one (PolicyDocument, the published schema) took it."""
    shown = json.loads(CliRunner().invoke(main, ["policy", "show", "--agent-id", "bot", "--json", "--db", db]).stdout)
    assert sorted(shown) == ["policy", "probabilities"]
    with SQLiteStore(db) as store:
        assert PolicyDocument.from_dict(shown["policy"]) == load_current(store, "bot")


def test_a_run_that_learned_only_corrections_shows_no_mean_reward(db: str) -> None:
    """A full batch of feedback corrections trains without new episodes: the run has no mean
    reward (its stored 0.0 is no batch's), so no listing shows 0.000 for it."""
    with SQLiteStore(db) as store:
        assert record_feedback(store, "ep-1", thumb="down").reconciled.status == "corrected"
        outcome = train_agent("bot", store, Reinforce(), max_batch=1)
    assert outcome.status == "published" and outcome.run is not None and outcome.run.episodes == 0
    runner = CliRunner()
    runs = runner.invoke(main, ["runs", "list", "--agent-id", "bot", "--db", db])
    row = next(line for line in runs.stdout.splitlines() if "bot:run:v3" in line).split("│")
    assert row[3].strip() == "0" and row[8].strip() == "", runs.stdout  # episodes 0, reward blank
    shown = runner.invoke(main, ["policy", "show", "--agent-id", "bot", "--db", db]).stdout
    assert "last run bot:run:v3: 0 episodes (1 correction row), KL" in shown and "0.000" not in shown, shown
    history = runner.invoke(main, ["policy", "history", "--agent-id", "bot", "--json", "--db", db]).stdout
    assert json.loads(history)[-1]["mean_reward"] is None


def test_episodes_list_does_not_call_an_episode_not_scored_when_the_dead_letters_were_unreadable(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the dead letters (Service Bus unreachable, no right to peek), an unscored episode
    may be dead-lettered: the list says so, as `episodes show` does, rather than "not scored"."""
    with SQLiteStore(db) as store:
        current = load_current(store, "bot")
        assert current is not None
        with EpisodeCapture(store, SoftmaxPolicy.from_document(current).decision_for("b"), input="2 + 3?",
                            episode_id="ep-2") as run:
            run.end("5")

    def unreadable(self: Any, limit: int) -> Any:
        raise TransientError("the queue refused to list its dead letters")

    listed = CliRunner().invoke(main, ["episodes", "list", "--db", db])
    assert "not scored" in listed.stdout and "could not be read" not in listed.stdout, listed.stdout
    monkeypatch.setattr(SQLiteQueue, "dead_letters", unreadable)
    listed = CliRunner().invoke(main, ["episodes", "list", "--db", db])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "ep-2" in line)
    assert "not scored?" in row and "dead letters could not be read" in listed.stdout, listed.stdout


def test_progress_on_stderr_that_is_not_a_terminal_is_plain_lines(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a CI log a bar is drawn once, at the end, as bar characters and ``0/?``: plain lines instead."""
    from agent_learning.cli import output as cli_output

    with SQLiteStore(db) as store:
        policy = SoftmaxPolicy.from_document(load_current(store, "bot"))  # type: ignore[arg-type]
        for i in range(3):
            EpisodeCapture(store, policy.decision_for("b"), input="2 + 2?", episode_id=f"ep-p{i}").end("4")
    monkeypatch.setattr(cli_output, "PLAIN_PROGRESS_SECONDS", 0.0)  # a line at every step, as a long run gets
    trained = CliRunner().invoke(main, ["train", "--db", db])
    assert trained.exit_code == 0, trained.output
    lines = trained.stderr.splitlines()
    assert lines[-1].startswith("scoring: 3 of 3 done in ") and lines[-1].endswith(" s"), lines
    assert [line.split(" so far")[0] for line in lines[:-1]] == [f"scoring: {n} of 3" for n in (1, 2, 3)]
    idle = CliRunner().invoke(main, ["train", "--db", db])
    assert idle.exit_code == 0 and idle.stderr.startswith("scoring: 0 done in "), idle.stderr
    for result in (trained, idle):
        assert "━" not in result.stderr and "/?" not in result.stderr
    quiet = CliRunner().invoke(main, ["train", "--db", db, "--json"])
    assert quiet.exit_code == 0 and quiet.stderr == ""  # --json: no progress at all
