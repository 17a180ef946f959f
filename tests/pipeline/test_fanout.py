"""Training fan-out: a tick plans which agents have new scores and sends one message for each;
a message trains one agent, and duplicates or stale messages change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from adapters import QueueUnderTest
from factories import make_episode, make_policy_doc, make_score

from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import InvalidDocument
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline import (
    TrainRequest,
    create_policy,
    load_current,
    plan_training,
    send_plan,
    set_pinned,
    train_agent,
    train_all,
    train_requested,
)
from agent_learning.queue.base import OutgoingMessage
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.store.base import Store


def start(store: Store, agent_id: str) -> None:
    create_policy(store, make_policy_doc(agent_id, kind="current"))


def score(store: Store, agent_id: str, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        episode = make_episode(f"{agent_id}-ep-{i}", agent_id=agent_id)
        store.add_episode(episode)
        store.add_score(make_score(episode=episode, reward=0.25 * (i % 4)))


@pytest.fixture
def agents(store: Store) -> Store:
    """busy: new scores; trained: scores all learned; pinned: new scores but paused; fresh: none."""
    for agent_id in ("busy", "trained", "pinned", "fresh"):
        start(store, agent_id)
    score(store, "busy", 3)
    score(store, "trained", 2)
    assert train_agent("trained", store, Reinforce()).status == "published"
    score(store, "pinned", 2)
    set_pinned(store, "pinned", True, reason="investigating")
    return store


def test_a_tick_plans_only_the_agents_with_new_scores(agents: Store) -> None:
    plan = plan_training(agents)
    assert [r.agent_id for r in plan.requests] == ["busy"]
    assert sorted(a.agent_id for a in plan.idle) == ["fresh", "trained"]
    assert [a.agent_id for a in plan.pinned] == ["pinned"] and plan.agents == 4
    (busy,) = plan.requests
    assert busy.version == 1 and busy.cursor is None
    trained = next(a for a in plan.idle if a.agent_id == "trained")
    assert trained.version == 2 and trained.cursor is not None
    assert {o.agent_id: o.status for o in plan.untrained()} == {
        "fresh": "no_new_scores", "trained": "no_new_scores", "pinned": "pinned"}

    assert plan_training(agents, agent_ids=["trained", "pinned"]).requests == []


def test_one_agent_id_passed_as_a_string_is_refused_not_read_as_its_characters(agents: Store) -> None:
    assert [r.agent_id for r in plan_training(agents, agent_ids=["busy"]).requests] == ["busy"]
    with pytest.raises(TypeError, match=r"agent_ids: 'busy' is one string; pass a list of agent ids, \['busy'\]"):
        plan_training(agents, agent_ids="busy")
    with pytest.raises(TypeError, match="agent_ids: 'busy' is one string"):
        train_all(agents, Reinforce(), agent_ids="busy")
    assert load_current(agents, "busy").version == 1  # nothing trained


def test_a_tick_reports_an_invalid_current_document_whether_or_not_its_agent_has_new_scores(agents: Store) -> None:
    """Before the fix the plan read only the cursor's fields: an agent whose document no longer
    validated (edited by hand) but had nothing new was reported as ``no_new_scores``, a pinned
    one as ``pinned``."""
    for agent_id in ("trained", "pinned", "busy"):
        tagged = agents.get_current_policy(agent_id)
        assert tagged is not None
        edited = load_current(agents, agent_id).model_copy(update={"logits": [0.0]})  # type: ignore[union-attr]
        agents.replace_current_policy(edited, tagged.etag)  # model_copy does not validate: as a hand edit
    plan = plan_training(agents)
    assert plan.requests == [] and [a.agent_id for a in plan.idle] == ["fresh"] and plan.pinned == []
    assert {o.agent_id: o.status for o in plan.untrained()} == {
        "busy": "invalid_policy", "fresh": "no_new_scores", "pinned": "invalid_policy", "trained": "invalid_policy"}
    for o in plan.failed:
        assert o.reason.startswith(f"invalid policy '{o.agent_id}:current': logits: has 1 entries but there are 3")
        assert o.reason.endswith(f"`agent-learn policy rollback --agent-id {o.agent_id} VERSION` repairs it")
    outcome = train_agent("busy", agents, Reinforce())  # the trainer says the same
    assert (outcome.status, outcome.reason) == ("invalid_policy", plan.failed[0].reason)


def test_a_message_trains_its_agent_once_however_often_it_is_delivered(agents: Store) -> None:
    (request,) = plan_training(agents).requests
    body = request.to_message().body
    first = train_requested(body, agents, Reinforce())
    assert first.status == "published" and first.version == 2 and first.run is not None and first.run.episodes == 3
    again = train_requested(body, agents, Reinforce())  # a duplicate, or a stale copy from an earlier tick
    assert again.status == "no_new_scores"
    assert load_current(agents, "busy").version == 2  # type: ignore[union-attr]
    assert plan_training(agents).requests == []  # nothing new: the next tick sends nothing

    score(agents, "busy", 2, first=3)
    (later,) = plan_training(agents).requests
    assert later.version == 2 and later.cursor == first.run.cursor_to.model_dump()
    assert later.message_id != request.message_id  # a new cursor: a new message


def test_the_message_id_is_the_agent_and_its_cursor() -> None:
    a = TrainRequest("busy", 3, {"seq": 7, "id": "ep-7"})
    assert a.message_id == TrainRequest("busy", 4, {"seq": 7, "id": "ep-7"}).message_id
    assert a.message_id != TrainRequest("busy", 3, {"seq": 8, "id": "ep-8"}).message_id
    assert a.message_id != TrainRequest("other", 3, {"seq": 7, "id": "ep-7"}).message_id
    assert len(TrainRequest("x" * 128, 1).message_id) <= 128
    assert TrainRequest.from_json(a.to_message().body) == a


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"[1]", "body"),
        (json.dumps({"type": "score_request", "agent_id": "a", "version": 1}), "type"),
        (json.dumps({"type": "train_request", "agent_id": "no spaces", "version": 1}), "agent_id"),
        (json.dumps({"type": "train_request", "agent_id": "a", "version": -1}), "version"),
        (json.dumps({"type": "train_request", "agent_id": "a", "version": 1, "cursor": 5}), "cursor"),
    ],
)
def test_a_message_that_is_not_a_training_request_names_the_field(body: Any, field: str) -> None:
    with pytest.raises(InvalidDocument) as info:
        TrainRequest.from_json(body)
    assert field in str(info.value)


def test_the_plan_goes_through_each_queue_and_trains_each_agent(agents: Store, queue: QueueUnderTest) -> None:
    plan = plan_training(agents)
    send_plan(plan, queue.queue.send)
    send_plan(plan, queue.queue.send)  # a re-run of the same tick: dropped as a duplicate
    (message,) = queue.receive_exactly(1)
    assert queue.queue.receive(5) == []
    outcome = train_requested(message.body, agents, Reinforce())
    queue.queue.complete(message)
    assert outcome.agent_id == "busy" and outcome.status == "published"


def test_one_agent_failing_does_not_stop_the_plan(agents: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    real = agents.has_new_scores

    def flaky(agent_id: str, after: Any) -> bool:
        if agent_id == "fresh":
            raise ConnectionError("store unreachable")
        return real(agent_id, after)

    monkeypatch.setattr(agents, "has_new_scores", flaky)
    plan = plan_training(agents)
    (failed,) = plan.failed
    assert failed.agent_id == "fresh" and failed.status == "failed" and "store unreachable" in failed.reason
    assert [r.agent_id for r in plan.requests] == ["busy"]


def test_the_embedded_runner_trains_through_its_queue_and_reports_every_agent(agents: Store) -> None:
    pipeline = LocalPipeline(agents, SQLiteQueue(":memory:"), OfflineJudge(), RewardFunction(), Reinforce())
    outcomes = pipeline.train()
    assert [(o.agent_id, o.status) for o in outcomes] == [
        ("busy", "published"), ("fresh", "no_new_scores"), ("pinned", "pinned"), ("trained", "no_new_scores")]
    assert pipeline.train_queue.counts().active == 0
    assert [o.status for o in pipeline.train()] == ["no_new_scores", "no_new_scores", "pinned", "no_new_scores"]

    pipeline.train_queue.send([OutgoingMessage("bad", "{}")])
    assert pipeline.train_pending() == []
    (dead,) = pipeline.train_queue.dead_letters()
    assert dead.reason == "InvalidMessage" and "type" in dead.description


class SlowLearner(Reinforce):
    """Each update takes ``seconds`` of the clock: a training run as long as a big batch's."""

    def __init__(self, clock: ManualClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        self.clock.advance(self.seconds)
        return super().learn(*args, **kwargs)


@pytest.mark.parametrize("seconds", [40, 70])
def test_the_embedded_runner_keeps_its_outcomes_when_runs_outlast_the_training_queue_lock(
    agents: Store, seconds: float
) -> None:
    """Two runs of 40 s within one 60-s lock used to expire the second message's lock, and the
    tick raised after publishing; a run longer than its own lock is trained again, changing nothing."""
    score(agents, "trained", 2, first=2)
    clock = ManualClock()
    queue = SQLiteQueue(":memory:", clock=clock, lock_seconds=60)
    pipeline = LocalPipeline(agents, SQLiteQueue(":memory:", clock=clock), OfflineJudge(), RewardFunction(),
                             SlowLearner(clock, seconds), clock=clock, train_queue=queue)
    outcomes = [(o.agent_id, o.status) for o in pipeline.train() if o.agent_id in ("busy", "trained")]
    expected = [("busy", "published"), ("trained", "published")]
    if seconds > 60:  # its lock expired: trained again, and nothing was left to learn
        expected = [("busy", "published"), ("busy", "no_new_scores"),
                    ("trained", "published"), ("trained", "no_new_scores")]
    assert outcomes == expected
    assert queue.counts().active == 0
    assert load_current(agents, "busy").version == 2 and load_current(agents, "trained").version == 3

