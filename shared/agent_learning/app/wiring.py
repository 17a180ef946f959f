"""Settings → objects: the one composition root.

The Functions app (:mod:`agent_learning.app.handlers`), the embedded runner
(:mod:`agent_learning.app.embedded`) and the CLI build their store, queue, judge, reward function,
learner, telemetry and drift configuration here, from one :class:`~agent_learning.app.settings.Settings`,
so they are wired alike. The adapters of Cosmos DB and Service Bus are imported
only when the settings choose them (the evaluators import azure-ai-evaluation only when built);
the Functions app imports this module on its first invocation, not at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from agent_learning.app.settings import PREFIX, Settings, component
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import ConfigurationError
from agent_learning.core.telemetry import configure
from agent_learning.evaluation import GuardrailConfig
from agent_learning.judges.base import Judge
from agent_learning.judges.evaluators import EvaluatorJudge, JudgeLimits, JudgeModel, JudgeTokens
from agent_learning.judges.offline import OfflineJudge
from agent_learning.judges.sampling import Judging, JudgingRules
from agent_learning.learning.reinforce import LearnerConfig, Reinforce
from agent_learning.pipeline import Scorer
from agent_learning.pipeline.drift import DriftConfig
from agent_learning.queue.base import WorkQueue
from agent_learning.queue.sqlite import SQLiteQueue
from agent_learning.rewards import RewardConfig, RewardFunction
from agent_learning.store.base import Store
from agent_learning.store.memory import MemoryStore
from agent_learning.store.sqlite import SQLiteStore, described

__all__ = [
    "Components",
    "configure",
    "describe_store",
    "drift_config",
    "guardrail_config",
    "judge_limits",
    "judge_model_config",
    "judge_tokens",
    "learner_config",
    "open_judge",
    "open_judging",
    "open_learner",
    "open_queue",
    "open_reward",
    "open_scorer",
    "open_store",
    "reward_config",
]


def reward_config(settings: Settings) -> RewardConfig:
    """The reward shaping the settings configure."""
    return component(settings, RewardConfig)


def learner_config(settings: Settings) -> LearnerConfig:
    """The learner's configuration."""
    return component(settings, LearnerConfig)


def drift_config(settings: Settings) -> DriftConfig:
    """The thresholds of the drift warnings, and whether a warning pins."""
    return component(settings, DriftConfig)


def guardrail_config(settings: Settings) -> GuardrailConfig | None:
    """The publish guardrail (``None`` when it is off)."""
    config = component(settings, GuardrailConfig)
    return None if config.mode == "off" else config


def judge_model_config(settings: Settings) -> JudgeModel:
    """The judge model of the azure-ai-evaluation evaluators."""
    return component(settings, JudgeModel)


def judge_limits(settings: Settings) -> JudgeLimits:
    """Timeouts and retries of the evaluators' calls."""
    return component(settings, JudgeLimits)


def judge_tokens(settings: Settings) -> JudgeTokens:
    """The evaluators' completion limits and the judge's token budget."""
    return component(settings, JudgeTokens)


def open_judge(settings: Settings) -> Judge:
    """The judge ``settings`` choose: the offline rules judge or the azure-ai-evaluation evaluators."""
    if settings.judge == "evaluators":
        return EvaluatorJudge(judge_model_config(settings), judge_limits(settings), tokens=judge_tokens(settings))
    return OfflineJudge()


def open_reward(settings: Settings) -> RewardFunction:
    """The reward function the settings configure."""
    return RewardFunction(reward_config(settings))


def open_learner(settings: Settings) -> Reinforce:
    """The learner the settings configure."""
    return Reinforce(learner_config(settings))


def open_judging(settings: Settings) -> Judging:
    """Which episodes are judged (``AGENT_LEARNING_JUDGING``), with a fresh ``N/min`` window."""
    return Judging(JudgingRules.parse(settings.judging))


def open_scorer(settings: Settings, store: Store, *, judge: Judge | None = None, clock: Clock = SYSTEM_CLOCK) -> Scorer:
    """The score stage's dependencies: ``store``, the judge (``judge`` or the settings'), the reward
    and which episodes are judged."""
    return Scorer(store, judge or open_judge(settings), open_reward(settings), clock, open_judging(settings))


def open_store(settings: Settings, *, path: str | Path | None = None, clock: Clock = SYSTEM_CLOCK) -> Store:
    """The store ``settings`` choose: SQLite (default), memory, or Cosmos DB."""
    if settings.store == "memory":
        return MemoryStore()
    if settings.store == "cosmos":
        from agent_learning.store.cosmos import CosmosStore  # azure-cosmos: only when the settings choose it

        assert settings.cosmos_endpoint is not None  # load_settings checks it
        key = settings.cosmos_key.get_secret_value() if settings.cosmos_key else None
        return CosmosStore.connect(
            settings.cosmos_endpoint,
            settings.cosmos_database,
            key=key,
            managed_identity_client_id=settings.cosmos_client_id,
            settle_seconds=settings.score_settle_seconds,
            clock=clock,
        )
    return SQLiteStore(path or settings.sqlite_path)


def describe_store(settings: Settings, path: str | Path | None = None) -> str:
    """The store the settings choose, for messages: an embedded file's absolute path and how it is
    chosen (a relative one depends on the working directory)."""
    if settings.store == "cosmos":
        return f"Cosmos DB {settings.cosmos_endpoint} database {settings.cosmos_database}"
    if settings.store == "memory":
        return "the memory store"
    return described(str(path or settings.sqlite_path))


def open_queue(settings: Settings, *, path: str | Path | None = None, clock: Clock = SYSTEM_CLOCK) -> WorkQueue:
    """The scoring queue ``settings`` choose: the embedded SQLite queue or Service Bus."""
    return _open_queue(settings, settings.queue_name, path, clock)


EMBEDDED_TRAIN_DUPLICATE_WINDOW = 0.001
"""Seconds the embedded training queue remembers a message id. Embedded ticks run back to back
and each drains the queue before the next, so an agent still at the same cursor (waiting for
more scores, or its candidate held) must be sent again at the next tick, not dropped."""


def open_train_queue(settings: Settings, *, path: str | Path | None = None, clock: Clock = SYSTEM_CLOCK) -> WorkQueue:
    """The training queue (one message per agent to train): embedded SQLite or Service Bus."""
    return _open_queue(settings, settings.train_queue_name, path, clock, EMBEDDED_TRAIN_DUPLICATE_WINDOW)


def _open_queue(
    settings: Settings, name: str, path: str | Path | None, clock: Clock, duplicate_window: float | None = None
) -> WorkQueue:
    if settings.queue == "servicebus":
        from agent_learning.queue.servicebus import (
            ServiceBusQueue,  # azure-servicebus: only when the settings choose it
        )

        if settings.servicebus_connection_string:
            secret = settings.servicebus_connection_string.get_secret_value()
            try:
                return ServiceBusQueue.from_connection_string(secret, name, lock_seconds=settings.queue_lock_seconds)
            except ValueError as exc:  # the SDK's parse; its message does not repeat the string
                raise ConfigurationError(
                    f"invalid configuration: {PREFIX}SERVICEBUS_CONNECTION_STRING: {exc}"
                ) from None
        assert settings.servicebus_namespace is not None  # load_settings checks it
        return ServiceBusQueue.from_namespace(
            settings.servicebus_namespace, name, managed_identity_client_id=settings.servicebus_client_id,
            lock_seconds=settings.queue_lock_seconds,
        )
    queue_path = ":memory:" if settings.store == "memory" else str(path or settings.sqlite_path)
    window = {} if duplicate_window is None else {"duplicate_window_seconds": duplicate_window}
    return SQLiteQueue(
        queue_path,
        name=name,
        lock_seconds=settings.queue_lock_seconds,
        max_deliveries=settings.queue_max_deliveries,
        clock=clock,
        **window,
    )


class Components:
    """The pipeline's parts as ``settings`` choose them, each built on first use, and closed
    together (what was opened here): the one place the Functions app
    (:func:`~agent_learning.app.handlers.build_runtime`), the embedded runner
    (:func:`~agent_learning.app.embedded.open_local`), the CLI and the demo build them.

    ``path`` is the embedded store's and queues' file (else the settings'); ``judge`` and ``store``
    replace the settings' choice with a part the caller opened (and closes)."""

    def __init__(
        self,
        settings: Settings,
        *,
        path: str | Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
        judge: Judge | None = None,
        store: Store | None = None,
    ) -> None:
        self.settings, self.path, self.clock = settings, path, clock
        self._given = {"judge": judge, "store": store}
        self._opened: list[Any] = []

    def _part(self, name: str, build: Callable[[], Any], closes: bool = False) -> Any:
        if name not in self.__dict__:
            given = self._given.get(name)
            part = given if given is not None else build()
            if closes and given is None:
                self._opened.append(part)
            self.__dict__[name] = part
        return self.__dict__[name]

    @property
    def store(self) -> Store:
        return self._part("store", lambda: open_store(self.settings, path=self.path, clock=self.clock), closes=True)

    @property
    def queue(self) -> WorkQueue:
        """The scoring queue."""
        return self._part("queue", lambda: open_queue(self.settings, path=self.path, clock=self.clock), closes=True)

    @property
    def train_queue(self) -> WorkQueue:
        """The training queue (one message per agent to train)."""
        return self._part(
            "train_queue", lambda: open_train_queue(self.settings, path=self.path, clock=self.clock), closes=True
        )

    @property
    def judge(self) -> Judge:
        return self._part("judge", lambda: open_judge(self.settings))

    @property
    def reward(self) -> RewardFunction:
        return self._part("reward", lambda: open_reward(self.settings))

    @property
    def judging(self) -> Judging:
        return self._part("judging", lambda: open_judging(self.settings))

    @property
    def scorer(self) -> Scorer:
        return self._part("scorer", lambda: Scorer(self.store, self.judge, self.reward, self.clock, self.judging))

    @property
    def learner(self) -> Reinforce:
        return self._part("learner", lambda: open_learner(self.settings))

    @property
    def drift(self) -> DriftConfig:
        return self._part("drift", lambda: drift_config(self.settings))

    @property
    def guardrail(self) -> GuardrailConfig | None:
        return self._part("guardrail", lambda: guardrail_config(self.settings))

    def close(self) -> None:
        """Close the parts opened here, the last opened first; each is closed even if another fails."""
        with ExitStack() as closing:
            while self._opened:
                closing.callback(self._opened.pop(0).close)

    def __enter__(self) -> Components:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
