"""Rollback, pin/unpin and the exploration-collapse and reward-drop warnings, on every store."""

from __future__ import annotations

import math
import random
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from factories import make_policy_doc, make_run

from agent_learning.agent.client import PolicyClient
from agent_learning.app.embedded import LocalPipeline
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import ConcurrencyConflict, InvalidDocument, NotFound, TransientError
from agent_learning.documents import PolicyDocument
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import RECENT, Reinforce
from agent_learning.ops.admin import rollback, set_pinned
from agent_learning.pipeline import create_policy, load_current
from agent_learning.pipeline.drift import DriftConfig, RunReward, assess, review
from agent_learning.pipeline.publish import revise
from agent_learning.policy.softmax import (
    Action,
    SoftmaxPolicy,
    StructuredPolicy,
    policy_choices,
    policy_entropy,
    policy_probabilities,
    served_entropy,
)
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.sim.simulate import SCENARIOS, math_tutor
from agent_learning.store import MemoryStore, Store
from agent_learning.store.sqlite import SQLiteStore

AGENT = "math-tutor"


# ``store``: every store adapter in turn (tests/support/adapters.py).


class Agent:
    """A simulated agent learning through the embedded runner on the given store."""

    def __init__(self, store: Store, tmp_path: Path, drift: DriftConfig | None = None) -> None:
        self.clock = ManualClock()
        self.scenario = math_tutor(AGENT)
        self.rng = random.Random(5)
        self.store = store
        self.pipeline = LocalPipeline(store, SQLiteQueue(":memory:", clock=self.clock), OfflineJudge(),
                                      RewardFunction(), Reinforce(), clock=self.clock, drift=drift)
        create_policy(store, SoftmaxPolicy.from_actions(AGENT, self.scenario.actions, exploration_floor=0.01)
                      .to_document(created_at=self.clock.now()))

    def round(self, n: int = 30) -> Any:
        policy = SoftmaxPolicy.from_document(load_current(self.store, AGENT), rng=self.rng)  # type: ignore[arg-type]
        for _ in range(n):
            self.scenario.run_episode(self.store, policy.choose(), self.rng, self.clock)
        self.clock.advance(60)
        return self.pipeline.run_once()


def test_rollback_publishes_the_old_logits_as_a_new_version_and_keeps_history(store: Store, tmp_path: Path) -> None:
    agent = Agent(store, tmp_path)
    for _ in range(3):
        agent.round()
    before = load_current(store, AGENT)
    assert before is not None and before.version == 4
    history_before = store.list_policy_versions(AGENT)

    change = rollback(store, AGENT, 2, clock=agent.clock, note="v3 answers too long")
    new = change.policy
    v2 = PolicyDocument.from_dict(store.get_policy_version(AGENT, 2))
    assert change.changed and new.version == 5 and new.source == "rollback" and new.parent_version == 2
    assert new.logits == v2.logits and new.cursor == before.cursor and new.run is None
    assert new.learner_state == before.learner_state != v2.learner_state  # the evidence up to the cursor
    assert "v3 answers too long" in new.note
    versions = store.list_policy_versions(AGENT)
    assert versions[:4] == history_before  # history is never rewritten
    assert [v["version"] for v in versions] == [1, 2, 3, 4, 5] and versions[4]["logits"] == v2.logits

    again = rollback(store, AGENT, 2, clock=agent.clock)
    assert not again.changed and load_current(store, AGENT).version == 5  # type: ignore[union-attr]

    report = agent.round()  # training goes on from the rolled-back logits, from the same cursor
    assert [t.status for t in report.trained] == ["published"]
    trained = load_current(store, AGENT)
    assert trained is not None and trained.version == 6 and trained.run is not None
    assert trained.run.base_version == 5 and trained.run.cursor_from == before.cursor


@pytest.mark.parametrize("change", ["drop", "rename"])
def test_a_rollback_past_a_revision_gives_the_restored_action_back_its_evidence(
    store: Store, tmp_path: Path, change: str
) -> None:
    """Revise away (or rename) an action, then roll back to the version before: the policy then
    learns exactly as an agent that was never revised (its twin, same episodes)."""
    agent, twin = Agent(store, tmp_path), Agent(MemoryStore(), tmp_path)
    for _ in range(3):
        agent.round()
        twin.round()
    before = load_current(store, AGENT)
    assert before is not None and before.learner_state == load_current(twin.store, AGENT).learner_state  # type: ignore[union-attr]
    actions = list(agent.scenario.actions)
    if change == "drop":
        revised = revise(store, AGENT, actions[:-1], clock=agent.clock)
    else:
        renamed = Action(id=f"{actions[-1].id}-2", description=actions[-1].description, config=actions[-1].config)
        revised = revise(store, AGENT, [*actions[:-1], renamed], renames={actions[-1].id: renamed.id},
                         clock=agent.clock)
    assert revised.changed
    restored = rollback(store, AGENT, before.version, clock=agent.clock).policy
    assert restored.action_ids == before.action_ids and restored.learner_state == before.learner_state
    agent.round()
    twin.round()
    assert SoftmaxPolicy.from_document(load_current(store, AGENT)).probabilities == pytest.approx(  # type: ignore[arg-type]
        SoftmaxPolicy.from_document(load_current(twin.store, AGENT)).probabilities)  # type: ignore[arg-type]


def per_action(doc: PolicyDocument) -> dict[str, dict[str, float]]:
    """Every per-action entry of a version's learner state, the change test's recent sums too, by action id."""
    state, ids = doc.learner_state, doc.action_ids
    flat = {**{k: v for k, v in state.items() if k != RECENT}, **{f"recent.{k}": v for k, v in state[RECENT].items()}}
    assert all(len(values) == len(ids) for values in flat.values())  # one entry per action, in order
    return {key: dict(zip(ids, values, strict=True)) for key, values in flat.items()}


def test_a_revision_reorders_the_change_tests_recent_sums_with_the_actions(store: Store, tmp_path: Path) -> None:
    """The recent sums follow the actions like the rest of the evidence, so the next run keeps them."""
    agent = Agent(store, tmp_path)
    for _ in range(3):
        agent.round()
    before = load_current(store, AGENT)
    assert before is not None and RECENT in before.learner_state
    actions = list(agent.scenario.actions)
    renamed = Action(id="calc2", description=actions[2].description, config=actions[2].config)
    revised = revise(store, AGENT, [actions[3], renamed, actions[0]], renames={actions[2].id: "calc2"},
                     clock=agent.clock).policy
    old, new = per_action(before), per_action(revised)
    for key, entries in new.items():
        assert entries == {actions[3].id: old[key][actions[3].id], "calc2": old[key][actions[2].id],
                           actions[0].id: old[key][actions[0].id]}
    back = revise(store, AGENT, [actions[3], actions[2], actions[0]], renames={"calc2": actions[2].id},
                  clock=agent.clock).policy  # the simulated agent knows only the old id
    assert back.learner_state[RECENT] == revised.learner_state[RECENT]
    agent.round()
    trained = load_current(store, AGENT)
    assert trained is not None and trained.run is not None and "recent_reset" not in trained.run.metrics
    per_action(trained)


def test_a_rollback_keeps_the_evidence_gathered_since_and_restores_what_a_revision_dropped(
    store: Store, tmp_path: Path
) -> None:
    """Actions the current version has keep its evidence; the one a revision dropped gets the
    evidence the restored version had for it (the change test's recent sums likewise)."""
    agent = Agent(store, tmp_path)
    for _ in range(3):
        agent.round()
    before = load_current(store, AGENT)
    assert before is not None
    actions = list(agent.scenario.actions)
    revise(store, AGENT, [actions[2], actions[0], actions[1]], clock=agent.clock)  # drops the last, reorders
    agent.round()
    since = load_current(store, AGENT)
    assert since is not None and since.learner_state["count"] != before.learner_state["count"][:3]
    restored = rollback(store, AGENT, before.version, clock=agent.clock).policy
    assert restored.action_ids == before.action_ids
    got = per_action(restored)
    old, current = per_action(before), per_action(since)
    for key, entries in got.items():
        assert entries == {**current[key], actions[3].id: old[key][actions[3].id]}


def test_rollback_rejects_unknown_and_current_versions(store: Store, tmp_path: Path) -> None:
    agent = Agent(store, tmp_path)
    agent.round()
    with pytest.raises(NotFound, match=r"VERSION: .*no version 9 .*versions 1 to 2"):
        rollback(store, AGENT, 9)
    with pytest.raises(ValueError, match="VERSION: v2 is the current version"):
        rollback(store, AGENT, 2)
    with pytest.raises(NotFound, match="agent_id"):
        rollback(store, "nobody", 1)


def test_a_version_without_a_record_is_named_as_missing_or_as_the_current_one(tmp_path: Path) -> None:
    """Before the fix both said "has no version N (versions 1 to 3)", N being one of those."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    agent = Agent(store, tmp_path)
    agent.round()
    current = load_current(store, AGENT)
    assert current is not None
    unrecorded = current.model_copy(update={"version": 3, "source": "rollback", "parent_version": 1, "run": None})
    store.replace_current_policy(unrecorded, store.get_current_policy(AGENT).etag)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"^VERSION: v3 is the current version of 'math-tutor'; nothing to roll back"):
        rollback(store, AGENT, 3)  # a crash left it unrecorded: the next run records it
    with closing(sqlite3.connect(str(tmp_path / "s.db"))) as conn, conn:
        conn.execute("DELETE FROM policies WHERE id = 'math-tutor:v2'")  # a record lost
    with pytest.raises(NotFound, match=r"^VERSION: the record of 'math-tutor' v2 is missing \(versions 1 to 3; "
                                       r"agent-learn audit --agent-id math-tutor checks them\)"):
        rollback(store, AGENT, 2)
    with pytest.raises(NotFound, match=r"^VERSION: 'math-tutor' has no version 4 \(versions 1 to 3\)"):
        rollback(store, AGENT, 4)
    store.close()


def test_an_operators_note_is_stored_whole_or_refused_never_cut(tmp_path: Path) -> None:
    """The version's note starts with the intervention's own words; the operator's note after
    them is kept to its last character, or refused (nothing published) when it does not fit."""
    store = MemoryStore()
    agent = Agent(store, tmp_path)
    agent.round()
    prefix = "rollback from v2 to v1: "
    with pytest.raises(ValueError, match=r"--note: is 1,000 characters; .* at most 976 of the 1,000 are left"):
        rollback(store, AGENT, 1, note="n" * 997 + "END")
    assert load_current(store, AGENT).version == 2  # type: ignore[union-attr]
    fits = "n" * (1000 - len(prefix) - 3) + "END"
    assert rollback(store, AGENT, 1, note=fits).policy.note == prefix + fits
    actions = list(agent.scenario.actions)
    with pytest.raises(ValueError, match="--note: is 1,000 characters"):
        revise(store, AGENT, actions[:-1], note="n" * 1000)
    assert revise(store, AGENT, actions[:-1], note="fewer").policy.note.endswith(": fewer")


def test_a_rollback_repairs_an_invalid_current_document_from_the_newest_valid_version(
    backend: Any, tmp_path: Path
) -> None:
    """A current document edited by hand stops the agent's training, and no other intervention
    can read it: a rollback replaces it, resuming from the version record it was a copy of."""
    store = backend.store
    agent = Agent(store, tmp_path)
    for _ in range(3):
        agent.round()
    good = load_current(store, AGENT)
    assert good is not None and good.version == 4
    edited = {**store.get_current_policy(AGENT).doc, "temperature": 0}  # type: ignore[union-attr]
    backend.put_raw("policies", {**edited, "pinned": True, "pin_reason": "investigating"})
    with pytest.raises(InvalidDocument, match="temperature"):
        set_pinned(store, AGENT, False)  # no other intervention can read it

    change = rollback(store, AGENT, 2, clock=agent.clock, note="after a bad edit")
    new = change.policy
    assert change.changed and "temperature" in change.replaced_invalid and change.resumed_from == 4
    assert (new.version, new.source, new.parent_version) == (5, "rollback", 2)
    assert new.cursor == good.cursor and new.learner_state == good.learner_state  # nothing learned is lost
    assert new.logits == PolicyDocument.from_dict(store.get_policy_version(AGENT, 2)).logits
    assert (new.pinned, new.pin_reason) == (True, "investigating")  # the pin is kept
    assert "invalid current document" in new.note and "after a bad edit" in new.note
    assert [v["version"] for v in store.list_policy_versions(AGENT)] == [1, 2, 3, 4, 5]
    assert not rollback(store, AGENT, 2, clock=agent.clock).changed  # repeating it changes nothing

    set_pinned(store, AGENT, False)
    trained = agent.round().trained
    assert [t.status for t in trained] == ["published"] and trained[0].run is not None
    assert trained[0].run.base_version == 5 and trained[0].run.cursor_from == good.cursor


@pytest.mark.parametrize(("claimed", "next_version"), [(2, 3), (3, 4), (99, 3), ("x", 3)])
def test_a_repairing_rollback_numbers_past_a_version_a_crash_left_unrecorded(
    backend: Any, tmp_path: Path, claimed: Any, next_version: int
) -> None:
    """Agents may have logged episodes under the version an invalid current document holds when
    a crash left it unrecorded (one past the records): the repair takes the number after it. A
    number edited in (99, "x") is not taken."""
    store = backend.store
    agent = Agent(store, tmp_path)
    agent.round()
    doc = store.get_current_policy(AGENT).doc  # type: ignore[union-attr]
    backend.put_raw("policies", {**doc, "version": claimed, "logits": [1e9] * len(doc["logits"])})
    change = rollback(store, AGENT, 1, clock=agent.clock)
    assert change.resumed_from == 2 and change.policy.version == next_version
    assert change.policy.cursor == PolicyDocument.from_dict(store.get_policy_version(AGENT, 2)).cursor


def test_pin_freezes_learning_and_unpin_learns_what_arrived_meanwhile(store: Store, tmp_path: Path) -> None:
    agent = Agent(store, tmp_path)
    agent.round()
    pinned = set_pinned(store, AGENT, True, "investigating a complaint")
    assert pinned.changed and pinned.policy.pinned and pinned.policy.version == 2
    assert not set_pinned(store, AGENT, True).changed  # idempotent
    cursor = pinned.policy.cursor
    report = agent.round(20)
    assert [t.status for t in report.trained] == ["pinned"]
    assert "investigating a complaint" in report.trained[0].reason
    current = load_current(store, AGENT)
    assert current is not None and (current.version, current.cursor, current.pinned) == (2, cursor, True)
    assert store.get_policy_version(AGENT, 2)["pinned"] is False  # type: ignore[index]  # versions are never pinned

    unpinned = set_pinned(store, AGENT, False)
    assert unpinned.changed and not unpinned.policy.pinned and unpinned.policy.pin_reason == ""
    trained = agent.pipeline.train()
    assert [t.status for t in trained] == ["published"] and trained[0].run is not None
    assert trained[0].run.episodes == 20 and trained[0].run.cursor_from == cursor
    assert not set_pinned(store, AGENT, False).changed


def test_an_intervention_retries_when_a_trainer_publishes_in_between(tmp_path: Path) -> None:
    store = MemoryStore()
    agent = Agent(store, tmp_path)
    agent.round()
    policy = SoftmaxPolicy.from_document(load_current(store, AGENT), rng=agent.rng)  # type: ignore[arg-type]
    for _ in range(10):
        agent.scenario.run_episode(store, policy.choose(), agent.rng, agent.clock)
    agent.pipeline.pump()
    agent.pipeline.score_pending()  # scored, not yet trained
    original = store.replace_current_policy
    raced: list[bool] = []

    def racing(doc: PolicyDocument, etag: str | None) -> str:
        if not raced:  # a trainer publishes v3 between our read of v2 and our swap
            raced.append(True)
            assert [t.status for t in agent.pipeline.train()] == ["published"]
        return original(doc, etag)

    store.replace_current_policy = racing  # type: ignore[method-assign]
    change = set_pinned(store, AGENT, True)
    assert raced and change.changed
    current = load_current(store, AGENT)
    assert current is not None and current.pinned and current.version == 3  # pinned the trainer's v3

    store.replace_current_policy = lambda doc, etag: (_ for _ in ()).throw(ConcurrencyConflict("stale"))  # type: ignore[method-assign]
    with pytest.raises(ConcurrencyConflict, match="kept changing"):
        set_pinned(store, AGENT, False)


# --------------------------------------------------------------------------- warnings


def runs(*means: float, episodes: int = 100, std: float = 0.2) -> list[RunReward]:
    """Runs newest first with these mean rewards."""
    return [RunReward(episodes, m, std) for m in means]


def test_assess_warns_on_a_sharp_reward_drop_backed_by_evidence() -> None:
    config = DriftConfig(reward_drop=0.25, window=200)
    (w,) = assess("a", 7, runs(0.5, 0.5, 0.8, 0.8), entropy=1.0, n_actions=4, config=config)
    assert w.kind == "reward_drop" and "0.300" in w.message and "v7" in w.message and "standard errors" in w.message
    assert assess("a", 7, runs(0.6, 0.6, 0.8, 0.8), 1.0, 4, config) == []  # a drop of 0.2 is within the threshold
    assert assess("a", 7, runs(0.5, 0.8, 0.8, 0.8), 1.0, 4, config) == []  # one run: the recent side pools two
    assert assess("a", 7, runs(0.5, 0.5, 0.8), 1.0, 4, config) == []  # the earlier side is too small
    few = runs(0.4, 0.4, 0.8, 0.8, episodes=10, std=0.5)  # as large a drop, too few episodes to be sure
    assert assess("a", 7, few, 1.0, 4, DriftConfig(window=20)) == []


def test_assess_warns_on_collapse_only_when_reward_falls_too() -> None:
    config = DriftConfig(collapse_entropy=0.1, collapse_reward_fall=0.1, reward_drop=0.5, window=100)
    collapsed = 0.05 * math.log(4)
    (w,) = assess("a", 9, runs(0.6, 0.75, 0.72), collapsed, 4, config)
    assert w.kind == "exploration_collapse" and "stopped exploring" in w.message
    assert assess("a", 9, runs(0.74, 0.75, 0.72), collapsed, 4, config) == []  # converged, reward steady
    assert assess("a", 9, runs(0.6, 0.75, 0.72), 0.5 * math.log(4), 4, config) == []  # still exploring


def test_a_policy_of_one_configuration_never_warns_of_an_exploration_collapse() -> None:
    """With one action there is nothing to explore: a fall is a reward drop or nothing."""
    config = DriftConfig(collapse_entropy=0.1, collapse_reward_fall=0.1, reward_drop=0.25, window=100)
    assert assess("a", 9, runs(0.6, 0.75, 0.72), 0.0, 1, config) == []
    assert [w.kind for w in assess("a", 9, runs(0.4, 0.75, 0.72), 0.0, 1, config)] == ["reward_drop"]


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"reward_drop": -0.1}, "reward_drop=-0.1 must be > 0"),
        ({"reward_drop": 0}, "reward_drop=0 must be > 0"),
        ({"collapse_reward_fall": -1.0}, "collapse_reward_fall=-1.0 must be >= 0"),
        ({"collapse_entropy": 1.5}, "collapse_entropy=1.5 must be between 0 and 1"),
        ({"evidence_z": float("nan")}, "evidence_z=nan must be a finite number"),
        ({"evidence_z": -3.0}, "evidence_z=-3.0 must be >= 0"),
        ({"reward_drop": "0.25"}, "reward_drop='0.25' must be a finite number"),
        ({"window": 0}, "window=0 must be a whole number"),
        ({"window": 2.5}, "window=2.5 must be a whole number"),
        ({"auto_pin": "false"}, "auto_pin='false' must be True or False"),
    ],
)
def test_a_drift_config_built_in_code_refuses_values_that_would_warn_wrongly(
    given: dict[str, Any], problem: str
) -> None:
    """A negative threshold warns (and with auto_pin pins) on a rising reward; a NaN z never asks for evidence."""
    with pytest.raises(ValueError, match=re.escape(problem)):
        DriftConfig(**given)


def simulate(means: list[float], batch: int, seed: int, config: DriftConfig) -> list[int]:
    """Runs of ``batch`` Bernoulli rewards with these means, oldest first; the runs that warn."""
    rng = random.Random(seed)
    history: list[RunReward] = []
    warned = []
    for i, p in enumerate(means):
        rewards = [1.0 if rng.random() < p else 0.0 for _ in range(batch)]
        mean = sum(rewards) / batch
        history.insert(0, RunReward(batch, mean, math.sqrt(mean * (1 - mean))))
        if assess("a", i + 2, history[:200], entropy=1.0, n_actions=4, config=config):
            warned.append(i)
    return warned


def test_small_batches_of_a_steady_reward_do_not_warn_and_a_real_drop_does() -> None:
    config = DriftConfig(reward_drop=0.25)
    # 1,000 runs of 10 episodes, reward steady at 0.8: a 0.25 swing between two batches of 10 is
    # common (the old rule warned on it), evidence for it over 200 episodes is not.
    false_alarms = sum(len(simulate([0.8] * 1000, 10, seed, config)) for seed in range(5))
    assert false_alarms <= 5  # at most one per 1,000 runs
    # The reward falls from 0.8 to 0.45 for good: caught within 400 episodes of the change.
    for seed in range(5):
        warned = simulate([0.8] * 100 + [0.45] * 100, 10, seed, config)
        assert warned and 100 <= warned[0] < 140, warned
def test_a_warning_pins_the_agent_when_auto_pin_is_on(store: Store, tmp_path: Path, caplog: Any) -> None:
    agent = Agent(store, tmp_path, drift=DriftConfig(reward_drop=0.2, window=30, auto_pin=True))
    agent.round()
    agent.round()
    # The judge turns harsh: every later episode gets a much lower reward.
    agent.pipeline.scorer.reward = HarshReward(agent.pipeline.scorer.reward)
    with caplog.at_level("WARNING", logger="agent_learning.pipeline.drift"):
        report = agent.round()
    assert [t.status for t in report.trained] == ["published"]
    assert any("reward_drop" in r.getMessage() for r in caplog.records)
    current = load_current(store, AGENT)
    assert current is not None and current.pinned and "mean reward dropped" in current.pin_reason
    assert [t.status for t in agent.round().trained] == ["pinned"]


def test_an_unpin_holds_until_runs_after_it_show_a_fall_of_their_own(store: Store, tmp_path: Path, caplog: Any) -> None:
    """Before the fix the next review pinned the agent again on the very runs the operator had
    seen when unpinning it (the recent side pooled the run that had pinned it)."""
    agent = Agent(store, tmp_path, drift=DriftConfig(reward_drop=0.2, window=60, auto_pin=True))
    for _ in range(4):
        agent.round()
    agent.pipeline.scorer.reward = HarshReward(agent.pipeline.scorer.reward)
    agent.round()
    pinned = load_current(store, AGENT)
    assert pinned is not None and pinned.pinned and pinned.version == 6 and pinned.unpinned_version is None
    set_pinned(store, AGENT, False)  # the operator accepts the lower reward
    unpinned = load_current(store, AGENT)
    assert unpinned is not None and unpinned.unpinned_version == 6
    with caplog.at_level("WARNING", logger="agent_learning.pipeline.drift"):
        report = agent.round()  # the fall still shows, on runs up to v6: warned, not pinned
    assert [(t.status, t.version) for t in report.trained] == [("published", 7)]
    assert "reward_drop" in caplog.text and "not pinned again: the fall rests on runs up to v6" in caplog.text
    assert not load_current(store, AGENT).pinned  # type: ignore[union-attr]
    assert store.get_policy_version(AGENT, 7).get("unpinned_version") is None  # type: ignore[union-attr]
    agent.round()
    agent.pipeline.scorer.reward = HarshReward(agent.pipeline.scorer.reward)  # a new fall, after the unpin
    statuses = [agent.round().trained[0].status for _ in range(3)]
    repinned = load_current(store, AGENT)
    assert repinned is not None and repinned.pinned and "mean reward dropped" in repinned.pin_reason
    # v9: the runs after the unpin fill one side only; v10: both, and they fall: pinned
    assert statuses == ["published", "published", "pinned"] and repinned.version == 10


def test_an_invalid_run_document_is_left_out_of_the_review_not_a_failed_publish(
    tmp_path: Path, caplog: Any
) -> None:
    """A run edited by hand (as in ``runs list``'s test) is named and left out; the version that
    training has just published is reported published, and the other runs still warn."""
    store = SQLiteStore(tmp_path / "s.db")
    agent = Agent(store, tmp_path, drift=DriftConfig(reward_drop=0.2, window=30))
    agent.round()
    agent.round()
    with closing(sqlite3.connect(tmp_path / "s.db")) as conn, conn:
        conn.execute("UPDATE runs SET doc = json_set(doc, '$.metrics.mean_reward', 'high') WHERE id = ?",
                     (f"{AGENT}:run:v2",))
    agent.pipeline.scorer.reward = HarshReward(agent.pipeline.scorer.reward)
    with caplog.at_level("WARNING", logger="agent_learning.pipeline.drift"):
        report = agent.round()
    assert [(t.status, t.version) for t in report.trained] == [("published", 4)]
    assert f"leaves out run '{AGENT}:run:v2': invalid run: metrics.mean_reward" in caplog.text
    assert "reward_drop" in caplog.text  # v4's fall against v3
    store.close()


def test_a_drift_review_that_fails_leaves_the_publish_reported_as_published(
    store: Store, tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store throttles the review's read of the runs: the version is published all the same,
    and the outcome says so (not ``unavailable``, which would say the next run retries)."""
    agent = Agent(store, tmp_path, drift=DriftConfig())

    def throttled(*args: Any, **kwargs: Any) -> Any:
        raise TransientError("the store is throttled (429)")

    monkeypatch.setattr(store, "list_runs", throttled)
    with caplog.at_level("ERROR", logger="agent_learning.pipeline.train"):
        report = agent.round()
    assert [(t.status, t.version) for t in report.trained] == [("published", 2)]
    assert load_current(store, AGENT).version == 2  # type: ignore[union-attr]
    assert "v2 is published, but its drift review failed: TransientError: the store is throttled" in caplog.text


class HarshReward:
    def __init__(self, inner: RewardFunction) -> None:
        self.inner = inner

    def __call__(self, metrics: Any, episode: Any) -> Any:
        reward, info = self.inner(metrics, episode)
        return max(-1.0, reward - 0.6), info


def test_pinned_reason_is_kept_off_version_documents() -> None:
    doc = make_policy_doc(kind="current", pinned=True, pin_reason="why")
    version = doc.as_kind("version")
    assert (version.pinned, version.pin_reason) == (False, "")
    with pytest.raises(ValueError, match="pinned"):
        make_policy_doc(pin_reason="why")


def test_a_structured_policy_is_measured_against_its_configurations_not_its_values(tmp_path: Path) -> None:
    """The triage bot's 3 prompts × 3 retrieval depths are 9 configurations: its entropy (the joint
    choice's, the sum over dimensions) has the maximum log 9, not log 6 (its 6 values), so a
    collapse is measured, and reported, against log 9 as for a flat policy of 9 actions."""
    scenario = SCENARIOS["triage-bot"]()
    clock = ManualClock()
    store = MemoryStore()
    create_policy(store, scenario.first_policy(temperature=1.0, exploration_floor=0.001, created_at=clock.now()))
    pipeline = LocalPipeline(store, SQLiteQueue(":memory:", clock=clock), OfflineJudge(), RewardFunction(),
                             Reinforce(), clock=clock)
    client = PolicyClient(store, "triage-bot", refresh_seconds=0, rng=random.Random(1), clock=clock)
    rng = random.Random(2)
    for _ in range(20):
        scenario.step(store, client.policy(), rng, clock)
    clock.advance(60)
    (trained,) = pipeline.run_once().trained
    assert trained.status == "published" and trained.choices == 9  # 6 values, 9 configurations
    requests = [e.get("context") for e in store.list_episodes("triage-bot", limit=100)]
    assert len(requests) == 20 and trained.entropy == pytest.approx(served_entropy(load_current(store, "triage-bot"),
                                                                                   requests))
    first = PolicyDocument.from_dict(store.get_policy_version("triage-bot", 1))
    assert policy_entropy(policy_probabilities(first)) == pytest.approx(math.log(policy_choices(first)))

    # A fall over two sides of 100 episodes, and a policy at 9 % of log 9 (but 11 % of log 6).
    for version, mean in ((4, 0.6), (3, 0.75), (2, 0.72)):
        store.put_run(make_run("triage-bot", version, episodes=100, metrics={"mean_reward": mean,
                                                                           "episode_reward_std": 0.2}))
    per_dimension = [0.983, 0.0085, 0.0085]
    probabilities = per_dimension * 2
    assert 0.1 * math.log(6) < policy_entropy(probabilities) < 0.1 * math.log(9)
    config = DriftConfig(collapse_entropy=0.1, collapse_reward_fall=0.1, reward_drop=0.5, window=100)
    (w,) = review(store, "triage-bot", 4, policy_entropy(probabilities), 9, config)
    assert w.kind == "exploration_collapse" and "entropy 0.089 of its maximum" in w.message
    assert review(store, "triage-bot", 4, policy_entropy(probabilities), 6, config) == []  # 0.11 of log 6: none


def test_a_contextual_policy_sure_in_every_segment_is_a_collapse_though_unsure_without_context() -> None:
    """Billing requests draw a, technical ones b, each at 99 %: the requests' policy has stopped
    exploring, though with no context (global logits 0) it is uniform."""
    doc = StructuredPolicy.create("triage", {"prompt": ["a", "b"]}, context={"task": "category"},
                                  exploration_floor=0.0).document
    offsets = {"billing": [4.6, -4.6], "technical": [-4.6, 4.6]}
    doc = PolicyDocument.from_dict({**doc.to_dict(), "features": [{"name": "task", "kind": "category",
                                                                  "segments": offsets}]})
    requests = [{"task": "billing"}] * 60 + [{"task": "technical"}] * 40
    served = served_entropy(doc, requests)
    assert policy_entropy(policy_probabilities(doc)) == pytest.approx(math.log(2))  # no context: uniform
    assert served == pytest.approx(policy_entropy([0.9999, 0.0001]), rel=0.3) and served < 0.1 * math.log(2)
    assert served_entropy(doc, []) == pytest.approx(math.log(2))  # no requests: with no context
    store = MemoryStore()
    for version, mean in ((4, 0.6), (3, 0.75), (2, 0.72)):
        store.put_run(make_run("triage", version, episodes=100, metrics={"mean_reward": mean,
                                                                       "episode_reward_std": 0.2}))
    config = DriftConfig(collapse_entropy=0.1, collapse_reward_fall=0.1, reward_drop=0.5, window=100)
    (w,) = review(store, "triage", 4, served, policy_choices(doc), config)
    assert w.kind == "exploration_collapse"


def test_a_fall_over_runs_of_one_episode_warns_reading_only_the_runs_it_needs() -> None:
    """Window 200 over runs of one episode needs 400 runs (reading 200 never filled both sides);
    runs of 100 episodes need 4, and 16 are read."""
    store = MemoryStore()
    for version in range(2, 1_002):
        mean = 0.9 if version <= 801 else 0.5  # the reward fell in the latest 200 runs
        store.put_run(make_run("tiny", version, episodes=1, metrics={"mean_reward": mean, "episode_reward_std": 0.1}))
    reads: list[int] = []
    list_runs = store.list_runs
    store.list_runs = lambda agent_id, limit=100: reads.append(limit) or list_runs(agent_id, limit)  # type: ignore[method-assign]
    config = DriftConfig(window=200)
    (w,) = review(store, "tiny", 1_001, 0.5, 4, config)
    assert w.kind == "reward_drop" and "0.900 over 200 episodes → 0.500 over the latest 200" in w.message
    assert reads == [16, 64, 256, 1_024]
    for version in range(1_002, 1_006):
        store.put_run(make_run("tiny", version, episodes=100, metrics={"mean_reward": 0.5, "episode_reward_std": 0.1}))
    reads.clear()
    assert review(store, "tiny", 1_005, 0.5, 4, config) == [] and reads == [16]
