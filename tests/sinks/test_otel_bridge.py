"""``sinks.otel_bridge``: the ``ckpt_events.context_bridges`` entry point's home resolves to the bridge."""

from __future__ import annotations

from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from ckpt_events.sinks import otel_bridge
from ckpt_events.sinks.otel._context_bridge import OtelContextBridge as Implemented


def test_the_entry_point_loads_the_bridge_this_module_exports() -> None:
    """The installed ``opentelemetry`` bridge is ``otel_bridge.OtelContextBridge``, the same class
    its private home defines, and reads the real SDK's current span."""
    [point] = [p for p in entry_points(group="ckpt_events.context_bridges") if p.name == "opentelemetry"]
    assert point.value == "ckpt_events.sinks.otel_bridge:OtelContextBridge"
    assert point.load() is otel_bridge.OtelContextBridge is Implemented
    assert otel_bridge.__all__ == ["OtelContextBridge"]
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        context = span.get_span_context()
        assert otel_bridge.OtelContextBridge().current_parent() == (
            context.trace_id,
            context.span_id,
            True,
            False,  # a span of this process
            None,  # no tracestate
        )
    assert trace.get_current_span().get_span_context().is_valid is False


async def test_an_extracted_remote_parent_keeps_its_remote_flag_and_tracestate() -> None:
    """A server without auto-instrumentation makes the caller's span current with
    ``propagate.extract`` + ``context.attach``: the operation was an INTERNAL child with a local
    parent and no tracestate. It is the SERVER child of the remote parent, its tracestate kept,
    as with ``traceparent=`` and ``with_tracestate``."""
    from opentelemetry import context, propagate

    from ckpt_events import OperationFinished, Telemetry
    from ckpt_events.testing import capture_events
    from ckpt_events.vocab import SpanKind, span_kind_of

    headers = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=abc",
    }
    token = context.attach(propagate.extract(headers))
    try:
        async with capture_events() as (bus, events):
            tel = Telemetry(bus, kind="agent", instance="a0", otel_context=True)
            with tel.operation("commit", checkpoint_id="c1") as op:
                assert op.tracestate() == "vendor=abc"
    finally:
        context.detach(token)
    (finished,) = [e for e in events if isinstance(e, OperationFinished)]
    assert finished.parent_remote is True and finished.parent_span_id == 0xB7AD6B7169203331
    assert finished.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span_kind_of(finished) == SpanKind.SERVER
