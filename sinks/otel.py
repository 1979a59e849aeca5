"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``), ``MetricSink`` (a ``MeterProvider``),
and ``OtlpSpanSink`` (spans straight to an OTLP/HTTP collector, no SDK objects)."""

from sinks._metric_sink import MetricSink, MetricSinkStats
from sinks._otlp_sink import OtlpSpanSink, OtlpSpanSinkStats
from sinks._span_sink import SpanSink, SpanSinkStats

__all__ = ["MetricSink", "MetricSinkStats", "OtlpSpanSink", "OtlpSpanSinkStats", "SpanSink", "SpanSinkStats"]
