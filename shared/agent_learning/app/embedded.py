"""The embedded runner: the three pipeline stages in one process, on the local adapters.

::

    episodes (store) ──pump──► queue ──score──► scores (store) ──train──► train queue ──► policies (store)

The loop in a script, on the embedded default (``.agent-learning/local.db``, the offline
judge; ``path=`` picks another file)::

    with open_local() as pipeline:
        report = pipeline.run_once()     # what `agent-learn train` does
    report.published                     # {"support-bot": 2}: the versions it published

A :class:`~agent_learning.agent.client.PolicyClient` in the same process chooses from a version
published here at its next choice (:mod:`agent_learning.core.notices`).

Its parts are built from settings in :mod:`agent_learning.app.wiring` (``open_store``,
``open_queue`` and ``open_judge`` are importable from here too). ``pump`` plays the Cosmos
change-feed trigger (it reads the store's episode feed from a durable checkpoint),
``score_pending`` plays the Service Bus trigger (it receives, scores and settles messages),
``train`` plays the timer (it plans the tick and sends one message per agent with new scores
to the training queue) and then the training trigger (it trains the agent each message
names). They call the same handlers as the Functions app. The checkpoint
is saved after the messages are sent, so a crash in between resends them, and duplicate
detection plus the idempotent scorer absorb that.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_learning.app import wiring
from agent_learning.app.deliveries import QueueSettles, deliver_training, scoring_failed, settle_score
from agent_learning.app.personalizer.sweep import sweep_events
from agent_learning.app.settings import Settings, load_settings
from agent_learning.app.wiring import Components, open_judge, open_queue, open_store
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import ConcurrencyConflict
from agent_learning.core.telemetry import configure
from agent_learning.documents import TRAIN_BATCH
from agent_learning.judges.base import Judge
from agent_learning.judges.sampling import Judging
from agent_learning.pipeline import (
    EnqueueResult,
    Scorer,
    TrainOutcome,
    enqueue_episodes,
    plan_training,
    score_message,
    send_plan,
    train_requested,
)
from agent_learning.pipeline.train import agent_list
from agent_learning.queue.base import WorkQueue
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardFunction
from agent_learning.rewards.feedback import SweepResult, sweep
from agent_learning.store.base import Store

# ``open_store``, ``open_queue`` and ``open_judge`` moved to :mod:`agent_learning.app.wiring`; importable here too.
__all__ = ["FEED_CHECKPOINT", "CycleReport", "LocalPipeline", "open_judge", "open_local", "open_queue", "open_store"]

FEED_CHECKPOINT = "episodes-feed"
log = logging.getLogger(__name__)

LOCK_SHARE = 0.5
"""The embedded runner receives no more scoring messages at once than it scored in this share of
the queue's lock, at the pace of the batch before (a judge model takes seconds an episode): the
rest of a batch would wait past its lock, come back, and be counted ``lock_lost``. Nor more than
twice the batch before (the first is one message): a batch of duplicates or dead letters, settled
in no time, says nothing of the judge's pace."""


@dataclass
class CycleReport:
    """What one :meth:`LocalPipeline.run_once` did."""

    enqueued: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    """Scoring messages handled (see :meth:`LocalPipeline.score_pending`), each counted once."""
    trained: list[TrainOutcome] = field(default_factory=list)
    feedback: SweepResult | None = None
    """What the feedback sweep before training did."""
    cpu_seconds: Counter[str] = field(default_factory=Counter)
    """CPU seconds of this process per stage: ``enqueue``, ``score``, ``feedback``, ``train``."""

    @property
    def published(self) -> dict[str, int]:
        """Agent id → the version this cycle published (agents it published nothing for are left out)."""
        return {r.agent_id: r.version for r in self.trained if r.status == "published" and r.version is not None}


class LocalPipeline:
    """Runs enqueue → score → train over a store and a queue."""

    def __init__(
        self,
        store: Store,
        queue: WorkQueue,
        judge: Judge,
        reward: RewardFunction,
        learner: Any,
        *,
        clock: Clock = SYSTEM_CLOCK,
        max_batch: int = TRAIN_BATCH,
        min_batch: int = 1,
        feed_checkpoint: str = FEED_CHECKPOINT,
        page_size: int = 500,
        drift: Any = None,
        guardrail: Any = None,
        train_queue: WorkQueue | None = None,
        judging: Judging | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.train_queue = train_queue if train_queue is not None else train_queue_beside(queue, clock)
        self.scorer = Scorer(store, judge, reward, clock, judging or Judging())
        self.learner = learner
        self.clock = clock
        self.max_batch = max_batch
        self.min_batch = min_batch
        self.feed_checkpoint = feed_checkpoint
        self.page_size = page_size
        self.drift = drift
        self.guardrail = guardrail

    @classmethod
    def of(cls, parts: Components) -> LocalPipeline:
        """The runner on the parts the settings choose (:class:`~agent_learning.app.wiring.Components`)."""
        return cls(
            parts.store, parts.queue, parts.judge, parts.reward, parts.learner, clock=parts.clock,
            max_batch=parts.settings.train_max_batch, min_batch=parts.settings.train_min_batch, drift=parts.drift,
            guardrail=parts.guardrail, train_queue=parts.train_queue, judging=parts.judging,
        )

    def close(self) -> None:
        """Close the store and the queues."""
        self.store.close()
        self.queue.close()
        self.train_queue.close()

    def __enter__(self) -> LocalPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pump(self) -> int:
        """Enqueue every episode written since the checkpoint; returns how many were sent."""
        sent = 0
        while True:
            continuation = self.store.get_checkpoint(self.feed_checkpoint)
            page = self.store.read_episodes(continuation, self.page_size)
            if not page.items:
                return sent
            result: EnqueueResult = enqueue_episodes(page.items, self.queue.send)
            sent += result.sent
            if page.continuation is not None:
                self.store.set_checkpoint(self.feed_checkpoint, page.continuation)

    def score_pending(
        self,
        max_messages: int | None = None,
        receive_batch: int = 100,
        progress: Callable[[int], None] | None = None,
    ) -> Counter[str]:
        """Receive and score until the queue has nothing available (or ``max_messages``);
        ``progress`` is called with the number handled so far. At most ``receive_batch`` messages
        are received at once, fewer at first and when a slow judge would keep them past their lock
        (:data:`LOCK_SHARE`). The messages of a batch to complete are completed together once it is
        scored (:meth:`~agent_learning.queue.base.WorkQueue.complete_all`: one commit on the embedded queue).

        Returns the messages handled, each counted once under what became of it: the status it
        was settled with (``scored``, ``duplicate``, ``unjudged``, ``retry``, ``dead_letter``),
        ``failed`` (scoring raised) or ``lock_lost`` (its lock expired before it was settled,
        whatever its outcome: it comes back, and what was stored makes it a duplicate)."""
        outcomes: Counter[str] = Counter()
        handled = 0
        lock = self.queue.lock_seconds
        received, seconds_each = 0, 0.0  # the batch before: its size and its pace
        while max_messages is None or handled < max_messages:
            want = receive_batch if max_messages is None else min(receive_batch, max_messages - handled)
            want = min(want, 2 * received or 1)
            if seconds_each > 0:
                want = max(1, min(want, int(LOCK_SHARE * lock / seconds_each)))
            started = self.clock.now()
            messages = self.queue.receive(want)
            if not messages:
                break
            completed: list[Any] = []  # completed together once the batch is scored (one commit)
            done: list[tuple[Any, str]] = []
            for message in messages:
                try:
                    outcome = score_message(message.body, self.scorer, delivery_count=message.delivery_count)
                except Exception as exc:
                    # What the Functions host does when the scoring function raises: the other
                    # messages go on, and this one comes back when its lock expires, until the
                    # queue's max deliveries dead-letter it.
                    log.warning(
                        "scoring message %s failed (%s: %s); it comes back when its lock expires, and is"
                        " dead-lettered after the queue's max deliveries",
                        message.message_id, type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG),
                    )
                    scoring_failed(message.delivery_count, getattr(self.queue, "max_deliveries", None))
                    outcomes["failed"] += 1
                else:
                    try:
                        settle_score(outcome, QueueSettles(self.queue, message, completed), message.delivery_count,
                                     getattr(self.queue, "max_deliveries", None))
                    except ConcurrencyConflict:
                        outcomes["lock_lost"] += 1
                    else:
                        if completed and completed[-1] is message:
                            done.append((message, outcome.status))
                        else:
                            outcomes[outcome.status] += 1
                handled += 1
                if progress:
                    progress(handled)
            # A lock lost (it expired while the batch was judged: a slow judge, or a long batch): the
            # message comes back, and what this delivery stored makes the next one a duplicate.
            lost = {id(message) for message in self.queue.complete_all(completed)}
            outcomes.update("lock_lost" if id(message) in lost else status for message, status in done)
            received = len(messages)
            seconds_each = (self.clock.now() - started).total_seconds() / received
        return outcomes

    def train(self, agent_ids: Iterable[str] | None = None, *, limit: int | None = None) -> list[TrainOutcome]:
        """One training tick as in Azure: plan it, send one message per agent with new scores to
        the training queue (:func:`~agent_learning.pipeline.fanout.plan_training`), then train the
        agent of every message waiting there. Returns an outcome for every agent (``agent_ids``:
        only those), ordered by agent id; one agent's failure does not stop the others. ``limit``:
        each run learns from at most that many scores (fewer than the configured batch)."""
        plan = plan_training(self.store, agent_ids=agent_list(agent_ids))
        send_plan(plan, self.train_queue.send)
        outcomes = plan.untrained() + self.train_pending(limit=limit)
        return sorted(outcomes, key=lambda o: o.agent_id)

    def train_pending(self, *, limit: int | None = None) -> list[TrainOutcome]:
        """Train the agent of every message on the training queue (the training trigger's work):
        each message is completed once trained, whatever the outcome (the next tick plans
        again); one that is not a training request is dead-lettered with the reason.

        Messages are received one at a time, so that each lock starts when its run does; a run
        that outlasts its lock keeps its outcome, and its message comes back, to a run that
        changes nothing."""
        outcomes: list[TrainOutcome] = []
        max_batch = self.max_batch if limit is None else min(limit, self.max_batch)

        def train(body: bytes | str) -> TrainOutcome:
            return train_requested(body, self.store, self.learner, clock=self.clock, max_batch=max_batch,
                                   min_batch=self.min_batch, drift=self.drift, guardrail=self.guardrail)

        while messages := self.train_queue.receive(1):
            for message in messages:
                outcome = deliver_training(message.body, train, QueueSettles(self.train_queue, message))
                if outcome is not None:
                    outcomes.append(outcome)
        return outcomes

    def run_once(self, agent_ids: Iterable[str] | None = None, *, limit: int | None = None) -> CycleReport:
        """Pump, score everything available, apply unapplied feedback, then train: one timer period's
        work. ``limit``: score at most that many episodes and learn from at most that many per agent
        (the rest wait for the next run)."""
        agent_ids = agent_list(agent_ids)  # before any work
        report = CycleReport()
        since = time.process_time()
        sweep_events(self.store, self.clock)  # events whose reward wait is over become episodes, pumped next
        report.enqueued = self.pump()
        since = charge(report.cpu_seconds, "enqueue", since)
        report.outcomes = self.score_pending(max_messages=limit)
        since = charge(report.cpu_seconds, "score", since)
        report.feedback = sweep(self.store, clock=self.clock)
        since = charge(report.cpu_seconds, "feedback", since)
        report.trained = self.train(agent_ids, limit=limit)
        charge(report.cpu_seconds, "train", since)
        return report


def charge(cpu: Counter[str], stage: str, since: float) -> float:
    """Add this process's CPU seconds since ``since`` (a :func:`time.process_time`) to ``cpu[stage]``;
    returns the time now, the start of the next stage."""
    now = time.process_time()
    cpu[stage] += now - since
    return now


def open_local(
    settings: Settings | None = None,
    *,
    path: str | Path | None = None,
    judge: Judge | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> LocalPipeline:
    """A :class:`LocalPipeline` on the store and queue chosen by ``settings`` (embedded by default).
    If any part fails to open, the parts already open are closed."""
    settings = settings or load_settings()
    configure(settings)
    parts = Components(settings, path=path, clock=clock, judge=judge)
    try:
        return LocalPipeline.of(parts)
    except BaseException:
        parts.close()
        raise


def train_queue_beside(queue: WorkQueue, clock: Clock = SYSTEM_CLOCK) -> WorkQueue:
    """The embedded training queue in the file of the embedded scoring ``queue`` (so that a
    message a crashed runner held is trained after a restart), or in memory beside another queue."""
    path = queue.path if isinstance(queue, SQLiteQueue) else ":memory:"
    return SQLiteQueue(
        path,
        name=Settings.model_fields["train_queue_name"].default,
        clock=clock,
        duplicate_window_seconds=wiring.EMBEDDED_TRAIN_DUPLICATE_WINDOW,
    )
