"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``) and ``MetricSink`` (a ``MeterProvider``)."""

from sinks._metrics import MetricSink, MetricSinkStats
from sinks._spans import SpanSink, SpanSinkStats

__all__ = ["MetricSink", "MetricSinkStats", "SpanSink", "SpanSinkStats"]
