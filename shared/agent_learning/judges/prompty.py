"""Long-lived judge clients for azure-ai-evaluation's prompty flows, and their completion limits.

azure-ai-evaluation 1.18's prompty flow (``AsyncPrompty.__call__``) does, on every evaluator call:
build a new ``AsyncOpenAI``/``AsyncAzureOpenAI`` client (which creates an SSL context and loads
the CA bundle: ~31 ms of CPU each, two thirds of the adapter's CPU per episode), compile its
Jinja template again (~1–3 ms), and send ``Connection: close`` so that no connection outlives the
call. :class:`SharedClientFlow` takes the flow's place through the evaluators' ``_flow`` property
(which has a setter) and does the same request with:

* one HTTP connection pool per judge, shared by one OpenAI client per evaluator, all living on
  the judge's one event loop (so ``Connection: close``, there to avoid pooled connections
  outliving a closed loop, is dropped and connections are kept alive);
* the template compiled once;
* the request sent with the client's ``post`` (documented for endpoints the SDK does not type),
  which skips ``chat.completions.create``'s transform of the parameters: a no-op for these plain
  JSON ones, and a third of the SDK's CPU per request.

Everything else is the flow's own code: its input resolution, chat parsing, request parameters
and reply formatting (``format_llm_response``), so the evaluators see the same output dict.
An OpenAI error is raised wrapped as the stock flow wraps it.

This leans on private parts of azure-ai-evaluation. :func:`install` checks each of them and
that the fast path renders exactly the messages the stock flow renders; if anything moved it
logs once and leaves the stock flow in place (slower, same results). Outside the judge's own
event loop the stock flow runs too.

:func:`set_completion_limit` sets the ``max_tokens`` (or ``max_completion_tokens``) a flow sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_learning.core.errors import PermanentError
from agent_learning.judges.base import InvalidJudgeOutput

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 24
"""Connections a judge keeps to the judge model: three calls for each of the 8 messages the
Functions host scores at once (host.json ``maxConcurrentCalls``). More calls than that wait for a
connection; more idle connections cost CPU on every request, as the HTTP pool checks each one
(at 96, the pool's bookkeeping doubled the CPU per episode)."""

COMPLETION_LIMIT_KEYS = ("max_tokens", "max_completion_tokens")
"""The request parameters that cap a reply's tokens (the prompty files use one or the other)."""

_warned: set[str] = set()


def cut_off_message(evaluator: str, metric: str) -> str:
    """Why a reply stopped at its completion limit is not a judgement, naming the setting to raise."""
    return (
        f"{evaluator}: the judge model's reply was cut off at its completion limit "
        f"(finish_reason 'length'); raise AGENT_LEARNING_JUDGE_MAX_TOKENS_{metric.upper()} if this recurs"
    )


def check_finish(response: Any, evaluator: str, metric: str) -> None:
    """Refuse a reply the judge model did not finish: cut off at its completion limit (invalid
    output) or withheld by the content filter (permanent, as a filtered request: there is no reply
    to parse, and its JSON would fail as a TypeError)."""
    choices = getattr(response, "choices", None)
    finish = getattr(choices[0], "finish_reason", None) if choices else None
    if finish == "length":
        raise InvalidJudgeOutput(cut_off_message(evaluator, metric))
    if finish == "content_filter":
        raise PermanentError(f"{evaluator}: the judge model's content filter withheld its reply")


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


@dataclass(frozen=True)
class _Parts:
    """The private pieces of azure-ai-evaluation the fast path uses."""

    env: Any  # the flow module's Jinja environment
    parse_chat: Callable[..., Any]
    prepare: Callable[..., Any]
    format_response: Callable[..., Any]
    wrapped_error: type
    openai_error: type
    chat_completion: type
    connection: Any
    azure_connection: type
    openai_connection: type
    is_byo: Callable[[Any], bool]
    user_agent: Callable[[], str]


def _parts() -> _Parts | None:
    try:  # lazy: azure-ai-evaluation is seconds to import and already loaded by the evaluators
        from azure.ai.evaluation._byo_judge import is_byo_model_config
        from azure.ai.evaluation._legacy.prompty import _utils
        from azure.ai.evaluation._legacy.prompty._connection import (
            AzureOpenAIConnection,
            Connection,
            OpenAIConnection,
        )
        from azure.ai.evaluation._legacy.prompty._exceptions import WrappedOpenAIError
        from azure.ai.evaluation._user_agent import UserAgentSingleton
        from openai import OpenAIError
        from openai.types.chat import ChatCompletion

        return _Parts(
            env=_utils._SANDBOXED_ENV,
            parse_chat=_utils._parse_chat,
            prepare=_utils.prepare_open_ai_request_params,
            format_response=_utils.format_llm_response,
            wrapped_error=WrappedOpenAIError,
            openai_error=OpenAIError,
            chat_completion=ChatCompletion,
            connection=Connection,
            azure_connection=AzureOpenAIConnection,
            openai_connection=OpenAIConnection,
            is_byo=is_byo_model_config,
            user_agent=lambda: UserAgentSingleton().value,
        )
    except (ImportError, AttributeError) as exc:
        _warn_once(
            "parts",
            "azure-ai-evaluation moved the prompty internals the judge reuses clients through (%s); "
            "each evaluator call builds its own client (slower, same results)",
            exc,
        )
        return None


class ClientPool:
    """One HTTP connection pool and one OpenAI client per evaluator, on one event loop.

    ``loop()`` names the only event loop they may be used on (``None`` while there is none);
    :meth:`client` returns ``None`` on any other. They are created, used and closed
    (:meth:`aclose`) on that loop.
    """

    def __init__(self, loop: Callable[[], Any]) -> None:
        self.loop = loop
        self._http: Any = None
        self._clients: dict[int, Any] = {}

    def client(self, flow: SharedClientFlow) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return None
        if running is not self.loop():
            return None
        client = self._clients.get(id(flow))
        if client is None:
            client = self._clients[id(flow)] = flow.build_client(self._pool())
        return client

    def _pool(self) -> Any:
        if self._http is None:
            from openai import DEFAULT_CONNECTION_LIMITS, DefaultAsyncHttpxClient  # lazy: the judge's dependency

            # A Limits of the HTTP package the SDK is built on (httpx, or its httpx2 fork).
            limits = type(DEFAULT_CONNECTION_LIMITS)(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
            )
            self._http = DefaultAsyncHttpxClient(limits=limits)
        return self._http

    async def aclose(self) -> None:
        http, self._http = self._http, None
        self._clients.clear()
        if http is not None:
            await http.aclose()


class SharedClientFlow:
    """An evaluator's prompty flow, sending through a :class:`ClientPool` client (see the module docstring)."""

    def __init__(self, stock: Any, pool: ClientPool, parts: _Parts, *, evaluator: str, metric: str) -> None:
        self.evaluator = evaluator
        self.metric = metric
        self.stock = stock
        self.pool = pool
        self.parts = parts
        self.template = parts.env.from_string(stock._template)
        self.is_first_choice = stock._data.get("model", {}).get("response", "first").lower() == "first"

    def __getattr__(self, name: str) -> Any:  # anything else an evaluator reads is the stock flow's
        return getattr(self.stock, name)

    def messages(self, inputs: Mapping[str, Any]) -> Any:
        """The chat messages for resolved ``inputs``, as the stock flow's ``build_messages`` makes them."""
        return self.parts.parse_chat(self.template.render(**inputs), self.stock.path.parent, "auto")

    def build_client(self, http_client: Any) -> Any:
        """An OpenAI client configured as the stock flow configures its per-call one, on ``http_client``."""
        from openai import AsyncAzureOpenAI, AsyncOpenAI  # lazy: part of the judge's dependencies

        parts, stock = self.parts, self.stock
        connection = parts.connection.parse_from_config(stock._model.configuration)
        headers = {"User-Agent": parts.user_agent()}
        if isinstance(connection, parts.azure_connection):
            return AsyncAzureOpenAI(
                azure_endpoint=connection.azure_endpoint,
                api_key=connection.api_key,
                azure_deployment=connection.azure_deployment,
                api_version=connection.api_version,
                max_retries=0,
                azure_ad_token_provider=(
                    stock.get_token_provider(stock._token_credential) if not connection.api_key else None
                ),
                default_headers=headers,
                http_client=http_client,
            )
        return AsyncOpenAI(
            base_url=connection.base_url,
            api_key=connection.api_key,
            organization=connection.organization,
            max_retries=0,
            default_headers=headers,
            http_client=http_client,
        )

    async def __call__(self, *, timeout: float | None = None, **kwargs: Any) -> dict:
        client = self.pool.client(self)
        if client is None:  # not on the judge's loop: the stock flow, with a client of its own
            return await self.stock(timeout=timeout, **kwargs)
        parts, stock = self.parts, self.stock
        inputs = stock._resolve_inputs(kwargs)
        params = parts.prepare(stock._model, self.messages(inputs))
        options: dict[str, Any] = {"timeout": float(timeout)} if timeout else {}
        headers = params.pop("extra_headers", None)
        if isinstance(headers, dict):  # keep the pooled connection alive (see the module docstring)
            options["headers"] = {k: v for k, v in headers.items() if k.lower() != "connection"}
        try:
            # The SDK's own POST (what chat.completions.create ends in) without its per-request
            # transform of the parameters, a no-op for these plain JSON ones and ~1.5 ms of CPU a call.
            response = await client.post(
                "/chat/completions", body=params, cast_to=parts.chat_completion, options=options
            )
        except parts.openai_error as error:
            raise parts.wrapped_error(error=error) from error
        check_finish(response, self.evaluator, self.metric)
        return await parts.format_response(
            response=response,
            is_first_choice=self.is_first_choice,
            response_format=params.get("response_format", {}),
            outputs=stock._outputs,
            inputs=inputs,
        )


_PROBE = {
    "query": "User turn 1:\n  probe query",
    "response": "probe response",
    "tool_definitions": "[]",
    "system_message": "probe system",
    "tool_calls": "[]",
}


def install(evaluator: Any, pool: ClientPool, metric: str) -> bool:
    """Put a :class:`SharedClientFlow` in ``evaluator``'s place of its prompty flow; True if done.

    Checks first that the flow is a prompty flow this version knows, that its connection is not
    a BYO project connection, and that the fast path renders the stock flow's messages exactly.
    """
    name = type(evaluator).__name__
    parts = _parts()
    if parts is None:
        return False
    try:
        stock = evaluator._flow
        configuration = stock._model.configuration
        if parts.is_byo(configuration):
            return False  # routed through a project's Responses client: leave it to the stock flow
        flow = SharedClientFlow(stock, pool, parts, evaluator=name, metric=metric)
        probe = {k: v for k, v in _PROBE.items() if k in stock._inputs}
        inputs = stock._resolve_inputs(probe)
        if flow.messages(inputs) != stock.render(**probe):
            raise ValueError("its messages differ from the stock flow's")
        connection = parts.connection.parse_from_config(configuration)
        if not isinstance(connection, (parts.azure_connection, parts.openai_connection)):
            return False
        evaluator._flow = flow
    except Exception as exc:  # any drift in the private parts: keep the stock flow
        _warn_once(
            f"install:{name}",
            "%s: cannot reuse a judge client (%s: %s); each call builds its own (slower, same results)",
            name,
            type(exc).__name__,
            exc,
        )
        return False
    return True


def stock_flow(evaluator: Any) -> Any:
    """The evaluator's azure-ai-evaluation prompty flow (under a :class:`SharedClientFlow`, if any)."""
    flow = evaluator._flow
    return flow.stock if isinstance(flow, SharedClientFlow) else flow


def completion_limit(evaluator: Any) -> int | None:
    """The ``max_tokens`` (or ``max_completion_tokens``) the evaluator's requests carry, if readable."""
    try:
        parameters = stock_flow(evaluator)._model.parameters
    except (AttributeError, RuntimeError):
        return None
    for key in COMPLETION_LIMIT_KEYS:
        value = parameters.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def set_completion_limit(evaluator: Any, limit: int) -> bool:
    """Send ``limit`` as the evaluator's completion limit, under the key its prompty file uses."""
    try:
        parameters = stock_flow(evaluator)._model.parameters
    except (AttributeError, RuntimeError):
        parameters = None
    keys = [k for k in COMPLETION_LIMIT_KEYS if isinstance(parameters, dict) and k in parameters]
    if not keys:
        _warn_once(
            f"limit:{type(evaluator).__name__}",
            "%s: cannot set its completion limit (no max_tokens in its prompty parameters); it sends its own",
            type(evaluator).__name__,
        )
        return False
    for key in keys:
        parameters[key] = limit
    return True


def template_chars(evaluator: Any) -> int | None:
    """Characters of the evaluator's prompt template (the fixed part of every prompt), if readable."""
    template = getattr(stock_flow(evaluator), "_template", None)
    return len(template) if isinstance(template, str) else None


__all__ = [
    "COMPLETION_LIMIT_KEYS",
    "ClientPool",
    "SharedClientFlow",
    "check_finish",
    "completion_limit",
    "cut_off_message",
    "install",
    "set_completion_limit",
    "stock_flow",
    "template_chars",
]
