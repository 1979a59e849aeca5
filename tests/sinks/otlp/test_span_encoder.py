"""The OTLP encoder writes from events what SpanSink + OpenTelemetry's encoder write from spans."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import (
    Bus,
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    Redactor,
    StageFinished,
    StepFinished,
    Telemetry,
)
from ckpt_events.sinks._span_attrs import span_name_and_attributes, span_plan
from ckpt_events.sinks.otel import AttributeLimits, SpanSink
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from ckpt_events.sinks.otlp._wire import json_attributes
from ckpt_events.vocab import CollectionAction, Kind, Operation, SpanKind, Step, span_kind_of
from tests.sinks.helpers import every_event_type

_KIND_NAMES = {SpanKind.INTERNAL: "SPAN_KIND_INTERNAL", SpanKind.SERVER: "SPAN_KIND_SERVER"}
_KIND_NAMES[SpanKind.CLIENT] = "SPAN_KIND_CLIENT"


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def _events() -> list[Any]:
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        await every_event_type(bus)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        try:
            with tel.operation("restore", checkpoint_id="c2") as op:
                op.set_attribute("user.flag", True)
                op.set_attribute("user.ratio", 0.25)
                op.set_attribute("user.token", "secret")
                raise RuntimeError("no space left")
        except RuntimeError:
            pass
        caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        with tel.operation("commit", checkpoint_id="c2", traceparent=caller).with_tracestate("ot=th:8") as op:
            with op.step("write"):
                pass
        await bus.flush()
    return [event for event in keep.events if type(event).__name__.endswith("Finished")]


def _spans_of(request: ExportTraceServiceRequest) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found[span.span_id.hex()] = MessageToDict(span)
    return found


def _without(span: dict[str, Any], *names: str) -> dict[str, Any]:
    # An unset status is empty either way; OpenTelemetry's encoder writes it, ours leaves it out.
    return {key: value for key, value in span.items() if key not in names and value != {}}


async def test_protobuf_matches_span_sink_through_opentelemetry_encoder() -> None:
    """Each span: ids, parent, name, times, attributes, status, exception event equal; kind: span_kind_of."""
    events = await _events()
    redactor = Redactor()
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter, resource=Resource({"service.name": "t"}), redactor=redactor, blocking=False)
    sink.handle(events)
    theirs = _spans_of(encode_spans(exporter.get_finished_spans()))
    body, count = SpanEncoder({"service.name": "t"}, redactor).protobuf(events)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    ours = _spans_of(request)
    assert count == len(theirs) == len(ours) >= 6
    assert set(ours) == set(theirs)
    by_id = {f"{event.span_id:016x}": event for event in events}
    for span_id, span in ours.items():
        assert span["kind"] == _KIND_NAMES[span_kind_of(by_id[span_id])]
        assert _without(span, "kind", "flags") == _without(theirs[span_id], "kind", "flags")
    assert any(span.get("status", {}).get("code") == "STATUS_CODE_ERROR" for span in ours.values())
    [resource] = request.resource_spans
    assert MessageToDict(resource.resource) == {
        "attributes": [{"key": "service.name", "value": {"stringValue": "t"}}]
    }


async def test_json_carries_the_same_spans_as_protobuf() -> None:
    """The OTLP/JSON body holds the protobuf body's spans (hex ids, 64-bit ints as strings)."""
    events = await _events()
    encoder = SpanEncoder({"service.name": "t"})
    body, count = encoder.protobuf(events)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    expected = _spans_of(request)
    decoded = msgspec.json.decode(encoder.json(events)[0])
    [resource_spans] = decoded["resourceSpans"]
    [scope_spans] = resource_spans["scopeSpans"]
    spans = scope_spans["spans"]
    assert len(spans) == count == len(expected)
    for span in spans:
        want = expected[span["spanId"]]
        assert span["name"] == want["name"]
        assert span.get("parentSpanId") == (
            bytes.fromhex(_b64hex(want["parentSpanId"])).hex() if "parentSpanId" in want else None
        )
        assert span["startTimeUnixNano"] == want["startTimeUnixNano"]
        assert [a["key"] for a in span["attributes"]] == [a["key"] for a in want.get("attributes", [])]
        assert [a["value"] for a in span["attributes"]] == [a["value"] for a in want.get("attributes", [])]
        assert span.get("status", {}).get("message") == want.get("status", {}).get("message")


async def test_protobuf_body_is_protobufs_own_serialization_byte_for_byte() -> None:
    """Every field in field-number order, as protobuf writes it: the body equals the official
    serialization of what it decodes to (roots, local and remote parents, a tracestate, an error,
    and ids at their extremes, packed big-endian in one struct with their tags)."""
    edges = [
        OperationFinished(
            kind="agent",
            instance="a",
            operation="commit",
            start_ns=1,
            end_ns=2,
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent,
            parent_remote=parent is not None,
            tracestate=state,
        )
        for trace_id, span_id, parent, state in [
            ((1 << 128) - 1, (1 << 64) - 1, (1 << 64) - 1, None),
            (1, 1, None, None),
            (1 << 127, 1 << 63, 1, "ot=th:8"),
            (1 << 64, 2, None, "ot=th:8"),
        ]
    ]
    events = [*await _events(), *edges]
    body, count = SpanEncoder({"service.name": "t"}).protobuf(events)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    assert request.SerializeToString() == body
    spans = list(request.resource_spans[0].scope_spans[0].spans)
    assert count == len(spans) == len(events)
    ids = [(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.trace_state) for s in spans[-4:]]
    assert ids == [
        ("f" * 32, "f" * 16, "f" * 16, ""),
        (f"{1:032x}", f"{1:016x}", "", ""),
        (f"{1 << 127:032x}", f"{1 << 63:016x}", f"{1:016x}", "ot=th:8"),
        (f"{1 << 64:032x}", f"{2:016x}", "", "ot=th:8"),
    ]


def _b64hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _every_span_shape() -> list[Any]:
    """A finished event of every class for every name it can have, with a local and a remote parent."""
    shapes: list[tuple[type, str, list[Any]]] = [
        (OperationFinished, "operation", list(Operation)),
        (CoordinateFinished, "operation", list(Operation)),
        (StepFinished, "step", list(Step)),
        (StageFinished, "stage", list(Kind)),
        (CollectionFinished, "action", list(CollectionAction)),
    ]
    events = []
    span_id = 1
    for cls, field, values in shapes:
        for value in values:
            for remote in (False, True):
                span_id += 1
                ids = {"trace_id": 7, "span_id": span_id, "parent_span_id": 1, "parent_remote": remote}
                events.append(
                    cls(kind="controller", instance="c", start_ns=1, end_ns=2, **{field: value}, **ids)
                )
    return events


def test_the_cached_span_kind_is_span_kind_of_for_every_span_name() -> None:
    """The encoder caches name and kind per (name, class, remote parent): for every span name of
    every class, in one batch through one encoder, the kind written is ``span_kind_of``'s."""
    events = _every_span_shape()
    request = ExportTraceServiceRequest()
    request.ParseFromString(SpanEncoder({"service.name": "t"}).protobuf(events + events[::-1])[0])
    spans = _spans_of(request)
    by_id = {f"{event.span_id:016x}": event for event in events}
    assert len(spans) >= 40
    for span_id, span in spans.items():
        assert span["kind"] == _KIND_NAMES[span_kind_of(by_id[span_id])], span["name"]


async def test_equal_values_of_other_types_are_not_confused_by_the_cache() -> None:
    """1, True and 1.0 compare equal; through one encoder each is still written as its own type."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for value in (1, True, 1.0, "1", 1, True):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.n", value)
        await bus.flush()
    events = [event for event in keep.events if type(event).__name__.endswith("Finished")]
    request = ExportTraceServiceRequest()
    request.ParseFromString(SpanEncoder({"service.name": "t"}).protobuf(events)[0])
    by_id = _spans_of(request)
    written = [
        next(a["value"] for a in by_id[f"{event.span_id:016x}"]["attributes"] if a["key"] == "user.n")
        for event in events
    ]
    assert written == [
        {"intValue": "1"},
        {"boolValue": True},
        {"doubleValue": 1.0},
        {"stringValue": "1"},
        {"intValue": "1"},
        {"boolValue": True},
    ]


async def test_a_large_request_and_a_large_span_decode_whole() -> None:
    """Lengths past one varint byte pair (a 20 KiB attribute, a request of hundreds of spans) are
    written right: the request parses to every span, the long value intact, renew skipped."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for n in range(300):
            with tel.operation("renew" if n == 7 else "commit", checkpoint_id=f"c{n}") as op:
                if n == 3:
                    op.set_attribute("user.blob", "x" * 20_000)
        await bus.flush()
    events = [event for event in keep.events if type(event).__name__.endswith("Finished")]
    body, count = SpanEncoder({"service.name": "t"}).protobuf(events)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = _spans_of(request)
    assert count == len(spans) == 299 and len(body) > 40_000
    blob = [a for span in spans.values() for a in span.get("attributes", []) if a["key"] == "user.blob"]
    assert blob == [{"key": "user.blob", "value": {"stringValue": "x" * 20_000}}]


async def test_every_span_carries_the_rules_attributes() -> None:
    """Spans without user attributes take a fast path (the plan's fields, no dict): for every
    event type and every span name, what is written is ``span_name_and_attributes``' dict."""
    events = await _events() + _every_span_shape()
    request = ExportTraceServiceRequest()
    request.ParseFromString(SpanEncoder({"service.name": "t"}).protobuf(events)[0])
    spans = _spans_of(request)
    redactor = Redactor()
    checked = 0
    for event in events:
        made = span_name_and_attributes(event, redactor)
        if made is None:
            continue
        span = spans[f"{event.span_id:016x}"]
        assert span["name"] == made[0]
        assert span.get("attributes", []) == json_attributes(made[1]), made[0]
        checked += 1
    assert checked >= 50


def test_no_span_plan_names_an_attribute_twice() -> None:
    """The fast path writes each planned field in turn, which equals the dict only if no
    attribute name repeats within a plan."""
    for event in _every_span_shape():
        plan = span_plan(event)
        if plan is not None:
            keys = [key for _, key in plan[1]]
            assert len(keys) == len(set(keys)), plan[0]


async def test_the_pair_caches_keep_keys_and_values_apart() -> None:
    """Through one encoder, more user keys than it caches, one value under several keys and several
    values under one key (past the per-key bound) are each written as their own pair."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0", worker=3)
        for n in range(1_200):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute(f"user.k{n % 100}", "same")
                op.set(records=n)
        await bus.flush()
    events = [event for event in keep.events if isinstance(event, OperationFinished)]
    encoder = SpanEncoder({"service.name": "t"})
    request = ExportTraceServiceRequest()
    request.ParseFromString(encoder.protobuf(events + events)[0])
    by_id = _spans_of(request)
    for n, event in enumerate(events):
        attributes = {a["key"]: a["value"] for a in by_id[f"{event.span_id:016x}"]["attributes"]}
        assert attributes[f"user.k{n % 100}"] == {"stringValue": "same"}
        assert attributes["nemo.gym.checkpoint.records"] == {"intValue": str(n)}
        assert attributes["nemo.gym.checkpoint.worker"] == {"intValue": "3"}


async def test_a_failed_span_carries_error_type_in_protobuf_and_json_as_span_sink_does() -> None:
    """``error.type`` (the exception's type) on each failed span, in both bodies, equal to
    SpanSink's through OpenTelemetry's encoder: alone, with user attributes
    (the attribute path), and under a count limit that keeps it before the user's."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for extra in ({}, {"user.a": 1, "user.b": "x"}):
            try:
                with tel.operation("commit", checkpoint_id="c1") as op:
                    with op.step("write"):
                        for key, value in extra.items():
                            op.set_attribute(key, value)
                        raise OSError("no space left")
            except OSError:
                pass
        await bus.flush()
    events = [event for event in keep.events if type(event).__name__.endswith("Finished")]
    assert len(events) == 4
    for limits in (None, AttributeLimits(count=5)):
        exporter = InMemorySpanExporter()
        SpanSink(
            exporter, resource=Resource({"service.name": "t"}), blocking=False, attribute_limits=limits
        ).handle(events)
        theirs = _spans_of(encode_spans(exporter.get_finished_spans()))
        encoder = SpanEncoder({"service.name": "t"}, limits=limits)
        request = ExportTraceServiceRequest()
        request.ParseFromString(encoder.protobuf(events)[0])
        ours = _spans_of(request)
        [json_spans] = [
            s["spans"]
            for r in msgspec.json.decode(encoder.json(events)[0])["resourceSpans"]
            for s in r["scopeSpans"]
        ]
        for span_id, span in ours.items():
            assert _without(span, "kind", "flags") == _without(theirs[span_id], "kind", "flags")
            pairs = {pair["key"]: pair["value"] for pair in span["attributes"]}
            assert pairs["error.type"] == {"stringValue": "OSError"}, (limits, span["name"])
        for span in json_spans:
            assert {"key": "error.type", "value": {"stringValue": "OSError"}} in span["attributes"]
