"""The learner reads a numeric feature through its declared transform: on a threshold in a number
spread over orders of magnitude, bins and log learn the threshold better than the raw value."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from agent_learning.documents import PolicyDocument
from agent_learning.learning.reinforce import PENDING_NUMBERS, LearnerConfig, Rows, learn_structured
from agent_learning.policy.softmax import SoftmaxPolicy

THRESHOLD = 1_000.0
"""Below it action ``small`` pays 0.7 and ``large`` 0.3; above it the other way round."""


def declared(transform: str) -> dict[str, Any]:
    feature: dict[str, Any] = {"name": "tokens", "kind": "number"}
    if transform != "standardise":
        feature["transform"] = transform
    if transform == "bins":
        feature["bins"] = [100.0, THRESHOLD, 10_000.0]
    return feature


def policy(transform: str) -> PolicyDocument:
    doc = SoftmaxPolicy.from_actions("bot", ["small", "large"], context={"tokens": "number"}, seed=1)
    return PolicyDocument.from_dict({**doc.to_document(created_at=None).to_dict(), "features": [declared(transform)]})


def tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """Token counts spread evenly over 10 to 100,000 on a log scale."""
    return np.exp(rng.uniform(math.log(10), math.log(100_000), n))


def regret_after_learning(transform: str, rounds: int = 6, per_round: int = 400) -> float:
    """Mean regret per request on held-out requests after ``rounds`` rounds of choosing and learning."""
    rng = np.random.default_rng(4)
    doc = policy(transform)
    for _ in range(rounds):
        chooser = SoftmaxPolicy(doc, rng=random.Random(int(rng.integers(1 << 30))))
        xs = tokens(rng, per_round)
        decisions = [chooser.choose(context={"tokens": float(x)}) for x in xs]
        chosen = np.array([[d.index] for d in decisions])
        good = (chosen[:, 0] == 0) == (xs < THRESHOLD)
        rewards = np.where(good, 0.7, 0.3) + rng.normal(0, 0.1, per_round)
        rows = Rows(chosen, rewards, np.array([d.probability for d in decisions]), [False] * per_round,
                    [{"tokens": float(x)} for x in xs])
        doc = learn_structured(LearnerConfig(), doc, rows).applied_to(doc)
    chooser = SoftmaxPolicy(doc)
    held_out = tokens(np.random.default_rng(99), 2_000)
    wrong = [chooser.probability("large" if x < THRESHOLD else "small", {"tokens": float(x)}) for x in held_out]
    return 0.4 * float(np.mean(wrong))


def test_bins_and_log_learn_a_threshold_better_than_the_raw_number() -> None:
    raw, log, bins = (regret_after_learning(t) for t in ("standardise", "log", "bins"))
    assert bins < raw and log < raw, (raw, log, bins)


@pytest.mark.parametrize("transform", ["log", "bins"])
def test_the_learned_document_keeps_the_declared_transform(transform: str) -> None:
    rng = np.random.default_rng(0)
    xs = tokens(rng, 200)
    doc = policy(transform)
    rows = Rows(rng.integers(0, 2, (200, 1)), rng.random(200), np.full(200, 0.5), [False] * 200,
                [{"tokens": float(x)} for x in xs])
    learned = learn_structured(LearnerConfig(), doc, rows).applied_to(doc)
    assert learned.features is not None
    feature = learned.features[0]
    assert feature.model_dump(include={"transform", "bins"}) == {
        k: v for k, v in declared(transform).items() if k in ("transform", "bins")}
    if transform == "bins":
        assert set(feature.segments or {}) == {"<100", "[100,1000)", "[1000,10000)", ">=10000"}
    else:  # centre and scale are fitted on ln(1 + x)
        assert feature.weights is not None and PENDING_NUMBERS not in learned.learner_state
        assert feature.center == pytest.approx(float(np.mean(np.log1p(xs))), rel=1e-6)
        assert feature.scale == pytest.approx(float(np.std(np.log1p(xs))), rel=1e-6)
