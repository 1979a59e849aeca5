"""Arrival stamps and event-loop lag on the reference participants (``instrument`` makes them;
its own tests are ``tests/participants/test_fastapi.py``)."""

from __future__ import annotations

import time

from ckpt_events import OperationFinished
from ckpt_events.participants import create_app
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
