"""One value OTLP or JSON cannot carry costs that value, never its span or its batch.

A lone surrogate, an int outside int64 and a NaN among 200 spans: OpenTelemetry's encoder drops
the one attribute (its ``_encode_attributes`` skips what protobuf refuses) and keeps the span;
ours does the same, counts it, and writes NaN and the infinities as OTLP/JSON's strings.
"""

from __future__ import annotations

import io
import math
from typing import Any

import msgspec
from google.protobuf.json_format import MessageToDict, Parse
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, OperationFinished, Redactor, Telemetry
from ckpt_events.sinks.jsonl import JsonLinesSink, read_events
from ckpt_events.sinks.otel import SpanSink
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder

SPANS = 200
#: (attribute or field, value) set on one operation each; every one is a value the wire cannot carry.
BAD: list[tuple[str, Any]] = [
    ("user.value", "x\ud800"),
    ("user.big", 2**63),
    ("user.huge", 2**64),
    ("user.tiny", -(2**63) - 1),
    ("records", 2**70),
]


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def _events(*, sink: Any = None) -> list[Any]:
    """200 operations; the first few carry one bad value each, the rest are ordinary."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        if sink is not None:
            bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for n in range(SPANS):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.n", n)
                if n < len(BAD):
                    name, value = BAD[n]
                    if name == "records":
                        # set() refuses it; an event built by hand and emitted can carry it.
                        op._records = value
                    else:
                        op.set_attribute(name, value)
        await bus.flush()
    return [event for event in keep.events if isinstance(event, OperationFinished)]


def _attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: a["value"] for a in span.get("attributes", [])}


def _spans(request: ExportTraceServiceRequest) -> dict[str, dict[str, Any]]:
    return {
        span.span_id.hex(): MessageToDict(span)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }


async def test_protobuf_keeps_every_span_and_drops_only_the_bad_values_as_opentelemetry_does() -> None:
    """200 spans decode; each bad value's attribute is gone exactly as OpenTelemetry's encoder drops it."""
    events = await _events()
    encoder = SpanEncoder({"service.name": "t"})
    body, count = encoder.protobuf(events)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    ours = _spans(request)
    assert count == len(ours) == SPANS
    assert encoder.invalid_values == len(BAD)
    exporter = InMemorySpanExporter()
    SpanSink(exporter, resource=Resource({"service.name": "t"}), redactor=Redactor(), blocking=False).handle(
        events
    )
    theirs = _spans(encode_spans(exporter.get_finished_spans()))
    for n, (name, _value) in enumerate(BAD):
        span_id = f"{events[n].span_id:016x}"
        key = "gym.checkpoint.records" if name == "records" else name
        assert key not in _attributes(ours[span_id])
        assert _attributes(ours[span_id]) == _attributes(theirs[span_id])
        assert _attributes(ours[span_id])["user.n"] == {"intValue": str(n)}


async def test_json_keeps_every_span_drops_the_bad_values_and_spells_nan_as_otlp_json_does() -> None:
    """The OTLP/JSON body parses with protobuf's JSON mapping to 200 spans; NaN, inf, -inf round-trip."""
    events = await _events()
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for value in (math.nan, math.inf, -math.inf):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.ratio", value)
        await bus.flush()
    floats = [event for event in keep.events if isinstance(event, OperationFinished)]
    encoder = SpanEncoder({"service.name": "t"})
    body, count = encoder.json(events + floats)
    assert count == SPANS + 3
    assert encoder.invalid_values == len(BAD)
    # Protobuf's JSON mapping reads the ids as base64 (OTLP/JSON writes hex): spans in order.
    request = Parse(body.decode(), ExportTraceServiceRequest())
    [spans] = [
        [MessageToDict(span) for span in s.spans] for r in request.resource_spans for s in r.scope_spans
    ]
    assert len(spans) == SPANS + 3
    for n, (name, _value) in enumerate(BAD):
        key = "gym.checkpoint.records" if name == "records" else name
        assert key not in _attributes(spans[n])
        assert _attributes(spans[n])["user.n"] == {"intValue": str(n)}
    [parsed] = [list(s.spans) for r in request.resource_spans for s in r.scope_spans]
    written = [
        next(a.value.double_value for a in span.attributes if a.key == "user.ratio")
        for span in parsed[SPANS:]
    ]
    assert math.isnan(written[0]) and written[1:] == [math.inf, -math.inf]
    assert b'"doubleValue":"NaN"' in body and b'"doubleValue":"-Infinity"' in body


async def test_jsonl_writes_every_event_with_the_bad_text_replaced_and_counted() -> None:
    """A lone surrogate costs its one character (U+FFFD), not 400 lines; the sink counts it."""
    stream = io.BytesIO()
    sink = JsonLinesSink(stream)
    events = await _events(sink=sink)
    stats = sink.stats()
    assert (stats.events, stats.failed, stats.replaced_values) == (2 * SPANS, 0, 1)
    stream.seek(0)
    read = [event for _, event in read_events(stream)]
    assert len(read) == 2 * SPANS
    finished = [event for event in read if isinstance(event, OperationFinished)]
    assert [event.span_id for event in finished] == [event.span_id for event in events]
    assert finished[0].attributes is not None and finished[0].attributes["user.value"] == "x\ufffd"
    assert finished[1].attributes == {"user.n": 1, "user.big": 2**63}  # JSON carries any int
    assert msgspec.json.decode(stream.getvalue().splitlines()[-1])["type"] == "operation_finished"


async def test_jsonl_reads_a_nan_attribute_back_as_nan() -> None:
    """JSON has no NaN: written as null, read back as NaN, the event kept (it was a corrupt line)."""
    stream = io.BytesIO()
    sink = JsonLinesSink(stream)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for value in (math.nan, math.inf, 0.5):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.ratio", value)
    stream.seek(0)
    finished = [event for _, event in read_events(stream) if isinstance(event, OperationFinished)]
    assert len(finished) == 3
    ratios = [event.attributes["user.ratio"] for event in finished if event.attributes is not None]
    assert math.isnan(ratios[0]) and math.isnan(ratios[1]) and ratios[2] == 0.5
