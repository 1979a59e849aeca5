"""The caller's W3C ``tracestate`` on the spans we export (W3C Trace Context: a participant passes
it on; vendors read ``dd=``, ``ot=th:`` on the exported spans): the SDK span sink's
``SpanContext.trace_state``, OTLP's ``Span.trace_state`` at a real receiver (protobuf and JSON, in
process and through the export process), JSON lines (and a log written before the field), and
the OTLP file reader. Every part is real: the SDK's in-memory exporter, a receiver on 127.0.0.1,
files, the export child."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, OperationFinished, OperationStarted, Telemetry
from ckpt_events.sinks import JsonLinesSink, configure, read_events
from ckpt_events.sinks.otel import OtlpSpanSink, SpanSink
from ckpt_events.sinks.otlp._reader import read_otlp
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from ckpt_events.vocab import Kind, Operation
from tests.participants.cli.otlp_receiver import Received, otlp_receiver

pytestmark = pytest.mark.anyio

_CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_CONTROLLER_CALLER = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
#: As a vendor's caller sends it: optional whitespace, normalised by ``parse_tracestate``.
_HEADER = "ot=th:8 , dd=s:1;t.dm:-4"
_STATE = "ot=th:8,dd=s:1;t.dm:-4"
#: Span name -> the tracestate its span must carry ("" for none).
_EXPECTED = {
    "gym.checkpoint.prepare": _STATE,
    "gym.checkpoint.wait_ready": _STATE,
    "gym.checkpoint.commit": _STATE,  # a local child operation of the prepare
    "gym.checkpoint.restore": "",  # a root of its own: no caller, no tracestate
    "gym.checkpoint.collection.checkpoint": _STATE,
    "gym.checkpoint.coordinate.prepare": _STATE,
    "gym.checkpoint.coordinate.prepare.agent": _STATE,
}


def _traffic(bus: Bus) -> None:
    """A participant's operation continued from a caller with a tracestate, its step and a
    local child; a root operation without one; a controller's collection, coordinate, stage."""
    tel = Telemetry(bus, kind="agent", instance="agent-0")
    with tel.operation("prepare", checkpoint_id="c1", traceparent=_CALLER).with_tracestate(_HEADER) as op:
        with op.step("wait_ready"):
            pass
        with tel.operation("commit", checkpoint_id="c1", parent=op):
            pass
    with tel.operation("restore", checkpoint_id="c1"):
        pass
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    collection = ctl.collection("checkpoint", checkpoint_id="c1", traceparent=_CONTROLLER_CALLER)
    with collection.with_tracestate(_HEADER) as collection:
        with ctl.coordinate("prepare", checkpoint_id="c1", parent=collection) as coordinate:
            with coordinate.stage("agent"):
                pass


async def test_the_sdk_span_sink_puts_it_on_every_span_of_the_callers_trace() -> None:
    """``SpanContext.trace_state`` of each span (and of its parent's context) is the caller's,
    as the SDK's own spans carry theirs; a span of a trace of its own has none."""
    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        bus.subscribe(SpanSink(exporter))
        _traffic(bus)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {name: span.context.trace_state.to_header() for name, span in spans.items()} == _EXPECTED
    prepare = spans["gym.checkpoint.prepare"]
    assert prepare.parent is not None and prepare.parent.is_remote
    assert prepare.parent.trace_state.to_header() == _STATE
    assert dict(prepare.context.trace_state) == {"ot": "th:8", "dd": "s:1;t.dm:-4"}
    step = spans["gym.checkpoint.wait_ready"]
    assert step.parent is not None and step.parent.trace_state.to_header() == _STATE


@pytest.mark.parametrize("value", ["Upper=1,not a member", ["ot=th:8"]])
async def test_a_malformed_tracestate_on_a_hand_built_event_is_left_out_not_the_span(value: Any) -> None:
    """An event built by hand (or read from an edited log) may hold anything (msgspec does not
    check a Struct's fields when it is built): the span goes out without it, in the SDK sink
    and the OTLP encoder alike."""
    bad = OperationFinished(Kind.AGENT, "agent-0", 7, 8, 1, 2, Operation.PREPARE, tracestate=value)
    exporter = InMemorySpanExporter()
    SpanSink(exporter, blocking=False).handle([bad])
    [span] = exporter.get_finished_spans()
    assert span.context.trace_state.to_header() == ""
    body, count = SpanEncoder({"service.name": "t"}).protobuf([bad])
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    assert count == 1 and request.resource_spans[0].scope_spans[0].spans[0].trace_state == ""
    [span_json] = msgspec.json.decode(SpanEncoder({}).json([bad])[0])["resourceSpans"][0]["scopeSpans"][0][
        "spans"
    ]
    assert "traceState" not in span_json


def _received_states(received: Received) -> dict[str, str]:
    """Span name -> its trace_state, over every trace request the receiver got."""
    states: dict[str, str] = {}
    for path, (content_type, body) in zip(received.paths, received.bodies, strict=False):
        if path != "/v1/traces":
            continue
        if content_type == "application/json":
            for resource in msgspec.json.decode(body).get("resourceSpans", []):
                for scope in resource["scopeSpans"]:
                    for span in scope["spans"]:
                        states[span["name"]] = span.get("traceState", "")
            continue
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    states[span.name] = span.trace_state
    return states


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
async def test_otlp_spans_carry_it_to_a_real_receiver(protocol: str) -> None:
    """``Span.trace_state`` (``traceState`` in JSON) as the receiver decodes it."""
    with otlp_receiver() as received:
        sink = OtlpSpanSink(received.url, protocol=protocol, linger=0.05)
        async with Bus() as bus:
            bus.subscribe(sink)
            _traffic(bus)
    assert sink.stats().exported == len(_EXPECTED)
    assert _received_states(received) == _EXPECTED


async def test_the_export_process_carries_it_to_otlp_and_json_lines(tmp_path: Path) -> None:
    """Through the export child (the handles' records on its pipe): the spans it exports and
    the log it writes carry the caller's tracestate."""
    log = tmp_path / "events.jsonl"
    with otlp_receiver() as received:
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=log, otlp_endpoint=received.url, export_process=True)
            _traffic(bus)
            await bus.flush()
            await configured.aclose()
    assert _received_states(received) == _EXPECTED
    states = {}
    for _, event in read_events(log):
        states[type(event).__name__, getattr(event, "operation", None)] = event.tracestate
    assert states[("OperationStarted", Operation.PREPARE)] == _STATE
    assert states[("OperationFinished", Operation.COMMIT)] == _STATE
    assert states[("OperationFinished", Operation.RESTORE)] is None


async def test_json_lines_round_trip_it_and_an_older_log_reads_as_none(tmp_path: Path) -> None:
    """Written and read back as it was; a line of a log written before the field reads ``None``."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        _traffic(bus)
    events = [event for _, event in read_events(log)]
    spans = {}
    for event in events:
        if type(event).__name__.endswith("Finished"):
            spans[event.span_id] = event
    assert sorted(event.tracestate or "" for event in spans.values()) == sorted(_EXPECTED.values())
    older = (
        b'{"type":"operation_started","kind":"agent","instance":"a0","trace_id":"0af7651916cd43dd8448eb211c80319c",'
        b'"span_id":"a0a81fffd5b36ee9","start_ns":1,"operation":"prepare","checkpoint_id":null,'
        b'"parent_span_id":"b7ad6b7169203331","parent_remote":true,"sampled":true,"worker":null}\n'
    )
    old = tmp_path / "old.jsonl"
    old.write_bytes(older)
    [(_, event)] = list(read_events(old))
    assert isinstance(event, OperationStarted) and event.tracestate is None


async def test_the_otlp_file_reader_reads_it_back(tmp_path: Path) -> None:
    """A collector's file of our OTLP/JSON spans reads back as events holding their tracestate."""
    kept: list[Any] = []

    class Keep:
        def handle(self, batch: list[Any]) -> None:
            kept.extend(batch)

    async with Bus() as bus:
        bus.subscribe(Keep())
        _traffic(bus)
    finished = [event for event in kept if type(event).__name__.endswith("Finished")]
    path = tmp_path / "traces.json"
    path.write_bytes(SpanEncoder({"service.name": "t"}).json(finished)[0] + b"\n")
    skipped: list[str] = []
    read = {event.span_id: event.tracestate for _, event in read_otlp(path, skipped.append)}
    assert skipped == []
    assert read == {event.span_id: event.tracestate for event in finished}


@pytest.mark.e2e
async def test_a_served_participant_exports_the_tracestate_its_request_came_with(tmp_path: Path) -> None:
    """``ckpt-events serve`` (a real uvicorn process) reached with a ``traceparent`` and two
    ``tracestate`` header fields (HTTP joins them with a comma): the spans it exports to a
    receiver on 127.0.0.1 carry the joined tracestate, the server span and its step alike."""
    import anyio
    import httpx

    from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
    from ckpt_events.participants.protocol import CONTROL_PREFIX
    from tests.participants.helpers import body

    token_file = write_token_file(tmp_path / "token", "served-token")
    with otlp_receiver() as received:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": received.url, "OTEL_BSP_SCHEDULE_DELAY": "20"}
        process = ServerProcess(
            "resources", instance="resources-0", token_file=token_file, log_dir=tmp_path, env=env
        )
        try:
            await process.wait_listening(30.0)
            headers = [
                ("authorization", "Bearer served-token"),
                ("traceparent", _CALLER),
                ("tracestate", "dd=s:1"),
                ("tracestate", "ot=th:8"),
            ]
            async with httpx.AsyncClient(base_url=process.url) as http:
                reply = await http.post(CONTROL_PREFIX + "/prepare", json=body("c-ts"), headers=headers)
                assert reply.status_code == 200, reply.text
            with anyio.fail_after(15):
                while "gym.checkpoint.prepare" not in _received_states(received):
                    await anyio.sleep(0.05)
        finally:
            process.terminate()
    states = _received_states(received)
    assert states["gym.checkpoint.prepare"] == "dd=s:1,ot=th:8"
    assert {state for name, state in states.items() if name != "gym.checkpoint.prepare"} <= {"dd=s:1,ot=th:8"}
