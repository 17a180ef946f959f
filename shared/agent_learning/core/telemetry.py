"""OpenTelemetry: the name of every span and metric the pipeline emits, and their export.

The library records through the OpenTelemetry API only, which does nothing until a provider
is installed, so agents and tests pay nothing for it. :func:`configure` installs one from the
settings (``AGENT_LEARNING_TELEMETRY``):

* ``auto`` (default) — Azure Monitor when ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is set
  (``azure-monitor-opentelemetry``), otherwise off;
* ``azure-monitor`` — Azure Monitor, and the connection string is required;
* ``console`` — spans and metrics printed to stderr (``opentelemetry-sdk``), for local runs (stdout
  stays the program's: ``agent-learn ... --json`` still prints one JSON document);
* ``off`` — nothing is exported.

:func:`install` points the library at given providers instead of the global ones (tests use
the SDK's in-memory exporters that way). ``opentelemetry`` is imported on first use, never when
the Functions app starts.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agent_learning.core.errors import ConfigurationError

if TYPE_CHECKING:
    from agent_learning.app.settings import Settings

SCOPE = "agent_learning"

# --------------------------------------------------------------------------- span names

SPAN_ENQUEUE = "agent_learning.enqueue"
"""One change-feed batch turned into scoring messages."""
SPAN_SCORE = "agent_learning.score"
"""One scoring message: judge, shape the reward, store the score."""
SPAN_JUDGE = "agent_learning.judge"
"""One judge call (all metrics of one episode)."""
SPAN_EVALUATOR = "agent_learning.judge.evaluator"
"""One azure-ai-evaluation evaluator within a judge call, retries included."""
SPAN_TRAIN = "agent_learning.train"
"""One training run of one agent, up to the publish."""
SPAN_FEEDBACK = "agent_learning.rewards.feedback"
"""One piece of user feedback stored and reconciled."""

SPANS = (SPAN_ENQUEUE, SPAN_SCORE, SPAN_JUDGE, SPAN_EVALUATOR, SPAN_TRAIN, SPAN_FEEDBACK)


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """A metric the library records: name, instrument kind, UCUM unit and description."""

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    unit: str
    description: str


EPISODES_ENQUEUED = Metric("agent_learning.episodes.enqueued", "counter", "{episode}", "episodes sent for scoring")
EPISODES_SCORED = Metric("agent_learning.episodes.scored", "counter", "{episode}", "episodes judged and stored")
EPISODES_UNJUDGED = Metric(
    "agent_learning.episodes.unjudged",
    "counter",
    "{episode}",
    "episodes recorded without judging (AGENT_LEARNING_JUDGING; by reason: sampled_out, over_rate)",
)
EPISODES_DEAD_LETTERED = Metric(
    "agent_learning.episodes.dead_lettered", "counter", "{episode}", "scoring messages dead-lettered (by reason)"
)
JUDGE_DURATION = Metric("agent_learning.judge.duration", "histogram", "s", "time of one judge call")
JUDGE_FAILURES = Metric(
    "agent_learning.judge.failures", "counter", "{failure}", "failed judge calls (kind: transient or permanent)"
)
REWARD = Metric("agent_learning.reward", "histogram", "1", "shaped reward of each scored episode")
QUEUE_LAG = Metric("agent_learning.queue.lag", "histogram", "s", "time from an episode's end to its score")
MEAN_REWARD = Metric("agent_learning.policy.mean_reward", "gauge", "1", "mean reward of an agent's last training batch")
POLICY_ENTROPY = Metric("agent_learning.policy.entropy", "gauge", "nat",
                        "entropy of an agent's published policy, as its latest batch's requests draw from it")
TRAINING_RUNS = Metric("agent_learning.training.runs", "counter", "{run}", "training attempts (by status)")
FEEDBACK_RECEIVED = Metric("agent_learning.rewards.feedback.received", "counter", "{feedback}", "user feedback stored")
FEEDBACK_CORRECTIONS = Metric(
    "agent_learning.rewards.feedback.corrections", "counter", "{correction}", "reward corrections written for feedback"
)
SCORES_LATE = Metric(
    "agent_learning.scores.late",
    "counter",
    "{score}",
    "scores whose write completed beyond the settle window (Cosmos DB): a trainer may have passed them",
)
POLICY_WARNINGS = Metric(
    "agent_learning.policy.warnings", "counter", "{warning}", "exploration-collapse and reward-drop warnings"
)

METRICS = (
    EPISODES_ENQUEUED,
    EPISODES_SCORED,
    EPISODES_UNJUDGED,
    EPISODES_DEAD_LETTERED,
    JUDGE_DURATION,
    JUDGE_FAILURES,
    REWARD,
    QUEUE_LAG,
    MEAN_REWARD,
    POLICY_ENTROPY,
    TRAINING_RUNS,
    FEEDBACK_RECEIVED,
    FEEDBACK_CORRECTIONS,
    SCORES_LATE,
    POLICY_WARNINGS,
)


# --------------------------------------------------------------------------- recording


class _NoSpan:
    """Stands in for a span when opentelemetry is not installed or nothing would record it."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        return None


class _Bound:
    """A tracer and one instrument per metric, from one pair of providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        try:
            from opentelemetry import metrics, trace  # lazy: the Functions app starts without opentelemetry
        except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
            self.tracer = None
            self.instruments: dict[str, Any] = {}
            self.tracing_off: Any = lambda: True
            return
        if tracer_provider is None:
            # Until a process installs a tracer provider, the global one is a proxy whose spans
            # record nothing; skipping them then saves about a tenth of scoring's time. The
            # check is made per span, so a provider installed later is used from then on.
            self.tracing_off = lambda: isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        else:
            self.tracing_off = lambda: False
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SCOPE)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE)
        makers = {"counter": meter.create_counter, "histogram": meter.create_histogram, "gauge": meter.create_gauge}
        self.instruments = {
            m.name: makers[m.kind](m.name, unit=m.unit, description=m.description) for m in METRICS
        }


_bound: _Bound | None = None
_lock = threading.Lock()
_configured: str | None = None


def _get() -> _Bound:
    global _bound
    if _bound is None:
        with _lock:
            if _bound is None:
                _bound = _Bound()
    return _bound


def install(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Record through these providers from now on (``None``: the global ones)."""
    global _bound
    with _lock:
        _bound = _Bound(tracer_provider, meter_provider) if tracer_provider or meter_provider else None


def _attributes(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attrs or {}).items() if isinstance(v, str | bool | int | float)}


@contextmanager
def span(name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A span around a block; an exception is recorded on it and re-raised."""
    bound = _get()
    tracer = bound.tracer
    if tracer is None or bound.tracing_off():
        yield _NoSpan()
        return
    with tracer.start_as_current_span(name, attributes=_attributes(attrs)) as current:
        yield current


def count(metric: Metric, value: float = 1, attrs: Mapping[str, Any] | None = None) -> None:
    """Add to a counter."""
    if value:
        _record(metric, "add", value, attrs)


def record(metric: Metric, value: float, attrs: Mapping[str, Any] | None = None) -> None:
    """Record a histogram value or set a gauge."""
    _record(metric, "record" if metric.kind == "histogram" else "set", value, attrs)


def _record(metric: Metric, method: str, value: float, attrs: Mapping[str, Any] | None) -> None:
    instrument = _get().instruments.get(metric.name)
    if instrument is not None:
        getattr(instrument, method)(value, attributes=_attributes(attrs))


# --------------------------------------------------------------------------- export


def mode(settings: Settings) -> str:
    """The exporter ``settings`` choose: ``off``, ``console`` or ``azure-monitor``."""
    if settings.telemetry == "auto":
        return "azure-monitor" if settings.applicationinsights_connection_string else "off"
    return settings.telemetry


def configure(settings: Settings) -> str:
    """Install the global exporters ``settings`` choose, once per process; returns the mode."""
    global _configured
    chosen = mode(settings)
    with _lock:
        if _configured is not None or chosen == "off":
            return _configured or chosen
        try:
            if chosen == "azure-monitor":
                _azure_monitor(settings)
            else:
                _console()
        except ImportError as exc:
            extra = "azure" if chosen == "azure-monitor" else "telemetry"
            why = (
                f"AGENT_LEARNING_TELEMETRY={chosen}"
                if settings.telemetry == chosen
                else "APPLICATIONINSIGHTS_CONNECTION_STRING is set, and AGENT_LEARNING_TELEMETRY=auto then exports to "
                "Azure Monitor, which"
            )
            raise ConfigurationError(
                f"{why} needs {exc.name}: pip install 'agent-learning[{extra}]', or set AGENT_LEARNING_TELEMETRY=off"
            ) from None
        _configured = chosen
        return chosen


def _resource() -> Any:
    from opentelemetry.sdk.resources import Resource  # lazy: only when exporters are configured

    return Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "agent-learning")})


def _azure_monitor(settings: Settings) -> None:
    from azure.monitor.opentelemetry import configure_azure_monitor  # lazy: an optional extra

    secret = settings.applicationinsights_connection_string
    if secret is None:
        raise ConfigurationError(
            "AGENT_LEARNING_TELEMETRY=azure-monitor needs APPLICATIONINSIGHTS_CONNECTION_STRING"
        )
    configure_azure_monitor(connection_string=secret.get_secret_value(), resource=_resource())


def _console() -> None:
    # lazy: the SDK only when console exporters are chosen
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = _resource()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr), export_interval_millis=60_000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader], resource=resource))
