"""The JSON-lines sink (writer), the reader that reports corrupt lines without stopping, the
open spans a log leaves (a crash mid-operation) closed as truncated, and the names of rotated logs
(numbered, or logrotate's ``dateext``)."""

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
