"""The training-run figure of ``benchmarks/speed.py`` at a tiny size: every stage is timed where the
trainer calls it, and the run learns every score it was given."""

from __future__ import annotations

import pytest
from benchmark_modules import load_benchmark

bench = load_benchmark("speed")


def test_a_training_run_is_timed_stage_by_stage_over_every_score() -> None:
    figures = bench.training_run_cpu_ms(scores=300, repeats=1)  # asserts the run learned all 300
    assert set(figures) == {*bench.TRAIN_STAGES, "total"}
    stages = [figures[stage] for stage in bench.TRAIN_STAGES]
    assert all(ms > 0 for ms in stages[:-1]) and sum(stages) == pytest.approx(figures["total"])
