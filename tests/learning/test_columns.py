"""The learner's batch read by columns equals the batch read row by row, value by value, as the
learner read it before: segments found and their order, each row's segment index, the standardised
numbers, and a numeric feature's centre, scale or pending moments, for values of every kind."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from agent_learning.documents import PolicyDocument
from agent_learning.learning.reinforce import (
    NUMBER_FIT_EPISODES,
    Rows,
    centre_and_scale,
    moments,
    prepare,
)
from agent_learning.policy.features import FeatureReader, standardise
from agent_learning.policy.softmax import SoftmaxPolicy


class Label(str):
    """A str subclass (a str Enum's values are): equal to its text, its own type."""


def policy() -> PolicyDocument:
    """A flat policy with action features, a learned category (one segment known), a fitted number,
    a log number not fitted yet, and a binned number."""
    actions = [{"id": f"a{i}", "features": {"genre": g}} for i, g in enumerate(["x", "y", "x"])]
    base = SoftmaxPolicy.from_actions("bot", actions, action_features=["genre"], seed=1)
    return PolicyDocument.from_dict({**base.to_document(created_at=None).to_dict(), "features": [
        {"name": "task", "kind": "category", "segments": {"s1": [0.1, -0.2, 0.3]}},
        {"name": "tokens", "kind": "number", "weights": [0.2, 0.0, -0.1], "center": 3.0, "scale": 2.5},
        {"name": "size", "kind": "number", "transform": "log"},
        {"name": "bucket", "kind": "number", "transform": "bins", "bins": [0, 1, 10]},
    ]})


def strings(rng: random.Random) -> Any:
    return rng.choice(["s0", "s1", "s2", "s3", None])


def odd_categories(rng: random.Random) -> Any:
    return rng.choice(["s0", "s1", Label("s1"), "None", None, 1, 1.0, True, False, 0, 0.0, -0.0, 2, [1]])


def numbers(rng: random.Random) -> Any:
    return rng.choice([rng.uniform(-5, 50), rng.randint(-3, 40), None])


def odd_numbers(rng: random.Random) -> Any:
    return rng.choice([rng.uniform(-5, 50), rng.randint(-3, 40), None, True, False, "7", np.float64(2.5),
                       np.int64(3), float("nan"), float("inf"), -0.0])


def rows(rng: random.Random, n: int, category: Callable[[random.Random], Any],
         number: Callable[[random.Random], Any]) -> Rows:
    """n rows: contexts with each feature absent now and then, some without context, some corrections."""
    contexts: list[Mapping[str, Any] | None] = []
    for _ in range(n):
        if rng.random() < 0.05:
            contexts.append(rng.choice([None, {}]))
            continue
        values = {"task": category(rng), "tokens": number(rng), "size": number(rng), "bucket": number(rng)}
        contexts.append({k: v for k, v in values.items() if rng.random() < 0.85})
    return Rows([(rng.randrange(3),) for _ in range(n)], [rng.random() for _ in range(n)], [0.3] * n,
                [rng.random() < 0.1 for _ in range(n)], contexts)


def rowwise(doc: PolicyDocument, batch: Rows) -> dict[str, Any]:
    """What the learner's batch holds, read row by row and value by value (the learner before its
    columns): per feature the segments (known, then new by count), each row's segment index and
    standardised number, and a number's centre and scale or pending count."""
    out: dict[str, Any] = {"segments": [], "cats": [], "nums": [], "numbers": []}
    for feature in doc.features or []:
        reader = FeatureReader(feature)
        values = [c.get(feature.name) if c else None for c in batch.contexts]
        if feature.segmented:
            counts: dict[str, int] = {}
            for value in values:
                if value is not None and (name := reader.segment(value)) is not None:
                    counts[name] = counts.get(name, 0) + 1
            known = list(feature.segments or {})
            known += [name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if name not in known]
            index = {name: k for k, name in enumerate(known)}
            out["segments"].append(known)
            out["cats"].append([
                index.get(segment, -1) if c and feature.name in c
                and (segment := reader.segment(c[feature.name])) is not None else -1
                for c in batch.contexts
            ])
            continue
        center, scale = feature.center, feature.scale
        if feature.weights is None:
            read = [reader.transformed(v) for v, fix in zip(values, batch.corrections, strict=True) if not fix]
            count, mean, std = moments(np.array([t for t in read if t is not None]))
            if count < NUMBER_FIT_EPISODES:
                out["numbers"].append(("pending", count, mean, std) if count else ("pending", 0))
                out["nums"].append([0.0] * len(values))
                continue
            center, scale = centre_and_scale(mean, std)
        out["numbers"].append(("fitted", center, scale))
        out["nums"].append([
            standardise(t, center, scale) if c and (t := reader.transformed(c.get(feature.name))) is not None else 0.0
            for c in batch.contexts
        ])
    return out


def by_columns(doc: PolicyDocument, batch: Rows) -> dict[str, Any]:
    """The same, as :func:`prepare` gives it."""
    model, _, prepared = prepare(doc, batch)
    numbers = []
    for j, name in enumerate(model.numeric):
        if not model.fitted[j]:
            p = model.pending.get(name)
            numbers.append(("pending", p["count"], p["mean"], p["std"]) if p else ("pending", 0))
        else:
            numbers.append(("fitted", model.centers[j], model.scales[j]))
    return {"segments": model.segments, "cats": prepared.categories.T.tolist(),
            "nums": prepared.numbers.T.tolist(), "numbers": numbers}


def same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN and 0.0 apart from −0.0 (the bits, not the value)."""
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# NaN and infinity reach the moments only here: an episode's context holds finite numbers only.
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize(
    ("category", "number", "n"),
    [(strings, numbers, 400), (strings, numbers, 20), (odd_categories, odd_numbers, 400)],
    ids=["plain values", "too few to fit", "values of every kind"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_columns_read_the_batch_as_rows_did(category: Any, number: Any, n: int, seed: int) -> None:
    doc, batch = policy(), rows(random.Random(seed), n, category, number)
    assert same(by_columns(doc, batch), rowwise(doc, batch))


@pytest.mark.parametrize(
    "values",
    [[1, True, 1.0, "1", None], [0.0, -0.0, False, 0, "s1"], [1, True, 5.0, None], [0.0, False, 12],
     [2, 2.0, "s1"], ["s1", Label("s1"), "s2"], [Label("s1"), "s1"]],
    ids=["1 true 1.0", "0.0 -0.0 false 0", "numbers and true", "numbers and false", "2 2.0",
         "str then str subclass", "str subclass then str"],
)
@pytest.mark.parametrize("feature", ["task", "bucket"])
def test_equal_values_of_other_kinds_are_read_apart(values: list[Any], feature: str) -> None:
    """1, 1.0 and True are equal keys but name three segments, and True falls in no bin."""
    contexts: list[Mapping[str, Any] | None] = [{feature: v} for v in values * 20]
    n = len(contexts)
    batch = Rows([(i % 3,) for i in range(n)], [0.5] * n, [0.3] * n, [False] * n, contexts)
    assert same(by_columns(policy(), batch), rowwise(policy(), batch))


def test_a_number_no_float_holds_is_refused_as_row_by_row() -> None:
    doc = policy()
    with pytest.raises(OverflowError):
        FeatureReader(doc.features[1]).transformed(10**400)  # type: ignore[index]
    with pytest.raises(OverflowError):
        prepare(doc, Rows([(0,)], [0.5], [0.3], [False], [{"tokens": 10**400}]))


def test_a_context_that_is_another_mapping_reads_as_a_dict() -> None:
    class Context(Mapping[str, Any]):
        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data

        def __getitem__(self, key: str) -> Any:
            return self.data[key]

        def __iter__(self) -> Any:
            return iter(self.data)

        def __len__(self) -> int:
            return len(self.data)

    doc, batch = policy(), rows(random.Random(5), 200, strings, numbers)
    wrapped = batch._replace(contexts=[Context(c) if c else c for c in batch.contexts])
    assert same(by_columns(doc, wrapped), rowwise(doc, batch))


def few_numbers(rng: random.Random) -> Any:
    """A handful of numbers, none equal to 0 or 1 (a boolean could share their entry)."""
    return rng.choice([2.5, 5, 12, 0.5, None])


def none_named(rng: random.Random) -> Any:
    """Strings, None, and the segment None reads as (a feature the row lacks reads as none)."""
    return rng.choice(["s0", "s1", "None", None])


def full_rows(rng: random.Random, n: int, category: Callable[[random.Random], Any],
              number: Callable[[random.Random], Any], missing: float = 0.0) -> Rows:
    """n rows whose contexts are dicts holding both features learned as segments (read together),
    each but for a share ``missing`` of them."""
    batch = rows(rng, n, category, number)
    contexts = [{**(c or {}), **{k: v for k, v in (("task", category(rng)), ("bucket", number(rng)))
                                 if rng.random() >= missing}} for c in batch.contexts]
    return batch._replace(contexts=contexts)


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize(
    ("category", "number", "missing"),
    [(strings, few_numbers, 0.0), (none_named, few_numbers, 0.2), (strings, numbers, 0.0),
     (odd_categories, odd_numbers, 0.0)],
    ids=["a few distinct contexts", "features missing now and then", "numbers equal to 0 or 1",
         "values of every kind"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_features_read_together_read_as_rows_did(category: Any, number: Any, missing: float, seed: int) -> None:
    """Every row's context a dict: the category and binned features read once per distinct tuple of
    values, or feature by feature where a tuple may hide values of other kinds (1 and True)."""
    doc, batch = policy(), full_rows(random.Random(seed), 400, category, number, missing)
    assert same(by_columns(doc, batch), rowwise(doc, batch))


@pytest.mark.parametrize(
    "change",
    [lambda c, i: None if i == 7 else c, lambda c, i: {k: v for k, v in c.items() if k != "bucket" or i != 7},
     lambda c, i: {**c, "task": [1]} if i == 7 else c, lambda c, i: {**c, "task": 1} if i == 7 else c,
     lambda c, i: {**c, "task": True} if i == 7 else c, lambda c, i: {**c, "bucket": True} if i == 7 else c],
    ids=["no context", "a feature missing", "an unhashable value", "a number among categories",
         "a boolean among categories", "a boolean among bins"],
)
def test_one_odd_row_among_features_read_together_reads_as_rows_did(change: Any) -> None:
    """Rows that would be read together but for one, odd in its context."""
    base = full_rows(random.Random(3), 200, strings, lambda rng: rng.choice([1, 5, 12, 1.0]))
    batch = base._replace(contexts=[change(c, i) for i, c in enumerate(base.contexts)])
    assert same(by_columns(policy(), batch), rowwise(policy(), batch))


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize(("category", "number"), [(strings, few_numbers), (odd_categories, odd_numbers)],
                         ids=["plain values", "values of every kind"])
@pytest.mark.parametrize("distinct", [1, 40, 3_000])
def test_rows_sharing_their_contexts_read_as_rows_did(category: Any, number: Any, distinct: int) -> None:
    """Rows whose contexts are a few shared objects, as the scores the trainer reads are (each object
    read once, whatever it holds), and rows that share too few to be read so (3,000 of 4,000)."""
    rng = random.Random(distinct)
    pool = full_rows(rng, distinct, category, number, 0.1).contexts
    batch = rows(rng, 4_000, category, number)
    shared = batch._replace(contexts=[rng.choice(pool) for _ in range(4_000)])
    copies = shared._replace(contexts=[dict(c) if c is not None else c for c in shared.contexts])
    assert same(by_columns(policy(), shared), rowwise(policy(), copies))


def test_a_context_answering_a_missing_feature_is_read_as_a_dict_without_it() -> None:
    """A defaultdict answers any key: the feature it lacks reads as absent, and it gains no key."""
    doc, batch = policy(), full_rows(random.Random(4), 200, strings, few_numbers)
    contexts = [defaultdict(str, {k: v for k, v in c.items() if k != "bucket" or i % 2}) for i, c in
                enumerate(batch.contexts)]
    keys = [set(c) for c in contexts]
    assert same(by_columns(doc, batch._replace(contexts=contexts)),
                rowwise(doc, batch._replace(contexts=[dict(c) for c in contexts])))
    assert [set(c) for c in contexts] == keys


@pytest.mark.parametrize(
    ("actions", "corrections"),
    [([(0,), (2,), (1,)], [False, True, False]), ([[0], [2], [1]], [0, 1, 0]),
     ([(np.int64(2),), (True,), (0,)], [True, False, 1]), ([(1,), (0,), (1,)], [False, False, False])],
    ids=["tuples and booleans", "lists and integers", "numpy integers and booleans among them", "0 and 1 only"],
)
def test_action_indices_and_flags_read_in_one_pass_as_numpy_reads_them(actions: Any, corrections: Any) -> None:
    contexts: list[Mapping[str, Any] | None] = [None] * 3
    _, _, prepared = prepare(policy(), Rows(actions, [0.5] * 3, [0.3] * 3, corrections, contexts))
    assert prepared.actions.dtype == np.int64 and prepared.actions.tolist() == np.asarray(actions).tolist()
    assert prepared.corrections.tolist() == np.asarray(corrections, dtype=bool).tolist()
