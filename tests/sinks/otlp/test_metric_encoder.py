"""Checkpoint metrics as OTLP export requests (``ckpt_events.sinks.otlp._metric_encoder``), written by
hand from our cumulative totals and read back by opentelemetry-proto."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ckpt_events import Bus
from ckpt_events.sinks._metric_totals import MetricTotals
from ckpt_events.sinks.otlp._metric_encoder import MetricEncoder
from tests.sinks.otlp.test_metric_sink import _event_mix


async def test_protobuf_and_json_decode_to_the_same_request() -> None:
    """OpenTelemetry's own protobuf classes parse our protobuf body and our JSON body identically."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    events: list[Any] = []

    class Keep:
        def handle(self, batch: list[Any]) -> None:
            events.extend(batch)

    async with Bus() as bus:
        bus.subscribe(Keep())
        await _event_mix(bus)
    totals = MetricTotals()
    totals.add(events)
    encoder = MetricEncoder({"service.name": "s", "n": 3})
    from_pb = ExportMetricsServiceRequest.FromString(encoder.protobuf(totals, 1, 2))
    from_json = json_format.Parse(encoder.json(totals, 1, 2), ExportMetricsServiceRequest())
    exemplars = [
        e
        for metric in from_pb.resource_metrics[0].scope_metrics[0].metrics
        for p in metric.histogram.data_points
        for e in p.exemplars
    ]
    assert exemplars  # protobuf carries exemplars, JSON none (rotel drops them): the rest agrees
    for metric in from_pb.resource_metrics[0].scope_metrics[0].metrics:
        for p in metric.histogram.data_points:
            del p.exemplars[:]
    assert from_pb == from_json
    metrics = from_pb.resource_metrics[0].scope_metrics[0].metrics
    assert [m.name for m in metrics][0] == "gym.checkpoint.operation_duration_ms"
    assert sum(p.count for p in metrics[0].histogram.data_points) == 11
    assert msgspec.json.decode(encoder.json(totals, 1, 2))["resourceMetrics"][0]["resource"]["attributes"][
        1
    ] == {
        "key": "n",
        "value": {"intValue": "3"},
    }


async def test_a_counter_total_past_int64_goes_out_as_a_double_never_negative() -> None:
    """Three commits of 2**62 bytes each (every one valid) total 3 * 2**62, past int64: both
    bodies carry it as ``as_double``, where it was wrapped to a negative ``as_int`` in protobuf
    and dropped by the collector in JSON (the asInt did not parse)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from ckpt_events import Telemetry

    events: list[Any] = []

    class Keep:
        def handle(self, batch: list[Any]) -> None:
            events.extend(batch)

    async with Bus() as bus:
        bus.subscribe(Keep())
        tel = Telemetry(bus, kind="resources", instance="r0")
        for i in range(3):
            with tel.operation("commit", checkpoint_id=f"c{i}") as op:
                op.set(records=1, bytes=2**62)
    totals = MetricTotals()
    totals.add(events)
    encoder = MetricEncoder({"service.name": "s"})
    from_pb = ExportMetricsServiceRequest.FromString(encoder.protobuf(totals, 1, 2))
    from_json = json_format.Parse(encoder.json(totals, 1, 2), ExportMetricsServiceRequest())
    for request in (from_pb, from_json):
        metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
        (size,) = metrics["gym.checkpoint.bytes_total"].sum.data_points
        assert size.WhichOneof("value") == "as_double"
        assert size.as_double == float(3 * 2**62)
        (rows,) = metrics["gym.checkpoint.records_total"].sum.data_points
        assert rows.WhichOneof("value") == "as_int"  # a total int64 holds stays an int
        assert rows.as_int == 3


def test_keys_written_alike_are_one_point_holding_their_sum_as_on_the_prometheus_page() -> None:
    """Three kinds and codes that differ only in undecodable bytes (``x\\udc80``, ``x\\udc81``)
    or in U+FFFD itself are written alike: they went out as three points with one attribute set
    (a collector keeps one: 1 refusal of 3, where the Prometheus page said 3). Now one point
    each, holding the three's sum, in protobuf and JSON alike, and every metric's attribute sets
    are unique."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from ckpt_events import OperationFinished, OperationStarted, Refused

    events: list[Any] = []
    for i, word in enumerate(("x\udc80", "x\udc81", "x\ufffd")):
        events.append(Refused(kind="model", instance="m0", time_ns=i, code=word))  # type: ignore[arg-type]
        ident = {"kind": word, "instance": "i0", "trace_id": 1, "span_id": i + 1, "start_ns": 1}
        events.append(OperationStarted(**ident, operation="commit"))  # type: ignore[arg-type]
        finished = OperationFinished(**ident, end_ns=(i + 1) * 3_000_000, operation="commit", records=2)  # type: ignore[arg-type]
        events.append(finished)
    events.append(
        OperationStarted(kind="x\udc82", instance="i0", trace_id=2, span_id=9, start_ns=1, operation="commit")
    )  # type: ignore[arg-type]
    totals = MetricTotals()
    totals.add(events)
    snapshot = totals.snapshot()  # with the open work, as the sink exports it
    encoder = MetricEncoder({"service.name": "s"})
    from_pb = ExportMetricsServiceRequest.FromString(encoder.protobuf(snapshot, 1, 2))
    from_json = json_format.Parse(encoder.json(snapshot, 1, 2), ExportMetricsServiceRequest())
    for request in (from_pb, from_json):
        metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
        for metric in metrics.values():
            data = getattr(metric, metric.WhichOneof("data"))
            sets = [tuple((a.key, str(a.value)) for a in p.attributes) for p in data.data_points]
            assert len(sets) == len(set(sets)), metric.name
        (refused,) = metrics["gym.checkpoint.events_total"].sum.data_points
        assert refused.as_int == 3
        (duration,) = metrics["gym.checkpoint.operation_duration_ms"].histogram.data_points
        assert duration.count == 3
        assert duration.sum == pytest.approx(2.999999 + 5.999999 + 8.999999)
        assert sum(duration.bucket_counts) == 3
        (records,) = metrics["gym.checkpoint.records_total"].sum.data_points
        assert records.as_int == 6
        (open_now,) = metrics["gym.checkpoint.open_operations"].sum.data_points
        assert open_now.as_int == 1  # the fourth kind's operation, still open
        (oldest,) = metrics["gym.checkpoint.oldest_open_s"].gauge.data_points
        assert oldest.as_double > 0
