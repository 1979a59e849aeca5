"""The event loop's lag: how late a sleep wakes up, sampled by a task of the loop itself.

``LoopLagMonitor.run()`` sleeps ``interval`` seconds at a time and keeps how much each sleep
overshot; ``max_since(start_ns)`` is the worst lag seen since ``start_ns`` (the sleep in
progress included, none once ``run()`` has stopped), which an operation records as
``loop_lag_ms`` when it ends. A loop blocked by other work (a sync call in a handler, a long
parse) shows up there.

A leaf of its own, apart from the FastAPI integration that runs one per app
(``ckpt_events.participants.fastapi.instrument``, which re-exports ``LoopLagMonitor``): a
multi-worker server's worker processes run one each, with or without a FastAPI app.
"""

from __future__ import annotations

import collections
import time
from typing import Final

import anyio

__all__ = ["DEFAULT_LAG_INTERVAL", "LoopLagMonitor"]

#: 50 ms between loop-lag samples: ~20 wake-ups a second, each a few microseconds.
DEFAULT_LAG_INTERVAL: Final = 0.05
#: Samples kept: 10 s at the default interval, plenty for one operation.
_KEEP: Final = 200


class LoopLagMonitor:
    """The event loop's lag, sampled by sleeping ``interval`` seconds and timing the overshoot."""

    def __init__(self, interval: float = DEFAULT_LAG_INTERVAL) -> None:
        self.interval = interval
        # (sample end ns, overshoot ms), newest last; bounded.
        self._samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=_KEEP)
        self._asleep_since: int | None = None

    async def run(self) -> None:
        """Sample until cancelled (``instrument``'s lifespan runs it in its task group); a
        monitor stopped has no sleep in progress, so it adds no lag of its own to a read."""
        try:
            while True:
                before = time.perf_counter_ns()
                self._asleep_since = time.time_ns()
                await anyio.sleep(self.interval)
                overshoot_ms = max(0.0, (time.perf_counter_ns() - before) / 1e6 - self.interval * 1e3)
                self._samples.append((time.time_ns(), overshoot_ms))
        finally:
            # The sleep cancelled is over: kept, a read after the stop (the first operation of a
            # lifespan run again, before the new run's first wake-up) counted the idle time since.
            self._asleep_since = None

    def max_since(self, start_ns: int) -> float:
        """The worst lag (ms) of the samples that ended after ``start_ns``, including the
        sleep in progress if it already overshot, each counted only for its time after
        ``start_ns``; 0.0 with no sample. Safe from any thread."""
        worst = 0.0
        now_ns = time.time_ns()
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
        return round(worst, 3)
