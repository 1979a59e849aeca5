"""The JSON-lines sink (writer), the reader that reports corrupt lines without stopping, and the
open spans a log leaves (a crash mid-operation) closed as truncated."""

from ckpt_events.sinks.jsonl._open_spans import OpenSpans, emit_truncated_spans, truncated_spans
from ckpt_events.sinks.jsonl._reader import MAX_LINE, CorruptLine, read_events
from ckpt_events.sinks.jsonl._writer import JsonLinesSink, JsonLinesStats

__all__ = [
    "MAX_LINE",
    "CorruptLine",
    "JsonLinesSink",
    "JsonLinesStats",
    "OpenSpans",
    "emit_truncated_spans",
    "read_events",
    "truncated_spans",
]
