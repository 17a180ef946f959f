"""Store access of the trainer: SQLite's score query at 1M scores, Cosmos requests per run.

    python benchmarks/store_access.py [--scores 1000000] [--versions 5000]
                                      [--json benchmarks/results/store_access.json]
                                      [--no-sqlite] [--no-history] [--no-cosmos]

SQLite: one agent with ``--scores`` scores; the trainer's query for the newest 100 (its cursor
near the end, as on every tick) with the cursor condition written both ways: the
``seq > ? OR (seq = ? AND id > ?)`` form, which SQLite serves from the index's agent_id column
only (it walks the agent's history up to the cursor), and the row-value ``(seq, id) > (?, ?)``
form, which seeks the (agent_id, seq, id) index to the cursor. Median of 21 runs, and
``SQLiteStore.read_scores`` itself.

History: one agent with ``--versions`` policy versions in SQLite (a two-dimension policy with a
context feature); the time to read its history, every version (what ``agent-learn policy
history`` read before it asked the store for the newest only) and the newest 5 (``--limit 5``).

Cosmos: the real azure-cosmos SDK against the local Cosmos server (``tests/fakes``, needs Node),
every HTTP request counted as the client sends it (``tests/support/cosmos_requests.py``): one
training run of an agent with 50 new scores, and one of an agent without, after a first run
of each (so each current version has a run record, and the SDK's metadata caches are warm).
The local server answers every query by scanning, so only request counts mean anything there.
The fan-out's two reads are counted too: ``has_new_scores`` and ``training_cursors``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from agent_learning.store.sqlite import SQLiteStore  # noqa: E402

OLD_QUERY = (
    "SELECT seq, id, doc FROM scores WHERE agent_id = ? AND (seq > ? OR (seq = ? AND id > ?)) ORDER BY seq, id LIMIT ?"
)
NEW_QUERY = "SELECT seq, id, doc FROM scores WHERE agent_id = ? AND (seq, id) > (?, ?) ORDER BY seq, id LIMIT ?"
NEW_SCORES = 100
"""Scores after the cursor in the SQLite measurement (a tick's worth)."""
REPEATS = 21
VERSIONS = 5_000
"""Policy versions in the history measurement: about 17 days of a 5-minute training timer."""


def sqlite_figures(n: int) -> dict[str, Any]:
    """Median milliseconds of the trainer's query at ``n`` scores, both forms and the store's."""
    from agent_learning.documents import ScoreCursor

    folder = Path(tempfile.mkdtemp(prefix="store-access-"))
    try:
        path = folder / "store.db"
        SQLiteStore(path).close()  # the schema
        doc = json.dumps({"agent_id": "bench", "reward": 0.5, "action_id": "a"})
        with sqlite3.connect(path) as conn:
            conn.executemany(
                "INSERT INTO scores (id, agent_id, seq, doc) VALUES (?, 'bench', ?, ?)",
                ((f"ep-{i:08d}", i, doc) for i in range(1, n + 1)),
            )
            conn.execute("ANALYZE")
        cursor = n - NEW_SCORES
        after = (f"ep-{cursor:08d}",)

        def median_ms(call: Any) -> float:
            runs = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                rows = call()
                runs.append((time.perf_counter() - t0) * 1e3)
                assert len(rows) == NEW_SCORES, len(rows)
            return statistics.median(runs)

        with sqlite3.connect(path) as conn:
            old = median_ms(lambda: conn.execute(OLD_QUERY, ("bench", cursor, cursor, after[0], 1000)).fetchall())
            new = median_ms(lambda: conn.execute(NEW_QUERY, ("bench", cursor, after[0], 1000)).fetchall())
            plans = {
                "or_form": [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {OLD_QUERY}", ("b", 1, 1, "x", 1))],
                "row_value": [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {NEW_QUERY}", ("b", 1, "x", 1))],
            }
        with SQLiteStore(path) as store:
            store_ms = median_ms(lambda: store.read_scores("bench", ScoreCursor(seq=cursor, id=after[0]), 1000))
        return {
            "scores": n,
            "new_scores": NEW_SCORES,
            "or_form_ms": old,
            "row_value_ms": new,
            "read_scores_ms": store_ms,
            "plans": plans,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def history_figures(n: int) -> dict[str, Any]:
    """Milliseconds to read the history of an agent with ``n`` versions (one a minute): all, the
    newest 5, and the 5 created in a window of five minutes in the middle."""
    from agent_learning.ops.history import history
    from agent_learning.policy.softmax import StructuredPolicy

    folder = Path(tempfile.mkdtemp(prefix="store-access-"))
    try:
        doc = StructuredPolicy.create(
            "bench",
            {"prompt": ["concise", "step-by-step", "empathetic"], "retrieval_k": [1, 3, 5]},
            context={"task": "category"},
        ).document
        with SQLiteStore(folder / "store.db") as store:
            minute = timedelta(minutes=1)
            for v in range(1, n + 1):
                version = doc.model_copy(update={"version": v, "created_at": doc.created_at + v * minute})
                store.create_policy_version(version.as_kind("version"))
            store.replace_current_policy(doc.model_copy(update={"version": n}).as_kind("current"), None)
            out: dict[str, Any] = {"versions": n}
            middle = doc.created_at + (n // 2) * minute
            for key, newest, since, until, expected in (
                ("all_ms", None, None, None, n),
                ("newest_5_ms", 5, None, None, min(5, n)),
                ("window_5_ms", None, middle, middle + 4 * minute, min(5, n - n // 2 + 1)),
            ):
                t0 = time.perf_counter()
                read = history(store, "bench", newest, since=since, until=until)
                out[key] = (time.perf_counter() - t0) * 1e3
                assert len(read.versions) == expected, (key, len(read.versions))
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cosmos_figures(new_scores: int = 50) -> dict[str, Any]:
    """Requests of one training run, an agent with ``new_scores`` new scores and one without."""
    import uuid
    import warnings

    warnings.filterwarnings("ignore", message="Unverified HTTPS request")  # the local server's own certificate
    from cosmos_fixture import CLIENT_KWARGS, SteppingClock, ensure_installed, start_server
    from cosmos_requests import RequestCounter
    from factories import make_policy_doc, make_score

    from agent_learning.learning.reinforce import Reinforce
    from agent_learning.pipeline import create_policy, train_agent
    from agent_learning.store.cosmos import CosmosStore

    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise SystemExit("the Cosmos figures need Node.js and npm (or pass --no-cosmos)")
    ensure_installed(npm)
    log = Path(tempfile.mkdtemp(prefix="cosmos-server-")) / "server.log"
    server = start_server(node, log)
    counter = RequestCounter()
    try:
        store = CosmosStore.connect(
            server.endpoint,
            f"bench-{uuid.uuid4().hex[:8]}",
            key=server.key,
            create_containers=True,
            client_kwargs={**CLIENT_KWARGS, "raw_response_hook": counter},
            clock=SteppingClock(),
        )
        learner = Reinforce()
        agents = {"with": "bench-with-new", "without": "bench-without-new"}
        for n, agent in enumerate(agents.values()):
            create_policy(store, make_policy_doc(agent_id=agent, version=1, source="init"))
            for i in range(new_scores):
                store.add_score(make_score(f"{agent}-warm-{i}", agent_id=agent))
            assert train_agent(agent, store, learner).status == "published", n
        for i in range(new_scores):
            store.add_score(make_score(f"{agents['with']}-new-{i}", agent_id=agents["with"]))
        out: dict[str, Any] = {"runs": {}}
        for case, agent in agents.items():
            with counter.counting() as calls:
                status = train_agent(agent, store, learner).status
            out["runs"][case] = {
                "status": status,
                "requests": calls.data,
                "all_requests": calls.total,
                "by_operation": calls.by_operation(),
            }
        with counter.counting() as calls:
            store.has_new_scores(agents["with"], None)
        out["has_new_scores"] = calls.data
        with counter.counting() as calls:
            store.training_cursors()
        out["training_cursors"] = calls.data
        store.close()
        return out
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--versions", type=int, default=VERSIONS)
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--no-history", action="store_true")
    parser.add_argument("--no-cosmos", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if not args.no_sqlite:
        s = results["sqlite"] = sqlite_figures(args.scores)
        print(
            f"SQLite, {s['scores']:,} scores of one agent, the newest {s['new_scores']} after the cursor "
            f"(median of {REPEATS}):"
        )
        print(f"  seq > ? OR (seq = ? AND id > ?)   {s['or_form_ms']:8.3f} ms   {s['plans']['or_form']}")
        print(f"  (seq, id) > (?, ?)                {s['row_value_ms']:8.3f} ms   {s['plans']['row_value']}")
        print(f"  SQLiteStore.read_scores           {s['read_scores_ms']:8.3f} ms")
    if not args.no_history:
        h = results["history"] = history_figures(args.versions)
        print(f"SQLite, the history of an agent with {h['versions']:,} policy versions:")
        print(f"  every version        {h['all_ms']:8.0f} ms")
        print(f"  the newest 5         {h['newest_5_ms']:8.0f} ms")
        print(f"  5 by creation time   {h['window_5_ms']:8.0f} ms")
    if not args.no_cosmos:
        c = results["cosmos"] = cosmos_figures()
        print("Cosmos requests per training run (documents; metadata cached by the SDK):")
        for case, figures in c["runs"].items():
            print(f"  agent {case} new scores: {figures['requests']} ({figures['status']}) {figures['by_operation']}")
        print(f"  has_new_scores: {c['has_new_scores']}; training_cursors of 2 agents: {c['training_cursors']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
