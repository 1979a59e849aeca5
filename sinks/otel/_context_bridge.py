"""``OtelContextBridge``: ckpt_events operations inside OpenTelemetry's current context.

``Telemetry(..., otel_context=True)`` loads it through the ``ckpt_events.context_bridges``
entry point. While an operation is open, OpenTelemetry's current span is a
``NonRecordingSpan`` carrying the operation's ids, so the app's spans, instrumented clients
and log correlation nest under it; the span itself is exported by ``SpanSink``.
"""

from __future__ import annotations

import contextvars

from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from ckpt_events._public_home import publish

__all__ = ["OtelContextBridge"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class OtelContextBridge:
    """A ``ckpt_events.ContextBridge`` over OpenTelemetry's context API."""

    def current_parent(self) -> tuple[int, int, bool, bool, str | None] | None:
        """The current OpenTelemetry span's ids, sampled flag, whether it came from another
        process (``propagate.extract`` then ``context.attach``: the operation is its SERVER
        child, as with ``traceparent=``) and its tracestate, if it is valid."""
        span_context = trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        state = span_context.trace_state.to_header() if span_context.trace_state else None
        return (
            span_context.trace_id,
            span_context.span_id,
            span_context.trace_flags.sampled,
            span_context.is_remote,
            state or None,
        )

    def attach(self, trace_id: int, span_id: int, sampled: bool, *, tracestate: str | None = None) -> object:
        """Make a non-recording span with these ids (and the operation's W3C ``tracestate``)
        current, so the app's instrumented clients pass both on; returns the context token."""
        flags = _SAMPLED if sampled else _NOT_SAMPLED
        state = TraceState.from_header([tracestate]) if tracestate else None
        span = NonRecordingSpan(SpanContext(trace_id, span_id, False, flags, state))
        return context.attach(trace.set_span_in_context(span))

    def detach(self, token: object) -> None:
        """Restore the context from before ``attach``. A token attached in another context
        (an operation entered in one threadpool call and left in another: a sync generator's
        ``StreamingResponse``, a sync ``yield`` dependency) has nothing to restore here, and
        is let go silently."""
        if isinstance(token, contextvars.Token):  # the default (contextvars) runtime context
            try:
                token.var.reset(token)  # what context.detach() does with it
            except ValueError:
                # Created in another Context (a copy gone with its thread call): this one never
                # held the operation. context.detach() logged 'Failed to detach context' with
                # a traceback on every such request.
                pass
            return
        context.detach(token)  # type: ignore[arg-type]


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel_bridge", OtelContextBridge)
