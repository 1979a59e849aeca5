"""``ContextBridge``: the hook through which ``Telemetry`` joins another tracing context.

The core imports no tracing library. A bridge (``ckpt_events.sinks.otel_bridge.OtelContextBridge`` for
OpenTelemetry) tells ``Telemetry`` the current span to parent an operation on, and makes
the operation current while it is open, so the app's own spans nest under it. ``Telemetry``
calls it only when built with ``otel_context``; the disabled path never reaches it.
"""

from __future__ import annotations

import inspect
from types import TracebackType
from typing import Any, Final, Protocol, runtime_checkable

from ckpt_events._frozen_attrs import FrozenAttributes
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events._span_handles import OperationSpan

__all__ = ["BridgedOperationSpan", "ContextBridge", "bridge_failed", "takes_tracestate"]

logger: Final = library_logger("ckpt_events")


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
        """Make the span ``span_id`` of ``trace_id`` current; returns a token for ``detach``.

        A bridge whose ``attach`` also takes a ``tracestate`` keyword (``str | None``) is given
        the operation's W3C ``tracestate`` there, so what the app sends from inside the
        operation carries it on; a bridge without it is called as above."""
        ...

    # Any, not object: the token is what this bridge's own attach returned, so a bridge may
    # type it (contextvars' ``Token[...]``); a parameter of ``object`` refused every narrower one.
    def detach(self, token: Any) -> None:
        """Undo the ``attach`` that returned ``token``."""
        ...


_failed_once: set[tuple[int, str]] = set()


def takes_tracestate(bridge: ContextBridge) -> bool:
    """Whether ``bridge.attach`` takes a ``tracestate`` keyword (read once, when ``Telemetry``
    is built: never on the request path)."""
    try:
        parameters = inspect.signature(bridge.attach).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: called as the protocol says
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == "tracestate" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


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
    #: Whether ``_bridge.attach`` takes the ``tracestate`` keyword (``takes_tracestate``).
    _bridge_state: bool = False
    _token: object = None
    _attached: bool = False

    def __enter__(self) -> OperationSpan:
        super().__enter__()
        bridge = self._bridge
        # Attached once, while open: entered again inside its block, each entry attached and
        # the one exit detached the last, so the ended operation stayed the current span.
        if bridge is not None and not self._attached and self._attributes.__class__ is not FrozenAttributes:
            try:
                state = self._tracestate
                if state is not None and self._bridge_state:
                    # takes_tracestate() read this keyword in the bridge's signature
                    self._token = bridge.attach(  # type: ignore[call-arg]
                        self.trace_id, self.span_id, self.sampled, tracestate=state
                    )
                else:
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


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", ContextBridge)
