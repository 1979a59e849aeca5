"""Arrival stamps and event-loop lag: what a participant adds so the report can attribute its time."""

from __future__ import annotations

import time

import anyio

from ckpt_events import OperationFinished
from ckpt_events.participants import create_app
from ckpt_events.participants.server.arrival import (
    SCOPE_KEY,
    Arrival,
    ArrivalMiddleware,
    LoopLagMonitor,
    timed,
)
from ckpt_events.testing import capture_events
from tests.participants.helpers import TOKEN, control, running


async def test_control_calls_carry_arrival_before_handler_and_loop_lag() -> None:
    """Each control operation's event says when its request reached the app and the worst loop lag."""
    async with capture_events() as (bus, events):
        app = create_app("resources", instance="resources-0", token=TOKEN, bus=bus)
        async with running(app) as client:
            before = time.time_ns()
            await control(client, "prepare")
            await control(client, "resume")
    finished = [e for e in events if isinstance(e, OperationFinished)]
    assert [e.operation for e in finished] == ["prepare", "resume"]
    for event in finished:
        assert event.received_ns is not None and before <= event.received_ns <= event.start_ns
        assert event.loop_lag_ms is not None and event.loop_lag_ms >= 0.0


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


async def test_middleware_stamps_the_scope_and_timed_is_inert_outside_a_request() -> None:
    """The middleware puts the arrival in the request scope; ``timed`` outside a request sets nothing."""
    seen: dict[str, object] = {}

    async def app(scope: dict, receive: object, send: object) -> None:
        seen["arrival"] = scope.get(SCOPE_KEY)

    before = time.time_ns()
    await ArrivalMiddleware(app)({"type": "http"}, None, None)
    stamped = seen["arrival"]
    assert isinstance(stamped, Arrival) and stamped.received_ns >= before
    await ArrivalMiddleware(app)({"type": "lifespan"}, None, None)
    assert seen["arrival"] is None  # the last call was not HTTP: left alone

    class Recorder:
        calls: list[dict[str, object]] = []

        def set(self, **values: object) -> None:
            self.calls.append(values)

    with timed(Recorder()):
        pass
    assert Recorder.calls == []
