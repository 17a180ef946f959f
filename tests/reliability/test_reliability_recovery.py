"""Reliability: the recovery tools (``agent_learning.ops.recovery``) never make an episode count twice.

* Replaying dead letters after the cause is fixed scores what could not be scored, leaves the
  rest (and what still fails) in the dead-letter queue with its reason, and an episode that got
  a score meanwhile keeps it.
* Re-scoring a range of episodes (new reward weights, a new judge) overwrites their scores in
  place: those a published version already learned from are not learned from again, the others
  are learned from once, with the new reward.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable

import pytest

pytest.importorskip("azure.functions")
from faults import AGENT, Agent, FaultyJudge, OutageJudge, account, dead_lettered, start_policy
from reliability_report import Backend, record

from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Episode, ScoreCursor
from agent_learning.judges.base import Judge, Judgement
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.recovery import replay_dead_letters, rescore
from agent_learning.pipeline import Scorer, load_current, score_episode, train_agent
from agent_learning.queue.base import MAX_DELIVERY_COUNT_EXCEEDED
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardConfig, RewardFunction

NEW_WEIGHTS = RewardFunction(RewardConfig(w_intent=1.0, w_adherence=0.0, w_completion=0.0, latency_penalty=0.0))


class Setup:
    """An agent and the embedded runner over the backend's store, with a judge that can fail."""

    def __init__(self, backend: Backend, max_deliveries: int = 10) -> None:
        self.clock = ManualClock()
        self.store = backend.store
        start_policy(self.store, self.clock)
        self.queue = SQLiteQueue(backend.path / "queue.db", clock=self.clock, max_deliveries=max_deliveries)
        self.judge = OutageJudge()
        self.pipeline = LocalPipeline(self.store, self.queue, self.judge, RewardFunction(), Reinforce(),
                                      clock=self.clock)
        self.agent = Agent(self.store, self.clock)

    def scored_round(self, n: int) -> None:
        self.agent.run(n)
        self.pipeline.pump()
        assert self.pipeline.score_pending() == {"scored": n}

    def rescorer(self, reward: RewardFunction = NEW_WEIGHTS) -> tuple[Scorer, FaultyJudge]:
        judge = FaultyJudge(OutageJudge())
        return Scorer(self.store, judge, reward, self.clock), judge

    def scores(self) -> dict[str, dict]:
        return {s["id"]: s for s in self.store.read_scores(AGENT, None, 10_000)}


def test_replaying_dead_letters_after_the_fix_scores_each_episode_once(backend: Backend) -> None:
    s = Setup(backend, max_deliveries=2)
    s.agent.run(10)
    poison = s.agent.answer("4", "poison")
    backend.put_raw("episodes", {**poison.to_dict(), "id": "poison-action", "action_id": "teleport"})
    s.pipeline.pump()
    s.judge.mode = "unavailable"
    s.pipeline.score_pending()
    letters = {d.message_id: d.reason for d in s.queue.dead_letters()}
    assert letters == {**dict.fromkeys([*s.agent.written], MAX_DELIVERY_COUNT_EXCEEDED),
                       "poison-action": "UnknownAction"}

    s.judge.mode = "up"  # the cause is fixed
    # A copy of one message got through meanwhile: that episode has its score already.
    early = s.agent.written[0]
    assert score_episode(early, s.pipeline.scorer).status == "scored"
    before = s.store.get_score(early, AGENT)
    planned = replay_dead_letters(s.queue, reasons=[MAX_DELIVERY_COUNT_EXCEEDED], dry_run=True)
    assert sorted(planned.replayed) == sorted(s.agent.written) and planned.left == {"UnknownAction": 1}
    assert s.queue.counts().dead_letter == len(s.agent.written) + 1  # a dry run moves nothing
    replayed = replay_dead_letters(s.queue, reasons=[MAX_DELIVERY_COUNT_EXCEEDED])
    assert replayed.replayed == planned.replayed
    outcomes = s.pipeline.score_pending()
    s.pipeline.train()

    books = account(s.store, s.agent.written, dead_lettered(s.queue))
    record("recovery: replay", backend.kind, faults=len(replayed.replayed), episodes=len(s.agent.written) + 1,
           lost=books.lost, double=len(books.double), kept=len(books.kept))
    assert outcomes == {"scored": len(s.agent.written) - 1, "duplicate": 1}
    assert s.store.get_score(early, AGENT) == before  # the score it had stays
    assert books.lost == 0 and books.double == set() and books.kept == {"poison-action"}
    assert {d.message_id: d.reason for d in s.queue.dead_letters()} == {"poison-action": "UnknownAction"}

    # Replaying what still fails puts it back in the dead-letter queue, with its reason.
    assert replay_dead_letters(s.queue).replayed == ["poison-action"]
    assert s.pipeline.score_pending() == {"dead_letter": 1}
    (letter,) = s.queue.dead_letters()
    assert letter.reason == "UnknownAction" and "teleport" in letter.description


def test_rescoring_trained_episodes_does_not_relearn_them_and_untrained_ones_learn_the_new_reward(
    backend: Backend,
) -> None:
    s = Setup(backend)
    s.scored_round(20)
    assert [o.status for o in s.pipeline.train()] == ["published"]
    trained = s.scores()
    s.scored_round(10)  # scored, not trained yet
    pending = {k: v for k, v in s.scores().items() if k not in trained}
    runs_before = s.store.list_runs(AGENT)
    scorer, judge = s.rescorer()

    result = rescore(s.store, scorer, AGENT)  # the whole range, stored metrics, new weights

    assert sorted(result.already_trained) == sorted(trained) and sorted(result.pending) == sorted(pending)
    assert result.failed == [] and judge.calls == 0  # re-shaping needs no judge call
    after = s.scores()
    for episode_id, old in {**trained, **pending}.items():
        new = after[episode_id]
        assert new["seq"] == old["seq"] and new["metrics"] == old["metrics"]
        assert new["reward_function"]["version"] == NEW_WEIGHTS.version != old["reward_function"]["version"]
        components = new["reward_function"]["components"]
        parts = {k: v for k, v in components.items() if k != "judged"}  # weighted metrics, (negative) penalties
        assert parts["weighted"] == pytest.approx(new["metrics"]["intent_resolution"]["normalised"])
        assert new["reward"] == components["judged"] == pytest.approx(max(-1.0, min(1.0, sum(parts.values()))))
    (outcome,) = s.pipeline.train()
    assert outcome.status == "published" and outcome.run is not None
    assert outcome.run.episodes == len(pending)  # the trained ones are not fed again
    assert outcome.run.metrics["mean_reward"] == pytest.approx(statistics.fmean(after[i]["reward"] for i in pending))
    assert s.store.list_runs(AGENT)[1:] == runs_before  # earlier runs untouched

    books = account(s.store, s.agent.written)
    record("recovery: rescore", backend.kind, faults=result.rescored, episodes=len(s.agent.written),
           lost=books.lost, double=len(books.double))
    assert books.lost == 0 and books.double == set()


def test_rescoring_part_of_the_range_with_the_judge_and_a_failing_judge(backend: Backend) -> None:
    s = Setup(backend)
    s.scored_round(12)
    rows = s.store.read_scores(AGENT, None, 100)
    after, until = ScoreCursor(seq=rows[2]["seq"], id=rows[2]["id"]), ScoreCursor(seq=rows[7]["seq"], id=rows[7]["id"])
    scorer, judge = s.rescorer(RewardFunction())
    result = rescore(s.store, scorer, AGENT, after=after, until=until, rejudge=True)
    assert result.pending == [r["id"] for r in rows[3:8]] and judge.calls == 5

    judge.inner.mode = "unavailable"  # type: ignore[attr-defined]
    before = s.scores()
    failed = rescore(s.store, scorer, AGENT, episode_ids=[rows[0]["id"], "no-such-episode"], rejudge=True)
    assert [(i, reason) for i, reason, _ in failed.failed] == [(rows[0]["id"], "JudgeUnavailable"),
                                                               ("no-such-episode", "NotScored")]
    assert s.scores() == before  # a failed re-score keeps the old score
    s.pipeline.train()
    books = account(s.store, s.agent.written)
    assert books.lost == 0 and books.double == set()


def test_rescoring_while_a_trainer_runs_counts_each_episode_once(backend: Backend) -> None:
    s = Setup(backend)
    statuses: list[str] = []
    for _ in range(5):
        s.scored_round(10)
        scorer, _ = s.rescorer()
        start = threading.Barrier(2)

        def train(barrier: threading.Barrier = start) -> None:
            barrier.wait()
            statuses.append(train_agent(AGENT, s.store, Reinforce(), clock=s.clock).status)

        def rescore_all(barrier: threading.Barrier = start, scorer: Scorer = scorer) -> None:
            barrier.wait()
            rescore(s.store, scorer, AGENT)

        threads = [threading.Thread(target=train), threading.Thread(target=rescore_all)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s.pipeline.train()
    books = account(s.store, s.agent.written)
    record("recovery: rescore", backend.kind, faults=5, episodes=len(s.agent.written), lost=books.lost,
           double=len(books.double))
    assert statuses == ["published"] * 5
    assert books.lost == 0 and books.double == set()
    current = load_current(s.store, AGENT)
    assert current is not None and current.version == 6


class TrainsDuringFirstCall(Judge):
    """A judge during whose first call a training run publishes (the timer, while a re-score runs)."""

    def __init__(self, inner: Judge, train: Callable[[], object]) -> None:
        self.inner, self.train = inner, train

    def judge(self, episode: Episode) -> Judgement:
        train, self.train = self.train, None
        if train is not None:
            train()
        return self.inner.judge(episode)


def test_a_re_score_says_which_episodes_a_trainer_learned_while_it_ran(backend: Backend) -> None:
    s = Setup(backend)
    s.scored_round(6)  # scored, not trained yet
    ids = [sid for sid, _ in sorted(s.scores().items(), key=lambda kv: (kv[1]["seq"], kv[0]))]
    published: list[str] = []
    judge = TrainsDuringFirstCall(OutageJudge(), lambda: published.append(
        train_agent(AGENT, s.store, Reinforce(), clock=s.clock).status))
    result = rescore(s.store, Scorer(s.store, judge, NEW_WEIGHTS, s.clock), AGENT, rejudge=True)
    assert published == ["published"]  # it learned all six with their old rewards
    # The first was being judged when the trainer read it; the other five were read by then
    # (the re-score had looked at the cursor only before it started).
    assert result.pending == ids[:1] and result.already_trained == ids[1:]
    for episode_id in ids[1:]:  # feedback keeps being applied to the reward that was learned
        ledger = s.store.get_correction_ledger(episode_id, AGENT)
        assert ledger is not None and ledger.doc["learned_base"] is not None
    books = account(s.store, s.agent.written)
    assert books.lost == 0 and books.double == set()
