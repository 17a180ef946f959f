"""An agent's episodes as Vowpal Wabbit's DSJSON and such logs imported as episodes: the round
trip, VW's own parser, training on an imported log, and bad lines."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dsjson_logs import ACTIONS, BEST, logged

from agent_learning.app import handlers, http
from agent_learning.app.embedded import LocalPipeline
from agent_learning.app.settings import load_settings
from agent_learning.app.wiring import Components
from agent_learning.core.clock import ManualClock
from agent_learning.ops.dsjson import BadLog, export_lines, import_lines
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.store import MemoryStore


class Served:
    """An embedded store and pipeline, and an agent ranked and rewarded through the Personalizer routes."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = ManualClock()
        s = load_settings(sqlite_path=str(tmp_path / "app.db"), store="sqlite", queue="sqlite",
                          policy_refresh_seconds=0)
        self.parts = Components(s, clock=self.clock)
        self.rt = handlers.Runtime(s, self.parts.store, send=None, parts=self.parts)

    def call(self, name: str, body: Any, **params: str) -> Any:
        answer = http.dispatch(name, http.Request("POST", {"agent_id": "news", **params}, {}, {},
                                                  json.dumps(body).encode()), self.rt)
        assert answer.status in (201, 204), answer.body
        return json.loads(answer.body) if answer.body else None

    def train(self) -> dict[str, int]:
        return LocalPipeline.of(self.parts).run_once().published


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """30 events of agent ``news`` (one excluded action, one left unrewarded), shared by the tests that only read."""
    s = Served(tmp_path_factory.mktemp("served"))
    for i in range(30):
        tier = "gold" if i % 2 else "silver"
        answer = s.call("personalizer_rank", {"contextFeatures": [{"user": {"tier": tier}}, {"hour": i % 24}],
                                              "actions": ACTIONS, "eventId": f"e{i}",
                                              "excludedActions": ["politics"] if i % 5 == 0 else []})
        s.clock.advance(1)
        if i != 7:
            s.call("personalizer_reward", {"value": float(answer["rewardActionId"] == BEST[tier])}, event_id=f"e{i}")
    yield s
    s.parts.close()


def test_export_import_export_is_the_same_log(served: Served, tmp_path: Path) -> None:
    skipped: list[str] = []
    first = list(export_lines(served.rt.store, "news", skipped=skipped))
    assert skipped == [] and len(first) == 29  # e7, never rewarded, is no episode
    line = json.loads(first[0])
    assert line["EventId"] == "e0" and line["_label_cost"] == -line["o"][0]["v"]
    assert line["c"]["user"] == {"tier": "silver"} and line["c"]["_multi"][0] == {"id": "sports", "topic": "sports",
                                                                                 "length": 3}
    assert line["_labelIndex"] == line["_label_Action"] - 1 == line["a"][0] - 1
    assert line["p"][0] == line["_label_probability"] and sum(line["p"]) == pytest.approx(1.0)
    other = Served(tmp_path)
    result = import_lines(other.rt.store, "copy", first)
    assert (result.added, result.created_policy) == (29, True)
    again = [json.loads(x) for x in export_lines(other.rt.store, "copy")]
    assert again == [json.loads(x) for x in first]
    assert import_lines(other.rt.store, "copy", first).already == 29  # importing again adds nothing
    other.parts.close()


def test_vowpal_wabbits_dsjson_parser_reads_the_export(served: Served) -> None:
    vw = pytest.importorskip("vowpalwabbit")
    workspace = vw.Workspace("--dsjson --cb_explore_adf --quiet")
    for text in export_lines(served.rt.store, "news"):
        line = json.loads(text)
        examples = workspace.parse(text)
        labels = [e.get_label(vw.LabelType.CONTEXTUAL_BANDIT) for e in examples]
        taken = labels[line["_label_Action"]]  # examples[0] is the shared context
        assert taken.costs[0].cost == pytest.approx(line["_label_cost"])
        assert taken.costs[0].probability == pytest.approx(line["_label_probability"])
        assert len(examples) == 1 + len(line["c"]["_multi"])
        workspace.learn(examples)
        workspace.finish_example(examples)
    workspace.finish()


def test_an_imported_log_trains_a_new_agent_toward_the_logged_best_action(tmp_path: Path) -> None:
    app = Served(tmp_path)
    result = import_lines(app.rt.store, "warm", logged(240))
    assert result.added == 240 and result.actions == ["sports", "politics", "cooking"]
    assert app.train() == {"warm": 2}
    doc = app.rt.store.get_current_policy("warm").doc
    policy = SoftmaxPolicy.from_document(doc)
    for tier, best in BEST.items():
        probs = {a: policy.probability(a, {"user.tier": tier}) for a in policy.action_ids}
        assert max(probs, key=probs.__getitem__) == best, (tier, probs)
    app.parts.close()


def test_a_new_agent_starts_from_the_logs_own_policy_so_the_guardrail_can_judge_its_first_steps(
    tmp_path: Path,
) -> None:
    """A log sure of one action: from a uniform version 1 the review would have few effective
    samples on it and hold every step; version 1 takes the log's shares instead."""
    app = Served(tmp_path)
    import_lines(app.rt.store, "warm", logged(600, behaviour=(0.8, 0.1, 0.1)))
    first = SoftmaxPolicy.from_document(app.rt.store.get_current_policy("warm").doc)
    assert first.probability("sports", {"user.tier": "gold"}) == pytest.approx(0.8, abs=0.05)
    assert app.train() == {"warm": 2}  # published, not held
    app.parts.close()


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.pop("_label_cost"), "_label_cost: missing"),
    (lambda d: d.update(_label_cost=-2.5), "_label_cost: must be a number from -1 to 0"),
    (lambda d: d.update(_label_probability=0), "_label_probability"),
    (lambda d: d.update(_label_Action=9), "_label_Action"),
    (lambda d: d.update(_labelIndex=7), "_labelIndex"),
    (lambda d: d.update(p=[0.5]), "p: must list one probability"),
    (lambda d: d.update(Timestamp="yesterday"), "Timestamp"),
    (lambda d: d["c"]["_multi"].append({"id": "sports"}), "c._multi[3].id: is offered twice"),
    (lambda d: d.update(EventId="log0"), "EventId: 'log0' is line 1's too"),
])
def test_a_bad_line_is_rejected_by_number_and_field_and_nothing_is_imported(change: Any, field: str) -> None:
    store = MemoryStore()
    lines = logged(3)
    bad = json.loads(lines[1])
    change(bad)
    with pytest.raises(BadLog, match=f"^line 2: {re.escape(field)}"):
        import_lines(store, "warm", [lines[0], json.dumps(bad), lines[2]])
    assert store.list_episodes("warm") == [] and store.get_current_policy("warm") is None
    with pytest.raises(BadLog, match=r"^line 1: not JSON"):
        import_lines(store, "warm", ["{"])
