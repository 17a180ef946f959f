"""The Azure AI Personalizer API per agent (``agents/{agent_id}/personalizer/...``): the route
handlers through :func:`agent_learning.app.http.dispatch` on the embedded store and pipeline, and the
real ``azure-ai-personalizer`` client driving the same handlers over HTTP."""

from __future__ import annotations

import io
import json
import math
import random
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from serving import call, start, until

from agent_learning.app import handlers, http
from agent_learning.app.callers import identify, key_digest, key_identity
from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.settings import load_settings
from agent_learning.app.wiring import Components
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Episode
from agent_learning.pipeline import set_pinned

ACTIONS = [{"id": topic, "features": [{"topic": topic, "length": n}]} for topic, n in
           (("sports", 3), ("politics", 5), ("cooking", 2))]
CONTEXT = [{"user": {"tier": "gold", "device": "mobile"}}, {"hour": 9}]


class App:
    """A runtime over an embedded store and its pipeline, and requests to its Personalizer routes."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.clock = ManualClock()
        s = load_settings(sqlite_path=str(tmp_path / "app.db"), store="sqlite", queue="sqlite",
                          policy_refresh_seconds=0, **settings)
        self.parts = Components(s, clock=self.clock)
        self.rt = handlers.Runtime(s, self.parts.store, send=None, parts=self.parts)

    def call(self, name: str, body: Any = None, method: str = "POST", agent: str = "news",
             **params: str) -> tuple[int, Any]:
        raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        answer = http.dispatch(name, http.Request(method, {"agent_id": agent, **params}, {}, {}, raw), self.rt)
        return answer.status, json.loads(answer.body) if answer.body else None

    def rank(self, event_id: str, agent: str = "news", **fields: Any) -> dict[str, Any]:
        status, answer = self.call("personalizer_rank", {"contextFeatures": CONTEXT, "actions": ACTIONS,
                                                         "eventId": event_id, **fields}, agent=agent)
        assert status == 201, answer
        return answer

    def reward(self, event_id: str, value: float, agent: str = "news") -> None:
        assert self.call("personalizer_reward", {"value": value}, agent=agent, event_id=event_id) == (204, None)

    def episode(self, event_id: str, agent: str = "news") -> Episode | None:
        raw = self.rt.store.get_episode(f"{agent}:{event_id}")
        return None if raw is None else Episode.from_dict({k: v for k, v in raw.items() if not k.startswith("_")})

    def train(self) -> dict[str, int]:
        return LocalPipeline.of(self.parts).run_once().published


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = App(tmp_path)
    yield a
    a.parts.close()


def test_rank_reward_train_and_the_next_rank_serves_the_learned_policy(app: App) -> None:
    first = app.rank("e0")
    assert first["eventId"] == "e0" and first["ranking"][0]["id"] == first["rewardActionId"]
    assert math.isclose(sum(r["probability"] for r in first["ranking"]), 1.0)
    for i in range(150):
        chosen = app.rank(f"e{i}")["rewardActionId"]
        app.reward(f"e{i}", 1.0 if chosen == "cooking" else 0.0)
    assert app.train() == {"news": 2}
    after = {r["id"]: r["probability"] for r in app.rank("after")["ranking"]}
    assert after["cooking"] > 0.5 > max(after["sports"], after["politics"])
    assert after["cooking"] <= 1 - 0.2 * 2 / 3  # explorationPercentage keeps ε spread over the others


def test_an_event_is_the_episode_with_the_served_probability_and_the_callers_own_reward(app: App) -> None:
    answer = app.rank("deferred", deferActivation=True)
    app.reward("deferred", 0.75)
    assert app.episode("deferred") is None  # not activated: not learned from
    assert app.call("personalizer_activate", event_id="deferred") == (204, None)
    episode = app.episode("deferred")
    assert episode is not None and episode.reward == 0.75 and episode.action_id == answer["rewardActionId"]
    assert episode.probability == pytest.approx(answer["ranking"][0]["probability"])
    assert episode.context == {"user.tier": "gold", "user.device": "mobile", "hour": 9}
    assert episode.policy_version == 1 and episode.ttl == 90 * 86_400
    app.reward("deferred", 0.0)  # the earliest reward counts
    assert app.episode("deferred").reward == 0.75
    assert app.call("personalizer_activate", event_id="deferred") == (204, None)
    assert app.rank("deferred", deferActivation=True) == answer  # a retried rank answers as the first
    status, error = app.call("personalizer_rank", {"actions": ACTIONS, "eventId": "deferred"})
    assert status == 409 and "eventId" in error["error"]["message"]


def test_a_reward_after_the_wait_takes_the_default_reward(app: App) -> None:
    assert app.call("personalizer_service_configuration", {"rewardWaitTime": "PT1M", "defaultReward": 0.25},
                    method="PUT")[0] == 200
    app.rank("late")
    app.clock.advance(120)
    app.reward("late", 1.0)
    assert app.episode("late").reward == 0.25


def test_the_first_rank_creates_the_agent_unless_the_setting_says_no(app: App, tmp_path: Path) -> None:
    app.rank("one", agent="fresh")
    doc = app.rt.store.get_current_policy("fresh").doc
    assert [a["id"] for a in doc["actions"]] == ["sports", "politics", "cooking"]
    assert {f["name"]: f["kind"] for f in doc["features"]} == {"user.tier": "category", "user.device": "category",
                                                             "hour": "number"}
    off = App(tmp_path / "off", personalizer_create_agents=False)
    status, error = off.call("personalizer_rank", {"actions": ACTIONS}, agent="fresh")
    assert status == 404 and error["error"]["code"] == "ResourceNotFound"
    assert "AGENT_LEARNING_PERSONALIZER_CREATE_AGENTS" in error["error"]["message"]
    off.parts.close()


def test_multislot_ranks_each_slot_from_its_dimension_and_learns_the_mean_reward(app: App) -> None:
    slots = [{"id": "main", "baselineAction": "sports"}, {"id": "side", "baselineAction": "cooking",
                                                          "excludedActions": ["politics"]}]
    status, answer = app.call("personalizer_multislot_rank", {"actions": ACTIONS, "slots": slots, "eventId": "m1"},
                              agent="page")
    assert status == 201 and [s["id"] for s in answer["slots"]] == ["main", "side"]
    side = answer["slots"][1]["rewardActionId"]
    assert side != "politics"
    body = {"reward": [{"slotId": "main", "value": 1.0}, {"slotId": "side", "value": 0.5}]}
    assert app.call("personalizer_multislot_reward", body, agent="page", event_id="m1") == (204, None)
    episode = app.episode("m1", agent="page")
    assert episode is not None and episode.reward == 0.75
    assert episode.action_id == f"main={answer['slots'][0]['rewardActionId']}:side={side}"
    assert app.call("personalizer_multislot_activate", agent="page", event_id="m1") == (204, None)
    status, error = app.call("personalizer_rank", {"actions": ACTIONS}, agent="page")
    assert status == 400 and error["error"]["code"] == "InvalidMultiSlotApiAccess"
    status, error = app.call("personalizer_reward", {"value": 1}, agent="page", event_id="m1")
    assert status == 400 and "multi-slot event" in error["error"]["message"]


def test_the_service_configuration_is_kept_per_agent_and_apprentice_serves_the_baseline(app: App) -> None:
    status, config = app.call("personalizer_service_configuration", method="GET")
    assert status == 200 and config["learningMode"] == "Online" and config["rewardWaitTime"] == "PT10M"
    status, config = app.call("personalizer_service_configuration", {**config, "learningMode": "Apprentice",
                                                                      "rewardWaitTime": "00:30:00"}, method="PUT")
    assert status == 200 and config["learningMode"] == "Apprentice" and config["rewardWaitTime"] == "PT30M"
    assert app.call("personalizer_service_configuration", method="GET") == (200, config)
    assert app.call("personalizer_service_configuration", method="GET", agent="other")[1]["learningMode"] == "Online"
    answer = app.rank("a1", excludedActions=["sports"])
    assert answer["rewardActionId"] == "politics" and answer["ranking"][0]["probability"] == 1.0
    assert answer["ranking"][-1] == {"id": "sports", "probability": 0.0}
    status, policy = app.call("personalizer_policy_configuration", method="GET")
    assert status == 200 and policy["name"] == "news v1" and "hour" in policy["arguments"]


@pytest.mark.parametrize("route, body, status, code, field", [
    ("personalizer_rank", {"actions": []}, 400, "InvalidRankRequest", "actions"),
    ("personalizer_rank", {"actions": [{"id": "a b", "features": []}]}, 400, "InvalidRankRequest", "actions[0].id"),
    ("personalizer_rank", {"actions": ACTIONS, "excludedActions": ["x"]}, 400, "InvalidRankRequest",
     "excludedActions[0]"),
    ("personalizer_rank", {"actions": ACTIONS, "contextFeatures": {"a": 1}}, 400, "InvalidRankRequest",
     "contextFeatures"),
    ("personalizer_rank", {"actions": ACTIONS, "contextFeatures": [{"t": None}]}, 400, "InvalidRankRequest",
     "contextFeatures: t"),
    ("personalizer_rank", {"actions": ACTIONS, "deferActivation": "yes"}, 400, "InvalidRankRequest",
     "deferActivation"),
    ("personalizer_rank", {"actions": ACTIONS, "eventId": "a/b"}, 400, "InvalidRankRequest", "eventId"),
    ("personalizer_rank", {"actions": ACTIONS, "context": []}, 400, "InvalidRankRequest", "context: unknown field"),
    ("personalizer_rank", b'{"actions": 1, "actions": 2}', 400, "BadRequest", "body"),
    ("personalizer_rank", b"x" * 600_000, 413, "PayloadSizeExceeded", "body"),
    ("personalizer_multislot_rank", {"actions": ACTIONS, "slots": [{"id": "s", "baselineAction": "x"}]}, 400,
     "InvalidRankRequest", "slots[0].baselineAction"),
    ("personalizer_service_configuration", {"learningMode": "Offline"}, 400, "InvalidServiceConfiguration",
     "learningMode"),
    ("personalizer_service_configuration", {"rewardWaitTime": "PT1S"}, 400, "InvalidServiceConfiguration",
     "rewardWaitTime"),
    ("personalizer_service_configuration", {"explorationPercentage": 2}, 400, "InvalidServiceConfiguration",
     "explorationPercentage"),
    ("personalizer_service_configuration", {"rewardAggregation": "median"}, 400, "InvalidServiceConfiguration",
     "rewardAggregation"),
    ("personalizer_service_configuration", {"logRetentionDays": 0}, 400, "InvalidServiceConfiguration",
     "logRetentionDays"),
])
def test_bad_bodies_are_personalizer_errors_naming_the_field(
    app: App, route: str, body: Any, status: int, code: str, field: str
) -> None:
    method = "PUT" if route.endswith("configuration") else "POST"
    got, answer = app.call(route, body, method=method)
    assert got == status and answer["error"]["code"] == code, answer
    assert answer["error"]["message"].startswith(field), answer


def test_rewards_name_their_problem_and_an_unknown_event_is_404(app: App) -> None:
    app.rank("r1")
    for body, field in [({"value": 1.5}, "value"), ({"value": "1"}, "value"), ({"valu": 1}, "valu")]:
        status, answer = app.call("personalizer_reward", body, event_id="r1")
        assert status == 400 and answer["error"]["message"].startswith(field), answer
    status, answer = app.call("personalizer_reward", {"value": 1}, event_id="nobody")
    assert status == 404 and answer["error"]["code"] == "ResourceNotFound"
    assert app.call("personalizer_activate", event_id="nobody")[0] == 404
    status, answer = app.call("personalizer_rank", {"actions": ACTIONS}, agent="a/b")
    assert status == 400 and answer["error"]["message"].startswith("agent_id")
    assert app.call("personalizer_policy_configuration", method="GET", agent="nobody")[0] == 404


def test_the_subscription_key_header_is_a_key() -> None:
    assert identify({"Ocp-Apim-Subscription-Key": "k1"}) == identify({"x-functions-key": "k1"})
    assert identify({"Ocp-Apim-Subscription-Key": "k1"}).id == key_identity("k1")


# --------------------------------------------------------------------------- the real client


KEY = "personalizer-test-key"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``agent-learn serve --key`` on an empty embedded store, its pipeline in the background."""
    pytest.importorskip("uvicorn")
    server = start(tmp_path, "--key", KEY)
    yield f"{server.url}/api/agents"
    code, said = server.stop(signal.SIGINT)
    assert (code, "Traceback" in said) == (0, False), said


def test_the_azure_ai_personalizer_client_drives_agent_learn_serve(served: str) -> None:
    personalizer = pytest.importorskip("azure.ai.personalizer")
    from azure.core.credentials import AzureKeyCredential
    from azure.core.exceptions import HttpResponseError

    endpoint = f"{served}/news"
    admin = personalizer.PersonalizerAdministrationClient(endpoint, AzureKeyCredential(KEY))
    client = personalizer.PersonalizerClient(endpoint, AzureKeyCredential(KEY))
    config = admin.get_service_configuration()
    assert config["learningMode"] == "Online"
    assert admin.update_service_configuration({**config, "explorationPercentage": 0.1})["explorationPercentage"] == 0.1

    for i in range(120):
        answer = client.rank({"contextFeatures": CONTEXT, "actions": ACTIONS, "eventId": f"c{i}"})
        client.reward(f"c{i}", {"value": 1.0 if answer["rewardActionId"] == "politics" else 0.0})
    deferred = client.rank({"actions": ACTIONS, "contextFeatures": CONTEXT, "deferActivation": True})
    client.activate(deferred["eventId"])

    def learned() -> bool:  # trained in the background, into a version that serves politics most
        ranking = client.rank({"contextFeatures": CONTEXT, "actions": ACTIONS})["ranking"]
        return {r["id"]: r["probability"] for r in ranking}["politics"] > 0.5

    until(learned, "a version learned from the rewards")
    assert admin.get_policy()["name"] != "news v1"

    model = b"".join(admin.export_model())
    exported = json.loads(model)
    admin.import_model(io.BytesIO(json.dumps({**exported, "logits": [0.0] * len(exported["logits"])}).encode()))
    assert json.loads(b"".join(admin.export_model()))["source"] == "import"
    assert admin.get_model_properties()["lastModifiedTime"] > admin.get_model_properties()["creationTime"]
    window = {"startTime": "2020-01-01T00:00:00Z", "endTime": "2030-01-01T00:00:00Z"}
    admin.create_evaluation("ev", {"name": "served", **window, "policies": [{"name": "v1", "arguments": "version 1"}]})
    found = admin.get_evaluation("ev", start_time=datetime(2020, 1, 1, tzinfo=UTC),
                                 end_time=datetime(2030, 1, 1, tzinfo=UTC))
    assert found["status"] == "Succeeded" and {r["name"] for r in found["content"]["value"]} >= {"baseline", "v1"}
    assert [e["id"] for e in admin.list_evaluations()] == ["ev"]
    admin.delete_evaluation("ev")
    assert admin.get_log_properties()["dateRange"]["to"] >= admin.get_log_properties()["dateRange"]["from"]
    admin.delete_logs()
    assert admin.get_log_properties()["dateRange"] == {}
    vw = {"name": "vw", "arguments": "--cb_explore_adf --epsilon 0.2"}
    assert admin.update_policy(vw) == vw == admin.get_policy()
    assert admin.reset_policy()["name"].startswith("news v")
    admin.reset_model()
    assert json.loads(b"".join(admin.export_model()))["source"] == "rollback"

    page = personalizer.PersonalizerClient(f"{served}/page", AzureKeyCredential(KEY))
    slots = page.rank_multi_slot({"actions": ACTIONS, "slots": [{"id": "main", "baselineAction": "sports"}]})
    page.reward_multi_slot(slots["eventId"], {"reward": [{"slotId": "main", "value": 1.0}]})
    page.activate_multi_slot(slots["eventId"])

    with pytest.raises(HttpResponseError) as bad:
        client.rank({"actions": []})
    assert bad.value.status_code == 400 and "actions" in str(bad.value)
    wrong = personalizer.PersonalizerClient(endpoint, AzureKeyCredential("wrong"))
    with pytest.raises(HttpResponseError) as refused:
        wrong.rank({"actions": ACTIONS})
    assert refused.value.status_code == 401


def test_a_new_action_without_features_is_added_to_a_policy_without_context_features(app: App) -> None:
    plain = [{"id": a["id"], "features": []} for a in ACTIONS]
    app.call("personalizer_rank", {"actions": plain[:2], "eventId": "n1"}, agent="plain")
    status, answer = app.call("personalizer_rank", {"actions": plain, "eventId": "n2"}, agent="plain")
    assert status == 201 and {r["id"] for r in answer["ranking"]} == {"sports", "politics", "cooking"}
    doc = app.rt.store.get_current_policy("plain").doc
    assert doc["source"] == "revise" and [a["id"] for a in doc["actions"]] == ["sports", "politics", "cooking"]
    app.call("personalizer_rank", {"actions": plain, "contextFeatures": CONTEXT, "eventId": "c1"}, agent="ctx")
    status, error = app.call("personalizer_rank", {"actions": [*plain, {"id": "travel", "features": []}],
                                                   "contextFeatures": CONTEXT}, agent="ctx")
    assert status == 400 and "'travel'" in error["error"]["message"]  # its context features: not revised yet


def test_actions_with_features_are_scored_by_them_and_an_unseen_one_is_ranked_by_what_its_features_earned(
    app: App,
) -> None:
    rng = random.Random(5)
    for i in range(300):  # politics pays; the agent learns it from the topic feature
        answer = app.call("personalizer_rank", {"actions": ACTIONS, "contextFeatures": CONTEXT, "eventId": f"f{i}"})[1]
        app.reward(f"f{i}", float(answer["rewardActionId"] == "politics" and rng.random() < 0.9))
    doc = app.rt.store.get_current_policy("news").doc
    assert [f["name"] for f in doc["action_features"]] == ["length", "topic"]
    assert app.episode("f0").candidates is not None  # each event learned among what it offered
    assert app.train()["news"] > 1
    unseen = {"id": "politics-2", "features": [{"topic": "politics", "length": 9}]}
    status, answer = app.call("personalizer_rank", {"actions": [*ACTIONS, unseen], "contextFeatures": CONTEXT,
                                                    "eventId": "unseen"})
    ranked = {r["id"]: r["probability"] for r in answer["ranking"]}
    assert status == 201 and ranked["politics-2"] > max(ranked["sports"], ranked["cooking"])


APP_PRINCIPAL, OTHER_PRINCIPAL = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0", "99999999-8888-4777-8666-555555555555"
TOKENS = {"token-of-the-app": APP_PRINCIPAL, "token-of-another": OTHER_PRINCIPAL}


class EntraToken:
    """An Entra ID token credential: the token a sign-in would give, for Personalizer's scope."""

    def __init__(self, token: str) -> None:
        self.token = token

    def get_token(self, *scopes: str, **options: Any) -> Any:
        from azure.core.credentials import AccessToken

        assert scopes == ("https://cognitiveservices.azure.com/.default",)
        return AccessToken(self.token, int(time.time()) + 3600)


def test_the_functions_app_admits_personalizer_clients_by_their_own_key_or_token(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host reads neither Ocp-Apim-Subscription-Key nor a token, so the Personalizer functions
    are anonymous there and the app admits the configured keys and principals, and nobody else."""
    personalizer = pytest.importorskip("azure.ai.personalizer")
    from azure.core.credentials import AzureKeyCredential
    from azure.core.exceptions import HttpResponseError
    from functions_host import functions_host

    monkeypatch.setattr(handlers, "_runtime", app.rt)
    with functions_host("function-key", TOKENS) as base:
        endpoint = f"{base}/api/agents/news"

        def refused(credential: Any, **options: Any) -> HttpResponseError:
            with pytest.raises(HttpResponseError) as error:
                personalizer.PersonalizerClient(endpoint, credential).rank({"actions": ACTIONS}, **options)
            return error.value

        nothing_configured = refused(AzureKeyCredential(KEY))  # fails closed
        assert nothing_configured.status_code == 401 and "AGENT_LEARNING_PERSONALIZER_KEY_SHA256" in str(
            nothing_configured)
        monkeypatch.setattr(app.rt, "settings", app.rt.settings.model_copy(update={
            "personalizer_key_sha256": (key_digest("old-key"), key_digest(KEY)),
            "personalizer_principals": (APP_PRINCIPAL,), "trust_principal_header": True}))

        client = personalizer.PersonalizerClient(endpoint, AzureKeyCredential(KEY))
        ranked = client.rank({"actions": ACTIONS, "eventId": "f1"})
        client.reward("f1", {"value": 1.0})
        assert ranked["eventId"] == "f1" and app.episode("f1").reward == 1.0
        admin = personalizer.PersonalizerAdministrationClient(endpoint, AzureKeyCredential(KEY))
        assert json.loads(b"".join(admin.export_model()))["agent_id"] == "news"
        assert list(admin.list_evaluations()) == []

        signed_in = personalizer.PersonalizerClient(endpoint, EntraToken("token-of-the-app"))
        assert signed_in.rank({"actions": ACTIONS}, enforce_https=False)["ranking"]
        assert refused(EntraToken("token-of-another"), enforce_https=False).status_code == 403
        assert refused(AzureKeyCredential("wrong")).status_code == 401
        assert refused(AzureKeyCredential("function-key")).status_code == 401  # the host's key is not one of these
        assert call(f"{base}/api/policies/news")[0] == 401  # the other routes: the host checks its key
        assert call(f"{base}/api/policies/news", headers={"x-functions-key": "function-key"})[0] == 200


def test_an_activated_event_never_rewarded_takes_the_default_reward_when_the_timer_sweeps(app: App) -> None:
    assert app.call("personalizer_service_configuration", {"rewardWaitTime": "PT1M", "defaultReward": 0.25},
                    method="PUT")[0] == 200
    app.rank("silent")
    app.rank("hidden", deferActivation=True)  # never activated: never learned from
    app.rank("kept")
    app.reward("kept", 1.0)
    handlers.train(app.rt)  # the timer (Functions host, agent-learn serve) within the wait: nothing to do
    assert app.episode("silent") is None
    app.clock.advance(61)
    handlers.train(app.rt)
    assert app.episode("silent").reward == 0.25 and app.episode("hidden") is None
    assert app.episode("kept").reward == 1.0
    assert app.rt.store.list_checkpoints("personalizer-pending:") == {}  # the next sweep reads nothing
    app.rank("later")
    app.clock.advance(61)
    app.train()  # the embedded runner sweeps too, and learns the episode in the same run
    assert app.episode("later").reward == 0.25


def test_average_aggregation_learns_the_mean_of_the_rewards_within_the_wait(app: App) -> None:
    assert app.call("personalizer_service_configuration", {"rewardWaitTime": "PT1M", "rewardAggregation": "average"},
                    method="PUT")[0] == 200
    app.rank("avg")
    app.reward("avg", 1.0)
    app.reward("avg", 0.5)
    assert app.episode("avg") is None  # more may come within the wait
    app.clock.advance(61)
    app.reward("avg", 0.0)  # after the wait: ignored, and the mean is taken
    assert app.episode("avg").reward == 0.75
    app.rank("swept")
    app.reward("swept", 0.2)
    app.reward("swept", 0.4)
    app.clock.advance(61)
    handlers.train(app.rt)
    assert app.episode("swept").reward == pytest.approx(0.3)
    assert app.call("personalizer_service_configuration", {"rewardAggregation": "average"}, method="PUT",
                    agent="page")[0] == 200
    slots = [{"id": "main", "baselineAction": "sports"}, {"id": "side", "baselineAction": "cooking"}]
    assert app.call("personalizer_multislot_rank", {"actions": ACTIONS, "slots": slots, "eventId": "m"},
                    agent="page")[0] == 201
    for value in (1.0, 0.0):
        body = {"reward": [{"slotId": "main", "value": value}]}
        assert app.call("personalizer_multislot_reward", body, agent="page", event_id="m") == (204, None)
    app.clock.advance(601)  # the default wait of agent page
    handlers.train(app.rt)
    assert app.episode("m", agent="page").reward == pytest.approx((0.5 + 0.0) / 2)  # side had none: defaultReward 0
    status, error = app.call("personalizer_service_configuration", {"rewardAggregation": "median"}, method="PUT")
    assert status == 400 and "rewardAggregation" in error["error"]["message"]



# --------------------------------------------------------------------------- model, policy configuration, logs


def model_of(app: App, agent: str = "news") -> dict[str, Any]:
    answer = http.dispatch("personalizer_model", http.Request("GET", {"agent_id": agent}), app.rt)
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/octet-stream"
    return json.loads(answer.body)


def test_the_model_exports_imports_as_a_new_version_and_resets_to_version_one(app: App) -> None:
    app.rank("m0")
    exported = model_of(app)
    assert exported["agent_id"] == "news" and exported["version"] == 1
    edited = {**exported, "agent_id": "elsewhere", "logits": [2.0, 0.0, -2.0]}
    assert app.call("personalizer_model", json.dumps(edited).encode(), method="PUT") == (204, None)
    assert app.call("personalizer_model", json.dumps(edited).encode(), method="PUT") == (204, None)  # no change
    now = model_of(app)
    assert (now["version"], now["source"], now["logits"]) == (2, "import", [2.0, 0.0, -2.0])
    assert now["cursor"] == exported["cursor"] and now["agent_id"] == "news"  # no score learned twice or skipped
    history = [v for v, _ in app.rt.store.policy_version_times("news")]
    assert history == [1, 2]  # the audit trail holds the replaced version and the import
    ranking = {r["id"]: r["probability"] for r in app.rank("m1")["ranking"]}
    assert ranking["sports"] > ranking["politics"] > ranking["cooking"]
    status, props = app.call("personalizer_model_properties", method="GET")
    assert status == 200 and props["lastModifiedTime"] == now["created_at"].replace("Z", "+00:00")
    assert app.call("personalizer_model", method="DELETE") == (204, None)
    reset = model_of(app)
    assert (reset["version"], reset["source"], reset["logits"]) == (3, "rollback", exported["logits"])
    assert app.call("personalizer_model", method="DELETE") == (204, None) and model_of(app)["version"] == 3


@pytest.mark.parametrize("body, field", [
    (b"not json", "model: not a policy document"),
    (b"[]", "model: must be a policy document"),
    (json.dumps({"actions": [{"id": "a"}], "logits": [1.0, 2.0]}).encode(), "model: logits"),
    (json.dumps({"actions": [{"id": "s=a"}], "logits": [0.0], "dimensions": [{"name": "s", "size": 1}]}).encode(),
     "model: is a multi-slot model"),
])
def test_a_bad_model_is_refused_naming_the_field(app: App, body: bytes, field: str) -> None:
    app.rank("b0")
    status, error = app.call("personalizer_model", body, method="PUT")
    assert status == 400 and error["error"]["message"].startswith(field), error
    assert model_of(app)["version"] == 1
    assert app.call("personalizer_model", method="GET", agent="nobody")[0] == 404


def test_the_policy_configuration_is_stored_and_reset(app: App) -> None:
    app.rank("p0")
    put = {"name": "vw", "arguments": "--cb_explore_adf --epsilon 0.2"}
    assert app.call("personalizer_policy_configuration", put, method="PUT") == (200, put)
    assert app.call("personalizer_policy_configuration", method="GET") == (200, put)
    status, described = app.call("personalizer_policy_configuration", method="DELETE")
    assert status == 200 and described["name"] == "news v1"
    assert app.call("personalizer_policy_configuration", method="GET") == (200, described)
    status, error = app.call("personalizer_policy_configuration", {"name": "vw"}, method="PUT")
    assert status == 400 and error["error"]["message"].startswith("arguments")


def test_log_properties_span_the_agents_episodes_and_deleting_logs_keeps_what_was_learned(app: App) -> None:
    app.rank("l0")
    assert app.call("personalizer_log_properties", method="GET") == (200, {"dateRange": {}})
    app.reward("l0", 1.0)
    app.clock.advance(3600)
    app.rank("l1")
    app.reward("l1", 0.0)
    status, props = app.call("personalizer_log_properties", method="GET")
    first, last = app.episode("l0").started_at, app.episode("l1").started_at
    assert status == 200 and [datetime.fromisoformat(props["dateRange"][k]) for k in ("from", "to")] == [first, last]
    app.train()
    app.rank("waiting")  # an event still waiting for its reward
    learned = app.rt.store.get_current_policy("news").doc
    other = app.rank("o1", agent="sports")["eventId"]

    assert app.call("personalizer_logs", method="DELETE") == (204, None)
    assert app.episode("l0") is None and app.rt.store.get_score("news:l1", "news") is None
    assert app.call("personalizer_log_properties", method="GET") == (200, {"dateRange": {}})
    assert app.rt.store.get_current_policy("news").doc == learned and app.rt.store.list_runs("news")
    assert app.call("personalizer_reward", {"value": 1.0}, event_id="waiting")[0] == 404  # its event is gone too
    app.reward(other, 1.0, agent="sports")  # another agent's logs stay
    assert app.episode(other, agent="sports") is not None
    assert app.call("personalizer_logs", method="DELETE") == (204, None)  # again: nothing left
    assert app.call("personalizer_logs", method="DELETE", agent="nobody")[0] == 404


def test_logging_only_pins_the_agent_and_leaving_it_unpins_unless_an_operator_pinned(app: App) -> None:
    def pinned(agent: str = "news") -> tuple[bool, str]:
        doc = app.rt.store.get_current_policy(agent).doc
        return doc["pinned"], doc["pin_reason"]

    app.rank("g0")
    logging_only = {"learningMode": "LoggingOnly"}
    assert app.call("personalizer_service_configuration", logging_only, method="PUT")[0] == 200
    assert pinned()[0] and "LoggingOnly" in pinned()[1]
    app.reward(app.rank("g0-1")["eventId"], 1.0)
    assert app.episode("g0-1") is not None  # logged; the trainer leaves a pinned agent alone
    assert app.call("personalizer_service_configuration", {"learningMode": "Apprentice"}, method="PUT")[0] == 200
    assert pinned() == (False, "")
    set_pinned(app.rt.store, "news", True, "an operator's reason")
    app.call("personalizer_service_configuration", logging_only, method="PUT")
    app.call("personalizer_service_configuration", {"learningMode": "Online"}, method="PUT")
    assert pinned() == (True, "an operator's reason")
    app.call("personalizer_service_configuration", logging_only, method="PUT", agent="later")
    app.rank("g1", agent="later")  # the first rank creates it pinned
    assert pinned("later")[0]


# --------------------------------------------------------------------------- evaluations and apprentice mode


WINDOW = {"startTime": "2020-01-01T00:00:00Z", "endTime": "2030-01-01T00:00:00Z"}


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """An agent that served 200 events rewarding cooking, and learned from them."""
    a = App(tmp_path_factory.mktemp("learned"))
    for i in range(200):
        chosen = a.rank(f"e{i}")["rewardActionId"]
        a.reward(f"e{i}", 1.0 if chosen == "cooking" else 0.0)
    assert a.train() == {"news": 2}
    yield a
    a.parts.close()


def test_an_evaluation_estimates_the_policies_on_the_logged_events_and_is_kept(learned: App) -> None:
    body = {"name": "check", **WINDOW, "policies": [{"name": "first", "arguments": "version 1"},
                                                    {"name": "cook", "arguments": "always cooking"}]}
    status, made = learned.call("personalizer_evaluation", body, method="PUT", evaluation_id="ev1")
    assert status == 200 and made["status"] == "Succeeded" and made["optimalPolicy"] == "cook"
    results = {r["policySource"] if r["policySource"] != "Custom" else r["name"]: r for r in made["content"]["value"]}
    assert set(results) == {"Online", "Baseline", "Random", "first", "cook"}
    for r in results.values():
        low, high = r["summary"]["confidenceInterval"]
        assert low <= r["summary"]["expectedReward"] <= high and set(r["estimates"]) == {"ips", "snips", "dr"}
    assert results["cook"]["summary"]["expectedReward"] == pytest.approx(1.0)
    assert results["Online"]["summary"]["expectedReward"] > results["first"]["summary"]["expectedReward"]
    assert results["Random"]["summary"] == results["first"]["summary"]  # version 1 is uniform
    assert learned.call("personalizer_evaluation", body, method="PUT", evaluation_id="ev1") == (200, made)
    assert learned.call("personalizer_evaluation", method="GET", evaluation_id="ev1") == (200, made)
    status, error = learned.call("personalizer_evaluation", {**body, "name": "other"}, method="PUT",
                                 evaluation_id="ev1")
    assert status == 409 and error["error"]["message"].startswith("evaluationId")
    learned.call("personalizer_evaluation", {"name": "second", **WINDOW}, method="PUT", evaluation_id="ev2")
    status, listing = learned.call("personalizer_evaluations", method="GET")
    ids = [e["id"] for e in listing["value"]]  # oldest first
    assert status == 200 and ids.index("ev1") < ids.index("ev2") and listing["value"][0]["status"] == "Succeeded"
    assert learned.call("personalizer_evaluation", method="DELETE", evaluation_id="ev1") == (204, None)
    ids = [e["id"] for e in learned.call("personalizer_evaluations", method="GET")[1]["value"]]
    assert "ev1" not in ids and "ev2" in ids
    assert learned.call("personalizer_evaluation", method="GET", evaluation_id="ev1")[0] == 404


@pytest.mark.parametrize("body, field", [
    ({"name": "x", "startTime": "yesterday", "endTime": WINDOW["endTime"]}, "startTime"),
    ({"name": "x", "startTime": WINDOW["endTime"], "endTime": WINDOW["startTime"]}, "endTime"),
    ({"name": "x", **WINDOW, "policies": [{"name": "vw", "arguments": "--cb_explore_adf"}]}, "policies[0].arguments"),
    ({"name": "x", **WINDOW, "policies": [{"name": "v", "arguments": "version 9"}]}, "policies[0].arguments"),
    ({"name": "x", **WINDOW, "enablePolicyOptimization": True}, "enablePolicyOptimization"),
    ({"name": "x", **WINDOW, "extra": 1}, "extra"),
    ({"name": "x", "startTime": "2029-01-01T00:00:00Z", "endTime": "2030-01-01T00:00:00Z"}, "startTime"),
])
def test_a_bad_evaluation_is_refused_naming_the_field(learned: App, body: dict[str, Any], field: str) -> None:
    status, error = learned.call("personalizer_evaluation", body, method="PUT", evaluation_id="bad")
    assert status == 400 and error["error"]["message"].startswith(field), error
    assert learned.call("personalizer_evaluation", method="GET", evaluation_id="bad")[0] == 404


def test_apprentice_mode_says_from_the_newest_evaluation_whether_the_learned_policy_beats_the_baseline(
    learned: App,
) -> None:
    learned.call("personalizer_service_configuration", {"learningMode": "Apprentice"}, method="PUT")
    try:
        learned.call("personalizer_evaluation", {"name": "apprentice", **WINDOW}, method="PUT", evaluation_id="ap")
        status, config = learned.call("personalizer_service_configuration", method="GET")
        metrics = config["latestApprenticeModeMetrics"]
        assert status == 200 and metrics["evaluationId"] == "ap" and metrics["learnedPolicyBeatsBaseline"] is True
        assert metrics["learnedMinusBaseline"]["confidenceInterval"][0] > 0
        served = learned.rank("ap1")
        assert served["rewardActionId"] == "sports" and served["ranking"][0]["probability"] == 1.0  # the baseline
    finally:
        learned.call("personalizer_service_configuration", {"learningMode": "Online"}, method="PUT")
    assert "latestApprenticeModeMetrics" not in learned.call("personalizer_service_configuration", method="GET")[1]
