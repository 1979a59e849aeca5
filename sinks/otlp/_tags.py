"""Protobuf field tags of the OTLP messages our encoders write, named by message and field.

A tag is ``field_number << 3 | wire_type``; every one below is under 128 (one varint byte)
except ``SPAN_FLAGS`` (field 16), which encodes as two bytes. The field numbers are those of
``opentelemetry-proto`` (``opentelemetry/proto/{common,resource,trace,metrics}/v1/*.proto``
and the two ``collector`` services); a test reads them back from its descriptors.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "EXEMPLAR_TRACE_ID",
    "EXEMPLAR_SPAN_ID",
    "EXEMPLAR_AS_DOUBLE",
    "EXEMPLAR_TIME",
    "HISTOGRAM_POINT_EXEMPLARS",
    "NUMBER_POINT_AS_DOUBLE",
    "GAUGE_DATA_POINTS",
    "METRIC_GAUGE",
    "ANY_VALUE_BOOL",
    "ANY_VALUE_DOUBLE",
    "ANY_VALUE_INT",
    "ANY_VALUE_STRING",
    "EVENT_ATTRIBUTES",
    "EVENT_NAME",
    "EVENT_TIME",
    "HISTOGRAM_DATA_POINTS",
    "HISTOGRAM_POINT_ATTRIBUTES",
    "HISTOGRAM_POINT_BOUNDS",
    "HISTOGRAM_POINT_BUCKETS",
    "HISTOGRAM_POINT_COUNT",
    "HISTOGRAM_POINT_MAX",
    "HISTOGRAM_POINT_MIN",
    "HISTOGRAM_POINT_SUM",
    "HISTOGRAM_TEMPORALITY",
    "I32",
    "I64",
    "KEY_VALUE_KEY",
    "KEY_VALUE_VALUE",
    "LEN",
    "METRICS_REQUEST_RESOURCE_METRICS",
    "METRIC_DESCRIPTION",
    "METRIC_HISTOGRAM",
    "METRIC_NAME",
    "METRIC_SUM",
    "METRIC_UNIT",
    "NUMBER_POINT_AS_INT",
    "NUMBER_POINT_ATTRIBUTES",
    "POINT_START_TIME",
    "POINT_TIME",
    "RESOURCE_ATTRIBUTES",
    "RESOURCE_METRICS_RESOURCE",
    "RESOURCE_METRICS_SCOPE_METRICS",
    "RESOURCE_SPANS_RESOURCE",
    "RESOURCE_SPANS_SCOPE_SPANS",
    "SCOPE_METRICS_METRICS",
    "SCOPE_METRICS_SCOPE",
    "SCOPE_NAME_FIELD",
    "SCOPE_SPANS_SCOPE",
    "SCOPE_SPANS_SPANS",
    "SCOPE_VERSION",
    "SPAN_ATTRIBUTES",
    "SPAN_DROPPED_ATTRIBUTES_COUNT",
    "SPAN_END_TIME",
    "SPAN_EVENTS",
    "SPAN_FLAGS",
    "SPAN_ID",
    "SPAN_KIND",
    "SPAN_NAME",
    "SPAN_PARENT_SPAN_ID",
    "SPAN_START_TIME",
    "SPAN_STATUS",
    "SPAN_TRACE_ID",
    "SPAN_TRACE_STATE",
    "STATUS_CODE",
    "STATUS_MESSAGE",
    "SUM_DATA_POINTS",
    "SUM_IS_MONOTONIC",
    "SUM_TEMPORALITY",
    "TRACES_REQUEST_RESOURCE_SPANS",
    "VARINT",
    "tag",
]

#: Wire types: varint (int, bool, enum), 64-bit (fixed64, sfixed64, double), length-delimited
#: (string, bytes, message, packed repeated), 32-bit (fixed32).
VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
I32: Final = 5


def tag(field_number: int, wire_type: int) -> int:
    """The tag of a field: its number and wire type, before varint encoding."""
    return field_number << 3 | wire_type


# -- common.v1, resource.v1 -------------------------------------------------------------------
#: AnyValue.string_value
ANY_VALUE_STRING: Final = tag(1, LEN)
#: AnyValue.bool_value
ANY_VALUE_BOOL: Final = tag(2, VARINT)
#: AnyValue.int_value
ANY_VALUE_INT: Final = tag(3, VARINT)
#: AnyValue.double_value
ANY_VALUE_DOUBLE: Final = tag(4, I64)
#: KeyValue.key
KEY_VALUE_KEY: Final = tag(1, LEN)
#: KeyValue.value
KEY_VALUE_VALUE: Final = tag(2, LEN)
#: InstrumentationScope.name
SCOPE_NAME_FIELD: Final = tag(1, LEN)
#: InstrumentationScope.version
SCOPE_VERSION: Final = tag(2, LEN)
#: Resource.attributes
RESOURCE_ATTRIBUTES: Final = tag(1, LEN)

# -- collector.trace.v1, trace.v1 -------------------------------------------------------------
#: ExportTraceServiceRequest.resource_spans
TRACES_REQUEST_RESOURCE_SPANS: Final = tag(1, LEN)
#: ResourceSpans.resource
RESOURCE_SPANS_RESOURCE: Final = tag(1, LEN)
#: ResourceSpans.scope_spans
RESOURCE_SPANS_SCOPE_SPANS: Final = tag(2, LEN)
#: ScopeSpans.scope
SCOPE_SPANS_SCOPE: Final = tag(1, LEN)
#: ScopeSpans.spans
SCOPE_SPANS_SPANS: Final = tag(2, LEN)
#: Span.trace_id
SPAN_TRACE_ID: Final = tag(1, LEN)
#: Span.span_id
SPAN_ID: Final = tag(2, LEN)
#: Span.trace_state
SPAN_TRACE_STATE: Final = tag(3, LEN)
#: Span.parent_span_id
SPAN_PARENT_SPAN_ID: Final = tag(4, LEN)
#: Span.name
SPAN_NAME: Final = tag(5, LEN)
#: Span.kind
SPAN_KIND: Final = tag(6, VARINT)
#: Span.start_time_unix_nano
SPAN_START_TIME: Final = tag(7, I64)
#: Span.end_time_unix_nano
SPAN_END_TIME: Final = tag(8, I64)
#: Span.attributes
SPAN_ATTRIBUTES: Final = tag(9, LEN)
#: Span.dropped_attributes_count
SPAN_DROPPED_ATTRIBUTES_COUNT: Final = tag(10, VARINT)
#: Span.events
SPAN_EVENTS: Final = tag(11, LEN)
#: Span.status
SPAN_STATUS: Final = tag(15, LEN)
#: Span.flags (two varint bytes)
SPAN_FLAGS: Final = tag(16, I32)
#: Span.Event.time_unix_nano
EVENT_TIME: Final = tag(1, I64)
#: Span.Event.name
EVENT_NAME: Final = tag(2, LEN)
#: Span.Event.attributes
EVENT_ATTRIBUTES: Final = tag(3, LEN)
#: Status.message
STATUS_MESSAGE: Final = tag(2, LEN)
#: Status.code
STATUS_CODE: Final = tag(3, VARINT)

# -- collector.metrics.v1, metrics.v1 ---------------------------------------------------------
#: ExportMetricsServiceRequest.resource_metrics
METRICS_REQUEST_RESOURCE_METRICS: Final = tag(1, LEN)
#: ResourceMetrics.resource
RESOURCE_METRICS_RESOURCE: Final = tag(1, LEN)
#: ResourceMetrics.scope_metrics
RESOURCE_METRICS_SCOPE_METRICS: Final = tag(2, LEN)
#: ScopeMetrics.scope
SCOPE_METRICS_SCOPE: Final = tag(1, LEN)
#: ScopeMetrics.metrics
SCOPE_METRICS_METRICS: Final = tag(2, LEN)
#: Metric.name
METRIC_NAME: Final = tag(1, LEN)
#: Metric.description
METRIC_DESCRIPTION: Final = tag(2, LEN)
#: Metric.unit
METRIC_UNIT: Final = tag(3, LEN)
#: Metric.gauge
METRIC_GAUGE: Final = tag(5, LEN)
#: Metric.sum
METRIC_SUM: Final = tag(7, LEN)
#: Metric.histogram
METRIC_HISTOGRAM: Final = tag(9, LEN)
#: Sum.data_points
SUM_DATA_POINTS: Final = tag(1, LEN)
#: Sum.aggregation_temporality
SUM_TEMPORALITY: Final = tag(2, VARINT)
#: Sum.is_monotonic
SUM_IS_MONOTONIC: Final = tag(3, VARINT)
#: Gauge.data_points
GAUGE_DATA_POINTS: Final = tag(1, LEN)
#: Histogram.data_points
HISTOGRAM_DATA_POINTS: Final = tag(1, LEN)
#: Histogram.aggregation_temporality
HISTOGRAM_TEMPORALITY: Final = tag(2, VARINT)
#: NumberDataPoint.start_time_unix_nano and HistogramDataPoint.start_time_unix_nano (both 2)
POINT_START_TIME: Final = tag(2, I64)
#: NumberDataPoint.time_unix_nano and HistogramDataPoint.time_unix_nano (both 3)
POINT_TIME: Final = tag(3, I64)
#: NumberDataPoint.as_double
NUMBER_POINT_AS_DOUBLE: Final = tag(4, I64)
#: NumberDataPoint.as_int
NUMBER_POINT_AS_INT: Final = tag(6, I64)
#: NumberDataPoint.attributes
NUMBER_POINT_ATTRIBUTES: Final = tag(7, LEN)
#: HistogramDataPoint.count
HISTOGRAM_POINT_COUNT: Final = tag(4, I64)
#: HistogramDataPoint.sum
HISTOGRAM_POINT_SUM: Final = tag(5, I64)
#: HistogramDataPoint.bucket_counts (packed)
HISTOGRAM_POINT_BUCKETS: Final = tag(6, LEN)
#: HistogramDataPoint.explicit_bounds (packed)
HISTOGRAM_POINT_BOUNDS: Final = tag(7, LEN)
#: HistogramDataPoint.exemplars
HISTOGRAM_POINT_EXEMPLARS: Final = tag(8, LEN)
#: Exemplar.time_unix_nano
EXEMPLAR_TIME: Final = tag(2, I64)
#: Exemplar.as_double
EXEMPLAR_AS_DOUBLE: Final = tag(3, I64)
#: Exemplar.span_id
EXEMPLAR_SPAN_ID: Final = tag(4, LEN)
#: Exemplar.trace_id
EXEMPLAR_TRACE_ID: Final = tag(5, LEN)
#: HistogramDataPoint.attributes
HISTOGRAM_POINT_ATTRIBUTES: Final = tag(9, LEN)
#: HistogramDataPoint.min
HISTOGRAM_POINT_MIN: Final = tag(11, I64)
#: HistogramDataPoint.max
HISTOGRAM_POINT_MAX: Final = tag(12, I64)
