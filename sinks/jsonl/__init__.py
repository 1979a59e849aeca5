"""The JSON-lines sink (writer), the reader that reports corrupt lines without stopping."""

from ckpt_events.sinks.jsonl._reader import CorruptLine, read_events
from ckpt_events.sinks.jsonl._writer import JsonLinesSink, JsonLinesStats

__all__ = ["CorruptLine", "JsonLinesSink", "JsonLinesStats", "read_events"]
