"""Agent side: record one run (steps, tool calls, output) and write it as an episode.

::

    decision = policy.choose()
    with EpisodeCapture(store, decision, input=question) as run:
        with run.tool("search", arguments={"q": question}) as call:
            call.result = search(question)
        episode = run.end(answer)

The episode records the decision's action, probability and policy version, which the
learner needs to weigh it correctly. Free text longer than the contract's caps is
truncated (and the field named in ``episode.truncated``) rather than failing the agent's
run; user input goes through the ``redact`` hook before it is stored. If the block raises
before ``end()``, the episode is still written, with an empty output and an ``agent`` step in
error, so a crashing configuration is learned from too; the exception propagates.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from .clock import SYSTEM_CLOCK, Clock
from .documents import MAX_STEP_TEXT_CHARS, MAX_STEPS, MAX_TEXT_CHARS, Episode, Step
from .policy import Decision
from .store.base import Store

_MARK = " …[truncated]"


@dataclass
class ToolCall:
    """Handle yielded by :meth:`EpisodeCapture.tool`; set ``result`` to record the output."""

    result: Any = None


class EpisodeCapture:
    """Collects one agent run and stores it through the store port when it ends."""

    def __init__(
        self,
        store: Store,
        decision: Decision,
        *,
        input: str,
        instructions: str | None = None,
        tool_definitions: list[dict[str, Any]] | None = None,
        metadata: Mapping[str, str | int | float | bool] | None = None,
        redact: Callable[[str], str] | None = None,
        episode_id: str | None = None,
        ttl: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.decision = decision
        self.episode_id = episode_id or uuid.uuid4().hex
        self._truncated: list[str] = []
        self.input = self._cap("input", redact(input) if redact else input, MAX_TEXT_CHARS)
        self.instructions = self._cap("instructions", instructions, MAX_TEXT_CHARS) if instructions else instructions
        self.tool_definitions = tool_definitions
        self.metadata = dict(metadata or {})
        self.ttl = ttl
        self.clock = clock
        self.started_at = clock.now()
        self.steps: list[Step] = []
        self.episode: Episode | None = None

    # ------------------------------------------------------------------ recording

    def step(
        self,
        name: str,
        *,
        latency_ms: float,
        status: Literal["ok", "error"] = "ok",
        error: str | None = None,
        kind: Literal["tool", "llm", "retrieval", "step"] = "tool",
        arguments: dict[str, Any] | None = None,
        result: Any = None,
        call_id: str | None = None,
    ) -> None:
        """Record a finished step or tool call."""
        if len(self.steps) >= MAX_STEPS:
            if "steps" not in self._truncated:
                self._truncated.append("steps")
            return
        n = len(self.steps)
        self.steps.append(
            Step(
                name=name[:128],
                kind=kind,
                status=status,
                latency_ms=max(0.0, float(latency_ms)),
                error=self._cap(
                    f"steps[{n}].error", error or ("error" if status == "error" else None), MAX_STEP_TEXT_CHARS
                ),
                arguments=arguments,
                result=self._cap(f"steps[{n}].result", None if result is None else str(result), MAX_STEP_TEXT_CHARS),
                call_id=call_id,
            )
        )

    @contextmanager
    def tool(
        self,
        name: str,
        *,
        arguments: dict[str, Any] | None = None,
        kind: Literal["tool", "llm", "retrieval", "step"] = "tool",
        call_id: str | None = None,
    ) -> Iterator[ToolCall]:
        """Time a tool call; an exception marks it as failed and propagates."""
        call = ToolCall()
        t0 = time.perf_counter()
        try:
            yield call
        except BaseException as exc:
            self.step(
                name,
                latency_ms=(time.perf_counter() - t0) * 1000,
                status="error",
                error=f"{type(exc).__name__}: {exc}",
                kind=kind,
                arguments=arguments,
                call_id=call_id,
            )
            raise
        self.step(
            name,
            latency_ms=(time.perf_counter() - t0) * 1000,
            kind=kind,
            arguments=arguments,
            result=call.result,
            call_id=call_id,
        )

    # ------------------------------------------------------------------ ending

    def build(self, output: str) -> Episode:
        """The episode as it would be stored (validated), without writing it."""
        d = self.decision
        capped = _truncate(output, MAX_TEXT_CHARS)
        truncated = [*self._truncated, "output"] if capped != output else list(self._truncated)
        return Episode(
            id=self.episode_id,
            agent_id=d.agent_id,
            policy_version=d.version,
            action_id=d.action_id,
            probability=d.probability,
            logprob=d.logprob,
            input=self.input,
            output=capped or "",
            instructions=self.instructions,
            tool_definitions=self.tool_definitions,
            steps=list(self.steps),
            started_at=self.started_at,
            ended_at=max(self.clock.now(), self.started_at),
            metadata=self.metadata,
            truncated=truncated,
            ttl=self.ttl,
        )

    def end(self, output: str) -> Episode:
        """Finish the run and write the episode; returns the stored episode."""
        if self.episode is not None:
            raise RuntimeError(f"episode {self.episode_id} has already ended")
        episode = self.build(output)
        self.store.add_episode(episode)
        self.episode = episode
        return episode

    async def aend(self, output: str) -> Episode:
        """``end()`` for async agents: uses the store's async write if it has one."""
        if self.episode is not None:
            raise RuntimeError(f"episode {self.episode_id} has already ended")
        episode = self.build(output)
        writer = getattr(self.store, "add_episode_async", None)
        if writer is not None:
            await writer(episode)
        else:
            await asyncio.to_thread(self.store.add_episode, episode)
        self.episode = episode
        return episode

    def __enter__(self) -> EpisodeCapture:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and self.episode is None:
            self._record_crash(exc)
            self.end("")

    async def __aenter__(self) -> EpisodeCapture:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and self.episode is None:
            self._record_crash(exc)
            await self.aend("")

    # ------------------------------------------------------------------ helpers

    def _record_crash(self, exc: BaseException) -> None:
        elapsed = (self.clock.now() - self.started_at).total_seconds() * 1000
        self.step("agent", kind="step", status="error", latency_ms=elapsed, error=f"{type(exc).__name__}: {exc}")

    def _cap(self, field: str, text: str | None, limit: int) -> str | None:
        """Truncate ``text`` and note the field (``steps`` for any step's text), once."""
        capped = _truncate(text, limit)
        name = "steps" if field.startswith("steps") else field
        if capped != text and name not in self._truncated:
            self._truncated.append(name)
        return capped


def _truncate(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - len(_MARK)] + _MARK
