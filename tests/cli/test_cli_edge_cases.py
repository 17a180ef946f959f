"""Inputs at the edges of `agent-learn`'s commands: each is refused in one line naming the option
(exit 2), or does what its help says, never silently something else."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

import pytest

pytest.importorskip("rich")

from cli_harness import clear_settings, cli, ok

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.app.embedded import open_local
from agent_learning.app.settings import load_settings
from agent_learning.core.errors import NotFound
from agent_learning.pipeline import load_current
from agent_learning.store.sqlite import SQLiteStore

AGENT = "support-bot"


@pytest.fixture(autouse=True)
def in_tmp(embedded_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The embedded settings of :func:`embedded_env`, run from the test's own folder."""
    monkeypatch.chdir(tmp_path)


def judged_episodes(db: str, n: int, *, train_each: bool = False) -> None:
    """``n`` episodes of AGENT (``ep-0`` ...) through the embedded pipeline, trained once at the
    end or after each (one version each: the guardrail, which cannot judge so few, warns)."""
    with open_local(load_settings(guardrail="warn"), path=db) as pipeline:
        for i in range(n):
            decision = PolicyClient(pipeline.store, AGENT).choose()
            EpisodeCapture(pipeline.store, decision, input="How?", episode_id=f"ep-{i}").end("Like this.")
            if train_each or i == n - 1:
                pipeline.run_once()


def refused(*args: str) -> str:
    """The one error line of a command refused as bad input."""
    result = cli(*args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (args, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    return lines[0]


def test_a_store_opened_from_another_folder_names_its_file_when_it_finds_no_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SQLiteStore()`` takes the default path in the working directory: opened from another
    folder, it creates an empty file there. What then finds no agent names that file (absolute)
    and how the path is chosen: in PolicyClient's exception, and in the CLI's one line."""
    monkeypatch.delenv("AGENT_LEARNING_SQLITE_PATH")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    file = Path.cwd() / ".agent-learning" / "local.db"
    store = SQLiteStore()
    with pytest.raises(NotFound) as missing:
        PolicyClient(store, AGENT).choose()
    store.close()
    assert str(missing.value).startswith(
        f"agent {AGENT!r} has no policy in the SQLite file {file} (AGENT_LEARNING_SQLITE_PATH or --db; else "
        ".agent-learning/local.db in the working directory), created empty when this store opened it;"
    )
    line = refused("policy", "show", "--agent-id", AGENT)
    assert line.startswith(f"error: --agent-id: {AGENT!r} has no policy in {file} (AGENT_LEARNING_SQLITE_PATH")


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A store with one agent, made with the CLI."""
    path = str(tmp_path / "agents.db")
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(["concise", "detailed"]))
    ok("init-policy", "--agent-id", AGENT, "--actions", str(actions), "--db", path)
    return path


def test_revise_refuses_an_object_of_dimensions(tmp_path: Path, db: str) -> None:
    structured = tmp_path / "dimensions.json"
    structured.write_text(json.dumps({"dimensions": {"prompt": ["a", "b"]}}))
    line = refused("policy", "revise", "--agent-id", AGENT, "--actions", str(structured), "--db", db)
    assert line.startswith("error: --actions: ") and "list" in line and "dimensions" in line
    with SQLiteStore(db) as store:
        assert load_current(store, AGENT).version == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("agents", ["", ",", " , "])
def test_the_demo_needs_an_agent(tmp_path: Path, agents: str) -> None:
    demo_db = tmp_path / "demo.db"
    assert refused("demo", "--agents", agents, "--db", str(demo_db), "--no-plot").startswith(
        "error: --agents: no agent given"
    )
    assert not demo_db.exists()


@pytest.mark.parametrize("agents, named", [("support-bot,support-bot", "support-bot given more than once"),
                                            ("support-bot,nobody", "unknown simulated agent(s) ['nobody']")])
def test_the_demo_refuses_repeated_or_unknown_agents_before_touching_its_db(
    tmp_path: Path, agents: str, named: str
) -> None:
    demo_db = tmp_path / "d.db"
    ok("demo", "--agents", "math-tutor", "--episodes", "100", "--batch", "100", "--db", str(demo_db), "--no-plot")
    before = demo_db.read_bytes()
    line = refused("demo", "--agents", agents, "--db", str(demo_db), "--episodes", "10", "--batch", "5", "--no-plot")
    assert line.startswith("error: --agents: ") and named in line
    assert demo_db.read_bytes() == before


def test_run_demo_refuses_a_repeated_scenario_before_touching_its_db(tmp_path: Path) -> None:
    from agent_learning.app.demo import run_demo

    demo_db = tmp_path / "d.db"
    demo_db.write_bytes(b"kept")
    with pytest.raises(ValueError, match=r"scenarios: .*more than once"):
        run_demo(db_path=demo_db, scenarios=["support-bot", "support-bot"], episodes_per_agent=10, batch=5)
    assert demo_db.read_bytes() == b"kept"


def test_a_demo_exploration_floor_too_large_for_a_scenario_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_settings(monkeypatch)
    monkeypatch.setenv("AGENT_LEARNING_EXPLORATION_FLOOR", "0.3")  # x 4 prompts of the math tutor: 1.2
    demo_db = tmp_path / "d.db"
    line = refused("demo", "--db", str(demo_db), "--episodes", "10", "--batch", "5", "--no-plot")
    assert line == ("error: AGENT_LEARNING_EXPLORATION_FLOOR=0.3: x 4 actions of the simulated math-tutor reaches 1 "
                    "(the floor is each one's minimum probability); set it below 0.25")
    assert not demo_db.exists()  # refused before the store was made


def test_paths_the_filesystem_refuses_are_named_in_one_line(
    tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "afile").write_text("a file, not a folder")
    blocked = str(tmp_path / "afile" / "x")
    actions = str(tmp_path / "actions.json")
    demo = ["demo", "--agents", "math-tutor", "--episodes", "100", "--batch", "100"]
    cases = {
        ("init-policy", "--agent-id", "a", "--actions", actions, "--db", f"{blocked}.db"): "--db",
        (*demo, "--db", f"{blocked}.db", "--no-plot"): "--db",
        (*demo, "--db", str(tmp_path / "demo.db"), "--plot", f"{blocked}.png"): "--plot",
        ("report", "--db", db, "--png", f"{blocked}.png"): "--png",
        ("report", "--db", db, "--html", f"{blocked}.html"): "--html",
    }
    if Path("/proc/self").is_dir():  # Linux: a folder where no file can be made
        cases[("init-policy", "--agent-id", "a", "--actions", actions, "--db", "/proc/x.db")] = "--db"
    for args, option in cases.items():
        assert refused(*args).startswith(f"error: {option}: cannot use "), args
    assert not (tmp_path / "demo.db").exists()  # refused before the demo ran

    def read_only(path: str) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr("agent_learning.store.sqlite.connect", read_only)
    assert refused("policy", "show", "--agent-id", AGENT, "--db", db) == (
        f"error: --db: cannot use {db}: attempt to write a readonly database"
    )


def test_a_folder_given_as_the_store_is_named_as_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``AGENT_LEARNING_SQLITE_PATH`` (``--db`` itself refuses a folder), not SQLite's
    "disk I/O error"."""
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(folder))
    for args in (("train",), ("audit",), ("policy", "show", "--agent-id", AGENT)):
        assert refused(*args) == f"error: --db: cannot use {folder}: a folder, not a file", args


def test_a_refused_command_leaves_no_folder_behind(tmp_path: Path, db: str) -> None:
    (tmp_path / "afile").write_text("a file, not a folder")
    blocked = str(tmp_path / "afile" / "x")
    demo = ["demo", "--agents", "math-tutor", "--episodes", "100", "--batch", "100"]
    fresh = tmp_path / "new" / "deeper"
    assert refused(*demo, "--db", str(fresh / "demo.db"), "--plot", f"{blocked}.png").startswith("error: --plot: ")
    assert refused("report", "--db", db, "--png", str(fresh / "r.png"), "--html", f"{blocked}.html").startswith(
        "error: --html: "
    )
    assert not (tmp_path / "new").exists()
    assert ok(*demo, "--db", str(fresh / "demo.db"), "--no-plot").exit_code == 0
    assert (fresh / "demo.db").is_file()


def test_demo_episodes_and_batch_are_checked_as_options(tmp_path: Path) -> None:
    demo = ["demo", "--agents", "math-tutor", "--db", str(tmp_path / "demo.db"), "--no-plot"]
    assert refused(*demo, "--batch", "0").startswith("error: --batch: 0 is not in the range")
    assert refused(*demo, "--episodes", "0").startswith("error: --episodes: 0 is not in the range")
    for episodes, batch in (("150", "100"), ("50", "100")):
        line = refused(*demo, "--episodes", episodes, "--batch", batch)
        assert line.startswith(f"error: --episodes: {episodes} is not a multiple of --batch {batch}")
        assert "try --episodes 100" in line
    assert not (tmp_path / "demo.db").exists()


def test_a_huge_limit_names_the_option(db: str) -> None:
    huge = "99999999999999999999"
    for args in (["episodes", "list"], ["runs", "list", "--agent-id", AGENT], ["dlq", "list"],
                 ["policy", "history", "--agent-id", AGENT], ["rescore", "--agent-id", AGENT, "--unjudged"]):
        assert refused(*args, "--db", db, "--limit", huge).startswith(f"error: --limit: {huge} is not in the range")
    for option in ("--last", "--smooth"):
        assert refused("report", "--db", db, option, huge).startswith(f"error: {option}: ")
    assert ok("episodes", "list", "--db", db, "--limit", "1000000").exit_code == 0


def test_the_policy_groups_db_reaches_its_subcommands(tmp_path: Path, db: str) -> None:
    assert f"{AGENT} v1" in ok("policy", "--db", db, "show", "--agent-id", AGENT).stdout
    assert "1 policy version" in ok("policy", "--db", db, "history", "--agent-id", AGENT).stdout
    assert "is pinned" in ok("policy", "--db", db, "pin", "--agent-id", AGENT).stdout
    other = str(tmp_path / "other.db")  # a subcommand's own --db wins
    assert refused("policy", "--db", db, "show", "--agent-id", AGENT, "--db", other).startswith(
        f"error: --db: there is no store at {other}"
    )


def test_train_and_episodes_list_refuse_an_unknown_agent(db: str) -> None:
    for args in (["train"], ["episodes", "list"]):
        line = refused(*args, "--agent-id", "nosuch", "--db", db)
        assert line.startswith("error: --agent-id: 'nosuch' has no policy") and AGENT in line
    assert "0 newest episodes" in ok("episodes", "list", "--agent-id", AGENT, "--db", db).stdout
    assert f"{AGENT}: " in ok("train", "--agent-id", AGENT, "--db", db).stdout


def test_migrate_scores_names_the_cosmos_settings_it_needs(tmp_path: Path) -> None:
    line = refused("store", "migrate-scores")  # no local store exists: it is not what is missing
    assert line.startswith("error: AGENT_LEARNING_STORE: migrate-scores copies between Cosmos DB containers")
    assert "CosmosDBConnection__accountEndpoint" in line and "--db" not in line
    assert not (tmp_path / "local.db").exists()


@pytest.mark.parametrize("group", [[], ["agent"], ["dlq"], ["runs"], ["episodes"], ["store"], ["policy"]])
def test_a_group_without_a_subcommand_prints_its_help(group: list[str]) -> None:
    result = ok(*group)
    assert result.stdout.startswith(f"Usage: {' '.join(['main', *group])} [OPTIONS]")
    assert "error:" not in result.output and "Commands:" in result.stdout


def test_report_and_demo_refuse_a_file_name_of_another_format(tmp_path: Path, db: str) -> None:
    """The chart is a PNG and the page HTML whatever the name says (which also keeps the two
    files apart)."""
    png, html = str(tmp_path / "r.png"), str(tmp_path / "r.html")
    assert refused("report", "--db", db, "--png", str(tmp_path / "r.txt"), "--html", html) == (
        f"error: --png: {tmp_path / 'r.txt'} does not end in .png, the format written there"
    )
    assert refused("report", "--db", db, "--png", png, "--html", png) == (
        f"error: --html: {png} does not end in .html or .htm, the format written there"
    )
    line = refused("demo", "--agents", "math-tutor", "--db", str(tmp_path / "d.db"), "--plot", str(tmp_path / "d.jpg"))
    assert line.startswith("error: --plot: ") and "does not end in .png" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actions.json", "agents.db"]


def test_the_demo_refuses_a_chart_that_would_replace_its_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot naming the --db file (by another spelling, too) would leave a PNG where the next
    commands it prints look for the store: refused before anything is written."""
    monkeypatch.chdir(tmp_path)
    demo = ["demo", "--agents", "math-tutor", "--episodes", "10", "--batch", "10", "--db", "same.png"]
    line = refused(*demo, "--plot", str(tmp_path / "same.png"))
    assert line.startswith(f"error: --plot: {tmp_path / 'same.png'} is also --db")
    assert list(tmp_path.iterdir()) == []
    ok(*demo, "--no-plot")


def test_a_demo_store_its_folder_will_not_let_go_of_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo deletes the old file first, which needs its folder writable (a shared folder, or
    ``--db /dev/null --force`` for anyone but root): a PermissionError printed a traceback."""
    demo = ["demo", "--agents", "math-tutor", "--episodes", "10", "--batch", "10", "--no-plot"]
    db = tmp_path / "demo.db"
    ok(*demo, "--db", str(db))
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self == db:
            raise PermissionError(13, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    result = cli(*demo, "--db", str(db))  # after the progress bar's first line
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.stderr.splitlines()[-1] == f"error: --db: cannot use {db}: Permission denied"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_the_demo_never_replaces_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """``--db /dev/null --force`` deleted /dev/null (run as root); a named pipe stands in for it."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    demo = ["demo", "--agents", "math-tutor", "--episodes", "10", "--batch", "10", "--no-plot", "--force"]
    assert refused(*demo, "--db", str(pipe)) == (
        f"error: --db: {pipe} is not a regular file, and the demo replaces the whole file; choose another --db"
    )
    assert stat.S_ISFIFO(pipe.stat().st_mode)


@pytest.mark.parametrize("command", [["agent", "list"], ["policy", "show", "--agent-id", AGENT], ["demo"]])
def test_an_empty_db_path_is_refused_not_taken_for_the_default(command: list[str]) -> None:
    assert refused(*command, "--db", "") == (
        "error: --db: is empty; give a file path, or leave the option out for the default"
    )


def test_counts_of_one_are_singular(tmp_path: Path, db: str) -> None:
    assert "1 agent in" in ok("agent", "list", "--db", db).stdout
    assert f"{AGENT}: 1 policy version" in ok("policy", "history", "--agent-id", AGENT, "--db", db).stdout
    text = ok("report", "--db", db, "--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html")).stdout
    assert f"{AGENT}: 1 policy version;" in text


def test_read_commands_leave_a_file_that_is_not_a_store_unchanged(tmp_path: Path, db: str) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (other, empty):
        before = path.read_bytes()
        for args in (["agent", "list"], ["episodes", "list"], ["dlq", "list"], ["policy", "show", "--agent-id", AGENT],
                     ["train"], ["audit"]):
            line = refused(*args, "--db", str(path))
            assert line.startswith(f"error: --db: {path} is not an agent-learning store"), args
        assert path.read_bytes() == before
    assert AGENT in ok("agent", "list", "--db", db).stdout
    assert "0 dead letters" in ok("dlq", "list", "--db", db).stdout  # a store made by init-policy has no queue yet
    ok("init-policy", "--agent-id", AGENT, "--actions", str(tmp_path / "actions.json"), "--db", str(empty))
    assert AGENT in ok("agent", "list", "--db", str(empty)).stdout  # init-policy makes a store in it


def test_the_demo_does_not_replace_a_file_that_is_not_a_store_without_force(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = other.read_bytes()
    line = refused("demo", "--agents", "math-tutor", "--episodes", "100", "--db", str(other), "--no-plot")
    assert line.startswith(f"error: --db: {other} is not an agent-learning store") and "--force" in line
    assert other.read_bytes() == before


def test_a_default_floor_too_large_for_the_actions_says_so_and_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = tmp_path / "k1000.json"
    many.write_text(json.dumps([f"k{i}" for i in range(1000)]))
    db = str(tmp_path / "floor.db")
    init = ["init-policy", "--agent-id", "k", "--actions", str(many), "--db", db]
    line = refused(*init)
    assert line.startswith("error: --exploration-floor: the default floor 0.001 x 1000 actions reaches 1"), line
    assert line.endswith("e.g. --exploration-floor 0.0005")
    line = refused(*init, "--exploration-floor", "0.002")
    assert line.startswith("error: --exploration-floor: 0.002 x 1000 actions reaches 1"), line
    for bad in ("nan", "-0.1"):
        line = refused(*init, f"--exploration-floor={bad}")
        assert line == f"error: --exploration-floor: must be a finite number >= 0, got {float(bad)}"
    monkeypatch.setenv("AGENT_LEARNING_EXPLORATION_FLOOR", "0.002")
    line = refused(*init)
    assert line.startswith("error: --exploration-floor: AGENT_LEARNING_EXPLORATION_FLOOR=0.002 x 1000 actions"), line
    monkeypatch.delenv("AGENT_LEARNING_EXPLORATION_FLOOR")
    dimensions = tmp_path / "dimensions.json"
    dimensions.write_text(json.dumps({"dimensions": {"k": list(range(1000)), "prompt": ["a", "b"]}}))
    line = refused("init-policy", "--agent-id", "k", "--actions", str(dimensions), "--db", db)
    assert "the default floor 0.001 x 1000 values of dimension 'k' reaches 1" in line

    limit = tmp_path / "k1024.json"
    limit.write_text(json.dumps([f"k{i}" for i in range(1024)]))
    ok("init-policy", "--agent-id", "k", "--actions", str(limit), "--db", db, "--exploration-floor", "0.0005")
    with SQLiteStore(db) as store:
        assert len(load_current(store, "k").actions) == 1024  # type: ignore[union-attr]


def test_a_revision_that_outgrows_the_kept_floor_names_actions(tmp_path: Path, db: str) -> None:
    many = tmp_path / "k1000.json"
    many.write_text(json.dumps([f"k{i}" for i in range(1000)]))
    line = refused("policy", "revise", "--agent-id", AGENT, "--actions", str(many), "--db", db)
    assert line.startswith("error: --actions: 1000 actions x the exploration floor 0.001 of v1 reaches 1"), line
    assert line.endswith("at most 999 actions fit")


@pytest.mark.parametrize(("args", "line"), [
    (["EP", "--score", "nan"], "error: --score: nan is not in the range 0<=x<=1."),
    (["EP", "--up", "--source", "bad source"],
     "error: --source: 'bad source' does not fit: use letters, digits, '.', '_' and '-', starting with a letter or "
     "digit, at most 64 characters"),
    (["", "--up"], "error: EPISODE_ID: '' does not fit: use letters, digits, '.', '_', ':' and '-', starting with a "
                   "letter or digit, at most 200 characters"),
    (["EP", "--up"], "error: EPISODE_ID: episode 'EP' does not exist"),
])
def test_bad_feedback_names_the_argument_or_option_alone(db: str, args: list[str], line: str) -> None:
    assert refused("feedback", *args, "--db", db) == line


@pytest.mark.parametrize(("structure", "line"), [
    ({"dimensions": {"p": ["a", "b"]}, "context": {"task": "categroy"}},
     "error: --actions: context.task: must be \"category\" or \"number\", got 'categroy'"),
    ({"dimensions": {"p": ["a", "b"], "bad dim": [1]}},
     "error: --actions: dimensions: 'bad dim' is not a dimension name: use a letter or '_' first, then letters, "
     "digits or '_', at most 32 characters"),
])
def test_a_bad_structure_is_named_as_the_actions_file_writes_it(
    tmp_path: Path, structure: dict[str, object], line: str
) -> None:
    actions = tmp_path / "structure.json"
    actions.write_text(json.dumps(structure))
    assert refused("init-policy", "--agent-id", "s", "--actions", str(actions), "--db", str(tmp_path / "s.db")) == line


@pytest.mark.parametrize("episodes, batch, named", [
    (150, 100, "episodes_per_agent: 150"),
    (50, 100, "episodes_per_agent: 50"),
    (10, 0, "batch: 0"),
])
def test_run_demo_refuses_episodes_that_are_not_whole_batches(
    tmp_path: Path, episodes: int, batch: int, named: str
) -> None:
    """run_demo(150, batch=100) would run one batch and report 100 episodes: refused, naming the
    argument, as the CLI's --episodes is."""
    from agent_learning.app.demo import run_demo

    demo_db = tmp_path / "d.db"
    demo_db.write_bytes(b"kept")
    with pytest.raises(ValueError, match=named):
        run_demo(db_path=demo_db, scenarios=["support-bot"], episodes_per_agent=episodes, batch=batch)
    assert demo_db.read_bytes() == b"kept"


def test_an_episode_whose_score_document_is_invalid_is_shown_as_rejected(db: str) -> None:
    judged_episodes(db, 2)
    with closing(sqlite3.connect(db)) as conn, conn:  # edited by hand: no reward function, a reward as text
        conn.execute("UPDATE scores SET doc = json_remove(doc, '$.reward_function') WHERE id = 'ep-0'")
        conn.execute("UPDATE scores SET doc = json_set(doc, '$.reward', 'high') WHERE id = 'ep-1'")

    shown = ok("episodes", "show", "ep-0", "--db", db).stdout
    assert "score ep-0 rejected: invalid score: reward_function: Field required; training skips it" in shown
    assert "rejected: invalid score: reward: Input should be a valid number" in ok("episodes", "show", "ep-1",
                                                                                    "--db", db).stdout
    listed = json.loads(ok("episodes", "list", "--json", "--db", db).stdout)
    assert [(e["id"], e["reward"], e["rejected"]) for e in listed] == [
        ("ep-1", None, "invalid score: reward: Input should be a valid number"),
        ("ep-0", None, "invalid score: reward_function: Field required")]
    assert ok("episodes", "list", "--db", db).stdout.count("rejected") == 3  # two rows and the legend
    said = " ".join(ok("feedback", "ep-0", "--up", "--db", db).stdout.split())  # stored, and said not learned
    assert said.endswith("stored, but not learned: the episode's score document is an invalid score: "
                         "reward_function: Field required, so training skips the episode (agent-learn audit counts "
                         "it rejected)")


def test_an_episode_document_edited_by_hand_is_shown_as_stored_and_said_invalid(db: str) -> None:
    judged_episodes(db, 1)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE episodes SET doc = json_set(doc, '$.probability', 'high') WHERE id = 'ep-0'")
    shown = ok("episodes", "show", "ep-0", "--db", db).stdout
    assert shown.startswith("ep-0 as stored is an invalid episode: probability: Input should be a valid number")
    assert "(p='high')" in shown  # not "Unknown format code 'f'"
    assert json.loads(ok("episodes", "show", "ep-0", "--json", "--db", db).stdout)["invalid"].startswith(
        "invalid episode: probability")


def test_an_invalid_run_document_is_named_and_the_other_runs_are_listed(db: str) -> None:
    judged_episodes(db, 4, train_each=True)
    with closing(sqlite3.connect(db)) as conn, conn:  # edited by hand
        conn.execute(f"UPDATE runs SET doc = json_set(doc, '$.metrics.kl', 'low') WHERE id = '{AGENT}:run:v3'")
    named = f"error: run '{AGENT}:run:v3' is invalid: invalid run: metrics.kl: Input should be a valid number"
    listed = cli("runs", "list", "--agent-id", AGENT, "--json", "--db", db)
    assert listed.exit_code == 1 and named in listed.stderr
    assert [r["run"]["id"] for r in json.loads(listed.stdout)] == [f"{AGENT}:run:v{v}" for v in (5, 4, 2)]
    table = cli("runs", "list", "--agent-id", AGENT, "--db", db)
    assert table.exit_code == 1 and f"{AGENT}:run:v4" in table.stdout and named in table.stderr
    shown = cli("runs", "show", f"{AGENT}:run:v3", "--db", db)
    assert shown.exit_code == 1 and named in shown.stderr and not shown.stdout
    assert "metrics.kl" in ok("runs", "show", f"{AGENT}:run:v4", "--db", db).stdout
