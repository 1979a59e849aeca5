"""The JSON-lines sink (writer), the reader that reports corrupt lines without stopping, the
open spans a log leaves (a crash mid-operation) closed as truncated, and the names of rotated logs
(numbered, or logrotate's ``dateext``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

if TYPE_CHECKING:
    from ckpt_events.sinks.jsonl._open_spans import OpenSpans, emit_truncated_spans, truncated_spans
    from ckpt_events.sinks.jsonl._reader import MAX_LINE, CorruptLine, read_events
    from ckpt_events.sinks.jsonl._rotation import RotatedName, oldest_first, rotated_name
    from ckpt_events.sinks.jsonl._writer import JsonLinesSink, JsonLinesStats

__all__ = [
    "MAX_LINE",
    "CorruptLine",
    "JsonLinesSink",
    "JsonLinesStats",
    "OpenSpans",
    "RotatedName",
    "emit_truncated_spans",
    "oldest_first",
    "read_events",
    "rotated_name",
    "truncated_spans",
]

# On first use: the writer (what `configure(jsonl_path=...)` needs) loaded the reader and its
# decoders with it (19 ms of `from ckpt_events.sinks import configure`).
_HOMES: Final = {
    "MAX_LINE": "ckpt_events.sinks.jsonl._reader",
    "CorruptLine": "ckpt_events.sinks.jsonl._reader",
    "JsonLinesSink": "ckpt_events.sinks.jsonl._writer",
    "JsonLinesStats": "ckpt_events.sinks.jsonl._writer",
    "OpenSpans": "ckpt_events.sinks.jsonl._open_spans",
    "RotatedName": "ckpt_events.sinks.jsonl._rotation",
    "emit_truncated_spans": "ckpt_events.sinks.jsonl._open_spans",
    "oldest_first": "ckpt_events.sinks.jsonl._rotation",
    "read_events": "ckpt_events.sinks.jsonl._reader",
    "rotated_name": "ckpt_events.sinks.jsonl._rotation",
    "truncated_spans": "ckpt_events.sinks.jsonl._open_spans",
}

# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`from ckpt_events import Bsu`) an Any that mypy --strict let through.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals())
del TYPE_CHECKING, lazy_attributes
