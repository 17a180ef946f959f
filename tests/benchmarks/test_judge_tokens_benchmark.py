"""The judge-token benchmark (``benchmarks/judge_tokens.py``) against the local judge server: it
judges its episode with the limits the judge uses and adds up what each evaluator is admitted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("azure.ai.evaluation")

from benchmark_modules import load_benchmark

bench = load_benchmark("judge_tokens")


def test_it_measures_every_evaluator_and_adds_up_what_an_episode_is_admitted(tmp_path: Path) -> None:
    out = tmp_path / "judge_tokens.json"
    bench.main(["--json", str(out)])  # a judging that fails raises, and the script would exit 1
    results = json.loads(out.read_text())
    rows = list(results["evaluators"].values())
    assert len(rows) == 3 and all(row["prompt_tokens"] > 0 and row["max_tokens"] > 0 for row in rows)
    assert results["admitted_per_episode"] == results["prompt_tokens_per_episode"] + sum(
        row["max_tokens"] for row in rows
    )
