"""One interrupt, one stop: uvicorn's server for ``serve`` and for a worker's own port.

uvicorn takes a second SIGINT for a second Ctrl-C and forces the exit: requests in flight are
cut, and ``serve``'s lifespan is cancelled before its sinks close. ``timeout -s INT`` and
supervisors signal a process and then its group, so one interrupt often arrives twice, a few
milliseconds apart; ``once_per_interrupt`` takes a SIGINT that soon after the first stop
signal for that one. It also takes SIGHUP (the terminal closed, an ssh session dropped) as
SIGTERM: uvicorn leaves it to its default action, which killed the server at once, its sinks
never closed (the spans an OTLP sink held never sent).

A forced exit cancels the requests still running at once. uvicorn only stops waiting for them
and then awaits ``asyncio.Server.wait_closed()``, which since Python 3.12 waits for every
connection to close: a request still reading its body held the "forced" exit until the
graceful-shutdown deadline (without one, until the request ended), where on 3.11 it ended at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import uvicorn

__all__ = ["FORCED_EXIT", "REPEATED_SIGNAL", "once_per_interrupt"]

#: A second SIGINT this soon after the first is the same interrupt: the same one delivered twice
#: (``timeout -s INT`` and supervisors signal the process and then its group), or Ctrl-C pressed
#: twice quickly by someone who wants the stop, not its force. Forced, the exit cancels the
#: lifespan, its events unwritten; the graceful stop is bounded (``timeout_graceful_shutdown``).
#: As ``ckpt-events demo`` takes a second signal (``REPEATED_INTERRUPT``, 1 s).
REPEATED_SIGNAL: Final = 1.0

#: The message of the cancellation a forced exit sends each running request (uvicorn's own, at
#: its graceful-shutdown deadline, names that deadline; the two are logged apart).
FORCED_EXIT: Final = "Task cancelled, the exit was forced"


def once_per_interrupt(base: type[uvicorn.Server]) -> type[uvicorn.Server]:
    """uvicorn's server (``base``), taking a SIGINT within ``REPEATED_SIGNAL`` of the first stop
    signal for that one (uvicorn forces the exit on a second SIGINT); a later one still forces it.
    SIGHUP stops it gracefully as SIGTERM does (and, as after SIGTERM, the process then ends of
    it), unless it was ignored (``nohup``): then it still is. A forced exit cancels the requests
    still running then, on every Python (see the module's docstring)."""

    class OncePerInterrupt(base):  # type: ignore[misc,valid-type]  # uvicorn is imported lazily
        _first_stop: float | None = None
        _cut: bool = False

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
            if self.force_exit and not self._cut:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    return  # not serving (yet or any more): no request to cut
                self._cut = True
                # A signal handler runs between two bytecodes of whatever the loop was doing:
                # the cancellations are scheduled, not made from here.
                loop.call_soon_threadsafe(self._cancel_running)

        def _cancel_running(self) -> None:
            for task in list(self.server_state.tasks):
                task.cancel(msg=FORCED_EXIT)

    return OncePerInterrupt
