"""``ContextBridge``: the hook through which ``Telemetry`` joins another tracing context.

The core imports no tracing library. A bridge (``ckpt_events.sinks.otel_bridge.OtelContextBridge`` for
OpenTelemetry) tells ``Telemetry`` the current span to parent an operation on, and makes
the operation current while it is open, so the app's own spans nest under it. ``Telemetry``
calls it only when built with ``otel_context``; the disabled path never reaches it.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Final, Protocol, runtime_checkable

from ckpt_events._span_handles import OperationSpan

__all__ = ["BridgedOperationSpan", "ContextBridge", "bridge_failed"]

logger: Final = logging.getLogger("ckpt_events")


@runtime_checkable
class ContextBridge(Protocol):
    """Reads and sets the current span of another tracing system."""

    def current_parent(self) -> tuple[int, int, bool] | tuple[int, int, bool, bool, str | None] | None:
        """(trace id, span id, sampled) of the current span, or ``None`` if there is none; or
        (trace id, span id, sampled, remote, tracestate), when the current span came in from
        another process (``remote``: the operation is then a SERVER span) with its W3C
        ``tracestate`` header (kept and passed on by the operation's ``tracestate()``)."""
        ...

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        """Make the span ``span_id`` of ``trace_id`` current; returns a token for ``detach``."""
        ...

    def detach(self, token: object) -> None:
        """Undo the ``attach`` that returned ``token``."""
        ...


_failed_once: set[tuple[int, str]] = set()


def bridge_failed(what: str, bridge: object) -> None:
    """A bridge's ``current_parent``/``attach``/``detach`` raised: logged once per bridge and
    call (with its traceback), and the operation goes on without it (telemetry never breaks the
    app: a raising ``attach`` left the operation started, never finished, and stopped the block)."""
    key = (id(bridge), what)
    if key in _failed_once:
        return
    _failed_once.add(key)
    logger.warning(
        "context bridge %s.%s() raised; the operation goes on without it (not logged again)",
        type(bridge).__name__,
        what,
        exc_info=True,
    )


class BridgedOperationSpan(OperationSpan, gc=False):
    """An ``OperationSpan`` that is the bridge's current span while it is open."""

    _bridge: ContextBridge | None = None
    _token: object = None
    _attached: bool = False

    def __enter__(self) -> OperationSpan:
        super().__enter__()
        bridge = self._bridge
        if bridge is not None:
            try:
                self._token = bridge.attach(self.trace_id, self.span_id, self.sampled)
                self._attached = True
            except Exception:
                bridge_failed("attach", bridge)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._bridge is not None and self._attached:
                self._attached = False
                try:
                    self._bridge.detach(self._token)
                except Exception:
                    bridge_failed("detach", self._bridge)
        finally:
            super().__exit__(exc_type, exc, tb)
