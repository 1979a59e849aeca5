"""The W3C trace context of one control call: its ``traceparent`` and ``tracestate`` headers."""

from __future__ import annotations

from typing import NamedTuple

from ckpt_events import Operation, OperationSpan, Telemetry

__all__ = ["TraceHeaders"]


class TraceHeaders(NamedTuple):
    """The caller's ``traceparent`` and ``tracestate`` (each ``None`` when absent).

    Several ``tracestate`` header fields arrive joined with ``,``, as HTTP combines them; the
    operation validates it (``ckpt_events.parse_tracestate``) and keeps it only with a valid
    ``traceparent``, so its ``tracestate()`` passes it on with ``traceparent()``.
    """

    traceparent: str | None = None
    tracestate: str | None = None

    def operation(self, tel: Telemetry, operation: Operation, checkpoint_id: str) -> OperationSpan:
        """``tel.operation(operation)`` continuing the caller's trace."""
        span = tel.operation(operation, checkpoint_id=checkpoint_id, traceparent=self.traceparent)
        return span.with_tracestate(self.tracestate)
