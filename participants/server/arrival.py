"""When a request reached the participant, and how busy its event loop was meanwhile.

``ArrivalMiddleware`` is a pure ASGI middleware (no Starlette request object, no task): it
reads the clock once per HTTP request, stores it in the request scope under ``SCOPE_KEY``
and in a context variable, so the control plane, which never sees the request, can put it
on the operation's events (``received_ns``). ``LoopLagMonitor`` sleeps ``interval`` seconds
in a loop for the app's lifetime and keeps how much each sleep overshot: a loop busy with
rollout work for 60 ms shows as a 60 ms lag. ``timed(span)`` wraps an operation: it sets
``received_ns`` when it starts and ``loop_lag_ms`` (the worst lag seen while it ran) when it
ends.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Final, Protocol

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["SCOPE_KEY", "Arrival", "ArrivalMiddleware", "LoopLagMonitor", "timed"]

#: The request-scope key of a request's ``Arrival``.
SCOPE_KEY: Final = "ckpt_events.arrival"
#: 50 ms between samples: ~20 wake-ups a second, each a few microseconds.
DEFAULT_INTERVAL: Final = 0.05
#: Samples kept: 10 s at the default interval, plenty for one operation.
_KEEP: Final = 200


class LoopLagMonitor:
    """The event loop's lag, sampled by sleeping ``interval`` seconds and timing the overshoot."""

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        # (sample end ns, overshoot ms), newest last; bounded.
        self._samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=_KEEP)
        self._asleep_since: int | None = None

    async def run(self) -> None:
        """Sample until cancelled (the app's lifespan runs it in its task group)."""
        while True:
            before = time.perf_counter_ns()
            self._asleep_since = time.time_ns()
            await anyio.sleep(self.interval)
            overshoot_ms = max(0.0, (time.perf_counter_ns() - before) / 1e6 - self.interval * 1e3)
            self._samples.append((time.time_ns(), overshoot_ms))

    def max_since(self, start_ns: int) -> float:
        """The worst lag (ms) of the samples that ended after ``start_ns``, including the
        sleep in progress if it already overshot; 0.0 with no sample."""
        worst = 0.0
        for end_ns, lag in reversed(self._samples):
            if end_ns < start_ns:
                break
            worst = max(worst, lag)
        if self._asleep_since is not None:
            pending = (time.time_ns() - self._asleep_since) / 1e6 - self.interval * 1e3
            worst = max(worst, pending)
        return round(worst, 3)


class Arrival:
    """One request's arrival time (Unix ns) and the app's lag monitor."""

    __slots__ = ("monitor", "received_ns")

    def __init__(self, received_ns: int, monitor: LoopLagMonitor | None) -> None:
        self.received_ns = received_ns
        self.monitor = monitor


_CURRENT: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("ckpt_events_arrival", default=None)


class ArrivalMiddleware:
    """Stamps each HTTP request with its arrival time before routing, parsing or auth."""

    def __init__(self, app: ASGIApp, monitor: LoopLagMonitor | None = None) -> None:
        self.app = app
        self.monitor = monitor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = Arrival(time.time_ns(), self.monitor)
        scope[SCOPE_KEY] = arrival
        token = _CURRENT.set(arrival)
        try:
            await self.app(scope, receive, send)
        finally:
            _CURRENT.reset(token)


class _Settable(Protocol):
    def set(self, *, received_ns: int | None = None, loop_lag_ms: float | None = None) -> None: ...


@contextlib.contextmanager
def timed(span: _Settable) -> Iterator[None]:
    """Put the current request's arrival and the loop lag while the block ran on ``span``.

    Outside a request that went through ``ArrivalMiddleware`` it does nothing.
    """
    arrival = _CURRENT.get()
    if arrival is None:
        yield
        return
    span.set(received_ns=arrival.received_ns)
    started = time.time_ns()
    try:
        yield
    finally:
        if arrival.monitor is not None:
            span.set(loop_lag_ms=arrival.monitor.max_since(started))
