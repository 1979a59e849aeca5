"""Sinks for ckpt_events: OpenTelemetry spans and metrics, JSON-lines logs, and replay.

``configure(bus)`` subscribes the standard set from arguments and the environment;
``sinks.otel``, ``sinks.jsonl`` and ``sinks.replay`` hold the parts. The OpenTelemetry
modules import the SDK only when used.
"""

from sinks._configure import Configured, configure
from sinks._logging_sink import LoggingSink
from sinks.jsonl._replay import ReplayResult, replay
from sinks.jsonl._writer import CorruptLine, JsonLinesSink, JsonLinesStats, read_events
from sinks.otel._env import OtelSettings, read_otel_env, sample_ratio_from_env

__all__ = [
    "Configured",
    "CorruptLine",
    "JsonLinesSink",
    "JsonLinesStats",
    "LoggingSink",
    "OtelSettings",
    "ReplayResult",
    "configure",
    "read_events",
    "read_otel_env",
    "replay",
    "sample_ratio_from_env",
]
