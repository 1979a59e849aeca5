"""``RequestWatchdog``: ends a request still running at its deadline, on one kept thread per sender.

A socket timeout bounds each read, not a reply trickling in a byte at a time, so every request
is watched until its deadline. A ``threading.Timer`` per request did that at the cost of a thread
started and ended per export (measured: ~90 us of CPU each, and a GIL hand-off both ways while
the event loop serves requests). Here one daemon thread sleeps towards the deadline of the
request in flight: arming a request whose deadline is later than the one it sleeps towards (the
steady state: one request after another, each with the same budget) does not wake it; it wakes
once per budget, finds the next deadline and sleeps again. It ends after ``IDLE_EXIT`` seconds
without a request, and the next request starts it again.
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

    def arm(self, budget: float, target: T) -> None:
        """Watch ``target`` for ``budget`` seconds from now (replacing what was armed)."""
        deadline = time.monotonic() + budget
        with self._cond:
            self._armed = (deadline, target)
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

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                armed = self._armed
                if armed is None:
                    self._sleeping_until = time.monotonic() + IDLE_EXIT
                    cond.wait(IDLE_EXIT)
                    if self._armed is None:
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
