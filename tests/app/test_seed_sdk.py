"""The ``azure-agents-learning-sdk`` README's contract (issue 41): its example, names, variables and
CLI lines work here as written, on the embedded default and over the Cosmos wire with the real
judges; its variables are read or refused with what replaces them; unknown ``AGENT_LEARNING_*``
variables are refused by every entry point. What that README gives is in ``tests/fixtures/seed``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cli_harness import clear_settings, cli, ok

from agent_learning.app import handlers, wiring
from agent_learning.app.embedded import open_local
from agent_learning.app.settings import load_settings
from agent_learning.core.errors import ConfigurationError, InvalidDocument
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.sqlite import SQLiteStore

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed"
EXAMPLE = (SEED / "example.py").read_text()
ROOT = Path(__file__).resolve().parents[2]
GUARDRAIL = "warn"
"""The example trains on one episode and the CLI lines on two: too few for the guardrail to judge (it would hold
them, tests/evaluation/test_guardrail.py); it warns, so they publish as the seed's SDK, which had no guardrail, did."""


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No settings, in a fresh folder: the embedded default is ``./.agent-learning/local.db``."""
    clear_settings(monkeypatch)
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", GUARDRAIL)
    monkeypatch.chdir(tmp_path)
    return tmp_path / ".agent-learning" / "local.db"


def run_example() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(EXAMPLE, str(SEED / "example.py"), "exec"), namespace)
    namespace["capture"].close()
    return namespace


def test_the_readme_example_runs_as_written_on_the_embedded_default(embedded: Path) -> None:
    done = run_example()
    run, decision = done["run"], done["decision"]
    assert (run.status, run.version, run.run.episodes) == ("published", 2, 1)
    assert done["runner"].policy.version == 2  # the runner's policy is the published one
    with SQLiteStore(embedded) as store:
        (episode,) = store.list_episodes("dq")
        assert (episode["action_id"], episode["policy_version"]) == (decision.action.id, 1)
        assert episode["logprob"] == pytest.approx(decision.logprob)
        score = store.get_score(episode["id"], "dq")
        assert set(score["metrics"]) == {"intent_resolution", "task_adherence", "task_completion"}
        assert -1 <= score["reward"] <= 1
        assert store.get_current_policy("dq").doc["version"] == 2


def test_the_readme_example_runs_over_cosmos_with_the_real_judges(
    cosmos_server: Any, judge_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only the seed's variables (and the local servers' keys) choose Cosmos DB and the evaluators."""
    from cosmos_fixture import CLIENT_KWARGS, SteppingClock

    from agent_learning.store.cosmos import CosmosStore

    clear_settings(monkeypatch)
    monkeypatch.chdir(tmp_path)
    database = f"seed-{uuid.uuid4().hex[:8]}"
    setup = CosmosStore.connect(cosmos_server.endpoint, database, key=cosmos_server.key, create_containers=True,
                                client_kwargs=CLIENT_KWARGS)
    for name, value in {
        "AGENT_LEARNING_COSMOS_ENDPOINT": cosmos_server.endpoint,
        "AGENT_LEARNING_COSMOS_KEY": cosmos_server.key,  # the local server's; Azure uses Entra ID
        "AGENT_LEARNING_COSMOS_DATABASE": database,
        "AGENT_LEARNING_JUDGE_ENDPOINT": judge_server.azure_endpoint,
        "AGENT_LEARNING_JUDGE_DEPLOYMENT": judge_server.deployment,
        "AGENT_LEARNING_JUDGE_API_KEY": judge_server.api_key,  # the local server's; Azure uses Entra ID
        "AGENT_LEARNING_GUARDRAIL": GUARDRAIL,
    }.items():
        monkeypatch.setenv(name, value)
    # A settle window passes between any two operations, so what was scored is trained at once.
    opener, stepping = wiring.open_store, SteppingClock()
    monkeypatch.setattr(wiring, "open_store", lambda settings, *, path=None, clock=None: opener(
        settings, path=path, clock=stepping))
    try:
        done = run_example()
        assert (done["run"].status, done["run"].version, done["run"].run.episodes) == ("published", 2, 1)
        assert sorted(r.evaluator for r in judge_server.requests) == [
            "intent_resolution", "task_adherence", "task_completion"]
        (episode,) = setup.list_episodes("dq")
        score = setup.get_score(episode["id"], "dq")
        assert score["judge"]["name"] != "offline" and len(score["metrics"]) == 3
        assert setup.get_current_policy("dq").doc["version"] == 2
    finally:
        setup._client.delete_database(database)  # type: ignore[union-attr]
        setup.close()


def test_the_readme_cli_lines_run(embedded: Path) -> None:
    """init-policy, train --limit (at most that many episodes judged and learned), policy --agent-id."""
    ok("init-policy", "--agent-id", "dq", "--actions", str(SEED / "actions.json"))
    from agent_learning import EpisodeCapture

    policy = SoftmaxPolicy.from_document(SQLiteStore(embedded).get_current_policy("dq").doc, seed=1)
    with EpisodeCapture() as capture:
        for _ in range(3):
            decision = policy.choose()
            ctx = capture.start(user_input="Summarise Q3 sales", policy_id=policy.snapshot().id,
                                policy_version=policy.snapshot().version, action_id=decision.action.id,
                                action_logprob=decision.logprob)
            capture.end(ctx, assistant_output="Sales rose.")
    trained = json.loads(ok("train", "--agent-id", "dq", "--limit", "2", "--json").output)
    assert trained["outcomes"] == {"scored": 2}
    assert [(t["status"], t["episodes"]) for t in trained["training"]] == [("published", 2)]
    assert "dq v2" in ok("policy", "--agent-id", "dq").output
    again = json.loads(ok("train", "--agent-id", "dq", "--limit", "2", "--json").output)
    assert again["outcomes"] == {"scored": 1}  # the one left waiting
    assert cli("train", "--limit", "0").exit_code == 2


SEED_SETTINGS = [
    ("AGENT_LEARNING_LR", "0.05", "learning_rate", 0.05),
    ("AGENT_LEARNING_W_INTENT", "0.5", "w_intent", 0.5),
    ("AGENT_LEARNING_W_ADHERENCE", "0.25", "w_adherence", 0.25),
    ("AGENT_LEARNING_W_COMPLETION", "0.2", "w_completion", 0.2),
    ("AGENT_LEARNING_COSMOS_DATABASE", "dq_rl", "cosmos_database", "dq_rl"),
    ("AGENT_LEARNING_JUDGE_DEPLOYMENT", "gpt-4o", "judge_deployment", "gpt-4o"),
    ("AGENT_LEARNING_JUDGE_ENDPOINT", "https://oai.openai.azure.com/", "judge_azure_endpoint",
     "https://oai.openai.azure.com/"),
    ("AGENT_LEARNING_JUDGE_ENDPOINT", "https://oai.openai.azure.com/", "judge", "evaluators"),
    ("AGENT_LEARNING_COSMOS_ENDPOINT", "https://acct.documents.azure.com:443/", "store", "cosmos"),
]
"""Each variable of the seed README with a setting here: a value, the setting, what it becomes."""


@pytest.mark.parametrize(("variable", "value", "setting", "expected"), SEED_SETTINGS)
def test_each_seed_variable_sets_the_setting_doing_its_job(
    embedded: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, setting: str, expected: Any
) -> None:
    judge_model = {"AGENT_LEARNING_JUDGE_ENDPOINT": "https://oai.openai.azure.com/",
                   "AGENT_LEARNING_JUDGE_DEPLOYMENT": "gpt-4o"}
    if variable in judge_model:  # the evaluators need both
        for name, other in judge_model.items():
            monkeypatch.setenv(name, other)
    monkeypatch.setenv(variable, value)
    settings = load_settings()
    assert getattr(settings, setting) == expected
    shown = {r["setting"]: r for r in json.loads(ok("config", "--json").output)}
    assert shown[setting]["value"] == expected
    assert shown[setting]["origin"] == variable  # the seed's name, as it was set


def test_every_seed_variable_is_tested() -> None:
    """Every variable of the seed README is mapped above or refused below."""
    names = {line.split()[0] for line in (SEED / "variables.txt").read_text().splitlines()}
    assert names - {row[0] for row in SEED_SETTINGS} == {"AGENT_LEARNING_BASELINE_DECAY"}


def test_a_switch_yields_to_the_setting_it_implies(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_COSMOS_ENDPOINT", "https://acct.documents.azure.com:443/")
    monkeypatch.setenv("AGENT_LEARNING_STORE", "memory")
    assert load_settings().store == "memory"


def test_a_seed_variable_without_a_knob_here_is_refused_saying_what_replaces_it(
    embedded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_LEARNING_BASELINE_DECAY", "0.9")
    with pytest.raises(ConfigurationError, match=r"AGENT_LEARNING_BASELINE_DECAY: .*mean reward of its own batch"):
        load_settings()


def test_a_judge_model_without_the_judge_chosen_is_refused(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed skipped judging without a judge endpoint; here a deployment alone is not ignored."""
    monkeypatch.setenv("AGENT_LEARNING_JUDGE_DEPLOYMENT", "gpt-4o")
    with pytest.raises(ConfigurationError, match=r"AGENT_LEARNING_JUDGE_DEPLOYMENT configure.*JUDGE=evaluators"):
        load_settings()
    monkeypatch.setenv("AGENT_LEARNING_JUDGE", "offline")  # chosen knowingly
    assert load_settings().judge == "offline"


def test_a_seed_name_and_ours_set_apart_are_refused(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_LR", "0.05")
    monkeypatch.setenv("AGENT_LEARNING_LEARNING_RATE", "1.2")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_LR and AGENT_LEARNING_LEARNING_RATE"):
        load_settings()
    monkeypatch.setenv("AGENT_LEARNING_LR", "-1")
    monkeypatch.delenv("AGENT_LEARNING_LEARNING_RATE")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_LR: Input should be greater than 0"):
        load_settings()


TYPO = ("AGENT_LEARNING_W_INTNET", "did you mean AGENT_LEARNING_W_INTENT?")


def test_an_unknown_variable_stops_the_cli_with_exit_2(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TYPO[0], "0.5")
    for command in (["config"], ["train"], ["policy", "--agent-id", "dq"]):
        result = cli(*command)
        assert result.exit_code == 2 and TYPO[0] in result.output and TYPO[1] in result.output, command
        assert "Traceback" not in result.output


def test_an_unknown_variable_stops_the_embedded_runner(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TYPO[0], "0.5")
    with pytest.raises(ConfigurationError, match=TYPO[1]):
        open_local()
    with pytest.raises(ConfigurationError, match=TYPO[1]):
        run_example()
    assert not embedded.exists()


def test_an_unknown_variable_stops_the_functions_app(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TYPO[0], "0.5")
    monkeypatch.setattr(handlers, "_runtime", None)
    with pytest.raises(ConfigurationError, match=TYPO[1]):
        handlers.runtime()


def test_config_names_each_source(embedded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_COSMOS_ENDPOINT", "https://acct.documents.azure.com:443/")
    (embedded.parent.parent / "local.settings.json").write_text(json.dumps({"Values": {"AGENT_LEARNING_JUDGING":
                                                                                       "*=0.5"}}))
    lines = ok("config", "--db", "x.db").output.splitlines()
    assert any(line.split() == ["implied", "by", "AGENT_LEARNING_COSMOS_ENDPOINT", "AGENT_LEARNING_STORE=cosmos"]
               for line in lines)
    assert any(line.split() == ["--db", "AGENT_LEARNING_SQLITE_PATH=x.db"] for line in lines)
    assert any(line.split()[:2] == ["default", "AGENT_LEARNING_W_INTENT=0.4"] for line in lines)
    assert any("local.settings.json (func start only)" in line and "AGENT_LEARNING_JUDGING=*=all" in line
               for line in lines)


def test_from_actions_takes_both_orders_and_refuses_a_mixed_call() -> None:
    ours = SoftmaxPolicy.from_actions("dq", ["a", "b"])
    seeds = SoftmaxPolicy.from_actions(["a", "b"], agent_id="dq")
    assert (ours.agent_id, ours.action_ids) == (seeds.agent_id, seeds.action_ids) == ("dq", ["a", "b"])
    assert seeds.snapshot() == ("dq:v1", 1, "dq")
    with pytest.raises(TypeError, match="agent_id must be a string"):
        SoftmaxPolicy.from_actions(["a", "b"], "dq")
    with pytest.raises(TypeError, match="given twice"):
        SoftmaxPolicy.from_actions("dq", ["a"], agent_id="dq")


def test_the_top_level_episode_capture_with_arguments_is_the_context_manager(tmp_path: Path) -> None:
    from agent_learning import EpisodeCapture
    from agent_learning.agent.capture import EpisodeCapture as Capture

    decision = SoftmaxPolicy.from_actions("dq", ["a"]).choose()
    with SQLiteStore(tmp_path / "s.db") as store:
        with EpisodeCapture(store, decision, input="q") as run:
            assert isinstance(run, Capture)
            run.end("answer")
        assert [e["output"] for e in store.list_episodes("dq")] == ["answer"]


def test_the_start_form_refuses_a_policy_id_that_is_not_the_snapshots(tmp_path: Path) -> None:
    from agent_learning.app.seed import EpisodeRecorder

    with SQLiteStore(tmp_path / "s.db") as store:
        recorder = EpisodeRecorder(store)
        for policy_id, version in (("dq", 1), ("dq:v2", 1)):
            with pytest.raises(InvalidDocument, match=r"policy_id: must be policy\.snapshot"):
                recorder.start(user_input="q", policy_id=policy_id, policy_version=version, action_id="a",
                               action_logprob=-0.7)


def test_the_seed_names_leave_the_agent_side_light() -> None:
    code = ("import sys; from agent_learning import Action, EpisodeCapture, LearningRunner, SoftmaxPolicy; "
            "print(sorted(m for m in ('numpy', 'pydantic_settings', 'azure', 'agent_learning.pipeline') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={"PYTHONPATH": str(ROOT / "shared")})
    assert done.stdout.strip() == "[]"
