"""Personalizer rank latency through ``agent-learn serve``: median and p99 for 4 and 50 actions.

    python benchmarks/personalizer.py [--requests 2000] [--json benchmarks/results/personalizer.json]

Starts ``agent-learn serve`` on a fresh embedded store (its pipeline running in the background, as
served), then sends rank requests one after another over one kept-alive connection, each with 2
context features and actions described by 3 categorical features, and a new event id; the first
:data:`WARMUP` of each size create the agent and are not counted. Wall time per request, client
side, so HTTP, the handler and the store's writes are all in it. Progress on stderr; the table on
stdout.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (4, 50)
WARMUP = 50
"""Requests per size sent first and not counted (the agent's creation, caches)."""


def rank_body(k: int, i: int) -> bytes:
    actions = [{"id": f"a{j}", "features": [{"colour": f"c{j % 5}", "size": f"s{j % 3}", "brand": f"b{j % 7}"}]}
               for j in range(k)]
    context = [{"user": {"tier": ("gold", "silver")[i % 2]}}, {"device": ("mobile", "desktop", "tv")[i % 3]}]
    return json.dumps({"contextFeatures": context, "actions": actions, "eventId": f"k{k}-{i}"}).encode()


def serve(folder: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    """``agent-learn serve`` on ``folder/bench.db``, once it listens: the process, host and port."""
    log = (folder / "serve.out").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "agent_learning.cli", "serve", "--db", str(folder / "bench.db"),
                                "--port", "0"], stdout=log, stderr=subprocess.DEVNULL, cwd=folder)
    deadline = time.monotonic() + 60
    while not (found := re.search(r"http://([^:/\s]+):(\d+)/api/", (folder / "serve.out").read_text())):
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"agent-learn serve did not start (exit {process.poll()})")
        time.sleep(0.05)
    return process, found.group(1), int(found.group(2))


def latencies_ms(host: str, port: int, k: int, requests: int) -> list[float]:
    """Wall time of each counted rank of ``k`` actions, in ms."""
    connection = http.client.HTTPConnection(host, port, timeout=30)
    path = f"/api/agents/bench-{k}/personalizer/rank?api-version=2022-09-01-preview"
    out = []
    for i in range(WARMUP + requests):
        body = rank_body(k, i)
        start = time.perf_counter()
        connection.request("POST", path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        took = (time.perf_counter() - start) * 1000
        if answer.status != 201:
            raise SystemExit(f"rank of {k} actions answered {answer.status}")
        if i >= WARMUP:
            out.append(took)
        if i % 500 == 0:
            print(f"{k} actions: {i} requests", file=sys.stderr)
    connection.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="counted requests per size")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        process, host, port = serve(Path(folder))
        try:
            for k in SIZES:
                times = sorted(latencies_ms(host, port, k, args.requests))
                rows[k] = {"median_ms": statistics.median(times), "p99_ms": times[int(0.99 * (len(times) - 1))],
                           "requests": len(times)}
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"{'actions':>7}  {'median ms':>9}  {'p99 ms':>7}  requests")
    for k, row in rows.items():
        print(f"{k:>7}  {row['median_ms']:>9.2f}  {row['p99_ms']:>7.2f}  {row['requests']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
