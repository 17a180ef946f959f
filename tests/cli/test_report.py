"""`agent-learn report` at scale: a window of versions, smoothing, and marks where operators acted."""

from __future__ import annotations

import json
import math
import random
import shutil
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")
from cli_harness import clear_settings
from click.testing import CliRunner

from agent_learning.cli import main
from agent_learning.ops.history import AgentHistory, history
from agent_learning.ops.plots import MARK, close, data_lines, history_figure, rolling_mean
from agent_learning.store.sqlite import SQLiteStore


def long_history(n: int) -> AgentHistory:
    rng = random.Random(0)
    sources = ["init"] + ["train"] * (n - 1)
    sources[n // 2] = "rollback"
    sources[n // 4] = "revise"
    return AgentHistory(
        "bot",
        ["a", "b"],
        versions=list(range(1, n + 1)),
        probabilities=[[0.5, 0.5]] * n,
        mean_reward=[None] + [0.7 + rng.gauss(0, 0.1) for _ in range(n - 1)],
        entropy=[0.69] * n,
        documents=[SimpleNamespace(source=s) for s in sources],  # type: ignore[misc]
        pinned=True,
    )


def test_a_thousand_versions_are_drawn_smoothed_with_their_marks() -> None:
    h = long_history(1_000)
    fig = history_figure([h], "t")
    try:
        _, ax_r, _ = fig.axes[:3]
        smoothed = [line for line in data_lines(ax_r) if "mean of 20 versions" in str(line.get_label())]
        assert len(smoothed) == 1  # 1,000 versions: a mean over 20
        y = list(smoothed[0].get_ydata())
        rewards = [m for m in h.mean_reward if m is not None]
        assert y[-1] == pytest.approx(sum(rewards[-20:]) / 20) and len(y) == 999
        marks = [line for line in ax_r.get_lines() if line.get_gid() == MARK]
        assert sorted(line.get_xdata()[0] for line in marks) == [251, 501, 1000]  # revise, rollback, pin
        labels = ax_r.get_legend_handles_labels()[1]
        assert {"rollback", "actions revised", "pinned: learning paused"} <= set(labels)
    finally:
        close(fig)
    few = history_figure([long_history(50)], "t")
    try:
        assert [len(data_lines(ax)) for ax in few.axes[:3]] == [2, 1, 1]  # 50 versions: drawn as they are
    finally:
        close(few)


def test_rolling_mean_is_the_trailing_mean() -> None:
    assert rolling_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert rolling_mean([2.0], 5) == [2.0] and not any(math.isnan(x) for x in rolling_mean([0.0] * 9, 3))


def test_hundreds_of_estimates_are_drawn_as_a_mean_in_a_band_and_a_few_as_error_bars() -> None:
    for n, bars in ((1_000, 0), (50, 1)):
        h = long_history(n)
        h.estimates = [None] + [(0.7, 0.6, 0.8 + i / n) for i in range(n - 1)]
        fig = history_figure([h], "t")
        try:
            ax_r = fig.axes[1]
            assert len(ax_r.containers) == bars  # matplotlib keeps each errorbar call as a container
            if not bars:
                (band,) = ax_r.collections
                (line,) = [x for x in data_lines(ax_r) if "estimate before publishing" in str(x.get_label())]
                assert "mean of 20 versions" in str(line.get_label()) and len(line.get_xdata()) == n - 1
                top = band.get_paths()[0].vertices[:, 1].max()
                assert top == pytest.approx(0.8 + (n - 2) / n - 19 / (2 * n))  # the mean of the last 20 bounds
        finally:
            close(fig)


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's store, made once for the module: tests read it through ``db``, a copy of their own."""
    path = tmp_path_factory.mktemp("demo") / "r.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        clear_settings(monkeypatch)
        # Batches of 10 are too few to judge: an enforcing guardrail would hold them; one that warns still estimates.
        monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")
        result = CliRunner().invoke(main, ["demo", "--db", str(path), "--episodes", "600", "--batch", "10",
                                           "--no-plot", "--agents", "support-bot"])
    assert result.exit_code == 0, result.output
    return path


@pytest.fixture
def db(demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A copy of the demo's store for one test, which may edit it."""
    clear_settings(monkeypatch)
    for part in demo_db.parent.glob(demo_db.name + "*"):  # the database and any journal beside it
        shutil.copy2(part, tmp_path / part.name)
    return str(tmp_path / demo_db.name)


def test_report_draws_the_newest_versions_or_a_time_window(db: str, tmp_path: Path) -> None:
    runner = CliRunner()
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    assert runner.invoke(main, ["policy", "rollback", "--agent-id", "support-bot", "30", "--db", db]).exit_code == 0
    last = json.loads(runner.invoke(main, ["report", "--last", "50", "--json", *files]).stdout)
    assert last["agents"]["support-bot"]["versions"] == 50
    html = (tmp_path / "r.html").read_text()
    assert html.count("<tr><td>") == 50 and "<td>12</td>" not in html and "<td>62</td>" in html
    smooth = json.loads(runner.invoke(main, ["report", "--smooth", "5", "--json", *files]).stdout)
    # raw and smoothed reward and entropy, and the guardrail's estimates
    assert smooth["agents"]["support-bot"]["series"] == [4, 3, 2]

    rows = json.loads(runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--json",
                                           "--db", db]).stdout)
    created = {r["version"]: datetime.fromisoformat(r["created_at"]) for r in rows}
    since = created[10].replace(microsecond=0)
    until = created[19].replace(microsecond=0) + timedelta(seconds=1)
    expected = sum(1 for t in created.values() if since <= t <= until)
    window = ["--since", since.strftime("%Y-%m-%dT%H:%M:%S"), "--until", until.strftime("%Y-%m-%dT%H:%M:%S")]
    timed = json.loads(runner.invoke(main, ["report", *window, "--json", *files]).stdout)
    assert timed["agents"]["support-bot"]["versions"] == expected >= 10


@pytest.mark.parametrize("args, problem", [
    (["--last", "0"], "--last"),
    (["--since", "yesterday"], "--since"),
    (["--since", "2026-02-01", "--until", "2026-01-01"], "is after --until"),
    (["--since", "2099-01-01"], "no versions"),
    (["--smooth", "0"], "--smooth"),
])
def test_bad_report_windows_are_one_line(db: str, tmp_path: Path, args: list[str], problem: str) -> None:
    result = CliRunner().invoke(main, ["report", "--db", db, "--png", str(tmp_path / "x.png"), *args])
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("reading policy versions")]
    assert result.exit_code == 2 and len(lines) == 1 and problem in lines[0], result.output


def test_a_policy_never_trained_is_drawn_on_its_own_versions() -> None:
    """A freshly created agent (one version, no run): its probabilities are visible points, every
    panel's axis is the version numbers it has, and the reward panel says there is no run yet."""
    h = AgentHistory("bot", ["a", "b"], versions=[1], probabilities=[[0.5, 0.5]], mean_reward=[None],
                     entropy=[0.69], documents=[SimpleNamespace(source="init")])  # type: ignore[list-item]
    fig = history_figure([h], "t")
    try:
        ax_p, ax_r, ax_h = fig.axes[:3]
        fig.canvas.draw()
        assert all(line.get_marker() not in (None, "None", "") for line in data_lines(ax_p))  # one point each
        assert data_lines(ax_r) == [] and "no training run yet" in [t.get_text() for t in ax_r.texts]
        for ax in (ax_p, ax_r, ax_h):
            low, high = ax.get_xlim()
            assert low < 1 < high and low > 0, (ax.get_title(), ax.get_xlim())  # never a negative version
            assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()  # no version 1.5
    finally:
        close(fig)


def test_a_contextual_agents_tables_say_their_probabilities_are_with_no_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The triage bot chooses by task type: its history table, the report's page and its entropy
    panel give the probabilities and entropy with no context, and say so (the chart's probability
    panel and --json give them per segment)."""
    clear_settings(monkeypatch)
    db = str(tmp_path / "t.db")
    runner = CliRunner()
    made = runner.invoke(main, ["demo", "--db", db, "--episodes", "100", "--batch", "50", "--no-plot",
                                "--agents", "triage-bot,support-bot"])
    assert made.exit_code == 0, made.output
    triage = runner.invoke(main, ["policy", "history", "--agent-id", "triage-bot", "--db", db])
    assert triage.exit_code == 0 and "with no context" in triage.stdout, triage.stdout
    flat = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--db", db])
    assert flat.exit_code == 0 and "no context" not in flat.stdout, flat.stdout
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    assert runner.invoke(main, ["report", *files]).exit_code == 0
    page = (tmp_path / "r.html").read_text()
    triage_part, support_part = page.split("<h2>triage-bot: ")[1], page.split("<h2>support-bot: ")[1]
    assert "with no context" in triage_part.split("<table>")[0]
    assert "no context" not in support_part.split("<h2>")[0]
    with SQLiteStore(db) as store:
        h = history(store, "triage-bot")
    fig = history_figure([h], "t")
    try:
        assert "no context" in fig.axes[2].get_title()
    finally:
        close(fig)


def test_an_agent_named_twice_is_charted_once(db: str, tmp_path: Path) -> None:
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    result = CliRunner().invoke(main, ["report", "--agent-id", "support-bot", "--agent-id", "support-bot", *files])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("support-bot:") == 1 and (tmp_path / "r.html").read_text().count("<h2>") == 1


def test_the_page_names_the_version_a_rollback_restored_as_policy_history_does(db: str, tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["policy", "rollback", "--agent-id", "support-bot", "30", "--db", db]).exit_code == 0
    history_text = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--limit", "1",
                                        "--db", db]).stdout
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    assert runner.invoke(main, ["report", "--last", "1", *files]).exit_code == 0
    assert "rollback of v30" in history_text and "<td>rollback of v30</td>" in (tmp_path / "r.html").read_text()


def test_an_invalid_version_document_is_named_and_left_out_while_the_others_are_read(db: str, tmp_path: Path) -> None:
    with sqlite3.connect(db) as conn:  # a version document edited by hand: three logits for four actions
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.logits', json('[0, 0, 0]')) "
                     "WHERE id = 'support-bot:v5'")
    runner = CliRunner()
    named = "invalid policy 'support-bot:v5': logits: has 3 entries but there are 4 actions (left out;"
    listed = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--json", "--db", db])
    assert listed.exit_code == 1 and named in listed.stderr
    versions = [r["version"] for r in json.loads(listed.stdout)]
    assert 5 not in versions and versions[:5] == [1, 2, 3, 4, 6]
    table = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--db", db])
    shown = f"{len(versions) + 1} policy versions, the {len(versions)} valid shown"
    assert table.exit_code == 1 and shown in table.stdout
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    charted = runner.invoke(main, ["report", "--json", *files])
    assert charted.exit_code == 1 and named in charted.stderr
    assert json.loads(charted.stdout)["agents"]["support-bot"]["versions"] == len(versions)
    restored = runner.invoke(main, ["policy", "rollback", "--agent-id", "support-bot", "5", "--db", db])
    # what the store holds, not the operator's input: 1, not 2 (bad input)
    assert restored.exit_code == 1 and "invalid policy 'support-bot:v5': logits:" in restored.stderr


def test_history_of_an_agent_whose_current_document_is_invalid_counts_every_version(db: str) -> None:
    """Before the fix `--limit 3` titled the table "3 policy versions": the count came from the
    current document, unreadable here, though the operator picks the version to roll back to from it."""
    with sqlite3.connect(db) as conn:  # the current document edited by hand
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.temperature', 0.001) WHERE id = 'support-bot:current'")
    runner = CliRunner()
    every = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--json", "--db", db])
    assert every.exit_code == 1 and "rollback --agent-id support-bot VERSION` repairs it" in every.stderr
    total = len(json.loads(every.stdout))
    limited = runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--limit", "3", "--db", db])
    assert limited.exit_code == 1 and f"{total} policy versions, the newest 3 valid shown" in limited.stdout


def test_the_report_says_how_many_versions_the_agent_has_and_which_it_charted(db: str, tmp_path: Path) -> None:
    """Before the fix the report said "5 versions" for the newest 5 of 61, or for 60 of 61 valid
    ones, where `policy history` says "61 policy versions, the newest 5 shown"."""
    runner = CliRunner()
    files = ["--png", str(tmp_path / "r.png"), "--html", str(tmp_path / "r.html"), "--db", db]
    total = len(json.loads(runner.invoke(main, ["policy", "history", "--agent-id", "support-bot", "--json",
                                                "--db", db]).stdout))
    every = runner.invoke(main, ["report", *files])
    assert every.exit_code == 0 and f"support-bot: {total} policy versions; series" in every.stdout
    assert f"<h2>support-bot: {total} policy versions</h2>" in (tmp_path / "r.html").read_text()
    last = runner.invoke(main, ["report", "--last", "5", *files])
    assert last.exit_code == 0 and f"support-bot: {total} policy versions, the newest 5 charted;" in last.stdout
    assert f"<h2>support-bot: {total} policy versions, the newest 5 charted</h2>" in (tmp_path / "r.html").read_text()
    with sqlite3.connect(db) as conn:  # a version document edited by hand
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.logits', json('[0, 0, 0]')) "
                     "WHERE id = 'support-bot:v5'")
    valid = runner.invoke(main, ["report", *files])
    assert valid.exit_code == 1 and f"{total} policy versions, the {total - 1} valid charted;" in valid.stdout
