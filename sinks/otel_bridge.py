"""The ``ckpt_events.context_bridges`` entry point's documented home; the bridge lives in
``sinks.otel._context_bridge``."""

from sinks.otel._context_bridge import OtelContextBridge

__all__ = ["OtelContextBridge"]
