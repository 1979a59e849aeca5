"""The ``ckpt_events.context_bridges`` entry point's documented home; the bridge lives in
``ckpt_events.sinks.otel._context_bridge``."""

from ckpt_events.sinks.otel._context_bridge import OtelContextBridge

__all__ = ["OtelContextBridge"]
