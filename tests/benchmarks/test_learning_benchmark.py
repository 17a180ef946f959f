"""The flat problems of the learning benchmark (``benchmarks/learning.py``) at small sizes: regret
against what the rewards really pay, the Gaussian Thompson reference, and the command line."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pytest
from benchmark_modules import load_benchmark

bench = load_benchmark("learning")


def test_regret_on_a_clipped_gaussian_problem_uses_the_clipped_means() -> None:
    """Clipping at 1 takes 0.03 off a mean of 0.8 with σ 0.25: the gaps are the clipped means'."""
    for problem in [p for p in bench.PROBLEMS if p.kind == "gaussian"]:
        paid = problem.draw(np.random.default_rng(0), 200_000).mean(axis=1)
        np.testing.assert_allclose(problem.expected, paid, atol=0.003)
        assert problem.best == int(np.argmax(paid))
    k4 = bench.PROBLEMS[0]
    np.testing.assert_array_equal(k4.expected, k4.means)  # Bernoulli: the means themselves

    gaussian = next(p for p in bench.PROBLEMS if p.name == "K=4 Gaussian")
    uniform, _, _, _ = bench.run(gaussian, bench.Uniform, seed=0, horizon=4_000)
    gaps = gaussian.expected.max() - gaussian.expected
    assert abs(uniform / 4_000 - gaps.mean()) < 0.01  # 0.132 per episode, not the unclipped 0.15


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "0"], "argument --seeds: must be at least 1 (got 0)"),
        (["--horizon", "-5"], "argument --horizon: must be at least 1 (got -5)"),
        (["--problems", "K=4 B,K=5"], "--problems: 'K=5' names no problem here (one of: K=4 Bernoulli,"),
        (["--gap", "--problems", "K=4"], "--problems: 'K=4' names no problem here (one of: 3×4×2 = 24,"),
    ],
)
def test_a_count_below_one_or_a_prefix_naming_no_problem_is_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--no-shift", "--no-structured"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err

def test_problems_are_named_by_prefixes_even_those_holding_a_comma() -> None:
    parser = argparse.ArgumentParser()
    factorized = bench.structured.FACTOR_PROBLEMS
    assert [p.name for p in bench.named(parser, factorized, "300, drawn")] == ["300, drawn per seed"]
    assert [p.name for p in bench.named(parser, factorized, "24,300")] == ["24, drawn per seed", "300, drawn per seed"]
    assert bench.named(parser, bench.PROBLEMS, "") == bench.PROBLEMS


def test_the_change_comes_after_exactly_horizon_episodes_whatever_the_batch() -> None:
    """A horizon that is not a whole number of batches ends with a short batch, as ``run`` does."""
    pulls: list[int] = []

    class Counting(bench.Uniform):
        def run_batch(self, env: object, n: int) -> tuple[np.ndarray, np.ndarray]:
            pulls.append(n)
            return super().run_batch(env, n)

    assert bench.recovery(Counting, seed=0, horizon=10) is None  # uniform never prefers the new best
    assert pulls[:1] == [10] and set(pulls[1:]) == {50}
    pulls.clear()
    next(bench.after_change(Counting, 0, 120, 50, bench.SHIFT_AFTER))
    assert pulls == [50, 50, 20, 50]


def test_gaussian_thompson_samples_each_mean_from_its_normal_posterior() -> None:
    """N((0.5 + Σr) / (n + 1), s² / (n + 1)), s² the sample variance (0.25 before two pulls)."""
    algo = bench.GaussianThompson(3, np.random.default_rng(0))
    algo.update(np.array([0, 0, 1]), np.array([0.6, 0.7, 0.2]), np.ones(3))
    mean, sd = algo.posterior()
    np.testing.assert_allclose(mean, [1.8 / 3, 0.7 / 2, 0.5])
    np.testing.assert_allclose(sd, [np.sqrt(0.005 / 3), np.sqrt(0.25 / 2), np.sqrt(0.25)])
    algo.update(np.array([2, 2]), np.array([0.4, 0.4]), np.ones(2))
    assert algo.posterior()[1][2] == np.sqrt(algo.min_variance / 3)  # agreeing rewards still leave doubt


def test_on_a_narrow_band_gaussian_thompson_sees_the_scale_the_beta_reference_does_not() -> None:
    narrow = next(p for p in bench.PROBLEMS if p.name.startswith("K=4 narrow band"))
    beta = [bench.run(narrow, bench.BatchedThompson, seed, 2_000) for seed in range(3)]
    gaussian = [bench.run(narrow, bench.GaussianThompson, seed, 2_000) for seed in range(3)]
    assert np.mean([r[0] for r in gaussian]) < np.mean([r[0] for r in beta]) / 5
    assert min(r[1] for r in gaussian) > 0.9


def test_the_guarded_learner_is_reviewed_as_the_trainer_reviews_it() -> None:
    """The guardrail as the trainer runs it: a step it cannot show safe is shrunk and applied, and a batch
    of 10 (fewer effective samples than the 30 it judges on) is held and learned again with the next,
    until 30 episodes speak for the step."""
    guarded: list[Any] = []

    def make(k: int, rng: np.random.Generator) -> Any:
        guarded.append(bench.Guarded(k, rng))
        return guarded[-1]

    by_name = {p.name: p for p in bench.PROBLEMS}
    bench.run(by_name["K=4 Bernoulli"], make, seed=0, horizon=2_000)
    bench.run(by_name["K=4 batch 10"], make, seed=0, horizon=600)
    hundreds, tens = guarded
    assert hundreds.shrunk > 0
    assert tens.held >= 2 * (tens.updates - tens.held) > 0


def test_the_table_divides_by_thompson_sampling_on_the_raw_reward_and_shows_it_beside_the_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench.main(["--seeds", "2", "--horizon", "100", "--problems", "K=4 Bernoulli", "--no-shift", "--no-structured"])
    lines = capsys.readouterr().out.splitlines()
    assert "| vs raw-reward Thompson (± paired se) | vs Beta Thompson |" in lines[0]
    rows = {line.split(" | ")[1]: line for line in lines[2:]}
    assert [bench.GaussianThompson.name, bench.FadingGaussianThompson.name, bench.BatchedThompson.name] == [
        name for name in rows if name.startswith("Thompson")
    ]
    assert " | 1.00× ± 0.00 | " in rows[bench.GaussianThompson.name]
    assert rows[bench.GaussianThompson.name].endswith("/2 |")  # its seeds below 0.5 too


def test_raw_reward_thompson_with_forgetting_fades_its_sums_with_the_learners_half_life() -> None:
    """n, Σr and Σr² shrink by 2^(−N/H) for a batch of N, then the batch adds; the prior does not fade."""
    half_life = bench.LearnerConfig().evidence_half_life
    assert half_life is not None and bench.FadingGaussianThompson.half_life == half_life
    fading = bench.FadingGaussianThompson(2, np.random.default_rng(0))
    plain = bench.GaussianThompson(2, np.random.default_rng(0))
    for algo in (fading, plain):
        algo.update(np.array([0, 0, 1]), np.array([1.0, 0.0, 1.0]), np.ones(3))
        algo.update(np.array([1, 1]), np.array([0.5, 0.5]), np.ones(2))
    keep = 0.5 ** (2 / half_life)
    np.testing.assert_allclose(fading.raw.n, [2 * keep, keep + 2])
    np.testing.assert_allclose(fading.raw.s, [keep, keep + 1.0])
    np.testing.assert_allclose(fading.raw.ss, [keep, keep + 0.5])
    np.testing.assert_allclose(plain.raw.n, [2, 3])
