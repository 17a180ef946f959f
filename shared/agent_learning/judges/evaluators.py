"""The azure-ai-evaluation judge: IntentResolution, TaskAdherence and TaskCompletion, bounded.

The three evaluators run concurrently in one event loop. Each gets its own bounded retry loop
and the episode one overall deadline, because the evaluators' own behaviour is dangerous in a
queue consumer: up to 11 attempts with waits up to 60 s and 600 s per attempt (about two hours
for one call), out-of-range scores accepted as a pass, a bare ``JSONDecodeError`` on a
malformed reply, ``TypeError`` on a null score. So this adapter:

* sets each evaluator's per-attempt timeout (``attempt_timeout``) and turns its internal retry
  loop off (``max_retries=0`` on its prompty flow), then retries itself: at most
  ``max_attempts`` per evaluator, exponential backoff with jitter, ``Retry-After`` honoured up
  to ``retry_after_cap``;
* runs each evaluator through its async entry point under ``asyncio.wait_for``, so a deadline
  cancels the in-flight HTTP request instead of leaving a thread behind;
* validates every output (:func:`~agent_learning.judges.base.metric_from_output`): type,
  finiteness, scale, result status;
* with a token budget (``tokens_per_minute`` > 0), books every call's admission cost before
  sending it and waits for its turn (:mod:`~agent_learning.judges.budget`); a turn later than
  the deadline fails the episode transiently without a request;
* classifies failures: throttling (429), server errors (5xx), timeouts and connection errors
  are transient (the message is redelivered later); invalid output after every attempt and
  content-filtered requests and replies are permanent (dead letter). Authentication, permission and
  not-found errors and an account out of quota (429 ``insufficient_quota``) are configuration
  problems (:class:`JudgeMisconfigured`): not retried within the judgement, but transient, so a
  message is redelivered (up to the queue's max deliveries, which come quickly: then it is
  dead-lettered ``MaxDeliveryCountExceeded``, and ``agent-learn dlq replay`` sends it back once
  the configuration is fixed) rather than dead-lettered at its first failure.

A failed evaluator never becomes a zero metric: the whole judgement fails, and the evaluators
still running are cancelled (their calls would be wasted). An episode with an
empty output is not sent: the evaluators' prompts tell the model to skip it (no score), so it
gets the offline judge's scores for an empty answer (1 / 0 / 0, evaluator ``offline:<metric>``).

``azure.ai.evaluation`` (1.1–1.5 s and 150 MiB to import here) is imported when this judge is
built, never at Functions start-up or on the agent side. The evaluator objects are built once
and reused for every episode, on one event loop per judge with long-lived HTTP clients
(:mod:`~agent_learning.judges.loop`, :mod:`~agent_learning.judges.prompty`), each sending the
completion limit of :class:`JudgeTokens`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agent_learning.core.errors import ConfigurationError, PermanentError, TransientError
from agent_learning.core.telemetry import SPAN_EVALUATOR, span
from agent_learning.documents import MAX_NAME_CHARS, Episode, JudgeInfo, MetricScore
from agent_learning.judges import prompty
from agent_learning.judges.base import InvalidJudgeOutput, Judge, Judgement, metric_from_output
from agent_learning.judges.budget import PromptEstimate, Reservation, TokenBudget
from agent_learning.judges.loop import LoopThread
from agent_learning.judges.metrics import INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION
from agent_learning.judges.offline import OfflineJudge

log = logging.getLogger(__name__)

DEADLINE_GRACE = 2.0
"""Seconds past ``episode_deadline`` a caller of :meth:`EvaluatorJudge.judge` waits before giving
up on a judgement whose loop did not get to enforce the deadline itself."""
TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
CONFIGURATION_STATUS = frozenset({401, 403, 404})


class JudgeMisconfigured(TransientError):
    """The judge model refused a call for a reason only its configuration can fix (a key, a role,
    a deployment, an account out of quota): not retried within the judgement, but transient, so
    the message is redelivered, up to the queue's max deliveries (see the module docstring)."""


@dataclass(frozen=True)
class JudgeLimits:
    """Time bounds of one judgement. Every call finishes within ``episode_deadline``."""

    attempt_timeout: float = 60.0
    """Seconds one HTTP attempt of an evaluator may take."""
    evaluator_deadline: float = 150.0
    """Seconds one evaluator may take, retries included."""
    episode_deadline: float = 180.0
    """Seconds the judgement of one episode may take."""
    max_attempts: int = 4
    """Attempts per evaluator before the judgement fails transiently."""
    backoff_base: float = 1.0
    """First retry delay in seconds (doubling, with jitter)."""
    backoff_max: float = 20.0
    """Longest retry delay in seconds."""
    retry_after_cap: float = 30.0
    """Longest wait a server's Retry-After may ask for, in seconds."""

    def __post_init__(self) -> None:
        for name in ("attempt_timeout", "evaluator_deadline", "episode_deadline", "backoff_max", "retry_after_cap"):
            value = getattr(self, name)
            if not 0 < value < math.inf:  # a deadline that never comes bounds nothing
                raise ValueError(f"judge limit {name} must be a finite number of seconds > 0, got {value!r}")
        if self.max_attempts < 1 or not 0 <= self.backoff_base < math.inf:
            raise ValueError("judge limits need max_attempts >= 1 and a finite backoff_base >= 0")


@dataclass(frozen=True)
class JudgeTokens:
    """Tokens of the judge calls: each evaluator's completion limit, and this process's budget.

    Azure OpenAI admits a request against its tokens-per-minute limit by prompt tokens plus the
    completion limit (``max_tokens``), so the limits below are sized to what each evaluator's reply
    needs rather than left at the evaluators' own (800, 3,000, 1,500): see
    ``docs/judges-and-rewards.md#judge-tokens`` for the measurement (``benchmarks/judge_tokens.py``).
    A reply cut off at its limit is invalid output: retried, then dead-lettered, never a score.
    """

    max_tokens_intent_resolution: int = 200
    """Most tokens intent resolution's reply may have (the max_tokens it sends; the longest reply
    its output format allows is 95)."""
    max_tokens_task_adherence: int = 400
    """Most tokens task adherence's reply may have (the max_completion_tokens it sends; 172 for a
    150-word reason)."""
    max_tokens_task_completion: int = 700
    """Most tokens task completion's reply may have (the max_tokens it sends; the longest reply its
    output format allows is 334)."""
    tokens_per_minute: int = 0
    """Tokens a minute this process lets the judge deployment admit, counted as Azure OpenAI counts
    them (prompt + max_tokens per call); 0: unpaced. Divide the deployment's limit among the
    processes that score (docs/judges-and-rewards.md#judge-tokens)."""

    def __post_init__(self) -> None:
        for metric in (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION):
            if self.max_tokens(metric) < 1:
                raise ValueError(f"judge max_tokens_{metric} must be >= 1")
        if self.tokens_per_minute < 0:
            raise ValueError("judge tokens_per_minute must be >= 0 (0: unpaced)")

    def max_tokens(self, metric: str) -> int:
        """The completion limit of ``metric``'s evaluator."""
        return int(getattr(self, f"max_tokens_{metric}"))


@dataclass(frozen=True)
class JudgeModel:
    """Where the judge model is: Azure OpenAI (``azure_endpoint`` + ``deployment``) or any
    OpenAI-compatible server (``base_url`` + ``model``: Foundry Local, Ollama, vLLM, ...).

    Azure OpenAI authenticates with ``api_key`` or, without one, with Entra ID
    (``DefaultAzureCredential``; ``client_id`` selects a user-assigned managed identity).
    """

    azure_endpoint: str | None = None
    deployment: str | None = None
    api_version: str = "2024-10-21"
    """The Azure OpenAI API version."""
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)  # a secret: never in logs or tracebacks
    client_id: str | None = None

    def __post_init__(self) -> None:
        azure = bool(self.azure_endpoint or self.deployment)
        openai = bool(self.base_url or self.model)
        if azure == openai:
            raise ConfigurationError(
                "judge model: set either AGENT_LEARNING_JUDGE_AZURE_ENDPOINT and AGENT_LEARNING_JUDGE_DEPLOYMENT "
                "(Azure OpenAI) or AGENT_LEARNING_JUDGE_BASE_URL and AGENT_LEARNING_JUDGE_MODEL (OpenAI-compatible)"
            )
        if azure and not (self.azure_endpoint and self.deployment):
            raise ConfigurationError(
                "judge model: Azure OpenAI needs both AGENT_LEARNING_JUDGE_AZURE_ENDPOINT and "
                "AGENT_LEARNING_JUDGE_DEPLOYMENT"
            )
        if openai and not (self.base_url and self.model):
            raise ConfigurationError(
                "judge model: an OpenAI-compatible endpoint needs both "
                "AGENT_LEARNING_JUDGE_BASE_URL and AGENT_LEARNING_JUDGE_MODEL"
            )
        # A URL the client cannot use fails every call as a connection error, retried forever: refuse it now.
        for setting, url in (("AZURE_ENDPOINT", self.azure_endpoint), ("BASE_URL", self.base_url)):
            if url and not _is_http_url(url):
                raise ConfigurationError(
                    f"judge model: AGENT_LEARNING_JUDGE_{setting} must be an http:// or https:// URL with a host "
                    f"(e.g. https://<resource>.openai.azure.com), got {url!r:.100}"
                )

    @property
    def name(self) -> str:
        return str(self.deployment or self.model)

    def model_config(self) -> dict[str, Any]:
        """The ``model_config`` dict the evaluators take."""
        if self.azure_endpoint:
            config: dict[str, Any] = {
                "type": "azure_openai",
                "azure_endpoint": self.azure_endpoint,
                "azure_deployment": self.deployment,
                "api_version": self.api_version,
            }
        else:
            config = {"type": "openai", "base_url": self.base_url, "model": self.model}
            config["api_key"] = self.api_key or "unused"  # local servers ignore it; the client requires one
        if self.api_key:
            config["api_key"] = self.api_key
        return config

    def credential(self) -> Any:
        """An Entra ID credential for Azure OpenAI without a key, else ``None``."""
        if not self.azure_endpoint or self.api_key:
            return None
        from azure.identity import DefaultAzureCredential  # lazy: only without an API key

        return DefaultAzureCredential(managed_identity_client_id=self.client_id)


def _is_http_url(url: str) -> bool:
    """Whether ``url`` is an absolute http(s) URL with a host and no surrounding whitespace."""
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and url == url.strip()
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False


def _evaluator_classes() -> dict[str, type]:
    """The three evaluator classes; raises a clear error if a version moved them."""
    try:
        from azure.ai.evaluation import IntentResolutionEvaluator, TaskAdherenceEvaluator  # lazy: seconds to import
    except ImportError as exc:
        raise ConfigurationError(
            "AGENT_LEARNING_JUDGE=evaluators needs azure-ai-evaluation 1.18 "
            f"(pip install 'agent-learning[judges]'): {exc}"
        ) from exc
    try:
        from azure.ai.evaluation._evaluators._task_completion import _TaskCompletionEvaluator
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise ConfigurationError(
            "azure-ai-evaluation no longer provides _TaskCompletionEvaluator where this version expects it "
            f"(azure.ai.evaluation._evaluators._task_completion): {exc}; pin azure-ai-evaluation 1.18"
        ) from exc
    return {
        INTENT_RESOLUTION: IntentResolutionEvaluator,
        TASK_ADHERENCE: TaskAdherenceEvaluator,
        TASK_COMPLETION: _TaskCompletionEvaluator,
    }


class EvaluatorJudge(Judge):
    """Judges episodes with azure-ai-evaluation's three agent evaluators; see the module docstring."""

    def __init__(
        self,
        model: JudgeModel,
        limits: JudgeLimits | None = None,
        *,
        tokens: JudgeTokens | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``sleep`` (backoffs and budget waits) and ``clock`` (the budget's monotonic seconds)
        are injectable for tests."""
        from importlib.metadata import version  # lazy: only to name the judge

        self.model = model
        self.limits = limits or JudgeLimits()
        self.tokens = tokens or JudgeTokens()
        self.budget: TokenBudget | None = None
        """The token budget calls are booked in (None: unpaced)."""
        if self.tokens.tokens_per_minute:
            self.budget = TokenBudget(self.tokens.tokens_per_minute, **({"clock": clock} if clock else {}))
        self._sleep = sleep or asyncio.sleep
        classes = _evaluator_classes()  # first: without the package, its clear error, not version()'s
        self.package_version = version("azure-ai-evaluation")
        self.info = JudgeInfo(name=f"azure-ai-evaluation {self.package_version}", model=model.name)
        credential = model.credential()
        self._runner = LoopThread("agent-learning-judge")
        self._clients = prompty.ClientPool(lambda: self._runner.current)
        self.evaluators: dict[str, Any] = {}
        self.retry_loop_disabled: dict[str, bool] = {}
        self.shared_clients: dict[str, bool] = {}
        self.max_tokens: dict[str, int | None] = {}
        """The completion limit each evaluator sends (None: not readable in this version)."""
        for metric, cls in classes.items():
            config = model.model_config()  # a fresh dict each: the evaluators write into it
            evaluator = cls(config, credential=credential) if credential is not None else cls(config)
            evaluator._LLM_CALL_TIMEOUT = self.limits.attempt_timeout  # seconds per HTTP attempt
            self.retry_loop_disabled[metric] = _disable_internal_retries(evaluator, metric)
            prompty.set_completion_limit(evaluator, self.tokens.max_tokens(metric))
            self.max_tokens[metric] = prompty.completion_limit(evaluator)
            self.shared_clients[metric] = prompty.install(evaluator, self._clients, metric)
            self.evaluators[metric] = evaluator
        # Prompt estimates for the budget: the template, or ~9,000 characters (the 1.18 ones' size).
        self.prompt_estimates = {
            m: PromptEstimate(prompty.template_chars(e) or 9_000) for m, e in self.evaluators.items()
        }
        self.stats_lock = threading.Lock()
        self.attempts: dict[str, int] = dict.fromkeys(self.evaluators, 0)

    # ------------------------------------------------------------------ the port

    def judge(self, episode: Episode) -> Judgement:
        """Judge on the judge's own event loop (one for its lifetime, whatever thread calls).

        The caller waits at most ``episode_deadline`` + :data:`DEADLINE_GRACE`, even when something
        synchronous blocks the loop (an Entra ID token fetched with a synchronous credential)."""
        timeout = self.limits.episode_deadline + DEADLINE_GRACE
        try:
            return self._runner.run(self.judge_async(episode), timeout=timeout)
        except TimeoutError as exc:
            raise TransientError(
                f"judge unavailable: no judgement within AGENT_LEARNING_JUDGE_EPISODE_DEADLINE "
                f"({self.limits.episode_deadline:g} s); its event loop was blocked ({exc})"
            ) from None

    def close(self) -> None:
        """Close the judge's HTTP clients and stop its event loop."""
        self._runner.close(self._clients.aclose)

    async def judge_async(self, episode: Episode) -> Judgement:
        """All three metrics, concurrently, within ``episode_deadline``. On an event loop other
        than the judge's own, the evaluators build a client per call."""
        if not episode.output.strip():
            # The evaluators' prompts have the model skip an empty answer (no score, "not applicable"),
            # which would dead-letter every crashed run: an empty answer resolves, adheres to and
            # completes nothing, so it gets the offline rules' 1 / 0 / 0 without a model call.
            return Judgement(OfflineJudge().judge(episode).metrics, self.info)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.episode_deadline
        first = self._book_episode(episode, min(deadline, loop.time() + self.limits.evaluator_deadline))
        tasks = {
            m: asyncio.ensure_future(self._metric(m, episode, deadline, first.get(m))) for m in self.evaluators
        }
        pending = set(tasks.values())
        try:
            while pending:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                if pending and any(not t.cancelled() and t.exception() for t in tasks.values() if t.done()):
                    # One evaluator failed for good, so the judgement fails whatever the others say:
                    # stop them rather than spend their tokens and retries on it.
                    for t in pending:
                        t.cancel()
                    await asyncio.wait(pending)
                    break
        except asyncio.CancelledError:  # the caller gave up on the judgement: its evaluators stop too
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending)
            raise
        errors = {m: t.exception() for m, t in tasks.items() if not t.cancelled() and t.exception() is not None}
        if errors:
            permanent = {m: e for m, e in errors.items() if isinstance(e, PermanentError)}
            chosen = permanent or errors
            detail = "; ".join(f"{m}: {e}" for m, e in chosen.items())
            if permanent:
                raise PermanentError(f"judge failed permanently: {detail}")
            if all(isinstance(e, TransientError) for e in errors.values()):
                raise TransientError(f"judge unavailable: {detail}")
            raise TransientError(f"judge failed unexpectedly: {detail}")
        results = {m: t.result() for m, t in tasks.items()}
        return Judgement({m: score for m, (score, _) in results.items()},
                         self._served_by(served for _, served in results.values()))

    def _served_by(self, served: Iterable[str]) -> JudgeInfo:
        """The judge, naming the model that answered when it is not the configured name: an Azure
        OpenAI deployment's name stays when its model version changes (automatic upgrades), and
        the reply's ``model`` tells them apart (``judge (gpt-4o-2024-11-20)``)."""
        models = sorted({m for m in served if m and m != self.info.model})
        if not models:
            return self.info
        return self.info.model_copy(update={"model": f"{self.info.model} ({', '.join(models)})"[:MAX_NAME_CHARS]})

    # ------------------------------------------------------------------ one metric

    async def _metric(
        self, metric: str, episode: Episode, episode_deadline: float, first: Booking | None
    ) -> tuple[MetricScore, str]:
        """One metric's score, and the model the judge's reply names (empty if none)."""
        name = type(self.evaluators[metric]).__name__
        with span(SPAN_EVALUATOR, {"metric": metric, "evaluator": name}) as sp:
            return await self._attempts(metric, episode, episode_deadline, sp, first)

    async def _attempts(
        self, metric: str, episode: Episode, episode_deadline: float, sp: Any, first: Booking | None = None
    ) -> tuple[MetricScore, str]:
        """Up to ``max_attempts`` calls of one evaluator; ``first`` is the first call's booking in
        the token budget (later calls book their own)."""
        lim = self.limits
        loop = asyncio.get_running_loop()
        deadline = min(episode_deadline, loop.time() + lim.evaluator_deadline)
        evaluator = self.evaluators[metric]
        name = type(evaluator).__name__
        last: Exception | None = None
        made = 0  # attempts sent; fewer than max_attempts when the deadline leaves no room for a retry
        for attempt in range(1, lim.max_attempts + 1):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            inputs = evaluator_input(episode)  # fresh per attempt: the evaluators may rewrite message lists
            booked = first if attempt == 1 else self._book(metric, _chars(inputs), deadline)
            if isinstance(booked, TransientError):
                last = booked
                break
            if booked is not None:
                wait = self.budget.wait(booked[0])  # type: ignore[union-attr]
                sp.set_attribute("budget_wait_seconds", round(wait, 3))
                if wait > 0:
                    try:
                        await self._sleep(wait)
                    except asyncio.CancelledError:  # another evaluator failed: this call is never sent
                        self.budget.release(booked[0])  # type: ignore[union-attr]
                        raise
            remaining = deadline - loop.time()
            with self.stats_lock:
                self.attempts[metric] += 1
            made = attempt
            sp.set_attribute("attempts", attempt)
            retry_after: float | None = None
            try:
                output = await asyncio.wait_for(_call(evaluator, inputs), timeout=remaining)
                check_complete(metric, output, name)
                check_raw_score(metric, output, name)
                score = metric_from_output(metric, output, name, f"azure-ai-evaluation {self.package_version}")
                self._settle(metric, booked, score)
                properties = output.get(f"{metric}_properties")
                served = properties.get("model") if isinstance(properties, Mapping) else None
                return score, served if isinstance(served, str) else ""
            except TimeoutError:
                if deadline < episode_deadline:
                    setting, seconds = "EVALUATOR_DEADLINE", lim.evaluator_deadline
                else:
                    setting, seconds = "EPISODE_DEADLINE", lim.episode_deadline
                last = TransientError(
                    f"{name} gave no answer within AGENT_LEARNING_JUDGE_{setting} ({seconds:g} s)"
                )
                break
            except InvalidJudgeOutput as exc:
                last = exc
            except PermanentError:
                raise  # classified where it was raised (a reply the content filter withheld)
            except Exception as exc:
                last, retry_after = classify(exc, name)
                if isinstance(last, PermanentError) and not isinstance(last, InvalidJudgeOutput):
                    raise last from exc  # e.g. content filtered: retrying cannot help
                if isinstance(last, JudgeMisconfigured):
                    break  # retrying in seconds cannot fix a key, a role, a deployment or a quota
            if attempt == lim.max_attempts:
                break
            delay = _backoff(attempt, lim, retry_after)
            if loop.time() + delay >= deadline:
                break
            log.warning(
                "%s attempt %d/%d failed (%s); retrying in %.1f s", name, attempt, lim.max_attempts, last, delay
            )
            await self._sleep(delay)
        if isinstance(last, InvalidJudgeOutput):
            raise PermanentError(f"{last} (still invalid after {made} of {lim.max_attempts} attempts)")
        raise last or TransientError(f"{name}: no attempt fitted in the deadline")

    # ------------------------------------------------------------------ the token budget

    def _cost(self, metric: str, chars: int) -> int:
        """A call's admission cost as Azure OpenAI counts it: estimated prompt tokens + max_tokens."""
        limit = self.max_tokens[metric] or self.tokens.max_tokens(metric)
        return self.prompt_estimates[metric].tokens(chars) + limit

    def _book_episode(self, episode: Episode, deadline: float) -> dict[str, Booking]:
        """Book the first call of every evaluator together, or none: when the last of them would
        start after ``deadline``, raise TransientError before any is sent (no tokens spent on a
        judgement that cannot finish). Empty when unpaced."""
        if self.budget is None:
            return {}
        chars = _chars(evaluator_input(episode))
        costs = {m: self._cost(m, chars) for m in self.evaluators}
        max_wait = deadline - asyncio.get_running_loop().time()
        reservations = self.budget.reserve_all(list(costs.values()), max_wait)
        if reservations is None and TokenBudget(self.budget.tokens_per_minute, clock=lambda: 0.0).reserve_all(
            list(costs.values()), max_wait
        ) is None:  # not even into an idle budget: waiting cannot help, the setting must change
            raise TransientError(
                f"judge token budget: this episode's {len(costs)} calls ({sum(costs.values())} tokens) cannot all "
                f"start before its deadline even with nothing else booked: AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE="
                f"{self.budget.tokens_per_minute} is too small for it (tokens a minute, not thousands as in a "
                "deployment's capacity)"
            )
        if reservations is None:
            raise TransientError(
                f"judge token budget: no room for this episode's {len(costs)} calls ({sum(costs.values())} tokens) "
                f"before its deadline at {self.budget.tokens_per_minute} tokens a minute; try again later"
            )
        return {m: (r, chars) for m, r in zip(costs, reservations, strict=True)}

    def _book(self, metric: str, chars: int, deadline: float) -> Booking | TransientError | None:
        """Book one more call of ``metric`` (a retry); ``None`` when unpaced, or the TransientError
        to fail with when its turn comes after ``deadline``."""
        if self.budget is None:
            return None
        cost = self._cost(metric, chars)
        reservation = self.budget.reserve(cost, max_wait=deadline - asyncio.get_running_loop().time())
        if reservation is None:
            return TransientError(
                f"{type(self.evaluators[metric]).__name__}: judge token budget: no room for a {cost}-token call "
                f"before the deadline at {self.budget.tokens_per_minute} tokens a minute"
            )
        return reservation, chars

    def _settle(self, metric: str, booked: Booking | None, score: MetricScore) -> None:
        """Correct a call's reservation with the prompt tokens the evaluator reported."""
        if self.budget is None or booked is None or not score.prompt_tokens:
            return
        reservation, chars = booked
        self.prompt_estimates[metric].observe(chars, score.prompt_tokens)
        limit = self.max_tokens[metric] or self.tokens.max_tokens(metric)
        self.budget.settle(reservation, score.prompt_tokens + limit)


# --------------------------------------------------------------------------- helpers


Booking = tuple[Reservation, int]
"""A call's reservation in the token budget and its inputs' size in characters."""


def _chars(inputs: Mapping[str, Any]) -> int:
    """The size of an evaluator's inputs, which its prompt estimate grows with."""
    return len(json.dumps(inputs, default=str))


def evaluator_inputs(episode: Episode) -> dict[str, dict[str, Any]]:
    """The keyword arguments of each evaluator for one episode (see :func:`evaluator_input`)."""
    return {metric: evaluator_input(episode) for metric in (INTENT_RESOLUTION, TASK_ADHERENCE, TASK_COMPLETION)}


def evaluator_input(episode: Episode) -> dict[str, Any]:
    """The keyword arguments of an evaluator for one episode, built anew on each call (the three
    evaluators take the same ones).

    ``query`` is the conversation up to the user's request (with the agent's instructions as
    a system message); ``response`` is the agent's side as messages: tool calls, their
    results and the final answer, in the format the evaluators accept.

    The episode's ``tool_definitions`` are not passed: azure-ai-evaluation 1.18's evaluators
    never send them to the model, but they validate them, and definitions in OpenAI's own
    ``{"type": "function", "function": {...}}`` form or without ``parameters`` failed every call.
    """
    query: list[dict[str, Any]] = []
    if episode.instructions:
        query.append({"role": "system", "content": episode.instructions})
    query.append({"role": "user", "content": [{"type": "text", "text": episode.input}]})

    response: list[dict[str, Any]] = []
    for i, step in enumerate(episode.steps):
        if step.kind != "tool":
            continue
        call_id = step.call_id or f"call_{i}"
        response.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_call",
                        "tool_call_id": call_id,
                        "name": step.name,
                        "arguments": dict(step.arguments or {}),
                    }
                ],
            }
        )
        result = step.result if step.status == "ok" else f"error: {step.error}"
        response.append(
            {"role": "tool", "tool_call_id": call_id, "content": [{"type": "tool_result", "tool_result": result or ""}]}
        )
    response.append({"role": "assistant", "content": [{"type": "text", "text": episode.output}]})

    return {"query": query, "response": response}


def classify(exc: BaseException, evaluator: str) -> tuple[Exception, float | None]:
    """Map an evaluator exception to Transient/Permanent/InvalidJudgeOutput (+ Retry-After)."""
    cause = _openai_error(exc)
    if isinstance(exc, (json.JSONDecodeError, TypeError, KeyError)) or (cause is None and isinstance(exc, ValueError)):
        return InvalidJudgeOutput(
            f"{evaluator}: the judge model's reply is not a valid evaluation ({type(exc).__name__}: {exc})"
        ), None
    if cause is not None:
        status = getattr(cause, "status_code", None)
        if status is None:  # connection error or timeout
            return TransientError(f"{evaluator}: {type(cause).__name__}: {cause}"), None
        body = str(getattr(cause, "body", "") or cause)
        if status == 400 and "content_filter" in body:
            return PermanentError(f"{evaluator}: the judge model's content filter rejected the episode"), None
        if status == 429 and "insufficient_quota" in (getattr(cause, "code", None), getattr(cause, "type", None)):
            return JudgeMisconfigured(
                f"{evaluator}: HTTP 429 insufficient_quota: the judge model's account is out of quota (billing, "
                f"not throttling): check the judge configuration ({_server_message(cause)})"
            ), None
        if status in TRANSIENT_STATUS:
            return TransientError(f"{evaluator}: HTTP {status}: {_server_message(cause)}"), _retry_after(cause)
        if status in CONFIGURATION_STATUS:
            return JudgeMisconfigured(
                f"{evaluator}: HTTP {status}: check the judge configuration ({_server_message(cause)})"
            ), None
        return PermanentError(f"{evaluator}: HTTP {status}: {_server_message(cause)}"), None
    if isinstance(exc, (ConnectionError, OSError)):
        return TransientError(f"{evaluator}: {type(exc).__name__}: {exc}"), None
    if any(c.__name__ == "EvaluationException" for c in type(exc).__mro__):
        # Raised by the evaluator on a reply it cannot use (e.g. "Invalid score value: 7").
        return InvalidJudgeOutput(f"{evaluator}: {exc}"), None
    message = str(exc)
    if "could not" in message.lower() or "parse" in message.lower():
        return InvalidJudgeOutput(f"{evaluator}: {message}"), None
    return TransientError(f"{evaluator}: unexpected {type(exc).__name__}: {message}"), None


SERVER_MESSAGE_CHARS = 300
"""How much of a judge server's own error message a transient error carries into logs and dead letters."""


def _server_message(cause: Any) -> str:
    """The error message the judge's server sent (Azure OpenAI's says e.g. "exceeded token rate
    limit ... retry after 6 seconds"), else the exception's text, cut to SERVER_MESSAGE_CHARS."""
    body = getattr(cause, "body", None)
    message = body.get("message") if isinstance(body, Mapping) else None
    return (message if isinstance(message, str) and message else str(cause))[:SERVER_MESSAGE_CHARS]


def check_complete(metric: str, output: Mapping[str, Any], evaluator: str) -> None:
    """Reject a reply the judge model stopped at its completion limit (``finish_reason: "length"``).

    Cut-off JSON already fails to parse; this catches the rest (a complete object followed by
    whitespace until the limit, a known failure of JSON mode), so no score ever comes from a
    reply the model did not finish.
    """
    props = output.get(f"{metric}_properties")
    if isinstance(props, Mapping) and props.get("finish_reason") == "length":
        raise InvalidJudgeOutput(prompty.cut_off_message(evaluator, metric))


def check_raw_score(metric: str, output: Mapping[str, Any], evaluator: str) -> None:
    """Reject an output whose score the judge model never gave.

    Task adherence and task completion report a reply without a score as 0.0 ("fail"),
    indistinguishable from a real 0. Their ``<metric>_properties.sample_output`` holds the
    model's raw reply: when it can be read, its ``score`` must be a finite number (or a quoted
    one, which the evaluators read as that number) equal to the reported one.
    """
    props = output.get(f"{metric}_properties")
    sample = props.get("sample_output") if isinstance(props, Mapping) else None
    if not isinstance(sample, str):
        return
    try:
        messages = json.loads(sample)
        content = messages[-1]["content"] if isinstance(messages, list) else None
        reply = json.loads(content) if isinstance(content, str) else None
    except (ValueError, KeyError, IndexError, TypeError):
        return  # not readable: nothing to cross-check
    if not isinstance(reply, Mapping):
        return
    raw = reply.get("score")
    try:
        said = math.nan if isinstance(raw, bool) else float(raw)  # "4" is read as 4 by the evaluators too
    except (TypeError, ValueError):
        said = math.nan
    if not math.isfinite(said):
        raise InvalidJudgeOutput(
            f"{evaluator}: the judge model's reply has no numeric score ({raw!r}); "
            f"the evaluator reported {output.get(metric)!r}"
        )
    reported = output.get(metric)
    if isinstance(reported, (int, float)) and abs(said - float(reported)) > 1e-9:
        raise InvalidJudgeOutput(f"{evaluator}: reported {reported!r} but the judge model said {raw!r}")


def _openai_error(exc: BaseException) -> BaseException | None:
    """The OpenAI SDK error behind an evaluator exception, if any."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if type(current).__module__.startswith("openai"):
            return current
        current = current.__cause__ or getattr(current, "inner_exception", None) or current.__context__
        seen += 1
    return None


def _retry_after(error: BaseException) -> float | None:
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("Retry-After", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


def _backoff(attempt: int, limits: JudgeLimits, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, limits.retry_after_cap)
    return min(limits.backoff_max, limits.backoff_base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


def _disable_internal_retries(evaluator: Any, metric: str) -> bool:
    """Turn the evaluator's own retry loop (10 retries, waits up to 60 s) off, and refuse a reply
    the model did not finish as the shared clients do (:func:`prompty.check_finish`); True if done."""
    name = type(evaluator).__name__
    try:
        flow = evaluator._flow
        send = flow._send_with_retries
    except (AttributeError, RuntimeError):
        log.warning("%s: cannot reach the evaluator's retry loop; relying on deadlines alone", name)
        return False

    async def send_once(*args: Any, **kwargs: Any) -> Any:
        response = await send(*args, **{**kwargs, "max_retries": 0})
        prompty.check_finish(response, name, metric)
        return response

    flow._send_with_retries = send_once
    return True


async def _call(evaluator: Any, kwargs: dict[str, Any]) -> Mapping[str, Any]:
    """Run an evaluator on the current loop (cancellable); fall back to a worker thread."""
    entry = getattr(evaluator, "_async_evaluator", None)
    if entry is None and hasattr(evaluator, "_to_async"):
        entry = evaluator._to_async()
    if entry is not None:
        return await entry(**kwargs)
    return await asyncio.to_thread(evaluator, **kwargs)  # pragma: no cover - other versions

