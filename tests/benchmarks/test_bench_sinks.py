"""``bench_sinks``'s peers do the same work as ours (SPEC 7, "Spans": "produce the same spans as
direct OpenTelemetry SDK instrumentation"; "Metrics": the same points as direct instrument calls):
a ratio against a peer that made fewer spans or points than we do would flatter us."""

from __future__ import annotations

from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks.bench_sinks import (
    RESOURCE,
    _direct_metrics,
    _direct_spans,
    _emit_spans,
    _metric_mix,
)
from ckpt_events.sinks.otel import MetricSink, SpanSink


def _shape(spans: tuple[ReadableSpan, ...]) -> list[Any]:
    """Each span's name, its parent's name, kind, status and attributes, in a stable order."""
    names = {span.context.span_id: span.name for span in spans}
    return sorted(
        (
            span.name,
            names.get(span.parent.span_id) if span.parent else None,
            span.kind,
            span.status.status_code,
            sorted(dict(span.attributes or {}).items()),
        )
        for span in spans
    )


def test_the_span_benchmarks_sdk_peer_makes_the_spans_ours_make() -> None:
    """Two commits, each with export and write: names, parents and attributes alike."""
    direct = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(direct))
    _direct_spans(provider.get_tracer("bench"), 2)
    ours = InMemorySpanExporter()

    async def emit() -> None:
        async with Bus() as bus:
            bus.subscribe(SpanSink(ours, resource=RESOURCE, blocking=False))
            _emit_spans(Telemetry(bus, kind="resources", instance="resources-0"), 2)
            await bus.flush()

    anyio.run(emit)
    assert len(ours.get_finished_spans()) == 6
    assert _shape(ours.get_finished_spans()) == _shape(direct.get_finished_spans())


def _points(reader: InMemoryMetricReader) -> dict[Any, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[Any, Any] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, metric.unit, tuple(sorted(point.attributes.items())))
                    value = getattr(point, "value", None)
                    points[key] = (point.count, round(point.sum, 6)) if value is None else value
    return points


def test_the_metric_benchmarks_direct_calls_record_what_our_sink_records() -> None:
    """Five cycles of the checkpoint mix: every instrument, attribute set and total alike."""
    events = _metric_mix(5)
    direct, ours = InMemoryMetricReader(), InMemoryMetricReader()
    _direct_metrics(MeterProvider(metric_readers=[direct], resource=RESOURCE).get_meter("bench"), events)
    MetricSink(MeterProvider(metric_readers=[ours], resource=RESOURCE)).handle(events)
    got = _points(ours)
    assert len(got) == 9
    assert got == _points(direct)
