"""OpenTelemetry sinks: ``SpanSink`` (any ``SpanExporter``), ``MetricSink`` (a ``MeterProvider``),
``OtlpSpanSink`` and ``OtlpMetricSink`` (spans and aggregated metrics straight to an OTLP/HTTP
collector, no SDK objects).

The names load on first use, so importing ``sinks.otel._env`` (what ``sinks.configure`` reads
the ``OTEL_*`` environment with) does not import the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from sinks.otel._metric_sink import MetricSink, MetricSinkStats
    from sinks.otel._span_sink import SpanSink, SpanSinkStats
    from sinks.otlp._metric_sink import OtlpMetricSink, OtlpMetricSinkStats
    from sinks.otlp._span_sink import OtlpSpanSink, OtlpSpanSinkStats

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

_HOME: Final = {
    "MetricSink": "sinks.otel._metric_sink",
    "MetricSinkStats": "sinks.otel._metric_sink",
    "OtlpMetricSink": "sinks.otlp._metric_sink",
    "OtlpMetricSinkStats": "sinks.otlp._metric_sink",
    "OtlpSpanSink": "sinks.otlp._span_sink",
    "OtlpSpanSinkStats": "sinks.otlp._span_sink",
    "SpanSink": "sinks.otel._span_sink",
    "SpanSinkStats": "sinks.otel._span_sink",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and cache the name here."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, loaded or not."""
    return sorted(set(globals()) | set(__all__))
