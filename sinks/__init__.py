"""Sinks for ckpt_events: OpenTelemetry spans and metrics, JSON-lines logs, and replay.

``configure(bus)`` subscribes the standard set from arguments and the environment;
``sinks.otel``, ``sinks.jsonl`` and ``sinks.replay`` hold the parts. The OpenTelemetry
modules import the SDK only when used.
"""

from sinks._configure import Configured, configure
from sinks._jsonl import CorruptLine, JsonLinesSink, JsonLinesStats, read_events
from sinks._replay import ReplayResult, replay

__all__ = [
    "Configured",
    "CorruptLine",
    "JsonLinesSink",
    "JsonLinesStats",
    "ReplayResult",
    "configure",
    "read_events",
    "replay",
]
