"""``AGENT_LEARNING_JUDGING`` in the pipeline, on every store (Cosmos DB over the wire included):
episodes a rule leaves out are recorded unjudged, never lost and never learned; their messages
complete; a redelivery keeps the first answer; they are judged later, once, and learned once;
the audit counts them; feedback on them waits for their score."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from factories import CountingStore, make_episode, make_policy_doc, make_unjudged

from agent_learning.app.deliveries import QueueSettles, settle_score
from agent_learning.core.clock import ManualClock
from agent_learning.documents import Episode
from agent_learning.judges.base import Judgement
from agent_learning.judges.offline import OfflineJudge
from agent_learning.judges.sampling import Judging, JudgingRules, id_fraction
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.audit import audit_agent
from agent_learning.ops.recovery import judge_unjudged, rescore
from agent_learning.pipeline import Scorer, create_policy, score_episode, score_message, train_agent
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.rewards.feedback import record_feedback, score_rows
from agent_learning.store import MemoryStore, Store

AGENT = "agent-a"
ACTIONS = ["direct", "step-by-step", "calculator"]


class CountingJudge(OfflineJudge):
    """The offline judge, counting the episodes it judged."""

    def __init__(self) -> None:
        super().__init__()
        self.judged: Counter[str] = Counter()

    def judge(self, episode: Episode) -> Judgement:
        self.judged[episode.id] += 1
        return super().judge(episode)


@pytest.fixture
def store(store: Store) -> Store:
    """Every store adapter in turn (tests/support/adapters.py), holding the agent's policy."""
    create_policy(store, make_policy_doc(AGENT))
    return store


def scorer_for(store: Store, clock: ManualClock, rule: str) -> Scorer:
    return Scorer(store, CountingJudge(), RewardFunction(), clock, Judging(JudgingRules.parse(rule)))


def judged_by(scorer: Scorer) -> Counter[str]:
    assert isinstance(scorer.judge, CountingJudge)
    return scorer.judge.judged


def add_episodes(store: Store, n: int, prefix: str = "ep") -> list[str]:
    ids = [f"{prefix}-{i:03d}" for i in range(n)]
    for i, episode_id in enumerate(ids):
        store.add_episode(make_episode(episode_id, action_id=ACTIONS[i % 3], probability=1 / 3))
    return ids


def message(episode_id: str) -> str:
    return json.dumps({"type": "score_request", "episode_id": episode_id})


def learned_ids(store: Store) -> list[str]:
    return [row["episode_id"] for row in store.read_scores(AGENT, None, 100_000)]


def test_a_fraction_records_the_rest_unjudged_and_they_are_judged_and_learned_once_later(
    store: Store, clock: ManualClock
) -> None:
    scorer = scorer_for(store, clock, "agent-a=0.5, *=all")
    ids = add_episodes(store, 30)
    chosen = {i for i in ids if id_fraction(i) < 0.5}
    assert 5 < len(chosen) < 25  # both kinds are there

    outcomes = {i: score_message(message(i), scorer) for i in ids}
    assert {i for i, o in outcomes.items() if o.status == "scored"} == chosen
    left_out = sorted(set(ids) - chosen)
    assert all(outcomes[i].status == "unjudged" and outcomes[i].reason == "SampledOut" for i in left_out)
    assert set(judged_by(scorer)) == chosen  # the judge never saw the others
    records = store.list_unjudged(AGENT)
    assert [r["id"] for r in records] == left_out
    first = records[0]
    assert (first["reason"], first["rule"], first["agent_id"]) == ("sampled_out", "agent-a=0.5", AGENT)
    assert (first["action_id"], first["policy_version"]) == (ACTIONS[ids.index(first["id"]) % 3], 1)
    assert sorted(learned_ids(store)) == sorted(chosen)  # the trainer's read never sees a record

    books = audit_agent(store, AGENT)
    assert (books.unjudged, books.unjudged_by_reason, books.pending_scoring) == (
        len(left_out),
        {"sampled_out": len(left_out)},
        0,
    )
    assert books.lost == 0 and books.ok
    assert (
        books.episodes
        == books.learned + books.learned_twice + books.lost + books.pending + books.dead_lettered + books.unjudged
    )

    # Every message again (a redelivery, a replay): the same answers, no judging, nothing rewritten.
    again = {i: score_message(message(i), scorer) for i in ids}
    assert {i for i, o in again.items() if o.reason == "AlreadyRecordedUnjudged"} == set(left_out)
    assert {i for i, o in again.items() if o.status == "duplicate"} == set(ids)
    assert sum(judged_by(scorer).values()) == len(chosen)
    assert store.list_unjudged(AGENT) == records

    trained = train_agent(AGENT, store, Reinforce(), clock=clock)
    assert trained.status == "published" and trained.run is not None and trained.run.episodes == len(chosen)

    # Judge part of the backlog (in episode-id order), then the rest: each is learned once.
    part = judge_unjudged(store, scorer, AGENT, limit=4)
    assert part.judged == left_out[:4] and part.more and not part.failed
    assert [r["id"] for r in store.list_unjudged(AGENT)] == left_out[4:]
    assert audit_agent(store, AGENT).pending_training == 4
    clock.advance(1)
    second = train_agent(AGENT, store, Reinforce(), clock=clock)
    assert second.run is not None and second.run.episodes == 4  # new seqs: after the cursor
    rest = judge_unjudged(store, scorer, AGENT)
    assert rest.judged == left_out[4:] and not rest.more
    assert judge_unjudged(store, scorer, AGENT).judged == []  # idempotent
    assert all(judged_by(scorer)[i] == 1 for i in ids)
    assert sorted(learned_ids(store)) == sorted(ids)  # every episode once
    clock.advance(1)
    train_agent(AGENT, store, Reinforce(), clock=clock)
    books = audit_agent(store, AGENT)
    assert (books.learned, books.unjudged, books.lost, books.learned_twice) == (30, 0, 0, 0) and books.ok


def test_a_rate_judges_n_a_minute_and_a_redelivery_keeps_the_first_answer(clock: ManualClock) -> None:
    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    scorer = scorer_for(store, clock, "agent-a=3/min")
    ids = add_episodes(store, 8)
    outcomes = []
    for i in ids:
        outcomes.append(score_message(message(i), scorer).status)
        clock.advance(5)
    assert outcomes == ["scored"] * 3 + ["unjudged"] * 5  # 40 s: three places
    over = store.get_unjudged(ids[3], AGENT)
    assert over is not None and over["reason"] == "over_rate" and over["rule"] == "agent-a=3/min"

    clock.advance(60)  # the places are free again; a copy of an over-rate message arrives
    copy = score_message(message(ids[3]), scorer)
    assert (copy.status, copy.reason) == ("duplicate", "AlreadyRecordedUnjudged")
    assert ids[3] not in judged_by(scorer) and store.get_unjudged(ids[3], AGENT) == over
    fresh = add_episodes(store, 3, prefix="new")
    assert [score_message(message(i), scorer).status for i in fresh] == ["scored"] * 3  # the place was given back
    assert score_message(message(ids[0]), scorer).status == "duplicate"  # judged: a duplicate as ever


def test_a_judgement_that_fails_transiently_gives_its_rate_place_back(clock: ManualClock) -> None:
    from agent_learning.core.errors import TransientError

    class Throttled(CountingJudge):
        failures = 4

        def judge(self, episode: Episode) -> Judgement:
            if self.failures:
                self.failures -= 1
                raise TransientError("429 Too Many Requests")
            return super().judge(episode)

    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    scorer = Scorer(store, Throttled(), RewardFunction(), clock, Judging(JudgingRules.parse("agent-a=3/min")))
    first, *others = add_episodes(store, 3)
    statuses = [score_message(message(first), scorer).status for _ in range(5)]  # four 429s, then judged
    assert statuses == ["retry"] * 4 + ["scored"]
    # One episode judged this minute, whatever its deliveries: two places are left, not none.
    assert [score_message(message(i), scorer).status for i in others] == ["scored", "scored"]
    assert store.list_unjudged(AGENT) == []


def test_left_out_messages_complete_and_are_counted(clock: ManualClock, captured: object) -> None:
    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    scorer = scorer_for(store, clock, "*=0")
    queue = SQLiteQueue(":memory:", clock=clock, max_deliveries=2)
    ids = add_episodes(store, 4)
    queue.send([OutgoingMessage(i, message(i)) for i in ids])
    for m in queue.receive(10):
        settle_score(score_message(m.body, scorer, delivery_count=m.delivery_count), QueueSettles(queue, m),
                     m.delivery_count, None)
    clock.advance(3600)
    counts = queue.counts()
    assert (counts.active, counts.dead_letter) == (0, 0) and queue.receive(10) == []  # completed, not retried
    redelivered = [score_message(message(i), scorer) for i in ids]  # a copy of each: recorded once, counted once
    assert {(o.status, o.reason) for o in redelivered} == {("duplicate", "AlreadyRecordedUnjudged")}
    assert captured.total("agent_learning.episodes.unjudged", agent_id=AGENT, reason="sampled_out") == 4  # type: ignore[attr-defined]
    assert captured.total("agent_learning.episodes.scored") == 0  # type: ignore[attr-defined]
    assert "unjudged" in [s.attributes.get("outcome") for s in captured.spans.get_finished_spans()]  # type: ignore[attr-defined]


def test_an_invalid_episode_is_dead_lettered_whatever_the_rule(clock: ManualClock) -> None:
    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    store.add_episode(make_episode("ep-bad", action_id="teleport"))
    outcome = score_message(message("ep-bad"), scorer_for(store, clock, "*=0"))
    assert (outcome.status, outcome.reason) == ("dead_letter", "UnknownAction")
    assert store.list_unjudged(AGENT) == []


def test_what_each_rule_costs_in_store_requests(clock: ManualClock) -> None:
    """Per episode, against judging every one: a sampled-out episode writes its record instead of
    a score; a rate-admitted one reads its slot once more; nothing costs more than one request extra."""

    def requests(rule: str, n: int = 6) -> list[Counter[str]]:
        store = CountingStore(MemoryStore())
        create_policy(store, make_policy_doc(AGENT))
        scorer = scorer_for(store, clock, rule)  # type: ignore[arg-type]
        ids = add_episodes(store, n)
        per_episode = []
        for i in ids:
            before = Counter(store.calls)
            score_message(message(i), scorer)
            per_episode.append(store.calls - before)
        return per_episode[1:]  # the first also loads the policy version (cached after)

    everything = requests("*=all")
    baseline = sum(everything[0].values())
    assert everything[0] == Counter({"get_score": 1, "get_episode": 1, "add_score": 1})
    for calls in requests("*=0"):
        assert calls == Counter({"get_score": 1, "get_episode": 1, "mark_unjudged": 1})
    rated = requests("*=2/min")
    assert rated[0] == everything[0] + Counter({"get_unjudged": 1})  # admitted: the first answer is looked up
    assert rated[-1] == Counter({"get_score": 1, "get_episode": 1, "mark_unjudged": 1})  # over the rate
    assert all(sum(c.values()) <= baseline + 1 for c in rated)


def test_feedback_on_an_unjudged_episode_waits_and_is_applied_when_it_is_judged(
    store: Store, clock: ManualClock
) -> None:
    scorer = scorer_for(store, clock, "*=0")
    (episode_id,) = add_episodes(store, 1)
    assert score_message(message(episode_id), scorer).status == "unjudged"
    result = record_feedback(store, episode_id, thumb="up", clock=clock)
    assert result.reconciled.status == "waiting"  # stored; it does not make the episode judged
    assert store.get_score(episode_id, AGENT) is None and episode_id not in judged_by(scorer)
    record = store.get_unjudged(episode_id, AGENT)
    assert record is not None and record["feedback_pending"] is True

    done = judge_unjudged(store, scorer, AGENT)
    assert done.judged == [episode_id]
    rows = score_rows(store, episode_id, AGENT)
    assert rows[0]["feedback_pending"] is True and len(rows) == 2  # the score, then the feedback's correction
    judged = rows[0]["reward"]
    learned = judged + rows[1]["reward_delta"]
    assert learned == pytest.approx(0.5 * judged + 0.5 * 1.0)  # the rule with the stored weight 0.5
    assert audit_agent(store, AGENT).feedback_unapplied == 0


def test_feedback_before_the_decision_keeps_waiting_through_the_record(store: Store, clock: ManualClock) -> None:
    scorer = scorer_for(store, clock, "*=0")
    (episode_id,) = add_episodes(store, 1)
    assert record_feedback(store, episode_id, thumb="down", clock=clock).reconciled.status == "waiting"
    assert score_message(message(episode_id), scorer).status == "unjudged"  # replaces the marker
    record = store.get_unjudged(episode_id, AGENT)
    assert record is not None and record["feedback_pending"] is True
    judge_unjudged(store, scorer, AGENT)
    rows = score_rows(store, episode_id, AGENT)
    assert len(rows) == 2 and rows[1]["reward"] == pytest.approx(0.5 * rows[0]["reward"])


def test_rescoring_by_id_names_an_unjudged_episode_and_judging_stops_when_the_judge_is_down(
    clock: ManualClock,
) -> None:
    from agent_learning.core.errors import TransientError

    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    scorer = scorer_for(store, clock, "*=0")
    ids = add_episodes(store, 3)
    for i in ids:
        score_message(message(i), scorer)
    result = rescore(store, scorer, AGENT, episode_ids=[ids[0]])
    (failure,) = result.failed
    assert failure[1] == "NotScored" and "rescore --unjudged" in failure[2]

    class Down(OfflineJudge):
        def judge(self, episode: Episode) -> Judgement:
            raise TransientError("429 Too Many Requests")

    stopped = judge_unjudged(store, Scorer(store, Down(), RewardFunction(), clock), AGENT)
    assert stopped.judged == [] and len(stopped.failed) == 1 and stopped.more
    assert stopped.stopped is not None and "429" in stopped.stopped
    assert len(store.list_unjudged(AGENT)) == 3  # every record stays
    with pytest.raises(ValueError, match="limit"):
        judge_unjudged(store, scorer, AGENT, limit=0)


def test_judging_later_ignores_the_rule_and_force_rescoring_is_not_sampled(clock: ManualClock) -> None:
    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT))
    scorer = scorer_for(store, clock, "*=0")
    (episode_id,) = add_episodes(store, 1)
    assert score_episode(episode_id, scorer, sample=False).status == "scored"
    assert score_episode(episode_id, scorer, force=True).status == "scored"  # a re-score judges, whatever the rule
    assert store.list_unjudged(AGENT) == []


def test_a_duplicate_message_without_the_episode_costs_one_read(store: Store, clock: ManualClock) -> None:
    """The message's agent locates the score slot: a redelivered copy is answered from it
    without reading the episode (before, the episode was read first, for its agent)."""
    scorer = scorer_for(store, clock, "*=all")
    (episode_id,) = add_episodes(store, 1)
    bare = json.dumps({"type": "score_request", "episode_id": episode_id, "agent_id": AGENT})
    assert score_message(bare, scorer).status == "scored"
    counted = CountingStore(store)
    scorer.store = counted
    assert score_message(bare, scorer).status == "duplicate"
    assert dict(counted.calls) == {"get_score": 1}


def test_episodes_that_cannot_be_judged_do_not_hold_a_limited_run_back(store: Store, clock: ManualClock) -> None:
    """Records whose episode expired sort first on every run; before, a ``limit`` spent itself on
    them run after run and never reached the others."""
    scorer = scorer_for(store, clock, "*=0")
    for i in range(2):  # recorded unjudged, then expired by TTL: no episode to judge
        store.mark_unjudged(make_unjudged(f"a-gone-{i}", agent_id=AGENT))
    ids = add_episodes(store, 3, prefix="b")
    for i in ids:
        assert score_message(message(i), scorer).status == "unjudged"

    done: list[int] = []
    first = judge_unjudged(store, scorer, AGENT, limit=2, progress=done.append)
    assert first.judged == ids[:2] and first.more and first.stopped is None and done == [1, 2]
    assert [(e, reason) for e, reason, _ in first.failed] == [("a-gone-0", "EpisodeNotFound"),
                                                              ("a-gone-1", "EpisodeNotFound")]
    second = judge_unjudged(store, scorer, AGENT, limit=2)
    assert second.judged == ids[2:] and not second.more and len(second.failed) == 2
    assert [r["id"] for r in store.list_unjudged(AGENT)] == ["a-gone-0", "a-gone-1"]  # they keep their records
