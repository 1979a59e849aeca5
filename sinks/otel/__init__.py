"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``), ``MetricSink`` (a ``MeterProvider``),
``OtlpSpanSink`` and ``OtlpMetricSink`` (spans and aggregated metrics straight to an OTLP/HTTP
collector, no SDK objects); ``AttributeLimits``, the span attribute limits both span sinks take.

The names load on first use, so importing ``ckpt_events.sinks.otel._env`` (what ``sinks.configure`` reads
the ``OTEL_*`` environment with) does not import the OpenTelemetry SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

if TYPE_CHECKING:
    from ckpt_events.sinks._span_attrs import AttributeLimits
    from ckpt_events.sinks.otel._metric_sink import MetricSink, MetricSinkStats
    from ckpt_events.sinks.otel._span_sink import SpanSink, SpanSinkStats
    from ckpt_events.sinks.otlp._metric_sink import OtlpMetricSink, OtlpMetricSinkStats
    from ckpt_events.sinks.otlp._span_sink import OtlpSpanSink, OtlpSpanSinkStats

__all__ = [
    "AttributeLimits",
    "MetricSink",
    "MetricSinkStats",
    "OtlpMetricSink",
    "OtlpMetricSinkStats",
    "OtlpSpanSink",
    "OtlpSpanSinkStats",
    "SpanSink",
    "SpanSinkStats",
]

_HOMES: Final = {
    "AttributeLimits": "ckpt_events.sinks._span_attrs",
    "MetricSink": "ckpt_events.sinks.otel._metric_sink",
    "MetricSinkStats": "ckpt_events.sinks.otel._metric_sink",
    "OtlpMetricSink": "ckpt_events.sinks.otlp._metric_sink",
    "OtlpMetricSinkStats": "ckpt_events.sinks.otlp._metric_sink",
    "OtlpSpanSink": "ckpt_events.sinks.otlp._span_sink",
    "OtlpSpanSinkStats": "ckpt_events.sinks.otlp._span_sink",
    "SpanSink": "ckpt_events.sinks.otel._span_sink",
    "SpanSinkStats": "ckpt_events.sinks.otel._span_sink",
}

# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`from ckpt_events import Bsu`) an Any that mypy --strict let through.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals())
# The helpers are not names of this package (dir() lists the namespace).
del TYPE_CHECKING, lazy_attributes
