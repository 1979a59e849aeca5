"""Replay a JSON-lines log into sinks or a bus."""

from ckpt_events.sinks.jsonl._replay import ReplayFailure, ReplayResult, is_rotated, replay

__all__ = ["ReplayFailure", "ReplayResult", "is_rotated", "replay"]
