"""One interrupt, one stop: uvicorn's server for ``serve`` and for a worker's own port.

uvicorn takes a second SIGINT for a second Ctrl-C and forces the exit: requests in flight are
cut, and ``serve``'s lifespan is cancelled before its sinks close. ``timeout -s INT`` and
supervisors signal a process and then its group, so one interrupt often arrives twice, a few
milliseconds apart; ``once_per_interrupt`` takes a SIGINT that soon after the first stop
signal for that one. It also takes SIGHUP (the terminal closed, an ssh session dropped) as
SIGTERM: uvicorn leaves it to its default action, which killed the server at once, its sinks
never closed (the spans an OTLP sink held never sent).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
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
    signal for that one (uvicorn forces the exit on a second SIGINT); a later one still forces it.
    SIGHUP stops it gracefully as SIGTERM does (and, as after SIGTERM, the process then ends of
    it), unless it was ignored (``nohup``): then it still is."""

    class OncePerInterrupt(base):  # type: ignore[misc,valid-type]  # uvicorn is imported lazily
        _first_stop: float | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                # As uvicorn does for its signals: only the main thread may set handlers.
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                if signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL:
                    yield  # ignored (nohup) or the embedder's own handler: left as it is
                    return
                signal.signal(signal.SIGHUP, self.handle_exit)
                try:
                    yield
                finally:
                    signal.signal(signal.SIGHUP, signal.SIG_DFL)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            now = time.monotonic()
            first = self._first_stop
            if first is not None and sig == signal.SIGINT and now - first < REPEATED_SIGNAL:
                return
            if first is None:
                self._first_stop = now
            super().handle_exit(sig, frame)

    return OncePerInterrupt
