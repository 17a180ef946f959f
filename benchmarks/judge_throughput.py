"""Judge throughput: episodes scored per second by the azure-ai-evaluation judge adapter
(three real evaluators per episode) against the local OpenAI-compatible judge server, at
concurrency 1, 8 and 32, and the per-episode overhead the adapter adds beyond the HTTP round
trips (the same three requests sent concurrently with a plain OpenAI client).

    python benchmarks/judge_throughput.py [--episodes 200] [--json results.json]

The judge server answers in ~1 ms, so these figures measure the client side: the adapter and
the evaluators (which build a new HTTP client for every call). A real judge model adds its
own latency per call; with it, throughput scales with concurrency until the model's rate limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from judge_server import JudgeServer

from agent_learning.documents import Episode, Step
from agent_learning.judges.evaluators import EvaluatorJudge, JudgeModel


def make_episode(i: int) -> Episode:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Episode(
        id=f"bench-{i}",
        agent_id="support-bot",
        policy_version=1,
        action_id="k=3",
        probability=0.25,
        logprob=math.log(0.25),
        input=f"How do I reset my password? (ticket {i})",
        output=f"Open Settings, choose Security and select Reset password. [judge:{('good', 'mid', 'bad')[i % 3]}]",
        instructions="Answer concisely from the knowledge base.",
        steps=[
            Step(
                name="search",
                status="ok",
                latency_ms=12,
                arguments={"q": "reset password"},
                result="Settings > Security > Reset password",
                call_id="call_1",
            )
        ],
        started_at=now,
        ended_at=now + timedelta(seconds=2),
    )


def adapter_run(judge: EvaluatorJudge, episodes: list[Episode], concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []

    def one(ep: Episode) -> None:
        t0 = time.perf_counter()
        judge.judge(ep)
        latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, episodes))
    return time.perf_counter() - t0, latencies


def raw_round_trips(server: JudgeServer, bodies: list[dict], n: int) -> list[float]:
    """The same three requests per episode, concurrently, with one reused plain OpenAI client."""
    from openai import AsyncOpenAI

    async def run() -> list[float]:
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key or "none", max_retries=0)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            await asyncio.gather(*(client.chat.completions.create(**b) for b in bodies))
            out.append(time.perf_counter() - t0)
        await client.close()
        return out

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per concurrency level")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()

    results: dict[str, object] = {"episodes": args.episodes, "levels": {}}
    with JudgeServer() as server:
        judge = EvaluatorJudge(JudgeModel(base_url=server.base_url, model=server.model, api_key=server.api_key))
        judge.judge(make_episode(-1))  # warm up: first calls load prompts and TLS settings
        bodies = [r.body for r in server.requests[-3:]]
        for concurrency in (1, 8, 32):
            episodes = [make_episode(i) for i in range(args.episodes)]
            print(f"concurrency {concurrency:>2}: scoring {len(episodes)} episodes ...", file=sys.stderr, flush=True)
            wall, latencies = adapter_run(judge, episodes, concurrency)
            level = {
                "episodes_per_second": round(len(episodes) / wall, 1),
                "median_episode_ms": round(statistics.median(latencies) * 1000, 1),
                "p95_episode_ms": round(sorted(latencies)[int(0.95 * (len(latencies) - 1))] * 1000, 1),
            }
            results["levels"][str(concurrency)] = level  # type: ignore[index]
            print(f"concurrency {concurrency:>2}: {level}", file=sys.stderr, flush=True)
        raw = raw_round_trips(server, bodies, 100)
        adapter_median = results["levels"]["1"]["median_episode_ms"]  # type: ignore[index]
        raw_median = statistics.median(raw) * 1000
        results["raw_three_requests_median_ms"] = round(raw_median, 1)
        results["adapter_overhead_ms"] = round(adapter_median - raw_median, 1)
        server_ms = [r for r in server.requests if r.outcome == "answered"]
        results["requests_answered"] = len(server_ms)

    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
