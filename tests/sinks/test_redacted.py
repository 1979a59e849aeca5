"""An exception's text is redacted by every sink that writes it (the JSON-lines log, a
``LoggingSink`` record's event, a span's status description and ``exception.message``, through
OpenTelemetry and through our OTLP encoder, protobuf and JSON), with the sink's ``Redactor``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, OperationFinished, Redactor, Telemetry
from ckpt_events.sinks import JsonLinesSink, LoggingSink
from ckpt_events.sinks.otel import SpanSink
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder

#: A failure whose text holds a URL's password, a key=value secret and a bearer token.
LEAKY = (
    "cannot reach https://svc:hunter2@db.internal:5432/x (password=hunter2, "
    "Authorization: Bearer eyJhbGciOi.J9sig) for checkpoint_id=c1"
)
SCRUBBED = (
    "cannot reach https://[REDACTED]@db.internal:5432/x (password=[REDACTED], "
    "Authorization: Bearer [REDACTED]) for checkpoint_id=c1"
)


async def _failed_commit(*sinks: Any) -> None:
    async with Bus() as bus:
        for sink in sinks:
            bus.subscribe(sink)
        tel = Telemetry(bus, kind="model", instance="m0")
        with pytest.raises(ConnectionError), tel.operation("commit", checkpoint_id="c1"):
            raise ConnectionError(LEAKY)


def _messages_written(
    log: Path, caplog: pytest.LogCaptureFixture, redactor: Redactor | None, events: list[Any]
) -> dict[str, list[str]]:
    """Every place the JSON-lines log, the logging records and our OTLP encoder (of ``events``)
    put the exception's text, by sink."""
    found: dict[str, list[str]] = {}
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    found["jsonl"] = [line["error_message"] for line in lines if line.get("error_message")]
    found["logging"] = [
        r.ckpt_event.error_message  # type: ignore[attr-defined]
        for r in caplog.records
        if isinstance(getattr(r, "ckpt_event", None), OperationFinished)
    ]
    encoder = SpanEncoder({"service.name": "t"}, redactor)
    request = ExportTraceServiceRequest()
    request.ParseFromString(encoder.protobuf(events)[0])
    as_json = json.loads(encoder.json(events)[0])
    for name, spans in (
        ("otlp protobuf", MessageToDict(request)["resourceSpans"][0]["scopeSpans"][0]["spans"]),
        ("otlp json", as_json["resourceSpans"][0]["scopeSpans"][0]["spans"]),
    ):
        found[name] = [
            text
            for span in spans
            for text in (
                span["status"]["message"],
                *(a["value"]["stringValue"] for e in span["events"] for a in e["attributes"]),
            )
        ]
    return found


@pytest.mark.parametrize("redactor", [None, Redactor({"password"}), Redactor(messages=False)])
async def test_every_sink_redacts_the_error_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, redactor: Redactor | None
) -> None:
    """A commit failing with a URL's password, ``password=...`` and a bearer token in its text:
    every sink wrote them verbatim. With the default rule and with a rule of the user's, each
    is ``[REDACTED]`` everywhere and the rest of the message kept; ``messages=False`` keeps it
    verbatim."""
    caplog.set_level(logging.INFO, logger="ckpt_events.events")
    log = tmp_path / "run.jsonl"
    exporter = InMemorySpanExporter()
    span_sink = SpanSink(
        exporter, resource=Resource({"service.name": "t"}), redactor=redactor, blocking=False
    )
    collected: list[Any] = []

    class Collect:
        def handle(self, batch: list[Any]) -> None:
            collected.extend(batch)

    await _failed_commit(
        JsonLinesSink(log, redactor=redactor), LoggingSink(redactor=redactor), span_sink, Collect()
    )
    span_sink.shutdown()
    [span] = exporter.get_finished_spans()
    found = _messages_written(log, caplog, redactor, collected)
    found["otel"] = [
        span.status.description or "",
        *(str((e.attributes or {})["exception.message"]) for e in span.events),
    ]
    expected = LEAKY if redactor is not None and not redactor.messages else SCRUBBED
    assert found["otel"] == [f"ConnectionError: {expected}", expected]
    for name in ("otlp protobuf", "otlp json"):
        assert found[name] == [f"ConnectionError: {expected}", "ConnectionError", expected], name
    assert found["jsonl"] == [expected] and found["logging"] == [expected], found
    # The event the sinks share is left alone: each sink redacts its own copy.
    assert [e.error_message for e in collected if isinstance(e, OperationFinished)] == [LEAKY]


def test_an_event_without_a_secret_is_not_copied() -> None:
    """``redacted`` hands back the batch itself when nothing in it is redacted: no copy per
    batch on the JSON-lines sink's hot path."""
    from ckpt_events.sinks._redacted import redacted

    plain = OperationFinished(
        kind="model",
        instance="m0",
        trace_id=1,
        span_id=2,
        start_ns=1,
        end_ns=2,
        operation="commit",
        outcome="error",
        error_type="OSError",
        error_message="disk full at /var/lib/ckpt",
    )
    batch = [plain]
    assert redacted(batch, Redactor()) is batch
    leaky = msgspec.structs.replace(plain, error_message="token=abc")
    out = redacted([leaky], Redactor())
    assert out[0].error_message == "token=[REDACTED]" and leaky.error_message == "token=abc"


def test_every_class_with_attributes_or_a_message_is_a_carrier() -> None:
    """``redacted`` reads both fields of a carrier without asking which it has: a class with one
    and not the other would have its attributes or its message go out unredacted."""
    from typing import get_args

    from ckpt_events import CheckpointEvent
    from ckpt_events.sinks._redacted import CARRIERS

    either = {
        cls
        for cls in get_args(CheckpointEvent)
        if {"attributes", "error_message"} & set(cls.__struct_fields__)
    }
    assert either == CARRIERS and len(CARRIERS) == 5
