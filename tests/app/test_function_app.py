"""The Functions app: binding metadata, settings, and every function invoked directly with the
real ``azure.functions`` types on the embedded store and queue (the host cannot run here)."""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func
from app_functions import document_list, functions, sb_message, trust_principal_header
from azure.functions.servicebus import ServiceBusMessage
from azure.functions.timer import TimerRequest

from agent_learning.app import deliveries, handlers, http
from agent_learning.app.callers import key_identity, principal_identity
from agent_learning.app.settings import environment_names, load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Episode
from agent_learning.pipeline import create_policy, load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.sim.simulate import math_tutor
from agent_learning.store.base import Store, Tagged
from agent_learning.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = functions()
AGENT = "math-tutor"


def bindings(name: str) -> list[dict[str, Any]]:
    return json.loads(FUNCTIONS[name].get_function_json())["bindings"]


def call(name: str, *args: Any) -> Any:
    return FUNCTIONS[name].get_user_function()(*args)


# --------------------------------------------------------------------------- wiring


def test_the_app_has_exactly_its_functions_one_per_route_of_the_route_table() -> None:
    assert set(FUNCTIONS) == {"enqueue", "score", "train", "train_agent", *http.BY_NAME}


def test_every_http_function_serves_its_route_of_the_route_table() -> None:
    """Each HTTP function is declared with the template and methods of its route (app/http.py),
    with function-key auth, but for routes whose clients send keys the host does not read."""
    for name in FUNCTIONS:
        if name not in http.BY_NAME:
            continue
        trigger, output = bindings(name)
        route = http.BY_NAME[name]
        assert trigger["type"] == "httpTrigger", name
        assert trigger["authLevel"] == ("ANONYMOUS" if route.own_keys else "FUNCTION"), name
        assert trigger["route"] == route.template and trigger["methods"] == list(route.methods), name
        assert output["type"] == "http", name


def test_enqueue_is_a_cosmos_trigger_on_episodes_with_an_existing_lease_container() -> None:
    (trigger,) = bindings("enqueue")
    assert trigger["type"] == "cosmosDBTrigger" and trigger["direction"] == "IN"
    assert trigger["containerName"] == "episodes"
    assert trigger["databaseName"] == "%AGENT_LEARNING_COSMOS_DATABASE%"
    assert trigger["connection"] == "CosmosDBConnection"
    assert trigger["leaseContainerName"] == "leases"
    assert trigger["createLeaseContainerIfNotExists"] is False  # a managed identity cannot create it
    assert trigger["leaseContainerPrefix"] == "%AGENT_LEARNING_LEASE_PREFIX%"
    # The Cosmos trigger does not retry a failed batch on its own: the app must declare it.
    retry = FUNCTIONS["enqueue"].get_setting("retry_policy").get_dict_repr()
    assert retry["strategy"] == "exponential_backoff" and retry["max_retry_count"] == "-1"


def test_score_is_a_service_bus_queue_trigger() -> None:
    (trigger,) = bindings("score")
    assert trigger["type"] == "serviceBusTrigger" and trigger["direction"] == "IN"
    assert trigger["queueName"] == "%AGENT_LEARNING_QUEUE_NAME%"
    assert trigger["connection"] == "ServiceBusConnection"


def test_train_agent_is_a_service_bus_trigger_on_the_training_queue() -> None:
    (trigger,) = bindings("train_agent")
    assert trigger["type"] == "serviceBusTrigger" and trigger["direction"] == "IN"
    assert trigger["queueName"] == "%AGENT_LEARNING_TRAIN_QUEUE_NAME%"
    assert trigger["connection"] == "ServiceBusConnection"


def test_train_is_a_timer_with_its_schedule_from_a_setting() -> None:
    (trigger,) = bindings("train")
    assert trigger["type"] == "timerTrigger"
    assert trigger["schedule"] == "%AGENT_LEARNING_TRAIN_SCHEDULE%"
    assert trigger["runOnStartup"] is False


def test_policy_is_an_http_get_with_function_key_auth() -> None:
    trigger, output = bindings("policy")
    assert trigger["type"] == "httpTrigger" and trigger["authLevel"] == "FUNCTION"
    assert trigger["methods"] == ["GET"] and trigger["route"] == "policies/{agent_id}"
    assert output["type"] == "http"


def test_every_setting_the_app_reads_is_in_the_local_settings_sample() -> None:
    sample = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
    referenced = set()
    for name in FUNCTIONS:
        for binding in bindings(name):
            for value in binding.values():
                referenced.update(re.findall(r"%([^%]+)%", str(value)))
            if "connection" in binding:
                prefix = binding["connection"]
                assert any(k.startswith(prefix + "__") for k in sample), f"no identity-based setting for {prefix}"
    referenced.update(environment_names().values())
    referenced.update({"FUNCTIONS_WORKER_RUNTIME", "AzureWebJobsStorage"})
    missing = sorted(referenced - set(sample))
    assert not missing, f"settings missing from local.settings.sample.json: {missing}"


def test_the_settings_sample_holds_no_secrets() -> None:
    text = (ROOT / "local.settings.sample.json").read_text()
    values = json.loads(text)["Values"]
    assert values["AGENT_LEARNING_COSMOS_KEY"] == "" and values["AGENT_LEARNING_SERVICEBUS_CONNECTION_STRING"] == ""
    assert values["APPLICATIONINSIGHTS_CONNECTION_STRING"] == ""
    assert not re.search(r"(AccountKey|SharedAccessKey)=", text)
    assert "local.settings.json" in (ROOT / ".gitignore").read_text().splitlines()


def test_host_json_pins_extension_bundle_4() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    assert host["extensionBundle"] == {"id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)"}
    assert host["extensions"]["serviceBus"]["autoCompleteMessages"] is True
    assert host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"] == "00:15:00"


def test_importing_the_app_loads_no_heavy_dependency() -> None:
    import subprocess
    import sys

    code = (
        "import sys, function_app; "
        "print([m for m in ('numpy', 'pydantic', 'azure.cosmos', 'azure.servicebus', 'azure.ai.evaluation', "
        "'opentelemetry', 'azure.monitor') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- invocation


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = ManualClock()
        settings = load_settings(sqlite_path=str(tmp_path / "app.db"), store="sqlite", queue="sqlite")
        self.store = SQLiteStore(settings.sqlite_path)
        self.queue = SQLiteQueue(settings.sqlite_path, clock=self.clock)
        self.train_queue = SQLiteQueue(settings.sqlite_path, name=settings.train_queue_name, clock=self.clock)
        self.rt = handlers.Runtime(settings, self.store, self.queue.send, send_train=self.train_queue.send)
        self.scenario = math_tutor(AGENT)
        create_policy(
            self.store,
            SoftmaxPolicy.from_actions(AGENT, self.scenario.actions).to_document(created_at=self.clock.now()),
        )
        self.rng = random.Random(3)

    def episodes(self, n: int) -> list[dict[str, Any]]:
        doc = load_current(self.store, AGENT)
        assert doc is not None
        policy = SoftmaxPolicy.from_document(doc, rng=self.rng)
        eps = [self.scenario.run_episode(self.store, policy.choose(), self.rng, self.clock) for _ in range(n)]
        # As the change feed delivers them: with Cosmos system properties.
        return [{**e.to_dict(), "_rid": "x", "_etag": '"0"', "_ts": 1, "_lsn": i} for i, e in enumerate(eps)]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    e = Env(tmp_path)
    monkeypatch.setattr(handlers, "_runtime", e.rt)
    yield e
    e.store.close()
    e.queue.close()
    e.train_queue.close()


def tick(env: Env) -> list[str]:
    """The timer, then the training trigger on each message it sent; the agents it trained."""
    assert call("train", TimerRequest(past_due=False)) is None
    trained = []
    for m in env.train_queue.receive(100):
        assert call("train_agent", sb_message(m)) is None
        env.train_queue.complete(m)
        trained.append(json.loads(m.body)["agent_id"])
    return trained


def test_enqueue_sends_one_message_per_episode_and_skips_unsendable_documents(env: Env) -> None:
    docs = env.episodes(5)
    batch = [*docs[:2], {"agent_id": AGENT, "note": "no id"}, *docs[2:]]
    assert call("enqueue", document_list(batch)) is None
    received = env.queue.receive(10)
    assert sorted(m.message_id for m in received) == sorted(d["id"] for d in docs)
    assert all(m.properties["agent_id"] == AGENT for m in received)
    body = json.loads(received[0].body)
    assert body["episode"]["id"] == received[0].message_id and "_rid" not in body["episode"]


def test_enqueue_redelivered_batch_is_deduplicated(env: Env) -> None:
    docs = env.episodes(4)
    call("enqueue", document_list(docs))
    call("enqueue", document_list(docs))  # the change feed delivers a batch again
    assert env.queue.counts().active == 4


def test_enqueue_raises_when_the_queue_is_down_so_the_batch_is_retried(env: Env) -> None:
    def broken(messages: Any) -> int:
        raise ConnectionError("Service Bus unreachable")

    env.rt.send = broken
    with pytest.raises(ConnectionError):
        call("enqueue", document_list(env.episodes(2)))


def test_score_stores_a_score_and_redelivery_is_a_no_op(env: Env) -> None:
    call("enqueue", document_list(env.episodes(3)))
    for m in env.queue.receive(3):
        assert call("score", sb_message(m)) is None
    scores = env.store.read_scores(AGENT, None, 10)
    assert len(scores) == 3
    m = env.queue.receive(1) or []
    assert m == []  # the embedded queue still holds them locked; redeliver one by hand:
    first = scores[0]
    again = ServiceBusMessage(
        body=json.dumps({"type": "score_request", "episode_id": first["id"]}).encode(),
        message_id=first["id"],
        delivery_count=2,
        application_properties={},
        user_properties={},
    )
    call("score", again)
    assert env.store.read_scores(AGENT, None, 10) == scores


def test_score_completes_an_episode_the_judging_rule_leaves_out(env: Env) -> None:
    """A normal completion: no exception (so the host neither retries nor dead-letters it), and
    the episode is recorded unjudged, not scored."""
    env.rt = handlers.Runtime(
        load_settings(sqlite_path=env.rt.settings.sqlite_path, judging=f"{AGENT}=0"), env.store, env.queue.send
    )
    handlers._runtime = env.rt
    call("enqueue", document_list(env.episodes(2)))
    for m in env.queue.receive(2):
        assert call("score", sb_message(m)) is None
    assert env.store.read_scores(AGENT, None, 10) == []
    assert [r["reason"] for r in env.store.list_unjudged(AGENT)] == ["sampled_out", "sampled_out"]


def test_score_raises_poison_for_bad_input_naming_the_field(env: Env) -> None:
    doc = env.episodes(1)[0]
    doc["probability"] = 7.0
    bad = ServiceBusMessage(
        body=json.dumps({"type": "score_request", "episode_id": doc["id"], "episode": doc}).encode(),
        message_id=doc["id"],
        delivery_count=1,
        application_properties={},
        user_properties={},
    )
    with pytest.raises(deliveries.PoisonMessage) as info:
        call("score", bad)
    assert info.value.reason == "InvalidEpisode" and "probability" in info.value.description
    assert env.store.get_score(doc["id"], AGENT) is None


def test_score_raises_transient_so_the_message_is_redelivered(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_learning.core.errors import TransientError

    doc = env.episodes(1)[0]
    scorer = handlers.scorer_of(env.rt)

    def unavailable(episode: Any) -> Any:
        raise TransientError("judge answered 503")

    monkeypatch.setattr(scorer.judge, "judge", unavailable)
    msg = ServiceBusMessage(
        body=json.dumps({"type": "score_request", "episode_id": doc["id"]}).encode(),
        message_id=doc["id"],
        delivery_count=1,
        application_properties={},
        user_properties={},
    )
    with pytest.raises(deliveries.TransientScoringError, match="503"):
        call("score", msg)


def test_train_publishes_for_every_agent_with_new_scores(env: Env) -> None:
    call("enqueue", document_list(env.episodes(40)))  # enough for the guardrail to judge (30 effective samples)
    for m in env.queue.receive(40):
        call("score", sb_message(m))
    assert tick(env) == [AGENT]
    current = load_current(env.store, AGENT)
    assert current is not None and current.version == 2 and current.run is not None and current.run.episodes == 40
    evaluation = current.run.evaluation  # the guardrail is on by default: every run says what it found
    assert evaluation is not None and evaluation.verdict in ("published", "shrunk") and evaluation.episodes == 40
    assert call("train", TimerRequest(past_due=True)) is None
    assert env.train_queue.receive(10) == []  # nothing new: no message
    assert load_current(env.store, AGENT).version == 2  # type: ignore[union-attr]


def test_a_training_message_that_is_not_a_request_is_poison(env: Env) -> None:
    bad = ServiceBusMessage(body=b'{"type": "train_request", "agent_id": "a b", "version": 1}', message_id="x",
                            delivery_count=1, application_properties={}, user_properties={})
    with pytest.raises(deliveries.PoisonMessage) as info:
        call("train_agent", bad)
    assert info.value.reason == "InvalidMessage" and "agent_id" in info.value.description


def test_the_timer_holds_a_candidate_the_guardrail_finds_worse(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    from learners import InvertedRewards

    env.rt.learner = InvertedRewards()
    call("enqueue", document_list(env.episodes(20)))
    for m in env.queue.receive(20):
        call("score", sb_message(m))
    tick(env)  # too few samples to judge: held, not published unjudged
    current = load_current(env.store, AGENT)
    assert current is not None and current.version == 1
    call("enqueue", document_list(env.episodes(400)))
    while received := env.queue.receive(100):
        for m in received:
            call("score", sb_message(m))
    tick(env)
    current = load_current(env.store, AGENT)
    assert current is not None and current.version == 1  # held again: v1 stays
    held = [r for r in env.store.list_runs(AGENT, 10) if r.get("status") == "held"]
    assert all(r["evaluation"]["verdict"] == "held" for r in held)
    assert max(r["episodes"] for r in held) == 420  # the held 20 learned again with the 400
    assert any("confidently worse" in r["evaluation"]["reason"] for r in held)
    assert any("train math-tutor: held" in r.getMessage() for r in caplog.records)


def http_get(agent_id: str, etag: str | None = None, always: bool = False) -> func.HttpResponse:
    headers = {"If-None-Match": etag} if etag or (always and etag is not None) else {}
    req = func.HttpRequest(
        method="GET", url=f"/api/policies/{agent_id}", route_params={"agent_id": agent_id}, headers=headers, body=b""
    )
    return call("policy", req)


def test_http_policy_returns_the_document_with_an_etag_and_honours_if_none_match(env: Env) -> None:
    resp = http_get(AGENT)
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    doc = json.loads(resp.get_body())
    assert doc["agent_id"] == AGENT and doc["kind"] == "current" and len(doc["logits"]) == 4
    assert not any(k.startswith("_") for k in doc)
    etag = resp.headers["ETag"]
    unchanged = http_get(AGENT, etag)
    assert unchanged.status_code == 304 and unchanged.get_body() == b""
    assert http_get(AGENT, '"stale"').status_code == 200


@pytest.fixture
def policy_runtime(durable_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The app's runtime on a store of each kind (Cosmos over the wire) holding one policy."""
    create_policy(durable_store,
                  SoftmaxPolicy.from_actions(AGENT, ["a", "b"]).to_document(created_at=ManualClock().now()))
    settings = load_settings(sqlite_path=str(tmp_path / "unused.db"), store="sqlite", queue="sqlite")
    monkeypatch.setattr(handlers, "_runtime", handlers.Runtime(settings, durable_store, send=None))
    return durable_store


@pytest.mark.parametrize(
    "header", ['"', '""', " ", 'W/""', "* ,", '*, "a"', '"a", "b"', '"a" "b"', 'x"', '"unterminated', 'W/"', '"a b"',
               '"€"']
)
def test_http_policy_with_an_empty_or_malformed_if_none_match_answers_the_document(
    policy_runtime: Any, header: str
) -> None:
    """An empty or malformed ETag means "no cached copy": a full 200, never a 500 (on Cosmos the
    SDK raised ValueError for an empty ETag)."""
    resp = http_get(AGENT, header, always=True)
    assert resp.status_code == 200, resp.get_body()
    assert json.loads(resp.get_body())["agent_id"] == AGENT and resp.headers["ETag"]


def test_http_policy_etag_round_trips_on_every_store(policy_runtime: Any) -> None:
    etag = http_get(AGENT).headers["ETag"]
    assert http_get(AGENT, etag).status_code == 304
    assert http_get(AGENT, f"W/{etag}").status_code == 304  # If-None-Match compares weakly
    assert http_get(AGENT, '"stale"').status_code == 200


def test_http_policy_if_none_match_star_or_a_list_holding_the_current_tag_answers_304(policy_runtime: Any) -> None:
    """RFC 9110 §13.1.2: ``*`` matches any current document, and a list matches when one of its
    tags does (weakly); either way the answer carries the current tag."""
    etag = http_get(AGENT).headers["ETag"]
    for header in ("*", f'"stale", {etag}', f'W/"stale",W/{etag}', f' , {etag}, "other" ,', f'"a,b", {etag}'):
        resp = http_get(AGENT, header)
        assert resp.status_code == 304 and resp.get_body() == b"" and resp.headers["ETag"] == etag, header
    for header in ('"stale", "older"', '"a,b", W/"c"'):
        assert http_get(AGENT, header).status_code == 200, header
    missing = http_get("nobody", "*")  # no current document: nothing matches "*"
    assert missing.status_code == 404 and "nobody" in json.loads(missing.get_body())["error"]


class QuotedETagStore(SQLiteStore):
    """ETags as Azure Cosmos DB writes them: the quotes are part of the value (``"\"0a1b...\""``)."""

    def get_current_policy(self, agent_id: str) -> Any:
        tagged = super().get_current_policy(agent_id)
        return tagged and Tagged(tagged.doc, f'"{tagged.etag}"')


def test_http_policy_etag_is_one_entity_tag_when_the_store_quotes_its_etags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = QuotedETagStore(str(tmp_path / "quoted.db"))
    create_policy(store, SoftmaxPolicy.from_actions(AGENT, ["a", "b"]).to_document(created_at=ManualClock().now()))
    settings = load_settings(sqlite_path=str(tmp_path / "unused.db"), store="sqlite", queue="sqlite")
    monkeypatch.setattr(handlers, "_runtime", handlers.Runtime(settings, store, send=None))
    etag = http_get(AGENT).headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag), etag  # not ""..."" (a malformed header)
    assert http_get(AGENT, etag).status_code == 304
    store.close()


def test_http_policy_404_and_400(env: Env) -> None:
    missing = http_get("nobody")
    assert missing.status_code == 404 and "nobody" in json.loads(missing.get_body())["error"]
    bad = http_get("bad id!")
    assert bad.status_code == 400 and "agent_id" in json.loads(bad.get_body())["error"]


# --------------------------------------------------------------------------- feedback


def test_feedback_is_an_http_post_with_function_key_auth() -> None:
    trigger, output = bindings("feedback")
    assert trigger["type"] == "httpTrigger" and trigger["authLevel"] == "FUNCTION"
    assert trigger["methods"] == ["POST"] and trigger["route"] == "episodes/{episode_id}/feedback"
    assert output["type"] == "http"


KEY = "function-key-of-the-app"


def http_feedback(
    episode_id: str, body: Any, key: str | None = KEY, headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """POST feedback as the holder of function key ``key`` (in the ``x-functions-key`` header)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **({"x-functions-key": key} if key else {}), **(headers or {})}
    req = func.HttpRequest(method="POST", url=f"/api/episodes/{episode_id}/feedback",
                           route_params={"episode_id": episode_id}, headers=sent, params=params or {}, body=raw)
    resp = call("feedback", req)
    assert resp.mimetype == "application/json"
    return resp.status_code, json.loads(resp.get_body())


def test_http_feedback_before_and_after_scoring(env: Env) -> None:
    early, late = env.episodes(2)
    env.store.add_episode(Episode.from_dict(early))
    env.store.add_episode(Episode.from_dict(late))
    status, body = http_feedback(early["id"], {"thumb": "down", "comment": "did not help"})
    assert status == 202 and body["status"] == "waiting"
    assert body["reward"] is None and body["reward_delta"] is None  # not applied yet: no change to report
    assert body["feedback_id"] == f"{early['id']}:fb:{key_identity(KEY)}" and body["source"] == key_identity(KEY)

    call("enqueue", document_list([early, late]))
    for m in env.queue.receive(2):
        call("score", sb_message(m))
    rows = env.store.read_scores(AGENT, None, 10)
    assert sorted(r["id"] for r in rows) == sorted([early["id"], f"{early['id']}~r1", late["id"]])

    status, body = http_feedback(late["id"], {"score": 0.9}, key="reviewer-key")
    assert status == 200 and body["status"] == "corrected" and body["correction_id"] == f"{late['id']}~r1"
    status, again = http_feedback(late["id"], {"score": 0.9}, key="reviewer-key")  # posted twice
    assert status == 200 and again["status"] == "unchanged" and again["reward"] == pytest.approx(body["reward"])
    assert again["reward_delta"] == 0.0
    assert len(env.store.read_scores(AGENT, None, 10)) == 4
    env.rt.settings = env.rt.settings.model_copy(update={"guardrail": "off"})  # two episodes: too few to judge
    assert tick(env) == [AGENT]
    run = load_current(env.store, AGENT).run  # type: ignore[union-attr]
    assert run is not None and run.episodes == 2 and run.metrics["corrections"] == 2


def test_http_feedback_on_an_episode_whose_score_is_invalid_is_kept_and_says_why_not_learned(env: Env) -> None:
    (episode,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(episode))
    call("enqueue", document_list([episode]))
    (message,) = env.queue.receive(1)
    call("score", sb_message(message))
    with closing(sqlite3.connect(env.rt.settings.sqlite_path)) as conn, conn:  # edited by hand
        conn.execute("UPDATE scores SET doc = json_remove(doc, '$.reward_function') WHERE id = ?", (episode["id"],))
    status, body = http_feedback(episode["id"], {"thumb": "up"})
    assert status == 200 and body["status"] == "rejected"  # not a 400: the caller's feedback was fine, and kept
    assert body["problem"] == "invalid score: reward_function: Field required"
    assert body["reward"] is None and body["reward_delta"] is None
    assert [f["id"] for f in env.store.list_feedback(episode["id"])] == [body["feedback_id"]]


def test_http_feedback_sources_are_the_callers_not_the_body(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    assert http_feedback(doc["id"], {"thumb": "up"}, key="key-of-alice")[0] == 202
    assert http_feedback(doc["id"], {"thumb": "down"}, key=None, params={"code": "key-of-bob"})[0] == 202
    principal = "4f1c2a3b-0000-4000-8000-00000000abcd"
    trust_principal_header(monkeypatch)  # App Service Authentication on
    assert http_feedback(doc["id"], {"thumb": "up"}, headers={"X-MS-CLIENT-PRINCIPAL-ID": principal})[0] == 202
    by_source = {f["source"]: f["value"] for f in env.store.list_feedback(doc["id"])}
    assert by_source == {key_identity("key-of-alice"): 1.0, key_identity("key-of-bob"): 0.0,
                         principal_identity(principal): 1.0}

    # The same key posting again replaces its own verdict; it cannot touch another caller's.
    assert http_feedback(doc["id"], {"thumb": "down"}, key="key-of-alice")[0] == 202
    by_source = {f["source"]: f["value"] for f in env.store.list_feedback(doc["id"])}
    assert len(by_source) == 3 and by_source[key_identity("key-of-alice")] == 0.0

    status, body = http_feedback(doc["id"], {"thumb": "up", "source": key_identity("key-of-bob")}, key="key-of-eve")
    assert status == 400 and body["error"].startswith("source:") and "caller" in body["error"]
    assert {f["source"]: f["value"] for f in env.store.list_feedback(doc["id"])} == by_source


def test_http_feedback_takes_a_bounded_number_of_sources(env: Env) -> None:
    from agent_learning.rewards.feedback import MAX_FEEDBACK_SOURCES

    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    for i in range(MAX_FEEDBACK_SOURCES):
        assert http_feedback(doc["id"], {"thumb": "up"}, key=f"key-{i}")[0] == 202
    status, body = http_feedback(doc["id"], {"thumb": "down"}, key="one-key-too-many")
    assert status == 409 and body["error"].startswith("source:")
    assert f"{MAX_FEEDBACK_SOURCES} sources" in body["error"] and "MAX_FEEDBACK_SOURCES" in body["error"]
    assert len(env.store.list_feedback(doc["id"])) == MAX_FEEDBACK_SOURCES
    assert http_feedback(doc["id"], {"thumb": "down"}, key="key-3")[0] == 202  # an existing source may change
    assert {f["value"] for f in env.store.list_feedback(doc["id"])} == {0.0, 1.0}


def test_http_feedback_from_one_key_posing_as_many_principals_is_one_source(env: Env) -> None:
    """Without the setting that states App Service Authentication is on, the principal header is
    the client's own: a key sending a new principal each time replaces its one verdict, instead
    of outvoting the others and filling the sources so that the real users are refused."""
    from agent_learning.rewards.feedback import MAX_FEEDBACK_SOURCES

    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    assert http_feedback(doc["id"], {"thumb": "up"}, key="key-of-alice")[0] == 202
    for i in range(MAX_FEEDBACK_SOURCES):
        forged = {"X-MS-CLIENT-PRINCIPAL-ID": f"4f1c2a3b-0000-4000-8000-{i:012d}"}
        status, body = http_feedback(doc["id"], {"thumb": "down"}, key="key-of-mallory", headers=forged)
        assert status == 202 and body["source"] == key_identity("key-of-mallory")
    by_source = {f["source"]: f["value"] for f in env.store.list_feedback(doc["id"])}
    assert by_source == {key_identity("key-of-alice"): 1.0, key_identity("key-of-mallory"): 0.0}
    assert http_feedback(doc["id"], {"thumb": "up"}, key="key-of-bob")[0] == 202  # room for the real users


def test_http_feedback_nested_too_deeply_is_a_400_naming_the_body(env: Env) -> None:
    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    status, body = http_feedback(doc["id"], b'{"thumb": ' + b"[" * 8_000 + b"]" * 8_000 + b"}")
    assert status == 400 and body["error"].startswith("body:") and "nested" in body["error"]
    assert env.store.list_feedback(doc["id"]) == []


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"not json", 400, "body"),
        ([1, 2], 400, "body"),
        ({"thumb": "sideways"}, 400, "thumb"),
        ({"score": 7}, 400, "score"),
        ({"score": "high"}, 400, "score"),
        ({}, 400, "thumb"),
        ({"score": None}, 400, "score: must be a number from 0 to 1, got null"),
        ({"thumb": None}, 400, "thumb: must be 'up' or 'down', got null"),
        ({"thumb": "up", "stars": 5}, 400, "stars"),
        ({"thumb": "up", "source": 3}, 400, "source"),
        ({"thumb": "up", "source": "reviewer"}, 400, "source"),
        ({"thumb": "up", "comment": "x" * 2000}, 400, "comment"),
        ({"thumb": "up", "comment": "x" * 20_000}, 413, "body"),
    ],
)
def test_http_feedback_rejects_bad_input_naming_the_field(env: Env, body: Any, status: int, field: str) -> None:
    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    got, answer = http_feedback(doc["id"], body)
    assert got == status and answer["error"].startswith(field if ":" in field else f"{field}:"), answer
    assert env.store.list_feedback(doc["id"]) == []


def test_http_feedback_on_a_stored_episode_without_a_valid_agent_id_is_409_not_the_callers_400(env: Env) -> None:
    """An episode written around the validation (agents may write to Cosmos DB directly) takes no
    feedback: the caller sent no agent_id, so the answer does not say its request was bad."""
    (doc,) = env.episodes(1)
    env.store.add_episode(Episode.from_dict(doc))
    for edit, problem in [("json_set(doc, '$.agent_id', 'Support Bot')", "'Support Bot' is not an agent id"),
                          ("json_remove(doc, '$.agent_id')", "agent id must be a non-empty string")]:
        with closing(sqlite3.connect(env.rt.settings.sqlite_path)) as conn, conn:
            conn.execute(f"UPDATE episodes SET doc = {edit} WHERE id = ?", (doc["id"],))
        status, body = http_feedback(doc["id"], {"thumb": "up"})
        assert status == 409, body
        assert body["error"].startswith(f"episode_id: invalid episode {doc['id']!r}: agent_id: {problem}")
        assert env.store.list_feedback(doc["id"]) == []


def test_http_feedback_for_an_unknown_episode_is_404(env: Env) -> None:
    status, body = http_feedback("no-such-episode", {"thumb": "up"})
    assert status == 404 and "no-such-episode" in body["error"]
    status, body = http_feedback("bad id!", {"thumb": "up"})
    assert status == 400 and body["error"].startswith("episode_id:")
