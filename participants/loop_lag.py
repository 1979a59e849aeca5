"""The event loop's lag: how late a sleep wakes up, sampled by a task of the loop itself.

``LoopLagMonitor.run()`` sleeps ``interval`` seconds at a time and keeps how much each sleep
overshot; ``max_since(start_ns)`` is the worst lag seen since ``start_ns`` (the sleep in
progress included), which an operation records as ``loop_lag_ms`` when it ends
(``max_since_monotonic`` from a ``time.monotonic_ns()`` start, which a step of the wall clock
while it ran does not move: the monitor's own stamps are all monotonic). A loop
blocked by other work (a sync call in a handler, a long parse) shows up there.

``run(wanted)`` samples only while ``wanted()`` is true: the FastAPI integration passes
whether a sink of its bus wants ``OperationFinished`` (the event that carries the lag), so with
telemetry off, or no sink wanting operations, it checks once a second (``PARKED_RECHECK``) and
wakes the loop for nothing else. ``run(on_demand=True)`` (the FastAPI integration's) samples
only while an operation timed with ``begin()``/``end()`` is open, and otherwise sleeps until
one begins, with no timer at all: an idle server with a sink woke 20 times a second for it
(3.7 ms of CPU a second, more than uvicorn's own 10 wake-ups and 1.7 ms). The wake-up that
``begin()`` asks for is itself a sample, due as the operation begins: how late it comes is the
loop's lag from the operation's start, so an operation is measured whole. An operation the monitor did not
sample from its start to its end (it began while parked, or ran when ``run()`` stopped) gets
``None`` from ``max_since``, recorded as no ``loop_lag_ms`` (unknown), never a 0.0 unmeasured.

A leaf of its own, apart from the FastAPI integration that runs one per app
(``ckpt_events.participants.fastapi.instrument``, which re-exports ``LoopLagMonitor``): a
multi-worker server's worker processes run one each, with or without a FastAPI app.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable
from typing import Final

import anyio
import anyio.abc
import anyio.lowlevel

from ckpt_events.checks import library_logger, shown

__all__ = ["DEFAULT_LAG_INTERVAL", "PARKED_RECHECK", "LoopLagMonitor"]

#: 50 ms between loop-lag samples: ~20 wake-ups a second, each a few microseconds.
DEFAULT_LAG_INTERVAL: Final = 0.05
#: Samples kept: 10 s at the default interval, plenty for one operation.
_KEEP: Final = 200
#: Seconds between checks of whether a sink wants the lag, while none does: an idle server with
#: telemetry off woke 58 times a second with the monitor sampling (20 without ``instrument``).
PARKED_RECHECK: Final = 1.0

logger: Final = library_logger("ckpt_events")


class LoopLagMonitor:
    """The event loop's lag, sampled by sleeping ``interval`` seconds and timing the overshoot."""

    def __init__(self, interval: float = DEFAULT_LAG_INTERVAL) -> None:
        self.interval = interval
        # (sample end, monotonic ns; overshoot ms), newest last; bounded. Monotonic, as are the two
        # stamps below: with wall stamps, the wall clock stepped back 10 s read an operation begun
        # while parked as sampled whole (0.0, unmeasured), and hid a sample's 300 ms overshoot.
        self._samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=_KEEP)
        self._asleep_since: int | None = None
        # Since when (monotonic ns) the monitor has sampled without a pause; None while parked or
        # stopped. An operation that began before it was not sampled whole: its lag is unknown.
        self._sampling_since: int | None = None
        #: Samples taken since the monitor was made (each one a wake-up of the loop).
        self.samples_taken = 0
        self._wanted_failed = False
        # Operations open between begin() and end(), and what wakes run() parked for want of one
        # (``None`` unless it is): both changed under the lock, from the loop or a worker thread.
        self._lock = threading.Lock()
        self._open = 0
        self._wake_parked: Callable[[], object] | None = None

    @property
    def sampling(self) -> bool:
        """Whether the monitor is sampling now (running, and a sink wants the lag)."""
        return self._sampling_since is not None

    async def run(
        self,
        wanted: Callable[[], bool] | None = None,
        *,
        on_demand: bool = False,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample until cancelled (``instrument``'s lifespan runs it in its task group), while
        ``wanted()`` is true (always, with no ``wanted``: e.g. ``partial(bus.wants,
        OperationFinished)``, some sink wants the event that carries the lag); otherwise parked,
        checking again every ``PARKED_RECHECK`` seconds (a ``wanted`` that raises counts as
        wanted, logged once: it never ends the server). A monitor stopped or parked
        has no sleep in progress, so it adds no lag of its own to a read.

        With ``on_demand``, it samples only while an operation begun with ``begin()`` is open,
        and sleeps without a timer otherwise (``wanted`` asked only then); ``begin()`` wakes it.

        Started with ``TaskGroup.start``, it is sampling (or parked) when that returns, so an
        operation begun right after is measured whole."""
        schedule = _threadsafe_scheduler() if on_demand else None
        try:
            while True:
                if schedule is not None and await self._parked_until_an_operation(schedule, task_status):
                    task_status = anyio.TASK_STATUS_IGNORED
                    continue
                if wanted is not None and not self._asks(wanted):
                    self._sampling_since = None
                    self._asleep_since = None
                    task_status.started()
                    task_status = anyio.TASK_STATUS_IGNORED
                    await anyio.sleep(PARKED_RECHECK)
                    continue
                if self._sampling_since is None:
                    self._sampling_since = time.monotonic_ns()
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                # One monotonic clock for the sleep's start, its overshoot and the sample's stamp
                # (it was read four times a sample, perf_counter beside monotonic).
                self._asleep_since = before = time.monotonic_ns()
                await anyio.sleep(self.interval)
                woke = time.monotonic_ns()
                overshoot_ms = max(0.0, (woke - before) / 1e6 - self.interval * 1e3)
                self._samples.append((woke, overshoot_ms))
                self.samples_taken += 1
        finally:
            # The sleep cancelled is over: kept, a read after the stop (the first operation of a
            # lifespan run again, before the new run's first wake-up) counted the idle time since.
            with self._lock:
                self._wake_parked = None
                self._asleep_since = None
                self._sampling_since = None

    async def _parked_until_an_operation(
        self, schedule: Callable[[Callable[[], object]], object], task_status: anyio.abc.TaskStatus[None]
    ) -> bool:
        """With no operation open, sleep until ``begin()`` wakes this, and take that wake-up
        as a sample (``begin()`` set it due then); ``False`` at once when one is open."""
        woken = anyio.Event()
        with self._lock:
            if self._open:
                return False
            self._sampling_since = None
            self._asleep_since = None
            self._wake_parked = functools.partial(schedule, woken.set)
        task_status.started()
        try:
            await woken.wait()
        finally:
            with self._lock:
                self._wake_parked = None
        woke = time.monotonic_ns()
        before = self._asleep_since
        if before is not None:  # set by begin() as it woke this, and not cleared since
            self._samples.append((woke, max(0.0, (woke - before) / 1e6 - self.interval * 1e3)))
            self.samples_taken += 1
            self._asleep_since = None
        return True

    def begin(self) -> int:
        """An operation begins: returns its start (``time.monotonic_ns()``) for
        ``max_since_monotonic``; a monitor run ``on_demand`` and parked is woken, its wake-up a
        sample due now, so the operation is measured from here. Pair with ``end()``. Safe from
        any thread; ~0.3 us."""
        now = time.monotonic_ns()
        with self._lock:
            self._open += 1
            wake = self._wake_parked
            if wake is not None:
                self._wake_parked = None
                # A sleep of one interval ending now: its overshoot is how late run() wakes.
                self._asleep_since = now - round(self.interval * 1e9)
                self._sampling_since = now
                try:
                    wake()
                except RuntimeError:  # its loop closed under it: nothing samples, the lag is unknown
                    self._asleep_since = None
                    self._sampling_since = None
        return now

    def end(self) -> None:
        """An operation begun with ``begin()`` ended: with none open, an ``on_demand`` monitor
        parks after its sample in progress."""
        with self._lock:
            self._open = max(0, self._open - 1)

    def _asks(self, wanted: Callable[[], bool]) -> bool:
        """``wanted()``; one that raises counts as wanted (sampled: a lag measured is never
        wrong), said once: it ended ``run()``, and with it the task group of the server that ran
        it (an ``ExceptionGroup`` out of the app's lifespan)."""
        try:
            return bool(wanted())
        except Exception as exc:
            if not self._wanted_failed:
                self._wanted_failed = True
                logger.warning(
                    "ckpt_events: the loop-lag monitor's wanted() raised %s: %s; the monitor samples as "
                    "if wanted (said once): make wanted() return True or False without raising",
                    type(exc).__name__,
                    shown(str(exc)),  # quoted: one line, whatever the user's exception says
                )
            return True

    def max_since(self, start_ns: int) -> float | None:
        """``max_since_monotonic`` of ``start_ns`` (Unix ns) taken to the monotonic clock at the
        read: a step of the wall clock since ``start_ns`` moves it by the step, which
        ``max_since_monotonic`` from a monotonic start does not."""
        return self.max_since_monotonic(start_ns - time.time_ns() + time.monotonic_ns())

    def max_since_monotonic(self, start_ns: int) -> float | None:
        """The worst lag (ms) of the samples that ended after ``start_ns``
        (``time.monotonic_ns()``), including the sleep in progress if it already overshot, each
        counted only for its time after ``start_ns``; 0.0 when sampled throughout and no sample
        overshot. ``None`` (unknown) unless the monitor has sampled without a pause from
        ``start_ns`` until now (it was parked or stopped for part of that time). Safe from any
        thread."""
        worst = 0.0
        now_ns = time.monotonic_ns()
        # By index from the newest, not an iterator: a sync endpoint's operation ends in a
        # worker thread while the loop appends, and iterating raised "deque mutated during
        # iteration". The deque only grows to its maxlen, so an index stays valid; an append
        # meanwhile shifts it to a newer sample, harmless for a maximum. (A copy cost 3 us.)
        samples = self._samples
        i = len(samples)
        while i:
            i -= 1
            end_ns, lag = samples[i]
            if end_ns < start_ns:
                break
            # Only the part of a sample's overshoot after start_ns: an operation that began
            # just after another handler blocked the loop, before this task woke to record
            # the block, was charged all of it, more than it had run, on a free loop.
            worst = max(worst, min(lag, (end_ns - start_ns) / 1e6))
        asleep_since = self._asleep_since  # read once: run() may clear it from the loop meanwhile
        if asleep_since is not None:
            pending = (now_ns - asleep_since) / 1e6 - self.interval * 1e3
            worst = max(worst, min(pending, (now_ns - start_ns) / 1e6))
        # Checked last, read once: the reads above cost what they did before this check.
        sampling_since = self._sampling_since
        if sampling_since is None or sampling_since > start_ns:
            return None
        return round(worst, 3)


def _threadsafe_scheduler() -> Callable[[Callable[[], object]], object]:
    """How any thread (the loop's own too) schedules a callback on the current event loop,
    without waiting for it: asyncio's ``call_soon_threadsafe``, trio's ``run_sync_soon``."""
    native = anyio.lowlevel.current_token().native_token
    call_soon = getattr(native, "call_soon_threadsafe", None)  # asyncio's loop
    if call_soon is not None:
        return call_soon  # type: ignore[no-any-return]
    return native.run_sync_soon  # type: ignore[attr-defined,no-any-return]  # trio's token
