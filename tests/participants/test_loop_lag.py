"""``ckpt_events.participants.loop_lag``: the event loop's lag, as an operation records it."""

from __future__ import annotations

import sys
import threading
import time

import anyio

from ckpt_events.participants import fastapi, loop_lag
from ckpt_events.participants.loop_lag import LoopLagMonitor


def test_the_fastapi_integration_re_exports_the_monitor() -> None:
    """``participants.fastapi.LoopLagMonitor`` (public there) is the very class of its own module."""
    assert "LoopLagMonitor" in fastapi.__all__
    assert fastapi.LoopLagMonitor is loop_lag.LoopLagMonitor
    assert LoopLagMonitor.__module__ == "ckpt_events.participants.loop_lag"


async def test_monitor_sees_a_blocked_loop() -> None:
    """A loop blocked for 120 ms shows a lag of at least 100 ms; the sample is taken after it."""
    monitor = LoopLagMonitor(interval=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await anyio.sleep(0.03)
        start = time.time_ns()
        time.sleep(0.12)  # blocks the event loop, as a busy handler would
        await anyio.sleep(0.03)
        lag = monitor.max_since(start)
        tg.cancel_scope.cancel()
    assert lag >= 100.0


async def test_monitor_is_read_safely_from_the_threadpool() -> None:
    """A sync (``def``) endpoint's operation ends in a worker thread, reading the monitor while
    the loop appends samples: it raised 'deque mutated during iteration' into the handler."""
    monitor = LoopLagMonitor(interval=0)
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                monitor.max_since(0)
            except Exception as exc:  # the failure this test looks for
                errors.append(exc)
                return

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often, as a loaded server's do
    readers = [threading.Thread(target=read) for _ in range(2)]
    try:
        for reader in readers:
            reader.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(monitor.run)
            with anyio.move_on_after(1.0):
                while not errors:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    finally:
        stop.set()
        for reader in readers:
            reader.join()
        sys.setswitchinterval(switch)
    assert errors == []


async def test_a_stopped_monitor_reports_no_lag_of_its_own() -> None:
    """Once ``run()`` is cancelled (the app's lifespan ended), the sleep it was in is over: a
    read after it counted the whole time since that sleep began as lag (~500 ms here)."""
    monitor = LoopLagMonitor(interval=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    await anyio.sleep(0.5)  # the loop is idle, not blocked
    assert monitor.max_since(time.time_ns()) < 50.0


async def test_a_block_that_ended_before_an_operation_is_not_its_lag() -> None:
    """An operation started right after another handler blocked the loop, before the monitor
    woke to take that sample, was charged the whole block (~300 ms, longer than it ran) though
    the loop ran freely all through it: a sample counts only its part after ``start_ns``."""
    monitor = LoopLagMonitor(interval=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await anyio.sleep(0.03)
        time.sleep(0.3)  # a handler blocks the loop, and returns
        start = time.time_ns()  # the next operation starts before the monitor wakes up
        await anyio.sleep(0.1)  # and awaits calmly
        lag = monitor.max_since(start)
        tg.cancel_scope.cancel()
    assert lag < 50.0
