"""The softmax policy: probabilities, draws, decisions and documents."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import Action, PolicyDocument, ScoreCursor
from agent_learning.policy.softmax import Decision, SoftmaxPolicy, mix_floor, softmax

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def trained(**kw: object) -> SoftmaxPolicy:
    actions = [Action(id="small"), Action(id="medium", config={"model": "m"}), Action(id="large", config={"k": 2})]
    options = {"version": 3, "temperature": 0.7, "exploration_floor": 0.05, "rng": random.Random(1)} | kw
    return SoftmaxPolicy("agent", actions, [1.0, -0.5, 0.25], **options)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- math


def test_softmax_known_values() -> None:
    probs = softmax([0.0, math.log(3.0)])
    assert probs == pytest.approx([0.25, 0.75])
    assert softmax([5.0, 5.0, 5.0]) == pytest.approx([1 / 3] * 3)


def test_softmax_is_stable_for_huge_logits() -> None:
    probs = softmax([1000.0, 999.0, -1000.0])
    assert all(math.isfinite(p) for p in probs)
    assert probs[0] == pytest.approx(1 / (1 + math.exp(-1)))
    assert probs[2] == 0.0


def test_temperature_flattens_and_sharpens() -> None:
    logits = [2.0, 1.0, 0.0]
    sharp, base, flat = softmax(logits, 0.5), softmax(logits, 1.0), softmax(logits, 2.0)
    assert sharp[0] > base[0] > flat[0] > 1 / 3
    assert sharp[2] < base[2] < flat[2] < 1 / 3
    assert softmax(logits, 1e6) == pytest.approx([1 / 3] * 3, abs=1e-5)
    assert softmax(logits, 0.01)[0] == pytest.approx(1.0)
    # T scales the logits: softmax(θ, T) == softmax(θ / T, 1).
    assert softmax(logits, 2.0) == pytest.approx(softmax([1.0, 0.5, 0.0]))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_softmax_rejects_bad_temperature(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        softmax([0.0, 1.0], temperature)


def test_mix_floor_known_values() -> None:
    assert mix_floor([1.0, 0.0, 0.0, 0.0], 0.1) == pytest.approx([0.7, 0.1, 0.1, 0.1])
    assert mix_floor([0.5, 0.5], 0.0) == [0.5, 0.5]


@pytest.mark.parametrize(("floor", "k"), [(0.5, 2), (0.25, 4), (1.0, 1), (-0.01, 3)])
def test_mix_floor_rejects_floor_times_k_at_least_one(floor: float, k: int) -> None:
    with pytest.raises(ValueError, match="exploration_floor"):
        mix_floor([1.0 / k] * k, floor)


@settings(max_examples=100, deadline=None)
@given(
    logits=st.lists(st.floats(min_value=-50, max_value=50), min_size=1, max_size=12),
    temperature=st.floats(min_value=0.05, max_value=100),
    share=st.floats(min_value=0, max_value=0.99),
)
def test_probabilities_sum_to_one_and_respect_the_floor(logits: list[float], temperature: float, share: float) -> None:
    floor = share / len(logits)
    probs = mix_floor(softmax(logits, temperature), floor)
    assert math.fsum(probs) == pytest.approx(1.0, abs=1e-12)
    assert all(p >= floor - 1e-15 for p in probs)
    # Ordering of the logits is kept.
    best = max(range(len(logits)), key=logits.__getitem__)
    assert probs[best] == pytest.approx(max(probs), abs=1e-12)


# --------------------------------------------------------------------------- construction


def test_from_actions_accepts_ids_dicts_and_actions_and_is_uniform() -> None:
    tuned = {"id": "tuned", "description": "d", "config": {"temperature": 0.2}}
    policy = SoftmaxPolicy.from_actions("agent", ["plain", tuned, Action(id="obj", config={"x": 1})])
    assert policy.action_ids == ["plain", "tuned", "obj"]
    assert list(policy.probabilities.values()) == pytest.approx([1 / 3] * 3)
    assert policy.version == 1
    assert policy.logits == (0.0, 0.0, 0.0)
    assert policy.decision_for("tuned").config == {"temperature": 0.2}
    assert policy.decision_for("obj").config == {"x": 1}
    assert policy.entropy() == pytest.approx(math.log(3))


def test_from_actions_uniform_with_floor_stays_uniform() -> None:
    policy = SoftmaxPolicy.from_actions("agent", ["a", "b", "c", "d"], exploration_floor=0.2)
    assert list(policy.probabilities.values()) == pytest.approx([0.25] * 4)


def test_floor_times_k_at_least_one_rejected() -> None:
    with pytest.raises(ValueError, match="exploration_floor"):
        SoftmaxPolicy.from_actions("agent", ["a", "b"], exploration_floor=0.5)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"temperature": "1"}, "temperature: must be a number, got str '1'"),
     ({"temperature": True}, "temperature: must be a number, got bool True"),
     ({"exploration_floor": "0.01"}, "exploration_floor: must be a number, got str '0.01'")],
)
def test_a_setting_that_is_not_a_number_is_named_not_converted(options: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        SoftmaxPolicy.from_actions("agent", ["a", "b"], **options)
    with pytest.raises(ValueError, match=re.escape("logits[1]: must be a number, got str '2'")):
        SoftmaxPolicy("agent", [Action(id="a"), Action(id="b")], [1.0, "2"])  # type: ignore[list-item]
    assert SoftmaxPolicy.from_actions("agent", ["a", "b"], temperature=np.float32(0.5)).temperature == 0.5


def test_duplicate_action_ids_rejected() -> None:
    with pytest.raises(InvalidDocument) as info:
        SoftmaxPolicy.from_actions("agent", ["a", "b", "a"])
    assert info.value.fields == ["actions"]
    assert "duplicate" in str(info.value) and "'a'" in str(info.value)


@pytest.mark.parametrize("bad", ["has space", "", "-leading", "a/b", "x" * 129])
def test_bad_action_id_rejected(bad: str) -> None:
    with pytest.raises(InvalidDocument) as info:
        SoftmaxPolicy.from_actions("agent", ["ok", bad])
    assert info.value.fields == ["actions[1].id"]
    assert "starting with a letter or digit, at most 128 characters" in str(info.value)


def test_bad_agent_id_rejected_with_field() -> None:
    with pytest.raises(InvalidDocument) as info:
        SoftmaxPolicy.from_actions("bad agent", ["a"])
    assert "agent_id" in info.value.fields


def test_unknown_action_fields_and_types_rejected() -> None:
    with pytest.raises(InvalidDocument, match="model: Extra inputs are not permitted") as info:
        SoftmaxPolicy.from_actions("agent", [{"id": "a", "model": "x"}])
    assert info.value.fields == ["actions[0].model"]
    with pytest.raises(InvalidDocument, match=r"actions\[0\]: must be an id, an Action or an object with an id"):
        SoftmaxPolicy.from_actions("agent", [1])  # type: ignore[list-item]


def test_constructor_rejects_mismatched_or_non_finite_logits() -> None:
    actions = [Action(id="a"), Action(id="b")]
    with pytest.raises(ValueError, match="one logit per action"):
        SoftmaxPolicy("agent", actions, [0.0])
    with pytest.raises(ValueError, match="one logit per action"):
        SoftmaxPolicy("agent", [], [])
    with pytest.raises(ValueError, match="finite"):
        SoftmaxPolicy("agent", actions, [0.0, math.nan])


# --------------------------------------------------------------------------- choosing


def test_probabilities_follow_the_formula() -> None:
    policy = trained()
    soft = softmax([1.0, -0.5, 0.25], 0.7)
    expected = [0.05 + (1 - 3 * 0.05) * p for p in soft]
    assert list(policy.probabilities.values()) == pytest.approx(expected)
    assert math.fsum(policy.probabilities.values()) == pytest.approx(1.0)
    assert policy.entropy() == pytest.approx(-sum(p * math.log(p) for p in expected))


def test_choose_with_seed_is_reproducible() -> None:
    a = SoftmaxPolicy.from_actions("agent", list("abcd"), seed=42)
    b = SoftmaxPolicy.from_actions("agent", list("abcd"), rng=random.Random(42))
    draws_a = [a.choose().action_id for _ in range(200)]
    draws_b = [b.choose().action_id for _ in range(200)]
    assert draws_a == draws_b
    assert SoftmaxPolicy.from_actions("agent", list("abcd"), seed=42).choose().action_id == draws_a[0]
    assert len(set(draws_a)) == 4
    # A per-call rng overrides the policy's own generator.
    assert [a.choose(random.Random(7)).action_id for _ in range(3)] == [b.choose(random.Random(7)).action_id] * 3


def test_different_seeds_give_different_sequences() -> None:
    a = SoftmaxPolicy.from_actions("agent", list("abcd"), seed=1)
    b = SoftmaxPolicy.from_actions("agent", list("abcd"), seed=2)
    assert [a.choose().action_id for _ in range(50)] != [b.choose().action_id for _ in range(50)]


def test_empirical_frequencies_match_probabilities() -> None:
    policy = trained(rng=random.Random(2026))
    n = 50_000
    counts = Counter(policy.choose().action_id for _ in range(n))
    for action_id, p in policy.probabilities.items():
        assert counts[action_id] / n == pytest.approx(p, abs=0.01)


def test_decision_fields() -> None:
    policy = trained()
    seen = set()
    for _ in range(300):
        d = policy.choose()
        assert isinstance(d, Decision)
        seen.add(d.action_id)
        assert d.agent_id == "agent"
        assert d.version == 3
        assert d.policy_id == "agent:v3"
        assert d.probability == policy.probabilities[d.action_id]
        assert d.logprob == math.log(d.probability)
        assert policy.action_ids[d.index] == d.action_id
        assert d.config == policy.actions[d.index].config
    assert seen == {"small", "medium", "large"}
    assert policy.decision_for("medium").config == {"model": "m"}


@pytest.mark.parametrize("structured", [False, True], ids=["flat", "structured"])
def test_a_decisions_config_is_read_only_json_and_copies_are_plain(structured: bool) -> None:
    """Before the fix ``decision.config`` was the action's own dict: a caller that changed it
    (or a list in it) changed every later decision of that action, and the policy document."""
    import copy
    import json

    from agent_learning.policy.softmax import StructuredPolicy

    changes = [lambda c: c.__setitem__("model", "x"), lambda c: c.update(model="x"), lambda c: c.pop("model"),
               lambda c: c.setdefault("new", 1), lambda c: c.clear(), lambda c: c.__delitem__("model")]
    if structured:  # a dimension's values are strings, numbers or booleans
        policy: Any = StructuredPolicy.create("agent", {"model": ["m"], "k": [3]}, rng=random.Random(1))
        config: dict[str, Any] = {"model": "m", "k": 3}
    else:
        config = {"model": "m", "tools": ["search"], "limits": {"k": [1, 2]}}
        policy = SoftmaxPolicy.from_actions("agent", [{"id": "a", "config": config}], rng=random.Random(1))
        changes += [lambda c: c["tools"].append("x"), lambda c: c["tools"].__setitem__(0, "x"),
                    lambda c: c["tools"].extend(["x"]), lambda c: c["limits"]["k"].append(3),
                    lambda c: c["limits"].update(k=[])]
    decision = policy.choose()
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change(decision.config)
    assert policy.choose().config == config and isinstance(decision.config, dict)
    assert json.loads(json.dumps(decision.config)) == config and repr(decision.config) == repr(config)
    mine = copy.deepcopy(decision.config)  # a plain, changeable copy
    mine["model"] = "x"
    assert type(mine) is dict and policy.choose().config == config
    if not structured:
        assert type(mine["tools"]) is list
        assert policy.actions[0].config == config  # the action's own config is untouched
    assert type(dict(decision.config)) is dict and type(decision.config | {"n": 1}) is dict
    assert policy.choose(context={"task": "a"}).config == config


def test_decision_for_unknown_action() -> None:
    policy = trained()
    with pytest.raises(InvalidDocument) as info:
        policy.decision_for("huge")
    assert info.value.fields == ["action_id"]
    assert "huge" in str(info.value)
    with pytest.raises(InvalidDocument):
        policy.probability("huge")
    assert policy.probability("small") == policy.probabilities["small"]


def test_single_action_always_chosen() -> None:
    policy = SoftmaxPolicy.from_actions("agent", ["only"], seed=0)
    decisions = [policy.choose() for _ in range(20)]
    assert all(d == decisions[0] for d in decisions)
    d = decisions[0]
    assert (d.action_id, d.probability, d.logprob) == ("only", 1.0, 0.0)


# --------------------------------------------------------------------------- documents


def test_to_document_and_back() -> None:
    policy = trained()
    options = {"created_at": CREATED, "parent_version": 2, "note": "n", "learner_state": {"baseline": 0.5}}
    doc = policy.to_document(source="train", cursor=ScoreCursor(seq=9, id="ep-9"), **options)
    assert (doc.id, doc.kind, doc.version, doc.source, doc.parent_version) == ("agent:v3", "version", 3, "train", 2)
    assert doc.logits == [1.0, -0.5, 0.25]
    assert (doc.temperature, doc.exploration_floor, doc.pinned) == (0.7, 0.05, False)
    assert doc.cursor == ScoreCursor(seq=9, id="ep-9")
    assert doc.created_at == CREATED
    assert doc.learner_state == {"baseline": 0.5}

    again = SoftmaxPolicy.from_document(doc)
    assert again.probabilities == policy.probabilities
    assert (again.version, again.temperature, again.exploration_floor, again.pinned) == (3, 0.7, 0.05, False)
    assert again.document == doc
    assert again.to_document(source="train", cursor=doc.cursor, **options) == doc


def test_pinned_current_document_round_trips() -> None:
    doc = trained(pinned=True).to_document(kind="current", created_at=CREATED)
    assert (doc.id, doc.pinned) == ("agent:current", True)
    again = SoftmaxPolicy.from_document(doc)
    assert again.pinned is True
    assert again.to_document(kind="current", created_at=CREATED) == doc
    assert doc.as_kind("version").pinned is False


def test_pinned_policy_exports_as_unpinned_version() -> None:
    policy = SoftmaxPolicy.from_document(trained(pinned=True).to_document(kind="current", created_at=CREATED))
    doc = policy.to_document(created_at=CREATED)
    assert (doc.kind, doc.pinned) == ("version", False)


def test_from_document_accepts_dicts_and_current_documents() -> None:
    doc = trained().to_document(kind="current", created_at=CREATED)
    assert doc.id == "agent:current"
    from_dict = SoftmaxPolicy.from_document(doc.to_dict(), seed=3)
    assert from_dict.version == 3
    assert from_dict.probabilities == trained().probabilities
    assert from_dict.choose().policy_id == "agent:v3"


def test_from_document_rejects_invalid_dict() -> None:
    data = trained().to_document(created_at=CREATED).to_dict()
    data["logits"] = [0.0]
    with pytest.raises(InvalidDocument) as info:
        SoftmaxPolicy.from_document(data)
    assert info.value.fields == ["logits"]


def test_document_floor_check_names_the_field() -> None:
    data = SoftmaxPolicy.from_actions("agent", ["a", "b"]).to_document(created_at=CREATED).to_dict()
    data["exploration_floor"] = 0.5
    with pytest.raises(InvalidDocument) as info:
        PolicyDocument.from_dict(data)
    assert info.value.fields == ["exploration_floor"]


# --------------------------------------------------------------------------- agent-side imports


def test_agent_side_does_not_import_numpy_or_judges() -> None:
    code = (
        "import sys, agent_learning.policy, agent_learning.agent.capture, agent_learning.agent.client, "
        "agent_learning.policy, agent_learning.rewards.feedback, agent_learning.store.sqlite; "
        "print('numpy' in sys.modules, 'azure.ai.evaluation' in sys.modules)"
    )
    shared = str(Path(__file__).resolve().parents[2] / "shared")  # the library, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [shared, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60, env=env)
    assert out.stdout.split() == ["False", "False"]


def test_the_store_an_agent_opens_without_a_path_is_the_one_the_settings_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's agent opens ``SQLiteStore()``: the file ``init-policy`` and ``open_local`` use,
    read from the same setting without loading the settings (and the pipeline's imports)."""
    from agent_learning.app.settings import load_settings
    from agent_learning.store.sqlite import DEFAULT_PATH, PATH_SETTING, SQLiteStore

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PATH_SETTING, raising=False)
    assert SQLiteStore().path == load_settings().sqlite_path == DEFAULT_PATH
    for value in ["", str(tmp_path / "elsewhere" / "agents.db")]:
        monkeypatch.setenv(PATH_SETTING, value)  # empty: the default, as the settings read it
        assert SQLiteStore().path == load_settings().sqlite_path == (value or DEFAULT_PATH)


@pytest.mark.parametrize(
    ("actions", "named"),
    [
        ("abc", r"actions: must be a list of actions, got str"),
        ({"dimensions": {"p": ["a"]}}, r"actions: must be a list of actions, got dict"),
        ([{"id": "a"}, {"noid": 1}], r"actions\[1\]\.id: Field required; actions\[1\]\.noid"),
        (["a", "bad id"], r"actions\[1\]\.id: 'bad id' does not fit: use letters, digits"),
        (["a", 3], r"actions\[1\]: must be an id"),
    ],
)
def test_actions_of_the_wrong_shape_are_named_by_their_place(actions: object, named: str) -> None:
    with pytest.raises(InvalidDocument, match=named):
        SoftmaxPolicy.from_actions("bot", actions)  # type: ignore[arg-type]


def test_a_sure_policy_has_entropy_zero_not_minus_zero() -> None:
    """``policy show`` of a one-action policy printed "entropy -0.000 nats"."""
    import numpy as np

    from agent_learning.learning.reinforce import entropy
    from agent_learning.policy.softmax import policy_entropy

    assert math.copysign(1.0, policy_entropy([1.0])) == 1.0
    assert math.copysign(1.0, entropy(np.array([1.0, 0.0]))) == 1.0
    assert f"{policy_entropy([1.0]):.3f}" == "0.000"
