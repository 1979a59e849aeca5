"""The ckpt-events pytest plugin (registered under ``pytest11``): fixtures for testing code that
emits checkpoint events.

* ``ckpt_capture``: an ``EventCapture`` (``ckpt_events.testing``): a running bus with a memory
  sink, usable from sync and async tests; ``ckpt_capture.telemetry(kind, instance)`` gives
  deterministic ids (1, 2, 3...) and clock (1 ms per reading), ``ckpt_capture.events`` the
  events so far.
* ``ckpt_span_exporter`` / ``ckpt_span_sink``: OpenTelemetry's ``InMemorySpanExporter`` and a
  ``SpanSink`` exporting to it, subscribed to ``ckpt_capture`` (asking for either is enough);
  the spans are in ``ckpt_span_exporter.get_finished_spans()`` after ``ckpt_capture.events``
  or a flush.
* ``ckpt_metric_reader`` / ``ckpt_meter_provider`` / ``ckpt_metric_sink``: OpenTelemetry's
  ``InMemoryMetricReader``, a ``MeterProvider`` reading through it, and a ``MetricSink``
  recording through it, subscribed to ``ckpt_capture`` (asking for any of the three is enough).

Async tests need an async plugin's marker, e.g. anyio's ``@pytest.mark.anyio`` (or
``anyio_mode = "auto"``) or pytest-asyncio's ``@pytest.mark.asyncio``; the fixtures themselves
are synchronous and serve both kinds, on any loop scope (docs/testing.md, "With pytest-asyncio").

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

    from ckpt_events.sinks.otel._metric_sink import MetricSink
    from ckpt_events.sinks.otel._span_sink import SpanSink

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
def _ckpt_in_memory_span_exporter() -> InMemorySpanExporter:
    exporter = pytest.importorskip(
        "opentelemetry.sdk.trace.export.in_memory_span_exporter", reason=_NEEDS_OTEL
    )
    return exporter.InMemorySpanExporter()  # type: ignore[no-any-return]


@pytest.fixture
def ckpt_span_sink(
    _ckpt_in_memory_span_exporter: InMemorySpanExporter, ckpt_capture: EventCapture
) -> SpanSink:
    """A ``SpanSink`` (default and checkpoint span groups) exporting to ``ckpt_span_exporter``,
    subscribed to ``ckpt_capture`` (whose bus closes it after the test)."""
    from ckpt_events.sinks.otel._span_sink import SpanSink

    sink = SpanSink(_ckpt_in_memory_span_exporter, span_groups="default,checkpoint")
    ckpt_capture.subscribe(sink, name="ckpt_span_sink")
    return sink


@pytest.fixture
def ckpt_span_exporter(
    _ckpt_in_memory_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> InMemorySpanExporter:
    """OpenTelemetry's in-memory span exporter, fed by ``ckpt_span_sink`` from ``ckpt_capture``."""
    return _ckpt_in_memory_span_exporter


@pytest.fixture
def _ckpt_in_memory_metric_reader() -> InMemoryMetricReader:
    export = pytest.importorskip("opentelemetry.sdk.metrics.export", reason=_NEEDS_OTEL)
    return export.InMemoryMetricReader()  # type: ignore[no-any-return]


@pytest.fixture
def ckpt_meter_provider(_ckpt_in_memory_metric_reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    """A ``MeterProvider`` read by ``ckpt_metric_reader``; shut down after the test."""
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider(metric_readers=[_ckpt_in_memory_metric_reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def ckpt_metric_sink(ckpt_meter_provider: MeterProvider, ckpt_capture: EventCapture) -> MetricSink:
    """A ``MetricSink`` recording through ``ckpt_meter_provider``, subscribed to ``ckpt_capture``."""
    from ckpt_events.sinks.otel._metric_sink import MetricSink

    sink = MetricSink(ckpt_meter_provider)
    ckpt_capture.subscribe(sink, name="ckpt_metric_sink")
    return sink


@pytest.fixture
def ckpt_metric_reader(
    _ckpt_in_memory_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> InMemoryMetricReader:
    """OpenTelemetry's in-memory metric reader, reading what ``ckpt_metric_sink`` records."""
    return _ckpt_in_memory_metric_reader
