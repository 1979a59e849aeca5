"""The wall clock a ``Telemetry`` stamps with by default: the monotonic clock, set to the wall clock.

A span's end is its start plus its duration on the monotonic clock (a wall clock stepped while
it ran cannot make it negative). Its start was read from the wall clock and the monotonic one a
moment apart, so each span carried its own offset between the two: two spans ending back to back
were stamped ~1 us out of their order (28 of 36,000 events of one process's log, which the report
took for a clock stepped back, and a process it then "aligned by +0.0 ms"), and a thread switch
between the two reads (the GIL's 5 ms) stamped a span's end milliseconds early, before its own
child's start. Here every stamp of a process is one monotonic read plus one offset shared by
all (``CALIBRATION.offset``), so stamps keep the order of what they stamp, and the start costs one
clock read, not two.

The offset is read again once ``RECALIBRATE_NS`` has passed (at the next stamp after it): the
wall clock read between two monotonic reads, again if a thread switch or a preemption fell
between them (a read taking over ``_READ_SPREAD_NS``). A new offset within ``_JITTER_NS`` of the
old one is the reads' own jitter and is not taken (stamps stay in order); past it, the wall clock
was stepped or slewed (NTP, a VM resumed) and is followed: within a second of the step, as
``time.time_ns`` would have been read at each stamp.
"""

from __future__ import annotations

from time import monotonic_ns, time_ns
from typing import Final

__all__ = ["CALIBRATION", "RECALIBRATE_NS", "wall_ns"]

#: How long an offset is used before the wall clock is read again.
RECALIBRATE_NS: Final = 1_000_000_000
#: A calibration's two monotonic reads this far apart had something between them: read again.
_READ_SPREAD_NS: Final = 20_000
_READ_TRIES: Final = 3
#: A new offset this close to the old one is the reads' jitter, not the clock: the old one stays.
_JITTER_NS: Final = 20_000


class _Calibration:
    """The process's offset from the monotonic clock to the wall clock, and when to read it again."""

    __slots__ = ("due", "offset")

    def __init__(self) -> None:
        self.offset = 0
        self.due = -1  # every monotonic read is past it: the first stamp calibrates

    def recalibrate(self, mono: int) -> int:
        """Read the offset again (at ``mono``, a monotonic read just taken); the wall-clock stamp
        for ``mono``."""
        best: tuple[int, int] | None = None
        for _ in range(_READ_TRIES):
            before = monotonic_ns()
            wall = time_ns()
            after = monotonic_ns()
            spread = after - before
            if best is None or spread < best[0]:
                best = (spread, wall - (before + after) // 2)
            if spread <= _READ_SPREAD_NS:
                break
        assert best is not None
        offset = best[1]
        if self.due < 0 or abs(offset - self.offset) > _JITTER_NS:
            self.offset = offset
        self.due = mono + RECALIBRATE_NS
        return mono + self.offset


CALIBRATION: Final = _Calibration()


def wall_ns() -> int:
    """Nanoseconds since the epoch, as ``time.time_ns``, on the clock the spans' stamps are on."""
    mono = monotonic_ns()
    if mono < CALIBRATION.due:
        return mono + CALIBRATION.offset
    return CALIBRATION.recalibrate(mono)
