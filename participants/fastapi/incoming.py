"""What one request brought (``Incoming``: the caller's span, its tracestate, the arrival, the
loop-lag monitor), and the operation it makes, timed for the loop's lag while it runs.

Part of ``ckpt_events.participants.fastapi``, which re-exports ``Incoming``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from ckpt_events import (
    OperationSpan,
    RemoteParent,
    Telemetry,
    format_traceparent,
    parse_traceparent,
    parse_tracestate,
)
from ckpt_events.participants.loop_lag import LoopLagMonitor

__all__ = ["Incoming", "WrappedOperation"]


class WrappedOperation:
    """An operation's handle (``_operation``) wrapped for what ``with`` adds around it; every
    public name the wrapper does not define is the handle's, so ``op = operation(request, ...)``
    with ``with`` forgotten behaves as ``tel.operation(...)`` does then, telemetry on or off
    (with a sink, ``op.set()`` was an ``AttributeError`` only then: a 500 in production)."""

    __slots__ = ("_operation",)

    _operation: Any  # the handle, or a wrapper of it

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never a slot not yet set (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._operation, name)

    if not TYPE_CHECKING:  # at run time only, as the handle's: `async with` refused in one line

        def __aenter__(self) -> Any:
            return self._operation.__aenter__()

        def __aexit__(self, *exc_info: object) -> None:  # looked up before __aenter__ is called
            return None


class _Timed(WrappedOperation):
    """An operation that records the worst loop lag seen while it ran, as it ends."""

    __slots__ = ("_monitor", "_since")

    _operation: OperationSpan

    def __init__(self, span: OperationSpan, monitor: LoopLagMonitor) -> None:
        self._operation = span
        self._monitor = monitor
        self._since = 0

    def __enter__(self) -> OperationSpan:
        # Monotonic, not the wall clock: a step of it ends no sampling. begin() wakes a monitor
        # parked for want of an operation.
        self._since = self._monitor.begin()
        try:
            return self._operation.__enter__()
        except BaseException:
            self._monitor.end()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._operation.set(loop_lag_ms=self._monitor.max_since_monotonic(self._since))
        finally:
            self._monitor.end()
        self._operation.__exit__(exc_type, exc, tb)


class Incoming(NamedTuple):
    """What one request brought: the caller's span (``parent``, from a valid ``traceparent``;
    ``None`` starts a new trace), the ``tracestate`` that came with it (normalised, ``None``
    when absent, malformed or without a parent), when it arrived (``received_ns``, Unix ns;
    ``None`` outside an instrumented app) and the app's loop-lag ``monitor``."""

    parent: RemoteParent | None = None
    tracestate: str | None = None
    received_ns: int | None = None
    monitor: LoopLagMonitor | None = None

    @classmethod
    def from_headers(
        cls,
        traceparent: str | None,
        tracestate: str | None = None,
        *,
        received_ns: int | None = None,
        monitor: LoopLagMonitor | None = None,
    ) -> Self:
        """An ``Incoming`` from the header values (several ``tracestate`` fields joined with
        ``,``, as HTTP combines them); malformed ones are dropped."""
        parent = parse_traceparent(traceparent)
        state = parse_tracestate(tracestate) if parent is not None and tracestate is not None else None
        return cls(parent, state, received_ns, monitor)

    def operation(
        self, tel: Telemetry, name: str, *, checkpoint_id: str | None = None, **attributes: Any
    ) -> AbstractContextManager[OperationSpan]:
        """``tel.operation(name, ...)``, a child of ``parent`` keeping ``tracestate``, with
        ``received_ns``, the loop lag while it runs, and ``attributes`` (``set_attribute``).

        ``with`` gives the ``OperationSpan`` itself (a no-op handle when no sink listens).
        """
        parent = self.parent
        traceparent = None if parent is None else format_traceparent(*parent)
        span = tel.operation(name, checkpoint_id=checkpoint_id, traceparent=traceparent)
        for key, value in attributes.items():  # checked on a no-op handle too: the same errors on or off
            span.set_attribute(key, value)
        if self.tracestate is not None:  # before the check below: a no-op handle hands it on too
            span = span.with_tracestate(self.tracestate)
        if not tel.enabled:
            return span
        if self.received_ns is not None:
            span.set(received_ns=self.received_ns)
        if self.monitor is None:
            return span
        return _Timed(span, self.monitor)
