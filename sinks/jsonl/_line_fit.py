"""What makes an event's JSON line one ``read_events`` reads back: every line within its bound
(``lines_fit``), and the fields of an event whose line was not, with long strings cut
(``cut_text``) or lone surrogates replaced (``replace_text``), for the JSON-lines sink to write
again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ckpt_events.sinks._wire_safe import replace_surrogates

__all__ = ["CUT_TO", "cut_text", "lines_fit", "replace_text"]

#: The characters a string keeps in an event whose line was too long to read back.
CUT_TO: Final = 1024


def lines_fit(data: bytes | bytearray, limit: int) -> bool:
    """Whether every line of ``data`` (whole lines, each ending in a newline) is at most
    ``limit`` bytes without its newline: one ``rfind`` per ``limit`` bytes, not one per line."""
    start, size = 0, len(data)
    while size - start > limit + 1:  # what is left may hold a line too long
        end = data.rfind(b"\n", start, start + limit + 1)
        if end < 0:  # no newline within limit bytes of a line's start
            return False
        start = end + 1
    return True


def cut_text(value: Any) -> tuple[Any, int]:
    """``value`` (``msgspec.to_builtins`` output) with each string past ``CUT_TO`` characters cut
    to that, and how many were."""
    return _map_text(value, lambda text: text[:CUT_TO])


def replace_text(value: Any) -> tuple[Any, int]:
    """``value`` (``msgspec.to_builtins`` output) with surrogates replaced, and how many strings changed."""
    return _map_text(value, replace_surrogates)


def _map_text(value: Any, change: Callable[[str], str]) -> tuple[Any, int]:
    """``value`` with ``change`` applied to every string in it (dict keys too), and how many it changed."""
    if isinstance(value, str):
        changed = change(value)
        return changed, int(changed != value)
    if isinstance(value, dict):
        count = 0
        out = {}
        for key, item in value.items():
            new_key, key_changed = _map_text(key, change)
            out[new_key], item_changed = _map_text(item, change)
            count += key_changed + item_changed
        return out, count
    if isinstance(value, list):
        pairs = [_map_text(item, change) for item in value]
        return [item for item, _ in pairs], sum(changed for _, changed in pairs)
    return value, 0
