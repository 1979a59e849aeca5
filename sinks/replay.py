"""Replay a JSON-lines log into sinks or a bus."""

from sinks.jsonl._replay import ReplayResult, replay

__all__ = ["ReplayResult", "replay"]
