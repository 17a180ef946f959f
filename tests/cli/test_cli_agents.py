"""Fixing a mistaken init-policy (`policy revise`), and listing and deleting agents, as a user does."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("rich")
from cli_harness import clear_settings
from click.testing import CliRunner

from agent_learning.app.embedded import open_local
from agent_learning.app.settings import load_settings
from agent_learning.cli import main
from agent_learning.core.clock import ManualClock
from agent_learning.ops.audit import audit
from agent_learning.ops.history import history
from agent_learning.pipeline import load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.sim.simulate import support_bot
from agent_learning.store.sqlite import SQLiteStore


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    clear_settings(monkeypatch)
    # Rounds of 40 episodes over four actions: too few for the guardrail to judge (it would hold them); it warns.
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")
    return str(tmp_path / "agents.db")


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def actions_file(tmp_path: Path, name: str, actions: list[object]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(actions))
    return str(path)


def learn(db: str, clock: ManualClock, rounds: int, seed: int) -> None:
    """Episodes of the simulated support bot under the current policy, then a training cycle, per round."""
    rng, scenario = random.Random(seed), support_bot()
    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        for _ in range(rounds):
            policy = SoftmaxPolicy.from_document(load_current(pipeline.store, "support-bot"), rng=rng)
            for _ in range(40):
                scenario.run_episode(pipeline.store, policy.choose(), rng, clock)
            clock.advance(120)
            pipeline.run_once()


def test_a_revision_adds_removes_and_renames_actions_as_a_new_version(tmp_path: Path, db: str) -> None:
    clock = ManualClock()
    cli("init-policy", "--agent-id", "support-bot", "--db", db,
        "--actions", actions_file(tmp_path, "v1.json", ["k=1", "k=3", "k=5", "k=10"]))
    learn(db, clock, rounds=3, seed=1)
    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        before = load_current(pipeline.store, "support-bot")
        # Episodes logged under the old actions, scored after the revision: one round not yet trained.
        policy, rng = SoftmaxPolicy.from_document(before, rng=random.Random(2)), random.Random(3)
        for _ in range(40):
            support_bot().run_episode(pipeline.store, policy.choose(), rng, clock)
    assert before is not None
    logits = dict(zip(before.action_ids, before.logits, strict=True))

    new = actions_file(tmp_path, "v2.json", ["k=1", "k=5", "five-passages", "k=20"])
    out = cli("policy", "revise", "--agent-id", "support-bot", "--actions", new, "--rename", "k=10", "five-passages",
              "--note", "k=3 was a typo", "--db", db)
    assert f"support-bot is now v{before.version + 1}" in out and "removed ['k=3']" in out
    again = cli("policy", "revise", "--agent-id", "support-bot", "--actions", new, "--rename", "k=10", "five-passages",
                "--db", db)
    assert "nothing changed" in again  # repeating it is a no-op

    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        revised = load_current(pipeline.store, "support-bot")
        assert revised is not None and revised.source == "revise" and revised.action_ids == [
            "k=1", "k=5", "five-passages", "k=20"]
        got = dict(zip(revised.action_ids, revised.logits, strict=True))
        shift = got["k=1"] - logits["k=1"]  # logits are re-centred
        assert got["k=5"] - shift == pytest.approx(logits["k=5"])
        assert got["five-passages"] - shift == pytest.approx(logits["k=10"])  # renamed: keeps its logit
        kept = [logits[a] for a in ("k=1", "k=5", "k=10")]
        assert got["k=20"] - shift == pytest.approx(sum(kept) / 3)  # added: the mean of those that stay
        assert revised.learner_state["count"][2] == before.learner_state["count"][3]  # and its evidence
        assert revised.learner_state["count"][3] == 0

        clock.advance(120)
        report = pipeline.run_once()  # the old-action episodes: scored, then learned or skipped, never lost
        assert report.published == {"support-bot": revised.version + 1}
        result = audit(pipeline.store, pipeline.queue, ["support-bot"])
        assert result.ok and result.agents[0].lost == 0 and result.agents[0].learned_twice == 0
        run = report.trained[0].run
        assert run is not None and run.skipped and run.rejected == 0  # not learned, and not invalid either
        assert "skipped" in load_current(pipeline.store, "support-bot").note
    listed = cli("runs", "list", "--agent-id", "support-bot", "--limit", "1", "--db", db)
    cells = [c.strip() for c in next(line for line in listed.splitlines() if run.id in line).split("│")]
    header = [c.strip() for c in next(line for line in listed.splitlines() if "skipped" in line).split("┃")]
    assert cells[header.index("skipped")] == str(run.skipped)  # a run that learned less says why

    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        h = history(pipeline.store, "support-bot")  # versions with different actions, side by side
        assert h.action_ids == ["k=1", "k=3", "k=5", "k=10", "five-passages", "k=20"]
        assert h.probabilities[0][4] is None and h.probabilities[-1][1] is None
    shown = cli("policy", "history", "--agent-id", "support-bot", "--db", db)
    assert "revise" in shown and "—" in shown
    cli("report", "--db", db, "--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"))

    back = cli("policy", "rollback", "--agent-id", "support-bot", "1", "--db", db)  # to the old actions
    assert "a copy of v1" in back
    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        current = load_current(pipeline.store, "support-bot")
        assert current is not None and current.action_ids == ["k=1", "k=3", "k=5", "k=10"]


def test_bad_revisions_are_refused_in_one_line(tmp_path: Path, db: str) -> None:
    cli("init-policy", "--agent-id", "a", "--db", db, "--actions", actions_file(tmp_path, "a.json", ["x", "y"]))
    runner = CliRunner()
    cases = {
        "a rename to an id not in the list": ["--actions", actions_file(tmp_path, "b.json", ["x", "z"]),
                                              "--rename", "y", "w"],
        "a rename of an unknown action": ["--actions", actions_file(tmp_path, "c.json", ["x", "z"]),
                                          "--rename", "q", "z"],
        "duplicate ids": ["--actions", actions_file(tmp_path, "d.json", ["x", "x"])],
    }
    for case, args in cases.items():
        result = runner.invoke(main, ["policy", "revise", "--agent-id", "a", "--db", db, *args])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, result.output)


@pytest.mark.parametrize(("renames", "problem"), [
    (["--rename", "x", "y"], "error: --rename: x y: 'y' is already an action of 'a' v1"),
    (["--rename", "x", "w", "--rename", "z", "w"], "error: --rename: x w: z is renamed to 'w' too"),
    (["--rename", "x", "w", "--rename", "x", "v"], "error: --rename: x is renamed more than once"),
])
def test_a_rename_onto_an_existing_or_shared_id_is_refused_and_nothing_changes(
    tmp_path: Path, db: str, renames: list[str], problem: str
) -> None:
    cli("init-policy", "--agent-id", "a", "--db", db, "--actions", actions_file(tmp_path, "a.json", ["x", "y", "z"]))
    new = actions_file(tmp_path, "b.json", ["y", "w", "v"])
    result = CliRunner().invoke(main, ["policy", "revise", "--agent-id", "a", "--db", db, "--actions", new, *renames])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(problem), result.output
    with SQLiteStore(db) as store:
        current = load_current(store, "a")
        assert current is not None and current.version == 1 and current.action_ids == ["x", "y", "z"]


def test_deleting_an_agent_asks_first_and_then_the_id_is_free(tmp_path: Path, db: str) -> None:
    clock = ManualClock()
    cli("init-policy", "--agent-id", "support-bot", "--db", db,
        "--actions", actions_file(tmp_path, "v1.json", ["k=1", "k=3", "k=5", "k=10"]))
    cli("init-policy", "--agent-id", "other", "--db", db, "--actions", actions_file(tmp_path, "o.json", ["a", "b"]))
    learn(db, clock, rounds=2, seed=4)
    listed = json.loads(cli("agent", "list", "--json", "--db", db))
    assert [(a["agent_id"], a["version"]) for a in listed] == [("other", 1), ("support-bot", 3)]

    refused = CliRunner().invoke(main, ["agent", "delete", "--agent-id", "support-bot", "--db", db], input="n\n")
    assert refused.exit_code != 0 and len(json.loads(cli("agent", "list", "--json", "--db", db))) == 2

    deleted = json.loads(cli("agent", "delete", "--agent-id", "support-bot", "--yes", "--json", "--db", db))
    assert deleted["deleted"]["episodes"] == 80 and deleted["deleted"]["policies"] == 4  # current + 3 versions
    assert [a["agent_id"] for a in json.loads(cli("agent", "list", "--json", "--db", db))] == ["other"]
    assert "support-bot" not in cli("episodes", "list", "--db", db)
    cli("init-policy", "--agent-id", "support-bot", "--db", db,  # the id starts afresh, no old scores learned
        "--actions", actions_file(tmp_path, "v1.json", ["k=1", "k=3", "k=5", "k=10"]))
    assert "no_new_scores" in cli("train", "--db", db)


def test_what_is_left_of_a_deleted_agent_and_an_agent_with_a_corrupt_policy_can_be_deleted(
    tmp_path: Path, db: str
) -> None:
    from agent_learning.agent.capture import EpisodeCapture
    from agent_learning.agent.client import PolicyClient

    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    cli("init-policy", "--agent-id", "support-bot", "--db", db, "--actions", actions)
    cli("init-policy", "--agent-id", "broken", "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:
        run = EpisodeCapture(store, PolicyClient(store, "support-bot").choose(), input="q")
        cli("agent", "delete", "--agent-id", "support-bot", "--yes", "--db", db)
        run.end("an answer")  # an agent mid-request when its policy was deleted: its episode lands after
        store.put_raw_current_policy("broken", {"id": "broken:current", "logits": ["NaN"]})

    left = json.loads(cli("agent", "delete", "--agent-id", "support-bot", "--yes", "--json", "--db", db))
    assert left["deleted"]["episodes"] == 1 and left["deleted"]["policies"] == 0
    assert json.loads(cli("episodes", "list", "--json", "--db", db)) == []
    said = cli("agent", "delete", "--agent-id", "broken", "--yes", "--db", db)
    # The corrupt current document and version 1: documents, not versions.
    assert said.startswith("deleted broken: 2 policy documents (versions and the current one), 0 runs, 0 score")
    again = CliRunner().invoke(main, ["agent", "delete", "--agent-id", "support-bot", "--yes", "--db", db])
    assert again.exit_code == 2 and "'support-bot' has no policy" in again.stderr  # nothing of it is left


def test_policy_rollback_repairs_an_agent_whose_current_document_was_edited_into_an_invalid_one(
    tmp_path: Path, db: str
) -> None:
    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    cli("init-policy", "--agent-id", "bot", "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:
        store.put_raw_current_policy("bot", {**store.get_current_policy("bot").doc, "logits": [0.0]})
    shown = CliRunner().invoke(main, ["policy", "show", "--agent-id", "bot", "--db", db])
    assert shown.exit_code == 1 and "logits" in shown.stderr  # not 2: the store holds it, the operator did not ask it
    assert shown.stderr.strip().endswith("; `agent-learn policy rollback --agent-id bot VERSION` repairs it")
    said = " ".join(cli("policy", "rollback", "--agent-id", "bot", "1", "--db", db).split())
    assert said.startswith("bot is now v2, a copy of v1; it replaced an invalid current document (invalid policy "
                           "'bot:current': logits: has 1 entries but there are 2 actions): training resumes from "
                           "v1's cursor, the newest valid version record")
    assert "actions restored" not in said
    assert json.loads(cli("policy", "show", "--agent-id", "bot", "--json", "--db", db))["policy"]["version"] == 2

    with SQLiteStore(db) as store:  # every record edited too: nothing to resume from
        store.put_raw_current_policy("bot", {**store.get_current_policy("bot").doc, "logits": [0.0]})
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.logits', json('[0]')) WHERE id = 'bot:v2'")
    said = " ".join(cli("policy", "rollback", "--agent-id", "bot", "1", "--db", db).split())
    assert said.startswith("bot is now v3, a copy of v1; it replaced an invalid current document")
    assert "training resumes from v1's cursor" in said  # v2's record is invalid too: v1 stands in

    with SQLiteStore(db) as store:  # --json says it too (before the fix only the text did)
        store.put_raw_current_policy("bot", {**store.get_current_policy("bot").doc, "temperature": 0.001})
    done = json.loads(cli("policy", "rollback", "--agent-id", "bot", "1", "--json", "--db", db))
    assert (done["changed"], done["policy"]["version"], done["resumed_from"]) == (True, 4, 3)
    assert done["replaced_invalid"].startswith("invalid policy 'bot:current': temperature:")
    again = json.loads(cli("policy", "rollback", "--agent-id", "bot", "1", "--json", "--db", db))
    assert not again["changed"] and "replaced_invalid" not in again


def test_policy_history_and_runs_list_list_the_records_of_an_agent_whose_current_document_is_invalid(
    tmp_path: Path, db: str
) -> None:
    """Before the fix it failed on the current document: the operator could not see the versions
    that `policy rollback`, which repairs it, chooses from."""
    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    cli("init-policy", "--agent-id", "bot", "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:
        store.put_raw_current_policy("bot", {**store.get_current_policy("bot").doc, "logits": [0.0]})
    said = ("error: invalid policy 'bot:current': logits: has 1 entries but there are 2 actions; "
            "`agent-learn policy rollback --agent-id bot VERSION` repairs it")
    for command in (["policy", "history"], ["runs", "list"]):
        for args in ([], ["--json"]):
            result = CliRunner().invoke(main, [*command, "--agent-id", "bot", "--db", db, *args])
            assert result.exit_code == 1 and said in " ".join(result.stderr.split()), result.output
    listed = CliRunner().invoke(main, ["policy", "history", "--agent-id", "bot", "--db", db, "--json"]).stdout
    assert [v["version"] for v in json.loads(listed)] == [1]
    assert CliRunner().invoke(main, ["runs", "list", "--agent-id", "bot", "--db", db, "--json"]).stdout.strip() == "[]"


def test_report_charts_the_versions_of_an_agent_whose_current_document_is_invalid(tmp_path: Path, db: str) -> None:
    """Before the fix one agent's invalid current document stopped the report of every agent, though
    it says the versions are read as `policy history` reads them."""
    pytest.importorskip("matplotlib")
    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    for agent_id in ("bot", "other"):
        cli("init-policy", "--agent-id", agent_id, "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:
        store.put_raw_current_policy("bot", {**store.get_current_policy("bot").doc, "logits": [0.0]})
    png, html = tmp_path / "r.png", tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", "--db", db, "--png", str(png), "--html", str(html), "--json"])
    assert result.exit_code == 1, result.output
    assert "`agent-learn policy rollback --agent-id bot VERSION` repairs it" in " ".join(result.stderr.split())
    charted = json.loads(result.stdout)["agents"]
    assert {a: c["versions"] for a, c in charted.items()} == {"bot": 1, "other": 1}
    assert png.stat().st_size > 0 and html.stat().st_size > 0


def test_a_current_document_edited_into_a_json_list_is_named_as_invalid_and_rollback_repairs_it(
    tmp_path: Path, db: str
) -> None:
    """Before the fix every command that read it (and the rollback that repairs it) raised AttributeError."""
    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    cli("init-policy", "--agent-id", "bot", "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:
        store.put_raw_current_policy("bot", [1, 2])  # type: ignore[arg-type]
    problem = "invalid policy document: (document): must be a JSON object, got list"
    for args in (["policy", "show", "--agent-id", "bot"], ["agent", "list"], ["policy", "history", "--agent-id", "bot"],
                 ["runs", "list", "--agent-id", "bot"]):
        shown = CliRunner().invoke(main, [*args, "--db", db])
        assert shown.exit_code == 1 and problem in shown.stderr and shown.exception is not None
        assert isinstance(shown.exception, SystemExit)
    said = " ".join(cli("policy", "rollback", "--agent-id", "bot", "1", "--db", db).split())
    assert said.startswith(f"bot is now v2, a copy of v1; it replaced an invalid current document ({problem})")
    assert json.loads(cli("agent", "list", "--json", "--db", db))[0]["version"] == 2


def test_agent_list_names_an_agent_with_an_invalid_policy_and_lists_the_others(tmp_path: Path, db: str) -> None:
    actions = actions_file(tmp_path, "a.json", ["a", "b"])
    for agent_id in ("alpha", "beta", "gamma"):
        cli("init-policy", "--agent-id", agent_id, "--db", db, "--actions", actions)
    with SQLiteStore(db) as store:  # edited by hand
        store.put_raw_current_policy("beta", {**store.get_current_policy("beta").doc, "logits": [0.0]})
    named = ("error: invalid policy 'beta:current': logits: has 1 entries but there are 2 actions; "
             "`agent-learn policy rollback --agent-id beta VERSION` repairs it (left out;")
    for args in ([], ["--json"]):
        result = CliRunner().invoke(main, ["agent", "list", "--db", db, *args])
        assert result.exit_code == 1 and named in result.stderr, result.output
        assert "alpha" in result.stdout and "gamma" in result.stdout and "beta" not in result.stdout
    listed = CliRunner().invoke(main, ["agent", "list", "--json", "--db", db]).stdout
    assert [a["agent_id"] for a in json.loads(listed)] == ["alpha", "gamma"]


def test_feedback_on_an_episode_of_a_removed_action_says_it_will_not_be_learned(tmp_path: Path, db: str) -> None:
    clock = ManualClock()
    cli("init-policy", "--agent-id", "support-bot", "--db", db,
        "--actions", actions_file(tmp_path, "v1.json", ["k=1", "k=3", "k=5", "k=10"]))
    learn(db, clock, rounds=1, seed=5)
    episodes = json.loads(cli("episodes", "list", "--agent-id", "support-bot", "--limit", "40", "--json", "--db", db))
    removed = next(e["id"] for e in episodes if e["action_id"] == "k=3")
    kept = next(e["id"] for e in episodes if e["action_id"] == "k=5")
    cli("policy", "revise", "--agent-id", "support-bot", "--db", db,
        "--actions", actions_file(tmp_path, "v2.json", ["k=1", "k=5", "k=10"]))

    said = " ".join(cli("feedback", removed, "--down", "--db", db).split())
    assert "but not learned: action 'k=3' is not in support-bot v3 (a revision removed or renamed it)" in said
    assert "learned from by the next training run" not in said
    assert "learned from by the next training run" in " ".join(cli("feedback", kept, "--down", "--db", db).split())
    with open_local(load_settings(), path=db, clock=clock) as pipeline:
        run = pipeline.run_once().trained[0].run
    assert run is not None and run.corrections == 1 and run.skipped == 1  # the removed action's correction


def test_pinning_a_pinned_agent_with_another_reason_says_the_first_reason_is_kept(tmp_path: Path, db: str) -> None:
    cli("init-policy", "--agent-id", "a", "--db", db, "--actions", actions_file(tmp_path, "a.json", ["x", "y"]))
    cli("policy", "pin", "--agent-id", "a", "--reason", "reward drop on billing", "--db", db)
    again = cli("policy", "pin", "--agent-id", "a", "--reason", "checking complaints", "--db", db)
    assert again.strip() == ("a was already pinned: reward drop on billing; it keeps that reason, not --reason "
                             "(unpin, then pin, to change it)")
    assert cli("policy", "pin", "--agent-id", "a", "--db", db).strip() == "a was already pinned: reward drop on billing"
    assert "learning is paused: reward drop on billing" in cli("policy", "show", "--agent-id", "a", "--db", db)


def test_a_revision_says_which_kept_actions_lost_or_changed_their_config(tmp_path: Path, db: str) -> None:
    cli("init-policy", "--agent-id", "support-bot", "--db", db, "--actions", actions_file(tmp_path, "v1.json", [
        {"id": "k=1", "description": "one passage", "config": {"retrieval_k": 1}},
        {"id": "k=5", "description": "five passages", "config": {"retrieval_k": 5}},
        {"id": "k=10", "config": {"retrieval_k": 10}}]))
    ids_only = cli("policy", "revise", "--agent-id", "support-bot", "--db", db,  # configs left out by mistake
                   "--actions", actions_file(tmp_path, "v2.json", ["k=1", "k=5", "ten", "k=20"]),
                   "--rename", "k=10", "ten")
    assert " ".join(ids_only.split()) == (
        "support-bot is now v2: revised actions: added ['k=20']; renamed k=10→ten; config changed for "
        "['k=1', 'k=5', 'ten']; description changed for ['k=1', 'k=5']")
    reordered = cli("policy", "revise", "--agent-id", "support-bot", "--db", db,
                    "--actions", actions_file(tmp_path, "v3.json", ["k=20", "k=1", "k=5", "ten"]))
    assert "support-bot is now v3: revised actions: order changed" in reordered


def test_agent_list_says_a_structured_policys_actions_are_values_of_its_dimensions(tmp_path: Path, db: str) -> None:
    cli("init-policy", "--agent-id", "flat", "--db", db, "--actions", actions_file(tmp_path, "a.json", ["x", "y"]))
    structured = tmp_path / "s.json"
    structured.write_text(json.dumps({"dimensions": {"prompt": ["a", "b", "c"], "retrieval_k": [1, 3, 5]}}))
    cli("init-policy", "--agent-id", "triage", "--db", db, "--actions", str(structured))
    listed = json.loads(cli("agent", "list", "--json", "--db", db))
    assert [(a["actions"], a["dimensions"]) for a in listed] == [(2, None), (6, {"prompt": 3, "retrieval_k": 3})]
    table = cli("agent", "list", "--db", db)
    assert "6 values in 2 dimensions" in table and "version created" in table


def test_feedback_on_an_unjudged_episode_says_how_it_gets_applied(
    tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli("init-policy", "--agent-id", "support-bot", "--db", db,
        "--actions", actions_file(tmp_path, "v1.json", ["k=1", "k=3", "k=5", "k=10"]))
    monkeypatch.setenv("AGENT_LEARNING_JUDGING", "support-bot=0.3")
    learn(db, ManualClock(), rounds=1, seed=6)
    episodes = json.loads(cli("episodes", "list", "--agent-id", "support-bot", "--limit", "40", "--json", "--db", db))
    left_out = next(e["id"] for e in episodes if e["unjudged"])
    said = " ".join(cli("feedback", left_out, "--down", "--db", db).split())
    assert ("stored; AGENT_LEARNING_JUDGING left the episode unjudged (sampled_out), so it is applied once "
            "`agent-learn rescore --agent-id support-bot --unjudged` judges it") in said


def test_a_rollback_across_a_revision_says_which_actions_it_restores_and_removes(tmp_path: Path, db: str) -> None:
    cli("init-policy", "--agent-id", "a", "--db", db, "--actions", actions_file(tmp_path, "a.json", ["x", "y", "z"]))
    cli("policy", "revise", "--agent-id", "a", "--db", db, "--actions", actions_file(tmp_path, "b.json", ["x", "w"]),
        "--rename", "y", "w")
    back = " ".join(cli("policy", "rollback", "--agent-id", "a", "1", "--db", db).split())
    assert back == ("a is now v3, a copy of v1; actions restored: ['y', 'z']; actions removed: ['w'] (their scores "
                    "not trained yet are skipped)")
    forth = cli("policy", "rollback", "--agent-id", "a", "2", "--db", db)
    assert "a is now v4, a copy of v2; actions restored: ['w']; actions removed: ['y', 'z']" in " ".join(forth.split())
    cli("policy", "rollback", "--agent-id", "a", "3", "--db", db)
    assert cli("policy", "rollback", "--agent-id", "a", "1", "--db", db).strip() == "a is now v6, a copy of v1"
