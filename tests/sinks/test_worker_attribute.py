"""The worker attribute: on spans (SDK sink and our OTLP encoder) and JSON lines, never on metrics."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import JsonLinesSink, read_events
from ckpt_events.sinks.otel import MetricSink, SpanSink
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from ckpt_events.vocab import Attr


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def _share(bus: Bus) -> None:
    """One commit on worker 1 and one on a single-process participant (no worker)."""
    for worker, instance in ((1, "agent-0"), (None, "agent-9")):
        tel = Telemetry(bus, kind="agent", instance=instance, worker=worker)
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("export") as step:
                step.set(records=3)
            op.set(records=3, bytes=10)
        tel.refused("stale_attempt", checkpoint_id="c1")


async def test_span_sink_names_the_worker_on_every_span_of_a_worker() -> None:
    """SpanSink: a worker's operation and step spans carry the worker; others have no such key."""
    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        bus.subscribe(SpanSink(exporter, blocking=False))
        await _share(bus)
        await bus.flush()
    spans = exporter.get_finished_spans()
    assert len(spans) == 4
    # Each participant's commit is its own trace: worker 1's two spans, agent-9's two spans.
    by_trace: dict[int, list[object]] = {}
    for span in spans:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span.attributes.get(Attr.WORKER))
    assert sorted(by_trace.values(), key=str) == [[1, 1], [None, None]]


async def test_otlp_encoder_names_the_worker() -> None:
    """The protobuf body holds the worker as an int attribute on the worker's spans only."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        await _share(bus)
        await bus.flush()
    finished = [e for e in keep.events if type(e).__name__.endswith("Finished")]
    body, count = SpanEncoder({"service.name": "t"}).protobuf(finished)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = [MessageToDict(s) for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert count == len(spans) == 4
    named = [a["value"] for s in spans for a in s.get("attributes", []) if a["key"] == Attr.WORKER]
    assert named == [{"intValue": "1"}, {"intValue": "1"}]


async def test_metric_points_never_carry_the_worker(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """Metrics: a worker's events are counted, but no point has a worker attribute (cardinality)."""
    async with Bus() as bus:
        bus.subscribe(ckpt_metric_sink)
        await _share(bus)
        await bus.flush()
    data = ckpt_metric_reader.get_metrics_data()
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    assert len(points) >= 2
    assert not any(Attr.WORKER in p.attributes or "worker" in p.attributes for p in points)


async def test_json_lines_carry_the_worker(tmp_path: Path) -> None:
    """A JSON line of a worker's event has ``worker`` and decodes back with it."""
    stream = io.BytesIO()
    async with Bus() as bus:
        sink = JsonLinesSink(stream)
        bus.subscribe(sink)
        await _share(bus)
        await bus.flush()
        await sink.aclose()
    lines = stream.getvalue().splitlines()
    path = tmp_path / "events.jsonl"
    path.write_bytes(stream.getvalue())
    events = [event for _, event in read_events(path)]
    assert {e.worker for e in events if e.instance == "agent-0"} == {1}
    assert {e.worker for e in events if e.instance == "agent-9"} == {None}
    assert any(b'"worker":1' in line for line in lines)
