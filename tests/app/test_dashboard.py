"""The operators' dashboard (``GET /api/dashboard``, ``/api/dashboard/agents/{agent_id}``) on the demo's
data: through the Functions app with the real ``azure.functions`` types, with hostile stored strings,
and in a real browser (headless Chromium, from the system's packages) served by ``agent-learn serve``.

The demo runs once for the module (:func:`demo_folder`); a held candidate, a pin, users' feedback the
judge stops agreeing with, a dead letter and an agent with hostile descriptions are added to its store.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from factories import make_policy_doc, make_run
from serving import start

from agent_learning.app import handlers, http
from agent_learning.app.dashboard import data, render
from agent_learning.app.demo import run_demo
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Evaluation, Interval
from agent_learning.judges.sampling import JudgingRules
from agent_learning.ops.admin import set_pinned
from agent_learning.pipeline import create_policy, load_current
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards.feedback import record_feedback
from agent_learning.store.sqlite import SQLiteStore

HOSTILE = "<script>alert(1)</script>"
DEMO_AGENTS = ("math-tutor", "support-bot", "triage-bot")
HELD_AGENT, PINNED_AGENT, HOSTILE_AGENT = "math-tutor", "support-bot", "hostile-agent"
AGREEING, DISAGREEING = 40, 30
"""Users' feedback on the held agent's episodes: the first agrees with the judge, the latest does not."""

SCREENSHOT = "DASHBOARD_SCREENSHOT"
"""With this variable set to a path, the browser test saves the held agent's page there as a PNG
(``DASHBOARD_SCREENSHOT=docs/dashboard.png pytest tests/app/test_dashboard.py -k browser``)."""

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1600")


def add_operators_marks(db: Path) -> None:
    """A held candidate, a pin, users' feedback, a dead letter and hostile strings, in the demo's store."""
    settings = load_settings(store="sqlite", queue="sqlite", sqlite_path=str(db))
    clock = ManualClock()
    with SQLiteStore(db) as store, SQLiteQueue(db, name=settings.queue_name) as queue:
        current = load_current(store, HELD_AGENT)
        assert current is not None
        store.put_run(make_run(
            HELD_AGENT, current.version + 1, id=f"{HELD_AGENT}-held", status="held",
            base_version=current.version, metrics={"mean_reward": 0.5},
            evaluation=Evaluation(verdict="held", reason=f"worse than the current policy {HOSTILE}", estimator="snips",
                                  confidence=0.95, margin=0.0, episodes=100, effective_sample_size=40.0,
                                  candidate=Interval(value=0.41, low=0.3, high=0.52),
                                  current=Interval(value=0.8, low=0.75, high=0.85)),
        ))
        set_pinned(store, PINNED_AGENT, True, reason=f"reward fell {HOSTILE}")
        for i, episode in enumerate(store.list_episodes(HELD_AGENT, AGREEING + DISAGREEING)):
            verdict = data.judge_verdict(store.get_score(episode["id"], HELD_AGENT))
            assert verdict is not None
            agrees = i < AGREEING
            value = 1.0 if (verdict >= data.GOOD) == agrees else 0.0
            clock.advance(60)
            record_feedback(store, episode["id"], score=value, comment=HOSTILE, clock=clock)
        doc = make_policy_doc(HOSTILE_AGENT, actions=["a", "b"], note=HOSTILE)
        create_policy(store, doc.model_copy(
            update={"actions": [a.model_copy(update={"description": HOSTILE}) for a in doc.actions]}))
        queue.send([OutgoingMessage("poison-1", "{}")])
        (message,) = queue.receive(1)
        queue.dead_letter(message, HOSTILE, HOSTILE)


@pytest.fixture(scope="module")
def demo_folder() -> Iterator[Path]:
    """The demo's store (``local.db``, where ``agent-learn serve --db`` looks) with the marks added."""
    folder = Path(tempfile.mkdtemp(prefix="dashboard-"))
    run_demo(db_path=folder / "local.db", scenarios=DEMO_AGENTS, episodes_per_agent=1_000, batch=100)
    add_operators_marks(folder / "local.db")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def app_runtime(demo_folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[handlers.Runtime]:
    """The Functions app's runtime on the demo's store and queues."""
    settings = load_settings(store="sqlite", queue="sqlite", sqlite_path=str(demo_folder / "local.db"))
    rt = handlers.build_runtime(settings)
    monkeypatch.setattr(handlers, "_runtime", rt)
    yield rt
    assert rt.parts is not None
    rt.parts.close()


class Page(HTMLParser):
    """What a page holds: its text, its elements (tag, attributes) and whether any script runs."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.texts).split())

    def tags(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs in self.elements if tag == name]


def get(name: str, query: dict[str, str] | None = None, **params: str) -> Any:
    """Route ``name`` through the Functions app with a real ``func.HttpRequest``."""
    func = pytest.importorskip("azure.functions")
    from app_functions import functions

    template = http.BY_NAME[name].template
    url = "/api/" + re.sub(r"\{(\w+)\}", lambda m: params[m.group(1)], template)
    req = func.HttpRequest(method="GET", url=url, route_params=params, params=query or {}, headers={}, body=b"")
    return functions()[name].get_user_function()(req)


# --------------------------------------------------------------------------- through the Functions app


def test_the_overview_names_every_agent_with_its_marks_through_the_functions_app(app_runtime: Any) -> None:
    resp = get("dashboard")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    page = Page(resp.get_body().decode())
    assert not page.tags("script")
    rows = {a["href"]: a for a in page.tags("a") if a.get("class") == "agent-link"}
    assert set(rows) == {f"dashboard/agents/{a}" for a in (*DEMO_AGENTS, HOSTILE_AGENT)}
    text = page.text
    assert "held" in text and "pinned" in text
    assert HOSTILE in text  # the dead letter's reason, shown as text
    assert re.search(r"judge agrees with users on 0% of the latest \d+ episodes", text), text


def test_the_overview_stops_auditing_when_its_time_is_spent_and_shows_no_count_rather_than_zero(
    app_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's audit reads all its scores: past the overview's time the other agents get no
    books (a dash, not a 0 that would say nothing was lost), and a note names them."""
    from agent_learning.app.dashboard import data

    monkeypatch.setattr(data, "OVERVIEW_AUDIT_SECONDS", 0.0)
    page = Page(get("dashboard").get_body().decode())
    uncounted = [c for c in page.tags("td") if c.get("title") == "not audited for this page: see the notes"]
    agents = len(DEMO_AGENTS) + 1
    assert len(uncounted) == 5 * (agents - 1)  # the first agent is audited, each other one's five cells are not
    assert f"{agents - 1} agents not audited within 0 s" in page.text and "agent-learn audit" in page.text


def test_the_agent_page_charts_its_learning_and_marks_the_hold(app_runtime: Any) -> None:
    resp = get("dashboard_agent", agent_id=HELD_AGENT)
    assert resp.status_code == 200
    page = Page(resp.get_body().decode())
    assert not page.tags("script")
    assert len(page.tags("svg")) >= 4  # probabilities, reward, estimates, agreement
    assert any(c.get("class") == "hold" for c in page.tags("circle"))
    assert any(t.get("class") == "hold" for t in page.tags("tr"))
    text = page.text
    assert f"worse than the current policy {HOSTILE}" in text
    assert f"on {0:.0%} of the latest" in text and f"of {AGREEING + DISAGREEING} episodes with feedback" in text


def test_the_pinned_agent_page_says_why_and_marks_the_pin(app_runtime: Any) -> None:
    page = Page(get("dashboard_agent", agent_id=PINNED_AGENT).get_body().decode())
    assert f"Learning is paused (pinned): reward fell {HOSTILE}" in page.text
    assert any(line.get("class") == "pin" for line in page.tags("line"))


def test_hostile_strings_are_escaped_everywhere(app_runtime: Any) -> None:
    """Stored text (a dead letter's reason, a pin's reason, a guardrail reason, an action's description,
    a version's note) and an agent id in the URL reach the page as text, never as markup."""
    bodies = [get("dashboard").get_body().decode()]
    agents = (HELD_AGENT, PINNED_AGENT, HOSTILE_AGENT)
    bodies += [get("dashboard_agent", agent_id=a).get_body().decode() for a in agents]
    missing = get("dashboard_agent", agent_id=HOSTILE)
    assert missing.status_code == 404
    bodies.append(missing.get_body().decode())
    for body in bodies:
        assert "<script" not in body
        page = Page(body)
        assert not page.tags("script")
    assert HOSTILE in Page(bodies[3]).text  # the description and the note, as text
    assert f"No agent {HOSTILE}" in Page(bodies[-1]).text


def test_a_bad_page_number_is_a_400_naming_it_and_pages_turn(app_runtime: Any) -> None:
    bad = get("dashboard_agent", {"page": "x"}, agent_id=HELD_AGENT)
    assert bad.status_code == 400 and b"page" in bad.get_body()
    assert get("dashboard", {"page": "0"}).status_code == 400
    beyond = get("dashboard_agent", {"page": "99", "code": "k&y"}, agent_id=HELD_AGENT)
    assert beyond.status_code == 200  # clamped to the last page
    links = [a["href"] for a in Page(beyond.get_body().decode()).tags("a")]
    assert "../../dashboard?code=k%26y" in links  # the key goes with the links


def test_long_series_are_thinned_and_tables_paged() -> None:
    """A page of 1,000 versions draws at most MAX_POINTS per line and PAGE_ROWS rows a table page."""
    from agent_learning.app.dashboard.svg import MAX_POINTS, thin

    points = [(float(i), float(i % 7)) for i in range(1_000)]
    kept = thin(points)
    assert len(kept) <= MAX_POINTS and kept[0][0] < kept[-1][0]
    assert sum(y for _, y in kept) / len(kept) == pytest.approx(sum(y for _, y in points) / len(points), rel=0.02)
    rows, number, pages = render.paged(list(range(1_000)), 3)
    assert (len(rows), number, pages) == (render.PAGE_ROWS, 3, -(-1_000 // render.PAGE_ROWS))


def test_the_agent_page_gives_the_drift_warnings_the_trainer_gave() -> None:
    """Runs whose reward falls sharply: the warnings the trainer's drift review gives at those versions
    (recomputed from the stored runs) are on the page, each with its version."""
    from agent_learning.pipeline.drift import DriftConfig
    from agent_learning.store.memory import MemoryStore

    store, agent = MemoryStore(), "drifting"
    create_policy(store, make_policy_doc(agent))
    for v in range(2, 22):
        run = make_run(agent, v, episodes=100, metrics={"mean_reward": 0.9 if v < 12 else 0.2,
                                                        "episode_reward_std": 0.1})
        store.put_run(run)
        store.create_policy_version(make_policy_doc(agent, v, run=run))
    page = data.agent_page(store, agent, JudgingRules.parse("*=all"), DriftConfig())
    assert page is not None
    # each side pools two runs (the 200-episode window): the fall warns from its first run until the
    # earlier side is made of fallen runs
    assert {w.version for w in page.drift} == {12, 13, 14}
    text = Page(render.agent_html(page, render.Links("../../", None), 1, datetime.now(UTC))).text
    assert "Drift at v12 (reward_drop)" in text and "Drift at v13 (reward_drop)" in text


# --------------------------------------------------------------------------- in a browser


def chromium() -> str | None:
    return shutil.which("chromium") if Path(CHROMEDRIVER).exists() else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by chromedriver, with a fresh profile."""
    if chromium() is None:
        pytest.skip("chromium and chromium-driver are not installed (make test installs them: apt-get install "
                    "chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-")
    options = webdriver.ChromeOptions()
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def served(demo_folder: Path) -> Iterator[str]:
    """``agent-learn serve`` on the demo's store; its ``/api/`` base URL."""
    server = start(demo_folder)
    try:
        yield server.url + "/api/"
    finally:
        server.stop(signal.SIGTERM)


def drawn(driver: Any, css: str) -> list[Any]:
    """The elements ``css`` selects that the browser drew with a non-zero size."""
    from selenium.webdriver.common.by import By

    return [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.size["width"] > 0 and e.size["height"] > 0]


def test_a_person_sees_every_agent_the_charts_and_the_hold_in_a_browser(browser: Any, served: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(served + "dashboard")
    names = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "a.agent-link") if e.is_displayed()}
    assert names == {*DEMO_AGENTS, HOSTILE_AGENT}
    held = [e for e in browser.find_elements(By.CSS_SELECTOR, "#agents td.hold") if e.is_displayed()]
    assert [e.text for e in held] == ["held"]

    browser.find_element(By.LINK_TEXT, HELD_AGENT).click()
    assert browser.find_element(By.ID, "agent-id").text == HELD_AGENT
    assert len(drawn(browser, "figure.chart svg")) >= 4
    assert drawn(browser, "svg polyline.series")  # the lines themselves
    assert drawn(browser, "svg circle.hold")  # the held candidate on the estimate chart
    assert drawn(browser, "#held tr.hold")
    if os.environ.get(SCREENSHOT):  # docs/dashboard.png: the page as a person sees it
        browser.set_window_size(1400, browser.execute_script("return document.body.scrollHeight") + 40)
        browser.save_screenshot(os.environ[SCREENSHOT])
        browser.set_window_size(1400, 1600)

    browser.get(served + f"dashboard/agents/{HOSTILE_AGENT}")
    assert HOSTILE in browser.find_element(By.ID, "actions").text  # shown as text, not run
