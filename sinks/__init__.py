"""Sinks for ckpt_events: OpenTelemetry spans and metrics, JSON-lines logs, and replay.

``configure(bus)`` subscribes the standard set from arguments and the environment;
``sinks.otel``, ``sinks.jsonl`` and ``sinks.replay`` hold the parts. The OpenTelemetry
modules import the SDK only when used.

The names below load on first use, so ``import sinks`` (and ``ckpt-events --help``) imports
neither the core's bus nor an HTTP stack until a name is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

if TYPE_CHECKING:
    from sinks._configure import Configured, configure
    from sinks._logging_sink import LoggingSink
    from sinks.jsonl._reader import CorruptLine, read_events
    from sinks.jsonl._replay import ReplayResult, replay
    from sinks.jsonl._writer import JsonLinesSink, JsonLinesStats
    from sinks.otel._env import OtelSettings, read_otel_env, sample_ratio_from_env
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

_HOMES: Final = {
    "Configured": "sinks._configure",
    "CorruptLine": "sinks.jsonl._reader",
    "JsonLinesSink": "sinks.jsonl._writer",
    "JsonLinesStats": "sinks.jsonl._writer",
    "LoggingSink": "sinks._logging_sink",
    "OtelSettings": "sinks.otel._env",
    "ReplayResult": "sinks.jsonl._replay",
    "StallWatch": "sinks.stall_watch",
    "configure": "sinks._configure",
    "read_events": "sinks.jsonl._reader",
    "read_otel_env": "sinks.otel._env",
    "replay": "sinks.jsonl._replay",
    "sample_ratio_from_env": "sinks.otel._env",
}

__getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals())
# The helpers are not names of this package (dir() lists the namespace).
del TYPE_CHECKING, lazy_attributes
