"""Numbers and text in words for what the command line prints: ``1 rollout``, ``2 rollouts``,
``0.004 MB/s``, a long message cut at a word with ``…``."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from typing import Final

__all__ = ["clipped", "close_choice", "counted", "milliseconds", "rate"]

#: Where a clipped text may end: before a space, or after a separator inside a long token
#: (a URL, a path, a dotted name).
_BREAK: Final = re.compile(r"\s|(?<=[/.,;:=&?)\]])")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` (with thousands separators) and ``noun``, or its plural (``noun + "s"`` unless
    given) for any count but one."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def close_choice(value: object, choices: Iterable[object]) -> str | None:
    """The one of ``choices`` that ``value`` looks like a typo of, if any: what a refused
    choice is said with (``agnt``: did you mean 'agent'?)."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], 1)
    return close[0] if close else None


def clipped(text: str, most: int) -> str:
    """``text`` on one line, at most ``most`` characters: cut at the last word boundary that fits,
    with ``…``, never inside a word (a token longer than half of ``most`` is cut at its last
    ``/``, ``.``, ``:`` or similar; only one with none of them is cut where it must)."""
    flat = " ".join(text.split())
    if len(flat) <= most:
        return flat
    room = flat[: max(1, most - 1)]
    if not flat[len(room)].isspace():
        ends = [m.start() if m.group().isspace() else m.end() for m in _BREAK.finditer(room)]
        # A token of more than half of ``most`` with no separator is cut where it must: cut
        # before it, a 1,024-character message of one token said nothing ("ValueError…").
        if ends and ends[-1] > 0 and len(room) - ends[-1] <= most // 2:
            room = room[: ends[-1]]
    return room.rstrip(" ,;:") + "…"


def milliseconds(value: float) -> str:
    """``12.3 ms``; under 1 ms with two significant digits (``0.056 ms``, ``0.0081 ms``), so a
    handler that took 56 us never reads ``0.0 ms``; ``0 ms`` only for nothing at all."""
    if value <= 0:
        return "0 ms"
    # Rounded to two significant digits first: 0.09996 is 0.10, not 0.100, and 0.99996 is 1.0.
    value = float(f"{value:.2g}") if value < 1 else value
    if value >= 1:
        return f"{value:.1f} ms"
    # Durations are whole nanoseconds (1e-6 ms): seven decimals show any of them.
    digits = min(7, 1 - math.floor(math.log10(value)))
    return f"{value:.{digits}f} ms"


def rate(nbytes: float, seconds: float) -> str:
    """Bytes per second with three significant digits in the unit that shows them (``B/s``,
    ``kB/s``, ``MB/s``, ``GB/s``): never ``0.00`` for a rate that is not zero."""
    per_s = nbytes / seconds if seconds > 0 else 0.0
    unit = "B/s"
    for bigger in ("kB/s", "MB/s", "GB/s"):
        if per_s < 999.5:  # what would print as 1000 is 1.00 of the next unit
            break
        per_s, unit = per_s / 1000, bigger
    if per_s == 0:
        return f"0 {unit}"
    digits = 0 if per_s >= 100 else 1 if per_s >= 10 else 2
    return f"{per_s:.{digits}f} {unit}"
