"""Spans and metrics, captured with the OpenTelemetry SDK's in-memory exporters, and the exporter setup."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from telemetry_capture import Captured

from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.settings import load_settings
from agent_learning.core import telemetry
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConfigurationError, PermanentError, TransientError
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import create_policy, load_current
from agent_learning.pipeline.drift import DriftConfig
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.rewards.feedback import record_feedback
from agent_learning.sim.simulate import support_bot
from agent_learning.store import SQLiteStore

AGENT = "support-bot"
ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "t.db")
    queue = SQLiteQueue(tmp_path / "t.db", clock=clock, max_deliveries=2)
    p = LocalPipeline(store, queue, OfflineJudge(), RewardFunction(), Reinforce(), clock=clock,
                      drift=DriftConfig(reward_drop=0.01, window=1, evidence_z=0.0))
    create_policy(store, SoftmaxPolicy.from_actions(AGENT, support_bot().actions).to_document(created_at=clock.now()))
    yield p
    store.close()
    queue.close()


def run_episodes(p: LocalPipeline, n: int, seed: int) -> list[str]:
    rng, scenario = random.Random(seed), support_bot()
    policy = SoftmaxPolicy.from_document(load_current(p.store, AGENT), rng=rng)  # type: ignore[arg-type]
    ids = []
    for _ in range(n):
        p.clock.advance(1.5)  # type: ignore[attr-defined]
        ids.append(scenario.run_episode(p.store, policy.choose(), rng, p.clock).id)
    return ids


def test_every_stage_has_a_span_and_the_judge_span_is_inside_the_score_span(
    captured: Captured, pipeline: LocalPipeline
) -> None:
    run_episodes(pipeline, 5, seed=1)
    pipeline.clock.advance(30)  # type: ignore[attr-defined]
    pipeline.run_once()
    spans = captured.spans.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count(telemetry.SPAN_ENQUEUE) == 1
    assert names.count(telemetry.SPAN_SCORE) == 5 and names.count(telemetry.SPAN_JUDGE) == 5
    assert names.count(telemetry.SPAN_TRAIN) == 1
    by_id = {s.context.span_id: s for s in spans}
    for judge in (s for s in spans if s.name == telemetry.SPAN_JUDGE):
        parent = by_id[judge.parent.span_id]
        assert parent.name == telemetry.SPAN_SCORE
        assert parent.attributes["episode_id"] == judge.attributes["episode_id"]
        assert parent.attributes["outcome"] == "scored" and judge.attributes["judge"] == "offline"
    enqueue = next(s for s in spans if s.name == telemetry.SPAN_ENQUEUE)
    assert (enqueue.attributes["received"], enqueue.attributes["sent"]) == (5, 5)
    train = next(s for s in spans if s.name == telemetry.SPAN_TRAIN)
    assert train.attributes["status"] == "published" and train.attributes["version"] == 2


def test_pipeline_metrics(captured: Captured, pipeline: LocalPipeline) -> None:
    ids = run_episodes(pipeline, 8, seed=2)
    pipeline.clock.advance(30)  # type: ignore[attr-defined]
    pipeline.run_once()
    assert captured.total("agent_learning.episodes.enqueued") == 8
    assert captured.total("agent_learning.episodes.scored", agent_id=AGENT) == 8
    (duration,) = captured.points("agent_learning.judge.duration")
    assert duration.count == 8 and duration.attributes["outcome"] == "ok" and duration.sum > 0
    (reward,) = captured.points("agent_learning.reward")
    assert reward.count == 8 and 0 < reward.sum <= 8
    (lag,) = captured.points("agent_learning.queue.lag")
    assert lag.count == 8 and lag.min >= 30  # scored at least 30 simulated seconds after each episode ended
    run = load_current(pipeline.store, AGENT).run  # type: ignore[union-attr]
    assert captured.points("agent_learning.policy.mean_reward")[0].value == pytest.approx(run.metrics["mean_reward"])
    assert 0 < captured.points("agent_learning.policy.entropy")[0].value <= 1.3863
    assert captured.total("agent_learning.training.runs", status="published") == 1

    record_feedback(pipeline.store, ids[0], thumb="down", clock=pipeline.clock)
    assert captured.total("agent_learning.rewards.feedback.received", kind="thumb") == 1
    assert captured.total("agent_learning.rewards.feedback.corrections") == 1
    assert telemetry.SPAN_FEEDBACK in captured.span_names()


def test_judge_failures_and_dead_letters_are_counted(
    captured: Captured, pipeline: LocalPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline.queue.send([OutgoingMessage("ghost", json.dumps({"episode_id": "ghost"}))])
    pipeline.score_pending()
    assert captured.total("agent_learning.episodes.dead_lettered", reason="EpisodeNotFound") == 1

    def unavailable(episode: Any) -> Any:
        raise TransientError("judge answered 503")

    monkeypatch.setattr(pipeline.scorer.judge, "judge", unavailable)
    run_episodes(pipeline, 1, seed=3)
    pipeline.pump()
    for _ in range(2):  # the queue allows 2 deliveries: the second failure dead-letters it
        pipeline.score_pending()
        pipeline.clock.advance(61)  # type: ignore[attr-defined]
    assert captured.total("agent_learning.judge.failures", kind="transient") == 2
    assert captured.total("agent_learning.episodes.dead_lettered", reason="MaxDeliveryCountExceeded") == 1
    assert pipeline.queue.counts().dead_letter == 2
    failed = [p for p in captured.points("agent_learning.judge.duration") if p.attributes["outcome"] == "transient"]
    assert failed[0].count == 2


def test_a_message_whose_scoring_raises_is_counted_when_the_queue_dead_letters_it(
    captured: Captured, pipeline: LocalPipeline, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bug (not a judge failure) raises out of scoring: the message comes back until the queue
    dead-letters it after its last allowed delivery, and the metric counts that, embedded and
    under Functions alike."""
    from agent_learning.app import handlers

    def bug(episode: Any) -> Any:
        raise RuntimeError("a bug in the judge")

    monkeypatch.setattr(pipeline.scorer.judge, "judge", bug)
    run_episodes(pipeline, 1, seed=3)
    pipeline.pump()
    for delivery in (1, 2):  # the queue allows 2 deliveries
        assert pipeline.score_pending() == {"failed": 1}
        dead = captured.total("agent_learning.episodes.dead_lettered", reason="MaxDeliveryCountExceeded")
        assert dead == (1 if delivery == 2 else 0)
        pipeline.clock.advance(61)  # type: ignore[attr-defined]
    assert pipeline.score_pending() == {}
    assert [d.reason for d in pipeline.queue.dead_letters()] == ["MaxDeliveryCountExceeded"]

    rt = handlers.Runtime(load_settings(sqlite_path=str(tmp_path / "f.db"), queue_max_deliveries=2),
                          pipeline.store, lambda messages: len(messages))
    rt.scorer = pipeline.scorer
    (episode_id,) = [e["id"] for e in pipeline.store.list_episodes(AGENT, limit=10)]
    body = json.dumps({"type": "score_request", "episode_id": episode_id})
    for delivery in (1, 2):
        with pytest.raises(RuntimeError, match="a bug"):
            handlers.score(body, delivery, episode_id, rt)
    assert captured.total("agent_learning.episodes.dead_lettered", reason="MaxDeliveryCountExceeded") == 2


def test_a_score_span_names_the_agent_whatever_the_outcome(
    captured: Captured, pipeline: LocalPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The score span carries ``agent_id`` for a failed judge too: the failures are what an
    operator filters one agent's spans for."""

    def broken(episode: Any) -> Any:
        raise PermanentError("the judge refused the prompt")

    monkeypatch.setattr(pipeline.scorer.judge, "judge", broken)
    run_episodes(pipeline, 1, seed=4)
    pipeline.pump()
    assert pipeline.score_pending() == {"dead_letter": 1}
    (scored,) = [s for s in captured.spans.get_finished_spans() if s.name == telemetry.SPAN_SCORE]
    assert scored.attributes["outcome"] == "dead_letter" and scored.attributes["reason"] == "JudgeFailed"
    assert scored.attributes["agent_id"] == AGENT


def test_a_drift_warning_is_a_metric_and_a_span_event(captured: Captured, pipeline: LocalPipeline) -> None:
    drops = 0
    for seed in range(12):  # until the batches' mean reward has dipped at least once
        run_episodes(pipeline, 30, seed=seed)
        pipeline.clock.advance(30)  # type: ignore[attr-defined]
        pipeline.run_once()
        means = [r["metrics"]["mean_reward"] for r in pipeline.store.list_runs(AGENT)]
        drops = sum(1 for newer, older in itertools.pairwise(means) if older - newer >= 0.01)
        if drops:
            break
    assert drops >= 1  # the 0.01 threshold makes an ordinary dip a warning
    assert captured.total("agent_learning.policy.warnings", kind="reward_drop") == drops
    events = [e for s in captured.spans.get_finished_spans() if s.name == telemetry.SPAN_TRAIN for e in s.events]
    assert [e.name for e in events].count("reward_drop") == drops


def test_names_are_unique_and_documented() -> None:
    names = [m.name for m in telemetry.METRICS]
    assert len(set(names)) == len(names) and len(set(telemetry.SPANS)) == len(telemetry.SPANS)
    guide = (ROOT / "docs" / "operating.md").read_text()
    for name in (*names, *telemetry.SPANS):
        assert f"`{name}`" in guide, name
    for m in telemetry.METRICS:
        assert f"`{m.unit}`" in guide


def test_without_a_provider_nothing_is_recorded_and_nothing_fails(pipeline: LocalPipeline) -> None:
    telemetry.install()
    run_episodes(pipeline, 3, seed=4)
    report = pipeline.run_once()
    assert report.outcomes == {"scored": 3}


def test_mode_follows_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGENT_LEARNING_TELEMETRY", "APPLICATIONINSIGHTS_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    assert telemetry.mode(load_settings()) == "off"
    assert telemetry.configure(load_settings()) == "off"
    key = "InstrumentationKey=00000000-0000-0000-0000-000000000000"
    monkeypatch.setenv("APPLICATIONINSIGHTS_CONNECTION_STRING", key)
    assert telemetry.mode(load_settings()) == "azure-monitor"
    assert telemetry.mode(load_settings(telemetry="off")) == "off"
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING")
    with pytest.raises(ConfigurationError, match="APPLICATIONINSIGHTS_CONNECTION_STRING"):
        load_settings(telemetry="azure-monitor")
    with pytest.raises(ConfigurationError, match="AGENT_LEARNING_TELEMETRY"):
        load_settings(telemetry="loud")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_LEARNING_", "APPLICATIONINSIGHTS_"))}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": str(ROOT / "shared"), **env}, check=False)


def test_spans_are_skipped_until_a_provider_is_installed_and_recorded_after() -> None:
    code = """
from agent_learning.core import telemetry
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
with telemetry.span(telemetry.SPAN_TRAIN) as sp:
    sp.set_attribute("agent_id", "a")
    print("before:", type(sp).__name__)
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with telemetry.span(telemetry.SPAN_TRAIN, {"agent_id": "a"}) as sp:
    print("after:", type(sp).__name__)
print("recorded:", [s.name for s in exporter.get_finished_spans()])
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "before: _NoSpan" in result.stdout  # the global proxy would record nothing: no span is made
    assert "recorded: ['agent_learning.train']" in result.stdout  # a provider installed later is used


def test_console_mode_prints_spans_and_metrics_to_stderr() -> None:
    code = """
from agent_learning.core import telemetry
from agent_learning.app.settings import load_settings
from opentelemetry import metrics, trace
assert telemetry.configure(load_settings()) == "console"
assert telemetry.configure(load_settings()) == "console"  # once per process
with telemetry.span(telemetry.SPAN_TRAIN, {"agent_id": "a"}):
    telemetry.count(telemetry.TRAINING_RUNS, 1, {"status": "published"})
trace.get_tracer_provider().force_flush()
metrics.get_meter_provider().force_flush()
print("the program's own output")
"""
    result = run_python(code, AGENT_LEARNING_TELEMETRY="console")
    assert result.returncode == 0, result.stderr
    assert '"name": "agent_learning.train"' in result.stderr
    assert '"name": "agent_learning.training.runs"' in result.stderr
    assert result.stdout == "the program's own output\n"  # stdout stays the program's (--json is one document)


def test_azure_monitor_mode_hands_the_connection_string_to_the_distro() -> None:
    """The exporter itself sends to Azure, which these tests cannot reach: the distro's
    configure function is replaced by a recorder at the import boundary."""
    code = """
import json, azure.monitor.opentelemetry as distro
calls = []
distro.configure_azure_monitor = lambda **kw: calls.append(kw)
from agent_learning.core import telemetry
from agent_learning.app.settings import load_settings
mode = telemetry.configure(load_settings())
seen = [{"connection_string": c["connection_string"], "service": c["resource"].attributes["service.name"]}
        for c in calls]
print(json.dumps({"mode": mode, "calls": seen}))
"""
    conn = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://127.0.0.1:9/"
    result = run_python(code, APPLICATIONINSIGHTS_CONNECTION_STRING=conn)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"mode": "azure-monitor",
                                         "calls": [{"connection_string": conn, "service": "agent-learning"}]}


def test_a_missing_exporter_package_names_the_setting_that_chose_it() -> None:
    """With the default ``auto``, it is the connection string that chose Azure Monitor."""
    code = """
import sys
sys.modules["azure.monitor.opentelemetry"] = None  # the azure extra not installed
from agent_learning.core import telemetry
from agent_learning.app.settings import load_settings
from agent_learning.core.errors import ConfigurationError
try:
    telemetry.configure(load_settings())
except ConfigurationError as exc:
    print(exc)
"""
    conn = "InstrumentationKey=00000000-0000-0000-0000-000000000000"
    needs = ("needs azure.monitor.opentelemetry: pip install 'agent-learning[azure]', "
             "or set AGENT_LEARNING_TELEMETRY=off")
    auto = run_python(code, APPLICATIONINSIGHTS_CONNECTION_STRING=conn)
    assert auto.stdout.strip() == ("APPLICATIONINSIGHTS_CONNECTION_STRING is set, and AGENT_LEARNING_TELEMETRY=auto "
                                   f"then exports to Azure Monitor, which {needs}"), auto.stderr
    chosen = run_python(code, APPLICATIONINSIGHTS_CONNECTION_STRING=conn, AGENT_LEARNING_TELEMETRY="azure-monitor")
    assert chosen.stdout.strip() == f"AGENT_LEARNING_TELEMETRY=azure-monitor {needs}", chosen.stderr


def test_the_demo_exports_no_telemetry_whatever_the_environment_chooses(tmp_path: Path) -> None:
    """The demo's simulated agents never reach the Application Insights resource (nor the console)
    the environment configures for the real pipeline: the distro's configure function is replaced
    by a recorder, as above, and the demo's wiring goes through the real ``configure``."""
    code = f"""
import json, azure.monitor.opentelemetry as distro
calls = []
distro.configure_azure_monitor = lambda **kw: calls.append(kw)
from click.testing import CliRunner
from agent_learning.core import telemetry
from agent_learning.cli import main
from agent_learning.app.demo import run_demo
run_demo(db_path={str(tmp_path / "a.db")!r}, scenarios=["support-bot"], episodes_per_agent=10, batch=10)
args = ["demo", "--episodes", "10", "--batch", "10", "--agents", "support-bot", "--no-plot", "--json"]
result = CliRunner().invoke(main, [*args, "--db", {str(tmp_path / "b.db")!r}])
print(json.dumps({{"calls": len(calls), "configured": telemetry._configured, "exit": result.exit_code}}))
"""
    conn = "InstrumentationKey=00000000-0000-0000-0000-000000000000;IngestionEndpoint=https://127.0.0.1:9/"
    for env in ({"APPLICATIONINSIGHTS_CONNECTION_STRING": conn},
                {"AGENT_LEARNING_TELEMETRY": "azure-monitor"},  # would fail validation: not the demo's setting
                {"AGENT_LEARNING_TELEMETRY": "console"}):
        result = run_python(code, **env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == {"calls": 0, "configured": None, "exit": 0}, env


def test_the_functions_runtime_counts_a_poison_message_on_its_last_delivery(captured: Captured, tmp_path: Path) -> None:
    from agent_learning.app import deliveries, handlers

    settings = load_settings(sqlite_path=str(tmp_path / "f.db"), queue_max_deliveries=3)
    store = SQLiteStore(settings.sqlite_path)
    rt = handlers.Runtime(settings, store, lambda messages: len(messages))
    body = json.dumps({"type": "score_request", "episode_id": "ghost"})
    try:
        for delivery in (1, 2, 3):
            with pytest.raises(deliveries.PoisonMessage):
                handlers.score(body, delivery, "ghost", rt)
            expected = 1 if delivery == 3 else 0  # Service Bus dead-letters it after the last delivery
            assert captured.total("agent_learning.episodes.dead_lettered", reason="EpisodeNotFound") == expected
    finally:
        store.close()
