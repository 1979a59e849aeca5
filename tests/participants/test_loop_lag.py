"""``ckpt_events.participants.loop_lag``: the event loop's lag, as an operation records it."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request

from ckpt_events import OperationFinished, OperationStarted, Subscription
from ckpt_events.participants import fastapi, loop_lag
from ckpt_events.participants.loop_lag import LoopLagMonitor
from ckpt_events.testing import MemorySink


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
    read after it counted the whole time since that sleep began as lag (~500 ms here); and
    since nothing was sampled, the lag is unknown (``None``), not a 0.0 as if measured."""
    monitor = LoopLagMonitor(interval=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    await anyio.sleep(0.5)  # the loop is idle, not blocked
    assert monitor.max_since(time.time_ns()) is None


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


def _app_with_monitor(
    sink: MemorySink | None, handler: Callable[[Request], Awaitable[dict[str, Any]]]
) -> tuple[FastAPI, LoopLagMonitor]:
    """An instrumented app (``sink`` subscribed at startup, if any) whose ``POST /op`` runs ``handler``."""
    app = FastAPI()
    fastapi.instrument(
        app,
        kind="judge",
        instance="judge-0",
        configure_sinks=lambda bus: None if sink is None else bus.subscribe(sink),
    )
    app.post("/op")(handler)
    monitor = app.state.ckpt_events.monitor
    assert isinstance(monitor, LoopLagMonitor)
    return app, monitor


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def _until_sampling(monitor: LoopLagMonitor) -> float:
    """Seconds until ``monitor`` samples (at most 3 s)."""
    started = time.monotonic()
    with anyio.fail_after(3.0):
        while not monitor.sampling:
            await anyio.sleep(0.01)
    return time.monotonic() - started


async def _blocking(request: Request) -> dict[str, Any]:
    with fastapi.operation(request, "commit", checkpoint_id="c1"):
        time.sleep(0.2)  # blocks the event loop, as a sync call in a handler would
    return {}


async def _until_parked(monitor: LoopLagMonitor) -> None:
    """Until ``monitor`` has woken and stopped sampling (at most 3 s)."""
    with anyio.fail_after(3.0):
        while monitor.sampling:
            await anyio.sleep(0.01)


async def test_an_app_with_no_sink_wanting_operations_samples_nothing_then_a_sink_gets_the_lag() -> None:
    """With no sink, the monitor took ~10 samples in 0.5 s (20 wake-ups a second for nothing);
    it takes none now, and the first operation after a sink subscribed gets its lag measured."""
    app, monitor = _app_with_monitor(None, _blocking)
    async with _serving(app) as client:
        await anyio.sleep(0.5)
        assert monitor.samples_taken == 0 and not monitor.sampling
        sink = MemorySink()
        app.state.ckpt_events.bus.subscribe(sink)
        await anyio.sleep(0.1)
        assert monitor.samples_taken == 0 and not monitor.sampling  # no operation: nothing to time
        assert (await client.post("/op")).status_code == 200
        await app.state.ckpt_events.bus.flush()
    (finished,) = sink.of_type(OperationFinished)
    assert finished.loop_lag_ms is not None and finished.loop_lag_ms >= 100.0
    assert monitor.samples_taken > 0


async def test_an_operation_not_sampled_whole_reports_no_lag() -> None:
    """An operation begun while the monitor was parked because no sink wanted the lag (a sink
    wants OperationStarted only), which saw it start sampling midway, reports no ``loop_lag_ms``
    (unknown), never 0.0; one begun while it slept for want of any operation is measured whole
    from its start (its wake-up a sample due then), as is one begun with a sink wanting it."""
    wanting = MemorySink([OperationFinished])
    subscribed: list[Subscription] = []
    app, monitor = _app_with_monitor(MemorySink([OperationStarted]), _blocking)

    async def woken(request: Request) -> dict[str, Any]:
        with fastapi.operation(request, "commit", checkpoint_id="woken"):
            # The loop stays blocked until the operation ends: the monitor cannot wake to check.
            subscribed.append(fastapi.telemetry(request).bus.subscribe(wanting))
            time.sleep(0.2)
        return {}

    async def midway(request: Request) -> dict[str, Any]:
        with fastapi.operation(request, "commit", checkpoint_id="midway"):
            await _until_parked(monitor)  # woken, it found no sink wanting the lag
            subscribed.append(fastapi.telemetry(request).bus.subscribe(wanting))
            await _until_sampling(monitor)
            time.sleep(0.2)
        return {}

    app.post("/woken")(woken)
    app.post("/midway")(midway)
    async with _serving(app) as client:
        await anyio.sleep(0.1)
        assert not monitor.sampling
        assert (await client.post("/woken")).status_code == 200
        await fastapi.telemetry(app).bus.flush()
        subscribed.pop().close()
        await _until_parked(monitor)
        assert (await client.post("/midway")).status_code == 200
        assert (await client.post("/op")).status_code == 200  # a sink wants it: measured
        await fastapi.telemetry(app).bus.flush()
    lags = {e.checkpoint_id: e.loop_lag_ms for e in wanting.of_type(OperationFinished)}
    assert lags["midway"] is None, lags
    assert lags["woken"] is not None and lags["woken"] >= 100.0, lags
    assert lags["c1"] is not None and lags["c1"] >= 100.0, lags


async def test_a_step_of_the_wall_clock_neither_fakes_nor_hides_a_measured_lag(monkeypatch: Any) -> None:
    """The wall clock stepped back 10 s (an NTP step; simulated, stepping the host's clock is not
    for a test): an operation begun while parked that saw the monitor start sampling read 0.0 (as
    if sampled whole, nothing measured), and one whose loop was blocked 200 ms read 0.0 (its
    sample stamped before its start); now None and >= 100 ms, the monitor's stamps monotonic."""
    real_time_ns = time.time_ns
    step = [0]
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + step[0])
    wanting = MemorySink([OperationFinished])
    app, monitor = _app_with_monitor(MemorySink([OperationStarted]), _blocking)

    async def midway(request: Request) -> dict[str, Any]:
        with fastapi.operation(request, "commit", checkpoint_id="midway"):
            await _until_parked(monitor)  # woken, it found no sink wanting the lag
            step[0] -= 10_000_000_000
            fastapi.telemetry(request).bus.subscribe(wanting)
            await _until_sampling(monitor)
        return {}

    async def stepped(request: Request) -> dict[str, Any]:
        with fastapi.operation(request, "commit", checkpoint_id="stepped"):
            time.sleep(0.2)  # blocks the loop
            await anyio.sleep(0.1)  # the monitor wakes and records it
            step[0] -= 10_000_000_000
            await anyio.sleep(0.1)
        return {}

    app.post("/midway")(midway)
    app.post("/stepped")(stepped)
    async with _serving(app) as client:
        await anyio.sleep(0.1)
        assert not monitor.sampling
        assert (await client.post("/midway")).status_code == 200
        assert (await client.post("/stepped")).status_code == 200
        await fastapi.telemetry(app).bus.flush()
    lags = {e.checkpoint_id: e.loop_lag_ms for e in wanting.of_type(OperationFinished)}
    assert lags["midway"] is None, lags
    assert lags["stepped"] is not None and lags["stepped"] >= 100.0, lags


async def test_a_wanted_that_raises_neither_ends_the_server_nor_loses_the_lag(caplog: Any) -> None:
    """A ``wanted`` of the user's own that raised ended ``run()``, and with it the app's lifespan
    (an ``ExceptionGroup`` out of its task group); now it counts as wanted, said once."""
    calls = 0

    def wanted() -> bool:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("registry gone")
        return False

    monitor = LoopLagMonitor()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await tg.start(monitor.run, wanted)
            yield
            tg.cancel_scope.cancel()

    app = FastAPI(lifespan=lifespan)
    lags: list[float | None] = []

    @app.post("/op")
    async def op() -> dict[str, Any]:
        start = time.monotonic_ns()
        time.sleep(0.12)  # blocks the loop, as a sync call in a handler would
        lags.append(monitor.max_since_monotonic(start))
        return {}

    async with _serving(app) as client:
        with anyio.fail_after(3.0):
            while calls < 2:  # the first call parked it; each after raises
                await anyio.sleep(0.01)
        await _until_sampling(monitor)
        assert (await client.post("/op")).status_code == 200
        await anyio.sleep(0.2)
        assert (await client.post("/op")).status_code == 200
    # Read while the sleep in progress overshoots: at least the block less one interval.
    assert all(lag is not None and lag >= 60.0 for lag in lags), lags
    said = [r.getMessage() for r in caplog.records if "wanted() raised" in r.getMessage()]
    assert said == [
        "ckpt_events: the loop-lag monitor's wanted() raised RuntimeError: 'registry gone'; the monitor "
        "samples as if wanted (said once): make wanted() return True or False without raising"
    ]


async def test_an_idle_app_wakes_nothing_and_a_thread_s_operation_wakes_the_monitor() -> None:
    """With a sink wanting the lag and no operation open, the monitor woke 20 times a second
    (~20 samples in 1 s here, 3.7 ms of CPU a second on an idle uvicorn); now none. A ``def``
    endpoint's operation, begun in a worker thread while the loop runs free, wakes it: its lag is
    measured (not ``None``) and small (a wake-up lost would read as its 300 ms)."""
    sink = MemorySink([OperationFinished])

    def threaded(request: Request) -> dict[str, Any]:
        with fastapi.operation(request, "commit", checkpoint_id="threaded"):
            time.sleep(0.3)  # in a worker thread: the loop is free
        return {}

    app, monitor = _app_with_monitor(sink, _blocking)
    app.post("/threaded")(threaded)
    async with _serving(app) as client:
        await anyio.sleep(0.05)
        idle_from = monitor.samples_taken
        await anyio.sleep(1.0)
        idle_samples = monitor.samples_taken - idle_from
        assert (await client.post("/threaded")).status_code == 200
        await fastapi.telemetry(app).bus.flush()
    assert idle_samples == 0
    (finished,) = sink.of_type(OperationFinished)
    assert finished.loop_lag_ms is not None and finished.loop_lag_ms < 100.0, finished.loop_lag_ms
    assert monitor.samples_taken > 0
