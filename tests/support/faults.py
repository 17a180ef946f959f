"""Fault injection for the reliability suite: crashes, duplicate deliveries, a Functions host.

* :class:`Crash` is a process dying: a ``BaseException``, so no handler's ``except
  Exception`` catches it and nothing after the crash point runs (SQLite rolls back an open
  transaction, as it would after a real crash).
* :class:`Injector` decides where to crash: a named crash point and how often
  (``every=2``: the 1st, 3rd, 5th... time the point is reached), and counts what it injected.
  :class:`FaultyStore`, :class:`FaultySend` and :class:`FaultyJudge` wrap the real store, the
  queue's send and the judge and consult it at every step boundary they own.
* :class:`FunctionsHost` plays the Azure Functions host around the app's own functions,
  called with the real ``azure.functions`` types: the change-feed trigger (a lease that moves
  only after a batch succeeded, retried without limit, optionally each batch delivered several
  times), the HTTP feedback function, the Service Bus trigger (complete on success, abandon on an exception, nothing
  after a crash, so the lock expires and the message comes back; optionally every message
  delivered several times) and the timer (optionally several times per tick).
* :class:`OutageJudge` fails like the evaluator adapter during an outage; :class:`NetworkCut`
  cuts the network between a client and its server (a TCP proxy).
* :func:`account` reconstructs, from the store alone, which score each published policy
  version consumed (the runs' cursor ranges), and so which episodes were lost or learned from
  more than once.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import azure.functions as func
from app_functions import functions, sb_message
from azure.functions.timer import TimerRequest
from factories import INCARNATION

from agent_learning.agent.capture import EpisodeCapture
from agent_learning.agent.client import PolicyClient
from agent_learning.app import handlers
from agent_learning.app.settings import load_settings
from agent_learning.app.wiring import EMBEDDED_TRAIN_DUPLICATE_WINDOW
from agent_learning.core.clock import ManualClock
from agent_learning.core.errors import PermanentError, TransientError
from agent_learning.documents import Episode, PolicyDocument, TrainingRun
from agent_learning.judges.base import Judge, Judgement
from agent_learning.judges.offline import OfflineJudge
from agent_learning.learning.reinforce import Reinforce
from agent_learning.ops.audit import AgentAudit, audit_agent
from agent_learning.pipeline import Scorer, create_policy, load_current
from agent_learning.policy.softmax import SoftmaxPolicy
from agent_learning.queue.base import OutgoingMessage, WorkQueue
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.sim.simulate import math_tutor
from agent_learning.store.base import Store

AGENT = "math-tutor"
FUNCTIONS = {name: f.get_user_function() for name, f in functions().items()}


class Crash(BaseException):
    """The process died at this point."""


class Injector:
    """Where to crash: ``points`` maps a crash point's name to how often it fires (``every``).

    A point with ``every=n`` fires the 1st, (n+1)th, (2n+1)th... time it is reached, so the
    retry right after a crash passes. ``injected`` counts the crashes per point.
    """

    def __init__(self, points: dict[str, int] | None = None) -> None:
        self.points = dict(points or {})
        for name, every in self.points.items():
            if every < 2:
                raise ValueError(f"crash point {name}: every must be >= 2, or the retry would crash too")
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self._lock = threading.Lock()

    def fires(self, point: str) -> bool:
        """Count a pass through ``point``; True if the process is to crash here."""
        every = self.points.get(point)
        if every is None:
            return False
        with self._lock:
            self.calls[point] += 1
            if self.calls[point] % every == 1:
                self.injected[point] += 1
                return True
        return False

    def check(self, point: str) -> None:
        if self.fires(point):
            raise Crash(point)

    @property
    def total(self) -> int:
        return sum(self.injected.values())


class FaultyStore(Store):
    """A store that may crash before (``<method>:before``) or after (``<method>:after``) any call."""

    def __init__(self, inner: Store, injector: Injector) -> None:
        self.inner, self.injector = inner, injector

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _crashing(name: str) -> Callable[..., Any]:
    def call(self: FaultyStore, *args: Any, **kwargs: Any) -> Any:
        self.injector.check(f"{name}:before")
        result = getattr(self.inner, name)(*args, **kwargs)
        self.injector.check(f"{name}:after")
        return result

    call.__name__ = name
    return call


for _name in Store.__abstractmethods__:
    setattr(FaultyStore, _name, _crashing(_name))
FaultyStore.__abstractmethods__ = frozenset()


class FaultySend:
    """The queue's batch send, which may crash before (``send:before``), after sending the first
    half of the batch (``send:mid``, as when Service Bus accepted one batch of several) or after
    all of it (``send:after``)."""

    def __init__(self, send: Callable[[list[OutgoingMessage]], int], injector: Injector) -> None:
        self.send, self.injector = send, injector

    def __call__(self, messages: list[OutgoingMessage]) -> int:
        self.injector.check("send:before")
        if len(messages) > 1 and self.injector.fires("send:mid"):
            self.send(messages[: len(messages) // 2])
            raise Crash("send:mid")
        sent = self.send(messages)
        self.injector.check("send:after")
        return sent


class FaultyJudge(Judge):
    """A judge that may crash before judging (``judge:before``) or after (``judge:after``).

    It also times every call of the judge it wraps (``durations``, seconds, failures included)."""

    def __init__(self, inner: Judge, injector: Injector | None = None) -> None:
        self.inner, self.injector = inner, injector or Injector()
        self.durations: list[float] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.durations)

    def judge(self, episode: Episode) -> Judgement:
        self.injector.check("judge:before")
        started = time.perf_counter()
        try:
            judgement = self.inner.judge(episode)
        finally:
            with self._lock:
                self.durations.append(time.perf_counter() - started)
        self.injector.check("judge:after")
        return judgement


class OutageJudge(Judge):
    """The offline judge behind a switchable outage. ``mode``: ``"up"``; ``"unavailable"``
    (what the evaluator adapter raises once its retries of 5xx, 429s or timeouts ran out); or
    ``"garbage"`` (its error for output still invalid after every attempt)."""

    def __init__(self) -> None:
        self.inner = OfflineJudge()
        self.mode = "up"
        self.failures = 0

    def judge(self, episode: Episode) -> Judgement:
        if self.mode == "unavailable":
            self.failures += 1
            raise TransientError("judge unavailable: IntentResolutionEvaluator: HTTP 503")
        if self.mode == "garbage":
            self.failures += 1
            raise PermanentError("judge failed permanently: intent_resolution: the reply is not a valid evaluation")
        return self.inner.judge(episode)


class NetworkCut:
    """A TCP proxy in front of a server that a test can cut and restore: while cut, open
    connections are dropped and new ones are closed as soon as they are accepted, as when the
    network to a service fails. Clients connect to ``port`` instead of ``target_port``."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host, self.target_port = host, target_port
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0
        threading.Thread(target=self._accept, name="network-cut", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._cut.is_set():
                self.refused += 1
                client.close()
                continue
            upstream = socket.create_connection((self.host, self.target_port))
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            connections, self._open = list(self._open), set()
        for s in connections:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self._listener.close()


# --------------------------------------------------------------------------- agents


def start_policy(store: Store, clock: ManualClock) -> None:
    """Version 1 of the math tutor's policy (uniform over its four prompt variants), of the
    incarnation of the factories' episodes."""
    actions = math_tutor(AGENT).actions
    first = SoftmaxPolicy.from_actions(AGENT, actions, exploration_floor=0.01).to_document(created_at=clock.now())
    create_policy(store, first.model_copy(update={"incarnation": INCARNATION}))


class Agent:
    """The simulated math tutor: reads its policy with the real client (refreshing before every
    round) and writes episodes through the real capture code."""

    def __init__(self, store: Store, clock: ManualClock, seed: int = 11) -> None:
        self.store, self.clock = store, clock
        self.scenario = math_tutor(AGENT)
        self.client = PolicyClient(store, AGENT, refresh_seconds=0, rng=random.Random(seed), clock=clock)
        self.rng = random.Random(seed + 1)
        self.written: list[str] = []

    def run(self, n: int) -> list[Episode]:
        policy = self.client.policy()
        episodes = [
            self.scenario.run_episode(self.store, policy.choose(), self.rng, self.clock,
                                      episode_id=f"ep-{len(self.written) + i:05d}")
            for i in range(n)
        ]
        self.written.extend(e.id for e in episodes)
        return episodes

    def answer(self, output: str, episode_id: str, question: str = "What is 2 + 2?") -> Episode:
        """One episode with this exact output (e.g. carrying a judge-server marker)."""
        capture = EpisodeCapture(self.store, self.client.policy().choose(), input=question,
                                 instructions=self.scenario.instructions, episode_id=episode_id, clock=self.clock)
        episode = capture.end(output)
        self.written.append(episode.id)
        return episode


# --------------------------------------------------------------------------- the Functions host


@dataclass
class Deliveries:
    """How many times the host delivers each change-feed batch, each message and each timer tick."""

    feed: int = 1
    message: int = 1
    timer: int = 1


class FunctionsHost:
    """The Azure Functions host, played around the app's functions (see the module docstring).

    ``store`` and ``queue`` are the real adapters; the app's runtime gets them wrapped in the
    fault injectors. ``workers`` > 1 runs the score function on several messages at once.
    """

    def __init__(
        self,
        store: Store,
        queue: WorkQueue,
        clock: ManualClock,
        *,
        injector: Injector | None = None,
        judge: Judge | None = None,
        deliveries: Deliveries | None = None,
        workers: int = 1,
        page_size: int = 50,
    ) -> None:
        self.store, self.queue, self.clock = store, queue, clock
        self.injector = injector or Injector()
        self.deliveries = deliveries or Deliveries()
        self.workers, self.page_size = workers, page_size
        # Crash and redelivery runs train on batches too small for the guardrail to judge (it would hold
        # them, tests/evaluation/test_guardrail.py); warning keeps every run publishing so the books can be checked.
        settings = load_settings(store="memory", queue="sqlite", guardrail="warn")
        faulty = FaultyStore(store, self.injector)
        self.judge = FaultyJudge(judge or OfflineJudge(), self.injector)
        # The training queue: every tick's messages are delivered before the next tick, and a
        # repeated tick's copies are delivered too (no duplicate detection), which the trainer
        # absorbs. A crashed run's message is delivered again until it succeeds (in Azure, after
        # MaxDeliveryCount, the next tick sends a new one).
        self.train_queue = SQLiteQueue(":memory:", name="train-agents", clock=clock, max_deliveries=1_000,
                                       duplicate_window_seconds=EMBEDDED_TRAIN_DUPLICATE_WINDOW)
        self.runtime = handlers.Runtime(
            settings,
            faulty,
            FaultySend(queue.send, self.injector),
            Scorer(faulty, self.judge, RewardFunction(settings.reward_config()), clock),
            Reinforce(settings.learner_config()),
            send_train=FaultySend(self.train_queue.send, self.injector),
        )
        self.lease: str | None = None
        self.events: Counter[str] = Counter()
        self._events_lock = threading.Lock()

    @property
    def faults(self) -> int:
        """Crashes injected plus deliveries beyond the first (each one a fault the pipeline must absorb)."""
        return self.injector.total + self.events["redelivered batch"] + self.events["ack lost"] + self.events[
            "repeated tick"]

    def _event(self, name: str) -> None:
        with self._events_lock:
            self.events[name] += 1

    @contextmanager
    def active(self) -> Iterator[None]:
        """The app's functions use this host's runtime (its store, queue and judge) meanwhile."""
        previous, handlers._runtime = handlers._runtime, self.runtime
        try:
            yield
        finally:
            handlers._runtime = previous

    def pump(self) -> None:
        """The Cosmos DB trigger: every new change-feed batch to ``enqueue``; the lease moves on success."""
        with self.active():
            while True:
                page = self.store.read_episodes(self.lease, self.page_size)
                if not page.items:
                    self.lease = page.continuation or self.lease
                    return
                batch = func.DocumentList([func.Document.from_dict(d) for d in page.items])
                delivered = 0
                for _ in range(50):
                    try:
                        FUNCTIONS["enqueue"](batch)
                    except Crash:
                        self._event("enqueue crashed")
                        continue  # the host restarts; the trigger's retry policy delivers the batch again
                    except Exception:
                        self._event("enqueue failed")
                        continue  # the function failed: the retry policy delivers the batch again
                    delivered += 1
                    if delivered == self.deliveries.feed:
                        break
                    self._event("redelivered batch")
                    self.clock.advance(1.0)  # a redelivery comes later (past a short duplicate-detection window)
                else:
                    raise AssertionError("a change-feed batch never succeeded")
                self.lease = page.continuation

    def score(self, passes: int | None = None) -> None:
        """The Service Bus trigger, until the queue is empty (expired locks are waited out), or
        for ``passes`` receive calls."""
        with self.active(), ThreadPoolExecutor(self.workers) as pool:
            for _ in range(passes or 10_000):
                messages = self.queue.receive(32)
                if not messages:
                    # Service Bus reports no per-lock counts; this host leaves nothing locked there.
                    if not isinstance(self.queue, SQLiteQueue) or self.queue.counts().active == 0:
                        return
                    self.clock.advance(self.queue.lock_seconds + 1)  # unsettled locks expire: redelivery
                    continue
                list(pool.map(self._deliver, messages))
            if passes is None:
                raise AssertionError("the queue never emptied")

    def _deliver(self, message: Any) -> None:
        try:
            FUNCTIONS["score"](sb_message(message))
        except Crash:
            self._event("score crashed")  # nothing settles the message: its lock expires
            return
        except Exception:
            self._event("abandoned")
            self.queue.abandon(message)
            return
        if message.delivery_count < self.deliveries.message or self.injector.fires("complete:before"):
            self._event("ack lost")  # the function returned, but the completion never reached the queue
            return
        self.queue.complete(message)

    def tick(self, *, retry: bool = True) -> None:
        """The timer: one training tick (delivered ``deliveries.timer`` times), then the training
        trigger on every message the tick sent. A crashed tick or training run runs again at once
        (the past-due run after the host restarts; the message whose lock expired), or, without
        ``retry``, the :class:`Crash` propagates."""
        with self.active():
            done = 0
            for _ in range(100):
                try:
                    FUNCTIONS["train"](TimerRequest(past_due=False))
                except Crash:
                    self._event("train crashed")
                    if not retry:
                        raise
                    continue
                except Exception:
                    self._event("train failed")  # the function failed: the next tick tries again
                    return
                done += 1
                if done == self.deliveries.timer:
                    break
                self._event("repeated tick")
            else:
                raise AssertionError("a training tick never finished")
            self._train_pending(retry)

    def _train_pending(self, retry: bool) -> None:
        """The training trigger, until the training queue is empty."""
        for _ in range(1_000):
            messages = self.train_queue.receive(32)
            if not messages:
                if self.train_queue.counts().active == 0:
                    return
                self.clock.advance(self.train_queue.lock_seconds + 1)  # a crashed run's message comes back
                continue
            for message in messages:
                try:
                    FUNCTIONS["train_agent"](sb_message(message))
                except Crash:
                    self._event("train crashed")  # nothing settles the message: its lock expires
                    if not retry:
                        raise
                    continue
                self.train_queue.complete(message)
        raise AssertionError("the training queue never emptied")

    def post_feedback(self, episode_id: str, body: dict[str, Any], key: str = "user-key") -> int:
        """The HTTP trigger: POST ``body`` as feedback on an episode, as the holder of function key
        ``key``; returns the status code (a :class:`Crash` propagates: the request just fails)."""
        req = func.HttpRequest(method="POST", url=f"/api/episodes/{episode_id}/feedback",
                               route_params={"episode_id": episode_id}, headers={"x-functions-key": key},
                               params={}, body=json.dumps(body).encode())
        with self.active():
            return int(FUNCTIONS["feedback"](req).status_code)

    def cycle(self) -> None:
        self.pump()
        self.score()
        self.tick()


def run_rounds(host: FunctionsHost, agent: Agent, rounds: int, per_round: int) -> None:
    """``rounds`` times: the agent writes ``per_round`` episodes, then the host pumps, scores and trains."""
    for _ in range(rounds):
        agent.run(per_round)
        host.cycle()
    host.tick()  # one more tick: anything left over is trained now


@dataclass(frozen=True)
class Reference:
    """The outcome of a crash-free run: the final logits and every score, by episode id."""

    logits: tuple[float, ...]
    scores: dict[str, dict[str, Any]]


_REFERENCE: dict[tuple[int, int, int], Reference] = {}


def reference(rounds: int, per_round: int, seed: int = 11) -> Reference:
    """A crash-free, duplicate-free run of :func:`run_rounds` on in-memory SQLite (cached)."""
    key = (rounds, per_round, seed)
    if key not in _REFERENCE:
        from agent_learning.store.sqlite import SQLiteStore

        clock = ManualClock()
        store = SQLiteStore(":memory:")
        start_policy(store, clock)
        run_rounds(FunctionsHost(store, SQLiteQueue(":memory:", clock=clock), clock), Agent(store, clock, seed),
                   rounds, per_round)
        current = load_current(store, AGENT)
        assert current is not None
        scores = {s["id"]: s for s in store.read_scores(AGENT, None, 1_000_000)}
        _REFERENCE[key] = Reference(tuple(current.logits), scores)
        store.close()
    return _REFERENCE[key]


def judged_content(score: dict[str, Any]) -> dict[str, Any]:
    """A score without what legitimately differs between two runs (store fields, ``seq``, ``scored_at``)."""
    return {k: v for k, v in score.items() if not k.startswith("_") and k not in ("seq", "scored_at")}


def differences(a: Any, b: Any, path: str = "", rel: float = 1e-12) -> list[str]:
    """Where two JSON values differ, numbers compared up to float rounding.

    Runs that fold the same scores into the policy in a different order (concurrent scorers
    store them in another order) agree up to rounding, and so do the probabilities agents log.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{path}.{k}", rel)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]", rel)]
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return [] if math.isclose(a, b, rel_tol=rel, abs_tol=rel) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


# --------------------------------------------------------------------------- accounting


@dataclass
class Accounting:
    """What the store says happened to the episodes an agent wrote."""

    written: list[str]
    consumed: Counter[str]  # score id → how many published updates' ranges hold it
    kept: set[str] = field(default_factory=set)  # rejected, but held for inspection (e.g. dead-lettered)
    versions: int = 0
    late: int = 0  # scores that landed inside a range after its run had read it: never learned from
    operators: AgentAudit | None = None  # what `agent-learn audit` reads from the same store

    @property
    def missing(self) -> set[str]:
        """Episodes in no published update's range, and not kept aside."""
        return set(self.written) - set(self.consumed) - self.kept

    @property
    def lost(self) -> int:
        """Lost by these books or by the operators' audit, whichever finds more."""
        return max(len(self.missing) + self.late, self.operators.lost if self.operators else 0)

    @property
    def double(self) -> set[str]:
        """Learned from twice; the operators' audit counts episodes, so its finding stands in
        when these books found none."""
        twice = {k for k, n in self.consumed.items() if n > 1}
        if not twice and self.operators is not None and self.operators.learned_twice:
            twice = {f"(audit: {self.operators.learned_twice} episodes learned twice)"}
        return twice


def account(store: Store, written: Iterable[str], kept: Iterable[str] = (), agent_id: str = AGENT) -> Accounting:
    """Check that the published versions form one chain and count what each consumed.

    Versions must be 1..N with no gap, the current document the last of them, and every
    version v >= 2 produced by exactly one run that started at version v-1's cursor and ended
    at version v's. The scores a run consumed are the ones between its two cursors in the
    ``(seq, id)`` order. A range holding more scores than its run counted (episodes, feedback
    corrections and rejected rows) had scores land in it after the run read it: those were never
    learned from (``late``).
    """
    versions = [PolicyDocument.from_dict(v) for v in store.list_policy_versions(agent_id)]
    current = load_current(store, agent_id)
    assert [v.version for v in versions] == list(range(1, len(versions) + 1)), "a version is missing or repeated"
    assert current is not None and current.as_kind("version") == versions[-1], "current is not the last version"
    runs = {r["policy_version"]: TrainingRun.from_dict(r) for r in store.list_runs(agent_id, 100_000)}
    assert sorted(runs) == list(range(2, len(versions) + 1)), "a version has no run record, or a run no version"
    scores = sorted((s["seq"], s["id"]) for s in store.read_scores(agent_id, None, 1_000_000, settled=False))
    consumed: Counter[str] = Counter()
    late = 0
    for previous, version in pairwise(versions):
        run = runs[version.version]
        assert version.run == run and run.base_version == previous.version
        assert run.cursor_from == previous.cursor and run.cursor_to == version.cursor
        low = (run.cursor_from.seq, run.cursor_from.id) if run.cursor_from else (-1, "")
        high = (run.cursor_to.seq, run.cursor_to.id)
        ids = [sid for seq, sid in scores if low < (seq, sid) <= high]
        late += len(ids) - run.episodes - run.corrections - run.rejected
        consumed.update(ids)
    operators = audit_agent(store, agent_id)
    assert not operators.problems, f"agent-learn audit found problems: {operators.problems}"
    return Accounting(list(written), consumed, set(kept), len(versions), late, operators)


def dead_lettered(queue: Any) -> set[str]:
    """Message ids (episode ids) in the dead-letter queue."""
    return {d.message_id for d in queue.dead_letters(10_000)}
