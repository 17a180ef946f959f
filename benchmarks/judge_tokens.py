"""Judge tokens: how many completion tokens each evaluator's reply needs, how many prompt tokens
it sends, and so how many tokens Azure OpenAI admits per judged episode (prompt + max_tokens per
call) with the evaluators' own limits and with ours.

    python benchmarks/judge_tokens.py [--json results.json]

Completion sizes are measured on what the evaluators' prompty files ask for: every example reply
(``EXPECTED OUTPUT``) they contain, and a reply at the limits their output format states (word
counts per field, filled with the examples' own words). Prompt tokens are those of the requests
the real evaluators send for the benchmark episode (recorded by the local judge server), plus the
chat format's 3 tokens per message and 3 per reply. Text is tokenised with the o200k_base
encoding (gpt-4o, gpt-4o-mini) through ``tiktoken`` or ``bpe-openai`` when either is installed
and its encoding loads (``pip install bpe-openai``: it ships the encoding), else estimated at 4
characters per token, and the output says which.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from judge_server import JudgeServer  # noqa: E402  (tests/fakes is not a package)
from judge_throughput import make_episode  # noqa: E402

from agent_learning.judges import prompty  # noqa: E402
from agent_learning.judges.evaluators import EvaluatorJudge, JudgeModel, JudgeTokens, _evaluator_classes  # noqa: E402
from agent_learning.judges.metrics import INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION  # noqa: E402

# The longest reply each output format allows, as (field, words) pairs: the word limits the prompty
# files state ("15-60 words"). Task adherence states none ("some sentences citing evidence and
# per-dimension pass/fail"): three dimensions at two sentences of 25 words each are assumed.
FORMAT_LIMITS: dict[str, list[tuple[str, int]]] = {
    INTENT_RESOLUTION: [("reason", 60)],
    TASK_ADHERENCE: [("reason", 150)],
    TASK_COMPLETION: [("reason", 60), ("task_requirements", 60), ("delivered_outcome", 60), ("completion_gaps", 60)],
}
HEADROOM = 2.0
"""A limit is HEADROOM × the longest reply the format allows, rounded up to the next 100."""
PER_MESSAGE = 3
"""Tokens the chat format adds per message (and once for the reply), as OpenAI counts them."""


def tokenizer() -> tuple[str, Callable[[str], int]]:
    """(name, count) for o200k_base, or the 4-characters-per-token estimate."""
    for module in ("tiktoken", "bpe_openai"):
        try:
            encoding = __import__(module).get_encoding("o200k_base")
            encoding.encode("probe")
            return f"o200k_base ({module})", lambda text, encoding=encoding: len(encoding.encode(text))
        except Exception:  # not installed, or its encoding cannot be loaded here
            continue
    return "estimate: 4 characters per token", lambda text: math.ceil(len(text) / 4)


def examples(template: str) -> list[dict[str, Any]]:
    """Every JSON reply example in a prompt template that carries a score."""
    found = []
    for match in re.finditer(r"^\{\n.*?^\}$", template, re.M | re.S):
        try:
            reply = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(reply, dict) and "score" in reply:
            found.append(reply)
    return found


def longest_reply(metric: str, words: list[str]) -> str:
    """A reply at the format's limits, its text made of the examples' words (pretty-printed, as they show it)."""

    def text(n: int) -> str:
        return " ".join(words[i % len(words)] for i in range(n))

    fields = dict((name, text(n)) for name, n in FORMAT_LIMITS[metric])
    reply: dict[str, Any] = {"reason": fields.pop("reason")}
    if fields:
        reply["properties"] = fields
    reply.update({"score": 1, "status": "completed"})
    return json.dumps(reply, indent=2, ensure_ascii=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    name, count = tokenizer()
    ours = JudgeTokens()
    results: dict[str, Any] = {"tokenizer": name, "headroom": HEADROOM, "evaluators": {}}
    with JudgeServer() as server:
        model = JudgeModel(base_url=server.base_url, model=server.model, api_key=server.api_key)
        judge = EvaluatorJudge(model, tokens=ours)  # a reply cut at its limit would fail the judging
        stock = {m: prompty.stock_flow(e) for m, e in judge.evaluators.items()}
        prompty_limits = {
            m: prompty.completion_limit(cls(model.model_config())) for m, cls in _evaluator_classes().items()
        }
        judge.judge(make_episode(0))
        judge.close()
        bodies = {r.evaluator: r.body for r in server.requests}
    for metric, flow in stock.items():
        template = flow._template
        replies = [json.dumps(r, indent=2, ensure_ascii=False) for r in examples(template)]
        words = [w for r in examples(template) for w in str(r.get("reason", "")).split()] or ["word"]
        longest = longest_reply(metric, words)
        messages = bodies[metric]["messages"]
        prompt = sum(count(str(m["content"])) + PER_MESSAGE for m in messages) + PER_MESSAGE
        bound = count(longest)
        results["evaluators"][metric] = {
            "prompty_max_tokens": prompty_limits[metric],
            "examples": len(replies),
            "largest_example_tokens": max((count(r) for r in replies), default=None),
            "format_limit_tokens": bound,
            "suggested_max_tokens": math.ceil(HEADROOM * bound / 100) * 100,
            "max_tokens": getattr(ours, f"max_tokens_{metric}"),
            "prompt_tokens": prompt,
        }
    rows = results["evaluators"].values()
    prompt_total = sum(r["prompt_tokens"] for r in rows)
    results["prompt_tokens_per_episode"] = prompt_total
    results["admitted_per_episode_prompty_limits"] = prompt_total + sum(r["prompty_max_tokens"] for r in rows)
    results["admitted_per_episode"] = prompt_total + sum(r["max_tokens"] for r in rows)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
