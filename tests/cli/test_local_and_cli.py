"""The embedded runner, the demo and the ``agent-learn`` commands, end to end on SQLite."""

from __future__ import annotations

import json
import os
import random
import shlex
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rich")
from cli_harness import clear_settings
from click.testing import CliRunner

from agent_learning.app.demo import run_demo
from agent_learning.app.embedded import FEED_CHECKPOINT, open_local
from agent_learning.app.settings import load_settings
from agent_learning.cli import main
from agent_learning.core.clock import ManualClock
from agent_learning.documents import PolicyDocument
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy
from agent_learning.sim.simulate import support_bot
from agent_learning.store.sqlite import SQLiteStore

pytestmark = pytest.mark.usefixtures("clean_env")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def agents_with_actions_a_and_b(tmp_path: Path, *agent_ids: str) -> str:
    """A store file in ``tmp_path`` where ``init-policy`` created each agent with actions a and b."""
    db = str(tmp_path / "x.db")
    actions = tmp_path / "actions.json"
    actions.write_text('["a", "b"]')
    for agent_id in agent_ids:
        args = ["init-policy", "--agent-id", agent_id, "--actions", str(actions), "--db", db]
        created = CliRunner().invoke(main, args)
        assert created.exit_code == 0, created.output
    return db


def test_local_pipeline_learns_and_its_checkpoint_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "local.db"
    clock = ManualClock()
    scenario = support_bot()
    rng = random.Random(4)
    pipeline = open_local(load_settings(), path=db, clock=clock)
    create_policy(pipeline.store, SoftmaxPolicy.from_actions(scenario.agent_id, scenario.actions,
                                                             exploration_floor=0.005).to_document(created_at=clock.now()))
    for _ in range(15):
        doc = load_current(pipeline.store, scenario.agent_id)
        assert doc is not None
        policy = SoftmaxPolicy.from_document(doc, rng=rng)
        for _ in range(100):
            scenario.run_episode(pipeline.store, policy.choose(), rng, clock)
        report = pipeline.run_once()
        assert report.enqueued == 100 and report.outcomes == {"scored": 100}
        assert [t.status for t in report.trained] == ["published"]
    checkpoint = pipeline.store.get_checkpoint(FEED_CHECKPOINT)
    pipeline.store.close()
    pipeline.queue.close()

    reopened = open_local(load_settings(), path=db, clock=clock)
    assert reopened.store.get_checkpoint(FEED_CHECKPOINT) == checkpoint
    assert reopened.pump() == 0  # nothing is sent twice after a restart
    final = load_current(reopened.store, scenario.agent_id)
    assert final is not None and final.version == 16
    probs = SoftmaxPolicy.from_document(final).probabilities
    assert max(probs, key=probs.__getitem__) == "k=5"
    assert probs["k=5"] > 0.8


def test_demo_reaches_the_best_action_and_writes_a_plot(tmp_path: Path) -> None:
    result = run_demo(db_path=tmp_path / "demo.db", episodes_per_agent=2_000, batch=100, seed=3)
    summary = result.summary()
    assert summary["episodes"] == 6_000
    assert summary["outcomes"] == {"scored": 6_000}
    for agent in ("math-tutor", "support-bot"):
        info = summary["agents"][agent]
        assert info["final_version"] == 21
        assert info["true_best_action"] == {"math-tutor": "step-by-step", "support-bot": "k=5"}[agent]
        assert info["best_action_probability"] >= 0.9
        assert info["reward_trend"]["last"] > info["reward_trend"]["first"] - 0.02
    triage = summary["agents"]["triage-bot"]
    assert "true_best_action" not in triage and triage["final_version"] == 21
    best = triage["best_by_segment"]
    assert best["task=billing"]["configuration"].startswith("prompt=concise:")
    assert best["task=technical"]["configuration"].startswith("prompt=step-by-step:")
    assert min(b["probability"] for b in best.values()) >= 0.6
    assert "agent-learn policy show --agent-id triage-bot --db " + str(tmp_path / "demo.db") in summary["next"]

    from agent_learning.ops.plots import plot_histories

    png = plot_histories(result.agents, tmp_path / "chart.png")
    width, height = png_size(png)
    assert width > 800 and height > 600


def test_cli_demo_json(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["demo", "--episodes", "600", "--batch", "100", "--db", str(tmp_path / "d.db"),
                                  "--plot", str(tmp_path / "p.png"), "--json", "--agents", "support-bot"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    info = summary["agents"]["support-bot"]
    assert info["true_best_action"] == "k=5"
    assert set(info["final_probabilities"]) == {"k=1", "k=3", "k=5", "k=10"}
    assert abs(sum(info["final_probabilities"].values()) - 1) < 1e-3
    assert summary["plot"] == str(tmp_path / "p.png") and png_size(tmp_path / "p.png")[0] > 0


def test_cli_creates_and_shows_a_structured_contextual_policy(tmp_path: Path) -> None:
    actions = tmp_path / "dims.json"
    actions.write_text(json.dumps({"dimensions": {"prompt": ["concise", "steps"], "retrieval_k": [1, 3]},
                                   "context": {"task": "category"},
                                   "excluded": [{"prompt": "concise", "retrieval_k": 3}]}))
    db = str(tmp_path / "s.db")
    runner = CliRunner()
    made = runner.invoke(main, ["init-policy", "--agent-id", "triage", "--actions", str(actions), "--db", db])
    assert made.exit_code == 0, made.output
    assert "dimensions prompt (2), retrieval_k (2) learning from ['task']" in made.stdout
    shown = runner.invoke(main, ["policy", "show", "--agent-id", "triage", "--db", db, "--json"])
    views = json.loads(shown.stdout)["probabilities"]
    assert PolicyDocument.from_dict(json.loads(shown.stdout)["policy"]).structured  # the document as stored
    assert views["no context"]["prompt"] == pytest.approx({"prompt=concise": 1 / 3, "prompt=steps": 2 / 3})
    text = runner.invoke(main, ["policy", "show", "--agent-id", "triage", "--db", db])
    assert text.exit_code == 0 and "retrieval_k" in text.stdout and "no segments learned yet" in text.stdout


def test_every_way_of_creating_a_policy_gives_it_the_same_exploration_floor(tmp_path: Path) -> None:
    """init-policy (flat and with dimensions) and the Python API as the README shows it start from
    the settings' floor and temperature (the Python API once had no floor)."""
    dims = tmp_path / "dims.json"
    dims.write_text(json.dumps({"dimensions": {"prompt": ["concise", "steps"]}, "context": {"task": "category"}}))
    db = agents_with_actions_a_and_b(tmp_path, "flat")
    made_dims = CliRunner().invoke(main, ["init-policy", "--agent-id", "dims", "--actions", str(dims), "--db", db])
    assert made_dims.exit_code == 0, made_dims.output
    with SQLiteStore(db) as store:
        made = [load_current(store, "flat"), load_current(store, "dims")]
    made += [
        SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=None),
        StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"task": "category"}).document,
    ]
    settings = load_settings()
    assert {(doc.exploration_floor, doc.temperature) for doc in made} == {
        (settings.exploration_floor, settings.temperature)}


def test_cli_demo_tables(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--episodes", "300", "--db", str(tmp_path / "d.db"), "--no-plot"])
    assert result.exit_code == 0, result.output
    assert "math-tutor: action probabilities, by policy version" in result.stdout
    assert "true best action" in result.stdout and "episodes in" in result.stdout
    assert "triage-bot: each value's probability with no context, by policy version" in result.stdout
    assert "task=billing: true best configuration prompt=concise:" in result.stdout


def test_the_demo_text_and_json_report_one_reward_trend_and_its_next_commands_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    args = ["demo", "--episodes", "1000", "--batch", "100", "--no-plot", "--agents", "support-bot", "--db", "my.db"]
    text = runner.invoke(main, args)
    assert text.exit_code == 0, text.output
    summary = json.loads(runner.invoke(main, [*args, "--json"]).stdout)  # same seed: the same run
    trend = summary["agents"]["support-bot"]["reward_trend"]
    assert trend["runs"] == 2  # a fifth of the 10 runs
    assert f"first {trend['runs']} training runs → the last {trend['runs']}: " \
           f"{trend['first']:.3f} → {trend['last']:.3f}" in text.stdout

    one = runner.invoke(main, ["demo", "--episodes", "500", "--batch", "100", "--no-plot", "--agents", "support-bot",
                               "--db", "one.db"])
    assert one.exit_code == 0 and "first 1 training run → the last 1: " in one.stdout  # a fifth of 5 runs

    printed = [line.removeprefix("next: ") for line in text.stdout.splitlines() if line.startswith("next: ")]
    assert printed == summary["next"] and len(printed) == 4
    assert summary["serve"] == "agent-learn serve --db my.db"  # the dashboard on the demo's data
    assert "dashboard: agent-learn serve --db my.db, then open http://127.0.0.1:7071/api/dashboard" in text.stdout
    for command in printed:
        argv = command.split()
        assert argv[0] == "agent-learn" and argv[-2:] == ["--db", "my.db"]
        ran = runner.invoke(main, argv[1:])
        assert ran.exit_code == 0, f"{command}: {ran.output}"


def test_the_demo_runs_embedded_with_the_offline_judge_whatever_the_environment_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, judge_server: Any
) -> None:
    """Settings for the real pipeline in the environment (a judge model and its sampling, Service
    Bus, Cosmos DB) are not the demo's: it judges all its simulated episodes offline, in its own file."""
    for name, value in {
        "JUDGING": "*=0.1",
        "JUDGE": "evaluators", "JUDGE_BASE_URL": judge_server.base_url, "JUDGE_MODEL": judge_server.model,
        "JUDGE_API_KEY": "key", "QUEUE": "servicebus", "SERVICEBUS_NAMESPACE": "nowhere.servicebus.windows.net",
        "STORE": "cosmos", "COSMOS_ENDPOINT": "https://nowhere.documents.azure.com:443/",
    }.items():
        monkeypatch.setenv(f"AGENT_LEARNING_{name}", value)
    args = ["demo", "--episodes", "20", "--batch", "10", "--agents", "math-tutor", "--no-plot", "--json"]
    result = CliRunner().invoke(main, [*args, "--db", str(tmp_path / "d.db")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcomes"] == {"scored": 20}
    run_demo(db_path=tmp_path / "e.db", scenarios=["math-tutor"], episodes_per_agent=10, batch=10)
    assert judge_server.count() == 0


def files_open_on(db: Path) -> list[str]:
    """The files this process holds open of the SQLite database ``db`` (with its -wal and -shm)."""
    found = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith(str(db)):
            found.append(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to list open files")
def test_the_demo_and_train_close_the_store_and_both_queues(tmp_path: Path) -> None:
    """The training queue too: an open connection keeps the file in use (on Windows the next demo
    could not replace it)."""
    db = tmp_path / "d.db"
    run_demo(db_path=db, scenarios=["math-tutor"], episodes_per_agent=10, batch=10)
    assert files_open_on(db) == []
    trained = CliRunner().invoke(main, ["train", "--db", str(db)])
    assert trained.exit_code == 0, trained.output
    assert files_open_on(db) == []


def test_the_next_commands_quote_a_store_path_with_spaces(tmp_path: Path) -> None:
    db = str(tmp_path / "my demos" / "d.db")
    runner = CliRunner()
    ran = runner.invoke(main, ["demo", "--episodes", "10", "--batch", "10", "--agents", "math-tutor", "--no-plot",
                               "--db", db])
    assert ran.exit_code == 0, ran.output
    printed = [line.removeprefix("next: ") for line in ran.stdout.splitlines() if line.startswith("next: ")]
    assert len(printed) == 4
    for command in printed:
        argv = shlex.split(command)
        assert argv[0] == "agent-learn" and argv[-2:] == ["--db", db]
        assert runner.invoke(main, argv[1:]).exit_code == 0, command


def test_cli_rejects_unknown_demo_agent(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--agents", "nobody", "--db", str(tmp_path / "d.db")])
    assert result.exit_code == 2
    assert "--agents" in result.stderr and "nobody" in result.stderr


def test_cli_init_policy_then_policy_then_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 episodes: fewer than the guardrail's default effective samples to judge (it would hold them).
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL_MIN_EFFECTIVE_SAMPLES", "5")
    db = str(tmp_path / "cli.db")
    actions = tmp_path / "actions.json"
    actions.write_text(json.dumps(["concise", {"id": "detailed", "description": "long answers",
                                                "config": {"max_tokens": 800}}]))
    runner = CliRunner()
    created = runner.invoke(main, ["init-policy", "--agent-id", "helper", "--actions", str(actions), "--db", db])
    assert created.exit_code == 0, created.output
    assert "helper v1" in created.stdout

    again = runner.invoke(main, ["init-policy", "--agent-id", "helper", "--actions", str(actions), "--db", db])
    assert again.exit_code == 0 and "helper already has this policy (now v1)" in again.stdout  # re-run: no change
    other = tmp_path / "other-actions.json"
    other.write_text(json.dumps(["concise", "bulleted"]))
    refused = runner.invoke(main, ["init-policy", "--agent-id", "helper", "--actions", str(other), "--db", db])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert refused.stderr.startswith("error: --agent-id: agent 'helper' already has a policy, made from other")
    assert "agent-learn policy revise --agent-id helper --actions FILE" in refused.stderr

    shown = runner.invoke(main, ["policy", "--agent-id", "helper", "--db", db, "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)["policy"]
    assert doc["version"] == 1 and [a["id"] for a in doc["actions"]] == ["concise", "detailed"]
    assert doc["actions"][1]["config"] == {"max_tokens": 800}

    table = runner.invoke(main, ["policy", "--agent-id", "helper", "--db", db])
    assert table.exit_code == 0 and "0.5000" in table.stdout

    # An agent writes episodes with the library; `train` scores them and publishes v2.
    from agent_learning.agent.capture import EpisodeCapture
    from agent_learning.store.sqlite import SQLiteStore

    with SQLiteStore(db) as store:
        policy = SoftmaxPolicy.from_document(load_current(store, "helper"), seed=1)  # type: ignore[arg-type]
        for i in range(20):
            decision = policy.choose()
            with EpisodeCapture(store, decision, input=f"What is {i} + 1?") as run:
                run.end(f"{i} plus one is {i + 1}, so the answer is {i + 1}." if decision.action_id == "detailed"
                        else str(i + 1))
    trained = runner.invoke(main, ["train", "--db", db, "--json"])
    assert trained.exit_code == 0, trained.output
    report = json.loads(trained.stdout)
    assert report["enqueued"] == 20 and report["outcomes"] == {"scored": 20}  # named as in demo --json
    assert report["scored"] == report["outcomes"]  # the name it had first, kept for scripts
    with SQLiteStore(db) as store:
        doc2 = load_current(store, "helper")
        (run,) = store.list_runs("helper")
    # The run's episode count and batch mean, as the text output shows them.
    assert report["training"] == [{"agent_id": "helper", "status": "published", "version": 2, "reason": "",
                                   "episodes": 20, "mean_reward": run["metrics"]["mean_reward"]}]
    assert 0 < run["metrics"]["mean_reward"] < 1
    assert doc2 is not None and doc2.logits[1] > doc2.logits[0]  # "detailed" scores higher with the offline judge

    quiet = runner.invoke(main, ["train", "--db", db, "--agent-id", "helper"])
    assert quiet.exit_code == 0 and "no_new_scores" in quiet.stdout
    quiet = runner.invoke(main, ["train", "--db", db, "--agent-id", "helper", "--json"])
    assert json.loads(quiet.stdout)["training"] == [{"agent_id": "helper", "status": "no_new_scores", "version": 2,
                                                     "reason": "", "episodes": 0, "mean_reward": None}]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ("[]", "non-empty JSON list"),
        ("{}", 'holds an object; it needs "dimensions"'),
        ('{"dimensions": {"k": [1]}, "contexts": {}}', "(unknown: ['contexts'])"),
        ('{"dimensions": {"k": []}}', "dimensions.k: must be a non-empty list of values"),
        ('{"dimensions": {"k": [1, 3, 1]}}', "dimensions.k: the value 1 is listed twice"),
        ('{"dimensions": {"k": [1, 1.0]}}', "dimensions.k: the values 1 and 1.0 are the same value"),
        ('{"dimensions": {"k": [1, "1"]}}', "dimensions.k: the values 1 and '1' both make the action id 'k=1'"),
        ('{"dimensions": {"k": [1, 2]}, "excluded": [{"k": 3}]}', "excluded[0].k"),
        ('["ok", "bad id!"]', "id"),
    ],
)
def test_cli_init_policy_reports_bad_action_files(tmp_path: Path, content: str, message: str) -> None:
    actions = tmp_path / "actions.json"
    actions.write_text(content)
    result = CliRunner().invoke(main, ["init-policy", "--agent-id", "a", "--actions", str(actions),
                                       "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2
    assert message in result.stderr


def test_cli_init_policy_refuses_a_temperature_no_training_could_use(tmp_path: Path) -> None:
    """Before the fix `--temperature 1e-310` created the policy, and every training of it failed."""
    actions = tmp_path / "actions.json"
    actions.write_text('["a", "b"]')
    args = ["init-policy", "--agent-id", "a", "--actions", str(actions), "--db", str(tmp_path / "x.db")]
    result = CliRunner().invoke(main, [*args, "--temperature", "1e-310"])
    assert result.exit_code == 2 and "--temperature" in result.stderr and "0.01" in result.stderr
    assert CliRunner().invoke(main, [*args, "--temperature", "0.01"]).exit_code == 0


def test_cli_train_trains_every_agent_and_exits_1_if_one_could_not_be(tmp_path: Path) -> None:
    from agent_learning.store.sqlite import SQLiteStore

    db = agents_with_actions_a_and_b(tmp_path, "alpha", "beta")
    with SQLiteStore(db) as store:
        store.put_raw_current_policy("alpha", {"id": "alpha:current", "logits": ["NaN"]})
    result = CliRunner().invoke(main, ["train", "--db", db, "--json"])
    assert result.exit_code == 1
    assert [(t["agent_id"], t["status"]) for t in json.loads(result.stdout)["training"]] == [
        ("alpha", "invalid_policy"), ("beta", "no_new_scores")]


def test_cli_train_says_a_current_document_is_invalid_when_its_agent_has_no_new_scores(tmp_path: Path) -> None:
    """Before the fix `train` said `no_new_scores` and exited 0 (with --agent-id: an error before
    anything was scored), without pointing at the rollback that repairs it."""
    from agent_learning.store.sqlite import SQLiteStore

    db = agents_with_actions_a_and_b(tmp_path, "alpha", "beta")
    with SQLiteStore(db) as store:  # edited by hand: the version and cursor still read
        store.put_raw_current_policy("alpha", {**store.get_current_policy("alpha").doc, "logits": [0.0]})
    reason = ("invalid policy 'alpha:current': logits: has 1 entries but there are 2 actions; "
              "`agent-learn policy rollback --agent-id alpha VERSION` repairs it")
    for args in ([], ["--agent-id", "alpha"]):
        result = CliRunner().invoke(main, ["train", "--db", db, "--json", *args])
        assert result.exit_code == 1, result.output
        training = json.loads(result.stdout)["training"]
        assert (training[0]["agent_id"], training[0]["status"], training[0]["reason"]) == (
            "alpha", "invalid_policy", reason)
    assert CliRunner().invoke(main, ["policy", "rollback", "--agent-id", "alpha", "1", "--db", db]).exit_code == 0
    result = CliRunner().invoke(main, ["train", "--db", db, "--json"])
    assert result.exit_code == 0 and {t["status"] for t in json.loads(result.stdout)["training"]} == {"no_new_scores"}


def test_cli_train_scores_the_rest_when_one_episode_fails_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_learning.app.embedded as local
    from agent_learning.agent.capture import EpisodeCapture
    from agent_learning.store.sqlite import SQLiteStore

    db = agents_with_actions_a_and_b(tmp_path, "alpha")
    with SQLiteStore(db) as store:
        policy = SoftmaxPolicy.from_document(load_current(store, "alpha"), seed=1)  # type: ignore[arg-type]
        for i in range(3):
            EpisodeCapture(store, policy.choose(), input=f"q{i}", episode_id=f"ep-{i}").end("answer")
    score = local.score_message

    def broken_on_ep_1(body: bytes, *args: Any, **kwargs: Any) -> Any:
        if b'"ep-1"' in body:
            raise RuntimeError("a bug")
        return score(body, *args, **kwargs)

    monkeypatch.setattr(local, "score_message", broken_on_ep_1)
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")  # two episodes: too few to judge, the guardrail warns
    result = CliRunner().invoke(main, ["train", "--db", db])
    assert result.exit_code == 1
    assert "scoring outcomes: scored 2, failed 1" in result.stdout
    assert "1 episode(s) could not be scored" in result.stdout
    assert "alpha: published → v2 (2 episodes" in result.stdout


def test_cli_policy_for_unknown_agent(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "x.db").close()
    result = CliRunner().invoke(main, ["policy", "--agent-id", "ghost", "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2 and "ghost" in result.stderr


def test_cli_reads_never_create_a_store_at_a_mistyped_path(tmp_path: Path) -> None:
    mistyped = tmp_path / "lcoal.db"
    for args in (["policy", "show", "--agent-id", "a"], ["episodes", "list"], ["dlq", "list"], ["audit"],
                 ["train"], ["runs", "list", "--agent-id", "a"], ["report"]):
        result = CliRunner().invoke(main, [*args, "--db", str(mistyped)])
        assert result.exit_code == 2 and "no store at" in result.stderr, (args, result.output)
    assert not mistyped.exists()


def test_cli_reports_bad_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_W_INTENT", "lots")
    result = CliRunner().invoke(main, ["train", "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2 and "AGENT_LEARNING_W_INTENT" in result.stderr


def test_console_script_is_installed() -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "agent-learn"]
    assert script.value == "agent_learning.cli:main"


def test_the_demo_replaces_only_its_own_store_unless_forced(tmp_path: Path) -> None:
    db = str(tmp_path / "mine.db")
    with SQLiteStore(db) as store:
        create_policy(store, SoftmaxPolicy.from_actions("my-agent", ["a", "b"]).to_document(created_at=None))
    args = ["demo", "--db", db, "--episodes", "100", "--agents", "support-bot", "--no-plot", "--json"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "my-agent" in refused.stderr and "--force" in refused.stderr
    with SQLiteStore(db) as store:
        assert store.list_agents() == ["my-agent"]  # untouched
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0
    assert CliRunner().invoke(main, args).exit_code == 0  # a demo's own store is replaced without asking
    with SQLiteStore(db) as store:
        assert store.list_agents() == ["support-bot"]


def test_the_demo_does_not_take_an_agent_named_like_one_of_its_own_for_its_own(tmp_path: Path) -> None:
    """The README's quick start creates ``support-bot`` (with other actions than the demo's): pointing
    the demo at that store replaced it, agent and episodes, without --force."""
    db = str(tmp_path / "local.db")
    with SQLiteStore(db) as store:
        create_policy(store, SoftmaxPolicy.from_actions("support-bot", ["k=1", "k=5"]).to_document(created_at=None))
    args = ["demo", "--db", db, "--episodes", "10", "--batch", "10", "--agents", "support-bot", "--no-plot"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "support-bot, which the demo did not write" in refused.stderr
    with SQLiteStore(db) as store:
        assert load_current(store, "support-bot").action_ids == ["k=1", "k=5"]  # untouched
    assert CliRunner().invoke(main, args).exit_code == 2
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0
    assert CliRunner().invoke(main, args).exit_code == 0  # now the demo's own


def test_history_of_a_structured_agent_has_its_probabilities_per_segment(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    runner = CliRunner()
    ran = runner.invoke(main, ["demo", "--episodes", "400", "--batch", "100", "--db", db, "--no-plot", "--json",
                               "--agents", "triage-bot"])
    assert ran.exit_code == 0, ran.output
    shown = runner.invoke(main, ["policy", "history", "--agent-id", "triage-bot", "--db", db, "--json"])
    rows = json.loads(shown.stdout)
    assert "segments" not in rows[0]  # version 1 has learned no segment yet
    last = rows[-1]["segments"]
    assert set(last) == {"task=billing", "task=technical"}
    assert sum(p for a, p in last["task=billing"].items() if a.startswith("prompt=")) == pytest.approx(1, abs=1e-5)


def test_cli_train_exits_1_when_the_judge_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, judge_server: Any
) -> None:
    """An episode the judge could not score comes back later: `train` said so only in a warning
    and exited 0, so a script took a judge outage for success."""
    from agent_learning.agent.capture import EpisodeCapture
    from agent_learning.agent.client import PolicyClient

    clear_settings(monkeypatch)
    for name, value in {
        "JUDGE": "evaluators", "JUDGE_BASE_URL": judge_server.base_url, "JUDGE_MODEL": judge_server.model,
        "JUDGE_API_KEY": "key", "JUDGE_MAX_ATTEMPTS": "1", "QUEUE_MAX_DELIVERIES": "2",
    }.items():
        monkeypatch.setenv(f"AGENT_LEARNING_{name}", value)
    db = agents_with_actions_a_and_b(tmp_path, "bot")
    with SQLiteStore(db) as store:
        EpisodeCapture(store, PolicyClient(store, "bot").choose(), input="How?", episode_id="ep-0").end("Like so.")
    judge_server.set_mode("http_500")
    result = CliRunner().invoke(main, ["train", "--db", db])
    assert result.exit_code == 1, result.output
    assert "found the judge unavailable" in result.output and "dlq replay" in result.output
    judge_server.reset()
    assert CliRunner().invoke(main, ["train", "--db", db]).exit_code == 0  # the dead letter is not a retry
