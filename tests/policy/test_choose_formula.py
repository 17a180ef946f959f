"""The choose formula of docs/how-it-works.md#choosing-in-another-language, implemented from the
docs alone (plain Python on the document's JSON), against the library's probabilities on
documents produced by real training."""

from __future__ import annotations

import enum
import itertools
import json
import math
import random
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import Action, PolicyDocument
from agent_learning.evaluation import chosen_probabilities
from agent_learning.learning.reinforce import Batch as FlatBatch
from agent_learning.learning.reinforce import LearnerConfig, Reinforce, Rows, learn_structured
from agent_learning.policy.softmax import SoftmaxPolicy, StructuredPolicy, mix_floor, served_entropy
from agent_learning.store.memory import MemoryStore

# --------------------------------------------------------------------------- the docs' formula


def _softmax_with_floor(logits: list[float], t: float, f: float) -> list[float]:
    m = max(x / t for x in logits)
    exps = [math.exp(x / t - m) for x in logits]
    total = sum(exps)
    return [f + (1 - len(logits) * f) * e / total for e in exps]


def _segment(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return value if isinstance(value, str) else repr(value)


def docs_probabilities(doc: Mapping[str, Any], x: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Every configuration id → its probability for context ``x``, from the document's JSON."""
    actions = [a["id"] for a in doc["actions"]]
    t = doc.get("temperature", 1.0)
    f = doc.get("exploration_floor", 0.0)
    if not any(doc.get(k) is not None for k in ("dimensions", "excluded", "features")):
        return dict(zip(actions, _softmax_with_floor(list(doc["logits"]), t, f), strict=True))
    x = x or {}
    logits = list(doc["logits"])
    for feature in doc.get("features") or []:
        name = feature["name"]
        if name not in x:
            continue
        value = x[name]
        if feature["kind"] == "category":
            offsets = (feature.get("segments") or {}).get(_segment(value))
            if offsets is not None:
                logits = [a + b for a, b in zip(logits, offsets, strict=True)]
        elif feature.get("weights") is not None and isinstance(value, int | float) and not isinstance(value, bool):
            z = (value - feature.get("center", 0.0)) / feature.get("scale", 1.0)
            z = max(-4.0, min(4.0, z))
            logits = [a + w * z for a, w in zip(logits, feature["weights"], strict=True)]
    dims = doc.get("dimensions") or [{"name": "", "size": len(actions)}]
    per_dim: list[list[tuple[str, str, float]]] = []  # (action id, value, p_d)
    start = 0
    for d in dims:
        ids = actions[start : start + d["size"]]
        probs = _softmax_with_floor(logits[start : start + d["size"]], t, f)
        per_dim.append([(i, i.partition("=")[2], p) for i, p in zip(ids, probs, strict=True)])
        start += d["size"]
    rules = doc.get("excluded") or []
    joint: dict[str, float] = {}
    excluded_mass = 0.0
    for combo in itertools.product(*per_dim):
        product = math.prod(p for _, _, p in combo)
        values = {d["name"]: v for d, (_, v, _) in zip(dims, combo, strict=True)}
        config_id = ":".join(i for i, _, _ in combo)
        if any(all(values.get(k) == v for k, v in rule.items()) for rule in rules):
            excluded_mass += product
            joint[config_id] = 0.0
        else:
            joint[config_id] = product
    z = 1 - excluded_mass
    return {k: p / z for k, p in joint.items()}


# --------------------------------------------------------------------------- documents from training


def _train(doc: PolicyDocument, reward: Any, contexts: Any, rounds: int, seed: int) -> list[PolicyDocument]:
    """``doc`` and every version of ``rounds`` updates on episodes drawn from the policy itself."""
    rng = random.Random(seed)
    out = [doc]
    for _ in range(rounds):
        chooser = StructuredPolicy(doc, rng=rng)
        rows: list[tuple[Any, ...]] = []
        for _ in range(120):
            x = contexts(rng)
            decision = chooser.choose(context=x)
            local = chooser.layout.parse(decision.action_id)
            rows.append((local, reward(decision.config, x, rng), decision.probability, x))
        acts, rewards, probs, xs = zip(*rows, strict=True)
        update = learn_structured(LearnerConfig(), doc, Rows(np.array(acts), rewards, probs, [False] * len(rows), xs))
        doc = PolicyDocument.from_dict(json.loads(json.dumps(update.applied_to(doc).to_dict())))
        out.append(doc)
    return out


def _reward(config: Mapping[str, Any], x: Mapping[str, Any], rng: random.Random) -> float:
    good = 0.3 * (config.get("prompt") == ("detailed" if x.get("task") == "billing" else "concise"))
    good += 0.2 * (config.get("k", 3) == 3) + 0.001 * (x.get("tokens") or 0) * (config.get("prompt") == "steps")
    good += 0.1 * bool(x.get("vip")) * (config.get("tools") is True)
    return good + rng.gauss(0.0, 0.2)


def _contexts(rng: random.Random) -> dict[str, Any]:
    x: dict[str, Any] = {"task": rng.choice(["billing", "tech", "sales"]), "vip": rng.random() < 0.3}
    if rng.random() < 0.9:
        x["tokens"] = rng.gauss(300.0, 150.0)
    if rng.random() < 0.5:
        x["tier"] = rng.choice([1, 2, 3])  # a category sent as a number
    return x


@pytest.fixture(scope="module")
def trained_documents() -> list[PolicyDocument]:
    structured = StructuredPolicy.create(
        "formula",
        {"prompt": ["concise", "detailed", "steps"], "k": [1, 3, 10], "tools": [True, False]},
        context={"task": "category", "tokens": "number", "vip": "category", "tier": "category"},
        excluded=[{"prompt": "steps", "k": 10}, {"k": 10, "tools": False}],
        temperature=0.8,
        exploration_floor=0.02,
    ).document
    one_dim = StructuredPolicy.create(
        "formula-1d", {"prompt": ["concise", "detailed", "steps"]}, context={"task": "category", "tokens": "number"}
    ).document
    return _train(structured, _reward, _contexts, 4, 1) + _train(one_dim, _reward, _contexts, 3, 2)[1:]


CONTEXTS: list[dict[str, Any] | None] = [
    None,
    {},
    {"task": "billing"},
    {"task": "billing", "tokens": 450.0, "vip": True, "tier": 2},
    {"task": "unknown-segment", "tokens": 1e9},  # an unknown segment, a number far out of range
    {"task": "tech", "tokens": -1e9, "extra": "not a feature", "other": 3},
    {"tokens": 300},  # an int for a number feature
    {"vip": False, "tier": 1},
    {"tier": 2.5},
]


def _assert_same(expected: Mapping[str, float], got: Mapping[str, float]) -> None:
    assert expected.keys() == got.keys()
    for key, p in expected.items():
        assert got[key] == pytest.approx(p, rel=1e-12, abs=1e-300), key


def test_the_trained_documents_use_every_part_of_the_formula(trained_documents: list[PolicyDocument]) -> None:
    last = trained_documents[4]
    kinds = {f.name: f for f in last.features or []}
    assert kinds["tokens"].weights is not None and kinds["tokens"].scale != 1.0 and kinds["tokens"].center != 0.0
    assert {"billing", "tech", "sales"} <= set(kinds["task"].segments or {})
    assert {"true", "false"} <= set(kinds["vip"].segments or {})
    assert {"1", "2", "3"} <= set(kinds["tier"].segments or {})
    assert last.excluded and last.temperature == 0.8 and last.exploration_floor == 0.02


@pytest.mark.parametrize("x", CONTEXTS, ids=[json.dumps(c) for c in CONTEXTS])
def test_the_docs_formula_gives_the_librarys_probabilities(trained_documents: list[PolicyDocument], x: Any) -> None:
    for doc in trained_documents:
        chooser = StructuredPolicy(doc)
        expected = docs_probabilities(doc.to_dict(), x)
        got = {k: chooser.probability(k, x) for k in expected}
        _assert_same(expected, got)
        assert math.fsum(got.values()) == pytest.approx(1.0)
        marginals = chooser.marginals(x)
        for d, values in marginals.items():
            for value_id, p in values.items():
                parts = [k for k in expected if value_id in k.split(":")] if doc.dimensions else [value_id]
                assert p == pytest.approx(math.fsum(expected[k] for k in parts), rel=1e-12), (d, value_id)


def test_choose_logs_exactly_the_docs_probability_of_what_it_chose(trained_documents: list[PolicyDocument]) -> None:
    rng = random.Random(5)
    for doc in trained_documents:
        chooser = StructuredPolicy(doc, rng=rng)
        for x in CONTEXTS:
            expected = docs_probabilities(doc.to_dict(), x)
            for _ in range(20):
                decision = chooser.choose(context=x)
                assert expected[decision.action_id] > 0
                assert decision.probability == pytest.approx(expected[decision.action_id], rel=1e-12)
                assert decision.logprob == pytest.approx(math.log(expected[decision.action_id]), rel=1e-12)
                assert decision.version == doc.version


def test_a_flat_policy_follows_the_docs_formula() -> None:
    """A one-dimension policy without dimensions, exclusions or features, trained by the flat learner."""
    rng = np.random.default_rng(0)
    policy = SoftmaxPolicy.from_actions("flat", ["a", "b", "c", "d"], temperature=0.7, exploration_floor=0.01)
    doc = policy.to_document(created_at=None)
    learner = Reinforce(LearnerConfig())
    for _ in range(3):
        acts = rng.integers(0, 4, 200)
        rewards = rng.normal(0.0, 0.3, 200) + 0.4 * (acts == 2)
        update = learner.update(doc.logits, FlatBatch.from_arrays(acts, rewards, np.full(200, 0.25), 4), 0.7)
        doc = PolicyDocument.from_dict({**doc.to_dict(), "logits": [float(v) for v in update.logits]})
        expected = docs_probabilities(json.loads(json.dumps(doc.to_dict(), default=str)))
        flat = SoftmaxPolicy.from_document(doc)
        _assert_same(expected, flat.probabilities)
        _assert_same(expected, {k: StructuredPolicy(doc).probability(k) for k in expected})
        for _ in range(20):
            decision = flat.choose()
            assert decision.probability == expected[decision.action_id]
            assert decision.logprob == pytest.approx(math.log(expected[decision.action_id]))


class _LastDraw(random.Random):
    """A generator whose every draw is the largest double below 1."""

    def random(self) -> float:
        return 1.0 - 2.0**-53


def test_the_last_uniform_draw_never_lands_on_an_action_of_probability_zero() -> None:
    """Ten actions of 0.1 add up to 0.9999999999999999: the draw above that once took the last
    action, of probability 0 (logprob -inf), which no episode can log."""
    doc = SoftmaxPolicy.from_actions("flat", [f"a{i}" for i in range(11)], exploration_floor=0.0).to_document(
        created_at=None
    )
    doc = PolicyDocument.from_dict({**doc.to_dict(), "logits": [0.0] * 10 + [-1000.0]})
    expected = docs_probabilities(doc.to_dict())
    for chooser in (SoftmaxPolicy.from_document(doc), StructuredPolicy(doc)):
        decision = chooser.choose(_LastDraw())
        assert decision.action_id == "a9" and decision.probability == expected["a9"] == 0.1


def test_a_string_for_a_number_feature_is_refused_by_choose_and_adds_nothing_to_a_logged_one(
    trained_documents: list[PolicyDocument],
) -> None:
    doc = trained_documents[4]
    chooser = StructuredPolicy(doc)
    x = {"task": "billing", "tokens": "450"}
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be a number"):
        chooser.choose(context=x)
    expected = docs_probabilities(doc.to_dict(), x)
    assert expected == docs_probabilities(doc.to_dict(), {"task": "billing"})
    _assert_same(expected, {k: chooser.probability(k, x) for k in expected})


def test_features_without_dimensions_make_all_the_actions_one_dimension() -> None:
    flat = SoftmaxPolicy.from_actions("flat", ["a", "b", "c"], exploration_floor=0.05).to_document(created_at=None)
    features = [
        {"name": "task", "kind": "category", "segments": {"billing": [1.5, -0.5, 0.0]}},
        {"name": "tokens", "kind": "number", "weights": [0.5, 0.0, -0.5], "center": 100.0, "scale": 50.0},
    ]
    fields = {"logits": [0.2, 0.0, -0.2], "features": features, "schema_version": 2}
    doc = PolicyDocument.from_dict({**flat.to_dict(), **fields})
    chooser = StructuredPolicy(doc, rng=random.Random(2))
    for x in CONTEXTS:
        expected = docs_probabilities(doc.to_dict(), x)
        _assert_same(expected, {k: chooser.probability(k, x) for k in expected})
        decision = chooser.choose(context=x)
        assert decision.probability == pytest.approx(expected[decision.action_id], rel=1e-12)


def test_marginals_of_a_large_joint_space_with_exclusions_sum_over_the_exclusions_only() -> None:
    """Seven dimensions of ten values and one excluded configuration: the marginals once summed
    over all 10^7 configurations (20 s, on every training run and `policy show`)."""
    dims = {f"d{i}": list(range(10)) for i in range(7)}
    policy = StructuredPolicy.create("wide", dims, excluded=[{f"d{i}": 1 for i in range(7)}])
    started = time.perf_counter()
    marginals = policy.marginals()
    assert time.perf_counter() - started < 2.0
    z = 1 - 1e-7
    assert marginals["d3"]["d3=1"] == pytest.approx((0.1 - 1e-7) / z, rel=1e-12)
    assert marginals["d3"]["d3=2"] == pytest.approx(0.1 / z, rel=1e-12)
    assert policy.probability(":".join(f"d{i}=2" for i in range(7))) == pytest.approx(1e-7 / z, rel=1e-12)


@pytest.mark.parametrize("floor", [math.nan, math.inf, -0.01, 0.5])
def test_a_floor_that_is_not_a_probability_is_refused_naming_it(floor: float) -> None:
    actions = [Action(id="a"), Action(id="b")]
    with pytest.raises(ValueError, match="exploration_floor"):
        SoftmaxPolicy("bot", actions, [0.0, 0.0], exploration_floor=floor)
    with pytest.raises(ValueError, match="exploration_floor"):
        mix_floor([0.5, 0.5], floor)


def test_a_str_enum_is_logged_as_its_value_after_the_plain_value_was_chosen_for() -> None:
    """The plain value's table, once kept, is found by the Enum (equal hash) without the check (the
    fast path of choose): the episode still logs the plain string, as the learner reads it."""

    class Task(str, enum.Enum):  # noqa: UP042 - the mixin whose str() is not its value
        BILLING = "billing"

    store = MemoryStore()
    chooser = StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"task": "category"}, seed=1)
    for i, value in enumerate(("billing", Task.BILLING, np.str_("billing"))):
        decision = chooser.choose(context={"task": value})
        assert decision.context == {"task": "billing"}, value
        with EpisodeCapture(store, decision, input="q", episode_id=f"ep-{i}") as run:
            episode = run.end("answer")
        assert episode.context is not None and type(episode.context["task"]) is str, value
        assert json.loads(episode.to_json())["context"] == {"task": "billing"}


def test_contexts_whose_values_are_equal_in_python_but_name_different_segments_are_kept_apart() -> None:
    """``1``, ``1.0`` and ``True`` are equal (and hash alike) but name the segments ``1``, ``1.0``
    and ``true``: the guardrail's probabilities and the served entropy grouped them as one context."""
    base = StructuredPolicy.create("bot", {"prompt": ["a", "b"]}, context={"tier": "category"}).document
    segments = {"1": [2.0, -2.0], "true": [-1.0, 1.0], "1.0": [0.0, 0.0]}
    features = [{"name": "tier", "kind": "category", "segments": segments}]
    doc = PolicyDocument.from_dict({**base.to_dict(), "features": features})
    contexts: list[dict[str, Any] | None] = [{"tier": 1}, {"tier": True}, {"tier": 1.0}, None]
    expected = [docs_probabilities(doc.to_dict(), x)["prompt=a"] for x in contexts]
    assert chosen_probabilities(doc, [[0]] * len(contexts), contexts) == pytest.approx(expected, rel=1e-12)
    entropies = [served_entropy(doc, [x]) for x in contexts]
    assert served_entropy(doc, contexts) == pytest.approx(sum(entropies) / len(entropies), rel=1e-12)
    assert entropies[0] + 0.1 < entropies[1] < entropies[2] - 0.1


def test_the_published_schema_refuses_what_the_document_model_refuses_in_names() -> None:
    """Another language validating against docs/policy.schema.json: an exclusion rule's keys are
    dimension names only, and a feature's name is a whole feature name (both were unanchored)."""
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "policy.schema.json").read_text())
    rule = schema["properties"]["excluded"]["anyOf"][0]["items"]
    assert rule["additionalProperties"] is False and all(p.startswith("^") for p in rule["patternProperties"])
    pattern = schema["$defs"]["ContextFeature"]["properties"]["name"]["pattern"]
    assert re.search(pattern, "task") and not re.search(pattern, "task type") and not re.search(pattern, "!x")


def test_a_joint_space_too_large_for_one_table_draws_per_dimension_with_the_same_probabilities() -> None:
    dims = {f"d{i}": list(range(6)) for i in range(4)}  # 1,296 configurations: drawn per dimension
    created = StructuredPolicy.create("wide", dims, context={"task": "category"}, excluded=[{"d0": 0, "d1": 1}])
    rng = random.Random(8)
    segments = {"a": [rng.uniform(-2, 2) for _ in range(24)]}
    fields = {
        "logits": [rng.uniform(-3, 3) for _ in range(24)],
        "features": [{"name": "task", "kind": "category", "segments": segments}],
        "exploration_floor": 0.01,
        "temperature": 1.3,
    }
    doc = PolicyDocument.from_dict({**created.document.to_dict(), **fields})
    chooser = StructuredPolicy(doc, rng=rng)
    for x in ({"task": "a"}, {"task": "b"}, None):
        expected = docs_probabilities(doc.to_dict(), x)
        for _ in range(50):
            decision = chooser.choose(context=x)
            assert decision.probability == pytest.approx(expected[decision.action_id], rel=1e-12)
            assert decision.logprob == pytest.approx(math.log(expected[decision.action_id]), rel=1e-12)


@pytest.mark.parametrize("action_id", [["a"], {"id": "a"}, 3, None])
def test_the_probability_of_what_is_not_an_action_id_is_refused_naming_it(action_id: Any) -> None:
    doc = SoftmaxPolicy.from_actions("bot", ["a", "b"]).to_document(created_at=None)
    for chooser in (SoftmaxPolicy.from_document(doc), StructuredPolicy(doc)):
        with pytest.raises(InvalidDocument, match="action_id"):
            chooser.probability(action_id)
