"""The ckpt-events pytest plugin (registered under ``pytest11``): fixtures for testing code that
emits checkpoint events.

* ``ckpt_capture``: an ``EventCapture`` (``ckpt_events.testing``): a running bus with a memory
  sink, usable from sync and async tests; ``ckpt_capture.telemetry(kind, instance)`` gives
  deterministic ids (1, 2, 3...) and clock (1 ms per reading), ``ckpt_capture.events`` the
  events so far.
* ``ckpt_span_exporter`` / ``ckpt_span_sink``: OpenTelemetry's ``InMemorySpanExporter`` and a
  ``SpanSink`` exporting to it (subscribe it with ``ckpt_capture.subscribe``; the spans are in
  ``ckpt_span_exporter.get_finished_spans()`` after ``ckpt_capture.events`` or a flush).
* ``ckpt_metric_reader`` / ``ckpt_meter_provider`` / ``ckpt_metric_sink``: OpenTelemetry's
  ``InMemoryMetricReader``, a ``MeterProvider`` reading through it, and a ``MetricSink``.

OpenTelemetry is imported by the fixtures that need it, so the plugin loads on an install
without the ``otel`` extra; those fixtures then skip the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from ckpt_events.testing import EventCapture

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from sinks.otel._metric_sink import MetricSink
    from sinks.otel._span_sink import SpanSink

__all__ = [
    "ckpt_capture",
    "ckpt_meter_provider",
    "ckpt_metric_reader",
    "ckpt_metric_sink",
    "ckpt_span_exporter",
    "ckpt_span_sink",
]

_NEEDS_OTEL = "needs OpenTelemetry's SDK (install ckpt-events[otel])"


@pytest.fixture
def ckpt_capture() -> Iterator[EventCapture]:
    """A running bus capturing every event, with deterministic ``telemetry()``."""
    with EventCapture() as capture:
        yield capture


@pytest.fixture
def ckpt_span_exporter() -> InMemorySpanExporter:
    """OpenTelemetry's in-memory span exporter."""
    exporter = pytest.importorskip(
        "opentelemetry.sdk.trace.export.in_memory_span_exporter", reason=_NEEDS_OTEL
    )
    return exporter.InMemorySpanExporter()  # type: ignore[no-any-return]


@pytest.fixture
def ckpt_span_sink(ckpt_span_exporter: InMemorySpanExporter) -> Iterator[SpanSink]:
    """A ``SpanSink`` (default and checkpoint span groups) exporting to ``ckpt_span_exporter``."""
    from sinks.otel._span_sink import SpanSink

    sink = SpanSink(ckpt_span_exporter, span_groups="default,checkpoint")
    yield sink
    sink.shutdown()


@pytest.fixture
def ckpt_metric_reader() -> InMemoryMetricReader:
    """OpenTelemetry's in-memory metric reader."""
    export = pytest.importorskip("opentelemetry.sdk.metrics.export", reason=_NEEDS_OTEL)
    return export.InMemoryMetricReader()  # type: ignore[no-any-return]


@pytest.fixture
def ckpt_meter_provider(ckpt_metric_reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    """A ``MeterProvider`` read by ``ckpt_metric_reader``; shut down after the test."""
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider(metric_readers=[ckpt_metric_reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def ckpt_metric_sink(ckpt_meter_provider: MeterProvider) -> MetricSink:
    """A ``MetricSink`` recording through ``ckpt_meter_provider``."""
    from sinks.otel._metric_sink import MetricSink

    return MetricSink(ckpt_meter_provider)
