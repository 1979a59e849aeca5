"""Which coordinator operation a worker's share belongs to, so the share joins its trace.

The control plane opens its operation span (``gym.checkpoint.commit``, ...) deep inside
``ControlPlane``; the pool, which sends the frames, only sees the workload calls made under
it. ``NotingTelemetry`` wraps the plane's ``Telemetry`` and notes each operation it opens in
a context variable of the request's task; the pool reads it (``current_share``) and puts the
operation's ``traceparent`` and checkpoint id on the frames, so each worker's share is a
child span of the coordinator's operation. When the main process has no sink (its span is a
no-op), the incoming ``traceparent`` is forwarded instead: the shares still join the
controller's trace.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

from ckpt_events import OperationSpan, Telemetry
from ckpt_events.vocab import Operation

__all__ = ["NotingTelemetry", "Share", "current_share"]


class Share:
    """The coordinator operation a frame belongs to: its checkpoint id and trace context."""

    __slots__ = ("checkpoint_id", "incoming", "span")

    def __init__(self, span: OperationSpan, checkpoint_id: str | None, incoming: str | None) -> None:
        self.span = span
        self.checkpoint_id = checkpoint_id
        self.incoming = incoming

    def traceparent(self) -> str | None:
        """The operation span's ``traceparent``, else (no sink here) the caller's."""
        return self.span.traceparent() or self.incoming


_CURRENT: Final[ContextVar[Share | None]] = ContextVar("ckpt_events_worker_share", default=None)


def current_share() -> Share | None:
    """The operation the calling task is inside, if it was opened through a ``NotingTelemetry``."""
    return _CURRENT.get()


class NotingTelemetry:
    """A ``Telemetry`` (every member forwarded) whose ``operation`` also notes the span it opens."""

    def __init__(self, tel: Telemetry) -> None:
        self._tel = tel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tel, name)

    def operation(
        self,
        operation: Operation | str,
        *,
        checkpoint_id: str | None = None,
        traceparent: str | None = None,
        parent: Any = None,
    ) -> OperationSpan:
        span = self._tel.operation(
            operation, checkpoint_id=checkpoint_id, traceparent=traceparent, parent=parent
        )
        # Set in the request's own task: each HTTP call runs in its own, so nothing leaks across.
        _CURRENT.set(Share(span, checkpoint_id, traceparent))
        return span
