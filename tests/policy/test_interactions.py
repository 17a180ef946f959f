"""Declared interactions: two dimensions drawn and learned jointly (agent_learning.policy.interactions)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.factories import make_score

from agent_learning.agent.client import PolicyClient
from agent_learning.cli import main
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import ContextFeature, PolicyDocument
from agent_learning.evaluation import counterfactual
from agent_learning.learning.reinforce import LearnerConfig, Reinforce, Rows
from agent_learning.pipeline import create_policy, train_agent
from agent_learning.policy.interactions import merged_document
from agent_learning.policy.softmax import Layout, SoftmaxPolicy, joint_index, knows_action, softmax
from agent_learning.store.memory import MemoryStore

DIMENSIONS = {"depth": [0, 1, 2], "model": ["m", "n"], "tool": ["a", "b", "c"]}


def policy(**kwargs: Any) -> SoftmaxPolicy:
    return SoftmaxPolicy.create("agent", DIMENSIONS, seed=3, **kwargs)


def stored(**changes: Any) -> dict[str, Any]:
    return {**policy(interactions=[("depth", "tool")]).document.to_dict(), **changes}


@pytest.mark.parametrize(
    ("interactions", "field", "problem"),
    [
        ([["depth", "size"]], "interactions[0]", "'size' is not a dimension"),
        ([["depth", "tool"], ["tool", "model"]], "interactions[1]", "'tool' is in two pairs"),
        ([["depth", "depth"]], "interactions[0]", "is in two pairs"),
        ([["depth"]], "interactions[0].dimensions", "at least 2"),
        ([{"dimensions": ["depth", "tool"], "logits": [0.0] * 8}], "interactions[0].logits", "(9), got 8"),
        ([{"dimensions": ["depth", "tool"], "segments": {"task": {"x": [0.0] * 9}}}], "interactions[0].segments",
         "'task' is not a category feature"),
        ([{"dimensions": ["depth", "tool"], "weights": {"tokens": [0.0] * 9}}], "interactions[0].weights",
         "'tokens' is not a numeric feature"),
    ],
)
def test_a_declared_interaction_is_checked_with_an_error_naming_the_field(
    interactions: list[Any], field: str, problem: str
) -> None:
    with pytest.raises(InvalidDocument) as exc:
        PolicyDocument.from_dict(stored(interactions=interactions))
    assert field in str(exc.value) and problem in str(exc.value)


def test_interactions_need_dimensions_and_a_floor_that_fits_the_pair() -> None:
    flat = SoftmaxPolicy.from_actions("agent", ["a", "b"]).to_document(created_at=None).to_dict()
    with pytest.raises(InvalidDocument, match="only a policy with dimensions declares interactions"):
        PolicyDocument.from_dict({**flat, "schema_version": 2, "interactions": [["a", "b"]]})
    with pytest.raises(InvalidDocument, match=r"interactions\[0\]: exploration_floor 0.12 x 9 pairs"):
        PolicyDocument.from_dict(stored(exploration_floor=0.12))  # 0.12 × 3 values per dimension fits alone
    with pytest.raises(InvalidDocument, match="interactions: must be a list of pairs"):
        policy(interactions="depth")


def test_a_document_with_interactions_round_trips_and_a_bare_pair_is_its_declaration() -> None:
    doc = PolicyDocument.from_dict(stored(interactions=[["depth", "tool"]]))
    assert doc.interactions is not None and doc.interactions[0].dimensions == ["depth", "tool"]
    assert doc.to_dict()["interactions"] == [{"dimensions": ["depth", "tool"]}]
    learned = PolicyDocument.from_dict(stored(interactions=[{"dimensions": ["depth", "tool"],
                                                            "logits": [0.5 * i for i in range(9)]}]))
    assert PolicyDocument.from_dict(json.loads(json.dumps(learned.to_dict()))) == learned
    assert SoftmaxPolicy(learned).to_document(created_at=learned.created_at).interactions == learned.interactions
    assert policy().document.to_dict().get("interactions") is None  # none declared: none written


def joint_logits() -> list[float]:
    return [0.3 * ((7 * i) % 5) - 0.6 for i in range(9)]


def test_choose_draws_the_pair_jointly_and_logs_the_exact_probability_of_the_configuration() -> None:
    base = stored(logits=[0.2, -0.1, 0.4, 0.3, -0.3, 0.1, 0.0, -0.5], features=[
        {"name": "task", "kind": "category", "segments": {"x": [0.1, 0.2, -0.3, 0.5, 0.0, -0.2, 0.4, 0.1]}}],
        interactions=[{"dimensions": ["tool", "depth"], "logits": joint_logits(),
                       "segments": {"task": {"x": [0.2 * i - 0.8 for i in range(9)]}}}],
        excluded=[{"depth": "2", "model": "n"}], exploration_floor=0.01)
    chooser = SoftmaxPolicy(PolicyDocument.from_dict(base), rng=random.Random(5))
    for context in (None, {"task": "x"}, {"task": "unseen"}):
        probabilities = {}
        for local in [(d, m, t) for d in range(3) for m in range(2) for t in range(3)]:
            config_id = f"depth={local[0]}:model={'mn'[local[1]]}:tool={'abc'[local[2]]}"
            probabilities[config_id] = chooser.probability(config_id, context)
        assert math.fsum(probabilities.values()) == pytest.approx(1.0)
        # by the formula: (tool, depth) from one softmax over its 9 pairs, model from its own, excluded renormalised
        x = 1.0 if context == {"task": "x"} else 0.0
        logit = base["logits"]
        offsets = base["features"][0]["segments"]["x"]
        pair = [logit[5 + t] + logit[d] + joint_logits()[t * 3 + d]
                + x * (offsets[5 + t] + offsets[d] + 0.2 * (t * 3 + d) - 0.8) for t in range(3) for d in range(3)]
        p_pair = [0.01 + (1 - 9 * 0.01) * p for p in softmax(pair)]
        p_model = [0.01 + (1 - 2 * 0.01) * p for p in softmax([logit[3] + x * offsets[3], logit[4] + x * offsets[4]])]
        raw = {(d, m, t): p_pair[t * 3 + d] * p_model[m] for d in range(3) for m in range(2) for t in range(3)}
        z = 1 - sum(p for (d, m, _), p in raw.items() if (d, m) == (2, 1))
        for (d, m, t), p in raw.items():
            expected = 0.0 if (d, m) == (2, 1) else p / z
            assert probabilities[f"depth={d}:model={'mn'[m]}:tool={'abc'[t]}"] == pytest.approx(expected)
        for _ in range(200):
            decision = chooser.choose(context=context)
            assert decision.probability == pytest.approx(probabilities[decision.action_id])
            assert decision.probability > 0
            assert decision.config == {"depth": int(decision.action_id[6]), "model": decision.action_id[14],
                                       "tool": decision.action_id[-1]}
        marginals = chooser.marginals(context)
        assert list(marginals) == ["depth", "model", "tool"]
        depth_2 = sum(p for k, p in probabilities.items() if "depth=2" in k)
        assert marginals["depth"]["depth=2"] == pytest.approx(depth_2)


def trap_mean(depth: int, tool: int) -> float:
    """Depth 0 and tool 0 best on their own; the pair (2, 2), each value worse on its own, best of all."""
    return 0.75 if (depth, tool) == (2, 2) else 0.5 + 0.1 * (depth == 0) + 0.1 * (tool == 0)


def trained(interactions: list[tuple[str, str]], batches: int = 30) -> PolicyDocument:
    doc = policy(interactions=interactions).document
    rng = random.Random(11)
    learner = Reinforce()
    for _ in range(batches):
        chooser = SoftmaxPolicy(doc, rng=rng)
        parse = Layout.of(doc).parse
        decisions = [chooser.choose() for _ in range(200)]
        rewards = [float(rng.random() < trap_mean(d.config["depth"], "abc".index(d.config["tool"]))) for d in decisions]
        rows = Rows([parse(d.action_id) for d in decisions], rewards, [d.probability for d in decisions],
                    [False] * len(decisions), [None] * len(decisions))
        doc = learner.learn(doc, rows).applied_to(doc)
    return doc


def test_the_learner_moves_the_joint_table_to_a_rewarded_pair_the_additive_model_cannot_reach() -> None:
    def best_pair(doc: PolicyDocument) -> float:
        chosen = SoftmaxPolicy(doc).probabilities.items()
        return sum(p for k, p in chosen if k.startswith("depth=2") and k.endswith("c"))

    additive, joint = trained([]), trained([("depth", "tool")])
    assert best_pair(additive) < 0.2  # locked onto depth 0 and tool 0
    assert best_pair(joint) > 0.6
    assert joint.interactions is not None and joint.interactions[0].logits is not None
    table = joint.interactions[0].logits
    assert table[8] == max(table)  # (depth 2, tool c): the pair the rewards single out


def test_what_the_learner_learns_on_the_merged_view_is_what_the_written_document_draws() -> None:
    doc = policy(interactions=[("tool", "depth")], context={"task": "category"}).document
    chooser = SoftmaxPolicy(doc, rng=random.Random(2))
    contexts = [{"task": random.Random(i).choice(["x", "y"])} for i in range(300)]
    decisions = [chooser.choose(context=c) for c in contexts]
    rows = Rows([Layout.of(doc).parse(d.action_id) for d in decisions],
                [float(d.config["tool"] == "b") + 0.5 * float(d.config["depth"] == 1) for d in decisions],
                [d.probability for d in decisions], [False] * 300, contexts)
    update = Reinforce().learn(doc, rows)
    written = SoftmaxPolicy(update.applied_to(doc))
    view = merged_document(doc)
    on_view = Reinforce().learn(view, rows)
    learned = SoftmaxPolicy(view.model_copy(update={  # the view is no document to store: its fields set as they are
        "logits": [float(x) for x in on_view.logits],
        "features": [ContextFeature.model_validate(f) for f in on_view.features or []]}))
    assert update.interactions and update.interactions[0]["segments"]["task"]
    for context in ({"task": "x"}, {"task": "y"}):
        for config_id, local in [(i, Layout.of(doc).parse(i)) for i in written.probabilities]:
            assert written.probability(config_id, context) == pytest.approx(learned.probability_at(local, context),
                                                                            abs=1e-5)
    assert knows_action(written.document, "depth=1:model=m:tool=b") and not knows_action(written.document, "depth=1")


def test_policy_show_prints_the_joint_table(tmp_path: Path, clean_env: Any) -> None:
    actions = tmp_path / "dims.json"
    actions.write_text(json.dumps({"dimensions": DIMENSIONS, "interactions": [["depth", "tool"]]}))
    db = str(tmp_path / "s.db")
    runner = CliRunner()
    made = runner.invoke(main, ["init-policy", "--agent-id", "triage", "--actions", str(actions), "--db", db])
    assert made.exit_code == 0, made.output
    shown = runner.invoke(main, ["policy", "show", "--agent-id", "triage", "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "interaction depth × tool" in shown.stdout
    lines = shown.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if "depth \\ tool" in line)
    assert [c for c in lines[header].replace("│", " ").split() if c in "abc"] == ["a", "b", "c"]
    assert sum("+0.000" in line for line in lines[header:]) >= 3


@pytest.mark.filterwarnings("error::UserWarning")  # the published version's tables are Interaction objects
def test_the_trainer_learns_the_pair_from_scored_episodes_and_publishes_its_joint_table() -> None:
    store = MemoryStore()
    create_policy(store, policy(interactions=[("depth", "tool")], exploration_floor=0.01).document)
    client = PolicyClient(store, "agent", rng=random.Random(4), refresh_seconds=0)
    rng = random.Random(5)
    n = 0
    for _ in range(15):
        for _ in range(100):
            decision = client.choose()
            mean = trap_mean(decision.config["depth"], "abc".index(decision.config["tool"]))
            n += 1
            store.add_score(make_score(f"ep-{n}", agent_id="agent", action_id=decision.action_id,
                                       probability=decision.probability, reward=float(rng.random() < mean),
                                       incarnation=decision.incarnation))
        outcome = train_agent("agent", store, Reinforce())
        assert outcome.status == "published", outcome.reason
    final = PolicyDocument.from_dict(store.get_current_policy("agent").doc)
    assert final.interactions is not None and final.interactions[0].logits is not None
    assert final.run is not None and final.run.episodes == 100
    assert SoftmaxPolicy(final).marginals()["tool"]["tool=c"] > 0.5  # tool c pays only beside depth 2


def test_off_policy_evaluation_reads_a_policy_with_interactions_as_it_draws() -> None:
    doc = PolicyDocument.from_dict(stored(
        interactions=[{"dimensions": ["tool", "depth"], "logits": joint_logits()}],
        excluded=[{"depth": "2", "model": "n"}]))
    chooser = SoftmaxPolicy(doc)
    layout = Layout.of(doc)
    table = counterfactual.of_document(doc)(None)
    for config_id, p in chooser.probabilities.items():
        assert table[joint_index(layout.parse(config_id), layout.sizes)] == pytest.approx(p)
    with_depth_1 = counterfactual.always(doc, "depth=1")(None)
    for config_id in chooser.probabilities:
        at = joint_index(layout.parse(config_id), layout.sizes)
        if "depth=1" not in config_id:
            assert with_depth_1[at] == 0.0
        else:  # the tool as the policy chooses it beside depth 1, the model as it chooses it
            given = sum(p for k, p in chooser.probabilities.items() if "depth=1" in k)
            assert with_depth_1[at] == pytest.approx(chooser.probabilities[config_id] / given)


def test_a_decision_index_is_the_configuration_position_in_the_document_joint_space() -> None:
    chooser = policy(interactions=[("tool", "depth")])
    plain = policy()
    for config_id in plain.probabilities:
        assert chooser.decision_for(config_id).index == plain.decision_for(config_id).index


def test_a_declared_pair_keeps_the_thompson_floor_of_a_list_of_configurations() -> None:
    doc = trained([("depth", "tool")], batches=8)
    chooser = SoftmaxPolicy(doc, rng=random.Random(8))
    decisions = [chooser.choose() for _ in range(200)]
    rows = Rows([Layout.of(doc).parse(d.action_id) for d in decisions],
                [trap_mean(d.config["depth"], "abc".index(d.config["tool"])) for d in decisions],
                [d.probability for d in decisions], [False] * 200, [None] * 200)

    def pair(dimension_floor: float) -> list[float]:
        learned = Reinforce(LearnerConfig(dimension_thompson_floor=dimension_floor)).learn(doc, rows).applied_to(doc)
        probabilities = SoftmaxPolicy(learned).probabilities
        return [sum(p for k, p in probabilities.items() if k.startswith(f"depth={d}") and k.endswith(t))
                for d in range(3) for t in "abc"]

    assert pair(1.5) == pytest.approx(pair(50.0), abs=1e-9)  # the per-dimension constant leaves the pair alone
