"""How our OTLP/JSON bodies write each 64-bit integer, field by field.

OTLP/JSON is protobuf's JSON mapping, with trace and span ids as hex: an int64, uint64 or fixed64
is a decimal string (a reader takes a number too), a 32-bit integer or an enum a number. The span
body follows it everywhere. The metric body writes its counts (``count``, ``bucketCounts``,
``asInt``) as numbers, on purpose: rotel's JSON decoder drops string counts and ``asInt`` (checked
against rotel-agent 0.0.1-alpha10: the string form fails ``test_every_point_reaches_rotel...``),
while every protobuf JSON reader takes numbers; its timestamps are strings.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks._metric_totals import MetricTotals
from ckpt_events.sinks.otel import AttributeLimits
from ckpt_events.sinks.otlp._metric_encoder import MetricEncoder
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from tests.sinks.otlp.test_metric_sink import _event_mix


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def _events() -> list[Any]:
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        await _event_mix(bus)
        tel = Telemetry(bus, kind="agent", instance="a0")
        try:
            with tel.operation("restore", checkpoint_id="c1") as op:
                op.set_attribute("user.big", 2**62)
                op.set_attribute("user.extra", "x")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        await bus.flush()
    return keep.events


async def test_span_json_writes_64_bit_integers_as_strings_and_ids_as_hex() -> None:
    """Times and intValue are decimal strings, ids lowercase hex, kind, flags, status code and the
    dropped attributes count (32-bit) numbers."""
    events = await _events()
    body, count = SpanEncoder({"service.name": "t"}, limits=AttributeLimits(None, 3)).json(events)
    spans = msgspec.json.decode(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans) == count > 0
    for span in spans:
        assert len(span["traceId"]) == 32 and int(span["traceId"], 16) >= 0
        assert len(span["spanId"]) == 16 and span["spanId"] == span["spanId"].lower()
        assert len(span.get("parentSpanId", "0" * 16)) == 16
        for name in ("startTimeUnixNano", "endTimeUnixNano"):
            assert isinstance(span[name], str) and span[name].isdigit()
        assert isinstance(span["kind"], int) and isinstance(span["flags"], int)
        for event in span.get("events", []):
            assert isinstance(event["timeUnixNano"], str) and event["timeUnixNano"].isdigit()
        for pair in span["attributes"]:
            if "intValue" in pair["value"]:
                assert isinstance(pair["value"]["intValue"], str)
        if "status" in span:
            assert isinstance(span["status"]["code"], int)
        if "droppedAttributesCount" in span:
            assert isinstance(span["droppedAttributesCount"], int)
    assert any(span.get("droppedAttributesCount") for span in spans)
    whole = msgspec.json.decode(SpanEncoder({"service.name": "t"}).json(events)[0])
    pairs = [
        pair for span in whole["resourceSpans"][0]["scopeSpans"][0]["spans"] for pair in span["attributes"]
    ]
    assert {"key": "user.big", "value": {"intValue": str(2**62)}} in pairs


async def test_metric_json_writes_timestamps_as_strings_and_counts_as_numbers() -> None:
    """startTimeUnixNano and timeUnixNano: decimal strings; count, bucketCounts, asInt: numbers
    (see the module docstring for why); sums, min, max, asDouble: numbers."""
    events = await _events()
    totals = MetricTotals(2000)
    totals.add(events)
    request = msgspec.json.decode(MetricEncoder({"service.name": "t"}).json(totals, 1, 2**62))
    metrics = request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    kinds = set()
    for metric in metrics:
        for kind in ("sum", "gauge", "histogram"):
            if kind not in metric:
                continue
            kinds.add(kind)
            for point in metric[kind]["dataPoints"]:
                assert point["timeUnixNano"] == str(2**62)
                if kind != "gauge":
                    assert point["startTimeUnixNano"] == "1"
                if kind == "sum":
                    assert isinstance(point["asInt"], int)
                if kind == "histogram":
                    assert isinstance(point["count"], int)
                    assert all(isinstance(n, int) for n in point["bucketCounts"])
                    assert sum(point["bucketCounts"]) == point["count"]
                if kind == "gauge":
                    assert isinstance(point["asDouble"], float)
    assert {"sum", "histogram"} <= kinds
