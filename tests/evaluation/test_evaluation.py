"""Off-policy estimators: values against their formulas, intervals that cover a known truth,
input errors that name the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from benchmark_modules import load_benchmark

from agent_learning.evaluation import (
    IPS,
    LATENCY,
    SNIPS,
    TOOL_FAILURES,
    DoublyRobust,
    Logs,
    NoOverlap,
    Target,
    compare,
    compare_metric,
    estimate,
    t_quantile,
)

bench = load_benchmark("evaluation")

ACTIONS = [0, 1, 1, 2, 0]
REWARDS = [1.0, 0.0, 1.0, 0.5, 0.0]
LOGGED = [0.5, 0.25, 0.25, 0.25, 0.5]
TARGET = [[0.2, 0.6, 0.2]] * 5


def test_ips_and_snips_are_their_formulas() -> None:
    w = np.array([0.2 / 0.5, 0.6 / 0.25, 0.6 / 0.25, 0.2 / 0.25, 0.2 / 0.5])
    r = np.array(REWARDS)
    ips = estimate(ACTIONS, REWARDS, LOGGED, TARGET, estimator="ips")
    snips = estimate(ACTIONS, REWARDS, LOGGED, TARGET, estimator="snips")
    assert ips.value == pytest.approx((w * r).mean())
    assert snips.value == pytest.approx((w * r).sum() / w.sum())
    assert snips.effective_sample_size == pytest.approx(w.sum() ** 2 / (w**2).sum())
    half = t_quantile(0.975, snips.effective_sample_size - 1) * (w * r).std(ddof=1) / math.sqrt(5)
    assert ips.high - ips.value == pytest.approx(half)
    assert ips.low < ips.value < ips.high


def test_doubly_robust_is_the_model_plus_weighted_residuals_with_a_cross_fitted_model() -> None:
    rng = np.random.default_rng(3)
    n, k = 400, 3
    groups = rng.integers(0, 2, n)
    actions = rng.integers(0, k, n)
    rewards = rng.random(n)
    target = rng.dirichlet(np.ones(k), size=2)
    logs = Logs.of(actions, rewards, np.full(n, 1 / k), k, groups)
    dr = DoublyRobust(prior=0.0)
    terms = dr.terms(logs, Target.of_table(target, groups))
    fold = np.arange(n) % 2
    i = 7  # an odd episode: predicted by the model of the even ones
    fit = (fold == 0) & (groups == groups[i])
    q = np.array([rewards[fit & (actions == a)].mean() for a in range(k)])
    expected = target[groups[i]] @ q + target[groups[i], actions[i]] * k * (rewards[i] - q[actions[i]])
    assert terms[i] == pytest.approx(expected)


def test_the_paired_difference_of_two_close_policies_is_narrower_than_either_estimate() -> None:
    rng = np.random.default_rng(5)
    logs, current = bench.Setting("softmax", "candidate").draw(rng, 3000)
    close = Target.of_table(0.9 * current.table + 0.1 * bench.LOGGING["uniform"], current.rows)
    cand, cur, diff = compare(logs, close, current, SNIPS())
    assert diff.value == pytest.approx(cand.value - cur.value)
    assert diff.high - diff.low < 0.5 * min(cand.high - cand.low, cur.high - cur.low)
    same = compare(logs, current, current, SNIPS())[2]
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


def test_clipping_caps_the_weights_and_raises_the_effective_sample_size() -> None:
    rng = np.random.default_rng(2)
    logs, target = bench.Setting("near-deterministic", "candidate").draw(rng, 2000)
    free = estimate(logs.actions, logs.rewards, logs.logged, target.table[target.rows], estimator="ips")
    clipped = estimate(logs.actions, logs.rewards, logs.logged, target.table[target.rows], estimator="ips", clip=5)
    assert clipped.effective_sample_size > free.effective_sample_size
    assert clipped.value < free.value  # rewards ≥ 0: capped weights can only lower IPS
    assert IPS(clip=5).terms(logs, target).max() <= 5 * logs.rewards.max()


@pytest.mark.parametrize("setting", bench.settings(), ids=lambda s: f"{s.logging}/{s.target}")
def test_intervals_cover_the_truth_and_the_bias_is_within_them(setting: object) -> None:
    """400 replications of 2,000 logged episodes per setting (each a few hundred ms)."""
    figures = {name: bench.replicate(setting, name, reps=400, n=2000, seed=11) for name in ("ips", "snips", "dr")}
    for name, f in figures.items():
        assert f["coverage"] >= 0.93, (name, f)
        assert abs(f["bias"]) < f["width"] / 2, (name, f)
    assert abs(figures["ips"]["bias"]) < 4 * figures["ips"]["bias_se"]  # unbiased
    assert figures["dr"]["std"] <= figures["ips"]["std"]


def test_t_quantiles_match_the_table() -> None:
    for df, expected in [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (19, 2.093), (120, 1.980)]:
        assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)
    # The tails a 99% or 99.9% interval uses, at few degrees of freedom (the expansion was 4% short at df 3).
    for p, df, expected in [(0.995, 3, 5.841), (0.995, 4, 4.604), (0.9995, 3, 12.924), (0.9995, 4, 8.610),
                            (0.9995, 10, 4.587), (0.9995, 30, 3.646), (0.9995, 60, 3.460)]:
        assert t_quantile(p, df) == pytest.approx(expected, abs=5e-4), (p, df)
    assert t_quantile(0.9995, 3.7) == t_quantile(0.9995, 3)  # fractional df rounds down: wider, never narrower
    assert t_quantile(0.025, 7) == -t_quantile(0.975, 7)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"actions": [0, 1, 1, 2]}, "rewards: has 5 entries but there are 4 episodes"),
        ({"actions": [0, 1, 1, 3, 0]}, "actions[3]: 3 is not an action index in [0, 3)"),
        ({"actions": [0, 1, 1.5, 2, 0]}, "actions: must be integer action indices"),
        ({"actions": ["a", "b", "c", "d", "e"]}, "actions: must hold numbers"),
        ({"actions": [0]}, "actions: an estimate needs at least 2 logged episodes"),
        ({"rewards": [1.0, float("nan"), 0, 0, 0]}, "rewards[1]: nan is not a finite number"),
        ({"logged_probabilities": [0.5, 0.0, 0.25, 0.25, 0.5]}, "logged_probabilities[1]: 0.0 is not a probability"),
        ({"logged_probabilities": [0.5, 1.5, 0.25, 0.25, 0.5]}, "logged_probabilities[1]: 1.5 is not a probability"),
        ({"target_probabilities": [[0.2, 0.6, 0.3]] * 5}, "target_probabilities[0]: sums to 1.1, not 1"),
        ({"target_probabilities": [[0.2, 0.8]] * 5}, "actions[3]: 2 is not an action index in [0, 2)"),
        ({"target_probabilities": [[0.2, 0.6, 0.2]] * 4}, "target_probabilities: shape (4, 3), expected (5, 3)"),
        ({"target_probabilities": [[-0.2, 1.0, 0.2]] * 5}, "target_probabilities[0, 0]: -0.2 is not a probability"),
        ({"target_probabilities": [0.2, 0.6, 0.2]}, "target_probabilities: shape (3,), expected (n, K)"),
        ({"target_probabilities": [[0.2, "x", 0.2]] * 5}, "target_probabilities: not an array of numbers"),
        ({"estimator": "magic"}, "estimator: 'magic' is not one of ips, snips, dr"),
        ({"confidence": 1.0}, "confidence: 1.0 must be between 0 and 1"),
        ({"clip": 0}, "clip: 0 must be a positive number"),
        ({"groups": [0, 1]}, "groups: needs one integer per episode (5)"),
    ],
)
def test_bad_inputs_name_the_field(change: dict, message: str) -> None:
    args = {"actions": ACTIONS, "rewards": REWARDS, "logged_probabilities": LOGGED, "target_probabilities": TARGET}
    args.update(change)
    with pytest.raises(ValueError) as err:
        estimate(**args)
    assert message in str(err.value)


def test_a_target_that_never_chooses_a_logged_action_has_nothing_to_estimate_from() -> None:
    with pytest.raises(NoOverlap, match="target_probabilities: the target gives probability 0 to every logged action"):
        estimate([0, 0, 1], [1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [[0.0, 0.0, 1.0]] * 3, estimator="dr")


@pytest.mark.parametrize("rate", [0.02, 0.98])
def test_a_metrics_interval_for_one_policy_stays_within_the_values_it_can_take(rate: float) -> None:
    rng = np.random.default_rng(0)
    failed = (rng.random(60) < rate).astype(np.float64)  # a tool-failure rate near 0 or 1, on 60 episodes
    failed[0] = 1.0 - round(rate)  # and at least one episode the other way
    logged, candidate, current = np.full(60, 0.5), rng.uniform(0.2, 0.8, 60), np.full(60, 0.5)
    cand, cur, diff = compare_metric(TOOL_FAILURES, failed, logged, candidate, current, 0.95)  # type: ignore[misc]
    uncut = compare(Logs.of(np.zeros(60, dtype=np.int64), failed, logged, 1), Target.of_chosen(candidate),
                    Target.of_chosen(current), SNIPS(), 0.95)
    assert uncut[0].low < 0 if rate < 0.5 else uncut[0].high > 1  # the normal approximation leaves [0, 1]
    assert 0.0 <= cand.low <= cand.value <= cand.high <= 1.0 and 0.0 <= cur.low <= cur.high <= 1.0
    assert (cand.value, cur.value, diff) == (uncut[0].value, uncut[1].value, uncut[2])  # the difference is not cut
    seconds = compare_metric(LATENCY, np.r_[np.zeros(59), 900.0], logged, candidate, current, 0.95)
    assert seconds is not None and seconds[0].low == 0.0 and seconds[0].high > 900 / 60


def test_with_the_rewards_range_an_estimate_stays_in_it_and_a_small_sample_keeps_a_width() -> None:
    """Right after a quick start every logged reward is 1: the intervals once read
    ``ips 2.000 [2.000, 2.000]`` and ``snips 1.000 [1.000, 1.000]``."""
    actions, rewards, logged = [0, 0], [1.0, 1.0], [0.5, 0.5]
    always_first = [[1.0, 0.0]] * 2
    ips = estimate(actions, rewards, logged, always_first, estimator="ips", bounds=(0, 1))
    assert (ips.value, ips.clipped_from, ips.high) == (1.0, 2.0, 1.0) and 0 <= ips.low < 1
    for name in ("snips", "dr"):
        e = estimate(actions, rewards, logged, always_first, estimator=name, bounds=(0, 1))
        assert 0 <= e.low < e.value == e.high == 1.0 and e.clipped_from is None
    logs = Logs.of(actions, rewards, logged, 2)
    same = compare(logs, Target.of(always_first, 2), Target.of(always_first, 2), SNIPS(), bounds=(0, 1))[2]
    assert same.low == same.value == same.high == 0.0  # one policy against itself: exactly no difference
    uniform = Target.of([[0.5, 0.5]] * 2, 2)
    apart = compare(logs, Target.of(always_first, 2), uniform, SNIPS(), bounds=(0, 1))[2]
    assert -1 <= apart.low < apart.value == 0.0 < apart.high <= 1  # the other action was never tried
    with pytest.raises(ValueError, match=r"bounds: \(1, 0\)"):
        estimate(actions, rewards, logged, always_first, bounds=(1, 0))


def test_a_small_sample_interval_within_the_rewards_range_covers_a_truth_near_its_edge() -> None:
    """16 on-policy episodes of a 0/1 reward with mean 0.95: all 16 are 1 in 44% of samples,
    where the interval without the range collapsed onto 1 and missed the truth."""
    rng = np.random.default_rng(14)
    n, truth = 16, 0.95
    covered = {None: 0, (0.0, 1.0): 0}
    for _ in range(400):
        rewards = (rng.random(n) < truth).astype(float)
        for bounds in covered:
            e = estimate(np.zeros(n, dtype=np.int64), rewards, np.ones(n), np.ones((n, 1)), bounds=bounds)
            covered[bounds] += e.low <= truth <= e.high
    assert covered[(0.0, 1.0)] / 400 >= 0.93 and covered[None] / 400 < 0.6, covered


def test_an_estimate_relying_on_rarely_logged_actions_is_unreliable_and_the_guardrail_does_not_publish_it() -> None:
    """K=100 logged uniformly, n=200, a target with half its mass on one action: whether that action was
    logged or not, the effective sample size can look fine while the interval misses; the diagnostics see it."""
    from agent_learning.evaluation import GuardrailConfig, judge

    rng = np.random.default_rng(5)
    n, k = 200, 100
    unreliable = 0
    for _ in range(20):
        actions = rng.integers(k, size=n)
        rewards = (rng.random(n) < np.where(actions == 0, 0.9, 0.4)).astype(float)
        target = np.full((n, k), 0.5 / (k - 1))
        target[:, 0] = 0.5
        found = estimate(actions, rewards, np.full(n, 1 / k), target, bounds=(0, 1))
        assert found.diagnostics is not None
        unreliable += not found.diagnostics.reliable
        verdict = judge(GuardrailConfig(), rewards, np.full(n, 1 / k), target[np.arange(n), actions], np.full(n, 1 / k))
        assert verdict.verdict == "held" or (found.diagnostics.reliable and verdict.verdict == "published")
    assert unreliable >= 18
    ordinary = estimate(actions, rewards, np.full(n, 1 / k), np.full((n, k), 1 / k), bounds=(0, 1))
    assert ordinary.diagnostics is not None and ordinary.diagnostics.reliable
    assert ordinary.diagnostics.mean_weight == pytest.approx(1.0)


@pytest.mark.parametrize(("k", "n"), [(4, 200), (16, 200)])
def test_a_rare_action_targets_intervals_that_miss_are_marked_unreliable(k: int, n: int) -> None:
    """The coverage grid's cells where the intervals cover less than 90% (a target with 90% of its mass
    on the actions logged least, few episodes): there, 90% of the misses must be marked unreliable."""
    figures = bench.grid_cell(bench.Cell(k, "rare actions"), n, reps=150, seed=3)
    assert figures["coverage"] < bench.GRID_COVERS, figures  # the cell where the rule rests on the diagnostics
    assert bench.passes(figures), figures


def test_the_coverage_grid_prints_every_cell() -> None:
    rows = bench.coverage_grid(reps=3)
    assert len(rows) == len(bench.GRID_ACTIONS) * len(bench.GRID_EPISODES) * len(bench.GRID_TARGETS)


@pytest.mark.parametrize(("neglected", "reliable"), [(15, True), (5, False)])
def test_a_step_towards_neglected_actions_is_judged_once_enough_episodes_took_them(neglected: int,
                                                                                   reliable: bool) -> None:
    """100 episodes of a version that puts the rest of its mass on one action, and a candidate with 40% on the
    three it neglects (each logged below 10 expected episodes): taken by 15 episodes in all, what they earn
    is measured and the estimate was wrongly unreliable (the step the world's change asks for was shrunk);
    taken by 5, it rests on those few."""
    from agent_learning.evaluation import weight_diagnostics

    n, lead = 100, 1 - neglected / 100
    logged = np.array([lead] * (n - neglected) + [neglected / 300] * neglected)
    target = np.array([0.6] * (n - neglected) + [0.4 / 3] * neglected)
    found = weight_diagnostics(target / logged, logged)
    assert found.mean_weight == pytest.approx(1.0) and found.rare_mass == pytest.approx(0.4)
    assert found.reliable is reliable, found.problem
