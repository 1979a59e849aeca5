"""SpanSink: span kinds, handing spans to a SpanProcessor or a TracerProvider, the default resource."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from ckpt_events import Bus, Telemetry
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


def test_default_resource_is_not_unknown_service(ckpt_span_exporter: InMemorySpanExporter) -> None:
    """Without a resource, the service name is ckpt-events, never unknown_service:python."""
    assert SpanSink(ckpt_span_exporter).resource.attributes["service.name"] == "ckpt-events"
