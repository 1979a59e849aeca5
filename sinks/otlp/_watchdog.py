"""``RequestWatchdog``: ends a request still running at its deadline, on one kept thread per sender.

A socket timeout bounds each read, not a reply trickling in a byte at a time, so every request
is watched until its deadline. A ``threading.Timer`` per request did that at the cost of a thread
started and ended per export (measured: ~90 us of CPU each, and a GIL hand-off both ways while
the event loop serves requests). Here one daemon thread sleeps towards the deadline of the
request in flight: arming a request whose deadline is later than the one it sleeps towards (the
steady state: one request after another, each with the same budget) does not wake it; it wakes
once per budget, finds the next deadline and sleeps again. It ends after ``IDLE_EXIT`` seconds
without a request, or at once on ``stop()`` (a sink's shutdown: the thread stayed up to 30 s
after its sink closed), and the next request starts it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar

__all__ = ["IDLE_EXIT", "RequestWatchdog"]

#: Seconds the thread waits for a next request before it ends (a sender no longer used keeps no thread).
IDLE_EXIT: Final = 30.0

T = TypeVar("T")


class RequestWatchdog(Generic[T]):
    """Calls ``expire(target)`` if the request armed with ``target`` is still armed at its deadline."""

    def __init__(self, expire: Callable[[T], object], name: str) -> None:
        self._expire = expire
        self._name = name
        self._cond = threading.Condition()
        self._armed: tuple[float, T] | None = None  # (monotonic deadline, target)
        self._sleeping_until: float | None = None  # the thread's wake-up time (inf: none)
        self._thread: threading.Thread | None = None
        self._stopping = False  # stop(): end once nothing is armed, not after IDLE_EXIT

    def arm(self, budget: float, target: T) -> None:
        """Watch ``target`` for ``budget`` seconds from now (replacing what was armed)."""
        deadline = time.monotonic() + budget
        with self._cond:
            self._armed = (deadline, target)
            self._stopping = False
            if self._thread is None:
                self._sleeping_until = None
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._sleeping_until is not None and deadline < self._sleeping_until:
                self._cond.notify()  # it sleeps past this deadline: wake it to sleep less

    def disarm(self) -> None:
        """The request ended: nothing to watch (the thread is not woken for it)."""
        with self._cond:
            self._armed = None

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread now if nothing is armed, waiting up to ``timeout`` for it; a request
        still armed keeps it until its deadline (never later). A later ``arm`` starts it again."""
        with self._cond:
            self._stopping = True
            thread = self._thread if self._armed is None else None
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                armed = self._armed
                if armed is None and self._stopping:
                    self._thread = None
                    return
                if armed is None:
                    self._sleeping_until = time.monotonic() + IDLE_EXIT
                    cond.wait(IDLE_EXIT)
                    if self._armed is None and not self._stopping:
                        self._thread = None  # the next arm() starts a new thread
                        return
                    continue
                deadline, target = armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._sleeping_until = deadline
                    cond.wait(left)
                    continue
                self._armed = None
            self._expire(target)
