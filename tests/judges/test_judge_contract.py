"""The judge port's contract, written once and run against every adapter (the ``judge`` fixture below).

Each test asserts a promise of :mod:`agent_learning.judges.base` that an adapter could break: every
metric scored on its scale and named, the judge named, the same episode judged the same, safe from
several threads, an empty output scored as documented, invalid output a PermanentError and never a
score, failures by class within the deadline, ``close`` idempotent. The adapters:

* ``offline``: :class:`~agent_learning.judges.offline.OfflineJudge`, its rules' outputs faulted (for
  the invalid-output cases) as the judge server faults a model's replies;
* ``evaluators``: :class:`~agent_learning.judges.evaluators.EvaluatorJudge`, the real
  azure-ai-evaluation evaluators against the local judge server (``tests/fakes/judge_server.py``).

What only one adapter does is tested in its own file: the rules in ``test_offline_judge.py``; the
evaluators' configuration styles, HTTP failure classes, retries, prompts and clients in
``test_judge_evaluators.py`` and ``test_judge_adapter.py``; their token budget in ``test_judge_budget.py``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import pytest
from adapters import adapter_params, only_on
from factories import make_episode
from judge_limits import fast_limits

from agent_learning.core.errors import PermanentError, TransientError
from agent_learning.documents import MAX_STEP_TEXT_CHARS, Episode, JudgeInfo
from agent_learning.judges import Judge, OfflineJudge
from agent_learning.judges.evaluators import DEADLINE_GRACE, EvaluatorJudge, JudgeModel
from agent_learning.judges.metrics import (
    INTENT_RESOLUTION,
    METRICS,
    SCALES,
    TASK_ADHERENCE,
    TASK_COMPLETION,
    normalise,
)
from agent_learning.judges.offline import VERSION
from agent_learning.rewards import RewardFunction

pytestmark = pytest.mark.timeout(120)

JUDGE_ADAPTERS = ("offline", "evaluators")
"""Every adapter of the judge port, in the order the tests run them."""

MODEL_JUDGES = ("evaluators",)
"""The adapters that call a model, which can fail transiently or hang (the offline rules cannot)."""

FAST = fast_limits(max_attempts=3)
SLACK = 1.0  # scheduling and client start-up on top of a judge's deadline
OUT_OF_RANGE = {INTENT_RESOLUTION: 7.0, TASK_ADHERENCE: 2.0, TASK_COMPLETION: 2.0}
"""The scores of the ``out_of_range`` fault, the judge server's."""


# --------------------------------------------------------------------------- adapters


class ScriptedRules(OfflineJudge):
    """The offline judge whose rules' outputs carry the faults set in :attr:`faults` (metric ->
    the judge server's behaviour string), as the judge server puts them in a model's replies; it
    counts how often each metric was evaluated."""

    def __init__(self) -> None:
        self.faults: dict[str, str] = {}
        self.asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def evaluate(self, query: str, response: str, instructions: str = "") -> dict[str, dict[str, Any]]:  # type: ignore[override]
        outputs = OfflineJudge.evaluate(query, response, instructions)
        with self._lock:
            self.asked.update(outputs.keys())
        for metric, fault in self.faults.items():
            output = outputs[metric]
            output[f"{metric}_reason"] = f"rules {metric}: scripted {fault}"
            if fault == "out_of_range":
                output[metric] = OUT_OF_RANGE[metric]
            elif fault == "null_score":
                output[metric] = None
            elif fault == "missing_score":
                del output[metric]
            elif fault == "skipped":
                output[metric], output[f"{metric}_result"] = None, "not_applicable"
            elif fault.startswith("score:"):
                output[metric] = float(fault.removeprefix("score:"))
            else:
                raise ValueError(f"the offline rules cannot fault with {fault!r}")
        return outputs


@dataclass
class JudgeUnderTest:
    """One adapter's judge, what it promises to name itself, and how to fault it."""

    adapter: str
    judge: Judge
    make: Callable[[], Judge]
    """Another judge configured as :attr:`judge` (as another worker would have)."""
    info: JudgeInfo
    """The judge a judgement names."""
    evaluators: dict[str, str]
    """The evaluator each metric names."""
    evaluator_version: str
    attempts: int
    """How often the judge asks for a metric whose answer stays invalid before it gives up."""
    deadline: float
    """Seconds a judge() call may take (inf: it calls nothing that can hang)."""
    deadline_setting: str
    """What a judgement cut off at its deadline names, to tune."""
    fail: Callable[[str, str | None], None]
    """``fail(fault, metric)``: answer every later request for ``metric`` (None: all) as the
    judge server's behaviour ``fault`` ("null_score", "score:4.5", "http_500", "hang", ...)."""
    asked: Callable[[str | None], int]
    """How often the judge asked for ``metric``'s score (None: any) since the test began."""
    model_requests: Callable[[], int]
    """Requests sent to a judge model since the test began (0 for a judge without one)."""


def offline_judge() -> JudgeUnderTest:
    rules = ScriptedRules()
    return JudgeUnderTest(
        "offline", rules, ScriptedRules, JudgeInfo(name="offline", model=VERSION),
        evaluators={m: f"offline:{m}" for m in METRICS}, evaluator_version=VERSION,
        attempts=1,  # deterministic rules: asking again cannot help
        deadline=math.inf, deadline_setting="",
        fail=lambda fault, metric: rules.faults.update(dict.fromkeys([metric] if metric else METRICS, fault)),
        asked=lambda metric: rules.asked[metric] if metric else sum(rules.asked.values()),
        model_requests=lambda: 0,
    )


def evaluator_judge(server: Any) -> JudgeUnderTest:
    pytest.importorskip("azure.ai.evaluation")
    model = JudgeModel(base_url=server.base_url, model=server.model, api_key="test-key")
    package = f"azure-ai-evaluation {version('azure-ai-evaluation')}"
    classes = {INTENT_RESOLUTION: "IntentResolutionEvaluator", TASK_ADHERENCE: "TaskAdherenceEvaluator",
               TASK_COMPLETION: "_TaskCompletionEvaluator"}
    return JudgeUnderTest(
        "evaluators", EvaluatorJudge(model, FAST), lambda: EvaluatorJudge(model, FAST),
        JudgeInfo(name=package, model=server.model), evaluators=classes, evaluator_version=package,
        attempts=FAST.max_attempts,
        deadline=FAST.episode_deadline + DEADLINE_GRACE,
        deadline_setting=f"AGENT_LEARNING_JUDGE_EVALUATOR_DEADLINE ({FAST.evaluator_deadline:g} s)",
        fail=lambda fault, metric: server.set_mode(fault, evaluator=metric),
        asked=server.count,
        model_requests=server.count,
    )


@pytest.fixture(params=adapter_params(*JUDGE_ADAPTERS))
def judge(request: pytest.FixtureRequest) -> Iterator[JudgeUnderTest]:
    """A fresh judge of each adapter in turn (the evaluators' on a fresh judge server), closed after."""
    if request.param == "offline":
        under_test = offline_judge()
    else:
        under_test = evaluator_judge(request.getfixturevalue("judge_server"))
    yield under_test
    under_test.judge.close()


# --------------------------------------------------------------------------- helpers


def episode(output: str, *, episode_id: str = "ep-1") -> Episode:
    """An episode with a tool call and instructions; the judge server scores ``[judge:...]`` markers."""
    return make_episode(
        episode_id,
        agent_id="support-bot",
        input="How do I reset my password?",
        output=output,
        instructions="Answer concisely from the knowledge base.",
    )


OUTPUTS = (
    "Open Settings, choose Security, select Reset password. [judge:good]",
    "Reset it in Settings. [judge:mid]",
    "I like turtles. [judge:bad]",
    "Your password can be reset from the account page",  # the server scores it by a hash
)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s result or the exception it raised, and the seconds it took."""
    t0 = time.perf_counter()
    try:
        return fn(), time.perf_counter() - t0
    except Exception as exc:
        return exc, time.perf_counter() - t0


# --------------------------------------------------------------------------- judgements


def test_a_judge_scores_every_metric_on_its_scale_and_names_itself(judge: JudgeUnderTest) -> None:
    assert isinstance(judge.judge, Judge)
    for i, output in enumerate(OUTPUTS):
        judgement = judge.judge.judge(episode(output, episode_id=f"ep-{i}"))
        assert judgement.judge == judge.info
        assert set(judgement.metrics) == set(METRICS)  # one per evaluator, none partial
        for metric, score in judgement.metrics.items():
            low, high = SCALES[metric]
            assert isinstance(score.raw, float) and low <= score.raw <= high and score.raw.is_integer()
            assert score.normalised == normalise(metric, score.raw) and 0.0 <= score.normalised <= 1.0
            assert score.result in ("pass", "fail")  # its threshold is the evaluator's own (3 on a 0-1 scale, even)
            assert isinstance(score.reason, str) and 0 < len(score.reason) <= MAX_STEP_TEXT_CHARS
            assert (score.evaluator, score.evaluator_version) == (judge.evaluators[metric], judge.evaluator_version)


def test_the_same_episode_gets_the_same_judgement(judge: JudgeUnderTest) -> None:
    """The offline rules promise it; a model judge gives it when its model answers the same (the
    judge server does), so nothing of the judge's own (ids, clocks, order) leaks into a judgement."""
    ep = episode("Adding the steps: open Settings, then Security, then Reset password.")
    first = judge.judge.judge(ep)
    assert judge.judge.judge(ep) == first
    assert judge.judge.judge(Episode.from_json(ep.to_json())) == first
    other = judge.make()
    try:
        assert other.judge(ep) == first
    finally:
        other.close()


def test_a_judge_is_safe_to_call_from_several_threads(judge: JudgeUnderTest) -> None:
    episodes = [episode(OUTPUTS[i % len(OUTPUTS)], episode_id=f"ep-{i}") for i in range(8)]
    alone = [judge.judge.judge(ep) for ep in episodes]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(judge.judge.judge, episodes))
    assert together == alone


@pytest.mark.parametrize("output", ["", "  \n"])
def test_an_empty_output_scores_one_zero_zero_without_a_model(judge: JudgeUnderTest, output: str) -> None:
    """As documented for both: the offline rules' 1 / 0 / 0, and no model is asked (its prompts
    would have it skip the episode, which would dead-letter every crashed run)."""
    ep = episode(output)
    judgement = judge.judge.judge(ep)
    assert {m: s.raw for m, s in judgement.metrics.items()} == {
        INTENT_RESOLUTION: 1.0, TASK_ADHERENCE: 0.0, TASK_COMPLETION: 0.0,
    }
    assert all(s.evaluator == f"offline:{m}" for m, s in judgement.metrics.items())
    assert judgement.judge == judge.info and judge.model_requests() == 0
    reward, _ = RewardFunction()(judgement.metrics, ep)
    assert reward == -0.5  # learned from, with the empty-output penalty


# --------------------------------------------------------------------------- invalid output


INVALID = [
    ("out_of_range", INTENT_RESOLUTION, "7"),
    ("out_of_range", TASK_ADHERENCE, "2"),
    ("null_score", TASK_ADHERENCE, ""),
    ("missing_score", TASK_ADHERENCE, ""),
    ("skipped", TASK_COMPLETION, "not applicable"),
    ("score:4.5", INTENT_RESOLUTION, "not a whole number"),
    ("score:0.5", TASK_ADHERENCE, "not a whole number"),
    ("score:0.5", TASK_COMPLETION, "not a whole number"),
]
"""(fault, the metric it hits, what the error says besides the metric)."""


@pytest.mark.parametrize(("fault", "metric", "says"), INVALID, ids=[f"{f}@{m}" for f, m, _ in INVALID])
def test_invalid_output_is_permanent_never_a_score(judge: JudgeUnderTest, fault: str, metric: str, says: str) -> None:
    judge.fail(fault, metric)
    result, seconds = timed(lambda: judge.judge.judge(episode("Open Settings. [judge:good]")))
    assert isinstance(result, PermanentError), result  # no judgement, so no default or zero stands in
    assert metric in str(result) and says in str(result), result
    if fault == "skipped":
        assert "scripted skipped" in str(result)  # the judge's own reason, for the operator
    assert judge.asked(metric) == judge.attempts
    assert seconds < judge.deadline + SLACK


def test_a_real_zero_is_a_score(judge: JudgeUnderTest) -> None:
    judge.fail("score:0", TASK_COMPLETION)
    score = judge.judge.judge(episode("Open Settings. [judge:good]")).metrics[TASK_COMPLETION]
    assert (score.raw, score.normalised, score.result) == (0.0, 0.0, "fail")


# --------------------------------------------------------------------------- failures of a model


@only_on("judge", *MODEL_JUDGES)
def test_a_persistent_transient_failure_is_a_transient_error_within_the_deadline(judge: JudgeUnderTest) -> None:
    judge.fail("http_500", None)
    result, seconds = timed(lambda: judge.judge.judge(episode("Open Settings. [judge:good]")))
    assert isinstance(result, TransientError) and "500" in str(result), result
    assert max(judge.asked(m) for m in METRICS) == judge.attempts  # bounded; the first to give up stops all
    assert seconds < judge.deadline + SLACK


@only_on("judge", *MODEL_JUDGES)
def test_the_deadline_bounds_a_call_to_a_hanging_model(judge: JudgeUnderTest) -> None:
    judge.fail("hang", None)
    result, seconds = timed(lambda: judge.judge.judge(episode("Open Settings. [judge:good]")))
    assert isinstance(result, TransientError) and judge.deadline_setting in str(result), result
    assert seconds < judge.deadline + SLACK


# --------------------------------------------------------------------------- close


def test_close_is_idempotent_and_leaves_no_thread_behind(judge: JudgeUnderTest) -> None:
    before = set(threading.enumerate())
    judge.judge.judge(episode("Open Settings. [judge:good]"))
    judge.judge.close()
    judge.judge.close()
    end = time.monotonic() + 5.0  # the judge server's handlers end once the judge's connections close
    while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()]) and time.monotonic() < end:
        time.sleep(0.05)
    assert left == []
