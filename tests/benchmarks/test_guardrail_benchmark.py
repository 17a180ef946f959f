"""The guardrail benchmark (``benchmarks/guardrail.py``) at a tiny horizon: its runs meet common random
numbers (a guardrail that never steps in leaves every run as it was), and its per-seed figures add up."""

from __future__ import annotations

import math

from benchmark_modules import load_benchmark

from agent_learning.evaluation import GuardrailConfig

bench = load_benchmark("guardrail")


def test_a_guardrail_that_only_warns_sees_the_same_episodes_and_publishes_the_same_versions() -> None:
    warned = bench.run(5, 600, bench.Recording(), GuardrailConfig(mode="warn"), change_at=300)
    off = bench.run(5, 600, bench.Recording(), None, change_at=300)
    assert [r[2:] for r in warned["rows"]] == [r[2:] for r in off["rows"]]
    assert (warned["regret"], warned["recovered"]) == (off["regret"], off["recovered"])
    enforced = bench.run(5, 600, bench.Recording(scale=10), bench.GUARD, change_at=300)
    assert any(r[0] == "held" or r[1] == "shrunk" for r in enforced["rows"])  # the tenfold step is stopped


def test_the_benchmark_runs_every_scenario_at_a_tiny_size_and_its_ratios_carry_their_error() -> None:
    sizes = {"healthy_episodes": 300, "bad_episodes": 300, "change_at": 200, "after_change": 300}
    seed = bench.one_seed(2, **sizes)
    assert seed["healthy"]["runs"] == 3 and seed["healthy"]["regret_off"] > 0
    for name in ("gone wrong", "tenfold"):
        worse, stopped, _ = seed[name]
        assert 0 <= stopped <= worse
    for side in ("on", "off"):
        took, missed, lost = seed[f"recovery {side}"]
        assert (took == 300) == missed and lost >= 0
    found = bench.main(seeds=2, **sizes)
    assert 0 <= found["healthy"]["false_holds"] <= 1 and found["healthy"]["regret_ratio"][0] > 0
    assert all(0 <= found[name]["caught"] <= 1 for name in ("gone wrong", "tenfold"))
    assert found["world changes"]["on"] <= 300 and found["world changes"]["off"] <= 300
    ratio, error = bench.ratio_and_error([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert (ratio, error) == (2.0, 0.0)
    ratio, error = bench.ratio_and_error([1.0, 3.0, 2.0], [2.0, 1.0, 2.0])
    assert math.isclose(ratio, 6 / 5) and error > 0
