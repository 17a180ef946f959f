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
run; ``input`` goes through the ``redact`` hook before it is stored. Only ``input``: tool
arguments and results, the output and metadata are stored as given, so text from the user that the
agent passes there (a search query) must be scrubbed before it is passed. A tool's result is
stored as text: a string as it is, a dict, list or number as JSON, anything else as ``str``.

Failures, and what they cost the action drawn:

* An exception inside ``run.tool(...)`` records the call as failed (status ``error``, the
  exception as its error text, its latency) and propagates. To record a failed call and go on,
  call ``call.fail("timeout")`` inside the block, or pass ``reraise=False`` so that an exception
  is recorded and swallowed (``call.result`` stays ``None``). A failed call costs the episode's
  reward the tool-failure penalty (:mod:`agent_learning.rewards`).
* If the run's block raises before ``end()``, the episode is still written, with an empty output
  and an ``agent`` step in error (in place of the last step of a run at ``MAX_STEPS``), so a
  crashing configuration is learned from too (the empty output is penalised); the exception
  propagates. An exception that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
  asyncio's ``CancelledError``) stops the run from outside and says nothing about the
  configuration (a restart cancels every run in flight): the run is discarded
  (``run.discarded`` says why) and nothing is written. A timeout meant to count against the
  configuration goes inside the block (``asyncio.timeout`` there raises ``TimeoutError``, an
  ``Exception``).
* If ``end()`` itself cannot write the episode (the store is unreachable), its error propagates
  and no crash episode is written in its place: the run did not crash, the store failed.
* ``run.discard(reason)`` writes nothing: for failures that say nothing about the configuration
  drawn (the model provider is down, the user went away), so that they are not charged to it.
* Recording never hides the agent's exception: if a failed call or the crash episode cannot be
  recorded (the store is unreachable, a value changed after it was checked), the agent's exception
  propagates with a note saying why (and the capture logs a warning).

Values are checked where they are passed: the constructor's, ``run.tool(...)``'s on entry (before
the call runs), ``run.step(...)``'s and ``run.add_usage(...)``'s. A bad one raises
:class:`~agent_learning.core.errors.InvalidDocument` naming the episode's field, e.g.
``invalid episode: steps[2].latency_ms: must not be negative, got -5``; nothing is coerced (a
latency is a finite number of milliseconds, at least 0; an output is a string, ``""`` for none).
Once ``end()`` has written the episode, ``run.step``, ``run.tool`` and ``run.add_usage`` raise
``RuntimeError``, as a second ``end()`` does: what they would record could never be stored.

``episode.truncated`` names what was cut: ``input``, ``output``, ``instructions`` (over
their caps), ``tool_definitions`` (the leading definitions that fit
``MAX_TOOL_DEFINITIONS_CHARS`` are kept whole; they are stored, not shown to the judges),
``steps`` (a step's name, text or arguments over their caps, or steps beyond
``MAX_STEPS``), and ``steps.result``, ``steps.arguments``, ``steps.error`` when step texts
were cut to keep the whole episode under ``MAX_EPISODE_BYTES`` (Cosmos DB's item limit; the
per-field caps alone admit about 4 MB). That cut takes the longest of those texts first,
down to a common length, and keeps everything the reward and the judges need besides: the
input, the output, the instructions and every step's name, status and latency. The other
fields' caps bound them to well under the limit (under 1.8 MB even in the worst case:
every text at its cap in 4-byte characters), so no step is ever dropped to fit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import numbers
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from agent_learning.core.clock import SYSTEM_CLOCK, Clock
from agent_learning.core.errors import DocumentTooLarge, InvalidDocument
from agent_learning.documents import (
    MAX_EPISODE_BYTES,
    MAX_JSON_CHARS,
    MAX_NAME_CHARS,
    MAX_STEP_TEXT_CHARS,
    MAX_STEPS,
    MAX_TEXT_CHARS,
    MAX_TOOL_DEFINITIONS_CHARS,
    PARTIAL,
    Episode,
    Step,
    Usage,
    invalid_from_pydantic,
    json_bytes,
)
from agent_learning.policy.softmax import Decision

_MARK = " …[truncated]"
_ABSENT = object()
"""What :meth:`EpisodeCapture.add_usage` reads for a count its ``usage`` does not have."""

log = logging.getLogger(__name__)


class EpisodeWriter(Protocol):
    """Where :class:`EpisodeCapture` writes: a store, or an :class:`~agent_learning.agent.client.HttpEpisodeWriter`
    (which may also offer ``add_episode_async``, as the Cosmos store does)."""

    def add_episode(self, episode: Episode) -> None: ...


@dataclass
class ToolCall:
    """Handle yielded by :meth:`EpisodeCapture.tool`; set ``result`` to record the output, or
    call :meth:`fail` to record the call as failed without raising."""

    result: Any = None
    error: str | None = None
    """Set by :meth:`fail`: the call is recorded as failed with this text."""

    def fail(self, error: str | BaseException) -> None:
        """Record this call as failed (e.g. ``call.fail("timeout after 10 s")``); the run goes on."""
        self.error = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error) or "error"


class EpisodeCapture:
    """Collects one agent run and writes it (to a store or an ingestion route) when it ends."""

    def __init__(
        self,
        store: EpisodeWriter,
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
        if not isinstance(decision, Decision):
            problem = f"must be the Decision that policy.choose() returned, got {type(decision).__name__}"
            raise InvalidDocument("episode", [("decision", problem)])
        self.store = store
        self.decision = decision
        self.episode_id = uuid.uuid4().hex if episode_id is None else episode_id  # "" is refused below, not replaced
        self._truncated: list[str] = []
        text = _checked_text("input", input, required=True)
        if redact is not None:
            text = redact(text)
            if not isinstance(text, str):
                raise InvalidDocument("episode", [("input", f"redact must return a string, got {type(text).__name__}")])
        self.input = self._cap("input", text, MAX_TEXT_CHARS)
        self.instructions = self._cap("instructions", instructions, MAX_TEXT_CHARS)
        self.tool_definitions = self._fit_tools(tool_definitions)
        if metadata is not None and not isinstance(metadata, Mapping):
            problem = f"must be a mapping of names to values, got {type(metadata).__name__}"
            raise InvalidDocument("episode", [("metadata", problem)])
        self.metadata = dict(metadata or {})
        self.ttl = ttl
        self.clock = clock
        self.started_at = clock.now()
        self.steps: list[Step] = []
        self.usage: Usage | None = None
        self.reward: float | None = None
        """The agent's own reward (``end(reward=)``; set it earlier, e.g. to 0, and a crash episode carries it)."""
        self.episode: Episode | None = None
        self.discarded: str | None = None
        """Why the run was discarded (:meth:`discard`), or None."""
        self._write_error: BaseException | None = None
        """The error of end()'s own write, which is no crash of the run (:meth:`_crashed`)."""
        try:  # the episode as it stands (what a crash would write): its values are refused here, not at the end
            Episode.model_validate(self._fields("", [], self.started_at), context=PARTIAL)
        except ValidationError as exc:
            problems = invalid_from_pydantic("episode", exc).problems
            raise InvalidDocument("episode", [("episode_id" if f == "id" else f, p) for f, p in problems]) from None

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
        """Record a finished step or tool call; a bad value raises :class:`InvalidDocument` naming
        ``steps[i].<field>`` (``latency_ms`` must be a finite number of milliseconds, at least 0).
        Only ``kind="tool"`` steps are shown to the judges (as tool calls with their results) and
        penalised when they fail; ``"llm"``, ``"retrieval"`` and ``"step"`` are stored and timed.
        After :meth:`end` it raises ``RuntimeError``: the episode is written, the step would be lost."""
        self._check_not_ended("step", name)
        step, cut = self._new_step(
            len(self.steps), name, latency_ms=latency_ms, status=status, error=error, kind=kind,
            arguments=arguments, result=result, call_id=call_id,
        )
        if len(self.steps) >= MAX_STEPS:
            self._note("steps")
            return
        self.steps.append(step)
        if cut:
            self._note("steps")

    def _new_step(
        self, n: int, name: Any, *, latency_ms: Any, status: Any, error: Any, kind: Any, arguments: Any,
        result: Any, call_id: Any,
    ) -> tuple[Step, bool]:
        """Step ``n`` as it would be recorded, and whether its name, a text or the arguments were cut to their caps.

        Raises :class:`InvalidDocument` naming every bad field as ``steps[n].<field>``."""
        path = f"steps[{n}]"
        problems: list[tuple[str, str]] = []
        if not isinstance(name, str):
            problems.append((f"{path}.name", f"must be a string, got {type(name).__name__}"))
            name = "step"
        latency, problem = _latency(latency_ms)
        if problem:
            problems.append((f"{path}.latency_ms", problem))
        if error is None or error == "":
            error = "error" if status == "error" else None
        texts = {"error": error, "result": None if result is None else _result_text(result)}
        for field, text in texts.items():
            if text is not None and not isinstance(text, str):
                problems.append((f"{path}.{field}", f"must be a string, got {type(text).__name__}"))
                texts[field] = None
        cut = len(name) > MAX_NAME_CHARS or any(
            text is not None and len(text) > MAX_STEP_TEXT_CHARS for text in texts.values()
        )
        if arguments is not None:
            size, problem = _json_arguments(arguments)
            if problem:
                problems.append((f"{path}.arguments", problem))
                arguments = None
            elif size > MAX_JSON_CHARS:
                arguments = _shrink_arguments(arguments, MAX_JSON_CHARS)
                cut = True
        try:
            step = Step(
                name=name[:MAX_NAME_CHARS],
                kind=kind,
                status=status,
                latency_ms=latency,
                error=_truncate(texts["error"], MAX_STEP_TEXT_CHARS),
                arguments=arguments,
                result=_truncate(texts["result"], MAX_STEP_TEXT_CHARS),
                call_id=call_id,
            )
        except ValidationError as exc:
            problems += [
                (path if field == "(document)" else f"{path}.{field}", problem)
                for field, problem in invalid_from_pydantic("episode", exc).problems
            ]
        if problems:
            raise InvalidDocument("episode", problems)
        return step, cut

    @contextmanager
    def tool(
        self,
        name: str,
        *,
        arguments: dict[str, Any] | None = None,
        kind: Literal["tool", "llm", "retrieval", "step"] = "tool",
        call_id: str | None = None,
        reraise: bool = True,
    ) -> Iterator[ToolCall]:
        """Time a tool call. An exception marks it as failed and propagates (with ``reraise=False``
        it is recorded and swallowed: an ``Exception``, never ``KeyboardInterrupt`` and the like;
        if it cannot be recorded, it propagates with a note saying why); :meth:`ToolCall.fail` marks
        it as failed without one. ``name``, ``arguments``, ``kind`` and ``call_id`` are checked before
        the call runs (:class:`InvalidDocument`), and after :meth:`end` it raises ``RuntimeError``."""
        self._check_not_ended("tool call", name)
        self._new_step(
            len(self.steps), name, latency_ms=0.0, status="ok", error=None, kind=kind, arguments=arguments,
            result=None, call_id=call_id,
        )
        call = ToolCall()
        t0 = time.perf_counter()
        try:
            yield call
        except BaseException as exc:
            try:
                call.fail(exc)
                self._record_call(name, call, t0, kind, arguments, call_id)
            except Exception as failure:
                _unrecorded(exc, f"the failed call {name!r} was not recorded", failure)
                reraise = True  # the call's own exception goes on, never this one
            if reraise or not isinstance(exc, Exception):
                raise
            return
        self._record_call(name, call, t0, kind, arguments, call_id)

    def _record_call(
        self, name: str, call: ToolCall, t0: float, kind: Any, arguments: dict[str, Any] | None, call_id: str | None
    ) -> None:
        self.step(
            name,
            latency_ms=max(0.0, (time.perf_counter() - t0) * 1000),
            status="error" if call.error is not None else "ok",
            error=call.error,
            kind=kind,
            arguments=arguments,
            result=call.result,
            call_id=call_id,
        )

    def add_usage(self, usage: Any = None, *, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Count model tokens the run spent: a model response's ``usage`` (anything with
        ``prompt_tokens`` and ``completion_tokens``, attributes or keys, as OpenAI's clients
        return; one missing or None count is 0) or the two numbers. Calls add up; the episode
        records the sum. A count that is not a whole number, at least 0, raises
        :class:`InvalidDocument` naming ``usage.prompt_tokens`` or ``usage.completion_tokens``, and
        a ``usage`` with neither (a whole response, or ``input_tokens``/``output_tokens`` as other
        APIs name them: pass those as the two numbers) naming ``usage``; a call after :meth:`end`,
        ``RuntimeError``."""
        self._check_not_ended("usage", None)
        counts = {"prompt_tokens": [prompt_tokens], "completion_tokens": [completion_tokens]}
        if usage is not None:
            get = usage.get if isinstance(usage, Mapping) else lambda name, default: getattr(usage, name, default)
            found = {name: get(name, _ABSENT) for name in counts}
            if all(value is _ABSENT for value in found.values()):
                problem = (f"has neither prompt_tokens nor completion_tokens, got {type(usage).__name__}; "
                           "give a response's usage, or the counts as prompt_tokens= and completion_tokens=")
                raise InvalidDocument("episode", [("usage", problem)])
            for name, values in counts.items():
                values.append(None if found[name] is _ABSENT else found[name])
        problems = [
            (f"usage.{name}", f"must be a whole number of tokens, at least 0, got {value!r:.40}")
            for name, values in counts.items()
            for value in values
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0)
        ]
        if problems:
            raise InvalidDocument("episode", problems)
        added = {name: sum(int(value) for value in values if value is not None) for name, values in counts.items()}
        if self.usage is not None:
            added = {name: getattr(self.usage, name) + count for name, count in added.items()}
        self.usage = Usage(**added)

    def discard(self, reason: str = "") -> None:
        """Write no episode for this run (module docstring: Failures); ``end()`` then refuses."""
        if self.episode is not None:
            raise RuntimeError(f"episode {self.episode_id} has already been written")
        self.discarded = reason or "discarded"

    # ------------------------------------------------------------------ ending

    def build(self, output: str) -> Episode:
        """The episode as it would be stored (validated: :class:`InvalidDocument`), without writing it."""
        capped = _truncate(_checked_text("output", output, required=True), MAX_TEXT_CHARS) or ""
        fields = self._fields(capped, list(self.steps), max(self.clock.now(), self.started_at))
        if capped != output:
            fields["truncated"].append("output")
        try:
            return Episode(**fields)  # validated and serialised once: the store writes its JSON
        except ValidationError as exc:
            invalid = invalid_from_pydantic("episode", exc)
            if not isinstance(invalid, DocumentTooLarge):
                raise invalid from None
        size = json_bytes(Episode.model_construct(**fields).model_dump(mode="json"))
        names = [f"steps.{f}" for f in _CUT_FIELDS]  # recorded in `truncated`: room for them too
        fields["steps"], cut = _fit_steps(fields["steps"], size - MAX_EPISODE_BYTES + json_bytes(names))
        fields["truncated"] = [*fields["truncated"], *(f"steps.{f}" for f in cut)]
        try:
            return Episode(**fields)
        except ValidationError as exc:
            raise invalid_from_pydantic("episode", exc) from None

    def _fields(self, output: str, steps: list[Step], ended_at: datetime) -> dict[str, Any]:
        """The episode's fields, unvalidated."""
        d = self.decision
        return {
            "id": self.episode_id,
            "agent_id": d.agent_id,
            "policy_version": d.version,
            "action_id": d.action_id,
            "probability": d.probability,
            "logprob": d.logprob,
            "input": self.input,
            "output": output,
            "instructions": self.instructions,
            "tool_definitions": self.tool_definitions,
            "steps": steps,
            "started_at": self.started_at,
            "ended_at": ended_at,
            "metadata": self.metadata,
            "truncated": list(self._truncated),
            "ttl": self.ttl,
            "context": dict(d.context) if isinstance(d.context, Mapping) else d.context,
            "usage": self.usage,
            "reward": self.reward,
            "incarnation": d.incarnation,
            "candidates": [c.model_dump() for c in d.candidates] if getattr(d, "candidates", None) else None,
        }

    def _own_reward(self, reward: float | None) -> None:
        """Keep ``reward`` (None keeps :attr:`reward`) if it is a number in [0, 1], else
        :class:`InvalidDocument` naming ``reward``; a bad one is not kept for a crash episode."""
        if reward is None:
            return
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not 0 <= reward <= 1:
            raise InvalidDocument("episode", [("reward", f"must be a number from 0 to 1, got {reward!r:.40}")])
        self.reward = float(reward)

    def _check_not_ended(self, what: str, name: object) -> None:
        """``RuntimeError`` once the episode is written: what is recorded now would never be stored."""
        if self.episode is not None:
            label = what if name is None else f"{what} {name!r:.80}"
            raise RuntimeError(f"episode {self.episode_id} has already ended; the {label} is not recorded")

    def _check_open(self) -> None:
        if self.episode is not None:
            raise RuntimeError(f"episode {self.episode_id} has already ended")
        if self.discarded is not None:
            raise RuntimeError(f"episode {self.episode_id} was discarded ({self.discarded}); nothing is written")

    def end(self, output: str, *, reward: float | None = None) -> Episode:
        """Finish the run and write the episode; returns the stored episode. ``output`` is the
        agent's answer, a string (``""`` for none: :class:`InvalidDocument` for ``None``);
        ``reward``, the agent's own reward in [0, 1], scores the episode without the judges."""
        self._check_open()
        self._own_reward(reward)
        episode = self.build(output)
        try:
            self.store.add_episode(episode)
        except BaseException as exc:
            self._write_error = exc
            raise
        self.episode = episode
        return episode

    async def aend(self, output: str, *, reward: float | None = None) -> Episode:
        """``end()`` for async agents: uses the store's async write if it has one."""
        self._check_open()
        self._own_reward(reward)
        episode = self.build(output)
        writer = getattr(self.store, "add_episode_async", None)
        try:
            if writer is not None:
                await writer(episode)
            else:
                await asyncio.to_thread(self.store.add_episode, episode)
        except BaseException as exc:
            self._write_error = exc
            raise
        self.episode = episode
        return episode

    def __enter__(self) -> EpisodeCapture:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and self._interrupted(exc):
            return
        if exc is not None and self._crashed(exc):
            try:
                self._record_crash(exc)
                self.end("")
            except Exception as failure:  # the agent's exception goes on, never this one
                _unrecorded(exc, f"episode {self.episode_id} was not written", failure)

    async def __aenter__(self) -> EpisodeCapture:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and self._interrupted(exc):
            return
        if exc is not None and self._crashed(exc):
            try:
                self._record_crash(exc)
                await self.aend("")
            except Exception as failure:
                _unrecorded(exc, f"episode {self.episode_id} was not written", failure)

    # ------------------------------------------------------------------ helpers

    def _interrupted(self, exc: BaseException) -> bool:
        """Whether ``exc`` stopped the run from outside (not an ``Exception``: ``KeyboardInterrupt``,
        ``SystemExit``, asyncio's cancellation): the run is then discarded, as it says nothing about
        the configuration drawn (a restart cancels every run in flight, whatever their configuration)."""
        if isinstance(exc, Exception) or self.episode is not None or self.discarded is not None:
            return False
        self.discarded = f"interrupted: {type(exc).__name__}"
        return True

    def _crashed(self, exc: BaseException) -> bool:
        """Whether leaving the block with ``exc`` is a crash to record: the run neither ended nor
        was discarded, and ``exc`` is not the failure of end()'s write (the store down, not the run)."""
        return self.episode is None and self.discarded is None and exc is not self._write_error

    def _record_crash(self, exc: BaseException) -> None:
        elapsed = max(0.0, (self.clock.now() - self.started_at).total_seconds() * 1000)  # a wall clock may step back
        if len(self.steps) >= MAX_STEPS:  # a run at the cap (a runaway loop) keeps why it ended over its last step
            self.steps.pop()
            self._note("steps")
        self.step("agent", kind="step", status="error", latency_ms=elapsed, error=f"{type(exc).__name__}: {exc}")

    def _cap(self, field: str, text: str | None, limit: int) -> str | None:
        """Truncate ``text`` and note the field, once."""
        capped = _truncate(_checked_text(field, text), limit)
        if capped != text:
            self._note(field)
        return capped

    def _fit_tools(self, definitions: Any) -> Any:
        """The leading ``definitions`` whose JSON fits :data:`MAX_TOOL_DEFINITIONS_CHARS` (the
        rest cut and noted); anything but a list of JSON objects is left to the episode's check."""
        if not isinstance(definitions, list) or not all(isinstance(d, dict) for d in definitions):
            return definitions
        try:
            sizes = [len(json.dumps(d, allow_nan=False, separators=(",", ":"))) for d in definitions]
        except (TypeError, ValueError, RecursionError):
            return definitions
        kept, size = 0, 1  # "[" + each definition and its "," or "]"
        while kept < len(sizes) and size + sizes[kept] + 1 <= MAX_TOOL_DEFINITIONS_CHARS:
            size += sizes[kept] + 1
            kept += 1
        if kept == len(definitions):
            return definitions
        self._note("tool_definitions")
        return definitions[:kept]

    def _note(self, name: str) -> None:
        """Record once that ``name`` was truncated."""
        if name not in self._truncated:
            self._truncated.append(name)


def _result_text(result: object) -> str:
    """A tool's result as the judges read it: a string as it is; a dict, list or number as JSON
    (``str`` would give Python's repr, ``{'k': 3}``); anything else as ``str``."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict | list | tuple | int | float | bool):
        try:
            return json.dumps(result, ensure_ascii=False, default=str, allow_nan=False)
        except (TypeError, ValueError):  # a key that is not a string, NaN, a cycle: as str
            pass
    return str(result)


def _checked_text(field: str, text: object, *, required: bool = False) -> str | None:
    """``text`` if it is a string (or None, unless ``required``); else :class:`InvalidDocument` naming ``field``."""
    if not isinstance(text, str) and (required or text is not None):
        raise InvalidDocument("episode", [(field, f"must be a string, got {type(text).__name__}")])
    return text


def _unrecorded(exc: BaseException, what: str, failure: Exception) -> None:
    """Say on the agent's exception ``exc`` (a note) and in the log that recording it failed."""
    message = f"agent_learning: {what}: {type(failure).__name__}: {failure}"
    exc.add_note(message)
    log.warning("%s (while %s propagated)", message, type(exc).__name__)


def _latency(value: object) -> tuple[float, str | None]:
    """``value`` as a latency in milliseconds, or 0 and why it is not one (no coercion from strings)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return 0.0, f"must be a number of milliseconds, got {type(value).__name__}"
    try:
        latency = float(value)
    except OverflowError:
        latency = math.inf
    if not math.isfinite(latency):
        return 0.0, f"must be a finite number, got {value!r:.40}"
    if latency < 0:
        return 0.0, f"must not be negative, got {value!r:.40}"
    return latency, None


def _json_arguments(arguments: object) -> tuple[int, str | None]:
    """The size of ``arguments`` as :func:`json_bytes` counts it, or why they are not a step's arguments."""
    if not isinstance(arguments, dict):
        return 0, f"must be an object (a dict), got {type(arguments).__name__}"
    if not all(isinstance(key, str) for key in arguments):
        return 0, "must have string keys"
    try:
        return len(json.dumps(arguments, allow_nan=False, separators=(",", ":"))), None
    except (TypeError, ValueError, RecursionError) as exc:
        return 0, f"must be JSON with finite numbers ({exc})"


def _truncate(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - len(_MARK)] + _MARK


_CUT_FIELDS = ("result", "arguments", "error")
"""The step fields cut to fit an episode under MAX_EPISODE_BYTES; names, statuses and latencies stay."""


def _fit_steps(steps: list[Step], excess: int) -> tuple[list[Step], list[str]]:
    """``steps`` with their longest texts cut to one common size so that they shrink by at
    least ``excess`` bytes (as :func:`json_bytes` counts), and which fields were cut.

    The common size is the largest that frees enough: every text longer than it is cut to it
    (or to its marker alone, for a size below that), every shorter text is kept whole.
    """
    sizes = [(i, f, json_bytes(getattr(s, f))) for i, s in enumerate(steps) for f in _CUT_FIELDS if getattr(s, f)]
    floors = {f: json_bytes(_shrink(f, "x", 0)) for f in _CUT_FIELDS}

    def freed(cap: int) -> int:
        return sum(size - max(cap, floors[f]) for _, f, size in sizes if size > max(cap, floors[f]))

    low, high = 0, max((size for *_, size in sizes), default=0)
    while low < high:  # the largest cap that frees at least `excess`
        mid = (low + high + 1) // 2
        low, high = (mid, high) if freed(mid) >= excess else (low, mid - 1)
    cuts: dict[int, dict[str, Any]] = {}
    for i, f, size in sizes:
        if size > max(low, floors[f]):
            cuts.setdefault(i, {})[f] = _shrink(f, getattr(steps[i], f), low)
    cut = sorted({f for update in cuts.values() for f in update}, key=_CUT_FIELDS.index)
    return [s.model_copy(update=cuts[i]) if i in cuts else s for i, s in enumerate(steps)], cut


def _shrink(field: str, value: Any, budget: int) -> Any:
    """``value`` (a step's text or arguments) cut so that it takes at most ``budget`` bytes as
    JSON, marked as truncated; never less than the marker (a failed step keeps an error text)."""
    if field == "arguments":
        return _shrink_arguments(value, budget)
    return _longest_prefix(value, lambda prefix: prefix + _MARK, budget)


def _shrink_arguments(arguments: Any, budget: int) -> dict[str, str]:
    """Arguments too large to keep, as ``{"truncated": <the start of their JSON>}``."""
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str)
    return _longest_prefix(text, lambda prefix: {"truncated": prefix + _MARK}, budget)


def _longest_prefix(text: str, wrap: Callable[[str], Any], budget: int) -> Any:
    """``wrap`` of the longest prefix of ``text`` that fits ``budget`` (``wrap("")`` at least)."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if json_bytes(wrap(text[:mid])) <= budget else (low, mid - 1)
    return wrap(text[:low])
