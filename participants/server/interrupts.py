"""One interrupt, one stop: uvicorn's server for ``serve`` and for a worker's own port.

uvicorn takes a second SIGINT for a second Ctrl-C and forces the exit: requests in flight are
cut, and ``serve``'s lifespan is cancelled before its sinks close. ``timeout -s INT`` and
supervisors signal a process and then its group, so one interrupt often arrives twice, a few
milliseconds apart; ``once_per_interrupt`` takes a SIGINT that soon after the first stop
signal for that one.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import uvicorn

__all__ = ["REPEATED_SIGNAL", "once_per_interrupt"]

#: A second SIGINT this soon after the first is the same one delivered twice (``timeout -s INT``
#: and supervisors signal the process and then its group), not a second Ctrl-C: no person
#: presses twice within 0.1 s, and a forced exit cancels the lifespan, its events unwritten.
REPEATED_SIGNAL: Final = 0.1


def once_per_interrupt(base: type[uvicorn.Server]) -> type[uvicorn.Server]:
    """uvicorn's server (``base``), taking a SIGINT within ``REPEATED_SIGNAL`` of the first stop
    signal for that one (uvicorn forces the exit on a second SIGINT); a later one still forces it."""

    class OncePerInterrupt(base):  # type: ignore[misc,valid-type]  # uvicorn is imported lazily
        _first_stop: float | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            first = self._first_stop
            if first is not None and sig == signal.SIGINT and now - first < REPEATED_SIGNAL:
                return
            if first is None:
                self._first_stop = now
            super().handle_exit(sig, frame)

    return OncePerInterrupt
