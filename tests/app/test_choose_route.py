"""``POST /api/agents/{agent_id}/choose``: agents in other languages draw a configuration over HTTP,
then write the episode back with the values it returned (the real ``azure.functions`` types)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("azure.functions")

import azure.functions as func
from app_functions import functions
from test_episode_ingestion import SUPPORT_KEY, WRITERS, App

from agent_learning.agent.client import PolicyClient
from agent_learning.app import handlers
from agent_learning.core.errors import StoredDocumentInvalid
from agent_learning.documents import AGENT_ID_RULE, DOC_ID_RULE, Episode
from agent_learning.pipeline import create_policy
from agent_learning.policy.softmax import SoftmaxPolicy


def choose(agent_id: str, body: Any) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = func.HttpRequest(method="POST", url=f"/api/agents/{agent_id}/choose", route_params={"agent_id": agent_id},
                               headers={"x-functions-key": SUPPORT_KEY}, body=raw)
    response = functions()["choose"].get_user_function()(request)
    assert response.mimetype == "application/json"
    return response.status_code, json.loads(response.get_body())


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> App:
    a = App(tmp_path, monkeypatch, WRITERS)
    policy = SoftmaxPolicy("support-eu", SoftmaxPolicy.from_actions("support-eu", [
        {"id": "k=1", "config": {"retrieval_k": 1}}, {"id": "k=5", "config": {"retrieval_k": 5}}]).actions, [1.0, 0.0])
    create_policy(a.store, policy.to_document(created_at=None))
    return a


def test_choose_is_an_http_post_with_function_key_auth() -> None:
    trigger, output = json.loads(functions()["choose"].get_function_json())["bindings"]
    assert trigger["type"] == "httpTrigger" and trigger["authLevel"] == "FUNCTION"
    assert trigger["methods"] == ["POST"] and trigger["route"] == "agents/{agent_id}/choose"
    assert output["type"] == "http"


def test_a_choice_over_http_follows_the_policy_and_its_episode_is_accepted_back(app: App) -> None:
    drawn = Counter()
    for _ in range(400):
        status, answer = choose("support-eu", {})
        assert status == 200
        drawn[answer["action_id"]] += 1
    expected = SoftmaxPolicy.from_document(app.store.get_current_policy("support-eu").doc).probabilities
    assert abs(drawn["k=1"] / 400 - expected["k=1"]) < 0.08  # 0.731: about 4.5 standard errors of room

    for no_context in ({}, {"context": {}}, {"context": None}):  # one spelling of "no features": null
        status, answer = choose("support-eu", no_context)
        assert status == 200 and answer["context"] is None, no_context
    status, answer = choose("support-eu", {"context": {"task": "billing", "tokens": 812}})
    assert status == 200 and answer["context"] == {"task": "billing", "tokens": 812}
    assert answer["probability"] == pytest.approx(expected[answer["action_id"]])
    assert answer["config"] == {"retrieval_k": int(answer["action_id"].split("=")[1])}
    now = datetime.now(UTC).isoformat()
    episode = {"id": answer["episode_id"], "agent_id": "support-eu", "policy_version": answer["policy_version"],
               "action_id": answer["action_id"], "probability": answer["probability"], "logprob": answer["logprob"],
               "context": answer["context"], "input": "How do I reset my password?", "output": "Settings.",
               "started_at": now, "ended_at": now, "incarnation": answer["incarnation"]}
    assert app.post("support-eu", episode) == (201, {"id": answer["episode_id"], "status": "created"})
    stored = app.store.get_episode(answer["episode_id"])
    assert stored is not None and Episode.from_dict(stored).context == {"task": "billing", "tokens": 812}


@pytest.mark.parametrize("body, status, problem", [
    (b'{"context": {"tokens": 1e400}}', 400, "context.tokens: must be a category"),
    (b'{"context": {"tokens": NaN}}', 400, "context.tokens: must be a category"),
    ({"context": {"tokens": 2**53}}, 400, "an integer must be below 2**53 in magnitude"),
    ({"context": {"task type": "x"}}, 400, "is not a feature name"),
    ({"context": "billing"}, 400, "context: must be an object"),
    ({"contxt": {}}, 400, "contxt: unknown field"),
    ([1], 400, "body: must be a JSON object"),
    (b"x" * 20_000, 413, "body: 20000 bytes"),
])
def test_bad_requests_name_the_field(app: App, body: Any, status: int, problem: str) -> None:
    got, answer = choose("support-eu", body)
    assert got == status and problem in answer["error"], answer


def test_an_unknown_agent_is_404_and_a_bad_id_400(app: App) -> None:
    assert choose("nobody", {}) == (404, {"error": "agent 'nobody' has no policy"})
    status, answer = choose("a/b", {})
    assert status == 400 and "agent_id" in answer["error"]


def test_an_invalid_stored_policy_is_503_with_retry_after_and_a_bad_context_400(app: App) -> None:
    """Told apart by the error's type: an invalid stored document (StoredDocumentInvalid) is the
    service's fault, whatever the request; a bad context is the caller's. Every 503 of the app
    carries Retry-After, as the store's outages do."""
    good = {k: v for k, v in app.store.get_current_policy("support-eu").doc.items() if not k.startswith("_")}
    app.store.put_raw_current_policy("support-eu", good | {"logits": [0.0]})
    with pytest.raises(StoredDocumentInvalid):
        PolicyClient(app.store, "support-eu").choose()
    problem = ("the current policy of 'support-eu' is invalid: "
               "invalid policy 'support-eu:current': logits: has 1 entries but there are 2 actions")
    for route, body in [("choose", b"{}"), ("choose", b'{"context": {"task": null}}'), ("policy", b"")]:
        request = func.HttpRequest(method="GET" if route == "policy" else "POST", url=f"/api/{route}/support-eu",
                                   route_params={"agent_id": "support-eu"}, headers={}, body=body)
        response = functions()[route].get_user_function()(request)
        assert response.status_code == 503 and json.loads(response.get_body()) == {"error": problem}, route
        assert response.headers.get("Retry-After") == str(handlers.RETRY_AFTER_SECONDS), route

    app.store.put_raw_current_policy("support-eu", good)  # repaired: the request's own fault shows
    status, answer = choose("support-eu", {"context": {"task": None}})
    assert status == 400 and answer["error"].startswith("context.task: must be a category"), answer
    assert choose("support-eu", {})[0] == 200


def call(route: str, param: str, value: str, body: bytes, method: str = "POST") -> tuple[int, dict[str, Any]]:
    """The app's ``route`` function with ``{param}`` = ``value`` in its path, as the support caller."""
    request = func.HttpRequest(method=method, url=f"/api/{route}/{value}", route_params={param: value},
                               headers={"x-functions-key": SUPPORT_KEY}, body=body)
    response = functions()[route].get_user_function()(request)
    return response.status_code, json.loads(response.get_body())


ROUTES = [("choose", "agent_id"), ("ingest", "agent_id"), ("feedback", "episode_id"), ("policy", "agent_id")]


@pytest.mark.parametrize("route, param", ROUTES)
def test_a_bad_id_in_the_path_is_answered_with_the_rule_and_a_short_echo(app: App, route: str, param: str) -> None:
    status, answer = call(route, param, "bad id/" + "x" * 292, b"{}", "GET" if route == "policy" else "POST")
    rule = AGENT_ID_RULE if param == "agent_id" else DOC_ID_RULE
    assert status == 400 and answer["error"].startswith(f"{param}: 'bad id/xxx"), answer
    assert answer["error"].endswith(f"' is not an {param.replace('_', ' ')}: use {rule}")
    assert "x" * 73 in answer["error"] and "x" * 74 not in answer["error"]  # the first 80 characters of 299


@pytest.mark.parametrize("route, param", ROUTES[:3])
@pytest.mark.parametrize("body, problem", [
    (b"{not json", "body: is not valid JSON (Expecting property name"),
    (b"\xff", "body: is not valid JSON ('utf-8' codec can't decode"),
    (b"[" * 10_000, "body: is nested too deeply to parse"),
    (b'{"context": {"task": "billing", "task": "refund"}}', "body: names 'task' twice in one object; only the last"),
])
def test_every_route_words_a_body_that_is_not_json_alike(
    app: App, route: str, param: str, body: bytes, problem: str
) -> None:
    status, answer = call(route, param, "support-eu", body)
    assert status == 400 and answer["error"].startswith(problem), answer


def test_a_structured_contextual_policy_answers_one_value_per_dimension_and_the_joint_probability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_learning.policy.softmax import StructuredPolicy

    a = App(tmp_path, monkeypatch, WRITERS)
    first = StructuredPolicy.create("support-eu", {"prompt": ["concise", "steps"], "retrieval_k": [1, 3, 5]},
                                    context={"task": "category"}, excluded=[{"prompt": "concise", "retrieval_k": 5}])
    create_policy(a.store, first.document)
    seen = Counter()
    for _ in range(200):
        status, answer = choose("support-eu", {"context": {"task": "billing"}})
        assert status == 200, answer
        assert set(answer["config"]) == {"prompt", "retrieval_k"}
        config = answer["config"]
        assert answer["action_id"] == f"prompt={config['prompt']}:retrieval_k={config['retrieval_k']}"
        assert answer["probability"] == pytest.approx(first.probability(answer["action_id"], {"task": "billing"}))
        seen[answer["action_id"]] += 1
    assert "prompt=concise:retrieval_k=5" not in seen and len(seen) == 5
    now = datetime.now(UTC).isoformat()
    episode = {"id": answer["episode_id"], "agent_id": "support-eu", "policy_version": 1,
               "action_id": answer["action_id"], "probability": answer["probability"], "logprob": answer["logprob"],
               "context": answer["context"], "input": "Why was I charged twice?", "output": "A refund is on its way.",
               "started_at": now, "ended_at": now, "incarnation": answer["incarnation"]}
    assert app_post_status(a, episode) == 201
    status, answer = choose("support-eu", {"context": {"task": 3.5, "extra": "x"}})
    assert status == 200 and answer["context"] == {"task": 3.5, "extra": "x"}
    for nested in ({"kind": "billing"}, ["billing"]):  # after a cached context of strings, too
        status, answer = choose("support-eu", {"context": {"task": nested}})
        assert status == 400 and "context.task: must be a category" in answer["error"], answer


def app_post_status(a: App, episode: dict[str, Any]) -> int:
    return a.post("support-eu", episode)[0]


def test_a_deleted_agent_is_404_like_get_not_its_cached_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_LEARNING_POLICY_REFRESH_SECONDS", "0")
    a = App(tmp_path, monkeypatch, WRITERS)
    create_policy(a.store, SoftmaxPolicy.from_actions("support-tn2", ["k=1", "k=5"]).to_document(created_at=None))
    status, answer = choose("support-tn2", {})
    assert status == 200 and answer["policy_version"] == 1

    a.store.delete_agent("support-tn2")
    assert choose("support-tn2", {}) == (404, {"error": "agent 'support-tn2' has no policy"})
    a.store.close()
