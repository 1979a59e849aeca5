"""SpanSink: span kinds, handing spans to a SpanProcessor or a TracerProvider (and refusing a
provider without the SDK's processors, counting what a shut-down one would lose), exactly one
target, the default resource."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind

from ckpt_events import Bus, InvalidTypeError, InvalidValueError, Telemetry
from ckpt_events.sinks.otel import SpanSink


async def test_span_kinds_server_client_internal(
    ckpt_span_sink: SpanSink, ckpt_span_exporter: InMemorySpanExporter
) -> None:
    """A stage is CLIENT, the operation it reaches over HTTP is SERVER, a step INTERNAL."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        agent = Telemetry(bus, kind="agent", instance="a0")
        with ctl.coordinate("prepare", checkpoint_id="c1") as co, co.stage("agent") as stage:
            with agent.operation("prepare", checkpoint_id="c1", traceparent=stage.traceparent()) as op:
                with op.step("export"):
                    pass
        with agent.operation("resume"):
            pass
    kinds = {(s.name, s.kind) for s in ckpt_span_exporter.get_finished_spans()}
    assert ("gym.checkpoint.prepare", SpanKind.SERVER) in kinds
    assert ("gym.checkpoint.resume", SpanKind.INTERNAL) in kinds
    assert any(kind is SpanKind.CLIENT for _, kind in kinds)
    assert any(name.endswith("export") and kind is SpanKind.INTERNAL for name, kind in kinds)


async def test_processor_receives_finished_spans() -> None:
    """SpanSink(processor=...) hands each span to on_end; the user's batch processor exports it."""
    exporter = InMemorySpanExporter()
    processor = BatchSpanProcessor(exporter)
    async with Bus() as bus:
        sink = SpanSink(processor=processor)
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
            pass
    assert [s.name for s in exporter.get_finished_spans()] == ["gym.checkpoint.resume"]
    assert sink.stats().exported == 1
    processor.shutdown()


async def test_tracer_provider_processors_and_resource() -> None:
    """SpanSink(tracer_provider=...) goes through the provider's processors, with its resource."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Bus() as bus:
        bus.subscribe(SpanSink(tracer_provider=provider))
        with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
            pass
    (span,) = exporter.get_finished_spans()
    assert span.resource is provider.resource
    provider.shutdown()


async def test_a_providers_whole_pipeline_through_the_public_processor() -> None:
    """The multi processor a provider was built with, given as processor=, takes our spans
    through every processor the provider has, beside the provider's own spans."""
    exporter = InMemorySpanExporter()
    processors = SynchronousMultiSpanProcessor()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "trainer"}), active_span_processor=processors
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Bus() as bus:
        sink = SpanSink(processor=processors, resource=provider.resource)
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
            provider.get_tracer("trainer").start_span("save-weights").end()
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == ["gym.checkpoint.resume", "save-weights"]
    assert {s.resource.attributes["service.name"] for s in spans} == {"trainer"}
    assert sink.stats().exported == 1
    provider.shutdown()


@pytest.mark.parametrize("processor_type", [SimpleSpanProcessor, BatchSpanProcessor])
@pytest.mark.parametrize("shut", ["before", "after"])
async def test_a_shut_down_provider_counts_its_spans_as_dropped_and_logs_once(
    processor_type: type[SimpleSpanProcessor | BatchSpanProcessor],
    shut: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spans handed to a provider that was shut down (before or after the sink was built) are
    lost by its processors: they are counted as dropped, never exported, said in last_failure
    and logged once."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor_type(exporter))
    if shut == "before":
        provider.shutdown()
    sink = SpanSink(tracer_provider=provider, linger=0)
    if shut == "after":
        provider.shutdown()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for _ in range(2):
            with tel.operation("resume"):
                pass
            await bus.flush()
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (0, 2, 2)
    assert stats.last_failure == "was shut down"
    assert exporter.get_finished_spans() == ()
    (record,) = [r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert "SynchronousMultiSpanProcessor was shut down" in record.getMessage()


async def _one_operation_through(sink: SpanSink) -> tuple[int, int, str | None]:
    """One operation through ``sink`` on a bus of its own: its (exported, dropped, last failure)."""
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
            pass
    stats = sink.stats()
    return stats.exported, stats.dropped, stats.last_failure


async def test_a_shut_down_processor_given_as_processor_counts_its_spans_as_dropped() -> None:
    """processor= a BatchSpanProcessor already shut down: the span is dropped, not exported."""
    processor = BatchSpanProcessor(InMemorySpanExporter())
    processor.shutdown()
    sink = SpanSink(processor=processor, linger=0)
    assert await _one_operation_through(sink) == (0, 1, "was shut down")


async def test_spans_to_a_shut_down_otlp_exporter_s_simple_processor_are_dropped() -> None:
    """A SimpleSpanProcessor around OpenTelemetry's OTLP exporter, shut down with its provider: its
    spans are dropped, not exported. Before 1.45 the processor kept no flag of its own and the
    sink read the exporter's (counted as exported, they were refused: (1, 0) for (0, 1))."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    )
    provider.shutdown()
    sink = SpanSink(tracer_provider=provider, linger=0)
    assert await _one_operation_through(sink) == (0, 1, "was shut down")


class _HoldsTheTenthSpan(InMemorySpanExporter):
    """A user's exporter whose tenth export waits while another thread shuts the provider down."""

    def __init__(self, provider: TracerProvider) -> None:
        super().__init__()
        self.calls = 0
        self.provider = provider

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.calls == 10:  # the user's signal handler, or their other thread, runs now
            shutting = threading.Thread(target=self.provider.shutdown)
            shutting.start()
            shutting.join(5)
        return super().export(spans)


async def test_a_provider_shut_down_while_a_batch_is_handed_over_drops_the_rest_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The provider shut down from another thread in the middle of a batch: the rest of the
    batch is counted as dropped and said in one line (it went to a SimpleSpanProcessor that
    warned once per span, 90 lines, and counted as exported, 100 of 9 delivered)."""
    caplog.set_level(logging.WARNING)
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = _HoldsTheTenthSpan(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = SpanSink(tracer_provider=provider, linger=0)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for index in range(100):
            with tel.operation("resume", checkpoint_id=f"c{index}"):
                pass
        await bus.flush()
    stats = sink.stats()
    # The tenth was handed over before the shutdown, which its exporter then refused unseen.
    assert (stats.exported, stats.dropped, stats.last_failure) == (10, 90, "was shut down")
    assert len(exporter.get_finished_spans()) == 9
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.name == "ckpt_events.sinks.otel"
    assert "was shut down" in record.getMessage()


class _RefusesSteps(SpanProcessor):
    """A user's processor with a bug: it raises on every step span, passes the rest on."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "gym.checkpoint.write":
            raise RuntimeError("scrubber bug")
        self.exporter.export([span])


async def test_a_processor_raising_on_one_span_loses_only_that_span(caplog: pytest.LogCaptureFixture) -> None:
    """A processor that raises on one span loses that span, counted, and is logged once; the
    spans after it in the batch (other checkpoints' operations) still reach it. The first raise
    dropped the rest of the batch: three checkpoints lost for one bad span."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    exporter = InMemorySpanExporter()
    sink = SpanSink(processor=_RefusesSteps(exporter))
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        for i in range(3):
            with tel.operation("commit", checkpoint_id=f"c{i}") as op, op.step("write"):
                pass
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["gym.checkpoint.commit"] * 3
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (3, 3, 3)
    assert stats.last_failure == "raised"
    assert len([r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]) == 1


def _sdk_provider_without_processors() -> TracerProvider:
    """An SDK provider whose private attribute is gone, as if a release renamed it."""
    provider = TracerProvider(shutdown_on_exit=False)
    del provider._active_span_processor
    return provider


@pytest.mark.parametrize(
    "make",
    [NoOpTracerProvider, ProxyTracerProvider, _sdk_provider_without_processors],
    ids=["noop", "proxy", "renamed"],
)
def test_a_provider_without_sdk_processors_is_refused_with_the_fix(make: Callable[[], object]) -> None:
    """A provider without the SDK's processors (the fallback's private attribute) is one
    InvalidTypeError line that says to pass processor=."""
    with pytest.raises(InvalidTypeError) as refused:
        SpanSink(tracer_provider=make())  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message and "no OpenTelemetry SDK span processors" in message
    assert "SpanSink's processor=BatchSpanProcessor(exporter)" in message and "span_exporter=" in message


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ((), "got none"),
        (("processor", "tracer_provider"), "got processor and tracer_provider"),
        (("exporter", "processor"), "got exporter and processor"),
    ],
)
def test_exactly_one_of_exporter_processor_or_tracer_provider(given: tuple[str, ...], named: str) -> None:
    """None, or two of them, is one InvalidValueError naming what was given."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    parts = {"exporter": exporter, "processor": SimpleSpanProcessor(exporter), "tracer_provider": provider}
    with pytest.raises(
        InvalidValueError, match=f"exactly one of exporter, processor or tracer_provider, {named}$"
    ):
        SpanSink(**{name: parts[name] for name in given})  # type: ignore[arg-type]
    provider.shutdown()


def test_default_resource_is_not_unknown_service(ckpt_span_exporter: InMemorySpanExporter) -> None:
    """Without a resource, the service name is ckpt-events, never unknown_service:python."""
    assert SpanSink(ckpt_span_exporter).resource.attributes["service.name"] == "ckpt-events"
