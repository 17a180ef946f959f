"""Scale: Cosmos DB requests per episode and per training tick, counted over the wire, and a
paper estimate of what one deployment sustains.

    python benchmarks/scale.py [--agents 1,100,1000,10000] [--batches 50,500] [--episodes 200]
                               [--judge offline|evaluators] [--trainer fanout,sequential] [--quick] [--json PATH]

Everything runs against the local Cosmos-compatible server of the wire tests
(``tests/fakes/cosmos_fixture.py``) with the real azure-cosmos SDK, and every request is
counted on the client by :class:`cosmos_requests.RequestCounter` (``tests/support/``), by kind:
point read, create/upsert/replace, query page, change-feed page, metadata. It measures:

1. Requests per episode, stage by stage: the agent's episode write (``EpisodeCapture``), the
   app's enqueue function (``functions.enqueue``; the change-feed reads that feed it are the
   Functions host's in Azure: they are emulated here, pages of 100 as the host's processor
   reads them, and reported apart), the scorer (``score_message`` with the episode embedded in
   the message and without it, a redelivered duplicate, and what a new scorer instance reads
   once), and the trainer amortised per episode at ``--batches`` new scores per agent per tick
   (10 agents each). The total per judged episode is the sum of the app's own stages.
2. One training tick per trainer mode for each ``--agents`` count: first with a few new
   scores per agent (``--scores-per-agent``, 3 by default, so 10,000 agents fit in minutes),
   then again with nothing new. Requests are counted; times are distorted (below).
3. Scorer CPU time per episode (this process: judge, reward, documents, the SDK's client side):
   with the offline judge, and with ``--judge evaluators`` the real azure-ai-evaluation
   evaluators against the local judge server (``tests/fakes/judge_server.py``), which runs
   in a child process so that its CPU is not counted.
4. A paper estimate computed from those counts and the deployment's defaults, read from
   ``infra/``, ``host.json`` and ``config.py``; every other number it needs is a named
   constant below with its source.

Where time figures are distorted: the local server answers every query by scanning and
sorting the whole container (and reports a request charge of 1 for everything), so a query
costs time in proportion to the container's size, which Cosmos DB's indexes do not. Tick wall
times therefore grow with the agent count faster than they would in Azure; the request counts
and this process's CPU time are not distorted. The estimate uses the counts, the CPU times and
per-request latencies assumed for Cosmos DB, never the local timings.

Trainer modes (``--trainer``): ``fanout`` is the deployed tick (``functions.train`` plans it and
sends one message per agent with new scores, ``functions.train_agent`` trains each);
``sequential`` trains every agent in turn in one run (the timer before the fan-out). A mode is
a function ``(runtime, phase) -> outcomes`` in :data:`TRAINER_MODES`; ``phase(name)`` is a
context manager that counts the requests of one part of the tick separately (planning, then
training each planned agent).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakes"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import cosmos_fixture  # noqa: E402  (the local server, as the wire tests start it)
from cosmos_requests import Counts, RequestCounter  # noqa: E402

from agent_learning.app import handlers  # noqa: E402
from agent_learning.app.settings import Settings, load_settings  # noqa: E402
from agent_learning.app.wiring import drift_config, guardrail_config, open_scorer  # noqa: E402
from agent_learning.core.clock import ManualClock  # noqa: E402
from agent_learning.judges.evaluators import JudgeTokens  # noqa: E402
from agent_learning.judges.offline import OfflineJudge  # noqa: E402
from agent_learning.pipeline import create_policy, score_message, train_all  # noqa: E402
from agent_learning.pipeline.enqueue import score_request_message  # noqa: E402
from agent_learning.policy.softmax import SoftmaxPolicy  # noqa: E402
from agent_learning.sim.simulate import support_bot  # noqa: E402
from agent_learning.store.cosmos import CONTAINERS, CosmosStore  # noqa: E402
from agent_learning.store.memory import MemoryStore  # noqa: E402

# --------------------------------------------------------------------------- assumptions
# Each number the estimate needs that the code and infra/ do not state, beside its source.

JUDGE_PROMPT_TOKENS_PER_EPISODE = 6_181
"""Prompt tokens the three evaluators send per episode (azure-ai-evaluation 1.18.10 prompts with
the benchmark episode, o200k_base: ``benchmarks/results/judge_tokens.json``)."""
JUDGE_MAX_COMPLETION_TOKENS_PER_EPISODE = sum(
    getattr(JudgeTokens(), f"max_tokens_{m}") for m in ("intent_resolution", "task_adherence", "task_completion")
)
"""The completion limits the judge sends (:class:`~agent_learning.judges.evaluators.JudgeTokens`)."""
JUDGE_REQUESTS_PER_EPISODE = 3
"""One chat completion per evaluator."""
AOAI_RPM_PER_1000_TPM = 6
"""Azure OpenAI grants 6 requests per minute per 1,000 tokens per minute of deployment capacity
and admits a request by its prompt tokens plus ``max_tokens`` (Azure OpenAI quota docs)."""
JUDGE_SECONDS_PER_EPISODE = 5.0
"""Assumed wall time of one episode's judging on gpt-4o-mini: the three calls run concurrently,
each generating a few hundred tokens (assumption, not measured here)."""
COSMOS_LATENCY_MS = {"read": 5.0, "write": 10.0, "query": 10.0, "changefeed": 10.0, "metadata": 5.0}
"""Assumed round trip per request kind from a Function app in the account's region (Cosmos DB
SLA: point reads and writes of 1 KB under 10 ms at p99; queries and feed pages taken as 10 ms)."""
COSMOS_RU = {"read": 1.0, "write": 6.0, "query": 3.0, "changefeed": 2.0, "metadata": 0.0}
"""Assumed request units per request kind for these ~1-3 KB documents with default indexing:
a 1 KB point read is 1 RU (Cosmos DB request-unit docs); a write of that size with every path
indexed about 6 RU and a small single-page query about 3 RU (typical charges; assumptions);
metadata requests are not charged to the containers' throughput."""
COSMOS_SERVERLESS_RU_PER_CONTAINER = 5_000
"""RU/s a serverless container serves up to 50 GB (one physical partition; Cosmos DB
"serverless performance" docs: more partitions add more)."""
SERVICEBUS_STANDARD_CREDITS_PER_S = 1_000
"""Service Bus Standard throttles a namespace at 1,000 credits per second; a send or a receive
costs one credit per message (Service Bus throttling docs)."""
SERVICEBUS_CREDITS_PER_EPISODE = 2
"""One send (enqueue) and one receive (the score trigger) per episode."""
FLEX_PLATFORM_DEFAULT_MAX_INSTANCES = 100
"""Flex Consumption's default maximumInstanceCount when a template sets none (Flex Consumption
docs); ``infra/`` sets its own, read below."""
CORES_PER_INSTANCE = 1.0
"""Assumed vCPUs of a 2,048 MB Flex Consumption instance (CPU is allocated in proportion to
memory; assumption)."""
CHANGE_FEED_PAGE = 100
"""Episodes per change-feed page the Functions host's processor reads (its default item count
when the trigger sets no ``max_items_per_invocation``; assumption)."""
CHANGE_FEED_POLL_DELAY_S = 5.0
"""How often the host polls the change feed when it is idle (Cosmos DB trigger
``feed_poll_delay`` default, 5,000 ms)."""

CLIENT_KWARGS = {**cosmos_fixture.CLIENT_KWARGS, "read_timeout": 600}
"""The wire tests' client settings with a longer read timeout: the local server answers a
cross-partition query by scanning every partition, which takes seconds at 10,000 agents."""
AMORTISE_AGENTS = 10
"""Agents trained in the tick that measures the trainer's requests per episode."""
SEED_THREADS = 8
"""Threads that write the seeded policies and scores (the local server serves them in turn)."""
PROGRESS_EVERY_S = 15.0
"""How often a long step reports its progress on stderr."""

AGENT = "support-bot"

# --------------------------------------------------------------------------- trainer modes

Phase = Callable[[str], contextlib.AbstractContextManager[Any]]


def fan_out_tick(rt: handlers.Runtime, phase: Phase) -> list[Any]:
    """The deployed tick: the timer plans it (``functions.train``: the feedback sweep, every
    agent's cursor, one "anything new?" query per unpinned agent) and sends one message per agent
    with new scores; the training trigger (``functions.train_agent``) trains each. The messages are
    handed over in memory: Service Bus is not Cosmos DB and costs no request here."""
    sent: list[Any] = []
    rt.send_train = lambda messages: sent.extend(messages) or len(messages)
    with phase("plan"):
        plan = handlers.train(rt)
    with phase("train"):
        trained = [handlers.train_agent(m.body, 1, m.message_id, rt) for m in sent]
    return trained + plan.untrained()


def sequential_tick(rt: handlers.Runtime, phase: Phase) -> list[Any]:
    """Every agent trained in turn in one process, without planning (what the timer did before
    the fan-out, and what ``train_all`` still does), with the app's settings."""
    s = rt.settings
    with phase("tick"):
        return train_all(rt.store, handlers.learner_of(rt), max_batch=s.train_max_batch,
                         min_batch=s.train_min_batch, drift=drift_config(s), guardrail=guardrail_config(s))


TRAINER_MODES: dict[str, Callable[[handlers.Runtime, Phase], list[Any]]] = {
    "fanout": fan_out_tick,
    "sequential": sequential_tick,
}
"""Trainer modes by name; the report shows each phase's requests per agent."""

# --------------------------------------------------------------------------- plumbing


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def ticker(label: str, counter: RequestCounter, every: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """Report ``label``'s elapsed time and requests so far every ``every`` seconds."""
    start, base = time.perf_counter(), counter.snapshot().total
    done = threading.Event()

    def run() -> None:
        while not done.wait(every):
            sent = counter.snapshot().total - base
            progress(f"  {label}: {time.perf_counter() - start:,.0f} s, {sent:,} requests so far")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@dataclass
class Wire:
    """The local server, one request counter, and a database per measurement."""

    server: Any
    counter: RequestCounter = field(default_factory=RequestCounter)

    def connect(self, database: str, create: bool = False) -> CosmosStore:
        """A store with its own client on ``database``, counted, on a settling clock."""
        return CosmosStore.connect(
            self.server.endpoint,
            database,
            key=self.server.key,
            create_containers=create,
            client_kwargs={**CLIENT_KWARGS, **self.counter.client_kwargs()},
            clock=cosmos_fixture.SteppingClock(),
        )

    @contextlib.contextmanager
    def store(self, label: str) -> Iterator[CosmosStore]:
        """A store on a new database (deleted afterwards), on a clock that settles every score
        before the next read (the wire tests' :class:`cosmos_fixture.SteppingClock`)."""
        name = f"scale-{label}-{uuid.uuid4().hex[:6]}"
        store = self.connect(name, create=True)
        try:
            yield store
        finally:
            with contextlib.suppress(Exception):
                store._client.delete_database(name)  # type: ignore[union-attr]
            store.close()

    def runtime(self, store: CosmosStore, send: Callable[[list[Any]], int] | None = None) -> handlers.Runtime:
        """The Functions app's runtime on ``store`` with the deployed defaults (offline judge)."""
        settings = load_settings(
            store="cosmos", cosmos_endpoint=self.server.endpoint, cosmos_database=store.database.id, judge="offline"
        )
        return handlers.Runtime(settings, store, send or (lambda messages: len(messages)))


@contextlib.contextmanager
def local_server() -> Iterator[Any]:
    """The wire tests' Cosmos-compatible server (``npm ci`` on first use)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise SystemExit("the scale benchmark needs Node.js >= 20 and npm for the local Cosmos server")
    cosmos_fixture.ensure_installed(npm)
    log = Path(tempfile.mkdtemp(prefix="scale-cosmos-")) / "server.log"
    server = cosmos_fixture.start_server(node, log)
    try:
        yield server
    finally:
        server.stop()


def per(counts: Counts, n: int) -> dict[str, float]:
    """Requests per unit by kind (document kinds, plus ``metadata``), rounded."""
    out = {kind: round(v / n, 3) for kind, v in sorted(counts.by_kind.items()) if kind.endswith(" docs")}
    if counts.metadata:
        out["metadata"] = round(counts.metadata / n, 3)
    return out


def stage(counts: Counts, n: int) -> dict[str, Any]:
    """A stage's counts over ``n`` episodes: all requests, document requests (metadata reads are
    a new client's, once per instance) and both per episode, by kind."""
    return {
        "n": n,
        "requests": counts.total,
        "documents": counts.data,
        "documents_per_episode": round(counts.data / n, 4),
        "per_episode": per(counts, n),
    }


def kind_class(kind: str) -> str:
    """``read``, ``write``, ``query``, ``changefeed`` or ``metadata`` for a counted kind."""
    operation, _, resource = kind.partition(" ")
    if resource != "docs":
        return "metadata"
    if operation in ("create", "upsert", "replace", "patch", "delete", "batch"):
        return "write"
    if operation in ("query", "readfeed"):
        return "query"
    return operation if operation in ("read", "changefeed") else "query"


def classes(by_kind: dict[str, float]) -> dict[str, float]:
    """Per-kind figures summed by class (read, write, query, changefeed, metadata)."""
    out: Counter[str] = Counter()
    for kind, n in by_kind.items():
        out[kind_class(kind) if kind != "metadata" else "metadata"] += n
    return dict(out)


def make_policy(store: Any, agent_id: str, actions: list[Any]) -> None:
    create_policy(store, SoftmaxPolicy.from_actions(agent_id, actions).to_document(created_at=None))


# --------------------------------------------------------------------------- 1. per episode


def measure_episode_path(wire: Wire, episodes: int) -> tuple[dict[str, Any], Any]:
    """Requests of each stage for ``episodes`` episodes of one agent; also returns a real score
    (the template the trainer measurements clone)."""
    counter = wire.counter
    scenario = support_bot(AGENT)
    sent: list[Any] = []
    out: dict[str, Any] = {"episodes": episodes}
    with wire.store("path") as store:
        make_policy(store, AGENT, scenario.actions)
        policy = SoftmaxPolicy.from_document(store.get_current_policy(AGENT).doc, seed=1)  # type: ignore[union-attr]
        rng, clock = random.Random(7), ManualClock()
        scenario.run_episode(store, policy.choose(), rng, clock)  # the client's metadata reads, not counted
        with counter.measure() as m:
            for _ in range(episodes):
                scenario.run_episode(store, policy.choose(), rng, clock)
        out["agent_write"] = stage(m.counts, episodes)

        docs: list[dict[str, Any]] = []
        token: str | None = None
        with counter.measure() as m:  # the host's change-feed reads (emulated)
            while True:
                page = store.read_episodes(token, CHANGE_FEED_PAGE)
                token = page.continuation
                if not page.items:
                    break
                docs.extend(page.items)
        docs = [d for d in docs if d.get("id") != docs[0].get("id")][:episodes]  # leave the warm-up episode out
        out["host_change_feed"] = {**stage(m.counts, episodes), "page": CHANGE_FEED_PAGE}

        rt = wire.runtime(store, lambda messages: sent.extend(messages) or len(messages))
        with counter.measure() as m:
            for start in range(0, len(docs), CHANGE_FEED_PAGE):
                handlers.enqueue(docs[start : start + CHANGE_FEED_PAGE], rt)
        out["enqueue"] = {**stage(m.counts, episodes), "messages": len(sent)}

        # The scorer runs in its own instance: its own client, server clock and policy cache.
        scorer_store = wire.connect(store.database.id)
        scorer = open_scorer(rt.settings, scorer_store)
        embedded = [m.body for m in sent]
        bare = [score_request_message(d, embed_limit=0).body for d in docs]  # as enqueue sends a large episode
        half = len(embedded) // 2
        with counter.measure() as m:  # a new scorer instance: clock probe, policy version read
            first = score_message(embedded[0], scorer)
        out["scorer_first_message"] = {**stage(m.counts, 1), "status": first.status}
        results: list[Any] = []
        cpu0 = time.process_time()
        with counter.measure() as m:
            results += [score_message(body, scorer) for body in embedded[1:half]]
        cpu = time.process_time() - cpu0
        n_embedded = half - 1
        out["scorer_embedded"] = {
            **stage(m.counts, n_embedded),
            "statuses": dict(Counter(r.status for r in results[-n_embedded:])),
            "cpu_ms_per_episode": round(cpu * 1000 / n_embedded, 2),
            "containers": {c: dict(m.container(c)) for c in CONTAINERS if m.container(c)},  # every one it used
        }
        with counter.measure() as m:
            results += [score_message(body, scorer) for body in bare[half:]]
        n_bare = len(bare) - half
        out["scorer_not_embedded"] = {
            **stage(m.counts, n_bare),
            "statuses": dict(Counter(r.status for r in results[-n_bare:])),
        }
        with counter.measure() as m:
            dupes = [score_message(body, scorer) for body in embedded[1:half]]
        out["scorer_duplicate"] = {
            **stage(m.counts, n_embedded),
            "statuses": dict(Counter(r.status for r in dupes)),
        }
        template = next(r.score for r in results if r.score is not None)
        scorer_store.close()
        handlers.train(rt)  # warm-up, not counted: the trainer's imports (numpy, learner, guardrail)
    return out, template


# --------------------------------------------------------------------------- 2. ticks


def seed(store: CosmosStore, agents: int, scores_each: int, template: Any, actions: list[Any], label: str) -> None:
    """``agents`` policies with ``scores_each`` new scores each, written through the store."""
    ids = [a.id for a in actions]
    done = Counter[str]()
    lock = threading.Lock()

    def one(i: int) -> None:
        agent = agent_id(i)
        make_policy(store, agent, actions)
        rng = random.Random(i)
        for _ in range(scores_each):
            action = ids[rng.randrange(len(ids))]
            episode = f"{agent}-{uuid.uuid4().hex[:12]}"
            store.add_score(
                template.model_copy(
                    update={
                        "id": episode,
                        "episode_id": episode,
                        "agent_id": agent,
                        "action_id": action,
                        "probability": 1 / len(ids),
                        "reward": round(rng.random(), 3),
                        "seq": None,
                    }
                )
            )
        with lock:
            done["agents"] += 1

    start = time.perf_counter()
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(PROGRESS_EVERY_S):
            n = done["agents"]
            rate = n / (time.perf_counter() - start)
            eta = (agents - n) / rate if rate else float("nan")
            progress(f"  {label}: seeded {n:,}/{agents:,} agents ({rate:,.0f}/s, ~{eta:,.0f} s left)")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        with ThreadPoolExecutor(SEED_THREADS) as pool:
            list(pool.map(one, range(agents)))
    finally:
        stop.set()
        reporter.join()


def agent_id(i: int) -> str:
    return f"agent-{i:05d}"


def run_tick(wire: Wire, rt: handlers.Runtime, mode: str, agents: int, label: str) -> dict[str, Any]:
    """One tick of ``mode``: wall time, this process's CPU time and requests, per agent too."""
    counter = wire.counter
    phases: dict[str, Counts] = {}
    phase_cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        cpu = time.process_time()
        with counter.measure() as m:
            yield
        phases[name] = phases[name] + m.counts if name in phases else m.counts
        phase_cpu[name] = phase_cpu.get(name, 0.0) + time.process_time() - cpu

    with ticker(label, counter):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        with counter.measure() as m:
            outcomes = TRAINER_MODES[mode](rt, phase)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "mode": mode,
        "agents": agents,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "wall_ms_per_agent": round(wall * 1000 / agents, 2),
        "cpu_ms_per_agent": round(cpu * 1000 / agents, 2),
        "requests": m.total,
        "requests_per_agent": round(m.total / agents, 3),
        "documents": m.data,
        "documents_per_agent": round(m.data / agents, 3),
        "per_agent": per(m.counts, agents),
        "writes_per_agent": round(m.writes / agents, 3),
        "statuses": dict(Counter(o.status for o in outcomes)),
        "problems": dict(Counter(f"{o.status}: {o.reason}" for o in outcomes if o.status in ("failed", "unavailable"))),
        "phases": {name: {**c.to_dict(), "cpu_ms_per_agent": round(phase_cpu[name] * 1000 / agents, 3)}
                   for name, c in phases.items()},
    }


def measure_batches(wire: Wire, batches: list[int], template: Any, mode: str) -> list[dict[str, Any]]:
    """The trainer's requests per episode: ``AMORTISE_AGENTS`` agents with ``b`` new scores each."""
    rows = []
    actions = support_bot(AGENT).actions
    for b in batches:
        with wire.store(f"batch{b}") as store:
            progress(f"trainer batch {b}: seeding {AMORTISE_AGENTS} agents x {b} scores")
            seed(store, AMORTISE_AGENTS, b, template, actions, f"batch {b}")
            row = run_tick(wire, wire.runtime(store), mode, AMORTISE_AGENTS, f"batch {b} tick")
        row["batch"] = b
        row["requests_per_episode"] = round(row["requests"] / (AMORTISE_AGENTS * b), 4)
        row["documents_per_episode"] = round(row["documents"] / (AMORTISE_AGENTS * b), 4)
        rows.append(row)
        progress(f"trainer batch {b}: {row['documents_per_episode']} document requests per episode ({row['statuses']})")
    return rows


def measure_ticks(
    wire: Wire,
    agent_counts: list[int],
    scores_each: int,
    template: Any,
    modes: list[str],
    rows: list[dict[str, Any]],
    saved: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """For each agent count and mode: a tick with new scores, then one with nothing new (appended
    to ``rows``; ``saved`` is called after each)."""
    actions = support_bot(AGENT).actions
    for n in agent_counts:
        for mode in modes:
            with wire.store(f"{mode}{n}") as store:
                t0 = time.perf_counter()
                progress(f"{n:,} agents: seeding {n:,} policies and {n * scores_each:,} scores")
                seed(store, n, scores_each, template, actions, f"{n:,} agents")
                progress(f"{n:,} agents: seeded in {time.perf_counter() - t0:,.0f} s; tick with new scores ({mode})")
                rt = wire.runtime(store)
                busy = run_tick(wire, rt, mode, n, f"{n:,} agents, new scores")
                busy.update(new_scores=True, scores_per_agent=scores_each)
                rows.append(busy)
                saved()
                progress(f"  {busy['requests_per_agent']} requests per agent, {busy['wall_s']} s ({busy['statuses']})")
                progress(f"{n:,} agents: tick with nothing new ({mode})")
                idle = run_tick(wire, rt, mode, n, f"{n:,} agents, nothing new")
                idle.update(new_scores=False, scores_per_agent=0)
                rows.append(idle)
                saved()
                progress(f"  {idle['requests_per_agent']} requests per agent, {idle['wall_s']} s ({idle['statuses']})")
    return rows


# --------------------------------------------------------------------------- 3. scorer CPU


@contextlib.contextmanager
def judge_server_process() -> Iterator[dict[str, str]]:
    """The local judge server in a child process (so that its CPU is not this process's)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from judge_server import JudgeServer; "
        "s = JudgeServer().start(); print(s.base_url, s.model, s.api_key or '-', flush=True); "
        "sys.stdin.read(); s.stop()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT / "tests" / "fakes")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url, model, key = proc.stdout.readline().split()
        yield {"base_url": base_url, "model": model, "api_key": "" if key == "-" else key}
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure_evaluators_cpu(wire: Wire, episodes: int) -> dict[str, Any]:
    """Scorer CPU per episode with the real evaluators against the local judge server."""
    from agent_learning.judges.evaluators import EvaluatorJudge, JudgeModel  # lazy: azure-ai-evaluation is heavy

    scenario = support_bot(AGENT)
    with judge_server_process() as judge, wire.store("evaluators") as store:
        make_policy(store, AGENT, scenario.actions)
        policy = SoftmaxPolicy.from_document(store.get_current_policy(AGENT).doc, seed=3)  # type: ignore[union-attr]
        rng, clock = random.Random(3), ManualClock()
        bodies = [
            score_request_message(scenario.run_episode(store, policy.choose(), rng, clock).to_dict()).body
            for _ in range(episodes + 1)
        ]
        model = JudgeModel(base_url=judge["base_url"], model=judge["model"], api_key=judge["api_key"] or None)
        rt = wire.runtime(store)
        scorer = open_scorer(rt.settings, store, judge=EvaluatorJudge(model))
        score_message(bodies[0], scorer)  # warm-up: imports, prompt files, clock probe
        progress(f"evaluators: scoring {episodes} episodes against the local judge server")
        wall0, cpu0 = time.perf_counter(), time.process_time()
        statuses = Counter(score_message(body, scorer).status for body in bodies[1:])
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "episodes": episodes,
        "cpu_ms_per_episode": round(cpu * 1000 / episodes, 2),
        "wall_ms_per_episode": round(wall * 1000 / episodes, 2),
        "statuses": dict(statuses),
    }


def measure_offline_judge_cpu(episodes: int) -> float:
    """CPU ms of the offline judge alone per episode (no store)."""
    scenario, judge, store = support_bot(AGENT), OfflineJudge(), MemoryStore()
    make_policy(store, AGENT, scenario.actions)  # type: ignore[arg-type]
    policy = SoftmaxPolicy.from_document(store.get_current_policy(AGENT).doc, seed=5)  # type: ignore[union-attr]
    rng, clock = random.Random(5), ManualClock()
    eps = [scenario.run_episode(store, policy.choose(), rng, clock) for _ in range(episodes)]
    cpu0 = time.process_time()
    for ep in eps:
        judge.judge(ep)
    return round((time.process_time() - cpu0) * 1000 / episodes, 3)


# --------------------------------------------------------------------------- 4. estimate


def schedule_seconds(schedule: str) -> float:
    """The period of an NCRONTAB schedule of the form the app uses (``0 */5 * * * *``)."""
    fields = schedule.split()
    if len(fields) != 6:
        raise ValueError(f"AGENT_LEARNING_TRAIN_SCHEDULE: {schedule!r} is not a six-field NCRONTAB expression")
    units = (1, 60, 3600)
    for value, unit in zip(fields[:3], units, strict=True):
        if value.startswith("*/"):
            return int(value[2:]) * unit
        if value == "*":
            return unit
    if fields[3:] == ["*", "*", "*"]:
        return 86_400.0
    raise ValueError(f"AGENT_LEARNING_TRAIN_SCHEDULE: {schedule!r}: only periodic schedules are estimated")


def bicep_default(path: Path, param: str) -> str:
    match = re.search(rf"^param {re.escape(param)} \w+ = '?([^'\n]+)'?$", path.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{path.relative_to(ROOT)}: no default for param {param}")
    return match.group(1).strip()


def read_defaults() -> dict[str, Any]:
    """The deployment's defaults, from infra/, host.json and config.py."""
    main = ROOT / "infra" / "main.bicep"
    params = json.loads((ROOT / "infra" / "main.parameters.json").read_text())["parameters"]

    def env_default(name: str) -> str:
        value = params[name]["value"]
        match = re.fullmatch(r"\$\{\w+=(.*)\}", value)
        return match.group(1) if match else value

    host = json.loads((ROOT / "host.json").read_text())
    schedule = env_default("trainSchedule") or Settings.model_fields["train_schedule"].default
    capacity_mode = env_default("cosmosCapacityMode") or bicep_default(
        ROOT / "infra" / "modules" / "cosmos.bicep", "capacityMode"
    )
    return {
        # main.bicep: capacity = judgeEpisodesPerMinute x judgeTokensPerEpisode / 1000, rounded up
        "judge_capacity_ktpm": -(
            -int(bicep_default(main, "judgeEpisodesPerMinute")) * int(bicep_default(main, "judgeTokensPerEpisode"))
            // 1000
        ),
        "judge_model": env_default("judgeModelName"),
        "max_concurrent_calls": int(host["extensions"]["serviceBus"]["maxConcurrentCalls"]),
        "maximum_instance_count": int(bicep_default(main, "maximumInstanceCount")),
        "train_schedule": schedule,
        "train_schedule_default_in_config": Settings.model_fields["train_schedule"].default,
        "tick_seconds": schedule_seconds(schedule),
        "cosmos_capacity_mode": capacity_mode,
        "cosmos_autoscale_max_ru": int(
            bicep_default(ROOT / "infra" / "modules" / "cosmos.bicep", "autoscaleMaxThroughput")
        ),
        "servicebus_sku": re.search(
            r"name: '(\w+)'", (ROOT / "infra" / "modules" / "servicebus.bicep").read_text().split("sku:", 1)[1]
        ).group(1),  # type: ignore[union-attr]
        "function_timeout": host.get("functionTimeout"),
    }


def cost(by_kind: dict[str, float], table: dict[str, float]) -> float:
    """Σ count × ``table[class]`` over per-unit counts by kind."""
    return sum(n * table[kind_class(k) if k != "metadata" else "metadata"] for k, n in by_kind.items())


def estimate(results: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Episodes per second and agents per tick one deployment sustains, from the measured counts."""
    path = results["episode_path"]
    limits: dict[str, dict[str, Any]] = {}
    capacity = defaults["judge_capacity_ktpm"] * 1000
    tokens = JUDGE_PROMPT_TOKENS_PER_EPISODE + JUDGE_MAX_COMPLETION_TOKENS_PER_EPISODE
    limits["judge tokens per minute"] = {
        "episodes_per_s": capacity / tokens / 60,
        "why": f"{capacity:,} TPM / ({JUDGE_PROMPT_TOKENS_PER_EPISODE:,} prompt + "
        f"{JUDGE_MAX_COMPLETION_TOKENS_PER_EPISODE:,} max completion tokens per episode)",
    }
    rpm = defaults["judge_capacity_ktpm"] * AOAI_RPM_PER_1000_TPM
    limits["judge requests per minute"] = {
        "episodes_per_s": rpm / JUDGE_REQUESTS_PER_EPISODE / 60,
        "why": f"{rpm:,} RPM / {JUDGE_REQUESTS_PER_EPISODE} requests per episode",
    }
    scorer = path["scorer_embedded"]["per_episode"]
    cosmos_s = cost(scorer, COSMOS_LATENCY_MS) / 1000
    slots = defaults["maximum_instance_count"] * defaults["max_concurrent_calls"]
    limits["scorer concurrency"] = {
        "episodes_per_s": slots / (JUDGE_SECONDS_PER_EPISODE + cosmos_s),
        "why": f"{defaults['maximum_instance_count']} instances x {defaults['max_concurrent_calls']} calls / "
        f"({JUDGE_SECONDS_PER_EPISODE} s judging + {cosmos_s * 1000:.0f} ms Cosmos per episode)",
    }
    cpu_ms = results["scorer_cpu"].get("evaluators_ms_per_episode") or results["scorer_cpu"]["offline_ms_per_episode"]
    limits["scorer CPU"] = {
        "episodes_per_s": defaults["maximum_instance_count"] * CORES_PER_INSTANCE / (cpu_ms / 1000),
        "why": f"{defaults['maximum_instance_count']} instances x {CORES_PER_INSTANCE} core / {cpu_ms} ms CPU "
        f"per episode ({'evaluators' if results['scorer_cpu'].get('evaluators_ms_per_episode') else 'offline'}"
        " judge)",
    }
    limits["Service Bus"] = {
        "episodes_per_s": SERVICEBUS_STANDARD_CREDITS_PER_S / SERVICEBUS_CREDITS_PER_EPISODE,
        "why": f"{defaults['servicebus_sku']}: {SERVICEBUS_STANDARD_CREDITS_PER_S:,} credits/s / "
        f"{SERVICEBUS_CREDITS_PER_EPISODE} per episode",
    }
    # Cosmos DB: request units per episode in each container, from the counts by container.
    containers: Counter[str] = Counter()
    n_scored = path["scorer_embedded"]["n"]
    for container, kinds in path["scorer_embedded"]["containers"].items():
        for kind, n in kinds.items():
            containers[container] += n / n_scored * COSMOS_RU[kind_class(kind)]
    containers["episodes"] += cost(path["agent_write"]["per_episode"], COSMOS_RU)
    batch = max(results["trainer_batches"], key=lambda r: r["batch"]) if results["trainer_batches"] else None
    if batch is not None:
        containers["trainer (all containers)"] += cost(batch["per_agent"], COSMOS_RU) / batch["batch"]
    serverless = defaults["cosmos_capacity_mode"].lower() == "serverless"
    if serverless:
        worst, ru = max(containers.items(), key=lambda kv: kv[1])
        limits["Cosmos DB RU/s"] = {
            "episodes_per_s": COSMOS_SERVERLESS_RU_PER_CONTAINER / ru,
            "why": f"serverless: {COSMOS_SERVERLESS_RU_PER_CONTAINER:,} RU/s per container / {ru:.1f} RU per "
            f"episode in {worst}",
        }
    else:
        total = sum(containers.values())
        limits["Cosmos DB RU/s"] = {
            "episodes_per_s": defaults["cosmos_autoscale_max_ru"] / total,
            "why": f"provisioned: {defaults['cosmos_autoscale_max_ru']:,} RU/s shared / {total:.1f} RU per episode",
        }
    first = min(limits, key=lambda k: limits[k]["episodes_per_s"])
    # Training. Fan-out: the timer (one instance) lists the cursors and checks each agent in
    # turn; the training trigger trains the agents with new scores on every
    # instance, max_concurrent_calls at a time each. Sequential: one run trains every agent in turn.
    ticks = results["ticks"]
    tick_s = defaults["tick_seconds"]
    slots = defaults["maximum_instance_count"] * defaults["max_concurrent_calls"]
    agents_per_tick: dict[str, Any] = {}
    for row in (r for r in ticks if r["agents"] == max(t["agents"] for t in ticks)):
        n = row["agents"]
        if row["mode"] == "fanout":
            phases = row["phases"]
            plan = per(Counts.of(phases["plan"]), n)
            train = per(Counts.of(phases["train"]), n) if "train" in phases else {}
            plan_cpu, train_cpu = (phases.get(p, {}).get("cpu_ms_per_agent", 0.0) / 1000 for p in ("plan", "train"))
            plan_s = cost(plan, COSMOS_LATENCY_MS) / 1000 + plan_cpu
            train_s = (cost(train, COSMOS_LATENCY_MS) / 1000 + train_cpu) / slots
            per_agent_s = max(plan_s, train_s)
            why = (f"{tick_s:.0f} s tick / max(plan on the timer's instance: {cost(plan, COSMOS_LATENCY_MS):.0f} ms "
                   f"Cosmos + {plan_cpu * 1000:.2f} ms CPU, one agent after another; train: "
                   f"{cost(train, COSMOS_LATENCY_MS):.0f} ms Cosmos + {train_cpu * 1000:.2f} ms CPU over {slots} "
                   "slots) per agent")
        else:
            cpu_s = row["cpu_ms_per_agent"] / 1000
            per_agent_s = cost(row["per_agent"], COSMOS_LATENCY_MS) / 1000 + cpu_s
            why = (f"{tick_s:.0f} s tick / ({cost(row['per_agent'], COSMOS_LATENCY_MS):.0f} ms Cosmos + "
                   f"{row['cpu_ms_per_agent']} ms CPU per agent, one after another)")
        label = f"{row['mode']}, {'with new scores' if row['new_scores'] else 'nothing new'}"
        agents_per_tick[label] = {
            "agents": int(tick_s / per_agent_s),
            "seconds_per_agent": round(per_agent_s, 5),
            "why": why + f", measured at {n:,} agents",
        }
    return {
        "limits": {k: {**v, "episodes_per_s": round(v["episodes_per_s"], 3)} for k, v in limits.items()},
        "first_bottleneck": first,
        "episodes_per_s": round(limits[first]["episodes_per_s"], 3),
        "episodes_per_day": int(limits[first]["episodes_per_s"] * 86_400),
        "agents_per_tick": agents_per_tick,
        "cosmos_ru_per_episode": {k: round(v, 2) for k, v in containers.items()},
        "host_change_feed_idle_requests_per_s": round(1 / CHANGE_FEED_POLL_DELAY_S, 2),
    }


ASSUMPTIONS = (
    "JUDGE_PROMPT_TOKENS_PER_EPISODE",
    "JUDGE_MAX_COMPLETION_TOKENS_PER_EPISODE",
    "JUDGE_REQUESTS_PER_EPISODE",
    "AOAI_RPM_PER_1000_TPM",
    "JUDGE_SECONDS_PER_EPISODE",
    "COSMOS_LATENCY_MS",
    "COSMOS_RU",
    "COSMOS_SERVERLESS_RU_PER_CONTAINER",
    "SERVICEBUS_STANDARD_CREDITS_PER_S",
    "SERVICEBUS_CREDITS_PER_EPISODE",
    "FLEX_PLATFORM_DEFAULT_MAX_INSTANCES",
    "CORES_PER_INSTANCE",
    "CHANGE_FEED_PAGE",
    "CHANGE_FEED_POLL_DELAY_S",
)
"""The constants above that the estimate rests on (written to the results)."""


def assumptions() -> dict[str, Any]:
    return {name: globals()[name] for name in ASSUMPTIONS}


# --------------------------------------------------------------------------- report


def totals(path: dict[str, Any], batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests per judged episode: agent write + enqueue + scorer (embedded) + trainer share."""
    stages = sum(path[s]["documents_per_episode"] for s in ("agent_write", "enqueue", "scorer_embedded"))
    out = {"app_without_trainer": round(stages, 3)}
    for row in batches:
        out[f"batch_{row['batch']}"] = round(stages + row["documents_per_episode"], 3)
    out["host_change_feed_per_episode"] = path["host_change_feed"]["documents_per_episode"]
    return out


def fmt_kinds(by_kind: dict[str, float]) -> str:
    names = {
        "read docs": "read",
        "create docs": "create",
        "upsert docs": "upsert",
        "replace docs": "replace",
        "query docs": "query",
        "changefeed docs": "feed",
        "delete docs": "delete",
        "metadata": "meta",
    }
    return ", ".join(f"{names.get(k, k)} {v:g}" for k, v in by_kind.items()) or "-"


def report(results: dict[str, Any]) -> str:
    """The results as readable tables."""
    lines: list[str] = []
    path = results["episode_path"]
    lines.append(
        f"Cosmos DB requests per episode ({path['episodes']} episodes, counted over the wire; document requests, "
        "metadata reads of a new client apart)"
    )
    lines.append(f"{'stage':<48} {'per episode':>11}  by kind")

    def row(label: str, value: float, by_kind: dict[str, float]) -> None:
        lines.append(f"{label:<48} {value:>11.3f}  {fmt_kinds(by_kind)}")

    for label, key in (
        ("agent: episode write (EpisodeCapture)", "agent_write"),
        ("enqueue function (functions.enqueue)", "enqueue"),
        ("scorer: episode embedded in the message", "scorer_embedded"),
        ("scorer: episode not embedded (read by id)", "scorer_not_embedded"),
        ("scorer: a redelivered duplicate", "scorer_duplicate"),
    ):
        row(label, path[key]["documents_per_episode"], path[key]["per_episode"])
    for b in results["trainer_batches"]:
        by_kind = {k: round(v / b["batch"], 4) for k, v in b["per_agent"].items()}
        row(f"trainer: {b['batch']:,} new scores per agent per tick", b["documents_per_episode"], by_kind)
    t = results["totals"]
    for key, value in t.items():
        if key.startswith("batch_"):
            lines.append(
                f"{'TOTAL per judged episode, trainer batch ' + key[6:]:<48} {value:>11.3f}  "
                "(write + enqueue + scorer embedded + trainer; target <= 4)"
            )
    first = path["scorer_first_message"]
    row("(once per scorer instance: its first message)", first["requests"], first["per_episode"])
    row(
        "(Functions host: change-feed pages, emulated)",
        path["host_change_feed"]["documents_per_episode"],
        path["host_change_feed"]["per_episode"],
    )
    lines.append("")
    lines.append("Training tick per agent (requests counted; times distorted: the local server scans whole containers)")
    lines.append(
        f"{'mode':<6} {'agents':>7} {'new':>4} {'docs/agent':>10} {'all/agent':>9} {'writes':>6} {'wall s':>8} "
        f"{'ms/agent':>8} {'CPU ms/agent':>12}  by kind per agent; outcomes"
    )
    for r in results["ticks"]:
        lines.append(
            f"{r['mode']:<6} {r['agents']:>7,} {('yes' if r['new_scores'] else 'no'):>4} "
            f"{r['documents_per_agent']:>10.3f} {r['requests_per_agent']:>9.3f} {r['writes_per_agent']:>6.2f} "
            f"{r['wall_s']:>8.1f} "
            f"{r['wall_ms_per_agent']:>8.2f} {r['cpu_ms_per_agent']:>12.2f}  "
            f"{fmt_kinds(r['per_agent'])}; {r['statuses']}"
        )
        if len(r["phases"]) > 1:
            shares = ", ".join(f"{name} {c['total'] / r['agents']:.3f}" for name, c in r["phases"].items())
            lines.append(f"{'':<6} {'':>7} {'':>4} phases, requests per agent: {shares}")
    lines.append("")
    cpu = results["scorer_cpu"]
    lines.append("Scorer CPU per episode (this process; the judge server runs in a child process)")
    lines.append(
        f"  offline judge: {cpu['offline_ms_per_episode']} ms per scored episode "
        f"(the judge alone {cpu['offline_judge_only_ms']} ms)"
    )
    if cpu.get("evaluators_ms_per_episode") is not None:
        lines.append(
            f"  evaluators (azure-ai-evaluation, local judge server): {cpu['evaluators_ms_per_episode']} ms CPU, "
            f"{cpu['evaluators_wall_ms_per_episode']} ms wall per episode"
        )
    lines.append("")
    est, d = results["estimate"], results["defaults"]
    lines.append(
        f"Paper estimate for one deployment at its defaults (judge {d['judge_model']} "
        f"{d['judge_capacity_ktpm']}k TPM, {d['maximum_instance_count']} instances x "
        f"{d['max_concurrent_calls']} concurrent calls, Cosmos {d['cosmos_capacity_mode']}, "
        f"Service Bus {d['servicebus_sku']}, tick every {d['tick_seconds']:.0f} s)"
    )
    for name, limit in sorted(est["limits"].items(), key=lambda kv: kv[1]["episodes_per_s"]):
        lines.append(f"  {name:<26} {limit['episodes_per_s']:>12,.3f} episodes/s  ({limit['why']})")
    lines.append(
        f"  first bottleneck: {est['first_bottleneck']}: {est['episodes_per_s']} episodes/s "
        f"(~{est['episodes_per_day']:,} a day)"
    )
    for label, a in est["agents_per_tick"].items():
        lines.append(f"  agents one tick trains, {label}: ~{a['agents']:,} ({a['why']})")
    lines.append(f"  Cosmos RU per episode by container (assumed RU per kind): {est['cosmos_ru_per_episode']}")
    check = results.get("cross_check")
    if check:
        lines.append(
            f"Requests counted by the client / served by the local server over the whole run: "
            f"{check['client_counted']:,} / {check['server_counted']:,}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: {text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"{name}: {text!r} needs positive integers")
    return values


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the benchmark with ``args``; returns the results."""
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")  # the local server's own certificate
    modes = [m.strip() for m in args.trainer.split(",") if m.strip()]
    unknown = [m for m in modes if m not in TRAINER_MODES]
    if unknown:
        raise SystemExit(f"--trainer: unknown mode(s) {unknown}; known: {', '.join(TRAINER_MODES)}")
    started = time.perf_counter()
    results: dict[str, Any] = {
        "measured": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "python benchmarks/scale.py " + " ".join(args.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }

    def saved() -> None:  # partial results after every tick, so that a long run that is stopped keeps them
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**results, "partial": True}, indent=2) + "\n")

    with local_server() as server:
        wire = Wire(server)
        server.reset_stats()
        progress(f"episode path: {args.episodes} episodes through write, enqueue and score")
        results["episode_path"], template = measure_episode_path(wire, args.episodes)
        results["trainer_batches"] = measure_batches(wire, args.batches, template, modes[0])
        results["totals"] = totals(results["episode_path"], results["trainer_batches"])
        results["scorer_cpu"] = {
            "offline_ms_per_episode": results["episode_path"]["scorer_embedded"]["cpu_ms_per_episode"],
            "offline_judge_only_ms": measure_offline_judge_cpu(200),
        }
        if args.judge == "evaluators":
            ev = measure_evaluators_cpu(wire, args.evaluator_episodes)
            results["scorer_cpu"].update(
                evaluators_ms_per_episode=ev["cpu_ms_per_episode"],
                evaluators_wall_ms_per_episode=ev["wall_ms_per_episode"],
                evaluators_statuses=ev["statuses"],
            )
        results["ticks"] = []
        measure_ticks(wire, args.agents, args.scores_per_agent, template, modes, results["ticks"], saved)
        # Every client of the run carries the counter: the server's own count must agree.
        results["cross_check"] = {
            "client_counted": wire.counter.snapshot().total,
            "server_counted": server.stats()["total"],
        }
    results["defaults"] = read_defaults()
    results["assumptions"] = assumptions()
    results["estimate"] = estimate(results, results["defaults"])
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", help="agent counts of the tick measurements (1,100,1000,10000)")
    parser.add_argument("--batches", help="new scores per agent of the amortised trainer cost (50,500)")
    parser.add_argument("--episodes", type=int, help="episodes through write, enqueue and score (200)")
    parser.add_argument("--scores-per-agent", type=int, default=3, help="new scores per agent in the tick rows")
    parser.add_argument(
        "--judge",
        choices=("offline", "evaluators"),
        default="offline",
        help="also measure the scorer's CPU with the real evaluators (local judge server)",
    )
    parser.add_argument("--evaluator-episodes", type=int, default=50, help="episodes scored by the evaluators")
    parser.add_argument(
        "--trainer", default="fanout", help=f"trainer modes, comma-separated ({', '.join(TRAINER_MODES)})"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke test")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="measure nothing: redo the estimate and tables of saved results"
    )
    args = parser.parse_args(argv)
    args.argv = argv
    small = {"agents": "1,10", "batches": "5,20", "episodes": 20}  # --quick: a smoke test in seconds
    full = {"agents": "1,100,1000,10000", "batches": "50,500", "episodes": 200}
    for name, value in (small if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.quick:
        args.evaluator_episodes = min(args.evaluator_episodes, 5)
    args.agents = parse_ints(str(args.agents), "--agents")
    args.batches = parse_ints(str(args.batches), "--batches")
    if args.episodes < 4:
        raise SystemExit("--episodes: at least 4 (half embedded, half not)")
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        results["defaults"] = read_defaults()
        results["assumptions"] = assumptions()
        results["estimate"] = estimate(results, results["defaults"])
    else:
        results = run(args)
    print(report(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        progress(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
