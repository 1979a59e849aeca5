"""The named protobuf tags of ckpt_events.sinks.otlp._tags agree with opentelemetry-proto's descriptors."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from ckpt_events.sinks.otlp import _tags as tags
from ckpt_events.sinks.otlp._wire import varint

# Each constant and the proto field(s) it stands for, spelled here a second time on purpose:
# the test reads the field number and type from the descriptors, not from the module.
FIELDS = {
    "ANY_VALUE_STRING": [(common_pb2.AnyValue, "string_value")],
    "ANY_VALUE_BOOL": [(common_pb2.AnyValue, "bool_value")],
    "ANY_VALUE_INT": [(common_pb2.AnyValue, "int_value")],
    "ANY_VALUE_DOUBLE": [(common_pb2.AnyValue, "double_value")],
    "KEY_VALUE_KEY": [(common_pb2.KeyValue, "key")],
    "KEY_VALUE_VALUE": [(common_pb2.KeyValue, "value")],
    "SCOPE_NAME_FIELD": [(common_pb2.InstrumentationScope, "name")],
    "SCOPE_VERSION": [(common_pb2.InstrumentationScope, "version")],
    "RESOURCE_ATTRIBUTES": [(resource_pb2.Resource, "attributes")],
    "TRACES_REQUEST_RESOURCE_SPANS": [(trace_service_pb2.ExportTraceServiceRequest, "resource_spans")],
    "RESOURCE_SPANS_RESOURCE": [(trace_pb2.ResourceSpans, "resource")],
    "RESOURCE_SPANS_SCOPE_SPANS": [(trace_pb2.ResourceSpans, "scope_spans")],
    "SCOPE_SPANS_SCOPE": [(trace_pb2.ScopeSpans, "scope")],
    "SCOPE_SPANS_SPANS": [(trace_pb2.ScopeSpans, "spans")],
    "SPAN_TRACE_ID": [(trace_pb2.Span, "trace_id")],
    "SPAN_ID": [(trace_pb2.Span, "span_id")],
    "SPAN_TRACE_STATE": [(trace_pb2.Span, "trace_state")],
    "SPAN_PARENT_SPAN_ID": [(trace_pb2.Span, "parent_span_id")],
    "SPAN_NAME": [(trace_pb2.Span, "name")],
    "SPAN_KIND": [(trace_pb2.Span, "kind")],
    "SPAN_START_TIME": [(trace_pb2.Span, "start_time_unix_nano")],
    "SPAN_END_TIME": [(trace_pb2.Span, "end_time_unix_nano")],
    "SPAN_ATTRIBUTES": [(trace_pb2.Span, "attributes")],
    "SPAN_DROPPED_ATTRIBUTES_COUNT": [(trace_pb2.Span, "dropped_attributes_count")],
    "SPAN_EVENTS": [(trace_pb2.Span, "events")],
    "SPAN_STATUS": [(trace_pb2.Span, "status")],
    "SPAN_FLAGS": [(trace_pb2.Span, "flags")],
    "EVENT_TIME": [(trace_pb2.Span.Event, "time_unix_nano")],
    "EVENT_NAME": [(trace_pb2.Span.Event, "name")],
    "EVENT_ATTRIBUTES": [(trace_pb2.Span.Event, "attributes")],
    "STATUS_MESSAGE": [(trace_pb2.Status, "message")],
    "STATUS_CODE": [(trace_pb2.Status, "code")],
    "METRICS_REQUEST_RESOURCE_METRICS": [
        (metrics_service_pb2.ExportMetricsServiceRequest, "resource_metrics")
    ],
    "RESOURCE_METRICS_RESOURCE": [(metrics_pb2.ResourceMetrics, "resource")],
    "RESOURCE_METRICS_SCOPE_METRICS": [(metrics_pb2.ResourceMetrics, "scope_metrics")],
    "SCOPE_METRICS_SCOPE": [(metrics_pb2.ScopeMetrics, "scope")],
    "SCOPE_METRICS_METRICS": [(metrics_pb2.ScopeMetrics, "metrics")],
    "METRIC_NAME": [(metrics_pb2.Metric, "name")],
    "METRIC_DESCRIPTION": [(metrics_pb2.Metric, "description")],
    "METRIC_UNIT": [(metrics_pb2.Metric, "unit")],
    "METRIC_SUM": [(metrics_pb2.Metric, "sum")],
    "METRIC_HISTOGRAM": [(metrics_pb2.Metric, "histogram")],
    "SUM_DATA_POINTS": [(metrics_pb2.Sum, "data_points")],
    "SUM_TEMPORALITY": [(metrics_pb2.Sum, "aggregation_temporality")],
    "SUM_IS_MONOTONIC": [(metrics_pb2.Sum, "is_monotonic")],
    "HISTOGRAM_DATA_POINTS": [(metrics_pb2.Histogram, "data_points")],
    "METRIC_GAUGE": [(metrics_pb2.Metric, "gauge")],
    "GAUGE_DATA_POINTS": [(metrics_pb2.Gauge, "data_points")],
    "NUMBER_POINT_AS_DOUBLE": [(metrics_pb2.NumberDataPoint, "as_double")],
    "HISTOGRAM_POINT_EXEMPLARS": [(metrics_pb2.HistogramDataPoint, "exemplars")],
    "EXEMPLAR_TIME": [(metrics_pb2.Exemplar, "time_unix_nano")],
    "EXEMPLAR_AS_DOUBLE": [(metrics_pb2.Exemplar, "as_double")],
    "EXEMPLAR_SPAN_ID": [(metrics_pb2.Exemplar, "span_id")],
    "EXEMPLAR_TRACE_ID": [(metrics_pb2.Exemplar, "trace_id")],
    "HISTOGRAM_TEMPORALITY": [(metrics_pb2.Histogram, "aggregation_temporality")],
    "POINT_START_TIME": [
        (metrics_pb2.NumberDataPoint, "start_time_unix_nano"),
        (metrics_pb2.HistogramDataPoint, "start_time_unix_nano"),
    ],
    "POINT_TIME": [
        (metrics_pb2.NumberDataPoint, "time_unix_nano"),
        (metrics_pb2.HistogramDataPoint, "time_unix_nano"),
    ],
    "NUMBER_POINT_AS_INT": [(metrics_pb2.NumberDataPoint, "as_int")],
    "NUMBER_POINT_ATTRIBUTES": [(metrics_pb2.NumberDataPoint, "attributes")],
    "HISTOGRAM_POINT_COUNT": [(metrics_pb2.HistogramDataPoint, "count")],
    "HISTOGRAM_POINT_SUM": [(metrics_pb2.HistogramDataPoint, "sum")],
    "HISTOGRAM_POINT_BUCKETS": [(metrics_pb2.HistogramDataPoint, "bucket_counts")],
    "HISTOGRAM_POINT_BOUNDS": [(metrics_pb2.HistogramDataPoint, "explicit_bounds")],
    "HISTOGRAM_POINT_ATTRIBUTES": [(metrics_pb2.HistogramDataPoint, "attributes")],
    "HISTOGRAM_POINT_MIN": [(metrics_pb2.HistogramDataPoint, "min")],
    "HISTOGRAM_POINT_MAX": [(metrics_pb2.HistogramDataPoint, "max")],
}

_I64_TYPES = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_I32_TYPES = {FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32}
_LEN_TYPES = {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE}


def _wire_type(field: FieldDescriptor) -> int:
    """The wire type this field is written with (a packed repeated scalar is length-delimited)."""
    if field.type in _LEN_TYPES or field.is_packed:
        return 2
    if field.type in _I64_TYPES:
        return 1
    if field.type in _I32_TYPES:
        return 5
    return 0


def test_every_tag_constant_is_checked() -> None:
    """The table above covers exactly the module's tag constants."""
    constants = {n for n in tags.__all__ if n not in {"VARINT", "I64", "LEN", "I32", "tag"}}
    assert constants == set(FIELDS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_tag_is_the_varint_of_its_fields_number_and_wire_type(name: str) -> None:
    """The constant's varint is that of (field number << 3) | wire type, read from the descriptor."""
    value = getattr(tags, name)
    for message, field_name in FIELDS[name]:
        field = message.DESCRIPTOR.fields_by_name[field_name]
        assert varint(value) == varint(field.number << 3 | _wire_type(field)), (message, field_name)


def test_the_one_two_byte_tag_is_span_flags() -> None:
    """Span.flags (field 16, fixed32) is written as the two bytes 0x85 0x01; every other tag is one byte."""
    assert varint(tags.SPAN_FLAGS) == b"\x85\x01"
    assert all(getattr(tags, name) < 128 for name in FIELDS if name != "SPAN_FLAGS")
