"""Counts in words for what the command line prints: ``1 rollout``, ``2 rollouts``."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` (with thousands separators) and ``noun``, or its plural (``noun + "s"`` unless
    given) for any count but one."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
