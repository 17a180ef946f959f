"""Pytest plugin: the ``captured`` fixture, which records the library's spans and metrics with
the OpenTelemetry SDK's in-memory exporters (registered in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent_learning.core import telemetry


class Captured:
    """Spans and metrics recorded while installed (the SDK is imported here, on first use)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        telemetry.install(tracer_provider, MeterProvider(metric_readers=[self.reader]))

    def span_names(self) -> list[str]:
        return [s.name for s in self.spans.get_finished_spans()]

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out = []
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        out.extend(metric.data.data_points)
        return out

    def total(self, name: str, **attrs: Any) -> float:
        return sum(p.value for p in self.points(name) if all(p.attributes.get(k) == v for k, v in attrs.items()))


@pytest.fixture
def captured() -> Iterator[Captured]:
    pytest.importorskip("opentelemetry.sdk")
    c = Captured()
    yield c
    telemetry.install()
