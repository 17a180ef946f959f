"""The factorized problems of the learning benchmark (``benchmarks/structured.py``) at tiny sizes:
every algorithm runs, the luck is common, and the forgetting reference forgets as stated."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from benchmark_modules import load_benchmark

from agent_learning.learning.reinforce import LearnerConfig

bench = load_benchmark("structured")
TINY = bench.FactorProblem("2×3 = 6", (2, 3), 300)


@pytest.mark.parametrize("make", bench.FACTOR_ALGORITHMS, ids=lambda m: m.name)
def test_every_factorized_algorithm_runs_and_meets_the_same_luck_again(make: object) -> None:
    table = TINY.table()
    worst = float(table.max() - table.min()) * TINY.horizon
    first, below = bench.run_factorized(TINY, make, seed=4)
    again, _ = bench.run_factorized(TINY, make, seed=4)
    assert 0.0 <= first <= worst and isinstance(below, bool)
    assert again == first


def test_the_forgetting_reference_fades_its_posteriors_with_the_learners_half_life() -> None:
    """Counts beyond the Beta(1, 1) prior shrink by 2^(−N/H) for a batch of N, then the batch adds."""
    half_life = LearnerConfig().evidence_half_life
    assert half_life is not None and bench.FadingDimensionThompson.half_life == half_life
    algo = bench.FadingDimensionThompson((2, 3), np.random.default_rng(0))
    algo.a[0][:] = [11.0, 3.0]
    algo.b[0][:] = [5.0, 1.0]
    local = np.array([[0, 2]] * 50)
    algo.update_local(local, np.ones(50), np.ones(50))
    fade = 0.5 ** (50 / half_life)
    np.testing.assert_allclose(algo.a[0], [1 + 10 * fade + 50, 1 + 2 * fade])
    np.testing.assert_allclose(algo.b[0], [1 + 4 * fade, 1.0])
    np.testing.assert_allclose(algo.a[1], [1.0, 1.0, 51.0])
    assert math.isclose(fade, 2 ** (-1 / 60))


def test_a_problem_drawn_per_seed_meets_a_new_instance_in_every_run_and_a_fixed_one_the_same() -> None:
    varied = bench.FactorProblem("6, drawn per seed", (2, 3), 300, varied=True)
    assert not np.array_equal(varied.table(1), varied.table(2))
    np.testing.assert_array_equal(varied.table(0), TINY.table(0))
    np.testing.assert_array_equal(TINY.table(1), TINY.table(2))
    # a run meets its own seed's instance, not the fixed one
    assert bench.run_factorized(varied, bench.DimensionThompson, seed=3) != bench.run_factorized(
        TINY, bench.DimensionThompson, seed=3
    )


def test_the_paired_standard_error_is_that_of_the_ratio() -> None:
    """The delta method's residuals regret − R·reference: a seed that keeps the ratio adds no doubt."""
    reference = np.array([10.0, 20.0, 30.0, 40.0])
    assert bench.paired_se(1.5 * reference, reference) == 0.0  # the same ratio on every seed: no doubt
    assert bench.paired_se(reference + 5.0, reference) > 0.0  # the same shift is a different ratio per seed
    regret = 1.5 * reference + np.array([1.0, -1.0, 3.0, -3.0])
    expected = np.std([1.0, -1.0, 3.0, -3.0], ddof=1) / 2.0 / 25.0
    assert math.isclose(bench.paired_se(regret, reference), expected)
    assert bench.paired_se(regret[:1], reference[:1]) == 0.0


def test_the_paired_standard_error_matches_the_spread_of_the_ratio_over_replications() -> None:
    rng = np.random.default_rng(5)
    ratios, errors = [], []
    for _ in range(2_000):
        reference = rng.uniform(50.0, 150.0, 50)
        regret = 1.5 * reference + rng.normal(0.0, 5.0, 50)
        ratios.append(regret.mean() / reference.mean())
        errors.append(bench.paired_se(regret, reference))
    assert math.isclose(float(np.mean(errors)), float(np.std(ratios)), rel_tol=0.1)


def test_the_contextual_rows_give_each_ratio_its_paired_standard_error() -> None:
    reference = [100.0, 150.0, 200.0]
    rows = {bench.RAW_PER_SEGMENT: bench.Row(reference), "ours": bench.Row([95.0, 140.0, 200.0], 1)}
    lines: list[str] = []
    out: dict[str, dict[str, dict[str, float]]] = {}
    bench._table_rows(lines, out, "2 segments", rows, bench.RAW_PER_SEGMENT, 3)
    se = bench.paired_se(np.array(rows["ours"].regret), np.array(reference))
    assert se > 0 and out["2 segments"]["ours"]["vs_reference_se"] == se
    assert out["2 segments"][bench.RAW_PER_SEGMENT]["vs_reference_se"] == 0.0
    assert lines[1] == f"| 2 segments | ours | 145.0 ± 43.0 | 0.97× ± {se:.2f} | 1/3 |"


def test_the_numeric_problem_is_checked_at_the_centre_of_every_bin_an_oracle_is_told() -> None:
    """One probe per bin, mirror-symmetric, none on a boundary (x = −0.5 fell in the inner bin and
    0.5 in the outer one), each with the best arm of its bin's mean rewards."""
    numeric = next(p for p in bench.CONTEXT_PROBLEMS if p.segments is None)
    probes = numeric.probes()
    np.testing.assert_array_equal(numeric.bin(probes), np.arange(numeric.bins))
    np.testing.assert_allclose(probes, -probes[::-1])
    for b, x in enumerate(probes):
        grid = np.linspace(-1.0, 1.0, 4_001)
        inside = grid[numeric.bin(grid) == b]
        assert numeric.means(inside).mean(axis=0).argmax() == numeric.means(np.array([x])).argmax()
    segments = next(p for p in bench.CONTEXT_PROBLEMS if p.segments == 4)
    np.testing.assert_array_equal(segments.probes(), [0.0, 1.0, 2.0, 3.0])


def test_the_factorized_tables_run_without_the_contextual_ones_and_plot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        bench, "FACTOR_PROBLEMS", [TINY, bench.FactorProblem("6, drawn per seed", (2, 3), 300, varied=True)]
    )
    lines, figures = bench.tables(2, t0=0.0, contextual=False)
    assert figures["contextual"] == {} and not any("contextual" in line for line in lines)
    assert list(figures["factorized"]) == ["2×3 = 6", "6, drawn per seed"]
    ours = figures["factorized"]["2×3 = 6"]["REINFORCE (ours)"]
    assert ours["vs_reference_se"] >= 0 and 0 <= ours["best_below_half"] <= 2
    assert sum(line.startswith("| 6, drawn per seed |") for line in lines) == len(bench.FACTOR_ALGORITHMS)
    bench.plot(figures, tmp_path / "structured.png")
    assert (tmp_path / "structured.png").stat().st_size > 0


def test_the_expected_regret_of_independent_draws_is_the_sum_over_every_configuration() -> None:
    rng = np.random.default_rng(3)
    table = rng.uniform(0.2, 0.8, (2, 3, 4))
    marginals = [rng.dirichlet(np.ones(k)) for k in table.shape]
    brute = sum(
        marginals[0][i] * marginals[1][j] * marginals[2][k] * (table.max() - table[i, j, k])
        for i in range(2)
        for j in range(3)
        for k in range(4)
    )
    assert math.isclose(bench.expected_regret(table, marginals), brute, rel_tol=1e-12)
    best = np.unravel_index(int(table.argmax()), table.shape)
    assert bench.expected_regret(table, [np.eye(k)[b] for k, b in zip(table.shape, best, strict=True)]) == 0.0


LONGER = bench.FactorProblem("2×3 = 6", (2, 3), 2 * bench.GAP_STRETCH)


def test_the_shadow_learns_from_the_same_episodes_as_the_algorithm_it_watches() -> None:
    """Watching per-dimension Thompson, the shadow's Thompson probabilities are the algorithm's own
    (up to sampling); on this problem the greedy choice on the same episodes costs no more by the end."""
    rows = np.mean([bench.stretch_regret(LONGER, bench.DimensionThompson, seed) for seed in range(6)], axis=0)
    assert rows.shape == (3, 2) and (rows >= 0).all()
    np.testing.assert_allclose(rows[1], rows[0], rtol=0.1)
    assert rows[2, -1] <= rows[0, -1]


def test_the_gap_table_has_ours_with_and_without_fading_and_thompson_per_stretch() -> None:
    lines = bench.gap_lines(LONGER, seeds=1, t0=0.0)
    assert lines[0].startswith("| 2×3 = 6: expected regret in the 500 episodes up to | 500 | 1,000 | total |")
    names = [line.split(" | ")[0].lstrip("| ") for line in lines[2:]]
    assert names == [
        "ours",
        "ours: Thompson's probabilities on its episodes",
        "ours: greedy on its episodes",
        "ours, evidence never fading",
        "ours, evidence never fading: Thompson's probabilities on its episodes",
        "ours, evidence never fading: greedy on its episodes",
        "per-dimension Thompson",
    ]
    for line in lines[2:]:
        first, second, total = (float(x) for x in line.strip("| ").split(" | ")[1:])
        assert math.isclose(first + second, total, abs_tol=0.11)


def test_the_factorized_rows_are_measured_against_raw_reward_thompson_per_dimension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench, "FACTOR_PROBLEMS", [TINY])
    lines, figures = bench.tables(2, t0=0.0, contextual=False)
    assert "| vs raw-reward Thompson per dimension (± paired se) |" in lines[0]
    rows = figures["factorized"]["2×3 = 6"]
    for reference in (bench.RawDimensionThompson, bench.FadingRawDimensionThompson):
        assert reference.name in rows and 0 <= rows[reference.name]["best_below_half"] <= 2
    assert rows[bench.RawDimensionThompson.name]["vs_reference"] == 1.0
    assert rows[bench.RawDimensionThompson.name]["vs_reference_se"] == 0.0
    assert bench.FadingRawDimensionThompson.half_life == LearnerConfig().evidence_half_life


def test_raw_reward_thompson_per_segment_runs_and_each_segment_forgets_by_its_own_episodes() -> None:
    two = bench.ContextProblem("2 segments", 4, 2, 200)
    for half_life in (None, LearnerConfig().evidence_half_life):
        regret, below = bench.run_contextual(
            two, lambda rng, seed, h=half_life: bench.RawThompsonCells(4, 2, two.bin, rng, "raw", h), seed=1
        )
        assert 0.0 < regret < 200 * 0.3 and isinstance(below, bool)
    algo = bench.RawThompsonCells(4, 2, two.bin, np.random.default_rng(0), "raw", 100.0)
    algo.update(np.array([0.0, 1.0]), np.array([2, 3]), np.array([1.0, 0.0]), np.ones(2))
    algo.update(np.array([0.0, 0.0, 0.0, 0.0]), np.array([1, 1, 1, 1]), np.ones(4), np.ones(4))
    np.testing.assert_allclose(algo.posterior.n[0], [0, 4, 0.5 ** (4 / 100), 0])  # faded by its 4 episodes
    np.testing.assert_allclose(algo.posterior.n[1], [0, 0, 0, 1])  # no episodes of its own: kept


def test_the_contextual_rows_are_measured_against_raw_reward_thompson_per_segment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("vowpalwabbit")
    monkeypatch.setattr(bench, "CONTEXT_PROBLEMS", [bench.ContextProblem("2 segments", 4, 2, 100)])
    out: dict[str, dict[str, dict[str, float]]] = {}
    lines = bench.contextual_lines(2, 0.0, out)
    assert "| vs raw-reward Thompson per segment (± paired se) |" in lines[0]
    rows = out["2 segments"]
    assert rows[bench.RAW_PER_SEGMENT]["vs_reference"] == 1.0 and rows[bench.RAW_PER_SEGMENT]["vs_reference_se"] == 0.0
    names = list(rows)
    assert names[:4] == [
        "REINFORCE (ours)",
        bench.RAW_PER_SEGMENT,
        "Thompson per segment, raw reward, forgetting",
        "Thompson per segment, Beta (told it)",
    ]
    assert any(name.startswith("VW ") for name in names)
    assert all(0 <= row["best_below_half"] <= 2 for row in rows.values())


def test_the_speed_rows_are_the_trainers_rows_read_from_score_documents() -> None:
    """What the benchmark times preparing is what the trainer hands the learner: the episodes'
    score documents read by ``collect``, one context object per distinct context, and they prepare
    into the same batch as the episodes given as arrays."""
    import random

    from agent_learning.learning.reinforce import Rows, prepare

    policy = bench.StructuredPolicy.create("speed", {"p": ["a", "b"], "k": [1, 3, 5]},
                                           context={"f0": "category", "f1": "category"}, rng=random.Random(0))
    rng = np.random.default_rng(1)
    n = 300
    contexts = [{f"f{i}": f"s{rng.integers(3)}" for i in range(2)} for _ in range(n)]
    actions, rewards = np.stack([rng.integers(0, 2, n), rng.integers(0, 3, n)], axis=1), rng.random(n)
    rows, read_ms = bench.trainer_rows(policy.document, actions, rewards, contexts, repeats=1)
    assert read_ms > 0 and len({id(c) for c in rows.contexts}) == len({tuple(c.values()) for c in contexts})
    _, _, read = prepare(policy.document, rows)
    _, _, given = prepare(policy.document, Rows(actions, rewards, np.full(n, 1 / 64), [False] * n, contexts))
    for name in ("actions", "rewards", "logged_probs", "corrections", "categories"):
        assert np.array_equal(getattr(read, name), getattr(given, name)), name
    assert bench.prepare_cpu_ms(policy.document, rows) > 0
