"""What-if estimates on an agent's logs: targets built right, feedback applied, truth covered."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import numpy as np
import pytest
from support.factories import BASE_TIME, make_policy_doc, make_score

from agent_learning.core.errors import NotFound
from agent_learning.documents import Action, Score
from agent_learning.evaluation import counterfactual as cf
from agent_learning.pipeline import create_policy, load_current, revise
from agent_learning.policy.softmax import Layout, StructuredPolicy, joint_index
from agent_learning.store.base import Store

AGENT = "what-if"
ACTIONS = ("a", "b", "c")
MEANS = {"a": 0.3, "b": 0.8, "c": 0.5}


def logged_uniformly(store: Store, n: int, seed: int = 0) -> None:
    """``n`` episodes logged by a uniform policy (v1), Bernoulli rewards of ``MEANS``."""
    create_policy(store, make_policy_doc(AGENT, kind="current", actions=ACTIONS, logits=[0.0, 0.0, 0.0]))
    rng = random.Random(seed)
    for i in range(n):
        action = rng.choice(ACTIONS)
        reward = 1.0 if rng.random() < MEANS[action] else 0.0
        store.put_score(make_score(f"ep-{i}", agent_id=AGENT, action_id=action, probability=1 / 3, reward=reward,
                                   scored_at=BASE_TIME + timedelta(seconds=i)))


def test_always_one_action_is_estimated_around_its_true_mean_on_every_store(store: Store) -> None:
    logged_uniformly(store, 900)
    current = load_current(store, AGENT)
    assert current is not None
    logged = cf.read_logged(store, current)
    assert len(logged.logs) == 900 and logged.first == BASE_TIME
    result = cf.compare_to_current(logged, current, cf.always(current, "b"), "always b")
    for name, (target, now, diff) in result.estimates.items():
        assert target.low <= MEANS["b"] <= target.high, name
        assert now.low <= np.mean(list(MEANS.values())) <= now.high, name
        assert diff.low > 0, name  # always b is better than uniform, and the interval says so
        assert target.effective_sample_size == pytest.approx(300, abs=40)


def test_feedback_changes_the_reward_an_episode_is_evaluated_with() -> None:
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    logged_uniformly(store, 20)
    first = Score.from_dict(store.get_score("ep-0", AGENT))  # type: ignore[arg-type]
    changed = 1.0 - first.reward
    store.put_score(make_score("ep-0", id="ep-0~r1", agent_id=AGENT, action_id=first.action_id,
                               probability=1 / 3, revision=1, reward=changed, reward_delta=changed - first.reward))
    current = load_current(store, AGENT)
    assert current is not None
    logged = cf.read_logged(store, current)
    assert len(logged.logs) == 20 and logged.logs.rewards[0] == changed
    since = cf.read_logged(store, current, since=BASE_TIME + timedelta(seconds=15))
    assert len(since.logs) == 5
    with pytest.raises(NotFound, match=r"^--since: 'what-if' has 1 scored episodes since"):
        cf.read_logged(store, current, since=BASE_TIME + timedelta(seconds=19))


def test_only_the_newest_limit_episodes_are_held_while_every_score_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    logged_uniformly(store, 2_500)
    current = load_current(store, AGENT)
    assert current is not None
    held: list[int] = []

    class Counted(cf.OrderedDict):  # type: ignore[misc,type-arg]
        def __setitem__(self, key: str, value: object) -> None:
            super().__setitem__(key, value)
            held.append(len(self))

    monkeypatch.setattr(cf, "OrderedDict", Counted)
    read: list[int] = []
    logged = cf.read_logged(store, current, limit=300, progress=read.append)
    assert len(logged.logs) == 300 and logged.truncated and logged.first == BASE_TIME + timedelta(seconds=2_200)
    assert read == [1_000, 2_000, 2_500] and max(held) == 301  # memory: never more than one over the limit


def test_episodes_of_a_removed_action_count_with_weight_zero_not_left_out() -> None:
    """A third of the episodes were of ``c``, which a revision removed: no target chooses it, so
    they weigh 0. Left out, IPS divided by the other two thirds and put "always b" at 1.2."""
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    logged_uniformly(store, 1500)
    revise(store, AGENT, [Action(id="a"), Action(id="b")])
    current = load_current(store, AGENT)
    assert current is not None
    logged = cf.read_logged(store, current)
    assert len(logged.logs) == 1500 and logged.skipped > 400
    result = cf.compare_to_current(logged, current, cf.always(current, "b"), "always b")
    now = (MEANS["a"] + MEANS["b"]) / 2  # the current version: a and b equally
    for name, (target, current_estimate, _) in result.estimates.items():
        assert target.low <= MEANS["b"] <= target.high, (name, target)
        assert current_estimate.low <= now <= current_estimate.high, (name, current_estimate)
    assert any("count with weight 0" in note for note in result.notes)


def test_one_value_of_a_dimension_keeps_the_other_dimensions_as_the_policy_chooses_them() -> None:
    policy = StructuredPolicy.create(
        AGENT, {"prompt": ["short", "long"], "k": [1, 3, 5]}, context={"task": "category"},
        excluded=[{"prompt": "long", "k": "5"}],
    )
    doc = policy.document.model_copy(update={"logits": [0.4, -0.4, 0.9, 0.0, -0.3]})
    layout = Layout.of(doc)
    reference = StructuredPolicy(doc)
    for context in (None, {"task": "billing"}):
        fixed = cf.always(doc, "prompt=long")(context)
        assert fixed.sum() == pytest.approx(1.0)
        allowed = [(1, 0), (1, 1)]  # long with k=1 or 3 (k=5 is excluded with long)
        for local in itertools.product(range(2), range(3)):
            if local not in allowed:
                assert fixed[joint_index(local, layout.sizes)] == 0.0
        ratio = fixed[joint_index((1, 0), layout.sizes)] / fixed[joint_index((1, 1), layout.sizes)]
        marginal = reference.marginals(context)["k"]
        assert ratio == pytest.approx(marginal["k=1"] / marginal["k=3"])
        whole = cf.of_document(doc)(context)
        for local in itertools.product(range(2), range(3)):
            expected = reference.probability(layout.joint_id(local), context)
            assert whole[joint_index(local, layout.sizes)] == pytest.approx(expected)
    assert cf.uniform(doc)(None).tolist() == pytest.approx([0.2] * 5 + [0.0])
    with pytest.raises(ValueError, match="is not an action"):
        cf.always(doc, "prompt=medium")


def test_a_misspelt_configuration_of_dimensions_is_told_the_form_of_one() -> None:
    doc = StructuredPolicy.create(AGENT, {"prompt": ["short", "long"], "k": [1, 3]}).document
    with pytest.raises(ValueError, match="one value per dimension in this order, joined by ':': 'prompt=short:k=1'"):
        cf.always(doc, "prompt=long,k=3")
    assert cf.always(doc, "prompt=long:k=3")(None).tolist() == [0.0, 0.0, 0.0, 1.0]


def test_a_joint_space_too_large_for_memory_is_evaluated_from_the_logged_configurations_alone() -> None:
    from agent_learning.store.memory import MemoryStore

    # 8 dimensions of 128 values: 128**8 configurations, a joint table of 2**59 bytes
    policy = StructuredPolicy.create(AGENT, {f"d{i}": [f"v{j}" for j in range(128)] for i in range(8)})
    store = MemoryStore()
    create_policy(store, policy.document)
    current = load_current(store, AGENT)
    assert current is not None
    layout = Layout.of(current)
    rng = random.Random(3)
    for i in range(40):
        local = [rng.randrange(128) for _ in range(8)]
        store.put_score(make_score(f"ep-{i}", agent_id=AGENT, action_id=layout.joint_id(local),
                                   probability=128.0**-8, reward=rng.random(), scored_at=BASE_TIME))
    logged = cf.read_logged(store, current)
    result = cf.compare_to_current(logged, current, cf.uniform(current), "uniform")
    assert set(result.estimates) == {"ips", "snips"}
    target, now, _ = result.estimates["snips"]
    assert target.value == pytest.approx(now.value)  # uniform is the current version
    assert any(note.startswith("dr: not estimated") and "--since" not in note for note in result.notes)


def test_the_probabilities_of_logged_configurations_alone_are_the_joint_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_learning.store.memory import MemoryStore

    policy = StructuredPolicy.create(
        AGENT, {"prompt": ["short", "long"], "k": [1, 3, 5]}, context={"task": "category"},
        excluded=[{"prompt": "long", "k": "5"}],
    )
    doc = policy.document.model_copy(update={"logits": [0.4, -0.4, 0.9, 0.0, -0.3]})
    store = MemoryStore()
    create_policy(store, doc)
    current = load_current(store, AGENT)
    assert current is not None
    rng = random.Random(5)
    for i in range(60):
        action = rng.choice(["prompt=short:k=1", "prompt=long:k=3", "prompt=short:k=5", "prompt=long:k=1"])
        store.put_score(make_score(f"ep-{i}", agent_id=AGENT, action_id=action, probability=0.2,
                                   reward=rng.random(), context={"task": rng.choice(["a", "b", "c"])}))
    logged = cf.read_logged(store, current)
    for target in (cf.of_document(current), cf.always(current, "prompt=long"), cf.uniform(current),
                   cf.always(current, "prompt=long:k=3")):
        whole = cf.target_of(logged, target)
        monkeypatch.setattr(cf, "MAX_TABLE_CELLS", 0)
        alone = cf.target_of(logged, target)
        monkeypatch.undo()
        assert whole.table is not None and alone.table is None
        assert alone.chosen(logged.logs) == pytest.approx(whole.chosen(logged.logs))


def test_the_span_of_scoring_times_holds_an_episode_re_scored_after_the_others() -> None:
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    logged_uniformly(store, 5)
    first = Score.from_dict(store.get_score("ep-0", AGENT))  # type: ignore[arg-type]
    later = BASE_TIME + timedelta(days=3)  # re-scored in place: its row keeps its place, not its time
    store.put_score(first.model_copy(update={"scored_at": later}))
    current = load_current(store, AGENT)
    assert current is not None
    logged = cf.read_logged(store, current)
    assert (logged.first, logged.last) == (BASE_TIME + timedelta(seconds=1), later)


def test_rewards_of_one_reward_function_are_estimated_the_newest_scores(store: Store) -> None:
    """Before the fix, episodes re-scored with other reward weights were averaged with the others,
    rewards on two scales in one estimate."""
    logged_uniformly(store, 30)
    current = load_current(store, AGENT)
    assert current is not None
    later = BASE_TIME + timedelta(days=1)
    for i in range(10):  # re-scored in place with another reward function: its scale, not the others'
        first = Score.from_dict(store.get_score(f"ep-{i}", AGENT))  # type: ignore[arg-type]
        info = first.reward_function.model_copy(update={"version": "heavier-penalties"})
        store.put_score(first.model_copy(update={"reward": first.reward / 2 - 0.75, "reward_function": info,
                                                 "scored_at": later}))
    logged = cf.read_logged(store, current)
    assert (len(logged.logs), logged.reward_function, logged.other_rewards) == (10, "heavier-penalties",
                                                                                {"test-reward": 20})
    assert logged.logs.rewards.max() < 0
    result = cf.compare_to_current(logged, current, cf.uniform(current), "uniform")
    assert any("reward function heavier-penalties" in n and "20 of test-reward" in n for n in result.notes)
    # an episode whose feedback was applied to the reward it was learned with: that reward's function
    first = Score.from_dict(store.get_score("ep-0", AGENT))  # type: ignore[arg-type]
    store.put_score(make_score("ep-0", id="ep-0~r1", agent_id=AGENT, action_id=first.action_id, probability=1 / 3,
                               revision=1, reward=1.0, reward_delta=0.5, scored_at=later + timedelta(hours=1)))
    logged = cf.read_logged(store, current)
    assert len(logged.logs) == 9 and logged.other_rewards == {"test-reward": 21}
    one = Score.from_dict(store.get_score("ep-5", AGENT))  # type: ignore[arg-type]  # one more change of weights
    info = one.reward_function.model_copy(update={"version": "third"})
    store.put_score(one.model_copy(update={"reward_function": info, "scored_at": later + timedelta(days=1)}))
    alone = r"has 1 scored episodes with a reward of reward function third \(the newest; 29 of other reward functions"
    with pytest.raises(NotFound, match=alone + r" are not comparable\); an estimate needs at least 2"):
        cf.read_logged(store, current)


def test_a_target_relying_on_rarely_logged_actions_is_marked_unreliable() -> None:
    """A target on an action the log took at 1%: its intervals covered 16–88% at n ≤ 1,000 while the
    effective sample size looked fine, and nothing warned."""
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    create_policy(store, make_policy_doc(AGENT, kind="current", actions=ACTIONS, logits=[0.0, 0.0, 0.0]))
    rng = random.Random(1)
    shares = {"a": 0.495, "b": 0.01, "c": 0.495}
    for i in range(300):
        action = rng.choices(ACTIONS, list(shares.values()))[0]
        store.put_score(make_score(f"ep-{i}", agent_id=AGENT, action_id=action, probability=shares[action],
                                   reward=float(rng.random() < MEANS[action])))
    current = load_current(store, AGENT)
    assert current is not None
    result = cf.compare_to_current(cf.read_logged(store, current), current, cf.always(current, "b"), "always b")
    assert any(note.startswith("unreliable:") for note in result.notes), result.notes
    diagnostics = result.to_dict()["estimates"]["snips"]["target"]["diagnostics"]
    assert diagnostics["reliable"] is False and diagnostics["max_weight"] > 50
    ordinary = cf.compare_to_current(cf.read_logged(store, current), current, cf.always(current, "a"), "always a")
    assert not any(note.startswith("unreliable:") for note in ordinary.notes), ordinary.notes
    assert ordinary.to_dict()["estimates"]["snips"]["target"]["diagnostics"]["reliable"] is True
