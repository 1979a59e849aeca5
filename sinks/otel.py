"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``), ``MetricSink`` (a ``MeterProvider``),
``OtlpSpanSink`` and ``OtlpMetricSink`` (spans and aggregated metrics straight to an OTLP/HTTP
collector, no SDK objects)."""

from sinks._metric_sink import MetricSink, MetricSinkStats
from sinks._otlp_metric_sink import OtlpMetricSink, OtlpMetricSinkStats
from sinks._otlp_sink import OtlpSpanSink, OtlpSpanSinkStats
from sinks._span_sink import SpanSink, SpanSinkStats

__all__ = [
    "MetricSink",
    "MetricSinkStats",
    "OtlpMetricSink",
    "OtlpMetricSinkStats",
    "OtlpSpanSink",
    "OtlpSpanSinkStats",
    "SpanSink",
    "SpanSinkStats",
]
