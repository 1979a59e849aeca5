"""The JSON-lines sink, and the reader that reports corrupt lines without stopping."""

from sinks.jsonl._writer import CorruptLine, JsonLinesSink, JsonLinesStats, read_events

__all__ = ["CorruptLine", "JsonLinesSink", "JsonLinesStats", "read_events"]
