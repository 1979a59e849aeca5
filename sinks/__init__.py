"""Sinks for ckpt_events: OpenTelemetry spans and metrics, JSON-lines logs, and replay.

``configure(bus)`` (``await aconfigure(bus)`` on an event loop) subscribes the standard set from
arguments and the environment (in this process, or with ``export_process=True`` in a child fed
through a pipe: ``ExportProcess``);
``otel``, ``jsonl`` and ``replay`` (under ``ckpt_events.sinks``) hold the parts. The OpenTelemetry
modules import the SDK only when used.

The names below load on first use, so ``from ckpt_events import sinks`` (and ``ckpt-events --help``) imports
neither the core's bus nor an HTTP stack until a name is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

if TYPE_CHECKING:
    from ckpt_events.sinks._configure import aconfigure, configure
    from ckpt_events.sinks._configured import Configured
    from ckpt_events.sinks._export.process import ExportProcess, ExportProcessStats
    from ckpt_events.sinks._logging_sink import LoggingSink
    from ckpt_events.sinks.jsonl._reader import CorruptLine, read_events
    from ckpt_events.sinks.jsonl._replay import ReplayFailure, ReplayResult, replay
    from ckpt_events.sinks.jsonl._writer import JsonLinesSink, JsonLinesStats
    from ckpt_events.sinks.otel._env import OtelSettings, read_otel_env, sample_ratio_from_env
    from ckpt_events.sinks.stall_watch import StallWatch

__all__ = [
    "Configured",
    "CorruptLine",
    "ExportProcess",
    "ExportProcessStats",
    "JsonLinesSink",
    "JsonLinesStats",
    "LoggingSink",
    "OtelSettings",
    "ReplayFailure",
    "ReplayResult",
    "StallWatch",
    "aconfigure",
    "configure",
    "read_events",
    "read_otel_env",
    "replay",
    "sample_ratio_from_env",
]

_HOMES: Final = {
    "Configured": "ckpt_events.sinks._configured",
    "CorruptLine": "ckpt_events.sinks.jsonl._reader",
    "ExportProcess": "ckpt_events.sinks._export.process",
    "ExportProcessStats": "ckpt_events.sinks._export.process",
    "JsonLinesSink": "ckpt_events.sinks.jsonl._writer",
    "JsonLinesStats": "ckpt_events.sinks.jsonl._writer",
    "LoggingSink": "ckpt_events.sinks._logging_sink",
    "OtelSettings": "ckpt_events.sinks.otel._env",
    "ReplayFailure": "ckpt_events.sinks.jsonl._replay",
    "ReplayResult": "ckpt_events.sinks.jsonl._replay",
    "StallWatch": "ckpt_events.sinks.stall_watch",
    "aconfigure": "ckpt_events.sinks._configure",
    "configure": "ckpt_events.sinks._configure",
    "read_events": "ckpt_events.sinks.jsonl._reader",
    "read_otel_env": "ckpt_events.sinks.otel._env",
    "replay": "ckpt_events.sinks.jsonl._replay",
    "sample_ratio_from_env": "ckpt_events.sinks.otel._env",
}

# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`from ckpt_events import Bsu`) an Any that mypy --strict let through.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals())
# The helpers are not names of this package (dir() lists the namespace).
del TYPE_CHECKING, lazy_attributes
