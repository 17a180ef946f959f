"""Policy documents written by the last release are read, served and trained on exactly as that
release did: ``tests/fixtures/release_documents.json`` holds a flat and a structured version
document with what that release computed from them (its ``about`` says how it was generated)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from agent_learning.documents import PolicyDocument
from agent_learning.learning.reinforce import Reinforce
from agent_learning.pipeline.train import collect, learn
from agent_learning.policy import StructuredPolicy
from agent_learning.policy.softmax import SoftmaxPolicy, load_policy, policy_probabilities

RELEASE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "release_documents.json").read_text())
KINDS = ["flat", "structured"]


def close(got: Any, want: Any, tol: float, where: str = "") -> None:
    """``got`` equals ``want`` with numbers within ``tol`` (absolute), recursively."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            close(got[key], want[key], tol, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list | tuple) and len(got) == len(want), f"{where}: {got!r:.200} != {want!r:.200}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            close(g, w, tol, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert math.isclose(got, want, rel_tol=0, abs_tol=tol), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def as_json(doc: PolicyDocument) -> dict[str, Any]:
    return json.loads(json.dumps(doc.to_dict(), default=str))


@pytest.mark.parametrize("kind", KINDS)
def test_a_release_document_reads_and_round_trips_unchanged(kind: str) -> None:
    stored = RELEASE[kind]["document"]
    assert as_json(PolicyDocument.from_dict(stored)) == stored
    policy = SoftmaxPolicy.from_document(stored)
    assert type(policy) is SoftmaxPolicy is StructuredPolicy  # one policy class, whatever the document
    assert as_json(policy.document) == stored
    assert policy.snapshot().id == stored["id"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_release_document_is_served_as_the_release_served_it(kind: str) -> None:
    release = RELEASE[kind]
    doc = PolicyDocument.from_dict(release["document"])
    assert policy_probabilities(doc) == pytest.approx(release["policy_probabilities"], rel=1e-12)
    for make in (load_policy, SoftmaxPolicy.from_document):
        policy = make(doc)
        for i, context in enumerate(release["contexts"]):
            want = release["probabilities"][str(i)]
            got = {c: policy.probability(c, context) for c in want}
            assert got == pytest.approx(want, rel=1e-12)
        policy = make(doc, rng=random.Random(7))
        for draw in release["draws"]:
            decision = policy.choose(context=draw["context"])
            assert (decision.action_id, dict(decision.config)) == (draw["action_id"], draw["config"])
            assert decision.probability == pytest.approx(draw["probability"], rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_a_release_document_is_trained_as_the_release_trained_it(kind: str) -> None:
    release = RELEASE[kind]
    doc = PolicyDocument.from_dict(release["document"])
    update = learn(Reinforce(), doc, collect(doc.agent_id, release["scores"], doc))
    want = release["trained"]["document"]
    got = as_json(PolicyDocument.from_dict({**release["document"], "logits": [float(x) for x in update.logits],
                                            "features": getattr(update, "features", None),
                                            "learner_state": update.state}))
    close(got["logits"], want["logits"], 1e-9, "logits")
    close(got["learner_state"], want["learner_state"], 2e-9, "learner_state")
    close(got.get("features"), want.get("features"), 2e-6, "features")
    metrics = release["trained"]["metrics"]
    assert {k: update.metrics.get(k) for k in metrics} == pytest.approx(metrics, rel=1e-9, abs=1e-12)
    trained = PolicyDocument.from_dict({**release["document"], "logits": want["logits"], "features":
                                        want.get("features"), "learner_state": want["learner_state"]})
    assert policy_probabilities(trained) == pytest.approx(release["trained"]["policy_probabilities"], rel=1e-12)
