"""OpenTelemetry's span attribute limits (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` and the generic ``OTEL_ATTRIBUTE_*``), honoured alike by
``SpanSink`` and our own OTLP encoder: strings cut to the length limit when one is set, at most
128 attributes a span by default, ours kept first, the rest counted as dropped."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, ConfigurationError, OperationFinished, Redactor, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel import AttributeLimits, OtlpSpanSink, SpanSink
from ckpt_events.sinks.otel._env import read_otel_env
from ckpt_events.sinks.otlp._span_encoder import SpanEncoder
from ckpt_events.vocab import Attr

#: A 10 MB attribute and exception message: what one careless ``set_attribute`` or ``str(exc)`` gives.
BLOB = "x" * 10_000_000
USER_COUNT = 200


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


def _operation(tel: Telemetry) -> None:
    with pytest.raises(RuntimeError), tel.operation("restore", checkpoint_id="c1") as op:
        op.set_attribute("user.blob", BLOB)
        for index in range(USER_COUNT):
            op.set_attribute(f"user.n{index:03}", index)
        raise RuntimeError(BLOB)


async def _exported(environ: dict[str, str]) -> ReadableSpan:
    """The span ``configure(environ=...)`` exports for one failing operation with huge values."""
    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        async with configure(bus, span_exporter=exporter, environ=environ):
            _operation(Telemetry(bus, kind="agent", instance="a0"))
    (span,) = exporter.get_finished_spans()
    return span


async def test_the_value_length_limit_cuts_attributes_and_the_exception() -> None:
    """OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=100: the 10 MB attribute and the exception message go out
    as 100 characters (they went out whole: a 10 MB span a collector refuses with its batch)."""
    span = await _exported({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100"})
    assert span.attributes is not None
    assert span.attributes["user.blob"] == "x" * 100
    (exception,) = span.events
    assert exception.attributes is not None
    assert exception.attributes["exception.message"] == "x" * 100
    assert span.status.description == "RuntimeError: " + "x" * 100


async def test_the_default_keeps_values_whole_and_128_attributes_ours_first() -> None:
    """No variable: no length limit (the spec's default; the exception message is already cut at
    1,024 characters where it is recorded), and 128 attributes, ours first, the rest dropped."""
    span = await _exported({})
    assert span.attributes is not None
    assert len(span.attributes) == 128
    assert span.attributes[Attr.ID] == "c1"
    assert span.attributes[Attr.PARTICIPANT_KIND] == "agent"
    assert span.dropped_attributes > 0
    assert len(span.attributes) + span.dropped_attributes == USER_COUNT + 1 + _own_count(span)
    (exception,) = span.events
    assert exception.attributes is not None
    assert exception.attributes["exception.message"] == "x" * 1024


def _own_count(span: ReadableSpan) -> int:
    assert span.attributes is not None
    return sum(1 for key in span.attributes if not key.startswith("user."))


async def test_the_span_s_own_variables_win_over_the_generic_ones() -> None:
    """OTEL_SPAN_ATTRIBUTE_* win over OTEL_ATTRIBUTE_* (the spec)."""
    span = await _exported(
        {
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "5",
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "7",
            "OTEL_ATTRIBUTE_COUNT_LIMIT": "3",
            "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "20",
        }
    )
    assert span.attributes is not None
    assert len(span.attributes) == 20
    assert span.attributes.get("user.blob", "x" * 7) == "x" * 7


async def _through_provider(environ: dict[str, str]) -> tuple[ReadableSpan, ReadableSpan]:
    """Our span and the provider's own, exported by a provider built with SpanLimits in code."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=6, max_span_attribute_length=9))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Bus() as bus:
        async with configure(bus, tracer_provider=provider, environ=environ):
            _operation(Telemetry(bus, kind="agent", instance="a0"))
            with provider.get_tracer("app").start_as_current_span("app") as own:
                own.set_attribute("user.blob", BLOB)
    provider.shutdown()
    ours, theirs = sorted(exporter.get_finished_spans(), key=lambda span: span.name == "app")
    return ours, theirs


async def test_a_tracer_provider_s_span_limits_hold_our_spans_too() -> None:
    """configure(tracer_provider=) with the provider's SpanLimits set in code: our spans keep 6
    attributes of 9 characters at most, as the provider's own do. They went out with 205
    attributes and the 10 MB value whole through a provider limited to 6 and 9."""
    ours, theirs = await _through_provider({})
    assert theirs.attributes is not None and theirs.attributes["user.blob"] == "x" * 9
    assert ours.attributes is not None
    assert len(ours.attributes) == 6
    assert len(ours.attributes) + ours.dropped_attributes == USER_COUNT + 1 + _own_count(ours)
    assert all(len(v) <= 9 for v in ours.attributes.values() if isinstance(v, str))
    (exception,) = ours.events
    assert exception.attributes is not None
    assert exception.attributes["exception.message"] == "x" * 9


async def test_the_environment_s_limits_win_over_a_tracer_provider_s() -> None:
    """Limits set in configure's environ are every span sink's, beside a provider of yours too."""
    ours, _ = await _through_provider({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "20"})
    assert ours.attributes is not None
    assert len(ours.attributes) == 20
    assert ours.attributes["user.blob"] == BLOB


@pytest.mark.parametrize(
    "name",
    [
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        "OTEL_ATTRIBUTE_COUNT_LIMIT",
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    ],
)
@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_limit_names_the_variable(name: str, value: str) -> None:
    """A limit that is not a whole number >= 0: one line naming the variable."""
    with pytest.raises(ConfigurationError, match=name) as info:
        read_otel_env({name: value})
    assert "\n" not in str(info.value)


async def test_the_otlp_sink_configure_builds_takes_the_limits() -> None:
    """Our OTLP/HTTP span sink gets the environment's limits too."""
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100",
        "OTEL_ATTRIBUTE_COUNT_LIMIT": "40",
    }
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            sink = configured.span_sink
            assert isinstance(sink, OtlpSpanSink)
            assert sink.encoder.limits == AttributeLimits(100, 40)


async def _events() -> list[Any]:
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="a0")
        _operation(tel)
        with tel.operation("commit", checkpoint_id="c" * 500) as op:  # ours cut too
            op.set_attribute("user.flag", True)
        await bus.flush()
    return [event for event in keep.events if isinstance(event, OperationFinished)]


def _spans_of(request: ExportTraceServiceRequest) -> dict[str, dict[str, Any]]:
    return {
        span.span_id.hex(): MessageToDict(span)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }


@pytest.mark.parametrize("limits", [AttributeLimits(100), AttributeLimits(None, 8), AttributeLimits(3, 0)])
async def test_the_encoder_writes_what_span_sink_gives_the_sdk_s_encoder(limits: AttributeLimits) -> None:
    """Protobuf and JSON: the same cut values, kept attributes and dropped count as SpanSink's spans
    written by OpenTelemetry's encoder."""
    events = await _events()
    exporter = InMemorySpanExporter()
    sink = SpanSink(
        exporter, resource=Resource({"service.name": "t"}), attribute_limits=limits, blocking=False
    )
    sink.handle(events)
    theirs = _spans_of(encode_spans(exporter.get_finished_spans()))
    encoder = SpanEncoder({"service.name": "t"}, Redactor(), limits)
    request = ExportTraceServiceRequest()
    request.ParseFromString(encoder.protobuf(events)[0])
    ours = _spans_of(request)
    assert set(ours) == set(theirs) and len(ours) == 2
    for span_id, span in ours.items():
        want = {key: value for key, value in theirs[span_id].items() if key not in ("flags", "status")}
        assert {key: value for key, value in span.items() if key not in ("flags", "status")} == want
        assert span.get("status", {}).get("message") == theirs[span_id].get("status", {}).get("message")
    [resource_spans] = msgspec.json.decode(encoder.json(events)[0])["resourceSpans"]
    for span in resource_spans["scopeSpans"][0]["spans"]:
        want = ours[span["spanId"]]
        assert span.get("droppedAttributesCount", 0) == want.get("droppedAttributesCount", 0)
        assert [a["key"] for a in span["attributes"]] == [a["key"] for a in want.get("attributes", [])]
        assert [a["value"] for a in span["attributes"]] == [a["value"] for a in want.get("attributes", [])]
