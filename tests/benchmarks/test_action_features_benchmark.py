"""The action-features benchmark (``benchmarks/action_features.py``) at a tiny horizon: ours with and
without features runs, meets the same luck again, and the new actions' figure is measured."""

from __future__ import annotations

import math

import pytest
from benchmark_modules import load_benchmark

bench = load_benchmark("action_features")


@pytest.mark.parametrize("features", [True, False])
def test_ours_runs_offering_the_new_actions_halfway_and_meets_the_same_luck_again(features: bool) -> None:
    def make(problem: object, seed: int) -> object:
        return bench.Ours(problem, features=features)

    name, regret, reached = bench.run(make, seed=3, horizon=600)
    again = bench.run(make, seed=3, horizon=600)
    assert again == (name, regret, reached)
    assert 0.0 < regret < 600 and (reached == math.inf or 250 <= reached <= 300)
    assert name.startswith("REINFORCE (ours)")
