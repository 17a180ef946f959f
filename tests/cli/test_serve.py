"""``agent-learn serve`` over real HTTP: the app's routes from the embedded store, the pipeline in the
background, the key, and a clean stop. The server runs as a subprocess, as a user starts it."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from cli_harness import cli
from serving import Server, call, environment, start, until

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import HttpEpisodeWriter, HttpPolicySource, PolicyClient
from agent_learning.app.callers import key_identity
from agent_learning.app.http import ROUTES

KEY = "local-test-key"
AGENT = "support-bot"


KEYED = {"x-functions-key": KEY}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``serve --key`` on a store where ``init-policy`` created :data:`AGENT`; the key may write its
    episodes. Stopped with Ctrl-C (SIGINT) at the end, which must be clean."""
    folder = tmp_path_factory.mktemp("serve")
    (folder / "actions.json").write_text('["k=3", "k=5"]')
    created = subprocess.run(
        [sys.executable, "-m", "agent_learning.cli", "init-policy", "--agent-id", AGENT, "--actions",
         str(folder / "actions.json"), "--db", str(folder / "local.db")],
        env=environment(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert created.returncode == 0, created.stderr
    server = start(folder, "--key", KEY, AGENT_LEARNING_EPISODE_WRITERS=json.dumps({key_identity(KEY): [AGENT]}),
                   AGENT_LEARNING_GUARDRAIL="off")  # publish from one episode (the guardrail wants 30)
    yield server
    code, said = server.stop(signal.SIGINT)
    assert (code, "Traceback" in said) == (0, False), said


def test_it_says_where_it_listens_every_route_and_what_runs_in_the_background(served: Server) -> None:
    banner = served.banner()
    assert served.url.startswith("http://127.0.0.1:") and "key required" in banner
    for route in ROUTES:
        assert re.search(rf"{', '.join(route.methods)} +/api/{re.escape(route.template)}\n", banner), route.name
    assert "background: change feed and scorer every 0.05 s, training every 0.2 s" in banner


def test_an_episode_posted_is_scored_and_trained_in_the_background_and_takes_feedback(served: Server) -> None:
    status, _, body = call(f"{served.url}/api/agents/{AGENT}/choose", "POST", {}, KEYED)
    chosen = json.loads(body)
    assert (status, chosen["policy_version"], chosen["action_id"] in ("k=3", "k=5")) == (200, 1, True)

    client = PolicyClient(HttpPolicySource(served.url, KEY), AGENT)  # the agent side, over the same routes
    with EpisodeCapture(HttpEpisodeWriter(served.url, KEY), client.choose(), input="Where is my order?") as run:
        episode = run.end("It ships today.")

    def trained() -> dict[str, Any] | None:
        status, _, body = call(f"{served.url}/api/policies/{AGENT}", headers=KEYED)
        policy = json.loads(body)
        return policy if status == 200 and policy["version"] > 1 else None

    policy = until(trained, "new policy version")
    assert policy["parent_version"] == 1
    until(lambda: f"training {AGENT}: published v{policy['version']}" in served.err.read_text(), "word of it")

    feedback = f"{served.url}/api/episodes/{episode.id}/feedback"
    first = call(feedback, "POST", {"thumb": "down", "comment": "wrong order"}, KEYED)
    again = call(feedback, "POST", {"thumb": "down", "comment": "wrong order"}, KEYED)
    answers = [json.loads(body) for _, _, body in (first, again)]
    assert (first[0], again[0]) == (200, 200)  # the episode is scored: the feedback applies at once
    assert [a["status"] for a in answers] == ["corrected", "unchanged"]  # posting again changes nothing
    assert answers[0]["feedback_id"] == answers[1]["feedback_id"] and answers[0]["source"] == key_identity(KEY)


def test_the_policy_route_answers_304_to_its_etag(served: Server) -> None:
    status, headers, _ = call(f"{served.url}/api/policies/{AGENT}", headers=KEYED)
    etag = headers["ETag"]
    assert status == 200 and etag
    status, _, body = call(f"{served.url}/api/policies/{AGENT}", headers={**KEYED, "If-None-Match": etag})
    assert (status, body) == (304, b"")


@pytest.mark.parametrize("form", ["x-functions-key", "code", "Ocp-Apim-Subscription-Key"])
def test_every_request_must_carry_the_key_in_one_of_its_three_forms(served: Server, form: str) -> None:
    def get(key: str) -> tuple[int, Message, bytes]:
        if form == "code":
            return call(f"{served.url}/api/policies/{AGENT}?code={key}")
        return call(f"{served.url}/api/policies/{AGENT}", headers={form: key})

    assert get(KEY)[0] == 200
    assert KEY not in served.banner() + served.err.read_text()  # the log shows code=<hidden>
    status, headers, body = get("not-the-key")
    assert (status, headers.get_content_type()) == (401, "application/json")
    assert json.loads(body)["error"].startswith("wrong key")


def test_a_request_without_the_key_is_refused_before_any_route_is_looked_up(served: Server) -> None:
    for path in (f"/api/policies/{AGENT}", "/api/no-such-route"):
        status, _, body = call(served.url + path)
        assert (status, json.loads(body)["error"].startswith("no key")) == (401, True), path


def test_an_unknown_route_is_404_and_a_wrong_method_405_in_json(served: Server) -> None:
    status, _, body = call(f"{served.url}/api/no-such-route", headers=KEYED)
    assert (status, json.loads(body)) == (404, {"error": "no route /api/no-such-route"})
    status, headers, body = call(f"{served.url}/api/policies/{AGENT}", "DELETE", headers=KEYED)
    assert (status, "GET" in headers["Allow"], "DELETE" in json.loads(body)["error"]) == (405, True, True)


def test_without_a_key_it_listens_on_this_machine_only_and_sigterm_stops_it_cleanly(tmp_path: Path) -> None:
    server = start(tmp_path)  # an empty folder: the store is created
    assert server.url.startswith("http://127.0.0.1:") and "no key" in server.banner()
    status, _, body = call(f"{server.url}/api/policies/{AGENT}")
    assert (status, json.loads(body)) == (404, {"error": f"agent {AGENT!r} has no policy"})
    code, said = server.stop(signal.SIGTERM)
    assert (code, "Traceback" in said) == (0, False), said


@pytest.mark.usefixtures("embedded_env")
def test_a_port_in_use_or_an_empty_key_is_bad_input_naming_the_option() -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = cli("serve", "--port", str(taken.getsockname()[1]))
    assert result.exit_code == 2 and "--port: cannot listen on 127.0.0.1:" in result.output, result.output
    assert signal.getsignal(signal.SIGTERM) == handler  # the command put back the handler it replaced
    result = cli("serve", "--key", " ")
    assert result.exit_code == 2 and "--key: is empty" in result.output, result.output


WITHOUT_THE_EXTRA = """
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("uvicorn", "starlette"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from agent_learning.cli import main
main(sys.argv[1:])
"""


def test_without_the_serve_extra_it_says_how_to_install_it(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_THE_EXTRA, "serve", "--db", str(tmp_path / "x.db")],
                          env=environment(), capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, "Traceback" in done.stderr) == (1, False), done.stderr
    assert "pip install 'agent-learning[serve]'" in done.stderr
