"""``choose()`` with numeric features (standardised, log, binned) draws with the probabilities the
policy's formula gives, on its quick path for plain contexts and off it, and refuses the same
contexts either way."""

from __future__ import annotations

import itertools
import math
import pickle
import random
from collections import Counter
from types import MappingProxyType
from typing import Any

import pytest

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import EXACT_INTEGERS, PolicyDocument
from agent_learning.policy import softmax
from agent_learning.policy.decision import Decision
from agent_learning.policy.softmax import SoftmaxPolicy, _draw_linear, _written_out

DIMENSIONS = {"prompt": ["a", "b", "c"], "k": [1, 3, 5, 10], "tools": [True, False]}
VALUES = 9


SEGMENTS = {"task": ("s0", "s1"), "tier": ("t0", "t1")}
"""The learned segments of each categorical feature a policy here may have (contexts also give s9, t9)."""


def document(*numeric: dict[str, Any], floor: float = 0.02, categories: tuple[str, ...] = ("task",)) -> PolicyDocument:
    """A policy over DIMENSIONS with the learned ``categories`` and the ``numeric`` features given,
    with logits and weights drawn at random."""
    rng = random.Random(7)
    doc = SoftmaxPolicy.create("bot", DIMENSIONS, context={"task": "category"}, seed=1).document.to_dict()
    learned = [{"name": name, "kind": "category", "segments": {s: [rng.gauss(0, 1) for _ in range(VALUES)]
                                                              for s in SEGMENTS[name]}} for name in categories]
    return PolicyDocument.from_dict({**doc, "logits": [rng.gauss(0, 1) for _ in range(VALUES)],
                                     "features": [*learned, *numeric], "exploration_floor": floor,
                                     "temperature": 0.8})


def slope(name: str, transform: str = "standardise") -> dict[str, Any]:
    rng = random.Random(name)
    feature = {"name": name, "kind": "number", "weights": [rng.gauss(0, 1) for _ in range(VALUES)],
               "center": 40.0, "scale": 25.0}
    return {**feature, "transform": transform, "center": 3.0, "scale": 1.5} if transform == "log" else feature


def binned(name: str) -> dict[str, Any]:
    rng = random.Random(name)
    return {"name": name, "kind": "number", "transform": "bins", "bins": [10, 100],
            "segments": {b: [rng.gauss(0, 1) for _ in range(VALUES)] for b in ("<10", ">=100")}}


POLICIES = {
    "standardise": document(slope("tokens")),
    "log": document(slope("tokens", "log")),
    "two slopes": document(slope("tokens"), slope("size", "log")),
    "bins": document(binned("tokens")),
    "bins and a slope": document(binned("tokens"), slope("size")),
    "no floor": document(slope("tokens"), floor=0.0),
    "two categories and a slope": document(slope("tokens"), categories=("task", "tier")),
    "a slope alone": document(slope("tokens"), categories=()),
}


def categorical(name: str) -> tuple[str, ...]:
    """The categorical features of the policy ``name`` of :data:`POLICIES`."""
    return tuple(f.name for f in POLICIES[name].features or () if f.kind == "category")


def contexts(rng: random.Random, n: int, segmented: tuple[str, ...] = ("task",)) -> list[dict[str, Any]]:
    """Plain contexts (the quick path) and others: an int, a value past the clip, a feature missing,
    an unknown segment, a feature the policy does not have (``segmented``: the policy's categorical
    features)."""
    out = []
    for _ in range(n):
        x: dict[str, Any] = {name: rng.choice([*SEGMENTS[name], f"{name[0]}9"]) for name in segmented}
        x |= {"tokens": rng.choice([rng.uniform(0, 300), rng.randint(0, 300), 1e7]), "size": rng.uniform(0, 80)}
        for name in x.copy():
            if rng.random() < 0.15:
                del x[name]
        if rng.random() < 0.1:
            x["other"] = "x"
        out.append(x)
    return out


@pytest.mark.parametrize("name", list(POLICIES))
def test_choose_logs_the_formulas_probability_on_random_contexts(name: str) -> None:
    doc = POLICIES[name]
    chooser, reference = SoftmaxPolicy(doc, rng=random.Random(3)), SoftmaxPolicy(doc)
    for x in contexts(random.Random(name), 300, categorical(name)):
        decision = chooser.choose(context=x)
        assert decision.probability == pytest.approx(reference.probability(decision.action_id, x), rel=1e-12)
        assert decision.logprob == pytest.approx(math.log(decision.probability), rel=1e-12)
        assert decision.context == x and decision.context is not x
        assert decision.config == reference.decision_for(decision.action_id).config
        assert decision == Decision(**decision._asdict())  # every field, as the constructor makes it


@pytest.mark.parametrize("name", ["standardise", "bins"])
def test_choose_draws_each_configuration_as_often_as_its_probability(name: str) -> None:
    doc, x = POLICIES[name], {"task": "s1", "tokens": 61.5}
    chooser = SoftmaxPolicy(doc, rng=random.Random(11))
    n = 20_000
    counts = Counter(chooser.choose(context=x).action_id for _ in range(n))
    for local in itertools.product(*(range(k) for k in chooser.layout.sizes)):
        action_id = chooser.layout.joint_id(local)
        p = chooser.probability(action_id, x)
        assert abs(counts[action_id] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1, action_id


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize(
    ("context", "problem"),
    [
        ({"task": "s1", "tokens": float("nan")}, "context.tokens"),
        ({"task": "s1", "tokens": float("inf")}, "context.tokens"),
        ({"task": "s1", "tokens": True}, "context.tokens: must be a number"),
        ({"task": "s1", "tokens": "12"}, "context.tokens: must be a number"),
        ({"task": "s1", "tokens": EXACT_INTEGERS}, "context.tokens"),
        ({"task": "s1", "tokens": None}, "context.tokens"),
        ({"task": "s1", "tokens": 5, "size": [1]}, "context.size"),
        ({"task": "s1", "tokens": 5, "": 1}, "context"),
    ],
    ids=["nan", "inf", "a boolean", "a string", "an integer too large", "None", "a list", "a bad name"],
)
def test_choose_refuses_a_context_that_is_not_one_after_plain_ones(
    name: str, context: dict[str, Any], problem: str
) -> None:
    chooser = SoftmaxPolicy(POLICIES[name], rng=random.Random(3))
    for x in contexts(random.Random(0), 50, categorical(name)):  # keep the segments' logits ready, as on the quick path
        chooser.choose(context=x)
    with pytest.raises(InvalidDocument, match=problem.replace(".", r"\.")):
        chooser.choose(context=context)


def test_choose_refuses_a_negative_number_for_a_log_feature_after_plain_ones() -> None:
    chooser = SoftmaxPolicy(POLICIES["log"], rng=random.Random(3))
    chooser.choose(context={"task": "s1", "tokens": 3})
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be 0 or more"):
        chooser.choose(context={"task": "s1", "tokens": -3})


@pytest.mark.parametrize("ordered_sum", [True, False], ids=["a + b", "sum()"])
@pytest.mark.parametrize("floor", [0.0, 0.01, 0.15])
@pytest.mark.parametrize("sizes", [(3, 4, 2), (1, 5), (2,), (1, 1, 1)])
def test_the_written_out_draw_gives_the_loops_index_and_probability(
    sizes: tuple[int, ...], floor: float, ordered_sum: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ordered_sum and not softmax.ORDERED_SUM:
        pytest.skip("sum() of floats is compensated on this Python: the written-out draw calls it")
    monkeypatch.setattr(softmax, "ORDERED_SUM", ordered_sum)
    rng = random.Random(f"{sizes}{floor}")
    starts = list(itertools.accumulate((0, *sizes)))
    spans = tuple((s, s + k, k, k * floor, 1.0 - k * floor, k - 1) for s, k in zip(starts, sizes, strict=False))
    slopes = [rng.gauss(0, 2) for _ in range(starts[-1])]
    draw = _written_out(spans, slopes, floor)
    for _ in range(300):
        logits = [rng.gauss(0, 3) for _ in slopes]
        x = rng.choice([rng.uniform(-4, 4), 0.0, 4.0])
        exps = [math.exp(v + w * x) for v, w in zip(logits, slopes, strict=True)]
        uniforms = []
        for start, stop, _, spread, mass, _ in spans:  # random, in the floor's part, on a sum's edge, at the top
            sums = list(itertools.accumulate(exps[start:stop]))
            uniforms.append(rng.choice([rng.random(), spread * 0.999, spread, 1.0 - 1e-16,
                                        spread + mass * rng.choice(sums) / sums[-1]]))
        assert draw(x, iter(uniforms).__next__, logits) == _draw_linear(exps, spans, floor, iter(uniforms).__next__)


@pytest.mark.parametrize("kept", [softmax.CACHE_SIZE, 1], ids=["kept", "caches cleared on every miss"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_a_plain_context_draws_what_the_same_context_checked_in_full_draws(
    name: str, kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(softmax, "CACHE_SIZE", kept)
    plain, checked = (SoftmaxPolicy(POLICIES[name], rng=random.Random(3)) for _ in range(2))
    for x in [*contexts(random.Random(name), 300, categorical(name)), {}, {"other": "x"}]:
        assert plain.choose(context=x) == checked.choose(context=MappingProxyType(x))  # not a dict: checked


@pytest.mark.parametrize("name", ["standardise", "bins"])
def test_a_pickled_policy_draws_as_the_original_from_its_own_generator(name: str) -> None:
    policy = SoftmaxPolicy(POLICIES[name], rng=random.Random(3))
    xs = [x for x in contexts(random.Random(name), 200) if "tokens" in x]
    for x in xs[:20]:  # the quick draw built and its caches filled
        policy.choose(context=x)
    twin = pickle.loads(pickle.dumps(policy))
    assert [twin.choose(context=x) for x in xs] == [policy.choose(context=x) for x in xs]
