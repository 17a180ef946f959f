"""The three handlers on the embedded adapters: idempotency, races, crashes and bad input."""

from __future__ import annotations

import json
import logging
import math
import random
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_learning.app import handlers
from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.settings import load_settings
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConcurrencyConflict, PermanentError, TransientError
from agent_learning.documents import Action, Episode, PolicyDocument, Score, TrainingRun
from agent_learning.judges.base import Judge, Judgement
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import LearnerConfig, Reinforce
from agent_learning.pipeline import (
    MAX_TRAIN_BATCH,
    Scorer,
    create_policy,
    enqueue_episodes,
    load_current,
    score_message,
    train_agent,
    train_safely,
)
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.rewards.feedback import record_feedback
from agent_learning.sim.simulate import math_tutor
from agent_learning.store.base import Store, Tagged
from agent_learning.store.sqlite import SQLiteStore

AGENT = "math-tutor"


class Env:
    """A store, a queue and the pipeline wired like the local runner, on one SQLite file."""

    def __init__(self, path: Path, clock: ManualClock, judge: Judge | None = None, max_deliveries: int = 10) -> None:
        self.path = path
        self.clock = clock
        self.store = SQLiteStore(path)
        self.queue = SQLiteQueue(path, lock_seconds=30, max_deliveries=max_deliveries, clock=clock)
        self.pipeline = LocalPipeline(self.store, self.queue, judge or OfflineJudge(), RewardFunction(), Reinforce(),
                                      clock=clock)
        self.scenario = math_tutor(AGENT)
        self.rng = random.Random(11)
        policy = SoftmaxPolicy.from_actions(AGENT, self.scenario.actions, exploration_floor=0.01, seed=3)
        create_policy(self.store, policy.to_document(created_at=clock.now()))

    def policy(self) -> SoftmaxPolicy:
        doc = load_current(self.store, AGENT)
        assert doc is not None
        return SoftmaxPolicy.from_document(doc, rng=self.rng)

    def episodes(self, n: int) -> list[Episode]:
        policy = self.policy()
        return [self.scenario.run_episode(self.store, policy.choose(), self.rng, self.clock) for _ in range(n)]

    def snapshot(self) -> dict[str, Any]:
        """Everything the pipeline stores, minus ETags (they are random by design)."""
        current = self.store.get_current_policy(AGENT)
        return {
            "episodes": self.store.list_episodes(limit=10_000),
            "scores": self.store.read_scores(AGENT, None, 10_000),
            "versions": self.store.list_policy_versions(AGENT),
            "current": current.doc if current else None,
            "runs": self.store.list_runs(AGENT, 10_000),
            "checkpoint": self.store.get_checkpoint("episodes-feed"),
            "queue": self.queue.counts(),
            "dead": [(d.message_id, d.reason) for d in self.queue.dead_letters(1000)],
        }


@pytest.fixture
def env(tmp_path: Path, clock: ManualClock) -> Env:
    return Env(tmp_path / "pipeline.db", clock)


# --------------------------------------------------------------------------- idempotency


def test_each_stage_run_twice_leaves_the_same_state(env: Env) -> None:
    env.episodes(40)
    env.pipeline.pump()
    after_pump = env.snapshot()
    assert after_pump["queue"].active == 40
    env.pipeline.pump()
    assert env.snapshot() == after_pump

    # Redeliver the whole change-feed batch: duplicate detection drops every message.
    result = enqueue_episodes(env.store.read_episodes(None, 1000).items, env.queue.send)
    assert (result.sent, result.duplicates) == (0, 40)
    assert env.snapshot() == after_pump

    assert env.pipeline.score_pending()["scored"] == 40
    after_score = env.snapshot()
    assert env.pipeline.score_pending() == {}
    assert env.snapshot() == after_score

    first = env.pipeline.train()
    assert [o.status for o in first] == ["published"]
    after_train = env.snapshot()
    second = env.pipeline.train()
    assert [o.status for o in second] == ["no_new_scores"]
    assert env.snapshot() == after_train


def test_a_re_score_is_not_measured_as_queue_lag(env: Env, captured: Any) -> None:
    (episode,) = env.episodes(1)
    body = json.dumps({"type": "score_request", "episode_id": episode.id})
    env.clock.advance(30)
    assert score_message(body, env.pipeline.scorer).status == "scored"
    env.clock.advance(30 * 86_400)  # an operator re-scores it a month later
    assert score_message(body, env.pipeline.scorer, force=True).status == "scored"
    (lag,) = captured.points("agent_learning.queue.lag")
    assert lag.count == 1 and lag.max < 60  # the first score only: a month is no queue lag


def test_scoring_the_same_message_twice_keeps_the_first_score(env: Env) -> None:
    (episode,) = env.episodes(1)
    scorer = env.pipeline.scorer
    body = json.dumps({"type": "score_request", "episode_id": episode.id})
    first = score_message(body, scorer)
    assert first.status == "scored" and first.score is not None
    stored = env.store.get_score(episode.id, AGENT)
    env.clock.advance(5)
    second = score_message(body, scorer)
    assert second.status == "duplicate"
    assert env.store.get_score(episode.id, AGENT) == stored  # scored_at unchanged: nothing rewritten


def test_forced_rescore_overwrites_in_place_and_is_not_learned_twice(env: Env) -> None:
    env.episodes(30)
    env.pipeline.run_once()
    runs_before = env.store.list_runs(AGENT)
    target = env.store.read_scores(AGENT, None, 1)[0]
    outcome = score_message(json.dumps({"type": "score_request", "episode_id": target["id"]}), env.pipeline.scorer,
                            force=True)
    assert outcome.status == "scored"
    assert outcome.score is not None and outcome.score.seq == target["seq"]
    assert len(env.store.read_scores(AGENT, None, 1000)) == 30
    assert [o.status for o in env.pipeline.train()] == ["no_new_scores"]
    assert env.store.list_runs(AGENT) == runs_before


# --------------------------------------------------------------------------- training and concurrency


def consumed_ranges_are_exact(store: Store, total_scores: int) -> None:
    """Every score was learned from exactly once: runs chain cursor to cursor and add up."""
    runs = sorted((TrainingRun.from_dict(r) for r in store.list_runs(AGENT, 100_000)), key=lambda r: r.policy_version)
    versions = [PolicyDocument.from_dict(v) for v in store.list_policy_versions(AGENT)]
    assert [v.version for v in versions] == list(range(1, len(versions) + 1))
    assert [r.policy_version for r in runs] == list(range(2, len(versions) + 1))
    previous = None
    for run in runs:
        assert run.cursor_from == previous
        assert run.base_version == run.policy_version - 1
        previous = run.cursor_to
    assert sum(r.episodes + r.rejected for r in runs) == total_scores
    seqs = [s["seq"] for s in store.read_scores(AGENT, None, 100_000)]
    assert previous is None or previous.seq == max(seqs)


def test_training_publishes_a_new_immutable_version_with_its_run(env: Env) -> None:
    env.episodes(60)
    report = env.pipeline.run_once()
    (outcome,) = report.trained
    assert outcome.status == "published" and outcome.version == 2
    v1 = PolicyDocument.from_dict(env.store.get_policy_version(AGENT, 1))
    v2 = PolicyDocument.from_dict(env.store.get_policy_version(AGENT, 2))
    assert v1.logits == [0.0, 0.0, 0.0, 0.0] and v1.source == "init"
    assert v2.logits != v1.logits and v2.source == "train" and v2.parent_version == 1
    assert v2.run is not None and v2.run.episodes == 60
    run = TrainingRun.from_dict(env.store.get_run(v2.run.id))
    assert run == v2.run
    assert run.metrics["mean_reward"] == pytest.approx(
        sum(s["reward"] for s in env.store.read_scores(AGENT, None, 100)) / 60)
    current = load_current(env.store, AGENT)
    assert current is not None and current.as_kind("version") == v2
    consumed_ranges_are_exact(env.store, 60)


def test_the_learner_state_rides_with_each_version_into_the_next_update(env: Env) -> None:
    """Each version stores the evidence of every episode learned so far; the next update starts
    from it (faded by the half-life) and adds its own batch."""
    env.episodes(60)
    env.pipeline.run_once()
    v2 = PolicyDocument.from_dict(env.store.get_policy_version(AGENT, 2))
    assert sum(v2.learner_state["count"]) == pytest.approx(60)
    env.episodes(40)
    env.pipeline.run_once()
    v3 = PolicyDocument.from_dict(env.store.get_policy_version(AGENT, 3))
    fade = 0.5 ** (40 / LearnerConfig().evidence_half_life)
    rewards = [s["reward"] for s in env.store.read_scores(AGENT, None, 1000)]  # in the order learned
    assert len(rewards) == 100 and sum(v2.learner_state["reward_sum"]) == pytest.approx(sum(rewards[:60]))
    assert sum(v3.learner_state["count"]) == pytest.approx(60 * fade + 40)
    assert sum(v3.learner_state["reward_sum"]) == pytest.approx(fade * sum(rewards[:60]) + sum(rewards[60:]))


class StaleReader(Store):
    """A store whose first current-policy read returns an earlier snapshot: a trainer that read
    the policy just before another trainer published."""

    def __init__(self, inner: Store, stale: Tagged) -> None:
        self.inner, self.stale = inner, stale

    def get_current_policy(self, agent_id: str) -> Tagged | None:
        stale, self.stale = self.stale, None
        return stale if stale is not None else self.inner.get_current_policy(agent_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


for _name in Store.__abstractmethods__ - {"get_current_policy"}:
    setattr(StaleReader, _name, lambda self, *a, _n=_name, **k: getattr(self.inner, _n)(*a, **k))
StaleReader.__abstractmethods__ = frozenset()


def test_a_stale_publish_is_rejected_and_nothing_is_double_applied(env: Env) -> None:
    env.episodes(50)
    env.pipeline.pump()
    env.pipeline.score_pending()
    stale = env.store.get_current_policy(AGENT)
    assert stale is not None
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock).status == "published"
    before = env.snapshot()

    late = train_agent(AGENT, StaleReader(env.store, stale), Reinforce(), clock=env.clock)
    assert late.status == "lost_race"
    # The version it reports is the one current now (the winner's), not the one it read.
    assert late.version == 2 and late.run is None
    assert late.reason == "another writer replaced v1 while this run trained from it; this run published nothing"
    assert env.snapshot() == before
    with pytest.raises(ConcurrencyConflict):
        env.store.replace_current_policy(PolicyDocument.from_dict(stale.doc), stale.etag)
    consumed_ranges_are_exact(env.store, 50)


def test_two_trainers_racing_apply_every_score_exactly_once(env: Env) -> None:
    total = 0
    statuses: list[str] = []
    lock = threading.Lock()
    for _ in range(8):
        env.episodes(25)
        total += 25
        env.pipeline.pump()
        env.pipeline.score_pending()
        barrier = threading.Barrier(2)

        def trainer(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            outcome = train_agent(AGENT, env.store, Reinforce(), clock=env.clock)
            with lock:
                statuses.append(outcome.status)

        threads = [threading.Thread(target=trainer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert statuses.count("published") == 8
    assert set(statuses) <= {"published", "lost_race", "no_new_scores"}
    consumed_ranges_are_exact(env.store, total)


class CrashOnce(Store):
    """Raises once, at the ``nth`` call of ``method``: after delegating (the write happened,
    then the process died) or before it."""

    def __init__(self, inner: Store, method: str, after: bool, nth: int = 1) -> None:
        self.inner, self.method, self.after, self.crashed, self.nth, self.calls = inner, method, after, False, nth, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _crashing(name: str):
    def call(self: CrashOnce, *args: Any, **kwargs: Any) -> Any:
        if name == self.method and not self.crashed:
            self.calls += 1
            if self.calls == self.nth:
                self.crashed = True
                if self.after:
                    getattr(self.inner, name)(*args, **kwargs)
                raise RuntimeError(f"crash in {name}")
        return getattr(self.inner, name)(*args, **kwargs)

    return call


for _name in Store.__abstractmethods__:
    setattr(CrashOnce, _name, _crashing(_name))
CrashOnce.__abstractmethods__ = frozenset()


@pytest.mark.parametrize(
    ("method", "after", "nth", "retry_status"),
    [
        ("replace_current_policy", False, 1, "published"),  # crash before the publish
        ("replace_current_policy", True, 1, "no_new_scores"),  # published, crashed before the version record
        ("get_policy_version", False, 1, "published"),  # crashed checking the last version's records
        ("create_policy_version", False, 1, "no_new_scores"),  # published, crashed writing the version record
        ("create_policy_version", True, 1, "no_new_scores"),  # version record written, crashed before the run's
        ("put_run", False, 1, "no_new_scores"),  # crashed writing the run record
    ],
)
def test_a_crash_during_training_is_repaired_without_double_counting(tmp_path: Path, clock: ManualClock,
                                                                   method: str, after: bool, nth: int,
                                                                   retry_status: str) -> None:
    crashed, clean = Env(tmp_path / "a.db", clock), Env(tmp_path / "b.db", ManualClock())
    for e in (crashed, clean):
        e.episodes(40)
        e.pipeline.pump()
        e.pipeline.score_pending()
    faulty = CrashOnce(crashed.store, method, after, nth)
    with pytest.raises(RuntimeError, match="crash"):
        train_agent(AGENT, faulty, Reinforce(), clock=clock)
    retry = train_agent(AGENT, crashed.store, Reinforce(), clock=clock)
    assert retry.status == retry_status
    assert train_agent(AGENT, clean.store, Reinforce(), clock=clock).status == "published"
    consumed_ranges_are_exact(crashed.store, 40)
    # Same data, deterministic math: the repaired run ends with the same logits as a clean one.
    got, want = load_current(crashed.store, AGENT), load_current(clean.store, AGENT)
    assert got is not None and want is not None
    assert got.version == want.version == 2
    assert got.logits == pytest.approx(want.logits)


class OutageWriting(CrashOnce):
    """The store fails transiently (an outage) at the first call of ``method``, before it writes."""

    def __init__(self, inner: Store, method: str) -> None:
        super().__init__(inner, method, after=False)


def _outage(name: str):
    crash = _crashing(name)

    def call(self: OutageWriting, *args: Any, **kwargs: Any) -> Any:
        try:
            return crash(self, *args, **kwargs)
        except RuntimeError as exc:
            raise TransientError(f"the store is unavailable ({exc})") from None

    return call


for _name in Store.__abstractmethods__:
    setattr(OutageWriting, _name, _outage(_name))


@pytest.mark.parametrize("method", ["create_policy_version", "put_run"])
def test_an_outage_writing_the_records_after_the_swap_still_reports_the_published_version(
    env: Env, method: str
) -> None:
    env.episodes(40)
    env.pipeline.pump()
    env.pipeline.score_pending()
    outcome = train_safely(AGENT, OutageWriting(env.store, method), Reinforce(), clock=env.clock)
    current = load_current(env.store, AGENT)
    assert current is not None and current.version == 2  # agents already draw from v2
    assert (outcome.status, outcome.version) == ("published", 2)
    assert outcome.run is not None and outcome.run.episodes == 40
    # The next run writes the records the outage left unwritten, and learns nothing twice.
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock).status == "no_new_scores"
    consumed_ranges_are_exact(env.store, 40)


def test_a_crash_between_scoring_and_settling_redelivers_without_rescoring(env: Env) -> None:
    env.episodes(5)
    env.pipeline.pump()
    messages = env.queue.receive(5)
    for m in messages:  # score, then "crash" before completing
        assert score_message(m.body, env.pipeline.scorer).status == "scored"
    scores = env.store.read_scores(AGENT, None, 100)
    env.clock.advance(31)  # locks expire; Service Bus would redeliver
    assert env.pipeline.score_pending() == {"duplicate": 5}
    assert env.store.read_scores(AGENT, None, 100) == scores
    assert env.queue.counts().active == 0


def test_pinned_policy_is_not_trained_and_keeps_its_cursor(env: Env) -> None:
    env.episodes(20)
    env.pipeline.pump()
    env.pipeline.score_pending()
    tagged = env.store.get_current_policy(AGENT)
    assert tagged is not None
    pinned = PolicyDocument.from_dict(tagged.doc).model_copy(update={"pinned": True})
    env.store.replace_current_policy(pinned, tagged.etag)
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock).status == "pinned"
    current = load_current(env.store, AGENT)
    assert current is not None and current.version == 1 and current.cursor is None


def test_min_batch_waits_for_enough_scores(env: Env) -> None:
    env.episodes(3)
    env.pipeline.pump()
    env.pipeline.score_pending()
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock, min_batch=10).status == "too_few_scores"
    env.episodes(7)
    env.pipeline.pump()
    env.pipeline.score_pending()
    outcome = train_agent(AGENT, env.store, Reinforce(), clock=env.clock, min_batch=10)
    assert outcome.status == "published" and outcome.run is not None and outcome.run.episodes == 10


def test_max_batch_splits_a_backlog_across_runs(env: Env) -> None:
    env.episodes(25)
    env.pipeline.pump()
    env.pipeline.score_pending()
    sizes = []
    while (o := train_agent(AGENT, env.store, Reinforce(), clock=env.clock, max_batch=10)).status == "published":
        assert o.run is not None
        sizes.append(o.run.episodes)
    assert sizes == [10, 10, 5]
    consumed_ranges_are_exact(env.store, 25)


# --------------------------------------------------------------------------- feedback corrections


def toggle_thumbs(env: Env, episodes: list[Episode], rounds: range) -> int:
    """Every episode gets thumbs up in even rounds and down in odd ones; returns the corrections."""
    statuses = [
        record_feedback(env.store, e.id, thumb="up" if r % 2 == 0 else "down", clock=env.clock).reconciled.status
        for r in rounds
        for e in episodes
    ]
    return statuses.count("corrected")


def undecided(env: Env, episodes: list[Episode]) -> list[Episode]:
    """The episodes whose judged reward both a thumb up and a thumb down change."""
    rewards = {e.id: env.store.get_score(e.id, AGENT)["reward"] for e in episodes}  # type: ignore[index]
    return [e for e in episodes if 0.01 < rewards[e.id] < 0.99]


def score_new(env: Env, n: int) -> list[Episode]:
    episodes = env.episodes(n)
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"scored": n}
    return episodes


def test_corrections_never_block_the_episodes_behind_them(env: Env) -> None:
    """A full page of feedback corrections is learned rather than waited on: 200 thumbs on
    learned episodes, read 50 at a time, do not keep the 3 new episodes behind them unlearned
    (before the fix: ``too_few_scores`` on every tick, for good)."""
    learned = undecided(env, score_new(env, 20))[:5]
    assert len(learned) == 5
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock).status == "published"
    assert toggle_thumbs(env, learned, range(40)) == 200  # each page of 50 holds 10 rounds
    score_new(env, 3)

    outcomes = [train_agent(AGENT, env.store, Reinforce(), clock=env.clock, max_batch=50) for _ in range(6)]
    assert [o.status for o in outcomes] == ["published"] * 5 + ["no_new_scores"]
    runs = [o.run for o in outcomes[:5]]
    assert [(r.episodes, r.corrections) for r in runs if r] == [(0, 50)] * 4 + [(3, 0)]
    # The first page ends on thumbs down for every episode: learned, the policy moves. The next
    # pages each toggle back to down: they net to zero, and the policy stays exactly where it was.
    logits = [env.store.get_policy_version(AGENT, v)["logits"] for v in range(2, 7)]  # type: ignore[index]
    assert logits[1] != logits[0]
    assert logits[1] == logits[2] == logits[3] == logits[4]
    assert [r.metrics["corrections"] for r in runs if r] == [5, 0, 0, 0, 0]  # corrected episodes in the update
    assert sum(r.episodes + r.corrections + r.rejected for r in runs if r) == 203  # every row once


def test_feedback_that_nets_to_zero_changes_nothing(tmp_path: Path) -> None:
    """The issue's measure: 50 episodes plus 2,000 thumb toggles that net to zero. The toggles
    must not grow the step or the trust region (before the fix: KL 0.39 without them, 2.93 with)."""
    runs = []
    for toggles in (False, True):
        env = Env(tmp_path / f"{toggles}.db", ManualClock())
        learned = undecided(env, score_new(env, 120))[:50]
        assert len(learned) == 50
        toggle_thumbs(env, learned, range(1))  # thumbs up on every episode, learned with it
        assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock).status == "published"
        if toggles:  # down, up, ... up: 2,000 corrections netting to zero
            assert toggle_thumbs(env, learned, range(1, 41)) == 2000
        score_new(env, 50)
        outcome = train_agent(AGENT, env.store, Reinforce(), clock=env.clock)
        assert outcome.status == "published" and outcome.run is not None
        runs.append((outcome.run, load_current(env.store, AGENT)))
    (plain, plain_doc), (toggled, toggled_doc) = runs
    assert (plain.episodes, plain.corrections, toggled.episodes, toggled.corrections) == (50, 0, 50, 2000)
    assert toggled.metrics["kl"] == pytest.approx(plain.metrics["kl"], abs=1e-9)
    assert toggled.metrics["step_scale"] == plain.metrics["step_scale"]
    assert toggled_doc.logits == plain_doc.logits and toggled_doc.learner_state == plain_doc.learner_state  # type: ignore[union-attr]


# --------------------------------------------------------------------------- bad input


def _raw_episode(env: Env, **changes: Any) -> dict[str, Any]:
    base = env.policy().decision_for("step-by-step")
    now = env.clock.now()
    doc = Episode(id=f"raw-{random.Random(str(changes)).getrandbits(40):x}", agent_id=AGENT, policy_version=1,
                  action_id=base.action_id, probability=base.probability, logprob=base.logprob,
                  input="What is 2 + 2?", output="2 + 2 makes 4, so the answer is 4.", started_at=now,
                  ended_at=now + timedelta(seconds=1), incarnation=base.incarnation).to_dict()
    for key, value in changes.items():
        if value is ...:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "reason", "field"),
    [
        ({"probability": math.nan}, "InvalidEpisode", "probability"),
        ({"probability": "0.25"}, "InvalidEpisode", "probability"),
        ({"action_id": "teleport"}, "UnknownAction", "action_id"),
        ({"policy_version": 99}, "UnknownPolicyVersion", "policy_version"),
        ({"input": ...}, "InvalidEpisode", "input"),
        ({"output": "x" * 20_001}, "InvalidEpisode", "output"),
        ({"steps": [{"name": "t", "status": "ok", "latency_ms": -1}]}, "InvalidEpisode", "steps[0].latency_ms"),
        ({"logprob": -0.1}, "InvalidEpisode", "logprob"),
        ({"schema_version": 7}, "InvalidEpisode", "schema_version"),
        ({"surprise": True}, "InvalidEpisode", "surprise"),
    ],
)
def test_invalid_episodes_are_dead_lettered_with_the_field_named_and_kept(env: Env, changes: dict[str, Any],
                                                                        reason: str, field: str) -> None:
    good = env.episodes(10)
    bad = _raw_episode(env, **changes)
    env.store.add_raw_episode(bad)
    report = env.pipeline.run_once()
    assert report.outcomes == {"scored": 10, "dead_letter": 1}
    (dead,) = env.queue.dead_letters()
    assert dead.message_id == bad["id"]
    assert dead.reason == reason
    assert field in dead.description
    assert json.dumps(env.store.get_episode(bad["id"])) == json.dumps(bad)  # kept for inspection, untouched
    assert env.store.get_score(bad["id"], AGENT) is None
    (trained,) = report.trained
    assert trained.run is not None and trained.run.episodes == len(good) and trained.run.rejected == 0


def test_a_malformed_queue_message_is_dead_lettered(env: Env) -> None:
    from agent_learning.queue.base import OutgoingMessage

    env.queue.send([OutgoingMessage("m1", "{not json"), OutgoingMessage("m2", json.dumps({"episode_id": 5}))])
    assert env.pipeline.score_pending() == {"dead_letter": 2}
    reasons = {d.message_id: (d.reason, d.description) for d in env.queue.dead_letters()}
    assert reasons["m1"][0] == "InvalidMessage" and "not valid JSON" in reasons["m1"][1]
    assert reasons["m2"][0] == "InvalidMessage" and "episode_id" in reasons["m2"][1]


def test_enqueue_reports_bad_documents_and_sends_the_rest(env: Env) -> None:
    docs = [{"id": "a", "agent_id": AGENT}, {"agent_id": AGENT}, "junk", {"id": "b"}]
    result = enqueue_episodes(docs, env.queue.send)  # type: ignore[arg-type]
    assert result.received == 4 and result.sent == 2
    assert [i for i, _ in result.failed] == [1, 2]
    assert "id" in result.failed[0][1]
    received = env.queue.receive(10)
    assert sorted(m.message_id for m in received) == ["a", "b"]
    assert received[0].properties.get("agent_id") == AGENT or received[1].properties.get("agent_id") == AGENT


def test_corrupt_scores_are_skipped_recorded_and_never_reach_the_policy(env: Env) -> None:
    env.episodes(20)
    env.pipeline.pump()
    env.pipeline.score_pending()
    env.store.put_raw_score({"id": "bogus", "agent_id": AGENT, "reward": float("nan")})
    outcome = train_agent(AGENT, env.store, Reinforce(), clock=env.clock)
    assert outcome.status == "published" and outcome.run is not None
    assert outcome.run.episodes == 20 and outcome.run.rejected == 1
    assert outcome.run.rejected_samples[0].id == "bogus"
    current = load_current(env.store, AGENT)
    assert current is not None and all(math.isfinite(x) for x in current.logits)
    assert current.cursor is not None and current.cursor.id == "bogus"  # moved past it: not re-read forever
    consumed_ranges_are_exact(env.store, 21)


def test_a_corrupt_current_policy_stops_training_without_damage(env: Env) -> None:
    env.episodes(10)
    env.pipeline.pump()
    env.pipeline.score_pending()
    env.store.put_raw_current_policy(AGENT, {"id": f"{AGENT}:current", "logits": ["NaN"]})
    outcome = train_agent(AGENT, env.store, Reinforce(), clock=env.clock)
    assert outcome.status == "invalid_policy" and "logits" in outcome.reason
    assert [v["version"] for v in env.store.list_policy_versions(AGENT)] == [1]


class FailingFor(SQLiteStore):
    """A SQLite store whose score reads fail for one agent (a partition that is down, a bug)."""

    def __init__(self, path: Path, agent_id: str, error: Exception) -> None:
        super().__init__(path)
        self.failing, self.error = agent_id, error

    def read_scores(self, agent_id: str, after: Any, limit: int, *, settled: bool = True) -> list[dict[str, Any]]:
        if agent_id == self.failing:
            raise self.error
        return super().read_scores(agent_id, after, limit, settled=settled)

    def has_new_scores(self, agent_id: str, after: Any) -> bool:
        if agent_id == self.failing:
            raise self.error
        return super().has_new_scores(agent_id, after)


@pytest.mark.parametrize(
    ("error", "status", "level"),
    [
        (TransientError("Cosmos DB answered 503: service unavailable"), "unavailable", logging.WARNING),
        (RuntimeError("a bug"), "failed", logging.ERROR),
    ],
)
def test_one_agent_failing_does_not_stop_the_others_in_either_runner(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture, error: Exception, status: str, level: int
) -> None:
    """The local runner isolates agents as the timer does (before the fix, `LocalPipeline.train`
    raised and trained nobody after the failing agent), and a store outage is ``unavailable``
    (before: every exception was labelled ``invalid_policy``, as if the document were corrupt)."""
    store = FailingFor(tmp_path / "f.db", "alpha", error)
    for agent_id in ("alpha", "beta"):
        create_policy(store, SoftmaxPolicy.from_actions(agent_id, ["x", "y"]).to_document(created_at=clock.now()))
    pipeline = LocalPipeline(store, SQLiteQueue(":memory:", clock=clock), OfflineJudge(), RewardFunction(),
                             Reinforce(), clock=clock)
    outcomes = pipeline.train()
    assert [(o.agent_id, o.status) for o in outcomes] == [("alpha", status), ("beta", "no_new_scores")]
    assert type(error).__name__ in outcomes[0].reason and str(error) in outcomes[0].reason
    assert [o.agent_id for o in pipeline.train(["beta"])] == ["beta"]

    settings = load_settings(store="memory", queue="sqlite")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agent_learning.app.handlers"):
        handlers.train(handlers.Runtime(settings, store, None, learner=Reinforce(), send_train=len))
    (record,) = [r for r in caplog.records if "train alpha" in r.getMessage()]
    assert record.levelno == level and status in record.getMessage() and str(error) in record.getMessage()


def test_max_batch_is_bounded_by_the_memory_budget(env: Env) -> None:
    """A run holds its whole batch in memory: more than MAX_TRAIN_BATCH rows is refused
    (before the fix any size was accepted; 190,000 rows held 1.1 GB)."""
    with pytest.raises(ValueError, match="max_batch"):
        train_agent(AGENT, env.store, Reinforce(), clock=env.clock, max_batch=MAX_TRAIN_BATCH + 1)
    assert train_agent(AGENT, env.store, Reinforce(), clock=env.clock, max_batch=MAX_TRAIN_BATCH).status == (
        "no_new_scores")


# --------------------------------------------------------------------------- judge failures


class FlakyJudge(Judge):
    """The offline judge behind an outage: the first ``failures`` calls raise ``error``."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.inner, self.failures, self.error, self.calls = OfflineJudge(), failures, error, 0

    def judge(self, episode: Episode) -> Judgement:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.inner.judge(episode)


def test_a_transient_judge_outage_retries_until_scored(tmp_path: Path, clock: ManualClock) -> None:
    env = Env(tmp_path / "t.db", clock, judge=FlakyJudge(3, TransientError("judge answered 503")))
    (episode,) = env.episodes(1)
    env.pipeline.pump()
    outcomes = env.pipeline.score_pending()
    assert outcomes == {"retry": 3, "scored": 1}
    assert Score.from_dict(env.store.get_score(episode.id, AGENT)).reward > 0
    assert env.queue.counts().dead_letter == 0


def test_a_judge_that_never_recovers_ends_in_the_dead_letter_queue(tmp_path: Path, clock: ManualClock) -> None:
    env = Env(tmp_path / "t.db", clock, judge=FlakyJudge(10**9, TransientError("judge answered 429")), max_deliveries=4)
    (episode,) = env.episodes(1)
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"retry": 4}
    (dead,) = env.queue.dead_letters()
    assert dead.message_id == episode.id and dead.reason == "MaxDeliveryCountExceeded"
    assert env.store.get_score(episode.id, AGENT) is None  # never a made-up zero reward


def test_a_permanent_judge_failure_is_dead_lettered_at_once(tmp_path: Path, clock: ManualClock) -> None:
    env = Env(tmp_path / "t.db", clock, judge=FlakyJudge(1, PermanentError("judge output invalid: score 7 > 5")))
    env.episodes(1)
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"dead_letter": 1}
    (dead,) = env.queue.dead_letters()
    assert dead.reason == "JudgeFailed" and "score 7" in dead.description


class BrokenOn(Judge):
    """The offline judge, with a bug that raises on one episode."""

    def __init__(self) -> None:
        self.inner, self.episode_id = OfflineJudge(), ""

    def judge(self, episode: Episode) -> Judgement:
        if episode.id == self.episode_id:
            raise RuntimeError("a bug in the judge")
        return self.inner.judge(episode)


def test_a_message_whose_scoring_raises_does_not_stop_the_others(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """As in the Functions host: the failed message comes back when its lock expires (30 s here),
    and the queue dead-letters it after its max deliveries; the other episodes are scored at once."""
    judge = BrokenOn()
    env = Env(tmp_path / "t.db", clock, judge=judge, max_deliveries=3)
    first, *others = env.episodes(3)
    judge.episode_id = first.id
    env.pipeline.pump()
    with caplog.at_level(logging.WARNING, logger="agent_learning.app.embedded"):
        assert env.pipeline.score_pending() == {"failed": 1, "scored": 2}
    assert f"{first.id} failed (RuntimeError: a bug in the judge)" in caplog.text
    assert all(env.store.get_score(e.id, AGENT) is not None for e in others)
    for _ in range(2):
        assert env.pipeline.score_pending() == {}  # locked until the lock expires
        clock.advance(31)
        assert env.pipeline.score_pending() == {"failed": 1}
    clock.advance(31)
    assert env.pipeline.score_pending() == {}
    (dead,) = env.queue.dead_letters()
    assert dead.message_id == first.id and dead.reason == "MaxDeliveryCountExceeded"
    assert env.store.get_score(first.id, AGENT) is None


class SlowOnce(Judge):
    """The offline judge, slower than the queue's lock (30 s) the first time it judges each of
    ``slow``, and failing for good on ``failing``."""

    def __init__(self, clock: ManualClock) -> None:
        self.inner, self.clock = OfflineJudge(), clock
        self.slow: set[str] = set()
        self.failing: set[str] = set()

    def judge(self, episode: Episode) -> Judgement:
        if episode.id in self.slow:
            self.slow.discard(episode.id)
            self.clock.advance(31)
        if episode.id in self.failing:
            raise PermanentError("judge output invalid")
        return self.inner.judge(episode)


def test_a_message_whose_lock_expires_is_counted_once_and_not_as_dead_lettered(
    tmp_path: Path, clock: ManualClock, captured: Any
) -> None:
    """A delivery whose lock expired before it was settled is ``lock_lost`` only: the outcomes add
    up to the deliveries handled, and a dead letter is counted (report and metric) only when made."""
    judge = SlowOnce(clock)
    env = Env(tmp_path / "t.db", clock, judge=judge, max_deliveries=3)
    poison, slow, fast = env.episodes(3)
    judge.slow, judge.failing = {poison.id, slow.id}, {poison.id}
    env.pipeline.pump()
    # poison: lock lost, then dead-lettered; slow: lock lost (its score stored), then a duplicate
    outcomes = env.pipeline.score_pending(receive_batch=1)
    assert outcomes == {"lock_lost": 2, "dead_letter": 1, "duplicate": 1, "scored": 1}
    assert [d.message_id for d in env.queue.dead_letters()] == [poison.id]
    assert captured.total("agent_learning.episodes.dead_lettered", reason="JudgeFailed") == 1
    assert env.store.get_score(fast.id, AGENT) is not None and env.store.get_score(slow.id, AGENT) is not None


def test_a_lost_lock_on_the_last_delivery_is_counted_as_the_queue_dead_letters_it(
    tmp_path: Path, clock: ManualClock, captured: Any
) -> None:
    judge = SlowOnce(clock)
    env = Env(tmp_path / "t.db", clock, judge=judge, max_deliveries=1)
    (poison,) = env.episodes(1)
    judge.slow, judge.failing = {poison.id}, {poison.id}
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"lock_lost": 1}
    assert [d.reason for d in env.queue.dead_letters()] == ["MaxDeliveryCountExceeded"]
    assert captured.total("agent_learning.episodes.dead_lettered") == 1


def test_scorer_caches_immutable_policy_versions(env: Env) -> None:
    scorer = Scorer(env.store, OfflineJudge(), RewardFunction(), env.clock)
    first = scorer.policy_version(AGENT, 1)
    assert first is not None and scorer.policy_version(AGENT, 1) is first
    assert scorer.policy_version(AGENT, 42) is None


def test_an_agent_re_created_under_its_id_is_scored_against_its_new_actions(env: Env) -> None:
    env.episodes(3)
    assert env.pipeline.run_once().outcomes == {"scored": 3}  # the scorer now remembers v1
    env.store.delete_agent(AGENT)
    actions = [Action(id="short"), Action(id="long")]
    create_policy(env.store, SoftmaxPolicy.from_actions(AGENT, actions).to_document(created_at=env.clock.now()))
    decision, now = env.policy().decision_for("short"), env.clock.now()
    env.store.add_episode(Episode(id="ep-short", agent_id=AGENT, policy_version=1, action_id="short",
                                  probability=decision.probability, logprob=decision.logprob, input="What is 2 + 2?",
                                  output="4", started_at=now, ended_at=now + timedelta(seconds=1),
                                  incarnation=decision.incarnation))
    report = env.pipeline.run_once()  # the same long-lived scorer, as in a warm Functions worker
    assert report.outcomes == {"scored": 1}, env.queue.dead_letters()
    assert env.queue.counts().dead_letter == 0


class CountingStore(StaleReader):
    """Counts the episode reads that reach the store."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.episode_reads = inner, 0

    def get_episode(self, episode_id: str) -> dict[str, Any] | None:
        self.episode_reads += 1
        return self.inner.get_episode(episode_id)

    def get_current_policy(self, agent_id: str) -> Tagged | None:
        return self.inner.get_current_policy(agent_id)


def test_small_episodes_travel_in_the_message_and_large_ones_are_read(env: Env) -> None:
    small = env.episodes(3)
    large = _raw_episode(env, output="The answer is 4. " + "x" * 19_000)
    large["input"] = "What is 2 + 2? " + "y" * 19_000
    large["instructions"] = "z" * 19_000
    large["steps"] = [{"name": "search", "status": "ok", "latency_ms": 5.0, "result": "r" * 4_000} for _ in range(3)]
    env.store.add_raw_episode(large)
    env.pipeline.pump()
    bodies = {m.message_id: json.loads(m.body) for m in env.queue.receive(10)}
    assert all("episode" in bodies[e.id] for e in small)
    assert "episode" not in bodies[large["id"]]
    env.clock.advance(31)

    counting = CountingStore(env.store)
    scorer = Scorer(counting, OfflineJudge(), RewardFunction(), env.clock)
    outcomes = [score_message(m.body, scorer, delivery_count=m.delivery_count) for m in env.queue.receive(10)]
    assert [o.status for o in outcomes] == ["scored"] * 4
    assert counting.episode_reads == 1  # only the large one


def test_a_redelivered_message_is_not_judged_again(tmp_path: Path, clock: ManualClock) -> None:
    judge = FlakyJudge(0, TransientError("unused"))
    env = Env(tmp_path / "r.db", clock, judge=judge)
    (episode,) = env.episodes(1)
    body = json.dumps({"type": "score_request", "episode_id": episode.id})
    assert score_message(body, env.pipeline.scorer, delivery_count=1).status == "scored"
    assert score_message(body, env.pipeline.scorer, delivery_count=2).status == "duplicate"
    assert judge.calls == 1
    # A second message for the episode, delivered for the first time (after the duplicate-detection
    # window, a dead-letter replay or a change-feed rewind), is not judged either.
    assert score_message(body, env.pipeline.scorer, delivery_count=1).status == "duplicate"
    assert judge.calls == 1


class TwoSecondJudge(Judge):
    """The offline judge at a judge model's pace: 2 s an episode on the pipeline's clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.inner, self.clock = OfflineJudge(), clock

    def judge(self, episode: Episode) -> Judgement:
        self.clock.advance(2)
        return self.inner.judge(episode)


def test_a_slow_judge_is_given_no_more_messages_at_once_than_it_scores_within_their_lock(
    tmp_path: Path, clock: ManualClock
) -> None:
    """At 2 s an episode, 100 messages received under one 30 s lock lost the lock of all but the
    first 15, which came back as duplicates: now a batch is sized to half the lock at the pace seen."""
    env = Env(tmp_path / "t.db", clock, judge=TwoSecondJudge(clock))
    env.episodes(40)
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"scored": 40}
    assert env.queue.dead_letters() == [] and env.pipeline.score_pending() == {}


def test_a_batch_grows_no_faster_than_it_doubles_after_messages_that_took_no_judge_call(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A message that comes back scored (the run before was stopped) is a duplicate, settled in no
    time: at the head of the queue its pace let the next receive take a full batch of 100, which a
    2 s judge held past their 30 s lock."""
    env = Env(tmp_path / "t.db", clock, judge=TwoSecondJudge(clock))
    first, *_ = env.episodes(40)
    body = json.dumps({"type": "score_request", "episode_id": first.id})
    assert score_message(body, env.pipeline.scorer).status == "scored"  # before the queue delivers it
    env.pipeline.pump()
    assert env.pipeline.score_pending() == {"duplicate": 1, "scored": 39}
