"""Judge throughput: episodes scored per second by the azure-ai-evaluation judge adapter
(three real evaluators per episode) against the local OpenAI-compatible judge server, at
concurrency 1, 8 and 32, with the CPU time the scoring process spends per episode, and the
same three requests sent with one reused plain OpenAI client for comparison.

    python benchmarks/judge_throughput.py [--episodes 200] [--json results.json]
    python benchmarks/judge_throughput.py --profile 100      # cProfile of 100 episodes, top items

The judge server runs in a child process, so the process CPU time measured here (``time.process_time``
over a level, divided by its episodes) is the client side alone: the adapter, the evaluators and
the OpenAI client. The server answers in about 1 ms; a real judge model adds its own latency per
call, and with it throughput grows with concurrency up to the model's rate limit.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import math
import pstats
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "fakes"
sys.path.insert(0, str(FAKES))

from judge_server import JudgeServer  # noqa: E402  (tests/fakes is not a package)

from agent_learning.documents import Episode, Step  # noqa: E402
from agent_learning.judges.evaluators import EvaluatorJudge, JudgeModel  # noqa: E402

# The judge server in a child process: prints its address as one JSON line, serves until stdin closes.
SERVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from judge_server import JudgeServer
server = JudgeServer().start()
print(json.dumps({"base_url": server.base_url, "model": server.model, "api_key": server.api_key}), flush=True)
sys.stdin.read()
server.stop()
"""


class ServerProcess:
    """The local judge server in its own process (its CPU time is not the scorer's)."""

    def __enter__(self) -> ServerProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(FAKES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        address = json.loads(self.process.stdout.readline())
        self.base_url, self.model, self.api_key = address["base_url"], address["model"], address["api_key"]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


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


def adapter_run(judge: EvaluatorJudge, episodes: list[Episode], concurrency: int) -> tuple[float, float, list[float]]:
    """(wall seconds, process CPU seconds, per-episode latencies) of scoring ``episodes``."""
    latencies: list[float] = []

    def one(ep: Episode) -> None:
        t0 = time.perf_counter()
        judge.judge(ep)
        latencies.append(time.perf_counter() - t0)

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, episodes))
    return time.perf_counter() - t0, time.process_time() - cpu0, latencies


def request_bodies(judge_model_of: Any) -> list[dict]:
    """The three request bodies of one episode, as the evaluators send them (recorded in-process)."""
    with JudgeServer() as recorder:
        judge = EvaluatorJudge(judge_model_of(recorder))
        judge.judge(make_episode(0))
        judge.close()
        return [r.body for r in recorder.requests]


def raw_round_trips(server: ServerProcess, bodies: list[dict], n: int, post: bool = False) -> tuple[list[float], float]:
    """The same three requests per episode, concurrently, with one reused plain OpenAI client
    (``chat.completions.create``, or the client's ``post`` as the judge sends them): (per-episode
    seconds, process CPU seconds per episode)."""
    from openai import AsyncOpenAI  # lazy: as in the library
    from openai.types.chat import ChatCompletion

    async def run() -> list[float]:
        client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key or "none", max_retries=0)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            if post:
                await asyncio.gather(
                    *(client.post("/chat/completions", body=b, cast_to=ChatCompletion) for b in bodies)
                )
            else:
                await asyncio.gather(*(client.chat.completions.create(**b) for b in bodies))
            out.append(time.perf_counter() - t0)
        await client.close()
        return out

    cpu0 = time.process_time()
    times = asyncio.run(run())
    return times, (time.process_time() - cpu0) / n


LAYERS = (
    ("one evaluator call (x3)", "agent_learning/judges/evaluators.py", "_call"),
    ("  its prompty flow", "azure/ai/evaluation/_legacy/prompty/_prompty.py", "__call__"),
    ("  its prompty flow (shared client)", "agent_learning/judges/prompty.py", "__call__"),
    ("    new OpenAI client per call", "openai/_client.py", "__init__"),
    ("    prompt rendering (jinja2)", "azure/ai/evaluation/_legacy/prompty/_utils.py", "build_messages"),
    ("    openai chat.completions.create", "openai/resources/chat/completions/completions.py", "create"),
    ("      request transform", "openai/_utils/_transform.py", "async_maybe_transform"),
    ("      the client's POST", "openai/_base_client.py", "post"),
    ("      HTTP send and receive (httpx)", "httpx2/_client.py", "send"),
    ("      response parsing", "openai/_response.py", "parse"),
)
"""Nested parts of an episode's judging, by the function that does each (file, name); each
part's cumulative profiled time is reported as a share of the whole."""


def profile(judge: EvaluatorJudge, episodes: list[Episode], top: int) -> str:
    """cProfile of scoring ``episodes`` one after another, in the thread that runs the evaluators."""
    profiler = cProfile.Profile()
    runner = getattr(judge, "_runner", None)  # the judge's event-loop thread, where it has one
    if runner is not None:
        runner.call(profiler.enable)
    else:
        profiler.enable()
    cpu0 = time.process_time()
    for ep in episodes:
        judge.judge(ep)
    cpu = time.process_time() - cpu0
    if runner is not None:
        runner.call(profiler.disable)
    else:
        profiler.disable()
    out = io.StringIO()
    print(f"{len(episodes)} episodes, {cpu / len(episodes) * 1000:.1f} ms CPU each (profiled)", file=out)
    stats = pstats.Stats(profiler, stream=out)
    cumulative: dict[tuple[str, str], float] = {}
    for (path, _, name), (_, _, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        for _, where, function in LAYERS:
            if path.endswith(where) and name == function:
                cumulative[(where, function)] = cumulative.get((where, function), 0.0) + cumtime
    whole = stats.total_tt  # type: ignore[attr-defined]
    print("where it goes (cumulative share of the profiled time; recursion counted once per call):", file=out)
    for label, where, function in LAYERS:
        if (where, function) in cumulative:
            print(f"  {label:<42} {cumulative[(where, function)] / whole:6.1%}", file=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes per concurrency level")
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels, comma-separated")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N episodes instead")
    parser.add_argument("--top", type=int, default=25, help="rows of the profile to print")
    args = parser.parse_args()

    def model_of(server: Any) -> JudgeModel:
        return JudgeModel(base_url=server.base_url, model=server.model, api_key=server.api_key)

    with ServerProcess() as server:
        judge = EvaluatorJudge(model_of(server))
        judge.judge(make_episode(-1))  # warm up: first calls load prompts and TLS settings
        if args.profile:
            print(profile(judge, [make_episode(i) for i in range(args.profile)], args.top))
            judge.close()
            return
        results: dict[str, Any] = {"episodes": args.episodes, "levels": {}}
        for concurrency in (int(c) for c in args.levels.split(",")):
            episodes = [make_episode(i) for i in range(args.episodes)]
            print(f"concurrency {concurrency:>2}: scoring {len(episodes)} episodes ...", file=sys.stderr, flush=True)
            wall, cpu, latencies = adapter_run(judge, episodes, concurrency)
            level = {
                "episodes_per_second": round(len(episodes) / wall, 1),
                "cpu_ms_per_episode": round(cpu / len(episodes) * 1000, 1),
                "median_episode_ms": round(statistics.median(latencies) * 1000, 1),
                "p95_episode_ms": round(sorted(latencies)[int(0.95 * (len(latencies) - 1))] * 1000, 1),
            }
            results["levels"][str(concurrency)] = level
            print(f"concurrency {concurrency:>2}: {level}", file=sys.stderr, flush=True)
        judge.close()
        bodies = request_bodies(model_of)
        raw, raw_cpu = raw_round_trips(server, bodies, 200)
        results["raw_three_requests_median_ms"] = round(statistics.median(raw) * 1000, 1)
        results["raw_three_requests_cpu_ms"] = round(raw_cpu * 1000, 1)
        results["raw_three_posts_cpu_ms"] = round(raw_round_trips(server, bodies, 200, post=True)[1] * 1000, 1)
        first = results["levels"][min(results["levels"], key=int)]
        results["adapter_overhead_ms"] = round(first["median_episode_ms"] - results["raw_three_requests_median_ms"], 1)
        results["adapter_cpu_ms_beyond_raw"] = round(
            first["cpu_ms_per_episode"] - results["raw_three_requests_cpu_ms"], 1
        )

    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
