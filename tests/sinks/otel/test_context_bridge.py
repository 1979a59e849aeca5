"""``OtelContextBridge`` (``ckpt_events.sinks.otel``): an operation inside OpenTelemetry's context."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from ckpt_events import OperationFinished, Telemetry
from ckpt_events.sinks.otel_bridge import OtelContextBridge
from ckpt_events.testing import capture_events


def test_without_a_current_span_there_is_no_parent() -> None:
    """Outside any span, current_parent() is None."""
    assert OtelContextBridge().current_parent() is None


async def test_an_operation_nests_under_the_current_span_and_the_app_s_spans_under_it() -> None:
    """The app's current span parents the operation; inside it, the app's new span is its child;
    after the block OpenTelemetry's context is the app's span again."""
    tracer = TracerProvider().get_tracer("the-app")
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="judge", instance="judge-0", otel_context=OtelContextBridge())
        with tracer.start_as_current_span("app.request") as request:
            outer = request.get_span_context()
            with tel.operation("commit", checkpoint_id="c1") as op:
                current = trace.get_current_span().get_span_context()
                assert (current.trace_id, current.span_id) == (op.trace_id, op.span_id)
                with tracer.start_as_current_span("app.work") as work:
                    assert work.parent is not None and work.parent.span_id == op.span_id  # type: ignore[attr-defined]
            assert trace.get_current_span().get_span_context() == outer
    [finished] = [e for e in events if isinstance(e, OperationFinished)]
    assert (finished.trace_id, finished.parent_span_id) == (outer.trace_id, outer.span_id)
    assert finished.sampled is True and finished.parent_remote is False
