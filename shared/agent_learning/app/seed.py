"""The names of the ``azure-agents-learning-sdk`` README, as a thin layer over this library.

::

    from agent_learning import Action, EpisodeCapture, LearningRunner, SoftmaxPolicy

* ``Action`` is :class:`~agent_learning.documents.Action`; ``SoftmaxPolicy`` is
  :class:`~agent_learning.policy.SoftmaxPolicy` (``from_actions(actions, agent_id=...)`` and
  ``snapshot()`` included), whose ``snapshot()`` also remembers the policy, so that a ``start``
  for an agent with no stored policy stores it first, as that README's policies persist at once.
* ``EpisodeCapture()`` with no arguments is that README's start/end form
  (:class:`EpisodeRecorder`): ``start(...)`` returns the run (an
  :class:`~agent_learning.agent.capture.EpisodeCapture`, which also records tool calls) and
  ``end(run, assistant_output=...)`` writes its episode to the store the settings choose. With
  arguments it is the capture itself, a context manager.
* ``LearningRunner(policy=...).run_offline_batch(agent_id, episode_limit=N)`` is one
  :meth:`~agent_learning.app.embedded.LocalPipeline.run_once` of the embedded runner for that agent: the
  same store, queue, judge, reward and learner as ``agent-learn train --limit N``.

The learner side (settings, store adapters, the pipeline, numpy) is imported when it is first
used, so that the agent side stays light. docs/migrating.md maps every name, variable and command.
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path
from typing import Any

from agent_learning import policy
from agent_learning.agent import capture
from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import InvalidDocument
from agent_learning.documents import Action
from agent_learning.policy.decision import Decision

_snapshotted: weakref.WeakValueDictionary[str, SoftmaxPolicy] = weakref.WeakValueDictionary()
"""Agent id → the policy whose ``snapshot()`` was taken last, for :meth:`EpisodeRecorder.start`."""


class SoftmaxPolicy(policy.SoftmaxPolicy):
    """:class:`~agent_learning.policy.SoftmaxPolicy`, whose ``snapshot()`` remembers it (weakly)
    for :meth:`EpisodeRecorder.start`."""

    def snapshot(self) -> policy.PolicySnapshot:
        _snapshotted[self.agent_id] = self
        return super().snapshot()

__all__ = ["Action", "EpisodeCapture", "EpisodeRecorder", "LearningRunner", "SoftmaxPolicy"]


class EpisodeCapture(capture.EpisodeCapture):
    """:class:`~agent_learning.agent.capture.EpisodeCapture`; called with no arguments, the
    start/end form of :class:`EpisodeRecorder` on the store the settings choose."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            return EpisodeRecorder()
        return super().__new__(cls)


class EpisodeRecorder:
    """Writes episodes given as ``start(...)`` / ``end(run, assistant_output=...)``. The store is
    ``store``, else the one the settings choose, opened at the first ``start``."""

    def __init__(self, store: capture.EpisodeWriter | None = None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self._owned = store is None

    def start(
        self,
        *,
        user_input: str,
        policy_id: str,
        policy_version: int,
        action_id: str,
        action_logprob: float,
        **options: Any,
    ) -> capture.EpisodeCapture:
        """A run of the action drawn from policy version ``policy_id`` (``agent:vN``, as
        ``policy.snapshot().id``); ``options`` are :class:`~agent_learning.agent.capture.EpisodeCapture`'s
        (``instructions``, ``metadata``, ``tool_definitions``...)."""
        agent_id, sep, version = str(policy_id).rpartition(":v")
        if not sep or not agent_id or version != str(policy_version):
            problem = (f"must be policy.snapshot().id, '<agent>:v{policy_version}' for policy_version "
                       f"{policy_version!r}, got {policy_id!r:.80}")
            raise InvalidDocument("episode", [("policy_id", problem)])
        if isinstance(action_logprob, bool) or not isinstance(action_logprob, int | float) or action_logprob > 0:
            problem = f"must be decision.logprob, a log-probability (<= 0), got {action_logprob!r:.40}"
            raise InvalidDocument("episode", [("action_logprob", problem)])
        if self.store is None:
            from agent_learning.app.settings import (
                load_settings,  # the learner side: imported only when the store is opened here
            )
            from agent_learning.app.wiring import open_store

            self.store = open_store(load_settings(), clock=self.clock)
        incarnation = self._incarnation(agent_id, policy_version)
        decision = Decision(
            agent_id, action_id, -1, math.exp(action_logprob), action_logprob, policy_version, incarnation=incarnation
        )
        return capture.EpisodeCapture(self.store, decision, input=user_input, clock=self.clock, **options)

    def _incarnation(self, agent_id: str, version: int) -> str | None:
        """The incarnation of the agent's stored policy ``version``, which the episode must carry
        (the scorer dead-letters one of another incarnation). An agent with no stored policy gets
        the one whose ``snapshot()`` gave ``policy_id``, stored now as its version 1."""
        read = getattr(self.store, "get_policy_version", None)
        if read is None:  # a writer that cannot read policies (over HTTP): the route checks the episode
            return None
        stored = read(agent_id, version)
        unsaved = _snapshotted.get(agent_id)
        if stored is None and version == 1 and unsaved is not None and unsaved.version == 1:
            from agent_learning.pipeline import create_policy  # the learner side, as above

            stored = create_policy(self.store, unsaved.to_document(created_at=self.clock.now())).to_dict()
        return stored.get("incarnation") if stored else None

    def end(self, run: capture.EpisodeCapture, *, assistant_output: str) -> Any:
        """Write the episode of ``run`` (what ``start`` returned) with the agent's output; returns it."""
        return run.end(assistant_output)

    def close(self) -> None:
        """Close the store if this recorder opened it."""
        if self._owned and self.store is not None and hasattr(self.store, "close"):
            self.store.close()
            self.store = None

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LearningRunner:
    """Judges, shapes, persists and learns from an agent's episodes: one run of the embedded
    pipeline (:func:`~agent_learning.app.embedded.open_local`) per :meth:`run_offline_batch`.

    ``settings`` default to the environment's; ``judge`` and ``path`` are ``open_local``'s."""

    def __init__(
        self,
        policy: SoftmaxPolicy | None = None,
        *,
        settings: Any = None,
        judge: Any = None,
        path: str | Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.judge = judge
        self.path = path
        self.clock = clock
        self.report: Any = None
        """The last run's :class:`~agent_learning.app.embedded.CycleReport` (scoring outcomes included)."""

    def run_offline_batch(self, agent_id: str | None = None, *, episode_limit: int | None = None) -> Any:
        """Score the waiting episodes with the configured judge (at most ``episode_limit``), store
        each metric and the shaped reward, then train ``agent_id`` on at most ``episode_limit`` new
        scores and publish the new version. The runner's policy is stored first if the agent has
        none, and becomes the published version after.

        Returns the agent's :class:`~agent_learning.pipeline.TrainOutcome`: ``status``
        (``published``, ``too_few_scores``...), ``version`` and ``run`` (the training run)."""
        from agent_learning.app.embedded import (
            open_local,  # the learner side (numpy, the judges): imported when it runs
        )
        from agent_learning.pipeline import create_policy, load_current

        agent_id = agent_id if agent_id is not None else (self.policy.agent_id if self.policy else None)
        if agent_id is None:
            raise ValueError("agent_id: give the agent to train, or a policy")
        if self.policy is not None and self.policy.agent_id != agent_id:
            raise ValueError(f"agent_id: {agent_id!r} is not the runner's policy's agent {self.policy.agent_id!r}")
        if episode_limit is not None and (isinstance(episode_limit, bool) or not isinstance(episode_limit, int)
                                          or episode_limit < 1):
            raise ValueError(f"episode_limit: must be a whole number >= 1, got {episode_limit!r:.40}")
        with open_local(self.settings, path=self.path, judge=self.judge, clock=self.clock) as pipeline:
            if self.policy is not None and pipeline.store.get_current_policy(agent_id) is None:
                create_policy(pipeline.store, self.policy.to_document(created_at=self.clock.now()))
            self.report = pipeline.run_once([agent_id], limit=episode_limit)
            (outcome,) = self.report.trained
            current = load_current(pipeline.store, agent_id)
        if current is not None:
            self.policy = SoftmaxPolicy.from_document(current)
        return outcome
