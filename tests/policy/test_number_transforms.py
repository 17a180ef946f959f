"""Numeric context features with a declared transform: the reading the policy and the learner share,
binned numbers as segments, the document round trip and the refusals."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import ContextFeature, PolicyDocument
from agent_learning.policy.features import NUMBER_CLIP, FeatureReader, bin_names
from agent_learning.policy.softmax import SoftmaxPolicy, segment_views

DIMENSIONS = {"prompt": ["concise", "detailed"], "retrieval_k": [1, 3, 5]}


def document(*features: dict[str, Any], **fields: Any) -> PolicyDocument:
    """A uniform policy over DIMENSIONS whose ``features`` are those given (learned values included)."""
    doc = SoftmaxPolicy.create("bot", DIMENSIONS, context={"task": "category"}, seed=1).document.to_dict()
    return PolicyDocument.from_dict({**doc, "features": list(features), "exploration_floor": 0.0, **fields})


def test_log_and_standardise_read_a_value_as_stated() -> None:
    log = FeatureReader(ContextFeature(name="tokens", kind="number", transform="log", center=5.0, scale=2.0))
    plain = FeatureReader(ContextFeature(name="tokens", kind="number", center=500.0, scale=200.0))
    assert log.transformed(999) == math.log1p(999)
    assert log.number(999) == pytest.approx((math.log(1_000) - 5.0) / 2.0)
    assert log.number(0) == -2.5
    assert log.number(1e300) == NUMBER_CLIP  # clipped, as standardised values are
    assert plain.number(900) == 2.0 and plain.number(-1e9) == -NUMBER_CLIP
    for reader in (log, plain):
        assert reader.number("900") is None and reader.number(True) is None
    assert log.number(-1) is None and plain.number(-1) == pytest.approx(-2.505)
    assert "0 or more" in (log.refusal(-1) or "") and plain.refusal(-1) is None


def test_bins_name_each_bin_and_read_a_number_as_its_bin() -> None:
    assert bin_names([100, 1_000, 10_000]) == ("<100", "[100,1000)", "[1000,10000)", ">=10000")
    assert bin_names([0.5]) == ("<0.5", ">=0.5")
    reader = FeatureReader(ContextFeature(name="tokens", kind="number", transform="bins", bins=[100, 1_000]))
    assert [reader.segment(x) for x in (-5, 99.9, 100, 999, 1_000, 1e12)] == [
        "<100", "<100", "[100,1000)", "[100,1000)", ">=1000", ">=1000"
    ]
    assert reader.segment("500") is None and reader.segment(True) is None


def test_a_binned_number_is_a_category_by_its_bin() -> None:
    offsets = [1.5, 0.0, 0.0, 0.0, 2.0]  # prompt=concise and retrieval_k=5 in the middle bin
    doc = document({"name": "tokens", "kind": "number", "transform": "bins", "bins": [100, 1_000],
                    "segments": {"[100,1000)": offsets}})
    chooser = SoftmaxPolicy(doc, rng=random.Random(3))
    inside = chooser.marginals({"tokens": 100})
    assert inside == chooser.marginals({"tokens": 999.5}) != chooser.marginals({"tokens": 1_000})
    assert chooser.marginals({"tokens": 5}) == chooser.marginals() == chooser.marginals({"tokens": 5_000})
    assert inside["prompt"]["prompt=concise"] == pytest.approx(1 / (1 + math.exp(-1.5)))
    decision = chooser.choose(context={"tokens": 500})
    assert decision.probability == chooser.probability(decision.action_id, {"tokens": 500})
    assert segment_views(doc)["tokens=[100,1000)"] == {"prompt": inside["prompt"], "retrieval_k": inside["retrieval_k"]}
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be a number"):
        chooser.choose(context={"tokens": "[100,1000)"})


def test_a_declared_transform_round_trips_and_a_document_without_one_reads_unchanged() -> None:
    declared = [
        {"name": "task", "kind": "category"},
        {"name": "tokens", "kind": "number", "transform": "log", "weights": [0.5] * 5, "center": 6.0, "scale": 1.5},
        {"name": "size", "kind": "number", "transform": "bins", "bins": [10.0, 20.5], "segments": {"<10": [0.1] * 5}},
        {"name": "age", "kind": "number", "weights": [0.25] * 5, "center": 3.0, "scale": 2.0},
    ]
    doc = document(*declared)
    again = PolicyDocument.from_dict(doc.to_dict())
    written = again.to_dict()["features"]
    assert again == doc and [{k: f[k] for k in d} for f, d in zip(written, declared, strict=True)] == declared
    assert "transform" not in written[3] and "bins" not in written[3]  # the default is not written
    assert SoftmaxPolicy(again).to_document(created_at=doc.created_at).features == doc.features
    assert doc.features is not None and doc.features[3].transform == "standardise" and doc.features[3].bins is None


@pytest.mark.parametrize(
    ("feature", "field"),
    [
        ({"name": "task", "kind": "category", "transform": "log"}, "transform"),
        ({"name": "tokens", "kind": "number", "transform": "sqrt"}, "transform"),
        ({"name": "tokens", "kind": "number", "transform": "bins"}, "bins"),
        ({"name": "tokens", "kind": "number", "bins": [1, 2]}, "bins"),
        ({"name": "tokens", "kind": "number", "transform": "bins", "bins": [10, 5]}, "bins"),
        ({"name": "tokens", "kind": "number", "transform": "bins", "bins": []}, "bins"),
        ({"name": "tokens", "kind": "number", "transform": "bins", "bins": ["10"]}, "bins"),
        ({"name": "tokens", "kind": "number", "transform": "bins", "bins": list(range(40))}, "bins"),
        ({"name": "tokens", "kind": "number", "transform": "bins", "bins": [1], "weights": [0.0] * 5}, "weights"),
        ({"name": "tokens", "kind": "number", "transform": "log", "segments": {"a": [0.0] * 5}}, "segments"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_field(feature: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidDocument, match=rf"features\[0\]\.{field}"):
        document(feature)


def test_choose_refuses_a_negative_number_for_a_log_feature() -> None:
    doc = document({"name": "tokens", "kind": "number", "transform": "log", "weights": [0.5] * 5, "center": 6.0,
                    "scale": 1.5})
    chooser = SoftmaxPolicy(doc, rng=random.Random(3))
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be 0 or more"):
        chooser.choose(context={"tokens": -3})
    with pytest.raises(InvalidDocument, match=r"context\.tokens: must be a number"):
        chooser.choose(context={"tokens": "3"})
    assert chooser.probability("prompt=concise:retrieval_k=1", {"tokens": -3}) == chooser.probability(
        "prompt=concise:retrieval_k=1"
    )  # a logged episode's value that gives nothing adds nothing, as the learner reads it
