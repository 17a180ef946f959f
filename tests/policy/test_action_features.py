"""Actions described by features, and the actions a request offers: the document, choose among the
offered, the learner's new blocks and the trainer and guardrail on episodes that offered candidates."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
from support.factories import make_episode, make_score

from agent_learning.agent.client import PolicyClient
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import MAX_CANDIDATES, Candidate, Episode, PolicyDocument, stored_policy
from agent_learning.evaluation import chosen_probabilities, toward
from agent_learning.evaluation.counterfactual import always, compare_to_current, of_document, read_logged
from agent_learning.learning.reinforce import Reinforce, Rows, gradient, prepare, surrogate
from agent_learning.pipeline import create_policy, train_agent
from agent_learning.pipeline.train import collect
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store.memory import MemoryStore

COLOURS = ("red", "blue", "green")


def catalogue(n: int = 6) -> list[dict[str, Any]]:
    """Actions a0… with a colour and a size each."""
    return [{"id": f"a{i}", "features": {"colour": COLOURS[i % 3], "size": "s" if i < n // 2 else "l"}}
            for i in range(n)]


def featured(**kwargs: Any) -> SoftmaxPolicy:
    return SoftmaxPolicy.from_actions(
        "shop", catalogue(), context={"mood": "category"}, action_features=["colour", "size"], **kwargs
    )


def good_colour(mood: str) -> str:
    return "red" if mood == "happy" else "blue"


def train(doc: PolicyDocument, batches: int, seed: int = 0, new_from: int | None = None) -> PolicyDocument:
    """``doc`` after ``batches`` updates on requests that offer 4 of its actions (and, from batch
    ``new_from``, one new red action each batch): the good colour pays 0.8 of the time, the others 0.3."""
    rng = random.Random(seed)
    learner = Reinforce()
    for b in range(batches):
        policy = SoftmaxPolicy(doc, rng=random.Random(seed * 1000 + b))
        rows: dict[str, list[Any]] = {k: [] for k in ("actions", "rewards", "probs", "contexts", "candidates")}
        for _ in range(100):
            mood = rng.choice(["happy", "sad"])
            offered: list[Any] = rng.sample(list(policy.actions[:6]), 4)
            if new_from is not None and b >= new_from:
                offered.append({"id": f"new{b}", "features": {"colour": "red", "size": "s"}})
            d = policy.choose(context={"mood": mood}, actions=offered)
            colour = (d.candidates or ())[d.index].features["colour"]
            rows["actions"].append((d.index,))
            rows["rewards"].append(float(rng.random() < (0.8 if colour == good_colour(mood) else 0.3)))
            rows["probs"].append(d.probability)
            rows["contexts"].append(d.context)
            rows["candidates"].append(list(d.candidates or ()))
        doc = learner.learn(doc, Rows(rows["actions"], rows["rewards"], rows["probs"], [False] * 100,
                                      rows["contexts"], rows["candidates"])).applied_to(doc)
    return doc


@pytest.fixture(scope="module")
def learned() -> PolicyDocument:
    """A policy trained for 12 batches (shared: one training for every test that reads it)."""
    return train(featured().document, 12)


def test_a_new_action_with_the_features_of_a_good_one_is_likely_at_once(learned: PolicyDocument) -> None:
    policy = SoftmaxPolicy(learned)
    for mood in ("happy", "sad"):
        good = good_colour(mood)
        offered = [
            {"id": "never-seen-good", "features": {"colour": good, "size": "l"}},
            {"id": "never-seen-bad", "features": {"colour": "green", "size": "l"}},
            *(a for a in catalogue() if a["features"]["colour"] != good),
        ]
        probs = dict(zip([a["id"] for a in offered], policy.offered_probabilities(policy.offered(offered),
                                                                                  {"mood": mood}), strict=True))
        assert max(probs, key=probs.__getitem__) == "never-seen-good", (mood, probs)
        assert probs["never-seen-good"] > 0.5, (mood, probs)
        # an id never seen ranks by its features: the bad colour below the good
        assert probs["never-seen-bad"] < probs["never-seen-good"] / 5, (mood, probs)


def test_a_policy_without_features_ranks_a_new_action_as_it_knows_nothing() -> None:
    """The control: without action features a new id is scored 0, whatever its features say."""
    plain = SoftmaxPolicy.from_actions("shop", [a["id"] for a in catalogue()], context={"mood": "category"})
    offered = [{"id": "x", "features": {"colour": "red"}}, {"id": "y", "features": {"colour": "green"}}]
    assert plain.offered_probabilities(plain.offered(offered), {"mood": "happy"}) == pytest.approx([0.5, 0.5])


def test_the_learner_keeps_the_new_actions_offered_and_learns_them(learned: PolicyDocument) -> None:
    doc = train(learned, 3, seed=1, new_from=0)
    ids = doc.action_ids
    assert ids[:6] == [a["id"] for a in catalogue()] and {"new0", "new1", "new2"} <= set(ids[6:])
    assert len(doc.logits) == len(ids)
    new = next(a for a in doc.actions if a.id == "new0")
    assert new.features == {"colour": "red", "size": "s"}
    assert len(doc.learner_state["count"]) == len(ids)  # the evidence grew with the actions
    # the next update reads that state as its own (no reset)
    again = train(doc, 1, seed=2)
    assert again.version == doc.version and len(again.learner_state["count"]) == len(again.actions)


def test_the_probability_is_the_actions_among_those_offered() -> None:
    doc = featured(exploration_floor=0.01).document
    doc = PolicyDocument.from_dict({**doc.to_dict(), "logits": [1.0, 0.0, -1.0, 0.5, 0.0, 0.0],
                                    "action_features": [{"name": "colour", "weights": {"red": 0.5, "blue": -0.5}}]})
    policy = SoftmaxPolicy(doc, rng=random.Random(3))
    offered = ["a0", "a2", {"id": "n", "features": {"colour": "blue"}}]
    logits = [1.0 + 0.5, -1.0 + 0.0, 0.0 - 0.5]  # a0 red, a2 green (no weight), n blue and never seen
    exps = [math.exp(x) for x in logits]
    want = [0.01 + (1 - 3 * 0.01) * e / sum(exps) for e in exps]
    counts: Counter[str] = Counter()
    for _ in range(20_000):
        d = policy.choose(context={"mood": "happy"}, actions=offered)
        assert d.probability == pytest.approx(want[d.index], rel=1e-12)
        assert [c.id for c in d.candidates or ()] == ["a0", "a2", "n"]
        counts[d.action_id] += 1
    for i, action_id in enumerate(["a0", "a2", "n"]):
        assert counts[action_id] / 20_000 == pytest.approx(want[i], abs=0.012)
    assert policy.probability("n", {"mood": "happy"}, candidates=d.candidates) == pytest.approx(want[2])
    assert policy.probability("a1", {"mood": "happy"}, candidates=d.candidates) == 0.0
    # more offered than the policy has: the floor shrinks so that what it spreads stays K·f
    many = [{"id": f"x{i}"} for i in range(40)]
    assert min(policy.offered_probabilities(policy.offered(many))) == pytest.approx(0.01 * 6 / 40 + (1 - 0.06) / 40)


def test_the_episode_logs_the_candidates_and_the_guardrail_recomputes_among_them() -> None:
    policy = featured(seed=4)
    d = policy.choose(context={"mood": "sad"}, actions=["a1", {"id": "n", "features": {"colour": "red"}}])
    episode = make_episode(agent_id="shop", action_id=d.action_id, probability=d.probability,
                           candidates=[c.model_dump() for c in d.candidates or ()], context=d.context)
    assert [c.id for c in episode.candidates or ()] == ["a1", "n"]
    assert "candidates" not in make_episode().to_dict()  # written only when set
    with pytest.raises(InvalidDocument, match="candidates: the action chosen, 'a0', is not among them"):
        Episode.from_dict({**make_episode().to_dict(), "action_id": "a0", "candidates": [{"id": "a1"}]})
    got = chosen_probabilities(policy.document, [(d.index,), (2,)], [d.context, None], [list(d.candidates or ()), None])
    assert got == pytest.approx([d.probability, policy.probability("a2")])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.choose(actions=[{"id": "x", "features": {"colour": 1.5}}]), r"actions\[0\]\.features"),
        (lambda p: p.choose(actions=["a0", "a1", "a0"]), r"actions\[2\]\.id: 'a0' is offered twice"),
        (lambda p: p.choose(actions=[]), "actions: offers 0 actions"),
        (lambda p: p.choose(actions=[f"x{i}" for i in range(MAX_CANDIDATES + 1)]), "actions: offers 51"),
        (lambda p: p.offered(["a0", "a1"], excluded=["a2"]), r"excluded\[0\]: 'a2' is not offered"),
        (lambda p: p.offered(["a0"], excluded=["a0"]), "excluded: excludes every action offered"),
        (lambda p: SoftmaxPolicy.from_actions("b", [{"id": "x", "features": {"c": [1]}}]), r"actions\[0\]\.features"),
    ],
)
def test_bad_actions_and_features_are_refused_naming_the_field(call: Any, field: str) -> None:
    with pytest.raises(InvalidDocument, match=field):
        call(featured())


def test_the_document_round_trips_and_refuses_what_does_not_fit() -> None:
    doc = featured().document
    stored = {**doc.to_dict(), "action_features": [
        {"name": "colour", "weights": {"red": 0.25, "blue": -0.5}, "by_context": {"mood": {"happy": {"red": 1.0}}}},
        {"name": "size", "weights": {}},
    ]}
    again = PolicyDocument.from_dict(stored)
    assert PolicyDocument.from_dict(again.to_dict()) == again
    assert SoftmaxPolicy(again).to_document(created_at=again.created_at).action_features == again.action_features
    bad = [
        ({"action_features": [{"name": "colour", "by_context": {"weather": {}}}]},
         "action_features.colour.by_context: 'weather' is not a category feature"),
        ({"action_features": [{"name": "colour", "weights": {"red": 1.0},
                               "by_context": {"mood": {"h": {"pink": 1.0}}}}]},
         r"by_context.mood.h: \['pink'\] are not values in weights"),
        ({"action_features": [{"name": "colour"}, {"name": "colour"}]}, "action_features: duplicate names"),
        ({"actions": [{"id": "a", "features": {"colour": 0.5}}], "logits": [0.0]},
         r"actions\[0\]\.features\.colour: must be a category"),
    ]
    for change, problem in bad:
        with pytest.raises(InvalidDocument, match=problem):
            PolicyDocument.from_dict({**stored, **change})
    structured = SoftmaxPolicy.create("s", {"prompt": ["a", "b"]}).document.to_dict()
    with pytest.raises(InvalidDocument, match="action_features: only a flat list"):
        PolicyDocument.from_dict({**structured, "action_features": [{"name": "colour"}]})


def test_the_gradient_of_the_action_feature_blocks_is_exact_by_finite_differences() -> None:
    rng = np.random.default_rng(5)
    doc = PolicyDocument.from_dict({**featured().document.to_dict(), "temperature": 0.7})
    pool = [Candidate(**a) for a in catalogue()] + [
        Candidate(id=f"n{i}", features={"colour": ["red", "pink"][i % 2], "size": "l"}) for i in range(3)]
    n = 120
    candidates: list[list[Candidate] | None] = []
    actions = []
    for i in range(n):
        k = int(rng.integers(2, len(pool) + 1))
        offered = [pool[j] for j in rng.choice(len(pool), k, replace=False)]
        candidates.append(offered if i % 5 else None)  # some rows chose among the policy's own
        actions.append((int(rng.integers(0, k if i % 5 else 6)),))
    contexts = [{"mood": str(rng.choice(["happy", "sad"]))} for _ in range(n)]
    model, params, batch = prepare(doc, Rows(actions, rng.normal(size=n), rng.uniform(0.05, 0.3, n), [False] * n,
                                             contexts, candidates))
    assert len(params.theta) == 9 and params.action.size == 6 and params.action_offsets[0].shape == (2, 6)
    params = params.with_flat(rng.normal(0, 0.5, params.flat().size))
    w, adv = rng.uniform(0.5, 2.0, n), rng.normal(size=n)
    analytic = gradient(params, model, batch, w, adv, 0.01).flat()
    x0, eps = params.flat(), 1e-6
    numeric = np.array([
        (surrogate(params.with_flat(x0 + eps * e), model, batch, w, adv, 0.01)
         - surrogate(params.with_flat(x0 - eps * e), model, batch, w, adv, 0.01)) / (2 * eps)
        for e in np.eye(len(x0))
    ])
    np.testing.assert_allclose(analytic, numeric, atol=1e-8)
    feature_part = slice(len(x0) - params.action.size - 12, len(x0))
    assert np.abs(analytic[feature_part]).max() > 1e-3  # the new blocks are not trivially zero


def test_the_trainer_learns_scores_of_offered_actions_and_the_guardrail_shrinks_towards_them(
    learned: PolicyDocument,
) -> None:
    store = MemoryStore()
    create_policy(store, featured(exploration_floor=0.01).document)
    client = PolicyClient(store, "shop", rng=random.Random(2), refresh_seconds=0)
    rng = random.Random(3)
    for i in range(200):
        mood = rng.choice(["happy", "sad"])
        d = client.choose(context={"mood": mood}, actions=["a0", "a1", {"id": "new", "features": {"colour": "red"}}])
        colour = {"a0": "red", "a1": "blue", "new": "red"}[d.action_id]
        store.add_score(make_score(f"ep-{i}", agent_id="shop", action_id=d.action_id, probability=d.probability,
                                   context=d.context, candidates=[c.model_dump() for c in d.candidates or ()],
                                   reward=float(colour == good_colour(mood)), incarnation=d.incarnation))
    outcome = train_agent("shop", store, Reinforce())
    assert outcome.status == "published", outcome.reason
    assert outcome.run is not None and outcome.run.episodes == 200 and not outcome.run.skipped
    trained = PolicyDocument.from_dict(store.get_current_policy("shop").doc)
    assert "new" in trained.action_ids
    weights = (trained.action_features or [])[0].weights
    assert set(weights) == {"red", "blue", "green"}
    logged = read_logged(store, trained)  # agent-learn evaluate: each episode among what it was offered
    assert logged.universe is not None and "new" in logged.universe and len(logged.logs) == 200
    first = of_document(stored_policy(store.get_policy_version("shop", 1)))  # another set of actions: offers decide
    on_policy = compare_to_current(logged, trained, first, "v1")
    snips, _, _ = on_policy.estimates["snips"]  # v1 chose every logged episode: its weights are all 1
    assert snips.value == pytest.approx(float(np.mean(logged.logs.rewards)))
    baseline, _, _ = compare_to_current(logged, trained, always(trained, "a0"), "a0").estimates["snips"]
    assert baseline.value == pytest.approx(float(np.mean([r for a, r in zip(logged.logs.actions, logged.logs.rewards,
                                                                             strict=True) if a == 0])))
    half = toward(featured().document, trained, 0.5)  # the guardrail's shrunk step: new actions from 0
    assert half.logits == pytest.approx([x / 2 for x in trained.logits])
    assert (half.action_features or [])[0].weights["red"] == pytest.approx(weights["red"] / 2)
    offered = [{"id": "a0"}, {"id": "brand-new", "features": {"colour": "red"}}]
    score = make_score("ep-x", agent_id="shop", action_id="brand-new", candidates=offered,
                       incarnation=trained.incarnation)
    batch = collect("shop", [{**score.to_dict(), "seq": 1}], trained)  # an id the policy lacks: learned, not skipped
    assert batch.actions == [(1,)] and not batch.skipped and [c.id for c in batch.candidates[0] or ()] == [
        "a0", "brand-new"]
