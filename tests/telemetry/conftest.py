"""OpenTelemetry's SDK, in memory: an exporter that keeps every ended span and a reader that
collects the metrics on demand. Tests that need it skip, saying why, where the SDK (which
the ``test`` extra installs) is missing; the control plane itself needs only the API."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from controlplane import SubagentControl
from tests.support import MakeControl

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SDK_MISSING = (
    "opentelemetry-sdk is not installed (the test extra brings it, with the otel extra): "
    "the span and metric tests need its in-memory exporter and reader"
)
HAS_SDK = importlib.util.find_spec("opentelemetry") is not None and (
    importlib.util.find_spec("opentelemetry.sdk") is not None
)


@dataclass
class Otel:
    """An SDK tracer and meter provider whose output a test reads back."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Every ended span (named ``name``), oldest end first."""
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """Each data point of ``metric`` as (attributes, point), cumulative so far."""
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found += [(dict(p.attributes or {}), p) for p in item.data.data_points]
        return found

    def value(self, metric: str, **attributes: Any) -> float:
        """A sum's value where its attributes include ``attributes`` (``a__b`` is ``a.b``);
        0 when there is no such point."""
        return sum(p.value for p in self._matching(metric, attributes))

    def count(self, metric: str, **attributes: Any) -> int:
        """How many values a histogram took where its attributes include ``attributes``."""
        return sum(p.count for p in self._matching(metric, attributes))

    def _matching(self, metric: str, attributes: dict[str, Any]) -> list[Any]:
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        return [
            point
            for found, point in self.points(metric)
            if all(found.get(k) == v for k, v in wanted.items())
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    """An in-memory SDK; the test skips, saying why, without opentelemetry-sdk."""
    if not HAS_SDK:
        pytest.skip(SDK_MISSING)
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(tracer_provider, meter_provider, exporter, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def control(make_control: MakeControl, request: pytest.FixtureRequest) -> SubagentControl:
    """A control plane; its spans and metrics go to ``otel`` when the test uses it."""
    if "otel" not in request.fixturenames:
        return make_control()
    otel: Otel = request.getfixturevalue("otel")
    return make_control(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
