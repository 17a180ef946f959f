"""The judge's token budget: booking under a tokens-per-minute limit as Azure OpenAI counts it
(deterministic, with a manual clock), and the real evaluators paced by it against the local
judge server."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import pytest

from agent_learning.core.errors import PermanentError, TransientError
from agent_learning.documents import Episode
from agent_learning.judges.budget import PromptEstimate, TokenBudget


class Clock:
    """A manual monotonic clock; ``sleep`` advances it (and records how long was asked)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --------------------------------------------------------------------------- booking


def test_calls_under_the_limit_start_at_once_but_spaced_as_requests_allow() -> None:
    clock = Clock()
    budget = TokenBudget(60_000, clock=clock)  # 360 requests a minute: one every 1/6 s
    starts = [budget.reserve(1_000, max_wait=10).start for _ in range(3)]  # type: ignore[union-attr]
    assert starts == pytest.approx([0.0, 1 / 6, 2 / 6])
    clock.now = 5.0
    assert budget.reserve(1_000, max_wait=10).start == 5.0  # type: ignore[union-attr]


def test_a_full_window_waits_for_the_oldest_call_to_leave_it() -> None:
    clock = Clock()
    budget = TokenBudget(10_000, clock=clock)  # 60 requests a minute: one a second
    first, second = budget.reserve(4_000, 100), budget.reserve(4_000, 100)
    assert (first.start, second.start) == (0.0, 1.0)  # type: ignore[union-attr]
    assert budget.reserve(4_000, max_wait=30) is None  # 12,000 > 10,000 until the first leaves at 60 s
    assert budget.held(at=1.0) == 8_000  # nothing was booked by the refusal
    third = budget.reserve(4_000, max_wait=100)
    assert third is not None and third.start == 60.0 and budget.wait(third) == 60.0
    assert budget.held(at=60.0) == 8_000  # the second and third


def test_settling_with_the_reported_count_frees_the_difference() -> None:
    clock = Clock()
    budget = TokenBudget(10_000, clock=clock)
    first = budget.reserve(4_000, 100)
    budget.reserve(4_000, 100)
    budget.settle(first, 1_000)  # type: ignore[arg-type]
    assert budget.reserve(4_000, 100).start == 2.0  # type: ignore[union-attr]  # 9,000 fits: only spacing waits


def test_a_call_larger_than_the_whole_budget_waits_for_an_empty_window_and_holds_it_longer() -> None:
    clock = Clock()
    budget = TokenBudget(1_000, clock=clock)  # 6 requests a minute
    big = budget.reserve(3_000, 100)
    assert big is not None and big.start == 0.0 and big.until == 180.0  # three minutes' worth
    small = budget.reserve(100, max_wait=1_000)
    assert small is not None and small.start == 180.0


def test_a_released_booking_gives_its_place_back() -> None:
    clock = Clock()
    budget = TokenBudget(10_000, clock=clock)
    first = budget.reserve(9_000, 100)
    budget.release(first)  # type: ignore[arg-type]
    assert budget.reserve(9_000, max_wait=5) is not None  # one request-spacing later, not 60 s


def test_any_minute_holds_at_most_the_budget_and_starts_keep_their_spacing() -> None:
    rng = random.Random(7)
    clock = Clock()
    limit = 30_000
    budget = TokenBudget(limit, clock=clock)
    booked = []
    for _ in range(400):
        clock.now += rng.expovariate(1 / 2.0)
        reservation = budget.reserve(rng.randint(500, 12_000), max_wait=rng.choice([5.0, 60.0, 600.0]))
        if reservation is not None:
            booked.append(reservation)
            if rng.random() < 0.5:
                budget.settle(reservation, int(reservation.cost * rng.uniform(0.5, 1.0)))
    starts = [r.start for r in booked]
    assert starts == sorted(starts) and len(booked) > 100
    assert min(b - a for a, b in itertools.pairwise(starts)) >= budget.spacing - 1e-9
    for r in booked:  # every 60 s window ending at a start (a call holds it for 60 s from its start)
        assert sum(o.cost for o in booked if o.start <= r.start < o.start + 60) <= limit


def test_an_episodes_calls_are_booked_all_or_none() -> None:
    clock = Clock()
    budget = TokenBudget(10_000, clock=clock)
    assert [r.start for r in budget.reserve_all([3_000, 3_000, 3_000], max_wait=10)] == [0.0, 1.0, 2.0]  # type: ignore[union-attr]
    assert budget.reserve_all([500, 500, 3_000], max_wait=30) is None  # the third would wait ~58 s
    assert budget.held(at=2.0) == 9_000  # the two that fitted were given back
    assert budget.reserve(500, max_wait=10).start == 3.0  # type: ignore[union-attr]  # and the spacing too


def test_budget_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="tokens_per_minute"):
        TokenBudget(0)
    with pytest.raises(ValueError, match="cost"):
        TokenBudget(100).reserve(-1, 10)


def test_prompt_estimates_start_at_four_characters_a_token_and_learn_the_ratio() -> None:
    estimate = PromptEstimate(template_chars=8_000)
    assert estimate.tokens(400) == 2_100
    estimate.observe(400, 1_890)  # the model counted 10% fewer
    assert estimate.tokens(400) == 1_890 and estimate.tokens(4_400) == math.ceil(0.9 * 3_100)


# --------------------------------------------------------------------------- through the real evaluators

pytest.importorskip("azure.ai.evaluation")

from support.factories import make_episode  # noqa: E402
from support.judge_limits import fast_limits  # noqa: E402

from agent_learning.judges.evaluators import EvaluatorJudge, JudgeLimits, JudgeModel, JudgeTokens  # noqa: E402

FAST = fast_limits(max_attempts=2)


def episode(i: int) -> Episode:
    return make_episode(
        f"ep-{i}",
        agent_id="support-bot",
        action_id="k=3",
        probability=0.25,
        input="How do I reset my password?",
        output=f"Open Settings, choose Security, select Reset password ({i}). [judge:good]",
        steps=[],
        metadata={},
    )


def judge_for(server: Any, tokens_per_minute: int, limits: JudgeLimits = FAST, clock: Clock | None = None):
    tokens = JudgeTokens(tokens_per_minute=tokens_per_minute)
    model = JudgeModel(base_url=server.base_url, model=server.model, api_key="test-key")
    if clock is None:
        return EvaluatorJudge(model, limits, tokens=tokens)
    return EvaluatorJudge(model, limits, tokens=tokens, clock=clock, sleep=clock.sleep)


def reported(request: Any) -> int:
    """The prompt tokens the judge server reports for a request (4 characters a token)."""
    return max(1, sum(len(str(m["content"])) for m in request.messages) // 4)


def test_the_budget_is_settled_with_the_reported_counts_and_a_late_turn_fails_transiently(judge_server: Any) -> None:
    clock = Clock()
    judge = judge_for(judge_server, 10_000, clock=clock)  # one request a second, 10,000 tokens a minute
    judge.judge(episode(1))
    assert clock.sleeps == [1.0, 1.0]  # the second and third evaluator wait their turn, a second apart
    requests = judge_server.requests
    limits = {"intent_resolution": 200, "task_adherence": 400, "task_completion": 700}
    assert judge.budget is not None
    assert judge.budget.held() == sum(reported(r) + limits[r.evaluator] for r in requests)  # settled, not estimated
    assert all(r.body.get("max_tokens", r.body.get("max_completion_tokens")) == limits[r.evaluator] for r in requests)
    # The window now holds ~6,000 of 10,000: the next episode's three calls cannot all fit before it
    # clears, ~57 s away, far past the 4 s deadline. The episode fails transiently with none of them sent.
    held = judge.budget.held()
    with pytest.raises(TransientError, match="token budget"):
        judge.judge(episode(2))
    assert len(judge_server.requests) == len(requests) and judge.budget.held() == held
    judge.close()


def test_calls_still_waiting_their_turn_when_another_evaluator_fails_are_never_sent(judge_server: Any) -> None:
    judge = judge_for(judge_server, 20_000)  # 120 requests a minute: the second and third wait 0.5 s and 1 s
    judge_server.set_mode("content_filter", evaluator="intent_resolution")  # the first call fails at once
    with pytest.raises(PermanentError, match="content filter"):
        judge.judge(episode(1))
    assert [r.evaluator for r in judge_server.requests] == ["intent_resolution"]
    # the three calls book ~8,400 tokens, the one sent ~2,400: the unsent calls' places were given back
    assert judge.budget is not None and judge.budget.held() < 3_000
    judge.close()


def test_a_budget_too_small_for_any_episode_says_so_naming_the_setting(judge_server: Any) -> None:
    judge = judge_for(judge_server, 36)  # a deployment's capacity (36 = 36,000 TPM) mistaken for tokens a minute
    with pytest.raises(TransientError, match="AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE=36 is too small") as info:
        judge.judge(episode(1))
    assert "even with nothing else booked" in str(info.value) and judge_server.requests == []
    judge.close()


def test_with_a_long_enough_deadline_the_call_waits_for_the_window(judge_server: Any) -> None:
    clock = Clock()
    patient = JudgeLimits(attempt_timeout=1.0, evaluator_deadline=150.0, episode_deadline=180.0, max_attempts=2)
    judge = judge_for(judge_server, 10_000, limits=patient, clock=clock)
    judge.judge(episode(1))
    judge.judge(episode(2))
    assert len(judge_server.requests) == 6
    assert max(clock.sleeps) > 50  # one call waited for the first episode's calls to leave the window
    assert clock.now >= 60.0
    judge.close()


def test_real_pacing_spaces_the_requests_the_deployment_sees(judge_server: Any) -> None:
    judge = judge_for(judge_server, 50_000)  # 300 requests a minute: one every 0.2 s, tokens to spare
    for i in range(2):
        judge.judge(episode(i))
    times = sorted(r.timestamp for r in judge_server.requests)
    assert len(times) == 6
    # Booked 0.2 s apart, a span of 1.0 s (unpaced, the six take about 0.15 s). Arrivals carry the
    # machine's scheduling jitter: a first request late by a few tenths on a busy machine shortens
    # the span by as much, so the check only tells paced from unpaced; the spacing itself is
    # checked exactly on a manual clock above.
    assert times[-1] - times[0] >= 0.6
    judge.close()
