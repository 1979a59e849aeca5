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
        assert otel_bridge.OtelContextBridge().current_parent() == (context.trace_id, context.span_id, True)
    assert trace.get_current_span().get_span_context().is_valid is False
