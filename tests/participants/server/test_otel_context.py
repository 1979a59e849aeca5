"""otel_context: a participant operation joins the app's OpenTelemetry trace (FastAPI instrumentation)."""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, set_span_in_context

from ckpt_events import Bus
from ckpt_events.participants import create_app
from ckpt_events.sinks.otel import SpanSink
from tests.participants.helpers import AUTH, TOKEN, control, running


async def test_prepare_nests_under_the_fastapi_server_span() -> None:
    """caller -> FastAPI SERVER -> gym.checkpoint.prepare -> the app's own span, all one trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("the-app")
    async with Bus() as bus:
        bus.subscribe(SpanSink(tracer_provider=provider))
        app = create_app("agent", instance="agent-0", token=TOKEN, bus=bus, otel_context=True)
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
        workload = app.state.workload
        closed = workload.on_admission_closed

        async def app_code(*args: Any) -> None:
            with tracer.start_as_current_span("app.flush"):
                await closed(*args)

        workload.on_admission_closed = app_code
        async with running(app) as client:
            # Not made current: the in-process ASGI app would inherit it (a real caller is
            # another process), and the instrumentation would then make no SERVER span.
            caller = tracer.start_span("caller", kind=SpanKind.CLIENT)
            headers = dict(AUTH)
            inject(headers, context=set_span_in_context(caller))
            reply = await control(client, "prepare", headers=headers)
            assert reply.status_code == 200, reply.text
            caller.end()
        await bus.flush()
    FastAPIInstrumentor.uninstrument_app(app)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    (server,) = [s for s in spans.values() if s.kind is SpanKind.SERVER]
    prepare, app_span = spans["gym.checkpoint.prepare"], spans["app.flush"]
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in (server, prepare, app_span)} == {trace_id}
    assert server.parent is not None and server.parent.span_id == caller.get_span_context().span_id
    assert prepare.parent is not None and prepare.parent.span_id == server.context.span_id
    assert app_span.parent is not None and app_span.parent.span_id == prepare.context.span_id
    provider.shutdown()


async def test_without_otel_context_prepare_is_a_sibling() -> None:
    """Off (the default): the operation follows the traceparent header, not the SERVER span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Bus() as bus:
        bus.subscribe(SpanSink(tracer_provider=provider))
        app = create_app("agent", instance="agent-0", token=TOKEN, bus=bus)
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
        async with running(app) as client:
            caller = provider.get_tracer("t").start_span("caller")
            headers = dict(AUTH)
            inject(headers, context=set_span_in_context(caller))
            assert (await control(client, "prepare", headers=headers)).status_code == 200
            caller.end()
        await bus.flush()
    FastAPIInstrumentor.uninstrument_app(app)
    (prepare,) = [s for s in exporter.get_finished_spans() if s.name == "gym.checkpoint.prepare"]
    assert prepare.parent is not None and prepare.parent.span_id == caller.get_span_context().span_id
    assert prepare.kind is SpanKind.SERVER
    provider.shutdown()


async def test_a_refused_call_is_a_failed_server_span_with_error_type() -> None:
    """A prepare refused (409 checkpoint_conflict) under a caller's traceparent: a SERVER span,
    child of the caller's, status ERROR naming the code, ``error.type`` its exception's type."""
    exporter = InMemorySpanExporter()
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with Bus() as bus:
        bus.subscribe(SpanSink(exporter, blocking=False, linger=0))
        app = create_app("agent", instance="agent-0", token=TOKEN, bus=bus)
        async with running(app) as client:
            assert (
                await control(client, "prepare", "c1", headers={**AUTH, "traceparent": caller})
            ).is_success
            refused = await control(client, "prepare", "c2", headers={**AUTH, "traceparent": caller})
            assert refused.status_code == 409
        await bus.flush()
    [span] = [s for s in exporter.get_finished_spans() if s.attributes.get("nemo.gym.checkpoint.id") == "c2"]
    assert span.kind is SpanKind.SERVER and span.parent is not None and span.parent.is_remote
    assert span.parent.span_id == 0xB7AD6B7169203331
    assert span.status.description is not None and "checkpoint_conflict" in span.status.description
    refusal = "ckpt_events.participants.errors.ProtocolRefusal"
    assert span.attributes["error.type"] == span.events[0].attributes["exception.type"] == refusal
