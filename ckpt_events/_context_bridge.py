"""``ContextBridge``: the hook through which ``Telemetry`` joins another tracing context.

The core imports no tracing library. A bridge (``ckpt_events.sinks.otel_bridge.OtelContextBridge`` for
OpenTelemetry) tells ``Telemetry`` the current span to parent an operation on, and makes
the operation current while it is open, so the app's own spans nest under it. ``Telemetry``
calls it only when built with ``otel_context``; the disabled path never reaches it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, runtime_checkable

from ckpt_events._span_handles import OperationSpan

__all__ = ["BridgedOperationSpan", "ContextBridge"]


@runtime_checkable
class ContextBridge(Protocol):
    """Reads and sets the current span of another tracing system."""

    def current_parent(self) -> tuple[int, int, bool] | None:
        """(trace id, span id, sampled) of the current span, or ``None`` if there is none."""
        ...

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        """Make the span ``span_id`` of ``trace_id`` current; returns a token for ``detach``."""
        ...

    def detach(self, token: object) -> None:
        """Undo the ``attach`` that returned ``token``."""
        ...


class BridgedOperationSpan(OperationSpan, gc=False):
    """An ``OperationSpan`` that is the bridge's current span while it is open."""

    _bridge: ContextBridge | None = None
    _token: object = None

    def __enter__(self) -> OperationSpan:
        super().__enter__()
        assert self._bridge is not None
        self._token = self._bridge.attach(self.trace_id, self.span_id, self.sampled)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._bridge is not None:
                self._bridge.detach(self._token)
        finally:
            super().__exit__(exc_type, exc, tb)
