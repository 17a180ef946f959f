"""`agent-learn audit`: where every episode is, rebuilt from the store, on SQLite and on Cosmos DB
over the wire; damaged books (a late score, overlapping runs) are found and fail the command."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rich")
from click.testing import CliRunner, Result
from factories import CountingStore, make_score

from agent_learning.app.embedded import LocalPipeline, open_local
from agent_learning.app.settings import load_settings
from agent_learning.cli import main
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Action, Episode, Feedback, PolicyDocument, TrainingRun
from agent_learning.ops import audit as audit_module
from agent_learning.ops.audit import audit, audit_agent
from agent_learning.pipeline import create_policy, load_current, publish, revise, rollback, set_pinned
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.rewards.feedback import record_feedback, sweep
from agent_learning.sim.simulate import math_tutor
from agent_learning.store.base import Store

AGENT = "math-tutor"
ACTIONS = ["direct", "step-by-step", "calculator", "few-shot"]


class Setup:
    """An embedded pipeline with the math tutor's policy and ``rounds`` trained rounds."""

    def __init__(self, pipeline: LocalPipeline) -> None:
        self.pipeline, self.store = pipeline, pipeline.store
        self.clock, self.rng, self.scenario = ManualClock(), random.Random(5), math_tutor(AGENT)
        create_policy(self.store, SoftmaxPolicy.from_actions(AGENT, ACTIONS).to_document(created_at=self.clock.now()))

    def write(self, n: int, prefix: str = "ep") -> list[str]:
        current = load_current(self.store, AGENT)
        assert current is not None
        policy = SoftmaxPolicy.from_document(current, rng=self.rng)
        start = sum(1 for _ in self.store.episode_ids(AGENT))
        return [
            self.scenario.run_episode(self.store, policy.choose(), self.rng, self.clock,
                                      episode_id=f"{prefix}-{start + i:04d}").id
            for i in range(n)
        ]

    def round(self, n: int = 10) -> None:
        self.write(n)
        self.pipeline.run_once()


@pytest.fixture(autouse=True)
def guardrail_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds of a few episodes are too few for the guardrail to judge (it would hold them): it warns, so
    the books have versions to audit."""
    monkeypatch.setenv("AGENT_LEARNING_GUARDRAIL", "warn")


@pytest.fixture
def setup(durable_store: Store, tmp_path: Path) -> Iterator[Setup]:
    """The embedded pipeline as configured, on each store a deployment runs on (tests/support/adapters.py)."""
    local = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    local.store.close()
    pipeline = LocalPipeline(durable_store, local.queue, local.scorer.judge, local.scorer.reward, local.learner)
    s = Setup(pipeline)
    yield s
    pipeline.queue.close()


def test_healthy_books_and_every_state_counted(setup: Setup) -> None:
    for _ in range(3):
        setup.round()
    unscored = setup.write(2)  # written, not enqueued yet
    setup.pipeline.pump()
    setup.pipeline.score_pending()  # scored, not trained yet
    setup.write(1)
    books = audit_agent(setup.store, AGENT)
    assert (books.episodes, books.learned, books.pending_training, books.pending_scoring) == (33, 30, 2, 1)
    assert (books.lost, books.learned_twice, books.dead_lettered, books.pending) == (0, 0, 0, 3)
    assert books.versions == 4 and books.runs == 3 and books.problems == [] and books.ok
    assert books.episodes == (
        books.learned + books.learned_twice + books.skipped + books.lost + books.pending + books.dead_lettered
    )
    assert unscored  # (the two written before scoring were scored by then)


def test_rollbacks_and_pins_keep_the_books_whole(setup: Setup) -> None:
    """A rollback publishes a version without a run and keeps the cursor; a pin publishes none:
    the chain stays intact and every episode is learned once, before and after them."""
    setup.round()
    setup.round()
    rollback(setup.store, AGENT, 2, clock=setup.clock)
    set_pinned(setup.store, AGENT, True, "checking")
    setup.round()  # scored while pinned: pending, not lost
    books = audit_agent(setup.store, AGENT)
    assert (books.learned, books.pending_training, books.lost, books.problems) == (20, 10, 0, [])
    set_pinned(setup.store, AGENT, False)
    setup.round()
    books = audit_agent(setup.store, AGENT)
    assert (books.episodes, books.learned, books.pending, books.lost, books.learned_twice) == (40, 40, 0, 0, 0)
    assert books.versions == 5 and books.runs == 3 and books.ok  # init, 2 runs, rollback, 1 run of 20


def test_the_chain_is_read_a_page_of_versions_at_a_time(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit never holds an agent's every version document: it reads them by number, a page
    at a time, and checks the chain across the pages as it would in one."""
    for _ in range(3):
        setup.round()
    rollback(setup.store, AGENT, 2, clock=setup.clock)
    setup.round()
    whole = audit_agent(setup.store, AGENT)
    monkeypatch.setattr(audit_module, "VERSION_PAGE", 2)
    counting = CountingStore(setup.store)
    paged = audit_agent(counting, AGENT)
    assert paged == whole and paged.versions == 6 and paged.ok
    assert counting.calls["list_policy_versions"] == 3


def test_feedback_stored_but_not_applied_is_reported_until_the_sweep_applies_it(setup: Setup) -> None:
    setup.round()
    episode_id = next(iter(sorted(setup.store.episode_ids(AGENT))))
    setup.store.put_feedback(Feedback.from_dict({  # what a feedback call that died next left behind
        "episode_id": episode_id, "agent_id": AGENT, "source": "user", "thumb": "down",
        "received_at": setup.clock.now().isoformat()}))
    books = audit_agent(setup.store, AGENT)
    assert (books.feedback_episodes, books.feedback_unapplied) == (1, 1)
    sweep(setup.store, clock=setup.clock)
    books = audit_agent(setup.store, AGENT)
    assert (books.feedback_episodes, books.feedback_unapplied, books.corrections) == (1, 0, 1)


def test_a_late_correction_is_pending_until_the_next_tick_learns_it_without_new_episodes(setup: Setup) -> None:
    setup.round()
    episode_id = min(setup.store.episode_ids(AGENT))
    assert record_feedback(setup.store, episode_id, thumb="down", clock=setup.clock).reconciled.status == "corrected"
    books = audit_agent(setup.store, AGENT)
    assert (books.pending_corrections, books.pending, books.feedback_unapplied) == (1, 0, 0)
    (outcome,) = setup.pipeline.run_once().trained  # a tick, and no episode written since the last
    assert outcome.status == "published" and outcome.run is not None
    assert (outcome.run.episodes, outcome.run.corrections) == (0, 1)
    books = audit_agent(setup.store, AGENT)
    assert (books.pending_corrections, books.corrections, books.learned, books.versions) == (0, 1, 10, 3)
    assert books.ok


def test_dead_letters_are_counted_by_reason(tmp_path: Path) -> None:
    pipeline = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    s = Setup(pipeline)
    s.round()
    raw = s.store.get_episode(next(iter(s.store.episode_ids(AGENT))))
    assert raw is not None
    s.store.add_raw_episode({**raw, "id": "bad-action", "action_id": "not-an-action"})  # type: ignore[attr-defined]
    s.pipeline.run_once()
    books = audit(s.store, pipeline.queue, [AGENT]).agents[0]
    assert books.dead_lettered == 1 and books.dead_lettered_by_reason == {"UnknownAction": 1}
    assert books.lost == 0 and books.ok
    without_queue = audit(s.store, None, [AGENT])
    assert without_queue.agents[0].pending_scoring == 1 and "no queue" in without_queue.notes[0]
    pipeline.queue.close()


def recreate(setup: Setup) -> tuple[str | None, str | None]:
    """Delete the agent and create it again under its id: its incarnations before and after."""
    before = load_current(setup.store, AGENT)
    setup.store.delete_agent(AGENT)  # what `agent-learn agent delete` does
    create_policy(setup.store, SoftmaxPolicy.from_actions(AGENT, ACTIONS).to_document(created_at=setup.clock.now()))
    after = load_current(setup.store, AGENT)
    assert before is not None and after is not None
    return before.incarnation, after.incarnation


def test_a_re_created_agent_dead_letters_its_predecessors_queued_episodes_and_learns_nothing(setup: Setup) -> None:
    setup.write(5)
    setup.pipeline.pump()
    setup.pipeline.score_pending()  # the scorer now remembers v1 of the first incarnation
    queued = setup.write(20, prefix="old")
    setup.pipeline.pump()  # their scoring messages wait in the queue
    old, new = recreate(setup)
    assert old and new and old != new
    setup.pipeline.run_once()  # the queue drained by the same long-lived scorer
    letters = setup.pipeline.queue.dead_letters()
    assert sorted(d.message_id for d in letters) == sorted(queued)
    assert {d.reason for d in letters} == {"IncarnationMismatch"}
    assert all(f"incarnation {old} of agent {AGENT!r}" in d.description and new in d.description for d in letters)
    assert setup.store.read_scores(AGENT, None, 100, settled=False) == []
    current = load_current(setup.store, AGENT)
    assert current is not None and current.version == 1  # learned nothing
    books = audit(setup.store, setup.pipeline.queue, [AGENT]).agents[0]
    assert (books.other_incarnation, books.scores_without_episode, books.episodes, books.lost) == (20, 0, 0, 0)
    assert books.ok


def test_training_refuses_a_score_of_another_incarnation_and_the_audit_counts_it(setup: Setup) -> None:
    """A scorer in another process that still remembered the deleted agent's version scored its
    episode: the score is not learned (the run rejects it, saying why) and the audit counts it."""
    old, _ = recreate(setup)
    setup.write(4)
    stale = make_score("old-1", agent_id=AGENT, action_id=ACTIONS[0], incarnation=old)
    setup.store.add_score(stale)
    setup.pipeline.run_once()
    current = load_current(setup.store, AGENT)
    assert current is not None and current.run is not None
    assert (current.run.episodes, current.run.rejected) == (4, 1)
    assert "incarnation" in current.run.rejected_samples[0].error and old in current.run.rejected_samples[0].error
    books = audit(setup.store, setup.pipeline.queue, [AGENT]).agents[0]
    assert (books.other_incarnation, books.scores_without_episode, books.learned) == (1, 0, 4) and books.ok


def test_an_episode_without_an_incarnation_belongs_to_an_agent_created_before_incarnations(setup: Setup) -> None:
    """Documents of earlier releases are read unchanged: an agent whose policy has no incarnation
    learns from episodes without one, as before; once re-created, it refuses them."""
    setup.store.delete_agent(AGENT)
    first = SoftmaxPolicy.from_actions(AGENT, ACTIONS).to_document(created_at=setup.clock.now())
    publish(setup.store, first.as_kind("current"), None)  # created as an earlier release created it
    assert "incarnation" not in setup.store.get_policy_version(AGENT, 1)  # type: ignore[operator]
    setup.round(5)
    written = setup.store.get_episode(next(iter(setup.store.episode_ids(AGENT))))
    assert written is not None and "incarnation" not in written
    assert audit_agent(setup.store, AGENT).learned == 5
    old, new = recreate(setup)
    assert old is None and new
    setup.store.add_episode(Episode.from_dict({**written, "id": "from-an-earlier-writer"}))
    setup.pipeline.run_once()
    (letter,) = setup.pipeline.queue.dead_letters()
    assert letter.reason == "IncarnationMismatch" and "legacy (from before incarnations)" in letter.description


def sqlite_file(store: Store) -> sqlite3.Connection:
    return sqlite3.connect(store.path, isolation_level=None)  # type: ignore[attr-defined]


def test_a_score_that_landed_behind_the_cursor_is_lost(tmp_path: Path) -> None:
    """A score written inside a range that a run had already read (as a late write on Cosmos DB
    does) is never learned: the audit finds it by the range holding more rows than its run counted."""
    pipeline = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    s = Setup(pipeline)
    s.write(10)
    s.pipeline.pump()
    s.pipeline.score_pending()
    with sqlite_file(s.store) as conn:  # leave room between the seqs
        conn.execute("UPDATE scores SET seq = -seq")  # (seqs are unique at every row's update)
        conn.execute("UPDATE scores SET seq = -seq * 10")
    s.pipeline.train()
    late_episode = s.write(1)[0]
    template = make_score(late_episode, agent_id=AGENT, action_id=ACTIONS[0], policy_version=2,
                          incarnation=load_current(s.store, AGENT).incarnation)  # type: ignore[union-attr]
    with sqlite_file(s.store) as conn:  # its seq lies in v2's consumed range
        conn.execute("INSERT INTO scores (id, agent_id, seq, doc) VALUES (?, ?, ?, ?)",
                     (late_episode, AGENT, 15, template.model_copy(update={"seq": 15}).to_json()))
    books = audit_agent(s.store, AGENT)
    assert (books.lost, books.late, books.learned, books.learned_twice) == (1, 1, 10, 0) and not books.ok
    pipeline.queue.close()


def test_overlapping_runs_are_learned_twice(tmp_path: Path) -> None:
    """v3's run claims to have started where v1 ended: the first batch lies in two ranges."""
    pipeline = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    s = Setup(pipeline)
    s.round(10)
    s.round(10)
    v3 = PolicyDocument.from_dict(s.store.get_policy_version(AGENT, 3))
    assert v3.run is not None
    run = v3.run.model_copy(update={"cursor_from": None, "episodes": 20})
    with sqlite_file(s.store) as conn:
        conn.execute("UPDATE runs SET doc = ? WHERE id = ?", (run.to_json(), run.id))
        conn.execute("UPDATE policies SET doc = ? WHERE id = ?",
                     (v3.model_copy(update={"run": run}).to_json(), v3.id))
        current = load_current(s.store, AGENT)
        assert current is not None
        conn.execute("UPDATE policies SET doc = ? WHERE id = ?",
                     (current.model_copy(update={"run": run}).to_json(), current.id))
    books = audit_agent(s.store, AGENT)
    assert (books.learned_twice, books.learned, books.lost) == (10, 10, 0)
    assert any("starts at" in p for p in books.problems) and not books.ok
    assert TrainingRun.from_dict(s.store.get_run(run.id)).cursor_from is None
    pipeline.queue.close()


# --------------------------------------------------------------------------- the command


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("AGENT_LEARNING_STORE", "AGENT_LEARNING_QUEUE", "AGENT_LEARNING_SQLITE_PATH"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "local.db"


def test_the_command_exits_0_on_healthy_books_with_the_documented_json(db: Path) -> None:
    pipeline = open_local(load_settings(sqlite_path=str(db)))
    s = Setup(pipeline)
    s.round(12)
    s.write(3)
    pipeline.store.close()
    pipeline.queue.close()
    result = cli("audit", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["ok"] is True
    books = data["agents"][AGENT]
    for key in ("episodes", "learned", "learned_twice", "skipped", "dead_lettered", "pending", "lost"):
        assert isinstance(books[key], int)
    assert (books["episodes"], books["learned"], books["pending"], books["lost"]) == (15, 12, 3, 0)
    text = cli("audit", "--db", str(db), "--agent-id", AGENT)
    assert text.exit_code == 0 and "nothing lost or learned twice" in text.stdout
    assert "3 not scored yet" in text.stdout


def test_the_command_exits_1_when_an_episode_is_lost_and_2_for_an_unknown_agent(db: Path) -> None:
    pipeline = open_local(load_settings(sqlite_path=str(db)))
    s = Setup(pipeline)
    s.round(5)
    with sqlite_file(s.store) as conn:  # a published version whose run went missing
        conn.execute("DELETE FROM runs")
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.run', NULL) WHERE kind = 'version'")
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.run', NULL) WHERE kind = 'current'")
    pipeline.store.close()
    pipeline.queue.close()
    result = cli("audit", "--db", str(db), "--json")
    assert result.exit_code == 1, result.output
    books = json.loads(result.stdout)["agents"][AGENT]
    assert books["lost"] == 5 and books["ok"] is False
    assert any("no run record" in p for p in books["problems"])
    unknown = cli("audit", "--db", str(db), "--agent-id", "nobody")
    assert unknown.exit_code == 2 and "nobody" in unknown.output and "Traceback" not in unknown.output


def test_an_episode_whose_score_document_is_invalid_is_rejected_not_pending(tmp_path: Path) -> None:
    """Training skips an invalid score document for good (its run counts it as rejected), so its
    episode is neither pending nor lost: it is counted apart, and the states still add up."""
    pipeline = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    s = Setup(pipeline)
    s.round()
    bad = s.write(1)[0]
    raw = s.store.read_scores(AGENT, None, 1, settled=False)[0]
    s.store.put_raw_score({k: v for k, v in raw.items() if k != "seq"} | {"id": bad, "episode_id": bad, "reward": 7.0})
    s.pipeline.run_once()
    books = audit_agent(s.store, AGENT)
    assert (books.episodes, books.learned, books.rejected, books.invalid_scores) == (11, 10, 1, 1)
    assert (books.pending, books.lost, books.ok) == (0, 0, True)
    states = ("learned", "learned_twice", "lost", "pending", "dead_lettered", "unjudged", "rejected")
    assert sum(getattr(books, state) for state in states) == books.episodes
    pipeline.queue.close()


def test_a_trained_version_whose_document_is_invalid_is_named_once_and_its_episodes_stay_learned(
    tmp_path: Path,
) -> None:
    """Its run record still holds the range it learned: its episodes were learned, not lost, and
    the version is named as invalid, not also as missing."""
    pipeline = open_local(load_settings(sqlite_path=str(tmp_path / "local.db")))
    s = Setup(pipeline)
    for _ in range(3):
        s.round()
    with sqlite3.connect(tmp_path / "local.db") as conn:  # a version document edited by hand
        conn.execute("UPDATE policies SET doc = json_set(doc, '$.logits', json('[0]')) WHERE id = ?", (f"{AGENT}:v3",))
    books = audit_agent(s.store, AGENT)
    assert (books.episodes, books.learned, books.lost) == (30, 30, 0)
    assert books.versions == 4  # as many as `policy history` counts: the invalid one too
    assert [p for p in books.problems if "v3" in p or "[3]" in p] == [
        f"version '{AGENT}:v3' is invalid: invalid policy: logits: has 1 entries but there are 4 actions"
    ]
    assert not books.ok  # the invalid document is still a problem
    pipeline.queue.close()


def test_episodes_a_run_skipped_because_a_revision_removed_their_action_are_skipped_not_learned(
    setup: Setup,
) -> None:
    setup.round()
    setup.write(20)  # chosen under v2, trained after the revision
    revise(setup.store, AGENT, [Action(id=a) for a in ACTIONS[1:]], clock=setup.clock)
    setup.pipeline.run_once()
    current = load_current(setup.store, AGENT)
    assert current is not None and current.run is not None
    removed = current.run.skipped
    assert removed  # some of the 20 chose the removed action
    books = audit_agent(setup.store, AGENT)
    assert (books.episodes, books.learned, books.skipped, books.lost) == (30, 30 - removed, removed, 0)
    assert books.pending == 0
    assert books.ok and books.problems == []
