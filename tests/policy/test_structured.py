"""Structured and contextual policies: the document, choose, the learner's math and training."""

from __future__ import annotations

import enum
import json
import math
import random
from collections import Counter
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from support.factories import BASE_TIME, make_score

from agent_learning.agent.client import PolicyClient
from agent_learning.core.errors import AlreadyExists, InvalidDocument
from agent_learning.documents import MAX_CONTEXT_FEATURES, MAX_LEARNED_VALUES, PolicyDocument
from agent_learning.learning.reinforce import (
    NUMBER_FIT_EPISODES,
    PENDING_NUMBERS,
    Batch,
    Evidence,
    LearnerConfig,
    Reinforce,
    Rows,
    StructuredReinforce,
    gradient,
    learn_structured,
    log_p_best,
    prepare,
    surrogate,
)
from agent_learning.pipeline import create_policy, train_agent
from agent_learning.policy.softmax import (
    Layout,
    SoftmaxPolicy,
    StructuredPolicy,
    knows_action,
    load_policy,
    policy_probabilities,
    served_entropy,
)
from agent_learning.store.base import Store
from agent_learning.store.memory import MemoryStore

DIMENSIONS = {"prompt": ["concise", "detailed", "steps"], "retrieval_k": [1, 3, 5, 10]}


def policy(**kwargs: Any) -> StructuredPolicy:
    """A uniform policy over DIMENSIONS; without a floor unless given, so the learner's own bounds show."""
    return StructuredPolicy.create("bot", DIMENSIONS, seed=3, **{"exploration_floor": 0.0, **kwargs})


def trained(doc: PolicyDocument, rng: np.random.Generator, n: int = 400) -> PolicyDocument:
    """``doc`` after one update on random rows (so that offsets and weights are not zero)."""
    layout_sizes = [d.size for d in doc.dimensions or []]
    actions = np.stack([rng.integers(0, k, n) for k in layout_sizes], axis=1)
    contexts = [
        {"task": str(rng.choice(["billing", "tech", "sales"])), "tokens": float(rng.normal(500, 200))} for _ in range(n)
    ]
    rewards = rng.normal(0.0, 1.0, n) + 0.5 * (actions[:, 0] == 1)
    update = learn_structured(
        LearnerConfig(), doc, Rows(actions, rewards, rng.uniform(0.02, 0.2, n), [False] * n, contexts)
    )
    return update.applied_to(doc)


# --------------------------------------------------------------------------- the document


def test_a_structured_policy_is_schema_2_and_a_flat_one_stays_schema_1_without_new_fields() -> None:
    doc = policy(context={"task": "category"}).document
    data = json.loads(doc.to_json())
    assert data["schema_version"] == 2
    assert [a["id"] for a in data["actions"]][:4] == [
        "prompt=concise",
        "prompt=detailed",
        "prompt=steps",
        "retrieval_k=1",
    ]
    assert data["dimensions"] == [{"name": "prompt", "size": 3}, {"name": "retrieval_k", "size": 4}]
    assert PolicyDocument.from_json(doc.to_json()) == doc
    flat = json.loads(SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=None).to_json())
    assert flat["schema_version"] == 1 and not {"dimensions", "features", "excluded"} & set(flat)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.update(dimensions=[{"name": "prompt", "size": 3}]), "dimensions"),
        (lambda d: d.update(excluded=[{"prompt": "long"}]), "excluded[0].prompt"),
        (lambda d: d.update(excluded=[{"model": "x"}]), "excluded[0]"),
        (lambda d: d.update(excluded=[{}]), "excluded[0]"),
        (lambda d: d.update(excluded=[{"prompt": p} for p in ("concise", "detailed", "steps")]), "excluded"),
        (lambda d: d.update(schema_version=1), "schema_version"),
        (lambda d: d.update(exploration_floor=0.25), "exploration_floor"),
        (
            lambda d: d.update(features=[{"name": "task", "kind": "category", "segments": {"x": [0.0]}}]),
            "features.task.segments.x",
        ),
        (
            lambda d: d.update(features=[{"name": "task", "kind": "category", "weights": [0.0] * 7}]),
            "features[0].weights",
        ),
        # a name no context can carry (contexts' names are checked whole): the feature would never apply
        (lambda d: d.update(features=[{"name": "task type", "kind": "category"}]), "features[0].name"),
    ],
)
def test_inconsistent_structured_documents_are_refused_naming_the_field(change: Any, field: str) -> None:
    data = policy().document.to_dict()
    change(data)
    with pytest.raises(InvalidDocument) as err:
        PolicyDocument.from_dict(data)
    assert any(path == field for path, _ in err.value.problems), err.value.problems


def test_create_names_the_bad_dimension_or_context() -> None:
    with pytest.raises(InvalidDocument, match=r"dimensions\.prompt"):
        StructuredPolicy.create("bot", {"prompt": []})
    with pytest.raises(InvalidDocument, match=r"dimensions\.k"):
        StructuredPolicy.create("bot", {"k": [1, math.nan]})
    with pytest.raises(InvalidDocument, match="is not a feature name"):
        StructuredPolicy.create("bot", DIMENSIONS, context={"task type": "category"})


def test_a_dimension_lists_each_value_once_as_json_compares_them() -> None:
    """1 and 1.0 are one JSON number (two actions with one configuration); true and 1 are not."""
    with pytest.raises(InvalidDocument, match=r"dimensions\.k: the values 1 and 1\.0 are the same value"):
        StructuredPolicy.create("bot", {"k": [1, 1.0]})
    with pytest.raises(InvalidDocument, match=r"dimensions\.k: the values 1 and '1' both make the action id 'k=1'"):
        StructuredPolicy.create("bot", {"k": [1, "1"]})
    both = StructuredPolicy.create("bot", {"k": [True, 1]})
    assert [a.config for a in both.actions] == [{"k": True}, {"k": 1}]


@pytest.mark.parametrize("numeric", [MAX_CONTEXT_FEATURES // 2, 0], ids=["half-numeric", "all-categorical"])
def test_4_dimensions_of_10_values_and_20_features_fit_in_64_kb_after_training(numeric: int) -> None:
    """Half the features numeric (every segment learned), or all categorical (learned up to the
    budget of context parameters: (segments + numeric features) × 40 values ≤ 2,048)."""
    categorical = MAX_CONTEXT_FEATURES - numeric
    dims = {f"d{i}": [f"value-{j}" for j in range(10)] for i in range(4)}
    context = {f"c{i}": "category" for i in range(categorical)} | {f"n{i}": "number" for i in range(numeric)}
    doc = StructuredPolicy.create("bot", dims, context=context).document
    rng = np.random.default_rng(0)
    n = 4000
    contexts = [
        {
            **{f"c{i}": f"seg-{rng.integers(4)}" for i in range(categorical)},
            **{f"n{i}": float(rng.normal()) for i in range(numeric)},
        }
        for _ in range(n)
    ]
    actions = rng.integers(0, 10, (n, 4))
    update = learn_structured(
        LearnerConfig(), doc, Rows(actions, rng.normal(size=n), np.full(n, 1e-4), [False] * n, contexts)
    )
    new = update.applied_to(doc)
    segments = [len(f.segments or {}) for f in new.features or [] if f.kind == "category"]
    assert sum(segments) == min(4 * categorical, MAX_LEARNED_VALUES // 40 - numeric)
    assert "recent" in (new.learner_state or {})  # the change test's sums are part of the size
    size = len(new.to_json().encode())
    print(f"4 dimensions x 10 values, {categorical} categorical + {numeric} numeric features: {size:,} bytes")
    assert size < 64 * 1024, size


# --------------------------------------------------------------------------- choosing


def chi_square_threshold(df: int) -> float:
    """The 0.999 quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    z = 3.090232
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("context", [None, {"task": "billing", "tokens": 900.0}, {"task": "tech"}])
def test_choose_draws_each_configuration_with_its_stated_probability(context: dict[str, Any] | None) -> None:
    doc = trained(
        policy(
            context={"task": "category", "tokens": "number"}, excluded=[{"prompt": "concise", "retrieval_k": 10}]
        ).document,
        np.random.default_rng(1),
    )
    chooser = StructuredPolicy(doc, rng=random.Random(7))
    n = 60_000
    counts = Counter(chooser.choose(context=context).action_id for _ in range(n))
    assert "prompt=concise:retrieval_k=10" not in counts
    allowed = [f"prompt={p}:retrieval_k={k}" for p in DIMENSIONS["prompt"] for k in DIMENSIONS["retrieval_k"]]
    allowed.remove("prompt=concise:retrieval_k=10")
    probs = {a: chooser.probability(a, context) for a in allowed}
    assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-12)
    stat = sum((counts[a] - n * p) ** 2 / (n * p) for a, p in probs.items())
    assert stat < chi_square_threshold(len(allowed) - 1), (stat, counts, probs)
    decision = chooser.choose(context=context)
    assert decision.probability == pytest.approx(probs[decision.action_id], rel=1e-12)
    assert decision.config == {
        "prompt": decision.action_id.split(":")[0][7:],
        "retrieval_k": int(decision.action_id.split("=")[-1]),
    }


@pytest.mark.parametrize("transform", ["standardise", "log"])
def test_choose_with_numeric_weights_draws_each_configuration_with_its_stated_probability(transform: str) -> None:
    """Without exclusions a numeric feature's terms are added per call (no table): the draws and the
    probability logged are still π(a | x)."""
    base = policy(context={"task": "category", "tokens": "number"}, exploration_floor=0.02).document.to_dict()
    base["features"][1]["transform"] = transform
    doc = trained(PolicyDocument.from_dict(base), np.random.default_rng(1))
    assert doc.features is not None and doc.features[1].weights and doc.features[1].transform == transform
    chooser = StructuredPolicy(doc, rng=random.Random(7))
    context = {"task": "billing", "tokens": 900.0}
    n = 60_000
    counts = Counter(chooser.choose(context=context).action_id for _ in range(n))
    every = [f"prompt={p}:retrieval_k={k}" for p in DIMENSIONS["prompt"] for k in DIMENSIONS["retrieval_k"]]
    probs = {a: chooser.probability(a, context) for a in every}
    stat = sum((counts[a] - n * p) ** 2 / (n * p) for a, p in probs.items())
    assert stat < chi_square_threshold(len(every) - 1), (stat, counts, probs)
    for tokens in (0, 12.5, 900.0, 1e9):
        decision = chooser.choose(context={"task": "tech", "tokens": tokens})
        assert decision.probability == pytest.approx(
            chooser.probability(decision.action_id, {"task": "tech", "tokens": tokens}), rel=1e-12
        )
        assert decision.context == {"task": "tech", "tokens": tokens}


def test_the_context_changes_the_choice_only_through_learned_segments_and_weights() -> None:
    doc = trained(policy(context={"task": "category", "tokens": "number"}).document, np.random.default_rng(2))
    chooser = StructuredPolicy(doc)
    base = chooser.marginals()
    assert chooser.marginals({"task": "never-seen"}) == base
    assert chooser.marginals({"task": "billing"}) != base
    assert chooser.marginals({"tokens": 5_000.0}) == chooser.marginals({"tokens": 1e9})  # clipped at ±4 scales
    with pytest.raises(InvalidDocument, match=r"context\.tokens"):
        chooser.choose(context={"tokens": "many"})


def test_probability_and_marginals_check_the_context_as_choose_does() -> None:
    """They kept a table for any context, unchecked, and choose() then found it there without
    checking: a decision whose context the episode refused, far from the cause."""
    chooser = policy(context={"task": "category"})
    for bad in ({"task": "x" * 1_000}, {"task": ["billing"]}, {"task": ""}):
        with pytest.raises(InvalidDocument, match=r"^invalid context: context\.task: must be a category"):
            chooser.marginals(bad)
        with pytest.raises(InvalidDocument, match=r"^invalid context: context\.task: must be a category"):
            chooser.probability("prompt=concise:retrieval_k=1", bad)
        with pytest.raises(InvalidDocument, match=r"^invalid context: context\.task: must be a category"):
            chooser.choose(context=bad)
    with pytest.raises(InvalidDocument, match=r"^invalid decision: action_id: 5 is not a configuration"):
        chooser.probability(5)  # type: ignore[arg-type]


def test_a_value_that_is_not_a_number_adds_nothing_for_a_numeric_feature() -> None:
    """As the learner reads it. An episode written in another language may log a string or a boolean
    for a numeric feature: the marginals and the entropy the trainer reports (served_entropy) treat
    it as missing; they raised on "many" and read "812" as 812 and True as 1."""
    doc = trained(policy(context={"task": "category", "tokens": "number"}).document, np.random.default_rng(2))
    chooser = StructuredPolicy(doc)
    base = chooser.marginals({"task": "billing"})
    assert chooser.marginals({"task": "billing", "tokens": 812}) != base
    for value in ("many", "812", True):
        assert chooser.marginals({"task": "billing", "tokens": value}) == base
        assert served_entropy(doc, [{"tokens": value}]) == served_entropy(doc, [{}])


@pytest.mark.parametrize("magnitude", [1e300, 1e-12, 5e-321], ids=["near-max", "tiny", "subnormal"])
def test_a_numeric_feature_of_any_finite_magnitude_trains(magnitude: float) -> None:
    """Its centre and scale come from its first batch: values near ±1e308 once overflowed the
    standard deviation (scale inf) and a spread below 5e-10 rounded to scale 0, and either document
    was refused, so every later training of the agent failed on the same episodes."""
    rng = np.random.default_rng(3)
    n = 400
    doc = policy(context={"tokens": "number"}).document
    actions = np.stack([rng.integers(0, d.size, n) for d in doc.dimensions or []], axis=1)
    x = rng.choice([-1.0, 1.0], n) * rng.uniform(1.0, 2.0, n)
    rewards = 0.5 + 0.4 * x * (actions[:, 0] == 0) + rng.normal(0.0, 0.1, n)  # prompt 0 helps as x grows
    rows = Rows(actions, rewards, rng.uniform(0.02, 0.2, n), [False] * n, [{"tokens": v * magnitude} for v in x])
    new = PolicyDocument.from_dict(learn_structured(LearnerConfig(), doc, rows).applied_to(doc).to_dict())
    (feature,) = new.features or []
    assert feature.scale == pytest.approx(float(np.std(x)) * magnitude, rel=1e-6)
    assert abs(feature.center) < feature.scale
    chooser = StructuredPolicy(new)
    low, high = (chooser.marginals({"tokens": s * magnitude})["prompt"]["prompt=concise"] for s in (-1.5, 1.5))
    assert high > low


def test_a_numeric_feature_is_fitted_on_its_first_30_episodes_pooled_over_small_batches() -> None:
    """With batches of 8 the feature waits, unused, until 30 episodes have carried it; its centre
    and scale are then theirs (one episode's batch used to fix scale 1 at that episode's value)."""
    rng = np.random.default_rng(4)
    doc = policy(context={"tokens": "number"}).document
    seen: list[float] = []
    fitted_after = None
    for _ in range(5):
        n = 8
        actions = np.stack([rng.integers(0, d.size, n) for d in doc.dimensions or []], axis=1)
        tokens = [float(t) for t in rng.normal(500.0, 200.0, n)]
        contexts = [{"tokens": t} if i else {} for i, t in enumerate(tokens)]  # one episode without it
        seen += tokens[1:]
        rows = Rows(actions, rng.normal(0.5, 0.2, n), np.full(n, 1 / 12), [False] * n, contexts)
        doc = PolicyDocument.from_dict(learn_structured(LearnerConfig(), doc, rows).applied_to(doc).to_dict())
        (feature,) = doc.features or []
        if len(seen) < NUMBER_FIT_EPISODES:
            assert feature.weights is None and doc.learner_state[PENDING_NUMBERS]["tokens"]["count"] == len(seen)
            assert StructuredPolicy(doc).marginals({"tokens": 100.0}) == StructuredPolicy(doc).marginals()
        else:
            fitted_after = fitted_after or len(seen)
            assert PENDING_NUMBERS not in doc.learner_state
            assert feature.weights is not None and any(feature.weights)
            assert feature.center == pytest.approx(float(np.mean(seen[:fitted_after])), rel=1e-9)
            assert feature.scale == pytest.approx(float(np.std(seen[:fitted_after])), rel=1e-8)
    assert fitted_after == 35  # 5 batches of 7


def test_a_one_dimension_policy_without_context_chooses_as_the_flat_policy() -> None:
    flat = SoftmaxPolicy.from_actions("bot", ["a", "b", "c"]).to_document(created_at=None)
    flat = PolicyDocument.from_dict({**flat.to_dict(), "logits": [0.5, -1.0, 0.5], "exploration_floor": 0.01})
    as_context = PolicyDocument.from_dict(
        {**flat.to_dict(), "schema_version": 2, "features": [{"name": "task", "kind": "category"}]}
    )
    structured = load_policy(as_context, rng=random.Random(5))
    plain = load_policy(flat, rng=random.Random(5))
    assert isinstance(structured, StructuredPolicy) and isinstance(plain, SoftmaxPolicy)
    for _ in range(200):
        a, b = structured.choose(context={"task": "x"}), plain.choose()
        assert (a.action_id, a.config) == (b.action_id, b.config)
        assert a.probability == pytest.approx(b.probability, rel=1e-12)
    assert policy_probabilities(as_context) == pytest.approx(policy_probabilities(flat), rel=1e-12)


def test_configurations_an_agent_can_write_back() -> None:
    doc = policy(excluded=[{"prompt": "steps"}]).document
    assert knows_action(doc, "prompt=concise:retrieval_k=3")
    assert not knows_action(doc, "prompt=steps:retrieval_k=3")
    assert not knows_action(doc, "prompt=concise")
    assert not knows_action(doc, "retrieval_k=3:prompt=concise")


# --------------------------------------------------------------------------- the learner's math


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_one_dimension_without_context_learns_exactly_as_the_flat_learner(temperature: float) -> None:
    rng = np.random.default_rng(4)
    flat = SoftmaxPolicy.from_actions("bot", ["a", "b", "c", "d"]).to_document(created_at=None)
    doc = PolicyDocument.from_dict({**flat.to_dict(), "logits": [0.3, -0.2, 0.5, -0.6], "temperature": temperature})
    as_structured = PolicyDocument.from_dict({**doc.to_dict(), "schema_version": 2, "features": []})
    learner = Reinforce()
    logits, state = np.array(doc.logits), None
    for step in range(4):
        n = 150
        acts, rew, mu = rng.integers(0, 4, n), rng.normal(0.5, 0.3, n), rng.uniform(0.05, 0.6, n)
        flags = np.arange(n) >= n - 5 * (step % 2)  # some batches carry feedback corrections
        flat_update = learner.update(logits, Batch.from_arrays(acts, rew, mu, 4, flags), temperature, state=state)
        structured = learn_structured(learner.config, as_structured, Rows(acts[:, None], rew, mu, flags, [None] * n))
        np.testing.assert_allclose(structured.logits, flat_update.logits, rtol=0, atol=1e-12)
        assert structured.state == flat_update.state
        assert structured.metrics["kl"] == pytest.approx(flat_update.metrics["kl"], rel=1e-9)
        logits, state = flat_update.logits, flat_update.state
        as_structured = PolicyDocument.from_dict(
            {**as_structured.to_dict(), "logits": list(logits), "learner_state": state}
        )


@pytest.mark.parametrize(
    "excluded", [[], [{"prompt": "concise", "retrieval_k": "10"}, {"prompt": "steps", "retrieval_k": "1"}]]
)
def test_the_gradient_is_exact_by_finite_differences(excluded: list[dict[str, str]]) -> None:
    rng = np.random.default_rng(5)
    doc = PolicyDocument.from_dict(
        {
            **policy(context={"task": "category", "tokens": "number"}).document.to_dict(),
            "excluded": excluded or None,
            "temperature": 0.7,
        }
    )
    n = 250
    actions = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n)], axis=1)
    contexts = [{"task": str(rng.choice(["x", "y", "z"])), "tokens": float(rng.normal(100, 30))} for _ in range(n)]
    model, params, batch = prepare(
        doc, Rows(actions, rng.normal(size=n), rng.uniform(0.05, 0.3, n), [False] * n, contexts)
    )
    params = params.with_flat(rng.normal(0, 0.5, params.flat().size))
    w, adv = rng.uniform(0.5, 2.0, n), rng.normal(size=n)
    analytic = gradient(params, model, batch, w, adv, 0.01).flat()
    x0, eps = params.flat(), 1e-6
    numeric = np.array(
        [
            (
                surrogate(params.with_flat(x0 + eps * e), model, batch, w, adv, 0.01)
                - surrogate(params.with_flat(x0 - eps * e), model, batch, w, adv, 0.01)
            )
            / (2 * eps)
            for e in np.eye(len(x0))
        ]
    )
    np.testing.assert_allclose(analytic, numeric, atol=1e-8)
    assert np.abs(analytic).max() > 1e-3  # not trivially zero


def test_a_policy_sure_of_an_excluded_configuration_still_trains() -> None:
    """At T = 0.1 the best prompt and the best retrieval depth, each 8 logits ahead in its
    dimension, form an excluded configuration: 1 − Σ_E Π s_d rounds to 0. The update stays finite
    (a NaN gradient norm made every training run invalid), q stays a probability and the gradient
    is the exact one wherever the exclusions leave mass float64 can resolve."""
    doc = PolicyDocument.from_dict(
        {
            **policy(excluded=[{"prompt": "concise", "retrieval_k": "10"}]).document.to_dict(),
            "temperature": 0.1,
            "logits": [5.33, -2.67, -2.67, -2.0, -2.0, -2.0, 6.0],
        }
    )
    rng = np.random.default_rng(3)
    n = 60
    actions = np.stack([rng.integers(0, 3, n), rng.integers(0, 3, n)], axis=1)  # never the excluded k=10
    rows = Rows(actions, rng.random(n), np.full(n, 0.05), [False] * n, [None] * n)
    update = learn_structured(LearnerConfig(), doc, rows)
    assert np.isfinite(update.logits).all()
    assert all(math.isfinite(value) for value in update.metrics.values()), update.metrics
    model, params, batch = prepare(doc, rows)
    w, _, stats = StructuredReinforce(LearnerConfig()).weights_and_advantages(params, model, batch)
    assert np.all(w <= 1 / 0.05) and stats["max_importance_weight"] <= 1 / 0.05
    g = gradient(params, model, batch, w, np.ones(n), 0.0).flat()
    assert np.isfinite(g).all()


def test_importance_weights_divide_the_learned_joint_probability_by_the_logged_one() -> None:
    rng = np.random.default_rng(6)
    doc = trained(
        policy(
            context={"task": "category", "tokens": "number"}, excluded=[{"prompt": "detailed", "retrieval_k": 5}]
        ).document,
        rng,
    )
    doc = PolicyDocument.from_dict({**doc.to_dict(), "exploration_floor": 0.0})  # q is π without the floor
    chooser = StructuredPolicy(doc, rng=random.Random(1))
    contexts = [
        {"task": t, "tokens": x}
        for t, x in zip(rng.choice(["billing", "tech", "new"], 50), rng.normal(500, 200, 50), strict=True)
    ]
    decisions = [chooser.choose(context=c) for c in contexts]
    logged = rng.uniform(0.01, 0.5, 50)
    actions = [chooser.layout.parse(d.action_id) for d in decisions]
    model, params, batch = prepare(doc, Rows(actions, np.zeros(50), logged, [False] * 50, contexts))
    cfg = LearnerConfig(importance_clip=3.0)
    w, _, stats = StructuredReinforce(cfg).weights_and_advantages(params, model, batch)
    expected = np.minimum([d.probability / mu for d, mu in zip(decisions, logged, strict=True)], 3.0)
    np.testing.assert_allclose(w, expected, rtol=1e-9)
    assert stats["clipped_fraction"] == pytest.approx(float(np.mean(expected >= 3.0)))


def assert_bound_holds(odds: Any) -> None:
    """A huge step without the evidence bound all but rules values out (odds below 1e-3); with
    it, the weakest value keeps odds above 0.005 of the leader's, ten times the unbounded."""
    loose = {"learning_rate": 50.0, "max_kl": None, "max_logit_gap": None}
    unbounded, bounded = odds(LearnerConfig(**loose, gap_per_evidence=None)), odds(LearnerConfig(**loose))
    assert unbounded < 1e-3 and bounded > 0.005 and bounded > 10 * unbounded, (unbounded, bounded)


def test_the_evidence_bound_keeps_each_segment_no_surer_than_its_evidence() -> None:
    """Twenty noisy episodes in a segment cannot make it sure of a prompt; without the bound,
    the same step would all but rule two prompts out there."""
    doc = policy(context={"task": "category"}).document
    rng = np.random.default_rng(8)
    n = 20
    actions = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n)], axis=1)
    rewards = 0.3 * (actions[:, 0] == 0) + rng.normal(0, 1.0, n)
    contexts = [{"task": "rare"}] * n

    def segment_odds(cfg: LearnerConfig) -> float:
        update = learn_structured(cfg, doc, Rows(actions, rewards, np.full(n, 1 / 12), [False] * n, contexts))
        new = update.applied_to(doc)
        prompt = StructuredPolicy(new).marginals({"task": "rare"})["prompt"]
        return min(prompt.values()) / max(prompt.values())

    assert_bound_holds(segment_odds)


def test_when_the_world_changes_every_segment_keeps_as_little_of_the_old_evidence_as_the_policy() -> None:
    """The change test reads the global evidence; when it fires, each segment's cells shrink by
    the share the global evidence kept, so the segments still add up to it."""
    cfg = LearnerConfig(change_threshold=4.0, evidence_half_life=None)
    doc = policy(context={"task": "category"}).document
    rng = np.random.default_rng(11)

    def learn(doc: PolicyDocument, best: int) -> tuple[PolicyDocument, float]:
        n = 200  # uniform draws; prompt `best` pays 0.8, the others 0.4
        actions = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n)], axis=1)
        rewards = (rng.random(n) < np.where(actions[:, 0] == best, 0.8, 0.4)).astype(float)
        contexts = [{"task": str(t)} for t in rng.choice(["billing", "tech"], n)]
        update = learn_structured(cfg, doc, Rows(actions, rewards, np.full(n, 1 / 12), [False] * n, contexts))
        return update.applied_to(doc), update.metrics["change_z"]

    def episodes(doc: PolicyDocument) -> tuple[float, float]:
        """Episodes behind the global evidence and summed over the task's segments."""
        state = doc.learner_state or {}
        cells = state["segments"]["task"].values()
        return sum(state["count"][:3]), sum(sum(count[:3]) for count, _ in cells)

    for _ in range(10):
        doc, z = learn(doc, best=0)
        assert z < 4.0
    assert episodes(doc) == pytest.approx((2_000, 2_000), rel=1e-4)
    zs = []
    while len(zs) < 10 and (not zs or zs[-1] <= 4.0):
        doc, z = learn(doc, best=1)
        zs.append(z)
    assert zs[-1] > 4.0, zs
    global_, segments = episodes(doc)
    assert global_ < 600 and segments == pytest.approx(global_, rel=1e-3)  # ≈ the recent 540 (H_r = 300)


@pytest.mark.parametrize(
    ("named", "actions", "rewards", "corrections"),
    [
        (r"actions\[0\]: must be an integer", [[0.7, 1.2], [2.9, 3.5]], [0.5, 0.1], [False, False]),
        (r"rewards\[0\]: must be a number", [[0, 1], [2, 3]], ["0.5", "0.1"], [False, False]),
        (r"corrections\[0\]: must be a boolean", [[0, 1], [2, 3]], [0.5, 0.1], [2, 0]),
        (r"actions: must be 2 value indices per row", [[0, 1], [2]], [0.5, 0.1], [False, False]),
        (r"actions\[0\]: must be an integer", [(0, 1), (2.0, 3)], [0.5, 0.1], [False, False]),
        (r"actions\[0\]: must be an integer", [(True, False), (False, True)], [0.5, 0.1], [False, False]),
        (r"actions: must be 2 value indices per row", [(0, 1), (2,)], [0.5, 0.1], [False, False]),
        (r"actions: must have shape \(2, 2\)", [b"\x00\x01", b"\x02\x03"], [0.5, 0.1], [False, False]),
        (r"corrections\[0\]: must be a boolean", [(0, 1), (2, 3)], [0.5, 0.1], [0.0, 1.0]),
        (r"actions: must have shape \(2, 2\)", [0, 1], [0.5, 0.1], [False, False]),
        (r"rewards: must have shape \(2,\)", [[0, 1], [2, 3]], [0.5], [False, False]),
    ],
)
def test_rows_of_the_wrong_kind_or_shape_are_named_not_converted(
    named: str, actions: Any, rewards: Any, corrections: Any
) -> None:
    """As the flat learner's batch: 0.7 was silently read as value 0, "0.5" as a reward, 2 as a
    correction flag, and a short column surfaced as a numpy reshape error."""
    rows = Rows(actions, rewards, [0.1, 0.1], corrections, [None, None])
    with pytest.raises(ValueError, match=named):
        learn_structured(LearnerConfig(), policy().document, rows)


def test_no_rows_change_nothing() -> None:
    doc = policy().document
    update = learn_structured(LearnerConfig(), doc, Rows([], [], [], [], []))
    assert list(update.logits) == list(doc.logits) and update.metrics["kl"] == 0.0


def test_a_segment_cell_with_negative_counts_restarts_as_the_global_evidence_would() -> None:
    """Counts are discounted episodes, never negative: a cell edited to negative counts would
    read as a few episodes with means far outside the rewards' range and bound the segment by
    them. Like the global evidence, it is unusable and starts again from this batch."""
    doc = policy(context={"task": "category"}).document
    n = 24
    actions = np.stack([np.arange(n) % 3, np.arange(n) % 4], axis=1)
    rows = Rows(actions, np.linspace(0, 1, n), np.full(n, 1 / 12), [False] * n, [{"task": "a"}] * n)
    fresh = learn_structured(LearnerConfig(), doc, rows)
    count, total = fresh.state["segments"]["task"]["a"]
    broken = {**fresh.state, "segments": {"task": {"a": [[-x for x in count], total]}}}
    update = learn_structured(LearnerConfig(), doc.model_copy(update={"learner_state": broken}), rows)
    assert update.state["segments"]["task"]["a"][0] == pytest.approx(count)


def test_unreadable_recent_sums_restart_alone_and_say_so() -> None:
    doc = policy(context={"task": "category"}).document
    n = 12
    actions = np.stack([np.arange(n) % 3, np.arange(n) % 4], axis=1)
    rows = Rows(actions, np.linspace(0, 1, n), np.full(n, 1 / 12), [False] * n, [{"task": "a"}] * n)
    state = learn_structured(LearnerConfig(), doc, rows).state
    metrics = learn_structured(LearnerConfig(), doc.model_copy(update={"learner_state": state}), rows).metrics
    assert "recent_reset" not in metrics
    broken = doc.model_copy(update={"learner_state": {**state, "recent": {"count": "x"}}})
    update = learn_structured(LearnerConfig(), broken, rows)
    assert update.metrics["recent_reset"] == 1.0 and "state_reset" not in update.metrics
    assert sum(update.state["count"]) == pytest.approx(2 * sum(state["count"]), rel=1e-2)  # the evidence is kept
    assert update.state["recent"]["count"] == state["count"]  # the recent sums hold this batch only


def test_a_burst_of_corrections_does_not_trip_the_change_test_of_a_structured_policy() -> None:
    """As in the flat learner: the recent sums hold judged rewards, and the older side leaves out
    the corrections' part of the global evidence, so late feedback drops no evidence (300
    corrections of -0.5 on one configuration took change_z from 1.2 to 15.8 and dropped 70% of
    the evidence)."""
    doc = policy(context={"task": "category"}).document
    sizes = [d.size for d in doc.dimensions or []]

    def rows(rng: np.random.Generator, n: int, corrections: int = 0) -> Rows:
        actions = np.stack([rng.integers(0, k, n) for k in sizes], axis=1)
        rewards = (rng.random(n) < 0.4 + 0.2 * (actions[:, 0] == 1)).astype(float)
        contexts = [{"task": str(rng.choice(["billing", "tech"]))} for _ in range(n)]
        return Rows(
            np.vstack([actions, np.tile(actions[:1], (corrections, 1))]),
            np.concatenate([rewards, np.full(corrections, -0.5)]),
            np.full(n + corrections, 0.1),
            [False] * n + [True] * corrections,
            contexts + contexts[:1] * corrections,
        )

    rng = np.random.default_rng(7)
    for _ in range(30):
        doc = learn_structured(LearnerConfig(), doc, rows(rng, 60)).applied_to(doc)
    plain = learn_structured(LearnerConfig(), doc, rows(np.random.default_rng(8), 60))
    burst = learn_structured(LearnerConfig(), doc, rows(np.random.default_rng(8), 60, corrections=300))
    assert burst.metrics["change_z"] == pytest.approx(plain.metrics["change_z"], abs=0.3)
    assert sum(burst.state["count"]) == pytest.approx(sum(plain.state["count"]))  # no evidence dropped
    assert burst.state["recent"]["reward_sum"] == pytest.approx(plain.state["recent"]["reward_sum"])
    assert sum(burst.state["recent"]["corrections"]) == pytest.approx(-0.5 * 300 * len(sizes))


def test_each_dimension_keeps_the_thompson_floor_of_its_own_evidence() -> None:
    """k=10 leads with 300 episodes at 0.7, k=3 and k=5 trail closely, k=1's first 8 episodes
    were unlucky and a noisy step pushed it 8 logits down: bounded, it keeps at least e^(−c_T)
    of its Thompson chance relative to the leader, within the retrieval dimension alone (with
    or without context features), c_T being ``dimension_thompson_floor`` in a policy with two
    dimensions; without the Thompson floor it stays below that."""
    rows = Rows(np.zeros((1, 2), dtype=np.int64), np.zeros(1), np.full(1, 1 / 12), [False], [None])
    count = np.array([100.0, 100.0, 100.0, 8.0, 60.0, 60.0, 300.0])  # prompts; k = 1, 3, 5, 10
    means = np.array([0.6, 0.6, 0.6, 0.5, 0.66, 0.67, 0.7])
    evidence = Evidence(count, count * means, count * (means**2 + 0.2))
    sub = Evidence(count[3:], count[3:] * means[3:], count[3:] * (means[3:] ** 2 + 0.2))

    def retrieval_logits(doc: PolicyDocument, cfg: LearnerConfig) -> np.ndarray:
        model, params, _ = prepare(doc, rows)
        params.theta[:] = [0.0, 0.0, 0.0, -6.0, 0.0, 0.0, 2.0]
        segments = [[(np.zeros(7), np.zeros(7))] * o.shape[0] for o in params.offsets]
        StructuredReinforce(cfg).bound_by_evidence(params, model, evidence, segments)
        return params.theta[3:]

    shrunk = sub.shrunk(LearnerConfig().evidence_prior)
    assert shrunk is not None
    log_best = log_p_best(*shrunk)
    c_t = LearnerConfig().dimension_thompson_floor
    assert c_t is not None and c_t < 2.5
    least = math.exp(-c_t + log_best[0] - log_best[3])
    for doc in (policy().document, policy(context={"task": "category"}).document):
        bounded = retrieval_logits(doc, LearnerConfig())
        assert int(np.argmax(bounded)) == 3 and math.exp(bounded[0] - bounded[3]) >= least * (1 - 1e-9)
        flat_c_t = retrieval_logits(doc, LearnerConfig(dimension_thompson_floor=2.5))  # the one-dimension c_T
        assert math.exp(flat_c_t[0] - flat_c_t[3]) < least
        without = retrieval_logits(doc, LearnerConfig(dimension_thompson_floor=None))
        assert math.exp(without[0] - without[3]) < least / 1.5


def test_strong_evidence_makes_each_dimension_lead_with_its_best_evidenced_value() -> None:
    """Without context, each dimension's logits are capped at the posterior odds of its own
    evidence: logits that still favour k=1 after a noisy start, 30 episodes per value saying
    k=10 is better, and k=10 leads. With a context feature the global logits are every
    context's starting point, not one context's policy: only the floor bounds them."""
    rows = Rows(np.zeros((1, 2), dtype=np.int64), np.zeros(1), np.full(1, 1 / 12), [False], [None])
    sums = np.array([15.0, 15.0, 15.0, 15.0, 16.0, 17.0, 22.0])  # prompts alike; k = 1, 3, 5, 10
    evidence = Evidence(np.full(7, 30.0), sums, sums.copy())  # 0/1 rewards: squares sum as rewards

    def retrieval_logits(doc: PolicyDocument, cfg: LearnerConfig) -> tuple[np.ndarray, int]:
        model, params, _ = prepare(doc, rows)
        params.theta[:] = [0.0, 0.0, 0.0, 2.0, 0.0, 0.0, -2.0]
        segments = [[(np.zeros(7), np.zeros(7))] * o.shape[0] for o in params.offsets]
        _, lowered = StructuredReinforce(cfg).bound_by_evidence(params, model, evidence, segments)
        return params.theta[3:], lowered

    contextual = policy(context={"task": "category"}).document
    capped, lowered = retrieval_logits(policy().document, LearnerConfig())
    assert int(np.argmax(capped)) == 3 and lowered >= 1
    sub = Evidence(evidence.count[3:], evidence.reward_sum[3:], evidence.reward_sq_sum[3:])
    z = np.maximum(sub.z_against(3, LearnerConfig().evidence_prior), 0.0)
    odds = np.array([math.erfc(x / math.sqrt(2)) / math.erfc(-x / math.sqrt(2)) for x in z])
    assert np.all(np.exp(capped - capped[3]) <= odds * (1 + 1e-9))
    for doc, cfg in ((policy().document, LearnerConfig(odds_cap=None)), (contextual, LearnerConfig())):
        floor_only, none_lowered = retrieval_logits(doc, cfg)
        assert int(np.argmax(floor_only)) == 0 and none_lowered == 0


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_each_dimension_is_bounded_in_probability_at_the_policy_temperature(temperature: float) -> None:
    """The bounds hold for s_d = softmax(θ_d / T), what the agents draw from: capped, k=1's
    probability relative to k=10's is at most its posterior odds; floored, k=3 (1 episode) keeps
    at least e^(−c)·Φ(−z)/(1 + Σ_b Φ(−z_b)) of k=10's, the calibration of its evidence."""
    rows = Rows(np.zeros((1, 2), dtype=np.int64), np.zeros(1), np.full(1, 1 / 12), [False], [None])
    count = np.array([30.0, 30.0, 30.0, 30.0, 1.0, 30.0, 30.0])  # prompts alike; k = 1, 3, 5, 10
    sums = np.array([15.0, 15.0, 15.0, 15.0, 0.0, 17.0, 22.0])
    evidence = Evidence(count, sums, sums.copy())  # 0/1 rewards: squares sum as rewards
    doc = PolicyDocument.from_dict({**policy().document.to_dict(), "temperature": temperature})
    model, params, _ = prepare(doc, rows)
    params.theta[:] = np.array([0.0, 0.0, 0.0, 2.0, -8.0, 0.0, -2.0]) * temperature
    cfg = LearnerConfig()
    StructuredReinforce(cfg).bound_by_evidence(params, model, evidence, [])
    ratio = np.exp((params.theta[3:] - params.theta[6]) / temperature)
    sub = Evidence(count[3:], sums[3:], sums[3:].copy())
    z = np.maximum(sub.z_against(3, cfg.evidence_prior), 0.0)
    odds = np.array([math.erfc(x / math.sqrt(2)) / math.erfc(-x / math.sqrt(2)) for x in z])
    assert int(np.argmax(ratio)) == 3 and ratio[0] <= odds[0] * (1 + 1e-9)
    assert cfg.calibration is not None
    beats = np.array([0.5 * math.erfc(x / math.sqrt(2)) for x in z])  # Φ(−z): the chance of beating k=10
    assert ratio[1] >= math.exp(-cfg.calibration) * beats[1] / (1 + beats[:3].sum()) * (1 - 1e-9)


# --------------------------------------------------------------------------- training end to end


def best_prompt(task: str) -> str:
    return {"billing": "concise", "tech": "steps"}[task]


def test_the_trainer_learns_a_different_best_prompt_per_task_over_every_store(store: Store) -> None:
    start = policy(context={"task": "category"}, exploration_floor=0.01).document
    create_policy(store, start)
    client = PolicyClient(store, "bot", rng=random.Random(11), refresh_seconds=0)
    rng = random.Random(12)
    n = 0
    for _ in range(12):
        for _ in range(100):
            task = rng.choice(["billing", "tech"])
            decision = client.choose(context={"task": task})
            good = decision.config["prompt"] == best_prompt(task)
            reward = 0.9 * float(rng.random() < (0.8 if good else 0.3)) + 0.1 * (decision.config["retrieval_k"] == 3)
            n += 1
            store.add_score(
                make_score(
                    f"ep-{n}",
                    agent_id="bot",
                    action_id=decision.action_id,
                    probability=decision.probability,
                    reward=reward,
                    context={"task": task},
                    incarnation=decision.incarnation,
                )
            )
        outcome = train_agent("bot", store, Reinforce())
        assert outcome.status == "published", outcome.reason
    final = load_policy(PolicyDocument.from_dict(store.get_current_policy("bot").doc))
    assert isinstance(final, StructuredPolicy)
    for task in ("billing", "tech"):
        marginal = final.marginals({"task": task})["prompt"]
        assert marginal[f"prompt={best_prompt(task)}"] > 0.7, (task, marginal)
    features = final.document.features or []
    assert set(features[0].segments or {}) == {"billing", "tech"}
    assert final.document.run is not None and final.document.run.episodes == 100


def test_a_cached_context_skips_no_check_a_new_feature_or_value_needs() -> None:
    chooser = policy(context={"task": "category", "tier": "category"})
    assert chooser.choose(context={"task": "billing"}).context == {"task": "billing"}
    with pytest.raises(InvalidDocument, match=r"context\.score"):
        chooser.choose(context={"task": "billing", "score": math.nan})
    with pytest.raises(InvalidDocument, match=r"context\.task"):
        chooser.choose(context={"task": ""})
    with pytest.raises(InvalidDocument, match=r"context\.tier"):
        chooser.choose(context={"task": "billing", "tier": None})


def test_a_category_given_as_a_boolean_or_number_meets_its_own_segment_whatever_was_asked_before() -> None:
    """True, 1 and 1.0 are equal to Python but name different segments: a context asked first
    must not decide which segment's probabilities a later one gets."""
    base = StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"vip": "category"}).document
    segments = {"true": [9.0, -9.0], "1": [-9.0, 9.0], "1.0": [-9.0, 9.0]}
    doc = PolicyDocument.from_dict(
        {**base.to_dict(), "features": [{"name": "vip", "kind": "category", "segments": segments}]}
    )
    for order in ((True, 1, 1.0, "true", "1"), ("1", 1.0, 1, "true", True)):
        chooser = StructuredPolicy(doc, rng=random.Random(0))
        for value in order:
            prompt = chooser.choose(context={"vip": value}).config["prompt"]
            assert prompt == ("a" if value is True or value == "true" else "b"), (order, value)


def test_numpy_scalars_in_a_context_are_the_plain_values_they_stand_for() -> None:
    """A context read from a data frame carries numpy scalars: an ``int64`` was refused, and a
    ``float64`` category met the segment ``"np.float64(1.5)"`` while the learner, reading the
    logged JSON, trained the segment ``"1.5"``."""
    base = StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"size": "category"}).document
    segments = {"3": [9.0, -9.0], "1.5": [-9.0, 9.0], "true": [9.0, -9.0]}
    doc = PolicyDocument.from_dict(
        {**base.to_dict(), "features": [{"name": "size", "kind": "category", "segments": segments}]}
    )
    chooser = StructuredPolicy(doc, rng=random.Random(0))
    for value, plain, prompt in ((np.int64(3), 3, "a"), (np.float64(1.5), 1.5, "b"), (np.bool_(True), True, "a")):
        decision = chooser.choose(context={"size": value})
        assert decision.config["prompt"] == prompt, value
        assert decision.context == {"size": plain} and type(decision.context["size"]) is type(plain)
        assert chooser.marginals({"size": value}) == chooser.marginals({"size": plain})

    class Size(str, enum.Enum):  # noqa: UP042 - the mixin whose str() is "Size.THREE", unlike StrEnum's
        THREE = "3"

    assert chooser.choose(context={"size": Size.THREE}).context == {"size": "3"}  # its value, not "Size.THREE"
    with pytest.raises(InvalidDocument, match=r"context\.size: must be a category"):
        chooser.choose(context={"size": np.float64("nan")})
    with pytest.raises(InvalidDocument, match=r"context\.size: must be a category"):
        chooser.choose(context={"size": np.array([1, 2])})


@pytest.mark.parametrize("value", [["billing"], {"nested": {"x": 1}}, {"billing"}])
def test_a_context_value_that_is_not_a_category_or_number_is_named_not_a_crash(value: Any) -> None:
    chooser = policy(context={"task": "category"})
    chooser.choose(context={"task": "billing"})  # a cached table for strings
    with pytest.raises(InvalidDocument, match=r"context\.task"):
        chooser.choose(context={"task": value})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"context": ["task"]}, "context"),
        ({"context": "task"}, "context"),
        ({"excluded": "x"}, "excluded"),
        ({"excluded": {"prompt": "a"}}, "excluded"),
        ({"excluded": [{"prompt": "a"}, "x"]}, r"excluded\[1\]"),
    ],
)
def test_context_and_exclusions_of_the_wrong_shape_are_named(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidDocument, match=named):
        StructuredPolicy.create("bot", {"prompt": ["a", "b"], "k": [1, 3]}, **fields)


@pytest.mark.parametrize(
    ("dimensions", "context", "problem"),
    [
        ({"k": [1, 3]}, {"task": "categroy"}, ("context.task", 'must be "category" or "number", got \'categroy\'')),
        ({"k": [1, 3]}, {"task": 3}, ("context.task", 'must be "category" or "number", got 3')),
        ({"bad dim": [1]}, None, ("dimensions", "'bad dim' is not a dimension name: use a letter or '_' first, "
                                                "then letters, digits or '_', at most 32 characters")),
    ],
)
def test_a_bad_structure_names_the_field_as_written_once(
    dimensions: dict[str, Any], context: dict[str, Any] | None, problem: tuple[str, str]
) -> None:
    with pytest.raises(InvalidDocument) as info:
        StructuredPolicy.create("bot", dimensions, context=context)
    assert info.value.problems == [problem]


def test_a_value_that_makes_no_action_id_is_named_in_its_dimension() -> None:
    with pytest.raises(InvalidDocument) as info:
        StructuredPolicy.create("bot", {"prompt": ["a b", "c"]})
    (field, problem), = info.value.problems
    assert field == "dimensions.prompt" and problem.startswith("the value 'a b' makes the action id 'prompt=a b'")


def test_a_numeric_slope_is_bounded_by_the_evidence_on_each_side_of_its_centre() -> None:
    """A few lucky episodes cannot make the policy sure of an arm at one scale from the centre;
    the state keeps each side's evidence."""
    doc = StructuredPolicy.create("bot", {"arm": [0, 1, 2]}, context={"x": "number"}, exploration_floor=0.0).document
    rng = np.random.default_rng(9)
    n = 30  # NUMBER_FIT_EPISODES: the feature is fitted in this batch
    xs = rng.uniform(-1, 1, n)
    actions = rng.integers(0, 3, (n, 1))
    rewards = np.where((actions[:, 0] == 0) == (xs > 0), 1.0, 0.0) * 0.2 + rng.normal(0, 1.0, n)
    contexts = [{"x": float(x)} for x in xs]

    def odds_at_one_scale(cfg: LearnerConfig) -> float:
        update = learn_structured(cfg, doc, Rows(actions, rewards, np.full(n, 1 / 3), [False] * n, contexts))
        new = update.applied_to(doc)
        feature = (new.features or [])[0]
        assert feature.weights is not None
        assert set(update.state.get("halves", {}).get("x", {})) == (
            {"below", "above"} if cfg.gap_per_evidence else set()
        )
        probs = StructuredPolicy(new).marginals({"x": feature.center + feature.scale})["arm"]
        return min(probs.values()) / max(probs.values())

    assert_bound_holds(odds_at_one_scale)


def test_segments_stop_being_added_when_the_budget_is_spent_and_training_goes_on() -> None:
    """Many segments of many features: the document stays within its limits and valid."""
    dims = {f"d{i}": [f"v{j}" for j in range(10)] for i in range(4)}
    doc = StructuredPolicy.create("bot", dims, context={f"c{i}": "category" for i in range(20)}).document
    rng = np.random.default_rng(3)
    n = 3000
    contexts = [{f"c{i}": f"s{rng.integers(40)}" for i in range(20)} for _ in range(n)]
    for _ in range(2):
        update = learn_structured(
            LearnerConfig(),
            doc,
            Rows(rng.integers(0, 10, (n, 4)), rng.normal(size=n), np.full(n, 1e-4), [False] * n, contexts),
        )
        doc = update.applied_to(doc)
    learned = sum(len(f.segments or {}) for f in doc.features or [])
    assert learned * 40 <= MAX_LEARNED_VALUES and learned == MAX_LEARNED_VALUES // 40
    assert len(doc.to_json()) < 128 * 1024
    with pytest.raises(InvalidDocument, match="the limit is 2048"):
        StructuredPolicy.create("bot", {"d": list(range(300))}, context={f"n{i}": "number" for i in range(7)})


def test_creating_the_same_structured_policy_again_changes_nothing_and_another_is_refused_by_name() -> None:
    """Re-running the README's snippet: the same policy made a second later is a no-op."""
    store, made = MemoryStore(), BASE_TIME
    spec = {"prompt": ["concise", "step-by-step"], "retrieval_k": [1, 3, 5]}
    triage = StructuredPolicy.create("triage-bot", spec, context={"task": "category"}, created_at=made)
    first = create_policy(store, triage.document)
    tagged = store.get_current_policy("triage-bot")
    later = made + timedelta(seconds=1)
    again = StructuredPolicy.create("triage-bot", spec, context={"task": "category"}, created_at=later)
    assert create_policy(store, again.document) == first
    assert store.get_current_policy("triage-bot") == tagged
    other = StructuredPolicy.create("triage-bot", spec, context={"task": "category", "tokens": "number"})
    with pytest.raises(AlreadyExists, match="agent 'triage-bot' already has a policy"):
        create_policy(store, other.document)


def test_a_structured_policy_rolls_back_with_its_features_and_refuses_a_flat_revision() -> None:
    from agent_learning.documents import Action
    from agent_learning.pipeline import revise, rollback
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    create_policy(store, policy(context={"task": "category"}).document)
    client = PolicyClient(store, "bot", rng=random.Random(2), refresh_seconds=0)
    for i in range(60):
        decision = client.choose(context={"task": "billing"})
        store.add_score(
            make_score(
                f"ep-{i}",
                agent_id="bot",
                action_id=decision.action_id,
                probability=decision.probability,
                reward=float(i % 2),
                context={"task": "billing"},
                incarnation=decision.incarnation,
            )
        )
    assert train_agent("bot", store, Reinforce()).status == "published"
    trained = PolicyDocument.from_dict(store.get_current_policy("bot").doc)
    assert (trained.features or [])[0].segments
    back = rollback(store, "bot", 1).policy
    assert back.version == 3 and back.schema_version == 2 and back.dimensions == trained.dimensions
    assert (back.features or [])[0].segments is None and back.logits == [0.0] * 7
    assert back.learner_state.get("segments") == trained.learner_state.get("segments")  # the evidence stays
    with pytest.raises(ValueError, match="has dimensions or context features"):
        revise(store, "bot", [Action(id="a"), Action(id="b")])


def test_a_numeric_feature_first_seen_after_the_first_update_still_gets_its_centre_and_scale() -> None:
    doc = StructuredPolicy.create("bot", {"arm": [0, 1]}, context={"tokens": "number"}).document
    n = 40
    actions, rewards = np.zeros((n, 1), dtype=int), np.linspace(0, 1, n)
    without = learn_structured(LearnerConfig(), doc, Rows(actions, rewards, np.full(n, 0.5), [False] * n, [None] * n))
    doc = without.applied_to(doc)
    assert (doc.features or [])[0].weights is None  # not seen: nothing fixed yet
    tokens = [{"tokens": 1000.0 + 10 * i} for i in range(n)]
    seen = learn_structured(LearnerConfig(), doc, Rows(actions, rewards, np.full(n, 0.5), [False] * n, tokens))
    feature = (seen.applied_to(doc).features or [])[0]
    assert feature.center == pytest.approx(1195.0) and feature.scale == pytest.approx(
        np.std([10 * i for i in range(n)])
    )


def test_an_update_that_leaves_the_policy_as_it_was_reports_a_kl_of_zero_not_below() -> None:
    """Every reward alike leaves every logit where it was; the per-dimension KL summed to about
    −1e-17 and `agent-learn runs` printed "KL -0.0000"."""
    doc = policy(context={"task": "category"}).document
    n = 300
    rng = np.random.default_rng(1)
    actions = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n)], axis=1)
    contexts = [{"task": str(rng.choice(["billing", "tech"]))} for _ in range(n)]
    rows = Rows(actions, np.full(n, 0.3), np.full(n, 1 / 12), [False] * n, contexts)
    kls = []
    for _ in range(5):
        update = learn_structured(LearnerConfig(), doc, rows)
        kls.append(update.metrics["kl"])
        doc = update.applied_to(doc)
    assert min(kls) == 0.0 and max(kls) < 1e-12


def test_the_entropy_a_run_reports_is_over_its_own_requests_not_the_contexts_of_old_episodes_corrected() -> None:
    """``TrainOutcome.entropy`` is the published version's entropy as the batch's requests draw
    from it; a feedback correction is a late verdict on an old episode, not a request of this batch."""
    from agent_learning.documents import correction_doc_id
    from agent_learning.store.memory import MemoryStore

    store = MemoryStore()
    incarnation = create_policy(store, policy(context={"task": "category"}).document).incarnation
    action = "prompt=concise:retrieval_k=1"
    store.put_score(make_score("e1", agent_id="bot", action_id=action, probability=1 / 12, context={"task": "a"},
                               incarnation=incarnation))
    for i in range(20):
        store.put_score(make_score(f"old-{i}", id=correction_doc_id(f"old-{i}", 1), revision=1,
                                   reward_delta=0.4, agent_id="bot", action_id=action, probability=1 / 12,
                                   context={"task": "b"}, incarnation=incarnation))
    outcome = train_agent("bot", store, StructuredReinforce())
    assert outcome.status == "published" and outcome.run is not None and outcome.run.metrics["corrections"] == 20
    new = store.get_current_policy("bot")
    assert new is not None
    doc = PolicyDocument.from_dict(new.doc)
    assert outcome.entropy == pytest.approx(served_entropy(doc, [{"task": "a"}]))
    assert outcome.entropy != pytest.approx(served_entropy(doc, [{"task": "a"}] + [{"task": "b"}] * 20))


def test_a_documents_layout_is_built_once_while_the_document_lives() -> None:
    """The scorer checks every episode's action against the same cached version: its layout is
    read once; an updated copy (another object) gets its own, and an entry leaves with its document."""
    import gc

    from agent_learning.policy import softmax

    doc = StructuredPolicy.create("layouts", {"prompt": ["a", "b"], "k": [1, 3]}).document
    layout = Layout.of(doc)
    assert Layout.of(doc) is layout and knows_action(doc, "prompt=b:k=3")
    wider = StructuredPolicy.create("layouts", {"prompt": ["a", "b"], "k": [1, 3, 5]}).document
    grown = doc.model_copy(update={"actions": wider.actions, "dimensions": wider.dimensions})
    assert Layout.of(grown).sizes == (2, 3) and layout.sizes == (2, 2) and knows_action(grown, "prompt=b:k=5")
    assert not knows_action(doc, "prompt=b:k=5")
    kept = id(doc)
    del doc
    gc.collect()
    assert kept not in softmax._LAYOUTS
