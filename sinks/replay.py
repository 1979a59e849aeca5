"""Replay a JSON-lines log into sinks or a bus."""

from ckpt_events.sinks.jsonl._replay import ReplayResult, replay

__all__ = ["ReplayResult", "replay"]
