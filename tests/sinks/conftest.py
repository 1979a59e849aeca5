"""Fixtures for the sink tests: real OpenTelemetry in-memory parts behind the sinks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sinks.otel import MetricSink, SpanSink


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def span_sink(exporter: InMemorySpanExporter) -> SpanSink:
    return SpanSink(exporter, span_groups="default,checkpoint")


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def metric_sink(meter_provider: MeterProvider) -> MetricSink:
    return MetricSink(meter_provider)
