"""Every operations command of ``agent-learn`` on the embedded store and on Cosmos DB (the real
azure-cosmos SDK against the local Cosmos server), chosen by configuration as in production;
``dlq`` also against Service Bus (the real azure-servicebus SDK against the AMQP test broker)."""

from __future__ import annotations

import json
import random
import struct
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rich")
pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")
from adapters import DURABLE_STORE_ADAPTERS, QUEUE_ADAPTERS, adapter_params
from cli_harness import cli, ok

from agent_learning.app import wiring
from agent_learning.app.embedded import LocalPipeline, open_local
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.documents import TrainingRun
from agent_learning.judges.offline import OfflineJudge
from agent_learning.ops.audit import audit_agent
from agent_learning.pipeline import TrainRequest, create_policy, load_current, score_episode
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.base import MAX_DELIVERY_COUNT_EXCEEDED, OutgoingMessage
from agent_learning.sim.simulate import math_tutor

AGENT = "math-tutor"
ACTIONS = ["direct", "step-by-step", "calculator", "few-shot"]


pytestmark = pytest.mark.usefixtures("clean_env")


def as_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json").stdout)


class Deployment:
    """Settings in the environment, a policy made with the CLI, and three trained versions."""

    def __init__(self, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> None:
        monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(tmp_path / "local.db"))
        # Rounds of 20 episodes are too few for the guardrail to judge at its default of 30 effective samples
        # (it holds them until that many accumulate, tests/evaluation/test_guardrail.py).
        monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL_MIN_EFFECTIVE_SAMPLES", "5")
        self.kind = kind
        self.cleanup: Any = None
        if kind == "cosmos":
            from cosmos_fixture import CLIENT_KWARGS, SteppingClock

            from agent_learning.app import wiring
            from agent_learning.store.cosmos import CosmosStore

            server = request.getfixturevalue("cosmos_server")
            database = f"cli-{uuid.uuid4().hex[:8]}"
            setup = CosmosStore.connect(server.endpoint, database, key=server.key, create_containers=True,
                                        client_kwargs=CLIENT_KWARGS)
            for name, value in {"STORE": "cosmos", "COSMOS_ENDPOINT": server.endpoint, "COSMOS_KEY": server.key,
                                "COSMOS_DATABASE": database}.items():
                monkeypatch.setenv(f"AGENT_LEARNING_{name}", value)
            # Every store the commands open runs on one stepping clock: a settle window passes
            # between any two operations, so what one command scored the next one can train.
            opener, stepping = wiring.open_store, SteppingClock()
            monkeypatch.setattr(wiring, "open_store", lambda settings, *, path=None, clock=None: opener(
                settings, path=path, clock=stepping))

            def cleanup() -> None:
                setup._client.delete_database(database)  # type: ignore[union-attr]
                setup.close()

            self.cleanup = cleanup
        actions = tmp_path / "actions.json"
        actions.write_text(json.dumps(ACTIONS))
        ok("init-policy", "--agent-id", AGENT, "--actions", str(actions), "--exploration-floor", "0.01")
        self.pipeline = open_local(load_settings())
        self.clock, self.rng, self.scenario = ManualClock(), random.Random(3), math_tutor(AGENT)
        self.episodes: list[str] = []
        for _ in range(3):
            self.round()

    def round(self, n: int = 20) -> Any:
        policy = SoftmaxPolicy.from_document(load_current(self.pipeline.store, AGENT), rng=self.rng)  # type: ignore[arg-type]
        for _ in range(n):
            self.episodes.append(self.scenario.run_episode(self.pipeline.store, policy.choose(), self.rng,
                                                           self.clock).id)
        return self.pipeline.run_once()

    def close(self) -> None:
        self.pipeline.store.close()
        self.pipeline.queue.close()
        if self.cleanup:
            self.cleanup()


@pytest.fixture(params=adapter_params(*DURABLE_STORE_ADAPTERS))
def deployment(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deployment]:
    d = Deployment(request.param, tmp_path, monkeypatch, request)
    yield d
    d.close()


def test_policy_show_and_history(deployment: Deployment) -> None:
    shown = as_json("policy", "show", "--agent-id", AGENT)
    doc = shown["policy"]
    assert doc["version"] == 4 and doc["kind"] == "current" and doc["source"] == "train"
    assert json.loads(ok("policy", "--agent-id", AGENT, "--json").stdout) == shown  # the old form still works
    table = ok("policy", "show", "--agent-id", AGENT).stdout
    assert f"{AGENT} v4 (train)" in table and "few-shot" in table and "last run" in table
    counts, sums = doc["learner_state"]["count"], doc["learner_state"]["reward_sum"]
    assert "mean reward" in table and f"{sums[0] / counts[0]:.3f}" in table  # the per-action evidence

    history = as_json("policy", "history", "--agent-id", AGENT)
    assert [h["version"] for h in history] == [1, 2, 3, 4]
    assert [h["source"] for h in history] == ["init", "train", "train", "train"]
    assert history[0]["mean_reward"] is None and history[0]["run"] is None
    for h in history:
        assert list(h["probabilities"]) == ACTIONS and sum(h["probabilities"].values()) == pytest.approx(1, abs=1e-5)
    for h in history[1:]:
        assert h["run"] == f"{AGENT}:run:v{h['version']}" and h["episodes"] == 20 and 0 < h["mean_reward"] <= 1
    assert history[0]["entropy"] == pytest.approx(1.386, abs=1e-3)  # uniform over 4 actions
    assert as_json("policy", "history", "--agent-id", AGENT, "--limit", "2") == history[-2:]
    text = ok("policy", "history", "--agent-id", AGENT).stdout
    assert "4 policy versions" in text and "run:v4" in text and "shown" not in text
    limited = ok("policy", "history", "--agent-id", AGENT, "--limit", "2").stdout
    assert "4 policy versions, the newest 2 shown" in limited  # the count is the agent's, not the page's

    # A time window (whole seconds on the command line), with or without the newest N of it.
    created = {h["version"]: datetime.fromisoformat(h["created_at"]) for h in history}
    since = created[2].replace(microsecond=0)
    until = since + timedelta(seconds=1)
    expected = [v for v, t in created.items() if since <= t <= until]
    window = ["--since", since.strftime("%Y-%m-%dT%H:%M:%S"), "--until", until.strftime("%Y-%m-%dT%H:%M:%S")]
    assert [h["version"] for h in as_json("policy", "history", "--agent-id", AGENT, *window)] == expected
    newest = as_json("policy", "history", "--agent-id", AGENT, *window, "--limit", "1")
    assert [h["version"] for h in newest] == expected[-1:]
    text = ok("policy", "history", "--agent-id", AGENT, *window, "--limit", "1").stdout
    assert "4 policy versions, the newest 1 created in the window shown" in text
    empty = cli("policy", "history", "--agent-id", AGENT, "--since", "2099-01-01")
    assert empty.exit_code == 2 and f"no versions of {AGENT} were created in that time" in empty.output
    backwards = cli("policy", "history", "--agent-id", AGENT, "--since", "2026-02-01", "--until", "2026-01-01")
    assert backwards.exit_code == 2 and "is after --until" in backwards.output


def test_rollback_pin_and_unpin(deployment: Deployment) -> None:
    v2 = as_json("policy", "history", "--agent-id", AGENT)[1]
    rolled = as_json("policy", "rollback", "--agent-id", AGENT, "2", "--note", "v3 regressed")
    assert rolled["changed"] and rolled["policy"]["version"] == 5 and rolled["policy"]["source"] == "rollback"
    assert as_json("policy", "history", "--agent-id", AGENT)[-1]["probabilities"] == v2["probabilities"]
    assert "already a rollback to v2" in ok("policy", "rollback", "--agent-id", AGENT, "2").stdout
    assert [h["version"] for h in as_json("policy", "history", "--agent-id", AGENT)] == [1, 2, 3, 4, 5]

    missing = cli("policy", "rollback", "--agent-id", AGENT, "9")
    assert missing.exit_code == 2 and "no version 9" in missing.stderr and "VERSION" in missing.stderr

    assert "is pinned" in ok("policy", "pin", "--agent-id", AGENT, "--reason", "checking complaints").stdout
    assert "already pinned" in ok("policy", "pin", "--agent-id", AGENT).stdout
    shown = ok("policy", "show", "--agent-id", AGENT).stdout
    assert "pinned" in shown and "checking complaints" in shown
    assert [t.status for t in deployment.round().trained] == ["pinned"]
    trained = json.loads(ok("train", "--json").stdout)
    assert trained["training"][0]["status"] == "pinned"
    assert "unpinned" in ok("policy", "unpin", "--agent-id", AGENT).stdout
    trained = json.loads(ok("train", "--json").stdout)
    (row,) = trained["training"]
    assert {k: row[k] for k in ("agent_id", "status", "version", "reason")} == {
        "agent_id": AGENT, "status": "published", "version": 6, "reason": ""}
    assert row["episodes"] > 0 and isinstance(row["mean_reward"], float)


def test_runs_list_and_show(deployment: Deployment) -> None:
    runs = as_json("runs", "list", "--agent-id", AGENT)
    assert [r["run"]["id"] for r in runs] == [f"{AGENT}:run:v{v}" for v in (4, 3, 2)]
    assert as_json("runs", "list", "--agent-id", AGENT, "--limit", "1") == runs[:1]
    shown = as_json("runs", "show", f"{AGENT}:run:v3")
    run = shown["run"]
    assert shown == runs[1] and run["episodes"] == 20 and run["cursor_to"]["seq"] > run["cursor_from"]["seq"]
    assert "run:v3" in ok("runs", "list", "--agent-id", AGENT).stdout
    assert "metrics.mean_reward" in ok("runs", "show", f"{AGENT}:run:v3").stdout
    bad = cli("runs", "show", "v3")
    assert bad.exit_code == 2 and "RUN_ID" in bad.stderr and ":run:v" in bad.stderr
    gone = cli("runs", "show", f"{AGENT}:run:v99")
    assert gone.exit_code == 2 and "no run" in gone.stderr


def test_evaluate_every_target_against_the_current_version(deployment: Deployment, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    own = as_json("evaluate", "--agent-id", AGENT)
    assert own["episodes"] == 60 and own["current_version"] == 4 and own["target"] == "v4 (current)"
    assert set(own["estimates"]) == {"ips", "snips", "dr"}
    for e in own["estimates"].values():
        assert e["target"] == e["current"] and e["difference"]["value"] == 0.0
    uniform = as_json("evaluate", "--agent-id", AGENT, "--uniform")
    first = as_json("evaluate", "--agent-id", AGENT, "--version", "1")  # v1 was uniform
    for name in ("ips", "snips", "dr"):
        u = uniform["estimates"][name]
        assert first["estimates"][name]["target"]["value"] == pytest.approx(u["target"]["value"])
        assert u["target"]["low"] <= u["target"]["value"] <= u["target"]["high"]
        own_value = {k: e["value"] if e["clipped_from"] is None else e["clipped_from"] for k, e in u.items()}
        assert own_value["difference"] == pytest.approx(own_value["target"] - own_value["current"])
        assert u["target"]["low"] >= 0 and u["target"]["high"] <= 1  # cut to the reward's range
    always = as_json("evaluate", "--agent-id", AGENT, "--action", "calculator", "--since", "2020-01-01")
    assert always["target"] == "always calculator" and always["episodes"] == 60

    # New scores that no run has learned yet: the candidate is what the next run would publish.
    policy = SoftmaxPolicy.from_document(load_current(deployment.pipeline.store, AGENT), rng=deployment.rng)  # type: ignore[arg-type]
    for _ in range(10):
        deployment.scenario.run_episode(deployment.pipeline.store, policy.choose(), deployment.rng, deployment.clock)
    deployment.pipeline.pump()
    deployment.pipeline.score_pending()
    candidate = as_json("evaluate", "--agent-id", AGENT, "--candidate")
    assert candidate["target"] == "the next candidate (v5, from 10 new episodes)" and candidate["episodes"] == 70
    monkeypatch.setenv("AGENT_LEARNING_TRAIN_MAX_BATCH", "4")  # the next run reads 4 score rows, and so does this
    smaller = as_json("evaluate", "--agent-id", AGENT, "--candidate")
    assert smaller["target"] == "the next candidate (v5, from 4 new episodes)"
    monkeypatch.delenv("AGENT_LEARNING_TRAIN_MAX_BATCH")
    assert not any("waits" in note for note in candidate["notes"])
    monkeypatch.setenv("AGENT_LEARNING_TRAIN_MIN_BATCH", "20")  # a run now would wait: the candidate is not the next
    waiting = as_json("evaluate", "--agent-id", AGENT, "--candidate")
    assert any("publishes nothing: it waits for 20 new scores" in note for note in waiting["notes"])
    monkeypatch.delenv("AGENT_LEARNING_TRAIN_MIN_BATCH")
    text = ok("evaluate", "--agent-id", AGENT, "--uniform").stdout
    assert "uniform against v4 (current) on 70 episodes" in text and "target − current" in text
    strict = ok("evaluate", "--agent-id", AGENT, "--uniform", "--confidence", "0.999").stdout
    assert "mean reward, 99.9% intervals" in strict  # not rounded up to "100%"

    two = cli("evaluate", "--agent-id", AGENT, "--uniform", "--candidate")
    assert two.exit_code == 2 and "--candidate: choose one target" in two.stderr
    unknown = cli("evaluate", "--agent-id", AGENT, "--action", "nope")
    assert unknown.exit_code == 2 and "--action: 'nope' is not an action of 'math-tutor'" in unknown.stderr
    assert unknown.stderr.startswith("error: --action")  # no empty line left by a progress bar before it
    future = cli("evaluate", "--agent-id", AGENT, "--since", "2999-01-01")
    assert future.exit_code == 2 and "has 0 scored episodes since 2999-01-01" in future.stderr

    actions = tmp_path / "revised.json"  # an action no episode has tried yet
    actions.write_text(json.dumps(["direct", "step-by-step", "calculator", "few-shot", "socratic"]))
    ok("policy", "revise", "--agent-id", AGENT, "--actions", str(actions))
    untried = cli("evaluate", "--agent-id", AGENT, "--action", "socratic")
    assert untried.exit_code == 2 and untried.stderr.strip().count("\n") == 0
    assert untried.stderr.strip().startswith(
        "error: --action: always socratic never chooses a configuration 'math-tutor' logged; nothing to estimate from"
    )


def test_train_applies_feedback_whose_call_died_before_applying_it(deployment: Deployment) -> None:
    from agent_learning.documents import Feedback

    eid = deployment.episodes[0]
    (score,) = as_json("episodes", "show", eid)["scores"]
    verdict = 0.0 if score["reward"] > 0.5 else 1.0  # a verdict that changes the reward
    deployment.pipeline.store.put_feedback(Feedback.from_dict({  # stored; the call died before applying it
        "episode_id": eid, "agent_id": AGENT, "source": "user", "score": verdict,
        "received_at": deployment.clock.now()}))
    ok("train")
    ok("train")
    assert [s["revision"] for s in as_json("episodes", "show", eid)["scores"]] == [0, 1]


def test_episodes_list_show_and_feedback(deployment: Deployment) -> None:
    listed = as_json("episodes", "list", "--agent-id", AGENT, "--limit", "5")
    assert len(listed) == 5 and all(e["agent_id"] == AGENT and e["reward"] is not None for e in listed)
    assert {e["id"] for e in listed} <= set(deployment.episodes)
    eid = listed[0]["id"]
    shown = as_json("episodes", "show", eid)
    assert shown["episode"]["id"] == eid and len(shown["scores"]) == 1 and shown["feedback"] == []
    metrics = shown["scores"][0]["metrics"]
    assert set(metrics) == {"intent_resolution", "task_adherence", "task_completion"}
    assert all(m["reason"] for m in metrics.values())  # the judges' reasons are shown

    result = as_json("feedback", eid, "--down", "--comment", "wrong answer")
    assert result["status"] == "corrected" and result["correction_id"] == f"{eid}~r1"
    assert as_json("feedback", eid, "--down", "--comment", "wrong answer")["status"] == "unchanged"
    shown = as_json("episodes", "show", eid)
    assert [s["revision"] for s in shown["scores"]] == [0, 1]
    assert shown["feedback"][0]["comment"] == "wrong answer" and shown["feedback"][0]["value"] == 0.0
    text = ok("episodes", "show", eid).stdout
    assert "correction r1" in text and "feedback from user: thumb down" in text and "intent_resolution" in text
    row = next(e for e in as_json("episodes", "list", "--agent-id", AGENT) if e["id"] == eid)
    assert row["corrections"] == 1 and row["reward"] == pytest.approx(shown["scores"][1]["reward"])

    for verdicts in ([], ["--up", "--down"]):  # none, or two
        refused = cli("feedback", eid, *verdicts)
        assert refused.exit_code == 2 and refused.stderr.startswith("error: --up/--down/--score: give exactly one")
    unknown = cli("feedback", "no-such-episode", "--up")
    assert unknown.exit_code == 2 and "does not exist" in unknown.stderr
    bad = cli("feedback", eid, "--score", "3")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --score: 3.0 is not in the range")
    missing = cli("episodes", "show", "no-such-episode")
    assert missing.exit_code == 2 and "EPISODE_ID" in missing.stderr


def test_feedback_on_an_episode_not_scored_yet_is_stored_and_waits(deployment: Deployment) -> None:
    policy = SoftmaxPolicy.from_document(load_current(deployment.pipeline.store, AGENT), rng=deployment.rng)  # type: ignore[arg-type]
    episode = deployment.scenario.run_episode(deployment.pipeline.store, policy.choose(), deployment.rng,
                                              deployment.clock)
    assert ok("episodes", "show", episode.id).stdout.strip().endswith("not scored yet")  # no dead letter either
    said = ok("feedback", episode.id, "--up")
    assert said.stdout.strip().endswith("stored; it is applied when the episode is scored")
    assert "Traceback" not in said.output
    ok("train")
    shown = as_json("episodes", "show", episode.id)
    assert [s["revision"] for s in shown["scores"]] == [0]  # scored with the verdict already in
    assert shown["feedback"][0]["value"] == 1.0


def test_runs_count_correction_rows_and_corrected_episodes_apart(deployment: Deployment) -> None:
    episode = deployment.episodes[-1]
    assert as_json("feedback", episode, "--down")["status"] == "corrected"
    assert as_json("feedback", episode, "--score", "0.5", "--source", "qa")["status"] == "corrected"
    deployment.round()  # new episodes, so the corrections are learned
    (listed,) = as_json("runs", "list", "--agent-id", AGENT, "--limit", "1")
    run = listed["run"]
    assert (run["corrections"], listed["corrected_episodes"], run["metrics"]["corrections"]) == (2, 1, 1)
    assert as_json("runs", "show", run["id"]) == listed
    assert TrainingRun.from_dict(run).id == run["id"]  # the document as stored: it validates as a run
    table = ok("runs", "list", "--agent-id", AGENT, "--limit", "1").stdout
    assert "correction rows" in table and "corrected episodes" in table
    row = next(line for line in table.splitlines() if run["id"] in line).split("│")
    assert [cell.strip() for cell in row[4:6]] == ["2", "1"]


def test_a_dead_lettered_episode_shows_why(deployment: Deployment) -> None:
    policy = SoftmaxPolicy.from_document(load_current(deployment.pipeline.store, AGENT), rng=deployment.rng)  # type: ignore[arg-type]
    episode = deployment.scenario.run_episode(deployment.pipeline.store, policy.choose(), deployment.rng,
                                              deployment.clock)
    deployment.pipeline.pump()
    (message,) = deployment.pipeline.queue.receive()
    deployment.pipeline.queue.dead_letter(message, "JudgeFailed", "the judge said [bold]no[/]")
    shown = as_json("episodes", "show", episode.id)
    assert shown["dead_letter"]["reason"] == "JudgeFailed"
    assert shown["dead_letter"]["description"] == "the judge said [bold]no[/]"
    text = ok("episodes", "show", episode.id).stdout
    assert "dead-lettered: JudgeFailed after 1 delivery attempt" in text and "[bold]no[/]" in text
    assert "not scored yet" not in text
    listed = {r["id"]: r for r in as_json("episodes", "list")}
    assert listed[episode.id]["dead_letter"] == "JudgeFailed"
    assert "dead-lettered" in ok("episodes", "list").stdout
    scored = as_json("episodes", "show", deployment.episodes[-1])
    assert scored["dead_letter"] is None
    said = " ".join(ok("feedback", episode.id, "--up").stdout.split())  # it waits for a replay, not a score
    assert f"dead-lettered (JudgeFailed), so it is applied only once `agent-learn dlq replay --id {episode.id}`" in said


def test_dlq_list_and_replay_on_the_embedded_queue(deployment: Deployment) -> None:
    deployment.pipeline.queue.send([OutgoingMessage("ghost-1", json.dumps({"episode_id": "ghost-1"}))])
    assert deployment.pipeline.score_pending() == {"dead_letter": 1}
    (dead,) = as_json("dlq", "list")
    assert dead["message_id"] == "ghost-1" and dead["reason"] == "EpisodeNotFound" and "ghost-1" in dead["body"]
    assert "EpisodeNotFound" in ok("dlq", "list").stdout
    refused = cli("dlq", "replay")
    assert refused.exit_code == 2 and refused.stderr.startswith("error: --all/--id/--reason: give --all")
    assert as_json("dlq", "replay", "--id", "ghost-1") == {"replayed": 1, "message_ids": ["ghost-1"], "left": {},
                                                          "not_found": []}
    assert as_json("dlq", "list") == []
    assert deployment.pipeline.queue.counts().active == 1


def test_report_writes_a_png_and_an_html_page(deployment: Deployment, tmp_path: Path) -> None:
    png, html = tmp_path / "out" / "report.png", tmp_path / "out" / "report.html"
    summary = as_json("report", "--png", str(png), "--html", str(html))
    # reward panel: the batches' mean reward and the guardrail's estimate of each version before publishing
    assert summary["agents"] == {AGENT: {"versions": 4, "series": [4, 2, 1]}}
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] > 800
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page and "http" not in page
    assert page.count("<tr>") == 5 and "few-shot" in page  # a header and one row per version
    text = ok("report", "--agent-id", AGENT, "--png", str(png), "--html", str(html)).stdout
    assert "wrote" in text and "[4, 2, 1]" in text
    nobody = cli("report", "--agent-id", "nobody", "--png", str(png), "--html", str(html))
    assert nobody.exit_code == 2 and "nobody" in nobody.stderr and AGENT in nobody.stderr


def test_unknown_agent_errors_name_the_option_and_list_the_agents(deployment: Deployment) -> None:
    for command in (["policy", "show"], ["policy", "history"], ["policy", "pin"], ["runs", "list"]):
        result = cli(*command, "--agent-id", "ghost")
        assert result.exit_code == 2, command
        assert "--agent-id: 'ghost' has no policy" in result.stderr and AGENT in result.stderr


def test_dlq_list_and_replay_on_service_bus(amqp_broker: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from agent_learning.queue.servicebus import ServiceBusQueue

    amqp_broker.queue("score-episodes", max_delivery_count=3, lock_duration=30.0)
    monkeypatch.setenv("AGENT_LEARNING_QUEUE", "servicebus")
    monkeypatch.setenv("AGENT_LEARNING_SERVICEBUS_CONNECTION_STRING", amqp_broker.connection_string)
    queue = ServiceBusQueue.from_connection_string(amqp_broker.connection_string, "score-episodes", max_wait_time=1)
    try:
        queue.send([OutgoingMessage(f"ep-{i}", json.dumps({"episode_id": f"ep-{i}"})) for i in range(3)])
        received = []
        while len(received) < 3:
            received.extend(queue.receive(3))
        for m in received:
            queue.dead_letter(m, "InvalidEpisode", f"{m.message_id}: probability: must be in (0, 1]")
        dead = as_json("dlq", "list", "--queue", "score-episodes")
        assert [d["message_id"] for d in dead] == ["ep-0", "ep-1", "ep-2"]
        assert dead[1]["reason"] == "InvalidEpisode" and "probability" in dead[1]["description"]
        replayed = as_json("dlq", "replay", "--id", "ep-1", "--queue", "score-episodes")
        assert replayed == {"replayed": 1, "message_ids": ["ep-1"], "left": {"InvalidEpisode": 2}, "not_found": []}
        assert [d["message_id"] for d in as_json("dlq", "list", "--queue", "score-episodes")] == ["ep-0", "ep-2"]
        assert "replayed 2" in ok("dlq", "replay", "--all", "--queue", "score-episodes").stdout
        assert as_json("dlq", "list", "--queue", "score-episodes") == []
        back = []
        while len(back) < 3:
            back.extend(queue.receive(3))
        assert sorted(m.message_id for m in back) == ["ep-0", "ep-1", "ep-2"]
    finally:
        queue.close()


def _training_queue(adapter: str, broker: Any, settings: Any) -> Any:
    """The deployment's training queue on ``adapter`` (on Service Bus, one whose empty receive
    returns within a second)."""
    if adapter == "sqlite":
        return wiring.open_train_queue(settings)
    from agent_learning.queue.servicebus import ServiceBusQueue

    return ServiceBusQueue.from_connection_string(broker.connection_string, settings.train_queue_name,
                                                  max_wait_time=1)


@pytest.mark.parametrize("adapter", adapter_params(*QUEUE_ADAPTERS))
def test_training_dead_letters_are_listed_replayed_and_audited(
    adapter: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before the fix the dead letters of train-agents were invisible: `dlq list` showed none,
    `dlq replay --all` replayed none and the audit said nothing."""
    monkeypatch.setenv("AGENT_LEARNING_SQLITE_PATH", str(tmp_path / "local.db"))
    broker = None
    if adapter == "servicebus":
        broker = request.getfixturevalue("amqp_broker")
        monkeypatch.setenv("AGENT_LEARNING_QUEUE", "servicebus")
        monkeypatch.setenv("AGENT_LEARNING_SERVICEBUS_CONNECTION_STRING", broker.connection_string)
    settings = load_settings()
    store = wiring.open_store(settings)
    pipeline = LocalPipeline(store, wiring.open_queue(settings), OfflineJudge(), wiring.open_reward(settings),
                             wiring.open_learner(settings), train_queue=_training_queue(adapter, broker, settings))
    try:
        clock, rng, scenario = ManualClock(), random.Random(3), math_tutor(AGENT)
        create_policy(store, SoftmaxPolicy.from_actions(AGENT, ACTIONS).to_document(created_at=clock.now()))
        policy = SoftmaxPolicy.from_document(load_current(store, AGENT), rng=rng)  # type: ignore[arg-type]
        for i in range(4):
            episode = scenario.run_episode(store, policy.choose(), rng, clock, episode_id=f"ep-{i}")
            score_episode(episode.id, pipeline.scorer, check_existing=False)
        train = pipeline.train_queue
        train.send([OutgoingMessage("train-poison", json.dumps({"type": "train_request"}))])
        assert pipeline.train_pending() == []  # not a training request: dead-lettered as InvalidMessage
        train.send([TrainRequest(AGENT, 1).to_message()])
        (stuck,) = train.receive(1)
        train.dead_letter(stuck, MAX_DELIVERY_COUNT_EXCEEDED)  # what the host does after failed deliveries

        dead = as_json("dlq", "list")
        assert {(d["queue"], d["reason"]) for d in dead} == {
            ("train-agents", "InvalidMessage"), ("train-agents", MAX_DELIVERY_COUNT_EXCEEDED)}
        unknown = cli("dlq", "list", "--queue", "train")
        assert unknown.exit_code == 2 and "--queue: 'train' is not a queue" in unknown.stderr
        books = json.loads(cli("audit", "--json").stdout)
        assert books["dead_letters"] == {
            "score-episodes": {}, "train-agents": {"InvalidMessage": 1, MAX_DELIVERY_COUNT_EXCEEDED: 1}}
        assert books["agents"][AGENT]["pending_training"] == 4

        assert as_json("dlq", "replay", "--all", "--queue", "train-agents") == {"replayed": 2}
        (trained,) = pipeline.train_pending()  # the replayed request trains; the poison is dead-lettered again
        assert trained.status == "published" and trained.run is not None and trained.run.episodes == 4
        assert "replayed 1 dead letter (0 to score-episodes, 1 to train-agents)" in ok("dlq", "replay", "--all").stdout
        assert pipeline.train_pending() == []  # replaying again is safe: nothing is learned twice
        said = " ".join(ok("audit").stdout.split())
        assert "dead letters in train-agents by reason: InvalidMessage 1 " in said and said.endswith("learned twice")
        books = audit_agent(store, AGENT)
        assert (books.learned, books.learned_twice, books.versions) == (4, 0, 2)
    finally:
        pipeline.close()


from amqp_broker import amqp_broker  # noqa: E402, F401  (the fixture; needs python-qpid-proton)
