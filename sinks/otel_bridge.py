"""The ``ckpt_events.context_bridges`` entry point's documented home; the bridge lives in
``ckpt_events.sinks.otel._context_bridge``."""

from ckpt_events._lazy import needs_extra

try:
    from ckpt_events.sinks.otel._context_bridge import OtelContextBridge
except ModuleNotFoundError as _exc:
    # Without the otel extra this was a bare "No module named 'opentelemetry'", naming no install.
    _said = needs_extra(_exc, __name__)
    if _said is None:
        raise
    raise _said from _exc

__all__ = ["OtelContextBridge"]
