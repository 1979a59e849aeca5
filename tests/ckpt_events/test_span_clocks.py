"""Span times: the start from the wall clock, the duration from the monotonic clock beside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    InvalidArgumentError,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StepFinished,
    StepStarted,
    Telemetry,
)
from ckpt_events.testing import EventCapture, TickingClock, capture_events

_STEP_NS = 5_000_000_000
_FINISHED = (OperationFinished, StepFinished, CoordinateFinished, StageFinished, CollectionFinished)


class _Clocks:
    """A wall clock and a monotonic clock, each a millisecond later per reading; ``step_wall``
    moves the wall clock alone, as NTP or a resumed VM does."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000
        self.mono = 1_000

    def wall(self) -> int:
        self.now += 1_000_000
        return self.now

    def monotonic(self) -> int:
        self.mono += 1_000_000
        return self.mono

    def step_wall(self, by: int) -> None:
        self.now += by


def _each_span(tel: Telemetry, step: Callable[[], None]) -> None:
    """One span of every kind, the wall clock stepped inside each."""
    with tel.operation("commit", checkpoint_id="c1") as op:
        step()
        with op.step("write"):
            step()
    with tel.coordinate("prepare", checkpoint_id="c1") as coordinate:
        step()
        with coordinate.stage("resources"):
            step()
    with tel.collection("checkpoint", checkpoint_id="c1"):
        step()


@pytest.mark.parametrize("by", [-_STEP_NS, _STEP_NS], ids=["back-5s", "forward-5s"])
@pytest.mark.parametrize("started", [True, False], ids=["started-wanted", "finished-only"])
async def test_a_wall_clock_step_inside_a_span_leaves_its_duration_true(by: int, started: bool) -> None:
    """A wall clock stepped 5 s back or forward while a span runs: end - start is the monotonic duration."""
    clocks = _Clocks()
    interests = None if started else _FINISHED
    async with capture_events(interests) as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0", clock=clocks.wall, monotonic=clocks.monotonic)
        _each_span(tel, lambda: clocks.step_wall(by))
    finished = [e for e in events if isinstance(e, _FINISHED)]
    assert {type(e) for e in finished} == set(_FINISHED)
    # Readings are 1 ms apart on either clock; no span is anywhere near the 5 s step.
    for event in finished:
        assert 0 < event.end_ns - event.start_ns < 10_000_000, event
    (step,) = [e for e in finished if isinstance(e, StepFinished)]
    assert step.end_ns - step.start_ns == 1_000_000  # its two monotonic readings, one apart
    # The start is the wall clock's (stepped by then), not the monotonic clock's.
    (operation,) = [e for e in finished if isinstance(e, OperationFinished)]
    assert step.start_ns - operation.start_ns in (by + 1_000_000, by + 2_000_000)


def test_a_real_monotonic_clock_beside_a_wall_clock_stepped_back() -> None:
    """With time.monotonic_ns, a wall clock 5 s back from the second reading on gives a true duration."""
    readings = 0

    def wall() -> int:
        nonlocal readings
        readings += 1
        return time.time_ns() - (_STEP_NS if readings > 1 else 0)

    with EventCapture() as capture:
        tel = capture.telemetry("resources", "r0", clock=wall, monotonic=time.monotonic_ns)
        with tel.operation("commit") as op:
            with op.step("write"):
                pass
        events: list[Any] = capture.events
    for event in events:
        if isinstance(event, OperationFinished | StepFinished):
            assert 0 <= event.end_ns - event.start_ns < 1_000_000_000, event
    (started_step,) = [e for e in events if isinstance(e, StepStarted)]
    (started_op,) = [e for e in events if isinstance(e, OperationStarted)]
    assert started_step.start_ns < started_op.start_ns  # the wall clock did go back


async def test_an_injected_clock_alone_times_spans_as_before() -> None:
    """A TickingClock without a monotonic twin times spans itself: one tick per reading, as before."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0", clock=TickingClock(start_ns=0, step_ns=1))
        with tel.operation("commit") as op:
            with op.step("export"):
                pass
            with op.step("write"):
                pass
    times = [(e.start_ns, e.end_ns) for e in events if isinstance(e, OperationFinished | StepFinished)]
    assert times == [(1, 2), (3, 4), (0, 5)]


def test_monotonic_must_be_callable() -> None:
    """A non-callable monotonic clock is refused."""
    with pytest.raises(InvalidArgumentError):
        Telemetry(None, kind="agent", instance="a0", monotonic=5)  # type: ignore[arg-type]
