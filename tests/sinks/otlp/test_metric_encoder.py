"""Checkpoint metrics as OTLP export requests (``ckpt_events.sinks.otlp._metric_encoder``), written by
hand from our cumulative totals and read back by opentelemetry-proto."""

from __future__ import annotations

from typing import Any

import msgspec

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
