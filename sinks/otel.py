"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``) and ``MetricSink`` (a ``MeterProvider``)."""

from sinks._metric_sink import MetricSink, MetricSinkStats
from sinks._span_sink import SpanSink, SpanSinkStats

__all__ = ["MetricSink", "MetricSinkStats", "SpanSink", "SpanSinkStats"]
