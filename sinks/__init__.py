"""Sinks for ckpt_events: OpenTelemetry spans and metrics, JSON-lines logs, and replay.

``configure(bus)`` subscribes the standard set from arguments and the environment;
``sinks.otel``, ``sinks.jsonl`` and ``sinks.replay`` hold the parts. The OpenTelemetry
modules import the SDK only when used.
"""

from sinks._configure import Configured, configure
from sinks._jsonl import CorruptLine, JsonLinesSink, JsonLinesStats, read_events
from sinks._logging_sink import LoggingSink
from sinks._otel_env import OtelSettings, read_otel_env, sample_ratio_from_env
from sinks._replay import ReplayResult, replay
from sinks.stall_watch import StallWatch

__all__ = [
    "Configured",
    "CorruptLine",
    "JsonLinesSink",
    "JsonLinesStats",
    "LoggingSink",
    "OtelSettings",
    "ReplayResult",
    "StallWatch",
    "configure",
    "read_events",
    "read_otel_env",
    "replay",
    "sample_ratio_from_env",
]
